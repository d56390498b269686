//! The client over `shm://`, end to end, against a real agent
//! ([`server::Agent`]) running in this process: zero-copy and copy-in
//! round trips at every size and dtype, the ONNX digits model bit for bit
//! against ONNX Runtime in-process, pipelining, releases of the agent's
//! region, a full arena, timeouts, and an agent that goes away.

use client::{Client, ClientError, ClientOptions, DType, Response, TensorRef};
use engine::{
    Backend, EngineError, ModelSignature, OrtBackend, OrtOptions, Output, OutputData, TensorView,
};
use server::{Agent, AgentConfig, ModelConfig, ModelRegistry};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};
use transport::Endpoint;
use wire::AlignedBuf;

/// No test may run longer than this.
const LIMIT: Duration = Duration::from_secs(120);

/// Points `TENSORWIRE_SHM_DIR` at a private temporary directory, once per
/// test process (before any control socket path is made).
fn setup() -> &'static std::path::Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().expect("temporary directory");
        std::env::set_var("TENSORWIRE_SHM_DIR", d.path());
        d
    })
    .path()
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// An agent listening on a fresh `shm://` name (plus a Unix socket and an
/// in-process name, for comparisons).
struct TestAgent {
    agent: Option<Agent>,
    shm: String,
    unix: String,
    inproc: String,
}

impl TestAgent {
    fn start(cfg: AgentConfig, registry: Option<ModelRegistry>) -> TestAgent {
        let dir = setup();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("tw-client-{}-{n}", std::process::id());
        let sock = dir.join(format!("u{n}.sock"));
        let mut cfg = cfg;
        cfg.listen = vec![
            Endpoint::Shm(name.clone()),
            Endpoint::Unix(sock.clone()),
            Endpoint::Inproc(name.clone()),
        ];
        let agent = match registry {
            Some(r) => Agent::with_registry(cfg, r),
            None => Agent::start(cfg),
        }
        .unwrap_or_else(|e| panic!("agent did not start: {e}"));
        TestAgent {
            agent: Some(agent),
            shm: format!("shm://{name}"),
            unix: format!("unix://{}", sock.display()),
            inproc: format!("inproc://{name}"),
        }
    }

    fn identity() -> TestAgent {
        TestAgent::start(AgentConfig::default(), None)
    }

    fn take(&mut self) -> Agent {
        self.agent.take().expect("agent already taken")
    }
}

fn connect(uri: &str) -> Client {
    Client::connect(uri).unwrap_or_else(|e| panic!("connect {uri}: {e}"))
}

fn connect_with(uri: &str, opts: ClientOptions) -> Client {
    Client::connect_with(uri, opts).unwrap_or_else(|e| panic!("connect {uri}: {e}"))
}

/// Runs `f` on its own thread; panics if it takes longer than `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => {
            let _ = h.join();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => panic!("finished without a result"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("still running after {limit:?} (hang?)"),
    }
}

/// `len` deterministic pseudo-random bytes (0/1 only when `bool_values`).
fn pattern(len: usize, seed: u64, bool_values: bool) -> Vec<u8> {
    let mut out = vec![0u8; len];
    fill(&mut out, seed, bool_values);
    out
}

fn fill(out: &mut [u8], seed: u64, bool_values: bool) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    if bool_values {
        out.iter_mut().for_each(|b| *b &= 1);
    }
}

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/build")
}

fn read_built(name: &str) -> Vec<u8> {
    let p = models_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run `bash scripts/setup.sh` to build the models)",
            p.display()
        )
    })
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn argmax_rows(v: &[f32], cols: usize) -> Vec<usize> {
    v.chunks_exact(cols)
        .map(|r| {
            r.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
                .expect("row")
        })
        .collect()
}

/// A backend that takes anything, sleeps `delay`, and returns copies of its
/// inputs (owned outputs: over shm they land in the agent's region).
struct CopyBackend {
    signature: ModelSignature,
    delay: Duration,
}

impl CopyBackend {
    fn registry(delay: Duration) -> ModelRegistry {
        let mut r = ModelRegistry::with_identity();
        r.add(
            Arc::new(CopyBackend {
                signature: ModelSignature {
                    name: "copy".into(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                },
                delay,
            }),
            1,
        );
        r
    }
}

impl Backend for CopyBackend {
    fn signature(&self) -> &ModelSignature {
        &self.signature
    }

