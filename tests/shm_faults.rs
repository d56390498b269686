//! Faults of the shared-memory transport (`shm://`) between real processes
//! (issue 3, "Bad input and faults"): a `tensorwire serve` child process is
//! the agent; clients are this test process (`client::Client`, or a raw
//! `transport::shm::ShmChannel` for the misbehaving ones) or `tensorwire
//! ping` / `tensorwire hold` children, where a client must be SIGKILLed.
//!
//! - a client SIGKILLed with requests in flight: the agent frees its
//!   session (its arena leaves the agent's mappings and fd table) and keeps
//!   serving another tenant at the same latency;
//! - the agent SIGKILLed (after a SIGSTOP, so calls surely wait): every
//!   waiting call, whether receiving or blocked on a full request ring,
//!   returns `AgentGone` promptly; while it is only frozen, calls time out;
//! - a client scribbling pseudo-random bytes over its whole arena (header
//!   page, ring indices and slots, data) while another tenant runs: only the
//!   scribbler's session is closed, the other tenant's latency holds;
//! - a client that stops reading responses (to Pings, or to identity
//!   requests that go through the model's queue): only its session is
//!   closed, after the agent's `stall_timeout`;
//! - a full client region and a full agent (output) region: a clear "no
//!   space" error, and every byte read back is right;
//! - descriptors pointing outside the arena, into the agent's region (at an
//!   output block the agent still holds), overlapping, misaligned: an error
//!   for that request; the session and the agent go on. (A header whose
//!   `payload_len` is over the session's limit is a session-level fault:
//!   the agent closes that session, as its own tests expect: `shm_tests.rs`,
//!   "header over the limits".)
//!
//! Each test also checks the agent process is alive and printed no panic,
//! and that closed sessions leave nothing behind: no arena in its
//! `/proc/PID/maps` or fd table, no thread, no place in its connection
//! table (`--max-connections`).
//!
//! The tests take a process-wide lock and run one at a time: several of
//! them compare latencies on a machine that may have two cores.

use client::{Client, ClientError, ClientOptions, Model, TensorBuf, TensorRef};
use common::{
    digits_expected, digits_input, digits_model, pattern, shm_dir, tensorwire_command, wait_until,
    within, ServeProcess,
};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use transport::shm::layout::AGENT_SLEEP;
use transport::shm::{control_path, futex, Arena, Layout, ShmChannel, ShmError, WaitPolicy};
use wire::{
    decode_error_body, decode_tensor_section_in, encode_model_name, encode_tensor_section, DType,
    Header, Kind, Limits, Placement, Status, TensorDesc, TensorSection,
};

/// How long an agent's worker pool may take to shrink back after a burst.
const RETIRE_WAIT: Duration = Duration::from_secs(server::reactor::RETIRE_AFTER.as_secs() + 5);

/// No test may run longer than this.
const LIMIT: Duration = Duration::from_secs(30);

/// The memfd name of every session arena (as in `/proc/PID/maps`).
const ARENA_NAME: &str = "memfd:tensorwire-shm";

/// One test at a time (latencies are compared; the machine may be small).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A `tensorwire serve` child listening on a fresh `shm://` name (and the
/// helper's Unix socket), with an optional TOML config.
struct ShmAgent {
    p: ServeProcess,
    name: String,
    uri: String,
    _dir: tempfile::TempDir,
}

impl ShmAgent {
    fn spawn(tag: &str, config: &str, extra: &[&str]) -> ShmAgent {
        shm_dir();
        let name = format!(
            "twf-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let uri = format!("shm://{name}");
        let dir = tempfile::tempdir().expect("temporary directory");
        let cfg = dir.path().join("agent.toml");
        std::fs::write(&cfg, config).expect("write the config");
        let cfg = cfg.display().to_string();
        let mut args = vec!["--listen", uri.as_str(), "--config", cfg.as_str()];
        args.extend_from_slice(extra);
        let p = ServeProcess::spawn(&args);
        assert!(p.uris.contains(&uri), "{:?}", p.uris);
        ShmAgent {
            p,
            name,
            uri,
            _dir: dir,
        }
    }

    fn pid(&self) -> i32 {
        self.p.pid()
    }

    /// Session arenas the agent maps now.
    fn arenas_mapped(&self) -> usize {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid()))
            .expect("read the agent's /proc/PID/maps");
        maps.lines().filter(|l| l.contains(ARENA_NAME)).count()
    }

    /// Session arenas the agent holds open (memfd descriptors).
    fn arena_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("read the agent's /proc/PID/fd")
            .filter_map(Result::ok)
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter(|t| t.to_string_lossy().contains(ARENA_NAME))
            .count()
    }

    /// Threads of the agent now.
    /// Threads of the agent process (its accept threads, reaper and
    /// workers: sessions have none of their own).
    fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.pid()))
            .expect("read the agent's /proc/PID/task")
            .count()
    }

    /// Waits until the agent maps and holds exactly `n` arenas; returns how
    /// long that took.
    fn wait_arenas(&self, n: usize, limit: Duration, what: &str) -> Duration {
        let t = Instant::now();
        wait_until(limit, what, || {
            self.arenas_mapped() == n && self.arena_fds() == n
        });
        t.elapsed()
    }

    /// The agent process is alive, and no thread of it panicked (a session
    /// thread's panic is caught, but the hook prints it).
    fn assert_running(&mut self, what: &str) {
        assert!(
            self.p.running(),
            "{what}: the agent process died; stderr:\n{}",
            self.p.stderr()
        );
        let err = self.p.stderr();
        assert!(
            !err.contains("panicked"),
            "{what}: the agent panicked:\n{err}"
        );
    }

    /// With `--max-connections max` and `open` sessions open: exactly
    /// `max - open` more are accepted, then one is refused (so no closed
    /// session still holds a place in the agent's table). Closes the extra
    /// ones again and waits until the agent has freed them.
    fn assert_free_places(&self, max: usize, open: usize) {
        let mut extra = Vec::new();
        for i in open..max {
            match Raw::try_connect(&self.name) {
                Ok(r) => extra.push(r),
                Err(e) => panic!("session {} of {max} refused: {e}", i + 1),
            }
        }
        match Raw::try_connect(&self.name) {
            Err(ShmError::Refused { status, .. }) => assert_eq!(status, Status::LimitExceeded),
            Err(e) => panic!("session {} of {max}: expected a refusal, got {e}", max + 1),
            Ok(_) => panic!("session {} of {max} was accepted", max + 1),
        }
        drop(extra);
        self.wait_arenas(open, Duration::from_secs(2), "the extra sessions closed");
    }
}

