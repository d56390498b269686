//! Data movers: the one interface every tensor copy into or out of an arena
//! or a receive buffer goes through.
//!
//! | mover | what moves the bytes | cost |
//! |---|---|---|
//! | [`Mover::Memcpy`] | the CPU, `copy_from_slice` (the libc `memcpy`: `rep movsb`/vector loads and stores through the cache) | fastest while source and destination fit in the caches |
//! | [`Mover::NonTemporal`] | the CPU, AVX2 (`_mm256_stream_si256`) or SSE2 (`_mm_stream_si128`) streaming stores, `sfence` after | writes bypass the cache: no read-for-ownership of the destination, no eviction of the caller's working set; slower for buffers that would have stayed cached |
//! | [`Mover::Kernel`] | the kernel, `process_vm_readv` from another process's memory (the agent pulling a client's tensor) | one system call plus page pinning (~µs), then a kernel `memcpy`; the client's CPU does no copy |
//! | [`Mover::Zero`] | nothing: the tensor already lies where the reader reads it (an arena allocation) | free; only possible when the bytes are already arena-resident |
//!
//! Which one a request uses is a [`MoverChoice`]: a fixed mover, or `auto`,
//! which asks a [`Policy`] (fitted on this machine by `tensorwire
//! calibrate`) for the best mover at the copy's size, the number of copies
//! running at once in this process ([`Inflight`]) and the cache state.
//! [`MoverCounters`] count the bytes and copies of each mover.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// How tensor bytes are moved.
///
/// # Examples
///
/// ```
/// use transport::mover::{copy, Mover};
/// let src = vec![5u8; 4096];
/// for m in [Mover::Memcpy, Mover::NonTemporal, Mover::Kernel] {
///     let mut dst = vec![0u8; 4096];
///     copy(m, &mut dst, &src)?;
///     assert_eq!(dst, src, "{m}");
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mover {
    /// A cached CPU copy (`memcpy`).
    Memcpy,
    /// A CPU copy with non-temporal (streaming, cache-bypassing) stores.
    #[serde(rename = "nt")]
    NonTemporal,
    /// A kernel copy (`process_vm_readv`): the reader pulls the bytes out of
    /// the writer's address space; the writer copies nothing.
    Kernel,
    /// No copy: the bytes already lie where they are read.
    Zero,
}

impl Mover {
    /// Every mover, in counter order.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::mover::Mover;
    /// let names: Vec<&str> = Mover::ALL.iter().map(|m| m.name()).collect();
    /// assert_eq!(names, ["memcpy", "nt", "kernel", "zero"]);
    /// assert!(Mover::ALL.iter().enumerate().all(|(i, m)| m.index() == i));
    /// ```
    pub const ALL: [Mover; 4] = [
        Mover::Memcpy,
        Mover::NonTemporal,
        Mover::Kernel,
        Mover::Zero,
    ];

    /// The mover's name as written in URIs, flags and policy files.
    /// Example: [`Mover::ALL`].
    pub fn name(self) -> &'static str {
        match self {
            Mover::Memcpy => "memcpy",
            Mover::NonTemporal => "nt",
            Mover::Kernel => "kernel",
            Mover::Zero => "zero",
        }
    }

    /// Index into per-mover arrays (`ALL` order). Examples: [`Mover::ALL`],
    /// [`MoverStats`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Mover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which mover a session uses: one fixed mover, or the policy's pick per copy.
///
/// # Examples
///
/// As `?mover=` and `--mover` write it:
///
/// ```
/// use transport::mover::{Mover, MoverChoice};
/// assert_eq!("nt".parse::<MoverChoice>()?, MoverChoice::Fixed(Mover::NonTemporal));
/// assert_eq!("auto".parse::<MoverChoice>()?, MoverChoice::default());
/// assert!("dma".parse::<MoverChoice>().unwrap_err().starts_with("unknown mover 'dma'"));
/// assert_eq!(MoverChoice::Fixed(Mover::Kernel).to_string(), "kernel");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MoverChoice {
    /// Ask the loaded [`Policy`] per copy (zero copy whenever the bytes
    /// already lie in the arena).
    #[default]
    Auto,
    /// Always this mover (for `memcpy`/`nt`/`kernel`: still zero copy for
    /// bytes already in the arena; `zero`: refuse bytes that are not).
    Fixed(Mover),
}

impl std::str::FromStr for MoverChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => MoverChoice::Auto,
            "memcpy" => MoverChoice::Fixed(Mover::Memcpy),
            "nt" => MoverChoice::Fixed(Mover::NonTemporal),
            "kernel" => MoverChoice::Fixed(Mover::Kernel),
            "zero" => MoverChoice::Fixed(Mover::Zero),
            other => {
                return Err(format!(
                    "unknown mover '{other}' (known: auto, memcpy, nt, kernel, zero)"
                ))
            }
        })
    }
}

impl fmt::Display for MoverChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MoverChoice::Auto => f.write_str("auto"),
            MoverChoice::Fixed(m) => f.write_str(m.name()),
        }
    }
}

/// A copy that failed. Only the kernel mover fails: the other process is
/// gone, forbids the read, or named memory it does not have.
///
/// # Examples
///
/// ```
/// use transport::mover::{kernel_read, MoverError};
/// let mut dst = [0u8; 8];
/// let e = kernel_read(std::process::id() as i32, &[(8, 8)], &mut dst).unwrap_err(); // page 0
/// assert_eq!(e, MoverError::BadAddress { addr: 8, len: 8 });
/// assert!(e.to_string().contains("EFAULT"));
/// ```
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MoverError {
    /// `EFAULT`: a remote range is not mapped (readable) in the peer.
    #[error("kernel copy: the peer's memory at {addr:#x}..+{len} is not readable (EFAULT)")]
    BadAddress {
        /// Start of the first range that failed.
        addr: u64,
        /// Its length.
        len: usize,
    },
    /// `ESRCH`: the peer process no longer exists.
    #[error("kernel copy: process {0} is gone (ESRCH)")]
    NoProcess(i32),
    /// `EPERM`: the kernel does not let this process read the peer's memory.
    #[error(
        "kernel copy: not permitted to read process {0} (EPERM: another user, or ptrace_scope)"
    )]
    NotPermitted(i32),
    /// Any other failure (`ENOMEM`, `EINVAL`, ...), or sizes that disagree.
    #[error("kernel copy: {0}")]
    Other(String),
}