    fn check_inputs(&self, _inputs: &[(DType, &[u64])]) -> Result<(), EngineError> {
        Ok(())
    }

    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
        std::thread::sleep(self.delay);
        inputs
            .iter()
            .map(|t| {
                Ok(Output {
                    dtype: t.dtype,
                    shape: t.shape.to_vec(),
                    data: OutputData::Owned(
                        AlignedBuf::copy_from(t.data)
                            .map_err(|e| EngineError::InvalidInput(e.to_string()))?,
                    ),
                })
            })
            .collect()
    }
}

fn check_echo(r: &Response, inputs: &[TensorRef<'_>], what: &str) {
    assert_eq!(r.outputs.len(), inputs.len(), "{what}");
    for (o, i) in r.outputs.iter().zip(inputs) {
        assert_eq!(o.dtype, i.dtype, "{what}");
        assert_eq!(o.shape, i.shape, "{what}");
        assert!(o.bytes() == i.data, "{what}: bytes differ");
    }
}

// ---------------------------------------------------------------------------

#[test]
fn zero_copy_identity_at_every_size_and_dtype() {
    within(LIMIT, || {
        let agent = TestAgent::identity();
        let c = connect(&agent.shm);
        let m = c.model("identity").expect("identity");
        let mut sent = 0u64;
        let mut round_trip = |dtype: DType, elems: usize, seed: u64| {
            let shape = [elems as u64];
            let mut buf = c.alloc_tensor(dtype, &shape).expect("alloc_tensor");
            assert!(buf.in_arena());
            assert_eq!(buf.len(), elems * dtype.size());
            assert_eq!(buf.as_ptr() as usize % 64, 0);
            fill(&mut buf, seed, dtype == DType::Bool);
            let want = buf.to_vec();
            let r = m.infer(&[buf.as_ref()]).expect("infer");
            sent += 1;
            let out = &r.outputs[0];
            assert_eq!((out.dtype, &out.shape[..]), (dtype, &shape[..]));
            assert!(out.bytes() == &want[..], "{dtype} × {elems}: bytes differ");
            // The identity model's output is the input, in place.
            assert_eq!(out.bytes().as_ptr(), buf.as_ptr(), "{dtype} × {elems}");
            assert!(
                buf.try_as_mut_bytes().is_none(),
                "an output still views it: not writable"
            );
            drop(r);
            assert!(buf.try_as_mut_bytes().is_some(), "writable again");
        };
        for (i, &len) in [
            0usize,
            1,
            63,
            64,
            65,
            4096,
            65_539,
            1 << 20,
            16 << 20,
            64 << 20,
        ]
        .iter()
        .enumerate()
        {
            round_trip(DType::U8, len, i as u64);
        }
        for (i, dtype) in DType::ALL.into_iter().enumerate() {
            for elems in [0, 1, 1000, (1 << 20) / dtype.size()] {
                round_trip(dtype, elems, 100 + i as u64);
            }
        }
        let s = c.copy_stats();
        assert_eq!(s.input_bytes_copied, 0, "zero-copy API: nothing copied");
        assert_eq!(s.output_bytes_copied, 0);
        assert_eq!(s.requests, sent);
        let info = c.shm_info().expect("shm session");
        assert_eq!(info.client_free, info.client_len, "every allocation freed");
    });
}

#[test]
fn copy_in_copies_exactly_the_inputs_once() {
    within(LIMIT, || {
        let agent = TestAgent::identity();
        let c = connect(&agent.shm);
        let m = c.model("identity").expect("identity");
        let mut expect = 0u64;
        for (i, &len) in [0usize, 1, 100, 4096, 1 << 20, 16 << 20, 64 << 20]
            .iter()
            .enumerate()
        {
            let a = pattern(len, i as u64, false);
            let b = pattern(24, 7, false);
            let shape_a = [len as u64];
            let inputs = [
                TensorRef::new(DType::U8, &shape_a, &a).unwrap(),
                TensorRef::new(DType::F64, &[3], &b).unwrap(),
            ];
            let r = m.infer(&inputs).expect("infer");
            check_echo(&r, &inputs, &format!("{len} bytes"));
            expect += (len + 24) as u64;
            assert_eq!(c.copy_stats().input_bytes_copied, expect, "{len} bytes");
        }
        // Every dtype, copied in.
        for (i, dtype) in DType::ALL.into_iter().enumerate() {
            let data = pattern(dtype.size() * 333, i as u64, dtype == DType::Bool);
            let inputs = [TensorRef::new(dtype, &[3, 111], &data).unwrap()];
            check_echo(&m.infer(&inputs).unwrap(), &inputs, &format!("{dtype}"));
            expect += data.len() as u64;
        }
        let s = c.copy_stats();
        assert_eq!(s.input_bytes_copied, expect);
        assert_eq!(s.output_bytes_copied, 0);
        let info = c.shm_info().unwrap();
        assert_eq!(info.client_free, info.client_len);
    });
}

#[test]
fn mixed_inputs_copy_only_what_is_not_in_the_arena() {
    within(LIMIT, || {
        let agent = TestAgent::identity();
        let c = connect(&agent.shm);
        let m = c.model("identity").expect("identity");
        let mut buf = c.alloc_tensor(DType::F32, &[256]).unwrap();
        buf.as_mut_slice::<f32>()
            .unwrap()
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = i as f32);
        let v = pattern(1000, 3, false);
        let before = c.copy_stats().input_bytes_copied;
        let inputs = [
            buf.as_ref(),
            TensorRef::new(DType::U8, &[1000], &v).unwrap(),
        ];
        let r = m.infer(&inputs).unwrap();
        check_echo(&r, &inputs, "mixed");
        assert_eq!(c.copy_stats().input_bytes_copied - before, 1000);
        assert_eq!(r.outputs[1].as_slice::<u8>().unwrap(), &v[..]);

        // An output that aliases an arena allocation goes back in place.
        let before = c.copy_stats().input_bytes_copied;
        let again = m.infer(&[r.outputs[0].as_ref()]).unwrap();
        assert_eq!(c.copy_stats().input_bytes_copied, before, "sent in place");
        assert_eq!(again.outputs[0].bytes().as_ptr(), buf.as_ptr());
        assert_eq!(again.outputs[0].as_slice::<f32>().unwrap()[255], 255.0);
        drop((r, again));

        // The same buffer twice would overlap: the second is copied.
        let before = c.copy_stats().input_bytes_copied;
        let inputs = [buf.as_ref(), buf.as_ref()];
        let r = m.infer(&inputs).unwrap();
        check_echo(&r, &inputs, "twice");
        assert_eq!(c.copy_stats().input_bytes_copied - before, 1024);
        drop(r);

        // A slice of an allocation at an unaligned offset is copied.
        let before = c.copy_stats().input_bytes_copied;
        let inputs = [TensorRef::new(DType::U8, &[10], &buf[4..14]).unwrap()];
        check_echo(&m.infer(&inputs).unwrap(), &inputs, "unaligned");
        assert_eq!(c.copy_stats().input_bytes_copied - before, 10);
        // An aligned sub-slice is sent in place.
        let before = c.copy_stats().input_bytes_copied;
        let inputs = [TensorRef::new(DType::U8, &[64], &buf[64..128]).unwrap()];
        let r = m.infer(&inputs).unwrap();
        check_echo(&r, &inputs, "aligned sub-slice");
        assert_eq!(c.copy_stats().input_bytes_copied, before);
        assert_eq!(r.outputs[0].bytes().as_ptr(), buf[64..].as_ptr());
    });
}