/// A `tensorwire` client child process, SIGKILLed when dropped.
struct Kid {
    child: Child,
    what: String,
}

impl Kid {
    fn spawn(args: &[&str]) -> Kid {
        shm_dir();
        let child = tensorwire_command()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a tensorwire client");
        Kid {
            child,
            what: format!("tensorwire {}", args.join(" ")),
        }
    }

    /// Waits (at most `limit`) for a line of its stdout starting with `prefix`.
    fn wait_line(&mut self, prefix: &str, limit: Duration) {
        let out = self.child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return,
                Ok(_) => {}
                Err(_) => panic!("{}: no `{prefix}` line within {limit:?}", self.what),
            }
        }
    }

    fn assert_running(&mut self) {
        if let Some(s) = self.child.try_wait().expect("try_wait") {
            let mut err = String::new();
            if let Some(mut e) = self.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("{} exited early ({s}): {err}", self.what);
        }
    }

    /// SIGKILL, and reap it.
    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the client");
        let s = self.child.wait().expect("reap the client");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&s),
            Some(libc::SIGKILL),
            "{}: {s}",
            self.what
        );
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn client(uri: &str, timeout: Duration) -> Client {
    shm_dir();
    let opts = ClientOptions {
        timeout,
        ..ClientOptions::default()
    };
    Client::connect_with(uri, opts).unwrap_or_else(|e| panic!("connect {uri}: {e}"))
}

/// Median and 99th percentile.
#[derive(Clone, Copy, Debug)]
struct Lat {
    n: usize,
    p50: Duration,
    p99: Duration,
}

impl Lat {
    fn of(mut v: Vec<Duration>) -> Lat {
        assert!(!v.is_empty());
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Lat {
            n: v.len(),
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

impl std::fmt::Display for Lat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.1} µs, p99 {:.1} µs over {}",
            self.p50.as_secs_f64() * 1e6,
            self.p99.as_secs_f64() * 1e6,
            self.n
        )
    }
}

/// "Not held up by the faulty tenant": the good tenant's p50 stays far
/// below the faults' own time scale (a 500 ms stall, 250 ms liveness
/// slices). This is an isolation check, not a performance test: the bound
/// (20× the baseline + 5 ms) tolerates a busy 2-core CI machine; the
/// measured figures are printed for the record.
fn assert_normal(base: Lat, now: Lat, what: &str) {
    let bound = base.p50 * 20 + Duration::from_millis(5);
    assert!(
        now.p50 <= bound,
        "{what}: p50 {:?} is over 20× the baseline's {:?} (+5 ms)",
        now.p50,
        base.p50
    );
}

/// A well-behaved tenant: identity round trips of a 4 KiB tensor that lives
/// in its arena (zero copy), each checked byte for byte.
struct Good {
    m: Model,
    buf: TensorBuf,
    want: Vec<u8>,
    calls: u64,
}

impl Good {
    fn new(uri: &str) -> Good {
        let c = client(uri, Duration::from_secs(5));
        let m = c.model("identity").expect("identity");
        let mut buf = c.alloc_tensor(DType::U8, &[4096]).expect("alloc_tensor");
        assert!(buf.in_arena());
        let want = pattern(4096, 42);
        buf.as_mut_bytes().copy_from_slice(&want);
        let mut g = Good {
            m,
            buf,
            want,
            calls: 0,
        };
        g.measure(200); // warm up
        g
    }

    fn round_trip(&mut self) -> Duration {
        let t = Instant::now();
        let r = self
            .m
            .infer(&[self.buf.as_ref()])
            .unwrap_or_else(|e| panic!("good tenant, call {}: {e}", self.calls));
        let took = t.elapsed();
        assert!(
            r.outputs[0].bytes() == &self.want[..],
            "good tenant, call {}: wrong bytes",
            self.calls
        );
        self.calls += 1;
        took
    }