/// Copies `src` into `dst` (equal lengths) with `mover`, in this process.
///
/// `Kernel` copies with `process_vm_readv` from this process itself (what
/// calibration measures; the same kernel path as from a peer). `Zero`
/// copies nothing and only checks that the two are the same bytes
/// (otherwise it is an error: zero copy needs the bytes in place).
///
/// # Panics
/// If the lengths differ (a caller bug, as with `copy_from_slice`).
///
/// # Examples
///
/// ```
/// use transport::mover::{copy, Mover};
/// let mut buf = vec![3u8; 1024];
/// let mut dst = vec![0u8; 1024];
/// copy(Mover::NonTemporal, &mut dst, &buf)?;
/// assert_eq!(dst, buf);
/// // Zero copy only "moves" bytes that are already where they are read:
/// assert!(copy(Mover::Zero, &mut dst, &buf).is_err());
/// let p = buf.as_mut_ptr();
/// // SAFETY: (the example only) both views are of `buf`, and zero copy touches neither.
/// let (same_dst, same_src) = unsafe { (std::slice::from_raw_parts_mut(p, 1024), std::slice::from_raw_parts(p, 1024)) };
/// copy(Mover::Zero, same_dst, same_src)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn copy(mover: Mover, dst: &mut [u8], src: &[u8]) -> Result<(), MoverError> {
    assert_eq!(dst.len(), src.len(), "mover copy: lengths differ");
    match mover {
        Mover::Memcpy => dst.copy_from_slice(src),
        Mover::NonTemporal => copy_nt(dst, src),
        Mover::Kernel => kernel_read(
            std::process::id() as i32,
            &[(src.as_ptr() as u64, src.len())],
            dst,
        )?,
        Mover::Zero => {
            if dst.as_ptr() != src.as_ptr() {
                return Err(MoverError::Other(
                    "zero copy asked for bytes that are not in place".into(),
                ));
            }
        }
    }
    Ok(())
}

/// Below this many bytes [`copy_nt`] is a plain copy (streaming stores and
/// the `sfence` cost more than they save).
///
/// # Examples
///
/// ```
/// use transport::mover::{copy_nt, NT_MIN_BYTES};
/// let small = [1u8; NT_MIN_BYTES - 1]; // a plain copy
/// let mut dst = [0u8; NT_MIN_BYTES - 1];
/// copy_nt(&mut dst, &small);
/// assert_eq!(dst, small);
/// ```
pub const NT_MIN_BYTES: usize = 256;

/// Copies `src` into `dst` with non-temporal stores: AVX2 32-byte streaming
/// stores when the CPU has AVX2, SSE2 16-byte ones otherwise (every x86_64),
/// a plain copy elsewhere and below [`NT_MIN_BYTES`]. The destination's
/// unaligned head and the tail are copied normally; an `sfence` orders the
/// streaming stores before anything this thread writes next (a ring mark
/// publishing the data).
///
/// # Examples
///
/// A destination that is not 32-byte aligned: the head and tail are
/// copied normally, the rest streamed.
///
/// ```
/// let src: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
/// let mut dst = vec![0u8; 10_003];
/// transport::mover::copy_nt(&mut dst[3..], &src);
/// assert_eq!(&dst[3..], &src[..]);
/// ```
pub fn copy_nt(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "mover copy: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        if src.len() >= NT_MIN_BYTES {
            if has_avx2() {
                // SAFETY: AVX2 was detected at run time; both slices are
                // valid for their (equal) lengths and cannot overlap (one
                // is `&mut`).
                unsafe { nt_avx2(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
            } else {
                // SAFETY: SSE2 is part of the x86_64 baseline; slices as above.
                unsafe { nt_sse2(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
            }
            return;
        }
    }
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| std::arch::is_x86_feature_detected!("avx2"))
}

/// # Safety
/// The CPU has AVX2; `dst` and `src` are valid for `n` bytes and do not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn nt_avx2(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_sfence};
    let head = dst.align_offset(32).min(n);
    // SAFETY: head <= n; both valid for n bytes, disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    // Four 32-byte stores per iteration: two cache lines.
    while i + 128 <= n {
        // SAFETY: i + 128 <= n; dst + i is 32-byte aligned (head aligned it
        // and i moves in multiples of 32); loads are unaligned loads.
        unsafe {
            let s = src.add(i) as *const __m256i;
            let d = dst.add(i) as *mut __m256i;
            let a = _mm256_loadu_si256(s);
            let b = _mm256_loadu_si256(s.add(1));
            let c = _mm256_loadu_si256(s.add(2));
            let e = _mm256_loadu_si256(s.add(3));
            _mm256_stream_si256(d, a);
            _mm256_stream_si256(d.add(1), b);
            _mm256_stream_si256(d.add(2), c);
            _mm256_stream_si256(d.add(3), e);
        }
        i += 128;
    }
    while i + 32 <= n {
        // SAFETY: as above, one 32-byte store.
        unsafe {
            let v = _mm256_loadu_si256(src.add(i) as *const __m256i);
            _mm256_stream_si256(dst.add(i) as *mut __m256i, v);
        }
        i += 32;
    }
    // SAFETY: the tail i..n lies inside both buffers.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i) };
    _mm_sfence();
}

/// # Safety
/// `dst` and `src` are valid for `n` bytes and do not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn nt_sse2(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = dst.align_offset(16).min(n);
    // SAFETY: head <= n; both valid for n bytes, disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n; dst + i is 16-byte aligned; SSE2 is baseline.
        unsafe {
            let v = _mm_loadu_si128(src.add(i) as *const __m128i);
            _mm_stream_si128(dst.add(i) as *mut __m128i, v);
        }
        i += 16;
    }
    // SAFETY: the tail i..n lies inside both buffers.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i) };
    // SAFETY: SSE is baseline on x86_64.
    unsafe { _mm_sfence() };
}

