//! The scenarios: each attacks the agent one way on one transport while an
//! [`Observer`] is served beside it, and returns a [`ScenarioResult`]
//! (what was tried, what the observer saw before/during/after, what the
//! agent kept afterwards).
//!
//! On a socket, each hostile message gets its own connection: Hello (when
//! the attack wants to reach past it), the bytes, then the write side shut.
//! The agent must answer an error or close; a connection it neither
//! answers nor closes within [`HANG_LIMIT`] is a defect (`hung`), as is an
//! agent that dies.

use crate::agent::AgentUnderTest;
use crate::hostile::{self, Attack};
use crate::observer::{Observer, Phase, PhaseStats};
use crate::{Config, ScenarioResult, TortureError};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use transport::Endpoint;
use wire::{encode_hello, Header, Kind, Limits, HEADER_LEN};

/// How long an attacked connection may stay open after its bytes and
/// EOF were sent before it counts as hung.
pub const HANG_LIMIT: Duration = Duration::from_secs(5);

/// A plain socket to the agent.
pub(crate) enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Sock {
    pub(crate) fn connect(uri: &str) -> std::io::Result<Sock> {
        let s = match Endpoint::parse(uri) {
            Ok(Endpoint::Unix(p)) => Sock::Unix(UnixStream::connect(p)?),
            Ok(Endpoint::Tcp { addr, .. }) => {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                Sock::Tcp(s)
            }
            _ => {
                return Err(std::io::Error::other(format!(
                    "{uri}: attacks need a unix:// or tcp:// endpoint"
                )))
            }
        };
        s.set_timeout(Some(HANG_LIMIT))?;
        Ok(s)
    }

    pub(crate) fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Sock::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Sock::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    pub(crate) fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Sock::Unix(s) => s.write_all(b),
            Sock::Tcp(s) => s.write_all(b),
        }
    }

    pub(crate) fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Unix(s) => s.read(b),
            Sock::Tcp(s) => s.read(b),
        }
    }

    pub(crate) fn shutdown_write(&self) {
        let _ = match self {
            Sock::Unix(s) => s.shutdown(Shutdown::Write),
            Sock::Tcp(s) => s.shutdown(Shutdown::Write),
        };
    }

    /// Sends a Hello and reads the HelloAck.
    pub(crate) fn hello(&mut self) -> std::io::Result<()> {
        let body = encode_hello(&Limits {
            max_tensors: 0,
            max_in_flight: 0,
            max_payload: 0,
            max_desc_len: 0,
        });
        let mut h = Header::new(Kind::Hello);
        h.request_id = 1;
        h.desc_len = body.len() as u32;
        let mut b = h.encode().to_vec();
        b.extend_from_slice(&body);
        self.write_all(&b)?;
        let mut head = [0u8; HEADER_LEN];
        self.read_exact(&mut head)?;
        let ack = Header::decode(&head).map_err(std::io::Error::other)?;
        if ack.kind != Kind::HelloAck {
            return Err(std::io::Error::other(format!(
                "Hello answered with {:?}",
                ack.kind
            )));
        }
        let mut body = vec![0u8; ack.desc_len.min(1 << 16) as usize];
        self.read_exact(&mut body)
    }

    pub(crate) fn read_exact(&mut self, b: &mut [u8]) -> std::io::Result<()> {
        match self {
            Sock::Unix(s) => s.read_exact(b),
            Sock::Tcp(s) => s.read_exact(b),
        }
    }
}

/// How the agent took one hostile message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// It answered (an error, or a response to a corruption that is still a
    /// valid request) and closed at our EOF.
    Answered,
    /// It closed without a word.
    Closed,
    /// It refused the connection (a limit) before the bytes went out.
    Refused,
    /// Neither within [`HANG_LIMIT`]: a defect.
    Hung,
}