    fn measure(&mut self, n: usize) -> Lat {
        Lat::of((0..n).map(|_| self.round_trip()).collect())
    }

    /// Round trips until `stop` is set (at least `min`).
    fn measure_until(&mut self, stop: &AtomicBool, min: usize) -> Lat {
        let mut v = Vec::new();
        while v.len() < min || !stop.load(Ordering::Acquire) {
            v.push(self.round_trip());
        }
        Lat::of(v)
    }
}

/// A raw shared-memory client: the bare channel, so that it can break
/// every rule.
struct Raw {
    ch: ShmChannel,
    limits: Limits,
    next: u64,
    /// Request-ring slots pushed so far: the index of the slot the agent
    /// reads next (its `tail` may lag: it gives slots back later).
    pushed: u64,
}

impl Raw {
    fn connect(name: &str) -> Raw {
        Raw::try_connect(name).unwrap_or_else(|e| panic!("raw connect to shm://{name}: {e}"))
    }

    fn try_connect(name: &str) -> Result<Raw, ShmError> {
        shm_dir();
        let path = control_path(name).expect("control path");
        let (ch, limits) =
            ShmChannel::connect(&path, &Limits::default(), None, 1, Duration::from_secs(5))?;
        Ok(Raw {
            ch,
            limits,
            next: 10,
            pushed: 0,
        })
    }

    fn layout(&self) -> Layout {
        *self.ch.layout()
    }

    fn arena(&self) -> Arc<Arena> {
        self.ch.arena().clone()
    }

    /// Writes `bytes` at `off` of the data area.
    fn write(&self, off: u64, bytes: &[u8]) {
        let start = self.layout().data_off + off as usize;
        // SAFETY: the test owns its client region and touches it from this
        // thread only; no other reference to these bytes is alive.
        unsafe { self.ch.arena().bytes_mut(start..start + bytes.len()) }.copy_from_slice(bytes);
    }

    fn read(&self, off: u64, len: u64) -> Vec<u8> {
        let start = self.layout().data_off + off as usize;
        self.ch.arena().bytes(start..start + len as usize).to_vec()
    }

    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn send(&mut self, h: &Header, desc: &[u8]) {
        assert!(
            self.ch.send(h, desc).expect("raw send"),
            "request ring full"
        );
        self.pushed += 1 + desc.len().div_ceil(64) as u64;
    }

