//! Runs the fuzz seed corpus (`fuzz/corpus/decode/`) through
//! [`wire::fuzz_decode`], the function the fuzz target calls, in a plain
//! `cargo test`; then a few thousand deterministic mutations of it.
//!
//! - Corpus files named `ok-*` must decode, `err-*` must be rejected; any
//!   other file (one the fuzzer added) must only not panic.
//! - Nothing may panic (a panic in `fuzz_decode` is either a decoder bug or a
//!   failed re-encoding assertion).
//! - Decoding must not allocate more than a small multiple of the input's
//!   size, however large the lengths and counts the input claims: a counting
//!   global allocator measures every call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::panic::catch_unwind;
use std::path::PathBuf;

use wire::{
    encode_signature, encode_tensor_section, flags, fuzz_decode, DType, Header, Kind, Limits,
    ModelSignature, Status, TensorDesc, TensorSpec, WireError, HEADER_LEN,
};

// ---------------------------------------------------------------------------
// Allocation accounting
// ---------------------------------------------------------------------------

struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the allocator may run while this thread's locals are gone.
    let _ = TRACKING.try_with(|t| {
        if t.get() {
            TOTAL.with(|c| c.set(c.get().saturating_add(size)));
            LARGEST.with(|c| c.set(c.get().max(size)));
        }
    });
}

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged, so it upholds exactly the system allocator's contract;
// the bookkeeping touches only const-initialised thread-local cells.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed through unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (every path above) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` was allocated by `System` with `layout`; the caller
        // guarantees `new_size` is valid for it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What one call allocated: total bytes requested and the largest request.
#[derive(Clone, Copy, Debug)]
struct Allocated {
    total: usize,
    largest: usize,
}

/// Runs `fuzz_decode(input)`, catching a panic, and measures its allocations.
fn run(input: &[u8]) -> (Result<Result<(), WireError>, String>, Allocated) {
    TOTAL.with(|c| c.set(0));
    LARGEST.with(|c| c.set(0));
    TRACKING.with(|t| t.set(true));
    let result = catch_unwind(|| fuzz_decode(input));
    TRACKING.with(|t| t.set(false));
    let allocated = Allocated {
        total: TOTAL.with(|c| c.get()),
        largest: LARGEST.with(|c| c.get()),
    };
    let result = result.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    });
    (result, allocated)
}