/// Sends `bytes` on a fresh connection (after a Hello if `hello`), shuts
/// the write side and reads until the agent closes.
fn attack_once(uri: &str, hello: bool, bytes: &[u8]) -> Outcome {
    let Ok(mut s) = Sock::connect(uri) else {
        return Outcome::Refused;
    };
    if hello {
        match s.hello() {
            Ok(()) => {}
            // A Hello the agent neither answers nor refuses in time.
            Err(e) if is_timeout(&e) => return Outcome::Hung,
            Err(_) => return Outcome::Refused,
        }
    }
    // The agent may close before it has read everything: that is fine.
    let _ = s.write_all(bytes);
    s.shutdown_write();
    let mut got = 0usize;
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + HANG_LIMIT;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Outcome::Hung
            }
            // Reset: closed with unread data, also an answer of sorts.
            Err(_) => break,
        }
        if Instant::now() >= deadline {
            return Outcome::Hung;
        }
    }
    if got > 0 {
        Outcome::Answered
    } else {
        Outcome::Closed
    }
}

pub(crate) fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Runs `attack` on the agent's `transport` between an observer's
/// before and after phases, and measures what it left behind.
pub(crate) fn scenario(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    name: &str,
    transport: &str,
    attack: impl FnOnce(&AgentUnderTest) -> Tried,
) -> Result<ScenarioResult, TortureError> {
    let obs = Observer::start(agent.uri(transport));
    std::thread::sleep(cfg.phase);
    let fds0 = agent.fds();
    let rss0 = agent.rss_kib();
    obs.mark(Phase::During);
    let t0 = Instant::now();
    let tried = attack(agent);
    let took = t0.elapsed();
    obs.mark(Phase::After);
    // The observer's own session stays open: the baseline counts it.
    let fds_left = agent.settle_fds(fds0, Duration::from_secs(5));
    std::thread::sleep(cfg.phase);
    let rss1 = agent.rss_kib();
    let phases = obs.finish();
    let alive = agent.check_alive();
    Ok(ScenarioResult::new(
        name,
        transport,
        tried,
        &phases,
        fds_left,
        rss1 as i64 - rss0 as i64,
        took,
        alive,
    ))
}

/// What an attack did.
#[derive(Clone, Debug, Default)]
pub struct Tried {
    /// Hostile messages, connections or kills made.
    pub count: u64,
    /// Of them, those the agent took wrongly (hung connections).
    pub defects: u64,
    /// Remarks for the report (outcome counts, rates).
    pub notes: Vec<String>,
}

/// Hostile bytes at volume on `transport` (unix or tcp): every
/// corruption and truncation of a valid request, then random messages up
/// to `cfg.messages` in all, from two threads.
pub fn hostile_bytes(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    transport: &str,
) -> Result<ScenarioResult, TortureError> {
    let uri = agent.uri(transport).to_string();
    let total = cfg.messages;
    let identity = identity_id(&uri)?;
    scenario(agent, cfg, "hostile bytes", transport, move |_| {
        // Corruptions of a request to identity (which takes any tensors)
        // reach the descriptor checks, not just the model lookup.
        let mut fixed: Vec<Attack> = hostile::corruptions(7, identity);
        fixed.extend(hostile::truncations(7, identity));
        let counts: [AtomicU64; 4] = Default::default();
        let hung_names = std::sync::Mutex::new(Vec::<String>::new());
        let next = AtomicU64::new(0);
        let fixed = &fixed;
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (uri, counts, hung_names, next) = (&uri, &counts, &hung_names, &next);
                s.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(0x7e57 + t);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= total {
                            return;
                        }
                        let (attack, hello) = match fixed.get(i as usize) {
                            Some(a) => (a.clone(), true),
                            None => (
                                hostile::random_message(&mut rng, identity),
                                rng.u8(..) >= 32,
                            ),
                        };
                        let o = attack_once(uri, hello, &attack.bytes);
                        counts[o as usize].fetch_add(1, Ordering::Relaxed);
                        if o == Outcome::Hung {
                            let mut h = hung_names.lock().unwrap_or_else(|p| p.into_inner());
                            if h.len() < 5 {
                                h.push(attack.name);
                            }
                        }
                    }
                });
            }
        });
        let c = |o: Outcome| counts[o as usize].load(Ordering::Relaxed);
        let mut notes = vec![format!(
            "{} corruptions and truncations, then random; answered {}, closed {}, refused {}, hung {}",
            fixed.len(),
            c(Outcome::Answered),
            c(Outcome::Closed),
            c(Outcome::Refused),
            c(Outcome::Hung)
        )];
        let hung = hung_names.into_inner().unwrap_or_default();
        if !hung.is_empty() {
            notes.push(format!("hung on: {}", hung.join(", ")));
        }
        Tried {
            count: total,
            defects: c(Outcome::Hung),
            notes,
        }
    })
}