    fn recv(&mut self) -> (Header, Vec<u8>) {
        self.ch
            .recv(
                &self.limits,
                WaitPolicy::CLIENT,
                Some(Duration::from_secs(5)),
            )
            .expect("a reply from the agent")
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

    fn ping(&mut self) {
        let (h, _) = self.control(Kind::Ping, Vec::new());
        assert_eq!(h.kind, Kind::Pong);
    }

    fn model_id(&mut self, name: &str) -> u32 {
        let (h, b) = self.control(Kind::ModelQuery, encode_model_name(name));
        assert_eq!(h.kind, Kind::ModelInfo, "{:?}", decode_error_body(&b));
        h.model_id
    }

    /// Sends a request over `tensors` (already in place) with `payload_len`
    /// (default: their total); returns its id.
    fn submit(&mut self, model: u32, tensors: &[TensorDesc], payload_len: Option<u64>) -> u64 {
        let mut desc = Vec::new();
        encode_tensor_section(tensors, None, &mut desc);
        let mut h = Header::new(Kind::Request);
        h.request_id = self.id();
        h.model_id = model;
        h.tensor_count = tensors.len() as u32;
        h.desc_len = desc.len() as u32;
        h.payload_len =
            payload_len.unwrap_or_else(|| tensors.iter().fold(0u64, |a, t| a.wrapping_add(t.len)));
        self.send(&h, &desc);
        h.request_id
    }

    /// A request and its reply: the response's section, or the error.
    fn call(
        &mut self,
        model: u32,
        tensors: &[TensorDesc],
        payload_len: Option<u64>,
    ) -> Result<(u64, TensorSection), (Status, String)> {
        let id = self.submit(model, tensors, payload_len);
        let (h, b) = self.recv();
        assert_eq!(h.request_id, id, "a reply to another request: {h:?}");
        match h.kind {
            Kind::Response => {
                let region = Placement::Region {
                    len: self.layout().data_len as u64,
                };
                Ok((
                    id,
                    decode_tensor_section_in(&h, &b, region).expect("section"),
                ))
            }
            Kind::Error => Err((h.status, decode_error_body(&b).unwrap_or_default())),
            k => panic!("unexpected {k:?}"),
        }
    }

    /// Wakes the agent's session thread if it sleeps on its futex.
    fn wake_agent(&self) {
        let w = self.ch.arena().atomic_u32(AGENT_SLEEP);
        w.store(0, Ordering::SeqCst);
        futex::wake(w, 1).expect("futex wake");
    }

    /// Waits until the agent has closed this session.
    fn wait_closed(&self, limit: Duration, what: &str) {
        wait_until(limit, what, || !self.ch.peer_alive());
    }
}

fn desc(dtype: DType, shape: &[u64], offset: u64) -> TensorDesc {
    TensorDesc {
        dtype,
        shape: shape.to_vec(),
        offset,
        len: TensorDesc::byte_len(dtype, shape).expect("size"),
    }
}

/// Overwrites all of `arena` (header page, rings, data) with pseudo-random
/// bytes from `seed`.
fn scribble(arena: &Arena, seed: u64) {
    // SAFETY: the arena is this (misbehaving) tenant's; nothing else in this
    // process uses it while the slice lives (its channel is idle on this
    // very thread). The agent may write it meanwhile: that is the fault
    // under test, and only bytes are written here.
    let all = unsafe { arena.bytes_mut(0..arena.len()) };
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in all.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

// ---------------------------------------------------------------------------

#[test]
fn a_sigkilled_client_frees_its_session_and_others_keep_their_latency() {
    let _serial = serial();
    within(LIMIT, "SIGKILLed clients", || {
        let mut agent = ShmAgent::spawn("kill-client", "", &["--max-connections", "5"]);
        let mut good = Good::new(&agent.uri);
        let base = good.measure(2000);
        agent.wait_arenas(1, Duration::from_secs(2), "the good session's arena");
        let threads = agent.threads();

        // A client pinging with 1 MiB tensors as fast as it can, and one
        // holding three idle sessions.
        let mut busy = Kid::spawn(&[
            "ping",
            "--connect",
            &agent.uri,
            "--size",
            "1048576",
            "-n",
            "1000000",
        ]);
        let mut idle = Kid::spawn(&[
            "hold",
            "--connect",
            &agent.uri,
            "--clients",
            "3",
            "--seconds",
            "60",
        ]);
        idle.wait_line("holding 3", Duration::from_secs(10));
        agent.wait_arenas(5, Duration::from_secs(5), "five sessions mapped");
        std::thread::sleep(Duration::from_millis(300));
        busy.assert_running();
        idle.assert_running();

        busy.kill();
        let freed = agent.wait_arenas(
            4,
            Duration::from_secs(2),
            "the busy client's arena unmapped and closed",
        );
        idle.kill();
        let freed_idle = agent.wait_arenas(
            1,
            Duration::from_secs(2),
            "the idle clients' arenas unmapped and closed",
        );
        agent.assert_running("after the kills");
        // Sessions hold no thread of their own; the workers that served
        // them retire once idle for RETIRE_AFTER.
        wait_until(RETIRE_WAIT, "the agent's extra workers retire", || {
            agent.threads() <= threads
        });

        let after = good.measure(2000);
        eprintln!(
            "SIGKILLed clients: busy session freed in {freed:?}, 3 idle ones in {freed_idle:?}; \
             good tenant before: {base}; after: {after}"
        );
        assert_normal(base, after, "good tenant after the kills");
        // The killed clients' places are free again; new sessions are
        // served as before.
        agent.assert_free_places(5, 1);
        let mut late = Good::new(&agent.uri);
        late.measure(10);
        agent.wait_arenas(2, Duration::from_secs(2), "two sessions");
    });
}

#[test]
fn a_sigkilled_agent_fails_every_waiting_call_promptly() {
    let _serial = serial();
    within(LIMIT, "SIGKILLed agent", || {
        // Eight ring slots: a pipelining sender blocks after four requests.
        let mut agent = ShmAgent::spawn("kill-agent", "[shm]\nring_slots = 8\n", &[]);
        let timeout = Duration::from_secs(5);
        let mut waiters: Vec<(String, Model)> = Vec::new();
        for i in 0..3 {
            let c = client(&agent.uri, timeout);
            waiters.push((
                format!("client {i}"),
                c.model("identity").expect("identity"),
            ));
        }
        // Two threads sharing one session: one reads, one parks.
        let shared = client(&agent.uri, timeout)
            .model("identity")
            .expect("identity");
        waiters.push(("shared session, thread a".into(), shared.clone()));
        waiters.push(("shared session, thread b".into(), shared));
        let piper = client(&agent.uri, timeout)
            .model("identity")
            .expect("identity");
        let frozen_client = client(&agent.uri, Duration::from_millis(300));
        let frozen = frozen_client.model("identity").expect("identity");
        agent.wait_arenas(6, Duration::from_secs(2), "six sessions");

        agent.p.freeze();
        // While the agent is frozen (alive, silent) a call times out.
        let t = Instant::now();
        let data = pattern(1000, 1);
        match frozen.infer(&[TensorRef::new(DType::U8, &[1000], &data).expect("t")]) {
            Err(ClientError::Timeout(_)) => {}
            other => panic!("frozen agent: expected Timeout, got {other:?}"),
        }
        let timed_out = t.elapsed();
        assert!(timed_out < Duration::from_secs(2), "{timed_out:?}");
        // So does a connection: its Hello is never answered.
        let quick = ClientOptions {
            connect_timeout: Duration::from_millis(300),
            ..ClientOptions::default()
        };
        let t = Instant::now();
        match Client::connect_with(&agent.uri, quick) {
            Err(ClientError::Timeout(_)) => {}
            other => panic!("connect to a frozen agent: expected Timeout, got {other:?}"),
        }
        let connect_timed_out = t.elapsed();
        assert!(connect_timed_out < Duration::from_secs(2));
        // And one still connecting when the agent dies.
        let (ctx, crx) = mpsc::channel();
        let uri = agent.uri.clone();
        std::thread::spawn(move || {
            let r = Client::connect(&uri).map(|_| ());
            let _ = ctx.send((r, Instant::now()));
        });

        let (tx, rx) = mpsc::channel::<(String, Result<(), ClientError>, Instant)>();
        for (what, m) in waiters {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let data = pattern(64 << 10, 7);
                let r = m
                    .infer(&[TensorRef::new(DType::U8, &[64 << 10], &data).expect("t")])
                    .map(|_| ());
                let _ = tx.send((what, r, Instant::now()));
            });
        }
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                // Submits until the request ring is full and the send blocks.
                let data = pattern(64, 8);
                let mut tickets = Vec::new();
                let r = loop {
                    match piper.submit(&[TensorRef::new(DType::U8, &[64], &data).expect("t")]) {
                        Ok(t) => tickets.push(t),
                        Err(e) => break e,
                    }
                };
                let _ = tx.send((
                    format!("pipelined submit after {} requests", tickets.len()),
                    Err(r),
                    Instant::now(),
                ));
                for (i, t) in tickets.into_iter().enumerate() {
                    let r = t.wait().map(|_| ());
                    let _ = tx.send((format!("pipelined ticket {i}"), r, Instant::now()));
                }
            });
        }
        drop(tx);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
            "a call returned while the agent was frozen"
        );

        let killed = Instant::now();
        agent.p.signal(libc::SIGKILL);
        agent.p.wait_exit(Duration::from_secs(5));
        let mut results = Vec::new();
        loop {
            match rx.recv_timeout(timeout + Duration::from_secs(1)) {
                Ok(r) => results.push(r),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("a call still waits {timeout:?} after the agent was killed")
                }
            }
        }
        let (r, at) = crx
            .recv_timeout(Duration::from_secs(6))
            .expect("the connection attempt returns");
        let connect_after = at.duration_since(killed);
        match r {
            Err(ClientError::AgentGone(_) | ClientError::Connect(_)) => {}
            other => panic!("connecting when the agent died: got {other:?}"),
        }
        assert!(connect_after < Duration::from_secs(1), "{connect_after:?}");
        let mut slowest = Duration::ZERO;
        for (what, r, at) in &results {
            let after = at.duration_since(killed);
            slowest = slowest.max(after);
            match r {
                Err(ClientError::AgentGone(msg)) => {
                    assert!(after < Duration::from_secs(1), "{what}: {after:?}: {msg}")
                }
                other => panic!("{what}: expected AgentGone, got {other:?} after {after:?}"),
            }
        }
        assert!(
            results.len() >= 5 + 1 + 4,
            "5 waiters, the blocked submit, at least 4 tickets: {}",
            results.len()
        );
        eprintln!(
            "SIGKILLed agent: frozen call timed out in {timed_out:?}, frozen connect in \
             {connect_timed_out:?}; {} waiting calls all AgentGone, the last {slowest:?} after \
             the kill; a pending connect failed {connect_after:?} after it",
            results.len()
        );
        // Afterwards: calls fail at once, and nobody can connect.
        let t = Instant::now();
        assert!(matches!(
            frozen_client.ping(),
            Err(ClientError::AgentGone(_))
        ));
        assert!(t.elapsed() < Duration::from_secs(1));
        match Client::connect(&agent.uri) {
            Err(ClientError::Connect(_)) => {}
            other => panic!("connect to a dead agent: expected Connect, got {other:?}"),
        }
    });
}