#[test]
fn tensor_buf_is_not_writable_while_a_request_reads_it() {
    within(LIMIT, || {
        let agent = TestAgent::start(
            AgentConfig::default(),
            Some(CopyBackend::registry(Duration::from_millis(100))),
        );
        let c = connect(&agent.shm);
        let m = c.model("copy").unwrap();
        let mut buf = c.alloc_tensor(DType::U8, &[4096]).unwrap();
        fill(&mut buf, 1, false);
        let t = m.submit(&[buf.as_ref()]).unwrap();
        assert!(buf.try_as_mut_bytes().is_none(), "pinned by the request");
        assert!(buf.as_mut_slice::<u8>().is_err());
        let r = t.wait().unwrap();
        assert!(r.outputs[0].bytes() == buf.bytes());
        assert_ne!(r.outputs[0].bytes().as_ptr(), buf.as_ptr(), "a copy");
        assert!(buf.try_as_mut_bytes().is_some(), "unpinned by the response");

        // A dropped ticket keeps its input pinned until the response comes.
        let t = m.submit(&[buf.as_ref()]).unwrap();
        drop(t);
        assert!(
            buf.try_as_mut_bytes().is_none(),
            "the agent may still read it"
        );
        c.ping().unwrap(); // answered after the abandoned request
        assert!(buf.try_as_mut_bytes().is_some());
    });
}