/// Reads the ranges `remote` (address, length) of process `pid` into `dst`,
/// back to back, with `process_vm_readv`: the kernel checks every range
/// against the peer's own mappings, so a peer that names memory it does not
/// have gets an error and nothing else of it is read. Partial reads are
/// continued; `dst.len()` must be the ranges' total.
///
/// # Examples
///
/// Two ranges of this process's own memory, gathered into one buffer
/// (the agent does this with a client's pid, `--allow-kernel-pull`):
///
/// ```
/// use transport::mover::kernel_read;
/// let (a, b) = (vec![1u8; 100], vec![2u8; 28]);
/// let mut dst = vec![0u8; 128];
/// let ranges = [(a.as_ptr() as u64, a.len()), (b.as_ptr() as u64, b.len())];
/// kernel_read(std::process::id() as i32, &ranges, &mut dst)?;
/// assert_eq!((&dst[..100], &dst[100..]), (&a[..], &b[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn kernel_read(pid: i32, remote: &[(u64, usize)], dst: &mut [u8]) -> Result<(), MoverError> {
    let total = remote
        .iter()
        .try_fold(0usize, |a, &(_, l)| a.checked_add(l))
        .ok_or_else(|| MoverError::Other("remote ranges overflow".into()))?;
    if total != dst.len() {
        return Err(MoverError::Other(format!(
            "remote ranges total {total} bytes, destination {}",
            dst.len()
        )));
    }
    // Remaining work: index of the current range and bytes done in it.
    let (mut r, mut r_done, mut d) = (0usize, 0usize, 0usize);
    const MAX_IOV: usize = 1024;
    while d < total {
        while r < remote.len() && remote[r].1 == r_done {
            r += 1;
            r_done = 0;
        }
        let mut iov: Vec<libc::iovec> = Vec::with_capacity((remote.len() - r).min(MAX_IOV));
        for (k, &(addr, len)) in remote[r..].iter().enumerate().take(MAX_IOV) {
            let skip = if k == 0 { r_done } else { 0 };
            if len > skip {
                iov.push(libc::iovec {
                    iov_base: (addr as usize).wrapping_add(skip) as *mut libc::c_void,
                    iov_len: len - skip,
                });
            }
        }
        let want: usize = iov.iter().map(|v| v.iov_len).sum();
        let local = libc::iovec {
            // SAFETY: d < total = dst.len(): in bounds.
            iov_base: unsafe { dst.as_mut_ptr().add(d) } as *mut libc::c_void,
            iov_len: (total - d).min(want),
        };
        // SAFETY: the local iovec lies inside `dst`, which we borrow
        // mutably; the remote iovecs are only addresses in the peer, which
        // the kernel checks (it never reads this process's memory for them).
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, iov.as_ptr(), iov.len() as _, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            let (addr, len) = remote.get(r).copied().unwrap_or((0, 0));
            return Err(match e.raw_os_error() {
                Some(libc::EFAULT) => MoverError::BadAddress {
                    addr: addr.wrapping_add(r_done as u64),
                    len: len - r_done,
                },
                Some(libc::ESRCH) => MoverError::NoProcess(pid),
                Some(libc::EPERM) => MoverError::NotPermitted(pid),
                _ => MoverError::Other(e.to_string()),
            });
        }
        let mut n = n as usize;
        if n == 0 {
            // A partial read stops at the first range it cannot read: that
            // range is bad.
            let (addr, len) = remote.get(r).copied().unwrap_or((0, 0));
            return Err(MoverError::BadAddress {
                addr: addr.wrapping_add(r_done as u64),
                len: len - r_done,
            });
        }
        d += n;
        while n > 0 && r < remote.len() {
            let left = remote[r].1 - r_done;
            let k = left.min(n);
            r_done += k;
            n -= k;
            if r_done == remote[r].1 {
                r += 1;
                r_done = 0;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Counting

/// Bytes and copies per mover, in one process (relaxed atomics).
///
/// # Examples
///
/// ```
/// use transport::mover::{Mover, MoverCounters};
/// let c = MoverCounters::default();
/// c.add(Mover::Memcpy, 4096);
/// c.add(Mover::Zero, 1 << 20); // sent in place
/// let s = c.snapshot();
/// assert_eq!((s.copies_of(Mover::Memcpy), s.bytes_of(Mover::Zero)), (1, 1 << 20));
/// ```
#[derive(Debug, Default)]
pub struct MoverCounters {
    bytes: [AtomicU64; 4],
    copies: [AtomicU64; 4],
}

/// A snapshot of [`MoverCounters`], indexed by [`Mover::index`].
///
/// # Examples
///
/// ```
/// use transport::mover::{Mover, MoverStats};
/// let mut s = MoverStats::default();
/// assert_eq!(s.to_string(), "none");
/// s.copies[Mover::NonTemporal.index()] = 2;
/// s.bytes[Mover::NonTemporal.index()] = 8192;
/// assert_eq!(s.to_string(), "nt 2 x / 8192 B");
/// assert_eq!(s.bytes_of(Mover::NonTemporal), 8192);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoverStats {
    /// Tensor bytes moved by each mover (`Zero`: bytes sent in place).
    pub bytes: [u64; 4],
    /// Tensors moved by each mover.
    pub copies: [u64; 4],
}

impl MoverStats {
    /// Bytes moved by `m`. Example: [`MoverStats`].
    pub fn bytes_of(&self, m: Mover) -> u64 {
        self.bytes[m.index()]
    }
    /// Tensors moved by `m`. Example: [`MoverCounters`].
    pub fn copies_of(&self, m: Mover) -> u64 {
        self.copies[m.index()]
    }
}

impl fmt::Display for MoverStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for m in Mover::ALL {
            if self.copies_of(m) > 0 {
                if !first {
                    f.write_str(", ")?;
                }
                first = false;
                write!(f, "{m} {} x / {} B", self.copies_of(m), self.bytes_of(m))?;
            }
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

impl MoverCounters {
    /// Counts one tensor of `bytes` moved by `m`. Example: [`MoverCounters`].
    pub fn add(&self, m: Mover, bytes: u64) {
        self.bytes[m.index()].fetch_add(bytes, Ordering::Relaxed);
        self.copies[m.index()].fetch_add(1, Ordering::Relaxed);
    }
    /// The counts so far. Example: [`MoverCounters`].
    pub fn snapshot(&self) -> MoverStats {
        let mut s = MoverStats::default();
        for i in 0..4 {
            s.bytes[i] = self.bytes[i].load(Ordering::Relaxed);
            s.copies[i] = self.copies[i].load(Ordering::Relaxed);
        }
        s
    }
}

/// A mover choice with its counters: what a side of a session moves tensor
/// bytes with ([`Movers::move_bytes`]) and what it has moved.
///
/// # Examples
///
/// ```
/// use transport::mover::{Mover, MoverChoice, Movers};
/// let movers = Movers::default(); // auto
/// movers.set_choice(MoverChoice::Fixed(Mover::NonTemporal));
/// assert_eq!(movers.choice(), MoverChoice::Fixed(Mover::NonTemporal));
/// let src = vec![9u8; 1 << 16];
/// let mut dst = vec![0u8; 1 << 16];
/// assert_eq!(movers.move_bytes(&mut dst, &src), Mover::NonTemporal);
/// assert_eq!(dst, src);
/// movers.count(Mover::Zero, 4096); // a tensor that was already in place
/// let s = movers.stats();
/// assert_eq!((s.bytes_of(Mover::NonTemporal), s.copies_of(Mover::Zero)), (1 << 16, 1));
/// ```
#[derive(Debug, Default)]
pub struct Movers {
    /// [`MoverChoice`] as a code: 0 auto, 1 + [`Mover::index`] fixed.
    choice: std::sync::atomic::AtomicU8,
    counters: MoverCounters,
}

impl Movers {
    /// Sets the choice for the copies that follow. Example: [`Movers`].
    pub fn set_choice(&self, c: MoverChoice) {
        let code = match c {
            MoverChoice::Auto => 0,
            MoverChoice::Fixed(m) => 1 + m.index() as u8,
        };
        self.choice.store(code, Ordering::Relaxed);
    }

    /// The choice in force. Example: [`Movers`].
    pub fn choice(&self) -> MoverChoice {
        match self.choice.load(Ordering::Relaxed) {
            0 => MoverChoice::Auto,
            c => MoverChoice::Fixed(Mover::ALL[(c as usize - 1).min(3)]),
        }
    }

    /// Copies `src` into `dst` with the mover the choice picks for it
    /// (`auto`: the process policy at this size and the copies running
    /// now), counts it, and returns the mover used. Both are this
    /// process's memory, so `zero` (nothing to skip here) is a memcpy, and
    /// a kernel copy that fails (a sandbox forbidding `process_vm_readv`)
    /// is redone as a memcpy.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::mover::{Mover, MoverChoice, Movers};
    /// let movers = Movers::default();
    /// movers.set_choice(MoverChoice::Fixed(Mover::Zero));
    /// let mut dst = [0u8; 4];
    /// assert_eq!(movers.move_bytes(&mut dst, b"abcd"), Mover::Memcpy); // not in place: copied
    /// assert_eq!(&dst, b"abcd");
    /// ```
    pub fn move_bytes(&self, dst: &mut [u8], src: &[u8]) -> Mover {
        let d = self.choice().decide(src.len());
        let m = match d.mover {
            Mover::Zero => Mover::Memcpy,
            m => m,
        };
        let m = match copy(m, dst, src) {
            Ok(()) => m,
            Err(_) => {
                dst.copy_from_slice(src);
                Mover::Memcpy
            }
        };
        self.counters.add(m, src.len() as u64);
        m
    }

    /// Counts bytes that needed no move (`Zero`) or were moved elsewhere.
    /// Example: [`Movers`].
    pub fn count(&self, m: Mover, bytes: u64) {
        self.counters.add(m, bytes);
    }

    /// The counts so far. Example: [`Movers`].
    pub fn stats(&self) -> MoverStats {
        self.counters.snapshot()
    }
}

/// Copies running at once in this process (the policy's concurrency input).
static INFLIGHT: AtomicUsize = AtomicUsize::new(0);

/// A copy in progress, counted in the process-wide number of copies running
/// at once while it lives.
///
/// # Examples
///
/// ```
/// use transport::mover::Inflight;
/// let first = Inflight::enter();
/// let second = Inflight::enter();
/// assert_eq!((first.concurrency(), second.concurrency()), (1, 2));
/// drop((first, second));
/// assert_eq!(Inflight::enter().concurrency(), 1);
/// ```
#[derive(Debug)]
pub struct Inflight(usize);

impl Inflight {
    /// Enters a copy; `concurrency()` is how many run now, this one included.
    /// Example: [`Inflight`].
    pub fn enter() -> Inflight {
        Inflight(INFLIGHT.fetch_add(1, Ordering::Relaxed) + 1)
    }
    /// Copies running when this one entered, itself included.
    /// Example: [`Inflight`].
    pub fn concurrency(&self) -> usize {
        self.0
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        INFLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// The policy

/// The policy file format's version ([`Policy::version`]).
///
/// # Examples
///
/// ```
/// use transport::mover::{Mover, Policy, POLICY_VERSION};
/// assert_eq!(Policy::fixed(Mover::Memcpy).version, POLICY_VERSION);
/// ```
pub const POLICY_VERSION: u32 = 1;

/// Entries' size classes: `log2_size` 0..=63.
const BUCKETS: usize = 64;
/// Table columns: half-octave size buckets, `floor(2 · log2(bytes))`, so
/// that a size between two measured ones (3 MiB between 1 and 4 MiB) goes
/// to the nearer in log scale.
const HALF_BUCKETS: usize = 2 * BUCKETS;

/// `floor(2 · log2(bytes))` (bytes 0 counts as 1), from the top 9 bits.
#[inline]
fn half_bucket(bytes: usize) -> usize {
    let b = bytes.max(1);
    let k = (usize::BITS - 1 - b.leading_zeros()) as usize;
    let m = if k >= 8 { b >> (k - 8) } else { b << (8 - k) };
    // m is 256..=511; 256·√2 = 362.04.
    2 * k + usize::from(m >= 363)
}

/// The smallest size in half-octave bucket `hb`.
fn half_bucket_start(hb: usize) -> usize {
    let k = hb / 2;
    if hb.is_multiple_of(2) {
        1usize << k
    } else if k >= 8 {
        363usize << (k - 8)
    } else {
        (363usize).div_ceil(1 << (8 - k))
    }
}
/// Concurrency levels a policy table holds (1..=MAX_CONC; more is MAX_CONC).
const MAX_CONC: usize = 8;

/// One measured case of a policy: the best mover for a size bucket,
/// concurrency and cache state. Example: [`Policy`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyEntry {
    /// `floor(log2(size))` of the sizes this entry covers.
    pub log2_size: u32,
    /// Copies at once.
    pub concurrency: u32,
    /// Whether the source was cold (not in any cache).
    pub cold: bool,
    /// The fastest mover measured.
    pub mover: Mover,
}

/// A mover policy as written by `tensorwire calibrate`: the best mover per
/// (log2 size, concurrency, cache state), decided for unseen cases by the
/// nearest measured one. Loaded with [`Policy::load`], asked with
/// [`Policy::choose`] (a table lookup: a few ns).
///
/// # Examples
///
/// A machine where streaming stores win from 4 MiB on, one copy at a time:
///
/// ```
/// use transport::mover::{Mover, Policy, PolicyEntry};
/// let entry = |log2_size, mover| PolicyEntry { log2_size, concurrency: 1, cold: false, mover };
/// let p = Policy::new(
///     "this machine".into(),
///     16 << 20,
///     vec![entry(12, Mover::Memcpy), entry(16, Mover::Memcpy), entry(22, Mover::NonTemporal)],
/// )?;
/// assert_eq!(p.choose(8 << 10, 1, None), Mover::Memcpy);
/// assert_eq!(p.choose(8 << 20, 1, None), Mover::NonTemporal);
/// assert!(p.memcpy_below > 64 << 10); // small copies decided by one comparison
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("mover-policy.json");
/// p.save(&path)?;
/// assert_eq!(Policy::load(&path)?.choose(8 << 20, 1, None), Mover::NonTemporal);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Policy {
    /// [`POLICY_VERSION`].
    pub version: u32,
    /// What it was measured on (free text: CPU model, kernel).
    pub machine: String,
    /// Sources at least this large are taken as cold (not cached) when a
    /// copy's cache state is not known: about half the last-level cache.
    pub cold_from_bytes: u64,
    /// The measured cases.
    pub entries: Vec<PolicyEntry>,
    /// The lookup table [cold][concurrency-1][bucket], built on load.
    #[serde(skip)]
    table: Vec<Mover>,
    /// Sizes below this are memcpy in every case of the table (decided
    /// without a lookup); built on load.
    #[serde(skip)]
    pub memcpy_below: usize,
}

impl Policy {
    /// A policy from measured entries (validated; the table built).
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::mover::{Mover, Policy, PolicyEntry};
    /// let zero = PolicyEntry { log2_size: 20, concurrency: 1, cold: false, mover: Mover::Zero };
    /// let e = Policy::new("m".into(), 1 << 24, vec![zero]).unwrap_err();
    /// assert!(e.contains("zero copy is not a choice"), "{e}");
    /// assert!(Policy::new("m".into(), 1 << 24, vec![]).is_err()); // no entries
    /// ```
    pub fn new(
        machine: String,
        cold_from_bytes: u64,
        entries: Vec<PolicyEntry>,
    ) -> Result<Policy, String> {
        let mut p = Policy {
            version: POLICY_VERSION,
            machine,
            cold_from_bytes,
            entries,
            table: Vec::new(),
            memcpy_below: 0,
        };
        p.build()?;
        Ok(p)
    }

    /// A fixed policy: `m` for every case. Saved, it loads back as the same
    /// policy (one entry; a `zero` one is refused on load: zero copy is not
    /// a choice for bytes to move).
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::mover::{Mover, Policy};
    /// let p = Policy::fixed(Mover::NonTemporal);
    /// assert_eq!(p.choose(64, 1, None), Mover::NonTemporal);
    /// assert_eq!(p.choose(1 << 30, 8, Some(true)), Mover::NonTemporal);
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("nt.json");
    /// p.save(&path)?;
    /// assert_eq!(Policy::load(&path)?.choose(1 << 30, 8, Some(true)), Mover::NonTemporal);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fixed(m: Mover) -> Policy {
        Policy {
            version: POLICY_VERSION,
            machine: String::new(),
            cold_from_bytes: u64::MAX,
            entries: vec![PolicyEntry {
                log2_size: 0,
                concurrency: 1,
                cold: false,
                mover: m,
            }],
            table: vec![m; 2 * MAX_CONC * HALF_BUCKETS],
            memcpy_below: if m == Mover::Memcpy { usize::MAX } else { 0 },
        }
    }

    /// Checks the entries and builds the lookup table: each (cache state,
    /// concurrency, bucket) gets the entry nearest in log2 size among the
    /// entries of the nearest measured concurrency of that cache state (the
    /// other cache state's when a state has none).
    fn build(&mut self) -> Result<(), String> {
        if self.version != POLICY_VERSION {
            return Err(format!(
                "version {} (this build reads version {POLICY_VERSION})",
                self.version
            ));
        }
        if self.entries.is_empty() {
            return Err("no entries".into());
        }
        for e in &self.entries {
            if e.log2_size as usize >= BUCKETS {
                return Err(format!("log2_size {} out of range 0..=63", e.log2_size));
            }
            if e.concurrency == 0 || e.concurrency > 1024 {
                return Err(format!(
                    "concurrency {} out of range 1..=1024",
                    e.concurrency
                ));
            }
            if e.mover == Mover::Zero {
                return Err(
                    "an entry names 'zero' (zero copy is not a choice for bytes to move)".into(),
                );
            }
        }
        let mut table = vec![Mover::Memcpy; 2 * MAX_CONC * HALF_BUCKETS];
        for cold in [false, true] {
            let mut of_state: Vec<&PolicyEntry> =
                self.entries.iter().filter(|e| e.cold == cold).collect();
            if of_state.is_empty() {
                of_state = self.entries.iter().collect();
            }
            for conc in 1..=MAX_CONC {
                let near_c = of_state
                    .iter()
                    .map(|e| e.concurrency)
                    .min_by_key(|&c| ((c as i64 - conc as i64).abs(), c))
                    .unwrap_or(1);
                let row: Vec<&&PolicyEntry> = of_state
                    .iter()
                    .filter(|e| e.concurrency == near_c)
                    .collect();
                for hb in 0..HALF_BUCKETS {
                    // Distance in quarter octaves from the bucket's middle
                    // (log2 = (hb + 0.5) / 2) to the entry's size.
                    let best = row
                        .iter()
                        .min_by_key(|e| {
                            (
                                (4 * e.log2_size as i64 - 2 * hb as i64 - 1).abs(),
                                e.log2_size,
                            )
                        })
                        .map(|e| e.mover)
                        .unwrap_or(Mover::Memcpy);
                    table[Self::slot(cold, conc, hb)] = best;
                }
            }
        }
        // The first bucket where any case is not memcpy bounds the sizes
        // decided without a lookup.
        let first_other = (0..HALF_BUCKETS)
            .find(|&b| (0..2 * MAX_CONC).any(|row| table[row * HALF_BUCKETS + b] != Mover::Memcpy))
            .unwrap_or(HALF_BUCKETS);
        self.memcpy_below = if first_other >= HALF_BUCKETS {
            usize::MAX
        } else {
            half_bucket_start(first_other)
        };
        self.table = table;
        Ok(())
    }

    #[inline]
    fn slot(cold: bool, conc: usize, bucket: usize) -> usize {
        ((cold as usize) * MAX_CONC + (conc.clamp(1, MAX_CONC) - 1)) * HALF_BUCKETS + bucket
    }

    /// The mover for one copy of `bytes` with `concurrency` copies running
    /// at once (this one included); `cold`: whether the source is known to
    /// be out of cache (`None`: guessed from its size, `cold_from_bytes`).
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::mover::{Mover, Policy, PolicyEntry};
    /// let p = Policy::new("m".into(), 1 << 24, vec![
    ///     PolicyEntry { log2_size: 20, concurrency: 1, cold: false, mover: Mover::Memcpy },
    ///     PolicyEntry { log2_size: 20, concurrency: 1, cold: true, mover: Mover::NonTemporal },
    /// ])?;
    /// assert_eq!(p.choose(1 << 20, 1, Some(false)), Mover::Memcpy);
    /// assert_eq!(p.choose(1 << 20, 1, Some(true)), Mover::NonTemporal);
    /// assert_eq!(p.choose(1 << 26, 1, None), Mover::NonTemporal); // ≥ cold_from_bytes: taken as cold
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn choose(&self, bytes: usize, concurrency: usize, cold: Option<bool>) -> Mover {
        let cold = cold.unwrap_or(bytes as u64 >= self.cold_from_bytes);
        self.table[Self::slot(cold, concurrency, half_bucket(bytes))]
    }

    /// Reads and validates a policy file.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("p.json");
    /// std::fs::write(&path, "{}")?;
    /// let e = transport::mover::Policy::load(&path).unwrap_err();
    /// assert!(e.starts_with("not a policy"), "{e}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(path: &Path) -> Result<Policy, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let mut p: Policy =
            serde_json::from_str(&text).map_err(|e| format!("not a policy: {e}"))?;
        p.build()?;
        Ok(p)
    }

    /// Writes the policy as JSON. Example: [`Policy`].
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    }
}