#[test]
fn a_client_scribbling_over_its_whole_arena_loses_only_its_session() {
    let _serial = serial();
    within(LIMIT, "scribbling client", || {
        // Small arenas, so that scribbling all of one is quick.
        let config = "[shm]\nclient_bytes = 4194304\nagent_bytes = 1048576\n";
        let mut agent = ShmAgent::spawn("scribble", config, &["--max-connections", "3"]);
        let mut good = Good::new(&agent.uri);
        let base = good.measure(2000);
        let threads = agent.threads();

        let stop = Arc::new(AtomicBool::new(false));
        let name = agent.name.clone();
        let stop2 = stop.clone();
        let bad = std::thread::spawn(move || {
            let mut closed = Vec::new();
            for round in 0..12u64 {
                let mut raw = Raw::connect(&name);
                raw.ping();
                let l = raw.layout();
                let arena = raw.arena();
                let seed = 1000 + round;
                let start = Instant::now();
                // Random bytes form no published message (a slot's mark
                // must equal its index + 1, PROTOCOL §14.4), so the agent
                // may just go on waiting for one: then the session ends
                // when the tenant leaves. Only a published garbage header
                // must end it at once.
                let (flavor, must_close) = match round % 4 {
                    0 => {
                        // Everything, over and over, waking the agent each
                        // time.
                        let mut k = 0;
                        while raw.ch.peer_alive() && start.elapsed() < Duration::from_millis(500) {
                            scribble(&arena, seed * 100 + k);
                            raw.wake_agent();
                            k += 1;
                        }
                        ("whole arena, repeatedly", false)
                    }
                    1 => {
                        // Everything, then the mark that publishes the slot
                        // the agent reads next: a garbage header.
                        let next = raw.pushed;
                        scribble(&arena, seed);
                        let slot = (next % u64::from(l.ring_capacity)) as usize;
                        arena
                            .atomic_u64(l.request_ring + 128 + slot * 64 + 56)
                            .store(next + 1, Ordering::Release);
                        raw.wake_agent();
                        ("whole arena, a garbage header published", true)
                    }
                    2 => {
                        // A request in flight (1 MiB in place), then
                        // everything, while the agent answers it.
                        let id = raw.model_id("identity");
                        raw.write(0, &pattern(1 << 20, seed));
                        raw.submit(id, &[desc(DType::U8, &[1 << 20], 0)], None);
                        scribble(&arena, seed);
                        raw.wake_agent();
                        ("whole arena, request in flight", false)
                    }
                    _ => {
                        // Everything, without waking the agent.
                        std::thread::sleep(Duration::from_millis(20));
                        scribble(&arena, seed);
                        ("whole arena, agent asleep", false)
                    }
                };
                let by_agent = if must_close {
                    raw.wait_closed(Duration::from_secs(2), flavor);
                    true
                } else {
                    let deadline = Instant::now() + Duration::from_millis(300);
                    while raw.ch.peer_alive() && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    !raw.ch.peer_alive()
                };
                // Leaving ends the session in any case (checked below: only
                // the good session is left, and its threads are gone).
                drop(raw);
                closed.push((flavor, by_agent, start.elapsed()));
            }
            stop2.store(true, Ordering::Release);
            closed
        });
        let during = good.measure_until(&stop, 500);
        let closed = bad.join().expect("the scribbling tenant");
        agent.assert_running("after the scribbling");
        let after = good.measure(2000);
        agent.wait_arenas(1, Duration::from_secs(2), "only the good session left");
        wait_until(RETIRE_WAIT, "the agent's extra workers retire", || {
            agent.threads() <= threads
        });
        agent.assert_free_places(3, 1);
        eprintln!("scribbling client: good tenant before: {base}");
        eprintln!("scribbling client: good tenant during: {during}");
        eprintln!("scribbling client: good tenant after:  {after}");
        for (flavor, by_agent, took) in &closed {
            let who = if *by_agent {
                "the agent"
            } else {
                "the tenant leaving"
            };
            eprintln!(
                "scribbling client: {flavor}: session closed by {who}, {took:?} after the scribble"
            );
        }
        assert_eq!(closed.len(), 12);
        assert_normal(base, during, "good tenant while the other scribbles");
        assert_normal(base, after, "good tenant after the scribbling");
    });
}