#[test]
fn digits_onnx_is_bit_identical_to_in_process() {
    within(LIMIT, || {
        let path = models_dir().join("digits_mlp.onnx");
        let input = read_built("digits_mlp_input.bin");
        assert_eq!(input.len(), 4 * 64 * 4);
        let expected = f32s(&read_built("digits_mlp_expected.bin"));
        let local = OrtBackend::load("digits", &path, &OrtOptions::default())
            .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
        let local_run = |x: &[u8], shape: &[u64]| {
            let buf = AlignedBuf::copy_from(x).unwrap();
            let views = [TensorView::new(DType::F32, shape, &buf)];
            let outs = local.run(&views).expect("local run");
            outs[0].bytes(&views).to_vec()
        };
        let want4 = local_run(&input, &[4, 64]);
        let want1 = local_run(&input[..256], &[1, 64]);
        assert_eq!(
            argmax_rows(&f32s(&want4), 10),
            argmax_rows(&expected, 10),
            "local run vs the Python reference"
        );

        let cfg = AgentConfig {
            models: vec![ModelConfig::new("digits", path.clone())],
            ..AgentConfig::default()
        };
        let agent = TestAgent::start(cfg, None);
        let c = connect(&agent.shm);
        let m = c.model("digits").unwrap();
        assert_eq!(m.signature(), local.signature());
        for round in 0..50 {
            // Copy-in.
            let r = m
                .infer(&[TensorRef::new(DType::F32, &[4, 64], &input).unwrap()])
                .unwrap();
            assert_eq!(r.outputs[0].shape, vec![4, 10]);
            assert!(r.outputs[0].bytes() == &want4[..], "round {round}: copy-in");
            // Zero copy.
            let mut x = c.alloc_tensor(DType::F32, &[1, 64]).unwrap();
            x.copy_from_slice(&input[..256]);
            let r = m.infer(&[x.as_ref()]).unwrap();
            assert_eq!(r.outputs[0].shape, vec![1, 10]);
            assert!(
                r.outputs[0].bytes() == &want1[..],
                "round {round}: zero-copy"
            );
        }
        // Typed access in place.
        let r = m
            .infer(&[TensorRef::new(DType::F32, &[4, 64], &input).unwrap()])
            .unwrap();
        let logits = r.outputs[0].as_slice::<f32>().unwrap();
        assert_eq!(argmax_rows(logits, 10), argmax_rows(&expected, 10));
    });
}

#[test]
fn pipelining_1000_requests_32_in_flight() {
    within(LIMIT, || {
        let agent = TestAgent::identity();
        let c = connect(&agent.shm);
        let m = c.model("identity").unwrap();
        let mut q: VecDeque<(u64, Vec<u8>, client::Ticket)> = VecDeque::new();
        let check = |(i, data, t): (u64, Vec<u8>, client::Ticket)| {
            let r = t.wait().unwrap_or_else(|e| panic!("request {i}: {e}"));
            assert!(r.outputs[0].bytes() == &data[..], "request {i}");
        };
        for i in 0..1000u64 {
            let data = pattern((i as usize * 97) % 5000, i, false);
            let shape = [data.len() as u64];
            let t = m
                .submit(&[TensorRef::new(DType::U8, &shape, &data).unwrap()])
                .unwrap_or_else(|e| panic!("submit {i}: {e}"));
            q.push_back((i, data, t));
            if q.len() == 32 {
                check(q.pop_front().unwrap());
            }
        }
        q.drain(..).for_each(check);

        // Zero copy, waited out of order (newest first in each window).
        let mut bufs: Vec<_> = (0..32)
            .map(|i| {
                let mut b = c.alloc_tensor(DType::U16, &[100 + i]).unwrap();
                fill(&mut b, i, false);
                b
            })
            .collect();
        let before = c.copy_stats().input_bytes_copied;
        for _ in 0..20 {
            let tickets: Vec<_> = bufs
                .iter()
                .map(|b| m.submit(&[b.as_ref()]).unwrap())
                .collect();
            for (b, t) in bufs.iter().zip(tickets).rev() {
                let r = t.wait().unwrap();
                assert_eq!(r.outputs[0].bytes().as_ptr(), b.as_ptr());
            }
        }
        assert_eq!(c.copy_stats().input_bytes_copied, before);
        for b in &mut bufs {
            assert!(b.try_as_mut_bytes().is_some());
        }

        // Four threads share the session, each with 8 in flight.
        std::thread::scope(|s| {
            for th in 0..4u64 {
                let m = m.clone();
                s.spawn(move || {
                    let mut q = VecDeque::new();
                    for i in 0..250u64 {
                        let data = pattern(64 + (i as usize * 31) % 3000, th * 1000 + i, false);
                        let shape = [data.len() as u64];
                        let t = m
                            .submit(&[TensorRef::new(DType::U8, &shape, &data).unwrap()])
                            .unwrap();
                        q.push_back((i, data, t));
                        if q.len() == 8 {
                            let (i, data, t) = q.pop_front().unwrap();
                            let r = t.wait().unwrap_or_else(|e| panic!("{th}/{i}: {e}"));
                            assert!(r.outputs[0].bytes() == &data[..], "{th}/{i}");
                        }
                    }
                    for (i, data, t) in q {
                        let r = t.wait().unwrap();
                        assert!(r.outputs[0].bytes() == &data[..], "{th}/{i}");
                    }
                });
            }
        });
        drop(bufs);
        let info = c.shm_info().unwrap();
        assert_eq!(info.client_free, info.client_len, "nothing leaked");
    });
}