/// Where `auto` looks for its policy when no file is given: the
/// `TENSORWIRE_MOVER_POLICY` environment variable, else
/// `$XDG_CONFIG_HOME/tensorwire/mover-policy.json`, else
/// `$HOME/.config/tensorwire/mover-policy.json`.
///
/// # Examples
///
/// ```
/// use transport::mover::default_policy_path;
/// match std::env::var_os("TENSORWIRE_MOVER_POLICY").filter(|p| !p.is_empty()) {
///     Some(p) => assert_eq!(default_policy_path(), Some(p.into())),
///     None => {
///         let p = default_policy_path().ok_or("HOME is set here")?;
///         assert!(p.ends_with("tensorwire/mover-policy.json"));
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn default_policy_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TENSORWIRE_MOVER_POLICY").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("tensorwire").join("mover-policy.json"))
}

static POLICY: OnceLock<Policy> = OnceLock::new();

/// The policy `auto` uses in this process, loaded at its first use: the
/// file [`set_policy_file`] named, else `TENSORWIRE_MOVER_POLICY`, else
/// the default path of [`default_policy_path`]. A named file that is
/// missing or bad, or a bad file at the default path, gives the fixed
/// `memcpy` policy and one warning on stderr naming the file and the
/// problem; no file at the default path gives `memcpy` silently (this
/// machine was not calibrated).
///
/// Example: [`set_policy_file`].
pub fn process_policy() -> &'static Policy {
    POLICY.get_or_init(|| {
        let named = std::env::var_os("TENSORWIRE_MOVER_POLICY").filter(|p| !p.is_empty());
        match default_policy_path() {
            Some(p) if named.is_some() || p.exists() => load_or_fallback(Some(&p)),
            _ => Policy::fixed(Mover::Memcpy),
        }
    })
}