#[test]
fn a_client_that_stops_reading_loses_only_its_session() {
    let _serial = serial();
    within(LIMIT, "client not reading", || {
        let config = "[limits]\nstall_timeout_ms = 500\n[shm]\nring_slots = 8\n";
        let mut agent = ShmAgent::spawn("stall", config, &[]);
        let mut good = Good::new(&agent.uri);
        let base = good.measure(2000);

        // Twice: Pings (answered by the session thread itself) and identity
        // requests (through the model's queue, which the good tenant shares).
        for kind in ["Ping", "identity"] {
            let mut stuck = Raw::connect(&agent.name);
            let identity = stuck.model_id("identity");
            stuck.write(0, &pattern(64, 5));
            let input = [desc(DType::U8, &[64], 0)];
            let mut tensors = Vec::new();
            encode_tensor_section(&input, None, &mut tensors);
            // A receive gives back the slots of what the last one took
            // (here, nothing arrives): the whole response ring is free.
            assert!(stuck
                .ch
                .try_recv(&stuck.limits)
                .expect("try_recv")
                .is_none());
            // Never reading the answers: the response ring fills, the agent
            // waits for room, the request ring fills behind it.
            let first = stuck.next + 1;
            let mut sent = 0u64;
            let mut last_ok = Instant::now();
            while last_ok.elapsed() < Duration::from_millis(50) {
                let (mut h, body) = if kind == "Ping" {
                    (Header::new(Kind::Ping), &[][..])
                } else {
                    let mut h = Header::new(Kind::Request);
                    h.model_id = identity;
                    h.tensor_count = 1;
                    h.desc_len = tensors.len() as u32;
                    h.payload_len = 64;
                    (h, &tensors[..])
                };
                h.request_id = first + sent;
                if stuck.ch.send(&h, body).expect("send") {
                    sent += 1;
                    last_ok = Instant::now();
                } else {
                    std::thread::yield_now();
                }
            }
            let full = last_ok;
            assert!(sent >= 8, "{kind}: both rings full after {sent}");
            let mut during = Vec::new();
            while stuck.ch.peer_alive() {
                assert!(
                    full.elapsed() < Duration::from_secs(3),
                    "{kind}: the stalled session is still open after 3 s"
                );
                during.push(good.round_trip());
            }
            let closed = full.elapsed();
            let during = Lat::of(during);
            agent.assert_running("after the stall");
            // What the stalled client finds: the answers that fitted, in
            // order, then the agent gone.
            let mut answers = 0u64;
            let err = loop {
                match stuck.ch.recv(
                    &stuck.limits,
                    WaitPolicy::CLIENT,
                    Some(Duration::from_secs(2)),
                ) {
                    Ok((h, _)) => {
                        let want = if kind == "Ping" {
                            Kind::Pong
                        } else {
                            Kind::Response
                        };
                        assert_eq!((h.kind, h.request_id), (want, first + answers), "{kind}");
                        answers += 1;
                    }
                    Err(e) => break e,
                }
            };
            assert!(matches!(err, ShmError::PeerGone), "{kind}: {err}");
            // A Pong takes one slot, a Response with one tensor two.
            let per = if kind == "Ping" { 1 } else { 2 };
            assert_eq!(answers * per, 8, "{kind}: the response ring's worth");
            agent.wait_arenas(1, Duration::from_secs(2), "the stalled arena freed");
            eprintln!(
                "stalled client ({kind}): {sent} sent, {answers} answers queued, session closed \
                 {closed:?} after the rings filled (stall_timeout 500 ms); good tenant during: \
                 {during}"
            );
            assert!(closed >= Duration::from_millis(400), "{kind}: {closed:?}");
            assert_normal(base, during, "good tenant during the stall");
        }
        let after = good.measure(2000);
        eprintln!("stalled client: good tenant before: {base}; after: {after}");
        assert_normal(base, after, "good tenant after the stall");
    });
}