#[test]
fn release_keeps_the_agent_region_from_filling() {
    within(LIMIT, || {
        // Room for exactly four 256 KiB outputs.
        let cfg = AgentConfig {
            shm_agent_bytes: 1 << 20,
            ..AgentConfig::default()
        };
        let agent = TestAgent::start(cfg, Some(CopyBackend::registry(Duration::ZERO)));
        let c = connect(&agent.shm);
        assert_eq!(c.shm_info().unwrap().agent_len, 1 << 20);
        let m = c.model("copy").unwrap();
        let mut x = c.alloc_tensor(DType::U8, &[256 << 10]).unwrap();
        fill(&mut x, 9, false);
        // Ten times more responses than fit, each dropped after use.
        for i in 0..40 {
            let r = m
                .infer(&[x.as_ref()])
                .unwrap_or_else(|e| panic!("response {i}: {e}"));
            assert!(r.outputs[0].bytes() == x.bytes(), "response {i}");
        }
        // Held responses fill it: a clear error, then room again once dropped.
        let held: Vec<Response> = (0..4).map(|_| m.infer(&[x.as_ref()]).unwrap()).collect();
        match m.infer(&[x.as_ref()]) {
            Err(ClientError::LimitExceeded(msg)) => assert!(!msg.is_empty()),
            other => panic!("agent region full: expected limit-exceeded, got {other:?}"),
        }
        for r in &held {
            assert!(r.outputs[0].bytes() == x.bytes(), "held outputs intact");
        }
        drop(held);
        let r = m.infer(&[x.as_ref()]).expect("room after the releases");
        assert!(r.outputs[0].bytes() == x.bytes());
        drop(r);
        // Several outputs of one response share one release; clones keep it.
        let two = m.infer(&[x.as_ref(), x.as_ref()]).unwrap();
        let keep = two.outputs[1].clone();
        drop(two);
        for _ in 0..3 {
            drop(m.infer(&[x.as_ref()]).unwrap()); // beside the 2 blocks `keep` holds
        }
        assert!(keep.bytes() == x.bytes());
        drop(keep);
        // Abandoned tickets: their outputs are released when they arrive.
        for _ in 0..40 {
            drop(m.submit(&[x.as_ref()]).unwrap());
        }
        c.ping().unwrap(); // every abandoned response has come by now
        for i in 0..40 {
            drop(
                m.infer(&[x.as_ref()])
                    .unwrap_or_else(|e| panic!("after abandoned tickets, {i}: {e}")),
            );
        }
    });
}