/// Loads `path` as this process's policy (`--mover-policy FILE`), with the
/// fallback and warning of [`load_or_fallback`]; false when a policy was
/// already in use (the first one stays).
///
/// # Examples
///
/// What `serve --mover-policy FILE` does, before any copy:
///
/// ```
/// use transport::mover::{process_policy, set_policy_file, Mover, MoverChoice, Policy, PolicyEntry};
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("policy.json");
/// let nt = PolicyEntry { log2_size: 20, concurrency: 1, cold: false, mover: Mover::NonTemporal };
/// Policy::new("streaming everywhere".into(), u64::MAX, vec![nt])?.save(&path)?;
/// assert!(set_policy_file(&path));
/// assert_eq!(process_policy().choose(1 << 20, 1, None), Mover::NonTemporal);
/// assert_eq!(MoverChoice::Auto.decide(1 << 20).mover, Mover::NonTemporal);
/// assert!(!set_policy_file(&path)); // the first one stays
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn set_policy_file(path: &Path) -> bool {
    let mut set = false;
    POLICY.get_or_init(|| {
        set = true;
        load_or_fallback(Some(path))
    });
    set
}

/// Loads `path`, or falls back to fixed `memcpy` with a warning.
///
/// # Examples
///
/// ```
/// use transport::mover::{load_or_fallback, Mover};
/// let p = load_or_fallback(Some(std::path::Path::new("/nonexistent/policy.json"))); // warns
/// assert_eq!(p.choose(1 << 30, 1, None), Mover::Memcpy);
/// ```
pub fn load_or_fallback(path: Option<&Path>) -> Policy {
    let Some(path) = path else {
        eprintln!("tensorwire: warning: mover=auto but no mover policy path (set TENSORWIRE_MOVER_POLICY or HOME); using memcpy");
        return Policy::fixed(Mover::Memcpy);
    };
    match Policy::load(path) {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "tensorwire: warning: mover policy {}: {e}; using memcpy (run `tensorwire calibrate --out {}`)",
                path.display(),
                path.display()
            );
            Policy::fixed(Mover::Memcpy)
        }
    }
}