#[test]
fn a_full_arena_is_a_clear_error_and_nothing_is_corrupted() {
    let _serial = serial();
    within(LIMIT, "full arena", || {
        let digits = digits_model();
        let config = "[shm]\nclient_bytes = 1048576\nagent_bytes = 4096\n";
        let load = format!("digits={}", digits.display());
        let mut agent = ShmAgent::spawn("full", config, &["--model", &load]);
        let c = client(&agent.uri, Duration::from_secs(5));
        let full = |r: Result<(), ClientError>, needle: &str, what: &str| match r {
            Err(ClientError::LimitExceeded(msg)) => assert!(msg.contains(needle), "{what}: {msg}"),
            other => panic!("{what}: expected LimitExceeded ({needle}), got {other:?}"),
        };

        // The agent's region: 4 KiB holds 21 digits outputs (160 B each, in
        // 192-byte blocks) until they are released.
        let d = c.model("digits").expect("digits");
        let input = digits_input();
        let x = TensorRef::new(DType::F32, &[4, 64], &input).expect("t");
        let mut held = Vec::new();
        let err = loop {
            match d.infer(&[x]) {
                Ok(r) => held.push(r),
                Err(e) => break e,
            }
            assert!(held.len() <= 64, "the 4 KiB output area never filled");
        };
        full(Err(err), "shm output area is full", "agent region");
        assert_eq!(held.len(), 21);
        let want = digits_expected();
        let first = held[0].outputs[0].bytes().to_vec();
        for (i, r) in held.iter().enumerate() {
            assert!(
                r.outputs[0].bytes() == &first[..],
                "held output {i} changed"
            );
        }
        for (g, w) in f32s(&first).iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "logit {g} vs reference {w}");
        }
        drop(held);
        // Released: room again.
        let r = d.infer(&[x]).expect("after the releases");
        assert!(r.outputs[0].bytes() == &first[..]);
        drop(r);

        // The client's region: 1 MiB, two 512 KiB tensors fill it.
        let m = c.model("identity").expect("identity");
        let mut a = c.alloc_tensor(DType::U8, &[512 << 10]).expect("a");
        let mut b = c.alloc_tensor(DType::U8, &[512 << 10]).expect("b");
        let (pa, pb) = (pattern(512 << 10, 1), pattern(512 << 10, 2));
        a.as_mut_bytes().copy_from_slice(&pa);
        b.as_mut_bytes().copy_from_slice(&pb);
        full(
            c.alloc_tensor(DType::U8, &[1]).map(|_| ()),
            "shm arena full",
            "alloc_tensor",
        );
        let v = pattern(100, 3);
        full(
            m.infer(&[TensorRef::new(DType::U8, &[100], &v).expect("t")])
                .map(|_| ()),
            "shm arena full",
            "copy-in infer",
        );
        // The digits input (copied in) has no room either.
        full(
            d.infer(&[x]).map(|_| ()),
            "shm arena full",
            "digits copy-in",
        );
        // Zero copy still works, and every byte is as written.
        for _ in 0..3 {
            let r = m.infer(&[a.as_ref(), b.as_ref()]).expect("zero copy");
            assert!(r.outputs[0].bytes() == &pa[..]);
            assert!(r.outputs[1].bytes() == &pb[..]);
        }
        assert!(a.bytes() == &pa[..] && b.bytes() == &pb[..]);
        drop(a);
        let r = m
            .infer(&[TensorRef::new(DType::U8, &[100], &v).expect("t")])
            .expect("room again");
        assert!(r.outputs[0].bytes() == &v[..]);
        assert!(b.bytes() == &pb[..]);
        let r = d.infer(&[x]).expect("digits again");
        assert!(r.outputs[0].bytes() == &first[..]);
        agent.assert_running("after the full arenas");
    });
}