#[test]
fn digits_outputs_are_released_too() {
    within(LIMIT, || {
        let path = models_dir().join("digits_mlp.onnx");
        let input = read_built("digits_mlp_input.bin");
        let cfg = AgentConfig {
            models: vec![ModelConfig::new("digits", path)],
            // One page: a few dozen 160-byte outputs at most.
            shm_agent_bytes: 4096,
            ..AgentConfig::default()
        };
        let agent = TestAgent::start(cfg, None);
        let c = connect(&agent.shm);
        let m = c.model("digits").unwrap();
        let x = TensorRef::new(DType::F32, &[4, 64], &input).unwrap();
        let first = m.infer(&[x]).unwrap().outputs[0].bytes().to_vec();
        for i in 0..500 {
            let r = m.infer(&[x]).unwrap_or_else(|e| panic!("request {i}: {e}"));
            assert!(r.outputs[0].bytes() == &first[..], "request {i}");
        }
    });
}

#[test]
fn a_full_arena_is_a_clear_error_not_corruption() {
    within(LIMIT, || {
        let cfg = AgentConfig {
            shm_client_bytes: 1 << 20,
            ..AgentConfig::default()
        };
        let agent = TestAgent::start(cfg, None);
        let c = connect(&agent.shm);
        let m = c.model("identity").unwrap();
        assert_eq!(c.limits().max_payload, 1 << 20, "a message fits the region");
        let mut a = c.alloc_tensor(DType::U8, &[512 << 10]).unwrap();
        let mut b = c.alloc_tensor(DType::U8, &[512 << 10]).unwrap();
        fill(&mut a, 1, false);
        fill(&mut b, 2, false);
        let full = |r: Result<_, ClientError>| match r {
            Err(ClientError::LimitExceeded(msg)) => {
                assert!(msg.contains("shm arena full"), "{msg}")
            }
            Err(e) => panic!("expected 'shm arena full', got {e}"),
            Ok(_) => panic!("expected 'shm arena full', got success"),
        };
        full(c.alloc_tensor(DType::U8, &[1]).map(|_| ()));
        let v = pattern(100, 5, false);
        full(
            m.infer(&[TensorRef::new(DType::U8, &[100], &v).unwrap()])
                .map(|_| ()),
        );
        // Zero copy still works with a full arena, and nothing was damaged.
        let r = m.infer(&[a.as_ref(), b.as_ref()]).unwrap();
        assert!(r.outputs[0].bytes() == a.bytes());
        assert!(r.outputs[1].bytes() == b.bytes());
        assert!(matches!(
            c.alloc_tensor(DType::U8, &[2 << 20]),
            Err(ClientError::LimitExceeded(_))
        ));
        assert!(matches!(
            c.alloc_tensor(DType::U64, &[u64::MAX]),
            Err(ClientError::InvalidInput(_))
        ));
        drop((r, a));
        let r = m
            .infer(&[TensorRef::new(DType::U8, &[100], &v).unwrap()])
            .unwrap();
        assert!(r.outputs[0].bytes() == &v[..]);
    });
}

#[test]
fn models_timeline_and_control_messages_over_shm() {
    within(LIMIT, || {
        let agent = TestAgent::identity();
        let opts = ClientOptions {
            want_timeline: true,
            ..ClientOptions::default()
        };
        let c = connect_with(&agent.shm, opts);
        assert!(c.uri().starts_with("shm://"));
        assert!(c.ping().is_ok());
        assert!(c
            .models()
            .unwrap()
            .iter()
            .any(|m| m.signature.name == "identity"));
        assert!(matches!(c.model("nope"), Err(ClientError::UnknownModel(_))));
        let m = c.model("identity").unwrap();
        let r = m
            .infer(&[TensorRef::from_slice(&[2], &[1u32, 2]).unwrap()])
            .unwrap();
        let tl = r.timeline.expect("timeline asked for");
        assert!(tl.stamps.iter().any(|&s| s != 0), "{tl:?}");
        assert_eq!(r.outputs[0].to_vec::<u32>().unwrap(), vec![1, 2]);
        assert!(Client::connect("shm://no-such-agent-here").is_err());
    });
}