/// Allocation allowed for decoding `len` input bytes: the decoded structures
/// are a bounded multiple of the bytes that encode them, plus error text.
fn budget(len: usize) -> Allocated {
    Allocated {
        total: 64 * len + 16 * 1024,
        largest: 16 * len + 4 * 1024,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Decodes `input`, failing the test on a panic or an allocation over budget.
fn check(input: &[u8], what: &str) -> Result<(), WireError> {
    let (result, allocated) = run(input);
    let result = result.unwrap_or_else(|msg| {
        panic!(
            "fuzz_decode panicked on {what}: {msg}\ninput: {}",
            hex(input)
        )
    });
    let limit = budget(input.len());
    assert!(
        allocated.total <= limit.total && allocated.largest <= limit.largest,
        "decoding {what} ({} bytes) allocated {allocated:?}, budget {limit:?}\ninput: {}",
        input.len(),
        hex(input)
    );
    result
}

// ---------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------

fn corpus() -> BTreeMap<String, Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode");
    let mut files = BTreeMap::new();
    for entry in
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
    {
        let path = entry.unwrap().path();
        if path.is_file() {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            files.insert(name, std::fs::read(&path).unwrap());
        }
    }
    files
}

#[test]
fn corpus_decodes_as_named() {
    let files = corpus();
    let named = files
        .keys()
        .filter(|n| n.starts_with("ok-") || n.starts_with("err-"))
        .count();
    assert!(
        (15..=48).contains(&named),
        "the seed corpus has {named} named files, expected 15..=48"
    );
    assert!(files.keys().any(|n| n.starts_with("ok-vector-")));
    for (name, bytes) in &files {
        let result = check(bytes, name);
        if name.starts_with("ok-") {
            assert_eq!(result, Ok(()), "{name} must decode");
        } else if name.starts_with("err-") {
            assert!(result.is_err(), "{name} must be rejected");
        }
    }
}

// ---------------------------------------------------------------------------
// Deterministic mutations
// ---------------------------------------------------------------------------

/// xorshift64*: small, fast, and the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-enough in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

const INTERESTING_U64: [u64; 14] = [
    0,
    1,
    7,
    8,
    24,
    63,
    64,
    65,
    4096,
    256 << 20,
    (256 << 20) + 1,
    u32::MAX as u64,
    1 << 63,
    u64::MAX,
];

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    if at + 4 <= b.len() {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    if at + 8 <= b.len() {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// Makes `desc_len` and `payload_len` agree with the input's actual size, so
/// that mutations reach past the framing checks.
fn fix_lengths(b: &mut [u8], rng: &mut Rng) {
    if b.len() < HEADER_LEN {
        return;
    }
    let body = b.len() - HEADER_LEN;
    let payload = u64::from_le_bytes(b[32..40].try_into().unwrap());
    if rng.below(2) == 0 && payload <= body as u64 {
        put_u32(b, 24, (body as u64 - payload) as u32);
    } else {
        let desc = u32::from_le_bytes(b[24..28].try_into().unwrap()) as usize;
        put_u64(b, 32, body.saturating_sub(desc) as u64);
    }
}

fn mutate(input: &mut Vec<u8>, rng: &mut Rng, seeds: &[Vec<u8>]) {
    let len = input.len();
    match rng.below(10) {
        // Flip one bit.
        0 | 1 if len > 0 => {
            let i = rng.below(len);
            input[i] ^= 1 << rng.below(8);
        }
        // Set a byte to an interesting value.
        2 if len > 0 => {
            let i = rng.below(len);
            input[i] = rng.pick(&[0, 1, 2, 8, 9, 0x3f, 0x40, 0x7f, 0x80, 0xff]);
        }
        // Truncate.
        3 => input.truncate(rng.below(len + 1)),
        // Edit a header count or length field.
        4 => {
            let v = rng.pick(&INTERESTING_U64);
            match rng.below(4) {
                0 => put_u32(input, 20, v as u32),
                1 => put_u32(input, 24, v as u32),
                2 => put_u64(input, 32, v),
                _ => put_u32(input, 16, v as u32),
            }
        }
        // Edit an 8-byte-aligned field of the descriptor section (offsets,
        // lengths, dims, stamps, hello limits live at multiples of 8).
        5 if len > HEADER_LEN + 8 => {
            let at = HEADER_LEN + 8 * rng.below((len - HEADER_LEN) / 8);
            let v = rng.pick(&INTERESTING_U64);
            if rng.below(2) == 0 {
                put_u64(input, at, v);
            } else {
                put_u32(input, at + 4 * rng.below(2), v as u32);
            }
        }
        // Insert a few random bytes.
        6 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            input.splice(at..at, bytes);
        }
        // Delete a range.
        7 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(32));
            input.drain(at..at + n);
        }
        // Splice in part of another seed.
        8 => {
            let other = &seeds[rng.below(seeds.len())];
            let from = rng.below(other.len() + 1);
            let at = rng.below(len + 1);
            input.truncate(at);
            input.extend_from_slice(&other[from..]);
        }
        // Make the framing lengths consistent with the bytes.
        _ => fix_lengths(input, rng),
    }
}

#[test]
fn mutations_never_panic_or_overallocate() {
    let seeds: Vec<Vec<u8>> = corpus().into_values().collect();
    let mut rng = Rng(0x7477_6972_6531_2026);
    let mut outcomes: BTreeMap<&'static str, usize> = BTreeMap::new();
    const ITERATIONS: usize = 6000;
    for i in 0..ITERATIONS {
        let mut input = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut input, &mut rng, &seeds);
        }
        if rng.below(2) == 0 {
            fix_lengths(&mut input, &mut rng);
        }
        let outcome = match check(&input, &format!("mutation {i}")) {
            Ok(()) => "ok",
            Err(e) => e.status().name(),
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    eprintln!("outcomes of {ITERATIONS} mutations: {outcomes:?}");
    // The mutations must exercise more than the header checks: some must
    // still decode, and some must fail in the descriptor section.
    assert!(
        outcomes.get("ok").copied().unwrap_or(0) >= ITERATIONS / 100,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("malformed").copied().unwrap_or(0) >= ITERATIONS / 20,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("limit-exceeded").copied().unwrap_or(0) > 0,
        "{outcomes:?}"
    );
}

// ---------------------------------------------------------------------------
// Huge claims, tiny bodies
// ---------------------------------------------------------------------------

fn with_body(mut h: Header, desc: &[u8], payload: &[u8]) -> Vec<u8> {
    h.desc_len = desc.len() as u32;
    h.payload_len = payload.len() as u64;
    let mut m = h.encode().to_vec();
    m.extend_from_slice(desc);
    m.extend_from_slice(payload);
    m
}

/// Overwrites the header's counts and lengths, leaving the bytes as they are.
fn claim(mut m: Vec<u8>, tensor_count: u32, desc_len: u32, payload_len: u64) -> Vec<u8> {
    put_u32(&mut m, 20, tensor_count);
    put_u32(&mut m, 24, desc_len);
    put_u64(&mut m, 32, payload_len);
    m
}

