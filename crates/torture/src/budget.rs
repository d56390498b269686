//! The payload budget with real bytes: many connections really send large
//! payloads, together far beyond the agent's `--max-total-payload`, and
//! stall part-way or go on slowly; the agent's resident memory is sampled
//! throughout and must stay within the budget plus [`SLACK`].
//!
//! The same measurement is run as a control on an agent whose budget is
//! larger than everything sent ([`CONTROL_BUDGET`]): there the agent's
//! RSS must rise by at least half of what the stalled connections hold, or
//! the sampling cannot see payload memory and the bound above means
//! nothing (a defect of the measurement, reported as one).

use crate::agent::{rss_kib, AgentUnderTest};
use crate::listeners::{is_timeout, Sock};
use crate::scenarios::{identity_id, scenario, Tried};
use crate::{Config, ScenarioResult, TortureError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use wire::{Header, Kind, HEADER_LEN};

/// The budget of the bounded run.
pub const BUDGET: u64 = 64 << 20;

/// The budget of the control run: more than all the connections send.
pub const CONTROL_BUDGET: u64 = 1 << 30;

/// What the agent's RSS may exceed the bounded run's baseline by beyond the
/// budget: its receive staging, a worker thread's allocator arena, the
/// observer's requests.
pub const SLACK: u64 = 32 << 20;

/// Connections, and the payload each declares and sends.
const CLIENTS: u64 = 16;
const EACH: u64 = 32 << 20;
/// Where a stalling connection stops sending.
const STALL_AT: u64 = 24 << 20;
/// A slow connection sends a MiB every this long.
const SLOW_STEP: Duration = Duration::from_millis(20);
const CHUNK: usize = 1 << 20;

/// How one connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
enum End {
    /// Its whole payload echoed back, byte for byte.
    Echoed,
    /// Refused `limit-exceeded` (the budget ran out under it).
    Refused,
    /// Stalled, nothing came back before it left.
    Waiting,
    /// Closed or reset by the agent without an answer.
    Closed,
    /// Anything else: another status, wrong bytes, a write that blocked
    /// past the hang limit.
    Other,
}

/// Every real-bytes row: the bounded run and the control run on each socket
/// transport (`--quick`: on the first of them only, with short observer
/// phases, to keep CI's run short).
pub fn real_bytes_rows(cfg: &Config) -> Result<Vec<ScenarioResult>, TortureError> {
    let mut c = cfg.clone();
    if cfg.quick {
        c.phase = Duration::from_millis(200);
    }
    let mut rows = Vec::new();
    for (i, t) in cfg.transports.iter().filter(|t| *t != "shm").enumerate() {
        if i > 0 && cfg.quick {
            break;
        }
        rows.push(real_bytes(&c, t, BUDGET, false)?);
        rows.push(real_bytes(&c, t, CONTROL_BUDGET, true)?);
    }
    Ok(rows)
}

/// On a fresh agent with `budget` (`--max-total-payload`; the largest
/// request 32 MiB): 16 connections each declare a 32 MiB request to
/// `identity` and really send its bytes, a MiB at a time; the even ones
/// stop at 24 MiB and stall for `cfg.attack`, the odd ones go on at a MiB
/// per 20 ms to the end and read their answer. The agent's RSS is sampled
/// every 10 ms. `control` marks the control run (see the module doc).
pub fn real_bytes(
    cfg: &Config,
    transport: &str,
    budget: u64,
    control: bool,
) -> Result<ScenarioResult, TortureError> {
    let (budget_s, each_s) = (budget.to_string(), EACH.to_string());
    let mut agent = AgentUnderTest::start(
        &cfg.exe,
        &cfg.digits,
        &[
            "--max-total-payload",
            budget_s.as_str(),
            "--max-payload",
            each_s.as_str(),
        ],
    )?;
    let uri = agent.uri(transport).to_string();
    let identity = identity_id(&uri)?;
    let pid = agent.pid();
    let hold = cfg.attack;
    let name = if control {
        "payload budget, real bytes (control)"
    } else {
        "payload budget, real bytes"
    };
    scenario(&mut agent, cfg, name, transport, move |_| {
        let rss0 = rss_kib(pid);
        let ends: [AtomicU64; 5] = Default::default();
        let sent = AtomicU64::new(0);
        let done = AtomicBool::new(false);
        let mut peak = rss0;
        let stall_until = Instant::now() + hold;
        std::thread::scope(|s| {
            let clients: Vec<_> = (0..CLIENTS)
                .map(|i| {
                    let (uri, sent) = (uri.as_str(), &sent);
                    s.spawn(move || {
                        let stall = i % 2 == 0;
                        one_client(uri, identity, i, stall, stall_until, sent)
                    })
                })
                .collect();
            let sampler = s.spawn(|| {
                let mut peak = rss0;
                while !done.load(Ordering::Relaxed) {
                    peak = peak.max(rss_kib(pid));
                    std::thread::sleep(Duration::from_millis(10));
                }
                peak
            });
            for c in clients {
                let end = c.join().unwrap_or(End::Other);
                ends[end as usize].fetch_add(1, Ordering::Relaxed);
            }
            done.store(true, Ordering::Relaxed);
            peak = sampler.join().unwrap_or(u64::MAX);
        });
        let n = |e: End| ends[e as usize].load(Ordering::Relaxed);
        let grew = peak.saturating_sub(rss0) << 10;
        let held_by_stalls = CLIENTS / 2 * STALL_AT;
        let (defect, verdict) = if control {
            // The measurement must see what the agent holds.
            let blind = grew < held_by_stalls / 2;
            (
                blind,
                if blind {
                    format!(
                        "BLIND: under half of the {} MiB the stalled connections hold",
                        held_by_stalls >> 20
                    )
                } else {
                    format!(
                        "the sampling sees the {} MiB the stalled connections hold",
                        held_by_stalls >> 20
                    )
                },
            )
        } else {
            let over = grew > budget + SLACK;
            (
                over,
                format!(
                    "{} the budget + {} MiB slack",
                    if over { "OVER" } else { "within" },
                    SLACK >> 20
                ),
            )
        };
        // A connection refused for no reason the budget gives, or an echo
        // with wrong bytes, is a defect too.
        let other = n(End::Other);
        Tried {
            count: CLIENTS,
            defects: u64::from(defect) + other,
            notes: vec![format!(
                "{CLIENTS} × {} MiB declared against a {} MiB budget, {} MiB really sent \
                 (half stall at {} MiB for {:?}, half go on at a MiB per {:?}): {} echoed, \
                 {} refused limit-exceeded, {} still waiting at the end, {} closed, {} other; \
                 agent RSS peak +{} MiB over its baseline: {verdict}",
                EACH >> 20,
                budget >> 20,
                sent.load(Ordering::Relaxed) >> 20,
                STALL_AT >> 20,
                hold,
                SLOW_STEP,
                n(End::Echoed),
                n(End::Refused),
                n(End::Waiting),
                n(End::Closed),
                other,
                grew >> 20,
            )],
        }
    })
}

/// One connection: Hello, a 32 MiB request to `identity`, its bytes a MiB
/// at a time (stalling at [`STALL_AT`] until `stall_until`, or slowly to
/// the end), then whatever the agent answered.
fn one_client(
    uri: &str,
    identity: u32,
    i: u64,
    stall: bool,
    stall_until: Instant,
    sent: &AtomicU64,
) -> End {
    let Ok(mut s) = Sock::connect(uri) else {
        return End::Closed;
    };
    if s.hello().is_err() {
        return End::Closed;
    }
    let (h, desc) = crate::hostile::u8_request(identity, 100 + i, EACH);
    let mut head = h.encode().to_vec();
    head.extend_from_slice(&desc);
    if s.write_all(&head).is_err() {
        return End::Closed;
    }
    let chunk = vec![pattern(i); CHUNK];
    let stop = if stall { STALL_AT } else { EACH };
    let mut at = 0;
    while at < stop {
        match s.write_all(&chunk) {
            Ok(()) => {
                at += CHUNK as u64;
                sent.fetch_add(CHUNK as u64, Ordering::Relaxed);
            }
            // The agent refused and closed: read its answer below.
            Err(e) if !is_timeout(&e) => break,
            // Blocked past the hang limit: the agent neither read nor
            // refused.
            Err(_) => return End::Other,
        }
        if !stall {
            std::thread::sleep(SLOW_STEP);
        }
    }
    if stall {
        if let Some(left) = stall_until.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        let _ = s.set_timeout(Some(Duration::from_millis(200)));
    }
    answer(&mut s, i)
}

/// Reads the agent's answer to connection `i`'s request.
fn answer(s: &mut Sock, i: u64) -> End {
    let mut head = [0u8; HEADER_LEN];
    match s.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if is_timeout(&e) => return End::Waiting,
        Err(_) => return End::Closed,
    }
    let Ok(r) = Header::decode(&head) else {
        return End::Other;
    };
    if r.kind == Kind::Error {
        return if r.status == wire::Status::LimitExceeded {
            End::Refused
        } else {
            End::Other
        };
    }
    if r.kind != Kind::Response || r.payload_len != EACH {
        return End::Other;
    }
    let mut desc = vec![0u8; r.desc_len as usize];
    if s.read_exact(&mut desc).is_err() {
        return End::Closed;
    }
    let mut buf = vec![0u8; CHUNK];
    let mut left = r.payload_len;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        if s.read_exact(&mut buf[..n]).is_err() {
            return End::Closed;
        }
        if buf[..n].iter().any(|&b| b != pattern(i)) {
            return End::Other;
        }
        left -= n as u64;
    }
    End::Echoed
}

/// The byte connection `i` fills its payload with.
fn pattern(i: u64) -> u8 {
    0x41 + i as u8
}