#[test]
fn copy_stats_on_every_transport() {
    within(LIMIT, || {
        let agent = TestAgent::identity();
        for uri in [&agent.shm, &agent.unix, &agent.inproc] {
            let c = connect(uri);
            let m = c.model("identity").unwrap();
            for len in [0usize, 100, 5000, 1 << 20] {
                let mut x = c.alloc_tensor(DType::U8, &[len as u64]).unwrap();
                assert_eq!(x.in_arena(), uri.starts_with("shm://"), "{uri}");
                fill(&mut x, len as u64, false);
                let r = m.infer(&[x.as_ref()]).unwrap();
                assert!(r.outputs[0].bytes() == x.bytes(), "{uri} {len}");
            }
            let s = c.copy_stats();
            assert_eq!(s.input_bytes_copied, 0, "{uri}");
            assert_eq!(s.output_bytes_copied, 0, "{uri}");
            assert_eq!(s.requests, 4, "{uri}");
            if uri.starts_with("unix://") {
                // At most the staging buffer's worth per response.
                assert!(s.staged_bytes <= 4 * 8192, "{uri}: {s:?}");
            } else {
                assert_eq!(s.staged_bytes, 0, "{uri}");
            }
            assert_eq!(c.shm_info().is_some(), uri.starts_with("shm://"));
        }
    });
}

#[test]
fn timeouts_and_the_in_flight_limit() {
    within(LIMIT, || {
        let agent = TestAgent::start(
            AgentConfig::default(),
            Some(CopyBackend::registry(Duration::from_millis(300))),
        );
        let opts = ClientOptions {
            timeout: Duration::from_millis(100),
            limits: wire::Limits {
                max_in_flight: 2,
                ..ClientOptions::default().limits
            },
            ..ClientOptions::default()
        };
        let c = connect_with(&agent.shm, opts);
        assert_eq!(c.limits().max_in_flight, 2);
        let m = c.model("copy").unwrap();
        let v = pattern(1000, 1, false);
        let x = TensorRef::new(DType::U8, &[1000], &v).unwrap();
        let t = Instant::now();
        assert!(matches!(m.infer(&[x]), Err(ClientError::Timeout(_))));
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
        // The timed-out request is still in flight; one more fits, not two.
        let t1 = m.submit(&[x]).unwrap();
        assert!(matches!(
            m.submit(&[x]),
            Err(ClientError::TooManyInFlight(2))
        ));
        drop(t1);
        // Once the late answers come (and are discarded), all is free again.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let _ = c.ping();
            let info = c.shm_info().unwrap();
            if info.client_free == info.client_len {
                break;
            }
            assert!(Instant::now() < deadline, "pins never released: {info:?}");
        }
        let ok = Client::connect_with(
            &agent.shm,
            ClientOptions {
                timeout: Duration::from_secs(10),
                ..ClientOptions::default()
            },
        )
        .unwrap();
        let r = ok.model("copy").unwrap().infer(&[x]).unwrap();
        assert!(r.outputs[0].bytes() == &v[..]);
    });
}