/// Slowloris: `cfg.slow_senders` connections each send a Hello, then a
/// valid request one byte every 20 ms, for `cfg.attack`. The agent may
/// close them (its stall deadline); none may hold the observer back.
pub fn slowloris(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    transport: &str,
) -> Result<ScenarioResult, TortureError> {
    let uri = agent.uri(transport).to_string();
    let (n, dur) = (cfg.slow_senders, cfg.attack);
    let identity = identity_id(&uri)?;
    scenario(agent, cfg, "slowloris", transport, move |_| {
        let (req, _) = hostile::valid_request(9, identity);
        let mut socks: Vec<Option<Sock>> = (0..n)
            .map(|_| {
                let mut s = Sock::connect(&uri).ok()?;
                s.hello().ok()?;
                Some(s)
            })
            .collect();
        let opened = socks.iter().filter(|s| s.is_some()).count();
        let end = Instant::now() + dur;
        let mut at = 0usize;
        let mut closed = 0usize;
        while Instant::now() < end && at < req.len() {
            for s in socks.iter_mut() {
                if let Some(sock) = s {
                    if sock.write_all(&req[at..at + 1]).is_err() {
                        closed += 1;
                        *s = None;
                    }
                }
            }
            at += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(socks);
        Tried {
            count: n as u64,
            defects: 0,
            notes: vec![format!(
                "{opened} opened; {closed} closed by the agent while trickling; {at} bytes each"
            )],
        }
    })
}

/// Idle connections: `cfg.idle` bare connections (no Hello), held for
/// `cfg.attack`. The agent may refuse some (its limits, clearly); the
/// observer must not notice.
pub fn idle(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    transport: &str,
) -> Result<ScenarioResult, TortureError> {
    raise_nofile();
    let uri = agent.uri(transport).to_string();
    let (n, dur) = (cfg.idle, cfg.attack);
    scenario(agent, cfg, "idle connections", transport, move |_| {
        let mut held = Vec::with_capacity(n);
        let mut failed = 0u64;
        for _ in 0..n {
            match Sock::connect(&uri) {
                Ok(s) => held.push(s),
                Err(_) => failed += 1,
            }
        }
        std::thread::sleep(dur);
        // Those the agent closed (its handshake deadline) read EOF now.
        let mut closed = 0;
        for s in &mut held {
            let _ = s.set_timeout(Some(Duration::from_millis(1)));
            let mut b = [0u8; 256];
            if s.read(&mut b).is_ok() {
                closed += 1;
            }
        }
        let open = held.len();
        drop(held);
        Tried {
            count: n as u64,
            defects: 0,
            notes: vec![format!(
                "{open} connected ({failed} refused at connect); {closed} closed by the agent within {dur:?}"
            )],
        }
    })
}

/// Connect churn: Hello and close, as fast as two threads can, for
/// `cfg.attack`.
pub fn churn(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    transport: &str,
) -> Result<ScenarioResult, TortureError> {
    let uri = agent.uri(transport).to_string();
    let dur = cfg.attack;
    scenario(agent, cfg, "connect churn", transport, move |_| {
        let ok = AtomicU64::new(0);
        let bad = AtomicU64::new(0);
        let hung = AtomicU64::new(0);
        let end = Instant::now() + dur;
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while Instant::now() < end {
                        match Sock::connect(&uri).and_then(|mut s| s.hello()) {
                            Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                            // Not answered within the hang limit: a defect.
                            Err(e) if is_timeout(&e) => hung.fetch_add(1, Ordering::Relaxed),
                            Err(_) => bad.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                });
            }
        });
        let (ok, bad, hung) = (ok.into_inner(), bad.into_inner(), hung.into_inner());
        Tried {
            count: ok + bad + hung,
            defects: hung,
            notes: vec![format!(
                "{:.0} sessions/s opened and closed; {bad} refused, {hung} Hellos unanswered",
                (ok + bad + hung) as f64 / dur.as_secs_f64()
            )],
        }
    })
}

