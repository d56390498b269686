//! The scenarios: each attacks the agent one way on one transport while an
//! [`Observer`] is served beside it, and returns a [`ScenarioResult`]
//! (what was tried, what the observer saw before/during/after, what the
//! agent kept afterwards).
//!
//! On a socket, each hostile message gets its own connection: Hello (when
//! the attack wants to reach past it), the bytes, then the write side shut.
//! The agent must answer an error or close; a connection it neither
//! answers nor closes within [`HANG_LIMIT`] is a defect (`hung`), as is an
//! agent that dies. The socket scenarios are the same for every listener
//! (unix, tcp, tls, vsock, http, grpc): what each sends is its [`Door`]'s.

use crate::agent::AgentUnderTest;
pub use crate::listeners::HANG_LIMIT;
use crate::listeners::{attack_once, is_timeout, Door, Opening, Outcome, Sock, Target};
use crate::observer::{Observer, Phase, PhaseStats};
use crate::{Config, ScenarioResult, TortureError};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use wire::{Header, Kind, Limits, HEADER_LEN};

/// Runs `attack` on the agent's `transport` between an observer's
/// before and after phases, and measures what it left behind.
pub(crate) fn scenario(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    name: &str,
    transport: &str,
    attack: impl FnOnce(&AgentUnderTest) -> Tried,
) -> Result<ScenarioResult, TortureError> {
    let obs = Observer::beside(agent, transport);
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

/// The door `transport` names and a target to attack it at; its
/// identity model's id (asked over its native transport).
fn door_of(agent: &AgentUnderTest, transport: &str) -> Result<(Door, Target, u32), TortureError> {
    let door = Door::parse(transport)
        .ok_or_else(|| TortureError(format!("{transport}: no socket attacks on it")))?;
    let uri = agent.uri(transport);
    let target = Target::new(uri).map_err(|e| TortureError(format!("{uri}: {e}")))?;
    let identity = identity_id(agent.uri(door.native_transport()))?;
    Ok((door, target, identity))
}

/// Hostile bytes at volume on `transport` (a socket listener): every
/// fixed hostile message of its door (for the native ones, every
/// corruption and truncation of a valid request), then random messages,
/// `total` in all, from two threads.
pub fn hostile_bytes(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    transport: &str,
    total: u64,
) -> Result<ScenarioResult, TortureError> {
    let (door, target, identity) = door_of(agent, transport)?;
    scenario(agent, cfg, "hostile bytes", transport, move |_| {
        let fixed = door.fixed_shots(identity);
        let counts: [AtomicU64; 4] = Default::default();
        let hung_names = std::sync::Mutex::new(Vec::<String>::new());
        let next = AtomicU64::new(0);
        let fixed = &fixed;
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (target, counts, hung_names, next) = (&target, &counts, &hung_names, &next);
                s.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(0x7e57 + t);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= total {
                            return;
                        }
                        let random;
                        let shot = match fixed.get(i as usize) {
                            Some(a) => a,
                            None => {
                                random = door.random_shot(&mut rng, identity);
                                &random
                            }
                        };
                        let o = attack_once(target, shot);
                        counts[o as usize].fetch_add(1, Ordering::Relaxed);
                        if o == Outcome::Hung {
                            let mut h = hung_names.lock().unwrap_or_else(|p| p.into_inner());
                            if h.len() < 5 {
                                h.push(shot.name.clone());
                            }
                        }
                    }
                });
            }
        });
        let c = |o: Outcome| counts[o as usize].load(Ordering::Relaxed);
        let mut notes = vec![format!(
            "{} fixed ({} sent), then random; answered {}, closed {}, refused {}, hung {}",
            fixed.len(),
            (fixed.len() as u64).min(total),
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

/// Slowloris: `cfg.slow_senders` connections each open as their door's
/// clients do (a native Hello; nothing on http and grpc), then send a
/// valid request one byte every 20 ms, for `cfg.attack`. The agent may
/// close them (its stall deadline); none may hold the observer back.
pub fn slowloris(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    transport: &str,
) -> Result<ScenarioResult, TortureError> {
    let (n, dur) = (cfg.slow_senders, cfg.attack);
    let (door, target, identity) = door_of(agent, transport)?;
    scenario(agent, cfg, "slowloris", transport, move |_| {
        let (req, opening) = door.slow_request(identity);
        let mut socks: Vec<Option<Sock>> = (0..n).map(|_| target.open(opening).ok()).collect();
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

/// The agent's handshake deadline (`serve`'s default
/// `handshake_timeout_ms`, which the agent under test keeps), plus the
/// reaper's slack: every listener, the KServe doors included, closes a
/// connection that has not started its handshake by then.
const HANDSHAKE_DEADLINE: Duration = Duration::from_millis(3000 + 750);

/// Idle connections: `cfg.idle` bare connections (no Hello, no TLS
/// handshake, no HTTP request), held for `cfg.attack`. The agent may
/// refuse some (its limits, clearly); the observer must not notice. When
/// the hold outlasts the agent's handshake deadline, a connection the
/// agent has not closed by then is a defect (it would hold a descriptor
/// forever); a shorter hold only notes how many were closed.
pub fn idle(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    transport: &str,
) -> Result<ScenarioResult, TortureError> {
    raise_nofile();
    let (n, dur) = (cfg.idle, cfg.attack);
    let (_, target, _) = door_of(agent, transport)?;
    scenario(agent, cfg, "idle connections", transport, move |_| {
        let mut held = Vec::with_capacity(n);
        let mut failed = 0u64;
        for _ in 0..n {
            match target.open(Opening::Raw) {
                Ok(s) => held.push(s),
                Err(_) => failed += 1,
            }
        }
        std::thread::sleep(dur);
        // Those the agent closed (its handshake deadline) read EOF now.
        let closed = held
            .iter_mut()
            .map(Sock::closed_by_peer)
            .filter(|&c| c)
            .count();
        let open = held.len();
        drop(held);
        let never_closed = if dur >= HANDSHAKE_DEADLINE {
            (open - closed) as u64
        } else {
            0
        };
        Tried {
            count: n as u64,
            defects: never_closed,
            notes: vec![format!(
                "{open} connected ({failed} refused at connect); {closed} closed by the agent within {dur:?}"
            )],
        }
    })
}

/// Connect churn: open a session as the door's clients do (a native
/// Hello, over TLS on a TLS door; an HTTP readiness probe; the HTTP/2
/// preface answered by SETTINGS) and close, as fast as two threads can,
/// for `cfg.attack`.
pub fn churn(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    transport: &str,
) -> Result<ScenarioResult, TortureError> {
    let dur = cfg.attack;
    let (door, target, _) = door_of(agent, transport)?;
    scenario(agent, cfg, "connect churn", transport, move |_| {
        let ok = AtomicU64::new(0);
        let bad = AtomicU64::new(0);
        let hung = AtomicU64::new(0);
        let end = Instant::now() + dur;
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while Instant::now() < end {
                        match target
                            .open(Opening::Secured)
                            .and_then(|mut s| door.open_session(&mut s))
                        {
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
                "{:.0} sessions/s opened and closed; {bad} refused, {hung} openings unanswered",
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
    ScenarioResult::unobserved(
        name,
        transport,
        1,
        u64::from(!ok),
        took.as_secs_f64(),
        format!("{what} after {:.0} ms", took.as_secs_f64() * 1e3),
    )
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
        let (mut h, desc) = crate::hostile::u8_request(identity, 0, EACH);
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
                        let (mut h, desc) = crate::hostile::u8_request(identity, 1, 0);
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
