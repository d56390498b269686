//! Shared-memory sessions against a real agent, driven by a minimal raw
//! client built on `transport::shm::ShmChannel` (no client crate): tensors
//! written into the client's region by hand, descriptors encoded by hand.

use crate::{Agent, AgentConfig, ModelConfig};
use engine::{Backend, OrtBackend, OrtOptions, TensorView};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use transport::shm::layout::AGENT_SLEEP;
use transport::shm::{control_path, futex, Layout, Ring, ShmChannel, ShmError, WaitPolicy};
use transport::Endpoint;
use wire::{
    decode_error_body, decode_tensor_section_in, encode_model_name, encode_tensor_section, flags,
    DType, Header, Kind, Limits, Placement, Stage, Status, TensorDesc, TensorSection,
};

fn unique_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "tw-server-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// An agent listening on a fresh `shm://` name, with small arenas.
fn start(edit: impl FnOnce(&mut AgentConfig)) -> (Agent, String) {
    let name = unique_name();
    let mut cfg = AgentConfig {
        listen: vec![Endpoint::Shm(name.clone())],
        shm_client_bytes: 1 << 20,
        shm_agent_bytes: 1 << 16,
        shm_ring_slots: 64,
        ..AgentConfig::default()
    };
    edit(&mut cfg);
    let agent = Agent::start(cfg).expect("agent starts");
    (agent, name)
}

fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn repo_file(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    assert!(
        p.is_file(),
        "{} is missing: run `bash scripts/setup.sh`",
        p.display()
    );
    p
}

/// The raw client: a channel and an id counter.
struct Raw {
    ch: ShmChannel,
    limits: Limits,
    next: u64,
}

impl Raw {
    fn connect(name: &str) -> Result<Raw, ShmError> {
        let path = control_path(name).unwrap();
        let (ch, limits) =
            ShmChannel::connect(&path, &Limits::default(), None, 1, Duration::from_secs(5))?;
        Ok(Raw {
            ch,
            limits,
            next: 10,
        })
    }

    fn layout(&self) -> Layout {
        *self.ch.layout()
    }

    /// Writes `bytes` at `off` of the data area.
    fn write(&self, off: u64, bytes: &[u8]) {
        let start = self.layout().data_off + off as usize;
        // SAFETY: the test owns these bytes of its client region; nothing
        // else in this process touches them meanwhile.
        unsafe { self.ch.arena().bytes_mut(start..start + bytes.len()) }.copy_from_slice(bytes);
    }

    fn read(&self, off: u64, len: u64) -> Vec<u8> {
        let start = self.layout().data_off + off as usize;
        self.ch.arena().bytes(start..start + len as usize).to_vec()
    }

    fn send(&mut self, h: &Header, desc: &[u8]) {
        assert!(self.ch.send(h, desc).unwrap(), "request ring full");
    }

    fn recv(&mut self) -> (Header, Vec<u8>) {
        self.ch
            .recv(
                &self.limits,
                WaitPolicy::CLIENT,
                Some(Duration::from_secs(5)),
            )
            .expect("a reply")
    }

    fn control(&mut self, kind: Kind, body: Vec<u8>) -> (Header, Vec<u8>) {
        let mut h = Header::new(kind);
        h.request_id = self.id();
        h.desc_len = body.len() as u32;
        self.send(&h, &body);
        let (r, b) = self.recv();
        assert_eq!(r.request_id, h.request_id);
        (r, b)
    }

    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn model_id(&mut self, name: &str) -> u32 {
        let (h, b) = self.control(Kind::ModelQuery, encode_model_name(name));
        assert_eq!(
            h.kind,
            Kind::ModelInfo,
            "{}",
            decode_error_body(&b).unwrap()
        );
        h.model_id
    }