fn small_alloc(input: &[u8]) -> Result<(), WireError> {
    let (result, allocated) = run(input);
    let result = result.expect("no panic");
    assert!(
        allocated.largest <= 4096,
        "a {}-byte input made a {}-byte allocation",
        input.len(),
        allocated.largest
    );
    result
}

#[test]
fn huge_claims_with_tiny_bodies_are_refused_cheaply() {
    let one = [TensorDesc {
        dtype: DType::U8,
        shape: vec![1],
        offset: 0,
        len: 1,
    }];
    let mut desc = Vec::new();
    encode_tensor_section(&one, None, &mut desc);
    let request = Header {
        tensor_count: 1,
        ..Header::new(Kind::Request)
    };
    let base = with_body(request, &desc, &[7]);
    assert_eq!(small_alloc(&base), Ok(()));
    let limits = Limits::default();

    // The most tensors the limits allow, in a section that holds one.
    let m = claim(base.clone(), limits.max_tensors, desc.len() as u32, 1);
    assert!(matches!(small_alloc(&m), Err(WireError::Malformed(_))));
    // Over-limit counts and lengths are refused from the header alone.
    for (count, desc_len, payload_len) in [
        (u32::MAX, desc.len() as u32, 1),
        (1, u32::MAX, 1),
        (1, limits.max_desc_len + 1, 1),
        (1, desc.len() as u32, u64::MAX),
        (1, desc.len() as u32, limits.max_payload + 1),
    ] {
        let err = small_alloc(&claim(base.clone(), count, desc_len, payload_len)).unwrap_err();
        assert_eq!(
            err.status(),
            Status::LimitExceeded,
            "{count} {desc_len} {payload_len}"
        );
    }
    // In-limit lengths the bytes do not back: truncation, no allocation.
    let m = claim(base.clone(), 1, limits.max_desc_len, 1);
    assert!(matches!(small_alloc(&m), Err(WireError::Truncated { .. })));
    let m = claim(base.clone(), 1, desc.len() as u32, limits.max_payload);
    assert!(matches!(small_alloc(&m), Err(WireError::Truncated { .. })));
    // A timeline claimed but absent.
    let mut m = base.clone();
    m[7] = flags::HAS_TIMELINE;
    m[6] = Kind::Response as u8;
    assert!(small_alloc(&m).is_err());

    // A model list claiming 2^32 - 1 models in 4 bytes.
    let h = Header::new(Kind::ModelList);
    let m = with_body(h, &u32::MAX.to_le_bytes(), &[]);
    assert!(matches!(small_alloc(&m), Err(WireError::Malformed(_))));
    // As many (minimal, 10-byte) models as a 60 kB body holds: valid, and
    // decoded within the allocation budget.
    let mut body = 6000u32.to_le_bytes().to_vec();
    body.resize(60_004, 0);
    let m = with_body(h, &body, &[]);
    assert_eq!(check(&m, "a list of 6000 minimal models"), Ok(()));
    // The same count with one byte missing.
    let m = with_body(h, &body[..body.len() - 1], &[]);
    assert!(check(&m, "a truncated list").is_err());
    // A signature claiming the most inputs and outputs in a few bytes.
    let sig = ModelSignature {
        name: "m".into(),
        inputs: vec![],
        outputs: vec![],
    };
    let mut b = Vec::new();
    encode_signature(&sig, &mut b);
    let n = b.len();
    b[n - 4..n - 2].copy_from_slice(&512u16.to_le_bytes());
    b[n - 2..].copy_from_slice(&512u16.to_le_bytes());
    let m = with_body(
        Header {
            model_id: 1,
            ..Header::new(Kind::ModelInfo)
        },
        &b,
        &[],
    );
    assert!(matches!(small_alloc(&m), Err(WireError::Truncated { .. })));
    b[n - 2..].copy_from_slice(&u16::MAX.to_le_bytes());
    let m = with_body(
        Header {
            model_id: 1,
            ..Header::new(Kind::ModelInfo)
        },
        &b,
        &[],
    );
    assert!(matches!(small_alloc(&m), Err(WireError::Malformed(_))));
    // One spec with 8 dims of every interesting value decodes or fails cleanly.
    for d in INTERESTING_U64 {
        let sig = ModelSignature {
            name: "m".into(),
            inputs: vec![TensorSpec {
                name: String::new(),
                dtype: DType::F32,
                shape: vec![Some(d); 8],
            }],
            outputs: vec![],
        };
        let mut b = Vec::new();
        encode_signature(&sig, &mut b);
        let m = with_body(Header::new(Kind::ModelInfo), &b, &[]);
        let _ = check(&m, "signature with interesting dims");
    }
}