#[test]
fn descriptors_outside_the_clients_region_are_refused_and_the_session_goes_on() {
    let _serial = serial();
    within(LIMIT, "bad descriptors", || {
        let digits = digits_model();
        let config = "[shm]\nclient_bytes = 1048576\nagent_bytes = 65536\n";
        let load = format!("digits={}", digits.display());
        let mut agent = ShmAgent::spawn("desc", config, &["--model", &load]);
        let mut other = Good::new(&agent.uri);
        let mut c = Raw::connect(&agent.name);
        let identity = c.model_id("identity");
        let digits = c.model_id("digits");
        let l = c.layout();
        let (client, data) = (l.client_len as u64, l.data_len as u64);

        // A digits output the agent holds in its region (not released).
        let input = digits_input();
        c.write(0, &input);
        let (_, s) = c
            .call(digits, &[desc(DType::F32, &[4, 64], 0)], None)
            .expect("digits");
        let held = s.tensors[0].clone();
        assert!(held.offset >= client, "{held:?}");
        let held_bytes = c.read(held.offset, held.len);

        let good = desc(DType::U8, &[4096], 0);
        let mut cases: Vec<(&str, Vec<TensorDesc>, Option<u64>)> = vec![
            (
                "in the agent's region",
                vec![desc(DType::U8, &[64], client)],
                None,
            ),
            (
                "on an output block the agent holds",
                vec![desc(DType::F32, &[4, 10], held.offset)],
                None,
            ),
            (
                "straddling the two regions",
                vec![desc(DType::U8, &[128], client - 64)],
                None,
            ),
            (
                "past the data area",
                vec![desc(DType::U8, &[64], data)],
                None,
            ),
            (
                "far past the arena (offset 2^62)",
                vec![desc(DType::U8, &[64], 1 << 62)],
                None,
            ),
            (
                "offset + length overflowing u64",
                vec![desc(DType::U8, &[128], u64::MAX - 63)],
                None,
            ),
            (
                "running off the client region's end",
                vec![desc(DType::U8, &[client], 64)],
                None,
            ),
            (
                "overlapping inputs",
                vec![desc(DType::U8, &[100], 0), desc(DType::U8, &[10], 64)],
                None,
            ),
            (
                "the same bytes twice",
                vec![good.clone(), good.clone()],
                None,
            ),
            ("misaligned", vec![desc(DType::U8, &[10], 8)], None),
            (
                "payload_len not the tensors' total",
                vec![good.clone()],
                Some(4095),
            ),
        ];
        let mut wrong_len = desc(DType::U8, &[64], 0);
        wrong_len.len = 1 << 30;
        cases.push(("length not the shape's", vec![wrong_len], Some(64)));
        let p = pattern(4096, 9);
        for (what, tensors, payload_len) in cases {
            let (status, msg) = c
                .call(identity, &tensors, payload_len)
                .map(|(_, s)| s.tensors)
                .expect_err(what);
            assert!(
                matches!(
                    status,
                    Status::Malformed | Status::LimitExceeded | Status::InvalidInput
                ),
                "{what}: {status} {msg}"
            );
            // The same session still serves a good request, on intact data.
            c.write(0, &p);
            let (_, s) = c
                .call(identity, std::slice::from_ref(&good), None)
                .unwrap_or_else(|e| panic!("after {what}: {e:?}"));
            assert_eq!(s.tensors, vec![good.clone()], "after {what}");
            assert_eq!(c.read(0, 4096), p, "after {what}");
            other.round_trip();
        }
        // The held output was never touched, and is still the client's to
        // read until it releases it.
        assert_eq!(c.read(held.offset, held.len), held_bytes);
        c.ping();
        agent.wait_arenas(2, Duration::from_secs(2), "both sessions alive");

        // A header announcing more payload than the session allows breaks
        // the session's limits, not only a request's: the agent answers
        // with an Error naming the limit (request id 0, as for any message
        // it cannot take) and closes that session only.
        let mut huge = desc(DType::U8, &[64], 0);
        huge.len = 1 << 30;
        let id = c.submit(identity, &[huge], None);
        let (h, b) = c.recv();
        let msg = decode_error_body(&b).unwrap_or_default();
        assert_eq!(
            (h.kind, h.request_id, h.status),
            (Kind::Error, 0, Status::LimitExceeded),
            "request {id}: {msg}"
        );
        assert!(msg.contains("payload"), "{msg}");
        c.wait_closed(Duration::from_secs(2), "the over-limit session closed");
        agent.wait_arenas(1, Duration::from_secs(2), "its arena freed");
        other.round_trip();
        let mut again = Raw::connect(&agent.name);
        again.ping();
        agent.assert_running("after the bad descriptors");
    });
}