    /// Sends a request for `model` over `tensors` (already in place);
    /// returns its id.
    fn submit(&mut self, model: u32, tensors: &[TensorDesc], timeline: bool) -> u64 {
        let mut desc = Vec::new();
        encode_tensor_section(tensors, None, &mut desc);
        let mut h = Header::new(Kind::Request);
        h.request_id = self.id();
        h.model_id = model;
        h.tensor_count = tensors.len() as u32;
        h.desc_len = desc.len() as u32;
        h.payload_len = tensors.iter().map(|t| t.len).sum();
        if timeline {
            h.flags = flags::WANT_TIMELINE;
        }
        self.send(&h, &desc);
        h.request_id
    }

    /// Sends a request and waits for its reply: the response's section, or
    /// the error's status and message.
    fn call(
        &mut self,
        model: u32,
        tensors: &[TensorDesc],
        timeline: bool,
    ) -> Result<(Header, TensorSection), (Status, String)> {
        let id = self.submit(model, tensors, timeline);
        let (h, b) = self.recv();
        assert_eq!(h.request_id, id);
        match h.kind {
            Kind::Response => {
                let region = Placement::Region {
                    len: self.layout().data_len as u64,
                };
                Ok((h, decode_tensor_section_in(&h, &b, region).unwrap()))
            }
            Kind::Error => Err((h.status, decode_error_body(&b).unwrap())),
            k => panic!("unexpected {k:?}"),
        }
    }

    fn release(&mut self, id: u64) {
        let mut h = Header::new(Kind::Release);
        h.request_id = id;
        self.send(&h, &[]);
    }
}