#[test]
fn agent_gone_is_noticed_within_the_timeout() {
    within(LIMIT, || {
        // Idle client, agent stopped: the next call fails at once.
        let mut agent = TestAgent::identity();
        let opts = ClientOptions {
            timeout: Duration::from_secs(20),
            ..ClientOptions::default()
        };
        let c = connect_with(&agent.shm, opts.clone());
        let m = c.model("identity").unwrap();
        let mut x = c.alloc_tensor(DType::U8, &[4096]).unwrap();
        fill(&mut x, 4, false);
        let held = m.infer(&[x.as_ref()]).unwrap();
        agent.take().shutdown(Duration::from_secs(1));
        let t = Instant::now();
        match m.infer(&[x.as_ref()]) {
            Err(ClientError::AgentGone(_)) => {}
            other => panic!("expected AgentGone, got {other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(matches!(c.ping(), Err(ClientError::AgentGone(_))));
        // What the client holds stays readable.
        assert!(held.outputs[0].bytes() == x.bytes());

        // A client waiting on a long request when the agent goes away.
        let mut agent = TestAgent::start(
            AgentConfig::default(),
            Some(CopyBackend::registry(Duration::from_secs(3))),
        );
        let c = connect_with(&agent.shm, opts);
        let m = c.model("copy").unwrap();
        let waiting = std::thread::spawn(move || {
            let t = Instant::now();
            let r = m.infer(&[TensorRef::new(DType::U8, &[3], &[1, 2, 3]).unwrap()]);
            (r.map(|_| ()), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(200));
        let a = agent.take();
        std::thread::spawn(move || a.shutdown(Duration::ZERO));
        let (r, took) = waiting.join().unwrap();
        match r {
            Err(ClientError::AgentGone(_)) => {}
            other => panic!("expected AgentGone, got {other:?}"),
        }
        assert!(took < Duration::from_secs(20), "{took:?}");
    });
}

#[test]
fn a_tiny_ring_back_pressures_pipelined_senders_without_deadlock() {
    within(LIMIT, || {
        // Eight slots per ring: two requests (or responses) at most.
        let cfg = AgentConfig {
            shm_ring_slots: 8,
            ..AgentConfig::default()
        };
        let agent = TestAgent::start(cfg, None);
        let c = connect(&agent.shm);
        assert_eq!(c.limits().max_desc_len, 7 * 64);
        let m = c.model("identity").unwrap();
        let shape = [2u64, 1, 1, 1, 1, 1, 1, 50]; // an 88-byte descriptor
        let mut q = VecDeque::new();
        for i in 0..400u64 {
            let data = pattern(100, i, false);
            let t = m
                .submit(&[TensorRef::new(DType::U8, &shape, &data).unwrap()])
                .unwrap_or_else(|e| panic!("submit {i}: {e}"));
            q.push_back((i, data, t));
            if q.len() == 32 {
                let (i, data, t) = q.pop_front().unwrap();
                let r = t.wait().unwrap_or_else(|e| panic!("wait {i}: {e}"));
                assert!(r.outputs[0].bytes() == &data[..], "request {i}");
            }
        }
        for (i, data, t) in q {
            let r = t.wait().unwrap_or_else(|e| panic!("wait {i}: {e}"));
            assert!(r.outputs[0].bytes() == &data[..], "request {i}");
        }
        // Threads sending and waiting at once on the tiny rings.
        std::thread::scope(|s| {
            for th in 0..3u64 {
                let m = m.clone();
                s.spawn(move || {
                    for i in 0..300u64 {
                        let data = pattern(64, th * 1000 + i, false);
                        let r = m
                            .infer(&[TensorRef::new(DType::U8, &[64], &data).unwrap()])
                            .unwrap_or_else(|e| panic!("{th}/{i}: {e}"));
                        assert!(r.outputs[0].bytes() == &data[..], "{th}/{i}");
                    }
                });
            }
        });
    });
}

#[test]
fn every_mover_moves_inputs_and_is_counted() {
    use transport::mover::Mover;
    within(LIMIT, || {
        let agent = TestAgent::identity();
        for (mover, want) in [
            ("memcpy", Mover::Memcpy),
            ("nt", Mover::NonTemporal),
            ("kernel", Mover::Kernel),
        ] {
            let c = connect(&format!("{}?mover={mover}", agent.shm));
            let m = c.model("identity").expect("identity");
            for len in [1usize, 63, 4099, 1 << 20] {
                let data = pattern(len, len as u64, false);
                let shape = [len as u64];
                let t = TensorRef::new(DType::U8, &shape, &data).expect("tensor");
                let r = m.infer(&[t]).expect("infer");
                assert!(
                    r.outputs[0].bytes() == &data[..],
                    "{mover} {len}: bytes differ"
                );
                assert_eq!(r.input_mover, Some(want), "{mover} {len}");
            }
            let s = c.mover_stats();
            assert_eq!(s.copies_of(want), 4, "{mover}: {s}");
            assert_eq!(s.bytes_of(want), 1 + 63 + 4099 + (1 << 20), "{mover}: {s}");
            // An arena tensor is sent where it lies, whatever the mover.
            let mut buf = c.alloc_tensor(DType::U8, &[64]).expect("alloc");
            buf.as_mut_bytes().fill(7);
            let r = m.infer(&[buf.as_ref()]).expect("infer");
            assert_eq!(r.input_mover, Some(Mover::Zero));
            assert_eq!(c.mover_stats().copies_of(Mover::Zero), 1);
        }
        // mover=zero refuses an input that is not in the arena, for that
        // call only.
        let c = connect(&format!("{}?mover=zero", agent.shm));
        let m = c.model("identity").expect("identity");
        let data = [1u8; 16];
        let t = TensorRef::new(DType::U8, &[16], &data).expect("tensor");
        let e = m.infer(&[t]).unwrap_err();
        assert!(e.to_string().contains("mover=zero"), "{e}");
        let buf = c.alloc_tensor(DType::U8, &[16]).expect("alloc");
        m.infer(&[buf.as_ref()])
            .expect("an arena tensor still goes");
    });
}