/// Clients killed mid-request: `tensorwire ping` children sending small
/// (256 B) and large (64 MiB) tensors over `transport`, each SIGKILLed
/// after a random 20–300 ms, `cfg.kills` times. The agent must free their
/// sessions (descriptors back to the baseline).
pub fn client_kills(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    exe: &Path,
    transport: &str,
) -> Result<ScenarioResult, TortureError> {
    let uri = agent.uri(transport).to_string();
    let kills = cfg.kills;
    let exe = exe.to_path_buf();
    scenario(
        agent,
        cfg,
        "client killed mid-request",
        transport,
        move |_| {
            let mut rng = fastrand::Rng::with_seed(11);
            let mut started = 0;
            let mut early = 0;
            let mut notes = Vec::new();
            for k in 0..kills {
                let size = if k % 2 == 0 { "256" } else { "67108864" };
                let mut cmd = Command::new(&exe);
                cmd.args(["ping", "--connect", &uri, "--size", size, "--warmup", "0"])
                    .args(["--duration", "30", "-n", "1000000000"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                crate::agent::die_with_parent(&mut cmd);
                match cmd.spawn() {
                    Ok(mut child) => {
                        started += 1;
                        std::thread::sleep(Duration::from_millis(rng.u64(20..=300)));
                        // A client that already ended was not killed
                        // mid-request: the scenario did not test what it says.
                        if let Ok(Some(status)) = child.try_wait() {
                            early += 1;
                            if notes.len() < 3 {
                                notes.push(format!(
                                    "a {size}-byte ping ended before its kill ({status})"
                                ));
                            }
                        }
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    Err(e) => notes.push(format!("cannot run {}: {e}", exe.display())),
                }
            }
            notes.insert(
                0,
                format!("{started} ping clients killed (256 B and 64 MiB, alternating)"),
            );
            Tried {
                count: started,
                defects: early,
                notes,
            }
        },
    )
}

impl ScenarioResult {
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: &str,
        transport: &str,
        tried: Tried,
        phases: &[PhaseStats; 3],
        fds_left: usize,
        rss_delta_kib: i64,
        took: Duration,
        alive: Result<(), TortureError>,
    ) -> ScenarioResult {
        let [before, during, after] = phases;
        let p99_before = before.quantile_us(0.99);
        let p99_during = during.quantile_us(0.99);
        let mut notes = tried.notes;
        for (label, p) in [("before", before), ("during", during), ("after", after)] {
            if !p.first_errors.is_empty() {
                notes.push(format!(
                    "observer errors {label}: {}",
                    p.first_errors.join("; ")
                ));
            }
        }
        let mut defects = tried.defects;
        if let Err(e) = alive {
            notes.push(e.0);
            defects += 1;
        }
        ScenarioResult {
            name: name.into(),
            transport: transport.into(),
            tried: tried.count,
            defects,
            others_requests: phases.iter().map(|p| p.latencies_ns.len() as u64).sum(),
            others_errors: phases.iter().map(|p| p.errors).sum(),
            others_wrong: phases.iter().map(|p| p.wrong).sum(),
            others_p99_before_us: p99_before,
            others_p99_during_us: p99_during,
            others_p99_after_us: after.quantile_us(0.99),
            others_p99_ratio: if p99_before > 0.0 {
                p99_during / p99_before
            } else {
                0.0
            },
            leaks: crate::Leaks {
                fds: fds_left,
                rss_delta_kib,
            },
            seconds: took.as_secs_f64(),
            notes,
        }
    }
}

/// Raises this process's open-file limit to its hard limit (the idle
/// scenario holds thousands of sockets).
fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// How much later than its timeout a client may report it.
const TIMEOUT_SLACK: Duration = Duration::from_millis(500);

/// How soon after the agent's death a waiting client must report it.
const KILL_NOTICED: Duration = Duration::from_millis(500);

/// The agent itself fails, on a fresh agent of its own: stopped
/// (`SIGSTOP`) while each transport's client waits (each must end with
/// `Timeout` within its 1 s timeout), killed (`SIGKILL`) while they wait
/// (each must end with a clear error within its timeout — `AgentGone` when
/// the transport notices the death), then restarted on the same
/// endpoints (a client that reconnects must be served again). One row per
/// fault and transport; the time each client took is in its notes.
pub fn agent_faults(cfg: &Config) -> Result<Vec<ScenarioResult>, TortureError> {
    use client::{Client, ClientError, ClientOptions, DType, TensorRef};
    let mut agent = AgentUnderTest::start(&cfg.exe, &cfg.digits, &[])?;
    let timeout = Duration::from_secs(1);
    let opts = ClientOptions {
        timeout,
        connect_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let data = [3u8; 64];
    let call = |m: &client::Model| -> Result<(), ClientError> {
        let t = TensorRef::new(DType::U8, &[64], &data)?;
        m.infer(&[t]).map(drop)
    };
    let connect = |uri: &str| -> Result<(Client, client::Model), TortureError> {
        let c = Client::connect_with(uri, opts.clone())
            .map_err(|e| TortureError(format!("{uri}: {e}")))?;
        let m = c
            .model("identity")
            .map_err(|e| TortureError(format!("{uri}: {e}")))?;
        Ok((c, m))
    };
    let mut sessions = Vec::new();
    for t in &cfg.transports {
        let (c, m) = connect(agent.uri(t))?;
        call(&m).map_err(|e| TortureError(format!("{t}: warm-up: {e}")))?;
        sessions.push((t.clone(), c, m));
    }
    let mut rows = Vec::new();
    // Each client calls once from its own thread while `act` runs 100 ms
    // in; returns (transport, result, when it called, when it returned).
    let wave = |act: &dyn Fn()| {
        std::thread::scope(|s| {
            let hs: Vec<_> = sessions
                .iter()
                .map(|(t, _, m)| {
                    s.spawn(move || {
                        let t0 = Instant::now();
                        let r = call(m);
                        (t.clone(), r, t0, Instant::now())
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(100));
            act();
            hs.into_iter()
                .filter_map(|h| h.join().ok())
                .collect::<Vec<_>>()
        })
    };
    agent.freeze();
    for (t, r, t0, end) in wave(&|| {}) {
        let took = end - t0;
        let ok = matches!(r, Err(ClientError::Timeout(_))) && took <= timeout + TIMEOUT_SLACK;
        rows.push(fault_row("agent stopped (SIGSTOP)", &t, ok, took, &r));
    }
    agent.signal(libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(300));
    agent.freeze();
    let killed = std::cell::Cell::new(Instant::now());
    let results = wave(&|| {
        agent.signal(libc::SIGKILL);
        killed.set(Instant::now());
    });
    for (t, r, _, end) in results {
        // Measured from the kill, not from the call; the death itself must
        // be noticed (AgentGone), not waited out (Timeout).
        let took = end.saturating_duration_since(killed.get());
        let ok = matches!(r, Err(ref e) if !matches!(e, ClientError::Timeout(_)))
            && took <= KILL_NOTICED;
        rows.push(fault_row("agent killed (SIGKILL)", &t, ok, took, &r));
    }
    agent.restart()?;
    for t in &cfg.transports {
        let t0 = Instant::now();
        let r = connect(agent.uri(t))
            .map_err(|e| ClientError::AgentGone(e.0))
            .and_then(|(_c, m)| (0..100).try_for_each(|_| call(&m)));
        let ok = r.is_ok();
        rows.push(fault_row(
            "agent restarted, client reconnects",
            t,
            ok,
            t0.elapsed(),
            &r,
        ));
    }
    Ok(rows)
}

fn fault_row(
    name: &str,
    transport: &str,
    ok: bool,
    took: Duration,
    r: &Result<(), client::ClientError>,
) -> ScenarioResult {
    let what = match r {
        Ok(()) => "served".to_string(),
        Err(e) => format!("error: {e}"),
    };
    ScenarioResult {
        name: name.into(),
        transport: transport.into(),
        tried: 1,
        defects: u64::from(!ok),
        others_requests: 0,
        others_errors: 0,
        others_wrong: 0,
        others_p99_before_us: 0.0,
        others_p99_during_us: 0.0,
        others_p99_after_us: 0.0,
        others_p99_ratio: 0.0,
        leaks: crate::Leaks {
            fds: 0,
            rss_delta_kib: 0,
        },
        seconds: took.as_secs_f64(),
        notes: vec![format!("{what} after {:.0} ms", took.as_secs_f64() * 1e3)],
    }
}

/// The payload budget the [`payload_budget`] scenario gives its agent.
pub const BUDGET: u64 = 64 << 20;

/// Many concurrent large declared payloads, on a fresh agent with a
/// [`BUDGET`] of request payload bytes in flight (`--max-total-payload`,
/// and the same largest request, `--max-payload`):
/// 16 connections per transport each declare a 16 MiB request (4× the
/// budget together), send its first 64 KiB and stall. The agent's memory
/// must stay within the budget (peak RSS over the baseline, sampled every
/// 20 ms), the requests over it must be refused at once (`limit-exceeded`),
/// and the well-behaved client beside them must still be served.
pub fn payload_budget(cfg: &Config, transport: &str) -> Result<ScenarioResult, TortureError> {
    let budget = BUDGET.to_string();
    let mut agent = AgentUnderTest::start(
        &cfg.exe,
        &cfg.digits,
        &[
            "--max-total-payload",
            budget.as_str(),
            "--max-payload",
            budget.as_str(),
        ],
    )?;
    let uri = agent.uri(transport).to_string();
    let hold = cfg.attack;
    let identity = identity_id(&uri)?;
    let pid = agent.pid();
    scenario(&mut agent, cfg, "payload budget", transport, move |_| {
        const EACH: u64 = 16 << 20;
        let rss0 = crate::agent::rss_kib(pid);
        let mut h = Header::new(Kind::Request);
        let desc = {
            let mut d = Vec::new();
            wire::encode_tensor_section(
                &[wire::TensorDesc {
                    dtype: wire::DType::U8,
                    shape: vec![EACH],
                    offset: 0,
                    len: EACH,
                }],
                None,
                &mut d,
            );
            d
        };
        h.model_id = identity;
        h.tensor_count = 1;
        h.desc_len = desc.len() as u32;
        h.payload_len = EACH;
        let mut socks = Vec::new();
        for i in 0..16u64 {
            let Ok(mut s) = Sock::connect(&uri) else {
                continue;
            };
            if s.hello().is_err() {
                continue;
            }
            h.request_id = 100 + i;
            let mut b = h.encode().to_vec();
            b.extend_from_slice(&desc);
            b.resize(b.len() + (64 << 10), 0x5a);
            if s.write_all(&b).is_ok() {
                socks.push(s);
            }
        }
        // Hold them, sampling the agent's memory; then read what came back:
        // the refusals of the requests over budget.
        let mut peak = rss0;
        let end = Instant::now() + hold;
        while Instant::now() < end {
            peak = peak.max(crate::agent::rss_kib(pid));
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut refused = 0;
        let mut other = Vec::new();
        for s in &mut socks {
            let _ = s.set_timeout(Some(Duration::from_millis(50)));
            let mut head = [0u8; HEADER_LEN];
            match s.read_exact(&mut head) {
                Ok(()) => match Header::decode(&head) {
                    Ok(r) if r.kind == Kind::Error && r.status == wire::Status::LimitExceeded => {
                        refused += 1
                    }
                    Ok(r) => other.push(format!("{:?} {:?}", r.kind, r.status)),
                    Err(e) => other.push(e.to_string()),
                },
                Err(e) => other.push(e.kind().to_string()),
            }
        }
        other.sort();
        other.dedup();
        let grew_kib = peak.saturating_sub(rss0);
        let over = grew_kib > (BUDGET >> 10) + (32 << 10);
        let held = socks.len();
        drop(socks);
        Tried {
            count: 16,
            defects: u64::from(over),
            notes: vec![format!(
                "{held} declared 16 MiB each against a {} MiB budget: {refused} refused (limit-exceeded), the others: {}; agent RSS peak +{} MiB{}",
                BUDGET >> 20,
                other.join(", "),
                grew_kib >> 10,
                if over { " — OVER the budget" } else { "" }
            )],
        }
    })
}

/// The id of the agent's `identity` model (it takes any tensors, so a
/// hostile request to it reaches every check of the descriptors).
pub(crate) fn identity_id(uri: &str) -> Result<u32, TortureError> {
    let c = client::Client::connect(uri).map_err(|e| TortureError(format!("{uri}: {e}")))?;
    let m = c
        .model("identity")
        .map_err(|e| TortureError(format!("{uri}: identity: {e}")))?;
    Ok(m.id())
}

/// Hostile shared-memory clients, `cfg.shm_rounds` of them one after
/// another, in turn: one scribbles random bytes over its whole arena
/// (rings, headers, both regions) and wakes the agent; one publishes
/// requests until its ring is full and never reads an answer; one writes
/// half a Hello on the control socket and closes. Each then leaves. The
/// agent must free every session (descriptors back to the baseline) while
/// the well-behaved client beside them, over shm too, is served.
pub fn shm_hostile(
    agent: &mut AgentUnderTest,
    cfg: &Config,
) -> Result<ScenarioResult, TortureError> {
    use transport::shm::{control_path, futex, layout::AGENT_SLEEP, ShmChannel};
    let uri = agent.uri("shm").to_string();
    let name = uri.trim_start_matches("shm://").to_string();
    let path = control_path(&name).map_err(|e| TortureError(format!("{uri}: {e}")))?;
    let identity = identity_id(&uri)?;
    let rounds = cfg.shm_rounds;
    scenario(agent, cfg, "hostile shm clients", "shm", move |_| {
        let mut rng = fastrand::Rng::with_seed(0x5a);
        let (mut scribbled, mut flooded, mut halves, mut failed) = (0u64, 0u64, 0u64, 0u64);
        for round in 0..rounds {
            match round % 3 {
                0 | 1 => {
                    let Ok((mut ch, _)) =
                        ShmChannel::connect(&path, &Limits::default(), None, 1, HANG_LIMIT)
                    else {
                        failed += 1;
                        continue;
                    };
                    if round % 3 == 0 {
                        let arena = ch.arena().clone();
                        // SAFETY: the arena is this (hostile) client's own
                        // mapping and nothing else in this process uses it;
                        // the agent may write it meanwhile, which is the
                        // fault under test: only bytes are written here.
                        let all = unsafe { arena.bytes_mut(0..arena.len()) };
                        rng.fill(all);
                        let w = arena.atomic_u32(AGENT_SLEEP);
                        w.store(0, Ordering::SeqCst);
                        let _ = futex::wake(w, 1);
                        scribbled += 1;
                    } else {
                        let mut desc = Vec::new();
                        wire::encode_tensor_section(
                            &[wire::TensorDesc {
                                dtype: wire::DType::U8,
                                shape: vec![0],
                                offset: 0,
                                len: 0,
                            }],
                            None,
                            &mut desc,
                        );
                        let mut h = Header::new(Kind::Request);
                        h.model_id = identity;
                        h.tensor_count = 1;
                        h.desc_len = desc.len() as u32;
                        for id in 2..100_000u64 {
                            h.request_id = id;
                            if !matches!(ch.send(&h, &desc), Ok(true)) {
                                break;
                            }
                        }
                        flooded += 1;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    drop(ch);
                }
                _ => {
                    if let Ok(mut s) = UnixStream::connect(&path) {
                        let mut h = Header::new(Kind::Hello);
                        h.desc_len = 32;
                        let _ = s.write_all(&h.encode()[..HEADER_LEN / 2]);
                        halves += 1;
                    } else {
                        failed += 1;
                    }
                }
            }
        }
        Tried {
            count: rounds,
            defects: 0,
            notes: vec![format!(
                "{scribbled} scribbled their arena, {flooded} filled their ring unread, \
                 {halves} left half a Hello; {failed} could not connect"
            )],
        }
    })
}