fn desc(dtype: DType, shape: &[u64], offset: u64) -> TensorDesc {
    TensorDesc {
        dtype,
        shape: shape.to_vec(),
        offset,
        len: TensorDesc::byte_len(dtype, shape).unwrap(),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn identity_round_trip_aliases_inputs_in_place() {
    let (agent, name) = start(|_| {});
    assert_eq!(agent.endpoints()[0].to_string(), format!("shm://{name}"));
    let mut c = Raw::connect(&name).unwrap();
    assert_eq!(c.limits.max_payload, c.layout().client_len as u64);
    assert_eq!(c.control(Kind::Ping, Vec::new()).0.kind, Kind::Pong);
    let (h, b) = c.control(Kind::ListModels, Vec::new());
    assert_eq!(h.kind, Kind::ModelList, "{b:?}");
    let id = c.model_id("identity");
    assert_eq!(agent.stats().shm_sessions, 1);

    // Two tensors, out of order in the client's region.
    let a = desc(DType::U8, &[1000], 4096);
    let b = desc(DType::F32, &[2, 3], 0);
    let (pa, pb) = (pattern(1000, 1), pattern(24, 7));
    c.write(a.offset, &pa);
    c.write(b.offset, &pb);
    for round in 0..3 {
        let (h, s) = c.call(id, &[a.clone(), b.clone()], true).unwrap();
        assert_eq!(h.payload_len, 1024);
        // Aliased: the same offsets, the same bytes, nothing moved.
        assert_eq!(s.tensors, vec![a.clone(), b.clone()], "round {round}");
        assert_eq!(c.read(a.offset, a.len), pa);
        assert_eq!(c.read(b.offset, b.len), pb);
        let tl = s.timeline.expect("timeline asked for");
        let stamps: Vec<u64> = Stage::ALL.iter().map(|&st| tl.get(st)).collect();
        assert!(stamps.iter().all(|&t| t > 0), "{stamps:?}");
        assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{stamps:?}");
    }
    // An empty request works too.
    let (_, s) = c.call(id, &[], false).unwrap();
    assert!(s.tensors.is_empty());
    let st = agent.stats();
    assert_eq!(st.shm_output_bytes_copied, 0, "identity copies nothing");
    assert_eq!(st.shm_output_bytes_in_place, 0);
    assert_eq!(st.shm_output_bytes_aliased, 3 * 1024);
    assert_eq!(st.responses, 4);
    // A Release of a response that holds nothing is ignored.
    c.release(11);
    assert_eq!(c.control(Kind::Ping, Vec::new()).0.kind, Kind::Pong);
}

/// Sends a pulled request (`flags::PULL`): `tensors` with one source
/// address each after the section; returns the reply.
fn call_pulled(
    c: &mut Raw,
    model: u32,
    tensors: &[TensorDesc],
    addrs: &[u64],
) -> Result<TensorSection, (Status, String)> {
    let mut desc = Vec::new();
    encode_tensor_section(tensors, None, &mut desc);
    for a in addrs {
        desc.extend_from_slice(&a.to_le_bytes());
    }
    let mut h = Header::new(Kind::Request);
    h.request_id = c.id();
    h.model_id = model;
    h.tensor_count = tensors.len() as u32;
    h.desc_len = desc.len() as u32;
    h.payload_len = tensors.iter().map(|t| t.len).sum();
    h.flags = flags::PULL;
    c.send(&h, &desc);
    let (r, b) = c.recv();
    assert_eq!(r.request_id, h.request_id);
    match r.kind {
        Kind::Response => {
            let region = Placement::Region {
                len: c.layout().data_len as u64,
            };
            Ok(decode_tensor_section_in(&r, &b, region).unwrap())
        }
        Kind::Error => Err((r.status, decode_error_body(&b).unwrap())),
        k => panic!("unexpected {k:?}"),
    }
}

#[test]
fn an_agent_pulls_only_when_started_to() {
    let (_agent, name) = start(|_| {});
    let mut c = Raw::connect(&name).unwrap();
    assert_eq!(
        Layout::features(c.ch.arena()),
        0,
        "pulls are off by default: not advertised"
    );
    let id = c.model_id("identity");
    let src = pattern(4096, 5);
    let a = desc(DType::U8, &[4096], 0);
    let (status, e) = call_pulled(&mut c, id, &[a], &[src.as_ptr() as u64])
        .expect_err("a pulled request to an agent that does not pull");
    assert_eq!(status, Status::InvalidInput);
    assert!(e.contains("--allow-kernel-pull"), "{e}");
    // The session goes on.
    assert_eq!(c.model_id("identity"), id);
}

#[test]
fn the_agent_pulls_inputs_by_address_and_refuses_lies_per_request() {
    let (agent, name) = start(|c| c.allow_kernel_pull = true);
    let mut c = Raw::connect(&name).unwrap();
    assert_eq!(
        Layout::features(c.ch.arena()) & transport::shm::layout::FEATURE_PULL,
        transport::shm::layout::FEATURE_PULL,
        "the agent advertises pulls"
    );
    let id = c.model_id("identity");
    // Two inputs: one pulled from this process's heap, one in place.
    let src = pattern(100_003, 3);
    let a = desc(DType::U8, &[100_003], 0);
    let b = desc(DType::U8, &[64], 128 * 1024);
    let pb = pattern(64, 9);
    c.write(b.offset, &pb);
    let s = call_pulled(
        &mut c,
        id,
        &[a.clone(), b.clone()],
        &[src.as_ptr() as u64, 0],
    )
    .unwrap();
    assert_eq!(s.tensors, vec![a.clone(), b.clone()]);
    assert_eq!(c.read(a.offset, a.len), src, "pulled into its slot");
    assert_eq!(c.read(b.offset, b.len), pb);
    assert_eq!(
        agent
            .stats()
            .movers
            .bytes_of(transport::mover::Mover::Kernel),
        100_003
    );
    // A client that lies about its addresses: an error for that request.
    for bad in [8u64, u64::MAX - 16, 0x7fff_ffff_0000] {
        let (status, msg) = call_pulled(&mut c, id, std::slice::from_ref(&a), &[bad]).unwrap_err();
        assert_eq!(status, Status::InvalidInput, "{msg}");
        assert!(msg.contains("not readable"), "{msg}");
    }
    // A section too short for its addresses: malformed, for that request.
    let (status, _) = call_pulled(&mut c, id, &[a.clone(), b.clone()], &[]).unwrap_err();
    assert_eq!(status, Status::Malformed);
    // The session goes on.
    let s = call_pulled(&mut c, id, std::slice::from_ref(&a), &[src.as_ptr() as u64]).unwrap();
    assert_eq!(s.tensors, vec![a]);
    assert_eq!(c.control(Kind::Ping, Vec::new()).0.kind, Kind::Pong);
}

fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn onnx_outputs_land_in_the_agent_region_until_released() {
    let model = repo_file("models/build/digits_mlp.onnx");
    let input = std::fs::read(repo_file("models/build/digits_mlp_input.bin")).unwrap();
    let expected =
        bytes_f32(&std::fs::read(repo_file("models/build/digits_mlp_expected.bin")).unwrap());
    assert_eq!(input.len(), 4 * 64 * 4);
    // In process, the same engine: the reference for bit equality.
    let local = OrtBackend::load("digits", &model, &OrtOptions::default()).unwrap();
    let buf = wire::AlignedBuf::copy_from(&input).unwrap();
    let shape = [4u64, 64];
    let out = local
        .run(&[TensorView::new(DType::F32, &shape, &buf)])
        .unwrap();
    let views = [TensorView::new(DType::F32, &shape, &buf)];
    let want = out[0].bytes(&views).to_vec();
    assert_eq!(want.len(), 160);
    for (g, e) in bytes_f32(&want).iter().zip(&expected) {
        assert!((g - e).abs() < 1e-4, "{g} vs {e}");
    }

    // 4 KiB of output area: 21 responses of 160 bytes (192 aligned) fit.
    let (agent, name) = start(|cfg| {
        cfg.models.push(ModelConfig::new("digits", model.clone()));
        cfg.shm_agent_bytes = 4096;
    });
    let mut c = Raw::connect(&name).unwrap();
    let id = c.model_id("digits");
    let x = desc(DType::F32, &shape, 128);
    c.write(x.offset, &input);
    let client_len = c.layout().client_len as u64;
    let mut held = Vec::new();
    let mut offsets = std::collections::HashSet::new();
    let err = loop {
        match c.call(id, std::slice::from_ref(&x), false) {
            Ok((h, s)) => {
                let t = &s.tensors[0];
                assert_eq!((t.dtype, &t.shape[..]), (DType::F32, &[4u64, 10][..]));
                assert!(t.offset >= client_len, "outputs live in the agent region");
                assert_eq!(h.payload_len, 160);
                assert_eq!(c.read(t.offset, t.len), want, "bit-identical to in-process");
                assert!(
                    offsets.insert(t.offset),
                    "a live output's block is never reused"
                );
                held.push(h.request_id);
            }
            Err(e) => break e,
        }
        assert!(held.len() < 100, "the area never filled");
    };
    assert_eq!(held.len(), 21);
    assert_eq!(err.0, Status::LimitExceeded);
    assert!(
        err.1.contains("output area is full") && err.1.contains("Release"),
        "{}",
        err.1
    );
    // The request's input was left as it was.
    assert_eq!(c.read(x.offset, x.len), input);
    // Releasing one response makes room for one more.
    c.release(held.remove(3));
    let (h, s) = c.call(id, std::slice::from_ref(&x), false).unwrap();
    assert_eq!(c.read(s.tensors[0].offset, 160), want);
    held.push(h.request_id);
    assert!(
        c.call(id, std::slice::from_ref(&x), false).is_err(),
        "full again"
    );
    for r in held.drain(..) {
        c.release(r);
    }
    assert!(c.call(id, std::slice::from_ref(&x), false).is_ok());

    let st = agent.stats();
    assert_eq!(st.shm_output_bytes_copied, 0, "ONNX Runtime wrote in place");
    assert_eq!(st.shm_output_bytes_in_place, 23 * 160);
    assert_eq!(st.errors, 2);
}

#[test]
fn bad_descriptors_get_an_error_and_the_session_goes_on() {
    let (agent, name) = start(|_| {});
    let mut c = Raw::connect(&name).unwrap();
    let l = c.layout();
    let client = l.client_len as u64;
    let cases: Vec<(&str, Vec<TensorDesc>)> = vec![
        ("in the agent region", vec![desc(DType::U8, &[64], client)]),
        (
            "straddling the regions",
            vec![desc(DType::U8, &[128], client - 64)],
        ),
        (
            "past the data area",
            vec![desc(DType::U8, &[64], l.data_len as u64)],
        ),
        (
            "overlapping",
            vec![desc(DType::U8, &[100], 0), desc(DType::U8, &[10], 64)],
        ),
        ("misaligned", vec![desc(DType::U8, &[10], 8)]),
        (
            "running off the client region's end",
            vec![desc(DType::U8, &[client], 64)],
        ),
    ];
    for (what, tensors) in cases {
        let (status, msg) = c.call(0, &tensors, false).expect_err(what);
        assert!(
            matches!(status, Status::Malformed | Status::LimitExceeded),
            "{what}: {status} {msg}"
        );
    }
    // payload_len that is not the tensors' total.
    let t = desc(DType::U8, &[64], 0);
    let mut d = Vec::new();
    encode_tensor_section(std::slice::from_ref(&t), None, &mut d);
    let mut h = Header::new(Kind::Request);
    h.request_id = 77;
    h.tensor_count = 1;
    h.desc_len = d.len() as u32;
    h.payload_len = 65;
    c.send(&h, &d);
    let (r, _) = c.recv();
    assert_eq!(
        (r.kind, r.request_id, r.status),
        (Kind::Error, 77, Status::Malformed)
    );
    // An unknown model, a Release with a body, a Hello on a live session.
    assert_eq!(c.call(9, &[], false).unwrap_err().0, Status::UnknownModel);
    let (h, _) = c.control(Kind::Release, vec![1, 2, 3]);
    assert_eq!((h.kind, h.status), (Kind::Error, Status::Malformed));
    let (h, _) = c.control(Kind::Hello, wire::encode_hello(&Limits::default()));
    assert_eq!((h.kind, h.status), (Kind::Error, Status::UnknownKind));
    // Still serving.
    c.write(0, &[5; 64]);
    let (_, s) = c.call(0, std::slice::from_ref(&t), false).unwrap();
    assert_eq!(s.tensors, vec![t]);
    assert_eq!(agent.stats().connections, 1);
}

#[test]
fn garbage_in_a_ring_closes_only_that_session() {
    let (agent, name) = start(|_| {});
    let mut good = Raw::connect(&name).unwrap();
    for fault in ["garbage slot", "impossible tail", "header over the limits"] {
        let mut bad = Raw::connect(&name).unwrap();
        wait_until(Duration::from_secs(2), "both sessions up", || {
            agent.stats().shm_sessions == 2
        });
        let l = bad.layout();
        let arena = bad.ch.arena().clone();
        match fault {
            "garbage slot" => {
                let ring = Ring::new(arena.clone(), l.request_ring, l.ring_capacity).unwrap();
                assert!(ring.producer().push(&[0xAB; 64]).unwrap());
            }
            "impossible tail" => {
                // The client claims to have consumed responses never sent:
                // the agent's next publish finds the response ring broken
                // (and has nowhere to say so).
                arena
                    .atomic_u64(l.response_ring + 64)
                    .store(1 << 40, Ordering::Release);
                let mut h = Header::new(Kind::Ping);
                h.request_id = 5;
                bad.send(&h, &[]);
            }
            _ => {
                // A sound header announcing more than the session allows:
                // its descriptor slots cannot be skipped safely either.
                let mut h = Header::new(Kind::Request);
                h.request_id = 5;
                h.payload_len = bad.limits.max_payload + 1;
                bad.send(&h, &[]);
            }
        }
        // Wake the agent's thread rather than wait for its next slice.
        arena.atomic_u32(AGENT_SLEEP).store(0, Ordering::SeqCst);
        futex::wake(arena.atomic_u32(AGENT_SLEEP), 1).unwrap();
        if fault != "impossible tail" {
            let (h, body) = bad.recv();
            assert_eq!((h.kind, h.request_id), (Kind::Error, 0));
            let msg = decode_error_body(&body).unwrap();
            assert!(
                matches!(
                    h.status,
                    Status::Malformed | Status::BadMagic | Status::LimitExceeded
                ),
                "{fault}: {} {msg}",
                h.status
            );
        }
        let end = bad.ch.recv(
            &bad.limits,
            WaitPolicy::CLIENT,
            Some(Duration::from_secs(5)),
        );
        assert!(matches!(end, Err(ShmError::PeerGone)), "{fault}: {end:?}");
        wait_until(Duration::from_secs(2), "bad session closed", || {
            agent.stats().connections == 1
        });
        // The other tenant carries on.
        good.write(0, &[1; 64]);
        assert!(good.call(0, &[desc(DType::U8, &[64], 0)], false).is_ok());
    }
}

#[test]
fn a_departed_client_frees_its_session_within_a_second() {
    let (agent, name) = start(|_| {});
    let mut c = Raw::connect(&name).unwrap();
    c.write(0, &[3; 64]);
    assert!(c.call(0, &[desc(DType::U8, &[64], 0)], false).is_ok());
    // Let the agent's thread fall asleep on the futex first.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(agent.stats().connections, 1);
    let t = Instant::now();
    drop(c);
    wait_until(Duration::from_secs(1), "session freed", || {
        agent.stats().connections == 0
    });
    eprintln!("session freed after {:?}", t.elapsed());
}

#[test]
fn a_client_that_stops_reading_loses_only_its_session() {
    let (agent, name) = start(|cfg| {
        cfg.shm_ring_slots = 8;
        cfg.stall_timeout = Duration::from_millis(300);
    });
    let mut good = Raw::connect(&name).unwrap();
    let mut stuck = Raw::connect(&name).unwrap();
    // Pings, never reading the Pongs: the response ring fills (8), the
    // agent blocks on the ninth, the request ring fills behind it.
    let mut sent = 0;
    let t = Instant::now();
    loop {
        let mut h = Header::new(Kind::Ping);
        h.request_id = sent + 1;
        if !stuck.ch.send(&h, &[]).unwrap() {
            if t.elapsed() > Duration::from_millis(100) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        sent += 1;
    }
    assert!(sent >= 16, "{sent}");
    // Meanwhile the other session answers at once.
    good.write(0, &[9; 64]);
    for _ in 0..20 {
        let t = Instant::now();
        assert!(good.call(0, &[desc(DType::U8, &[64], 0)], false).is_ok());
        // Well under the stuck session's 300 ms stall: not held up by it
        // (a liveness bound, generous for a busy CI machine).
        assert!(t.elapsed() < Duration::from_millis(250));
    }
    wait_until(Duration::from_secs(3), "stuck session closed", || {
        agent.stats().connections == 1
    });
    assert!(!stuck.ch.peer_alive());
    assert!(good.call(0, &[desc(DType::U8, &[64], 0)], false).is_ok());
}

#[test]
fn max_connections_counts_shm_sessions() {
    let (agent, name) = start(|cfg| cfg.max_connections = 1);
    let _first = Raw::connect(&name).unwrap();
    match Raw::connect(&name) {
        Err(ShmError::Refused { status, message }) => {
            assert_eq!(status, Status::LimitExceeded);
            assert!(message.contains("1 connections"), "{message}");
        }
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("expected a refusal, got a session"),
    }
    assert_eq!(agent.stats().refused, 1);
}

#[test]
fn shutdown_refuses_new_requests_then_closes_sessions_and_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("a.sock");
    let (agent, name) = start(|cfg| cfg.listen.push(Endpoint::Unix(sock.clone())));
    let ctl = control_path(&name).unwrap();
    assert!(ctl.exists() && sock.exists());
    let mut c = Raw::connect(&name).unwrap();
    c.write(0, &[1; 64]);
    assert!(c.call(0, &[desc(DType::U8, &[64], 0)], false).is_ok());
    // (The request's in-flight count ends just after its response is out.)
    assert_eq!(agent.core().close_and_drain(Duration::from_secs(1)), 0);
    let (status, _) = c.call(0, &[desc(DType::U8, &[64], 0)], false).unwrap_err();
    assert_eq!(status, Status::ShuttingDown);
    // Let the session thread fall asleep: shutdown must wake it.
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    agent.shutdown(Duration::from_secs(1));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(!ctl.exists() && !sock.exists(), "socket files removed");
    assert!(matches!(
        c.ch.recv(&c.limits, WaitPolicy::CLIENT, Some(Duration::from_secs(2))),
        Err(ShmError::PeerGone)
    ));
}

#[test]
fn a_bad_hello_is_refused() {
    let (agent, name) = start(|_| {});
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(control_path(&name).unwrap()).unwrap();
    let mut h = Header::new(Kind::Ping);
    h.request_id = 4;
    s.write_all(&h.encode()).unwrap();
    let mut b = [0u8; 64];
    s.read_exact(&mut b).unwrap();
    let r = Header::decode(&b).unwrap();
    assert_eq!((r.kind, r.status), (Kind::Error, Status::UnknownKind));
    wait_until(Duration::from_secs(1), "refused session gone", || {
        agent.stats().connections == 0
    });
    assert_eq!(agent.stats().errors, 1);
}

/// Returns an owned copy of its first input, then that input aliased twice.
struct CopyAndAlias(wire::ModelSignature);

impl Backend for CopyAndAlias {
    fn signature(&self) -> &wire::ModelSignature {
        &self.0
    }
    fn check_inputs(&self, _: &[(DType, &[u64])]) -> Result<(), engine::EngineError> {
        Ok(())
    }
    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<engine::Output>, engine::EngineError> {
        let t = inputs[0];
        let out = |data| engine::Output {
            dtype: t.dtype,
            shape: t.shape.to_vec(),
            data,
        };
        Ok(vec![
            out(engine::OutputData::Owned(
                wire::AlignedBuf::copy_from(t.data).unwrap(),
            )),
            out(engine::OutputData::Input(0)),
            out(engine::OutputData::Input(0)),
        ])
    }
}

#[test]
fn owned_outputs_are_copied_once_and_counted() {
    let name = unique_name();
    let cfg = AgentConfig {
        listen: vec![Endpoint::Shm(name.clone())],
        shm_client_bytes: 1 << 20,
        shm_agent_bytes: 8192,
        ..AgentConfig::default()
    };
    let mut reg = crate::ModelRegistry::with_identity();
    reg.add(
        std::sync::Arc::new(CopyAndAlias(wire::ModelSignature {
            name: "copy".into(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        })),
        1,
    );
    let agent = Agent::with_registry(cfg, reg).unwrap();
    let mut c = Raw::connect(&name).unwrap();
    let m = c.model_id("copy");
    let x = desc(DType::U8, &[1000], 0);
    let px = pattern(1000, 3);
    c.write(0, &px);
    let (h, s) = c.call(m, std::slice::from_ref(&x), false).unwrap();
    let client = c.layout().client_len as u64;
    assert_eq!(h.payload_len, 3000);
    let [owned, alias, again] = &s.tensors[..] else {
        panic!("{:?}", s.tensors)
    };
    assert!(owned.offset >= client && again.offset >= client);
    assert_eq!(
        alias.offset, x.offset,
        "the first alias points at the input"
    );
    for t in &s.tensors {
        assert_eq!(c.read(t.offset, t.len), px);
    }
    let st = agent.stats();
    assert_eq!(st.shm_output_bytes_copied, 2000);
    assert_eq!(st.shm_output_bytes_aliased, 1000);
    assert_eq!(st.shm_output_bytes_in_place, 0);
    // An output that could never fit says so (and what to raise).
    let big = desc(DType::U8, &[10_000], 4096);
    let (status, msg) = c.call(m, &[big], false).unwrap_err();
    assert_eq!(status, Status::LimitExceeded);
    assert!(msg.contains("larger than the whole"), "{msg}");
    // The failed request's blocks were returned: releasing the first
    // response empties the area completely.
    c.release(h.request_id);
    let y = desc(DType::U8, &[4096], 0);
    let (h2, s2) = c.call(m, std::slice::from_ref(&y), false).unwrap();
    assert_eq!(
        s2.tensors[0].offset, client,
        "first fit from the start again"
    );
    assert!(
        c.call(m, std::slice::from_ref(&y), false).is_err(),
        "8 KiB held"
    );
    c.release(h2.request_id);
    assert!(c.call(m, std::slice::from_ref(&y), false).is_ok());
}

#[test]
fn a_partial_hello_holds_no_worker_and_is_closed() {
    use std::io::{Read, Write};
    let (agent, name) = start(|cfg| cfg.handshake_timeout = Duration::from_millis(200));
    let path = control_path(&name).unwrap();
    // Ten bytes of a Hello, then silence: closed at the deadline.
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    s.write_all(&Header::new(Kind::Hello).encode()[..10])
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    assert_eq!(
        s.read(&mut [0u8; 64]).unwrap_or(0),
        0,
        "closed, nothing sent"
    );
    assert!(t.elapsed() < Duration::from_secs(3));
    wait_until(Duration::from_secs(2), "its slot given back", || {
        agent.stats().connections == 0
    });
    assert_eq!(agent.stats().handshake_timeouts, 1);
    // Ten bytes and a hang-up: gone at once, not spinning on the bytes.
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    s.write_all(&Header::new(Kind::Hello).encode()[..10])
        .unwrap();
    drop(s);
    wait_until(
        Duration::from_secs(2),
        "a departed half-Hello freed",
        || agent.stats().connections == 0,
    );
    assert_eq!(agent.stats().handshake_timeouts, 1);
    // And the agent still bootstraps whole Hellos.
    let mut good = Raw::connect(&name).unwrap();
    good.control(Kind::Ping, Vec::new());
}

#[test]
fn shutdown_ends_a_session_whose_client_keeps_sending() {
    let (agent, name) = start(|_| {});
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let pinger = std::thread::spawn(move || {
        let mut raw = Raw::connect(&name).unwrap();
        let _ = ready_tx.send(());
        // Pings as fast as answers come, until the session ends.
        let mut n = 0u64;
        while !flag.load(Ordering::Relaxed) {
            let mut h = Header::new(Kind::Ping);
            h.request_id = raw.id();
            if !raw.ch.send(&h, &[]).unwrap_or(false) {
                break;
            }
            match raw.ch.recv(
                &raw.limits,
                WaitPolicy::CLIENT,
                Some(Duration::from_secs(2)),
            ) {
                Ok(_) => n += 1,
                Err(_) => break,
            }
        }
        n
    });
    ready.recv().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    agent.shutdown(Duration::from_millis(100));
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let pings = pinger.join().unwrap();
    assert!(pings > 0);
    assert!(took < Duration::from_secs(8), "shutdown took {took:?}");
}