/// A mover decided for one copy; while it lives, a copy the policy was
/// asked about counts in the process's copies at once ([`Inflight`]).
/// Example: [`MoverChoice::decide`].
#[derive(Debug)]
pub struct Decision {
    /// The mover to use.
    pub mover: Mover,
    _inflight: Option<Inflight>,
}

impl MoverChoice {
    /// The mover for one copy of `bytes` that is not already in place.
    /// `Fixed`: that mover, at no cost. `Auto`: the process policy's choice
    /// at this size, cache state guessed from it, and the copies running
    /// now (this one counted while the [`Decision`] lives); sizes below the
    /// policy's `memcpy_below` (memcpy in every case it measured) are
    /// decided by one comparison, without counting them. `Zero` cannot move
    /// bytes and is returned as is (the caller refuses or skips).
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::mover::{Mover, MoverChoice};
    /// assert_eq!(MoverChoice::Fixed(Mover::Kernel).decide(1 << 20).mover, Mover::Kernel);
    /// assert_eq!(MoverChoice::Auto.decide(64).mover, Mover::Memcpy); // small: memcpy in every policy here
    /// ```
    #[inline]
    pub fn decide(self, bytes: usize) -> Decision {
        match self {
            MoverChoice::Fixed(mover) => Decision {
                mover,
                _inflight: None,
            },
            MoverChoice::Auto => {
                let p = process_policy();
                if bytes < p.memcpy_below {
                    return Decision {
                        mover: Mover::Memcpy,
                        _inflight: None,
                    };
                }
                let g = Inflight::enter();
                Decision {
                    mover: p.choose(bytes, g.concurrency(), None),
                    _inflight: Some(g),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn every_mover_copies_odd_sizes_and_alignments() {
        let sizes = [
            0usize,
            1,
            7,
            31,
            32,
            63,
            64,
            127,
            255,
            256,
            257,
            1000,
            4097,
            65_537,
            1 << 20,
        ];
        for &n in &sizes {
            for so in [0usize, 1, 3, 17, 32] {
                for d_off in [0usize, 1, 5, 16, 33] {
                    let src_buf = pattern(n + so, n as u8);
                    let src = &src_buf[so..so + n];
                    for m in [Mover::Memcpy, Mover::NonTemporal, Mover::Kernel] {
                        let mut dst_buf = vec![0xAAu8; n + d_off + 8];
                        copy(m, &mut dst_buf[d_off..d_off + n], src).unwrap();
                        assert_eq!(
                            &dst_buf[d_off..d_off + n],
                            src,
                            "{m} n={n} so={so} do={d_off}"
                        );
                        assert!(dst_buf[..d_off].iter().all(|&b| b == 0xAA));
                        assert!(dst_buf[d_off + n..].iter().all(|&b| b == 0xAA));
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sse2_path_copies() {
        for n in [256usize, 300, 4099] {
            let src = pattern(n + 3, 9);
            let mut dst = vec![0u8; n + 1];
            // SAFETY: valid, disjoint buffers of n bytes.
            unsafe { nt_sse2(dst.as_mut_ptr().add(1), src.as_ptr().add(3), n) };
            assert_eq!(&dst[1..], &src[3..]);
        }
    }

    #[test]
    fn zero_needs_the_bytes_in_place() {
        let mut a = vec![1u8; 8];
        let b = vec![1u8; 8];
        assert!(copy(Mover::Zero, &mut a, &b).is_err());
    }

    #[test]
    fn kernel_reads_a_child_process_and_refuses_bad_addresses() {
        // A child that has the pattern at the same address as ours (fork
        // copies the address space), then waits to be killed.
        let data = pattern(100_000, 5);
        let mut fds = [0i32; 2];
        // SAFETY: a two-int array for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only writes one byte and sleeps (both
        // async-signal-safe system calls).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: writing one byte from a static to our pipe.
            unsafe { libc::write(fds[1], b"x".as_ptr() as *const libc::c_void, 1) };
            loop {
                // SAFETY: plain sleep in the child.
                unsafe { libc::pause() };
            }
        }
        let mut b = [0u8; 1];
        // SAFETY: reading one byte into a local.
        let got = unsafe { libc::read(fds[0], b.as_mut_ptr() as *mut libc::c_void, 1) };
        assert_eq!(got, 1);
        // SAFETY: our own pipe ends, closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        let mut dst = vec![0u8; data.len()];
        let half = data.len() / 2;
        let ranges = [
            (data.as_ptr() as u64, half),
            (data.as_ptr() as u64 + half as u64, data.len() - half),
        ];
        kernel_read(pid, &ranges, &mut dst).unwrap();
        assert_eq!(dst, data);
        // A lie: an address the child does not have.
        let e = kernel_read(pid, &[(8, 16)], &mut [0u8; 16]).unwrap_err();
        assert!(
            matches!(e, MoverError::BadAddress { addr: 8, len: 16 }),
            "{e}"
        );
        // A good range followed by a bad one: an error, not a short copy.
        let mut two = vec![0u8; 32];
        let e = kernel_read(pid, &[(data.as_ptr() as u64, 16), (16, 16)], &mut two).unwrap_err();
        assert!(matches!(e, MoverError::BadAddress { .. }), "{e}");
        // SAFETY: killing and reaping our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        let e = kernel_read(pid, &ranges, &mut dst).unwrap_err();
        assert_eq!(e, MoverError::NoProcess(pid));
    }

    #[test]
    fn policy_picks_the_nearest_case_and_rejects_bad_files() {
        let e = |l, c, cold, m| PolicyEntry {
            log2_size: l,
            concurrency: c,
            cold,
            mover: m,
        };
        let p = Policy::new(
            "test".into(),
            1 << 24,
            vec![
                e(6, 1, false, Mover::Memcpy),
                e(20, 1, false, Mover::Memcpy),
                e(26, 1, false, Mover::NonTemporal),
                e(26, 1, true, Mover::Kernel),
                e(6, 2, false, Mover::Memcpy),
                e(26, 2, false, Mover::Kernel),
            ],
        )
        .unwrap();
        assert_eq!(p.choose(64, 1, Some(false)), Mover::Memcpy);
        assert_eq!(p.choose(3 << 24, 1, Some(false)), Mover::NonTemporal);
        // 2^22 is nearer 2^20 (memcpy) than 2^26; 3·2^23 nearer 2^26 (nt).
        assert_eq!(p.choose(1 << 22, 1, Some(false)), Mover::Memcpy);
        assert_eq!(p.choose(3 << 23, 1, Some(false)), Mover::NonTemporal);
        assert_eq!(p.choose(1 << 30, 1, Some(false)), Mover::NonTemporal);
        assert_eq!(p.choose(1 << 30, 3, Some(false)), Mover::Kernel);
        assert_eq!(p.choose(1, 1, Some(true)), Mover::Kernel);
        assert_eq!(p.choose(1 << 26, 1, None), Mover::Kernel);
        // Buckets 0..=5 are memcpy everywhere except the cold state, whose
        // nearest entry for every size is kernel: nothing is memcpy-only.
        assert_eq!(p.memcpy_below, 1);

        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.json");
        p.save(&f).unwrap();
        let q = Policy::load(&f).unwrap();
        assert_eq!(q.choose(3 << 24, 1, Some(false)), Mover::NonTemporal);
        std::fs::write(&f, "{ not json").unwrap();
        assert!(Policy::load(&f).unwrap_err().contains("not a policy"));
        std::fs::write(
            &f,
            r#"{"version":9,"machine":"","cold_from_bytes":1,"entries":[]}"#,
        )
        .unwrap();
        assert!(Policy::load(&f).unwrap_err().contains("version 9"));
        let fb = load_or_fallback(Some(&dir.path().join("missing.json")));
        assert_eq!(fb.choose(1 << 26, 2, None), Mover::Memcpy);
    }

    #[test]
    fn a_saved_fixed_policy_loads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        for m in [Mover::Memcpy, Mover::NonTemporal, Mover::Kernel] {
            let p = Policy::fixed(m);
            let f = dir.path().join(format!("{}.json", m.name()));
            p.save(&f).unwrap();
            let q = Policy::load(&f).unwrap_or_else(|e| panic!("{}: {e}", m.name()));
            assert!(q.table == p.table, "{}: another table", m.name());
            for size in (0..40).map(|k| 3usize << k) {
                for conc in [1, 2, 8] {
                    for cold in [None, Some(false), Some(true)] {
                        assert_eq!(q.choose(size, conc, cold), m, "{size} B, {conc}, {cold:?}");
                    }
                }
            }
        }
        let f = dir.path().join("zero.json");
        Policy::fixed(Mover::Zero).save(&f).unwrap();
        assert!(Policy::load(&f)
            .unwrap_err()
            .contains("zero copy is not a choice"));
    }

    #[test]
    fn half_buckets_split_octaves_at_root_two() {
        // Bucket 1 (sizes in [√2, 2)) holds no whole size.
        for hb in (0..HALF_BUCKETS).filter(|&hb| hb != 1) {
            let s = half_bucket_start(hb);
            assert_eq!(half_bucket(s), hb, "start of {hb}: {s}");
            if hb > 2 {
                assert_eq!(half_bucket(s - 1), hb - 1, "before {hb}: {s}");
            }
        }
        assert_eq!(half_bucket(0), 0);
        assert_eq!(half_bucket(usize::MAX), HALF_BUCKETS - 1);
        assert_eq!(half_bucket(3 << 20), 43);
        assert_eq!(half_bucket(1 << 20), 40);
    }

    #[test]
    fn choices_parse() {
        for s in ["auto", "memcpy", "nt", "kernel", "zero"] {
            assert_eq!(s.parse::<MoverChoice>().unwrap().to_string(), s);
        }
        assert!("fast"
            .parse::<MoverChoice>()
            .unwrap_err()
            .contains("unknown mover"));
    }
}
