//! Clients SIGKILLed at a chosen stage of their request: while it waits in
//! the model's queue, while the engine computes it, and while its answer
//! is being written to it. Each on every transport, with a small (256 B)
//! and a large (64 MiB) tensor.
//!
//! The victim is a `tensorwire infer` child calling `slow_echo`
//! (`models/build_slow_echo.py`: an echo of its input beside ~140 ms of
//! MatMuls, whatever the input's size) on an agent of its own, started
//! with one intra-op thread and a metrics listener. The stage is not
//! guessed from a sleep: it is read from the agent's `/metrics` for that
//! model ([`QueueState`]: runs in progress, requests waiting, in flight,
//! runs completed) before the kill, and the row's notes say what was seen.
//!
//! - *queued*: two other clients of this process keep the model held
//!   (each calls again as soon as it is answered: one running, one
//!   waiting); the victim is killed once the agent counts it waiting too
//!   (2 waiting). Every call of theirs must be answered.
//! - *computing*: the victim alone; killed once its run is in progress
//!   (1 running, 1 in flight).
//! - *being answered*: the victim is stopped (SIGSTOP: it reads nothing
//!   more) while its run is in progress, then killed once the run has
//!   completed; with 64 MiB over a socket the agent is still writing the
//!   answer then (1 in flight), otherwise the answer lies unread in the
//!   socket buffer or the ring.
//!
//! After each: the agent's descriptors back to the baseline, the model idle
//! (nothing running, waiting or in flight), its RSS within [`RSS_SLACK`] of
//! the baseline taken after an uninterrupted request of the same size (so
//! the buffers the agent keeps for reuse are in the baseline and a leaked
//! 64 MiB buffer is not), the well-behaved client served throughout.

use crate::agent::{die_with_parent, AgentUnderTest};
use crate::scenarios::{scenario, Tried};
use crate::{Config, ScenarioResult, TortureError};
use client::{Client, ClientOptions, DType, Model, TensorRef};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The model the kills aim at, as the agent serves it.
const MODEL: &str = "slow";

/// How far over its baseline the agent's RSS may be after a kill, KiB: a
/// leaked large buffer (64 MiB) is far over it; allocator arenas of a
/// worker thread started meanwhile are under it.
pub const RSS_SLACK_KIB: i64 = 24 << 10;

/// The same, as a byte count for the docs.
pub const RSS_SLACK: u64 = (RSS_SLACK_KIB as u64) << 10;

/// How long a stage may take to be reached, or the model to go idle.
const STAGE_LIMIT: Duration = Duration::from_secs(20);

/// Elements of the small (256 B) and large input. The large one is 64 MiB
/// less 4 KiB, so that its echo and the second output fit the 64 MiB
/// agent region of a default shm arena.
const SIZES: [(&str, u64); 2] = [("256 B", 64), ("64 MiB", (16 << 20) - 1024)];

/// Where a victim is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Waiting in the model's queue behind other clients' requests.
    Queued,
    /// Its own run in progress in the engine.
    Computing,
    /// Its answer being written to it (it reads nothing: stopped).
    Answered,
}

impl Stage {
    /// Every stage, in the order the rows are run.
    pub const ALL: [Stage; 3] = [Stage::Queued, Stage::Computing, Stage::Answered];

    fn name(self) -> &'static str {
        match self {
            Stage::Queued => "client killed while queued",
            Stage::Computing => "client killed while computing",
            Stage::Answered => "client killed while answered",
        }
    }
}

/// One model's queue as the agent's `/metrics` shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueState {
    /// Engine runs in progress (`tensorwire_queue_running`).
    pub running: u64,
    /// Requests waiting in the queue (`nv_inference_pending_request_count`).
    pub waiting: u64,
    /// Requests admitted and not yet answered (`tensorwire_inflight_requests`).
    pub in_flight: u64,
    /// Engine runs completed (`tensorwire_queue_runs_total`).
    pub runs: u64,
}

impl QueueState {
    fn idle(&self) -> bool {
        self.running == 0 && self.waiting == 0 && self.in_flight == 0
    }
}

impl std::fmt::Display for QueueState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} running, {} waiting, {} in flight, {} runs done",
            self.running, self.waiting, self.in_flight, self.runs
        )
    }
}

/// Reads `model`'s [`QueueState`] from the metrics listener at `uri`
/// (`http://HOST:PORT`).
pub fn scrape(uri: &str, model: &str) -> Result<QueueState, String> {
    let addr = uri.trim_start_matches("http://").trim_end_matches('/');
    let mut s = TcpStream::connect(addr).map_err(|e| format!("{uri}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{uri}: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("{uri}: {e}"))?;
    let labels = format!("{{model=\"{model}\",version=\"1\"}} ");
    let value = |name: &str| -> Result<u64, String> {
        let prefix = format!("{name}{labels}");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
            .ok_or_else(|| format!("{uri}: no {name} for model {model}"))
    };
    Ok(QueueState {
        running: value("tensorwire_queue_running")?,
        waiting: value("nv_inference_pending_request_count")?,
        in_flight: value("tensorwire_inflight_requests")?,
        runs: value("tensorwire_queue_runs_total")?,
    })
}

/// Polls the metrics (every 2 ms, at most `limit`) until `want` holds;
/// the state that held it, or the last one seen.
fn wait_for(
    uri: &str,
    limit: Duration,
    want: impl Fn(&QueueState) -> bool,
) -> Result<QueueState, String> {
    let deadline = Instant::now() + limit;
    let mut last = QueueState::default();
    loop {
        last = scrape(uri, MODEL).unwrap_or(last);
        if want(&last) {
            return Ok(last);
        }
        if Instant::now() >= deadline {
            return Err(format!("not within {limit:?} (last seen: {last})"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every kill-stage row: stage × transport × size, on an agent of their
/// own serving `slow` (`cfg.slow`). Quick: one kill per row and each
/// transport's rows alternate the sizes (3 rows a transport); full: every
/// size, `KILLS_FULL` kills a row.
pub fn kill_stages(cfg: &Config) -> Result<Vec<ScenarioResult>, TortureError> {
    const KILLS_FULL: u64 = 5;
    if !cfg.slow.is_file() {
        return Err(TortureError(format!(
            "{} is missing: run scripts/setup.sh (models/build_slow_echo.py)",
            cfg.slow.display()
        )));
    }
    let model = format!("{MODEL}={}", cfg.slow.display());
    let mut agent = AgentUnderTest::start(
        &cfg.exe,
        &cfg.digits,
        &[
            "--model",
            model.as_str(),
            "--intra-threads",
            "1",
            "--metrics-listen",
            "http://127.0.0.1:0",
        ],
    )?;
    let metrics = agent
        .metrics
        .clone()
        .ok_or_else(|| TortureError("the agent printed no metrics endpoint".into()))?;
    let dir = tempfile::Builder::new()
        .prefix("tw-kills-")
        .tempdir()
        .map_err(|e| TortureError(format!("temporary directory: {e}")))?;
    let mut inputs = Vec::new();
    for (label, n) in SIZES {
        let path = dir.path().join(format!("x{n}.npy"));
        let data = input(n);
        npy::write_npy(&path, DType::F32, &[n], &data)
            .map_err(|e| TortureError(format!("{}: {e}", path.display())))?;
        inputs.push((label, n, path));
    }
    // The observer's phases are short here: there are many rows.
    let mut row_cfg = cfg.clone();
    if cfg.quick {
        row_cfg.phase = Duration::from_millis(200);
    }
    let kills = if cfg.quick { 1 } else { KILLS_FULL };
    let mut rows = Vec::new();
    for (ti, t) in cfg.transports.iter().enumerate() {
        for (si, stage) in Stage::ALL.into_iter().enumerate() {
            for (zi, (label, n, path)) in inputs.iter().enumerate() {
                if cfg.quick && (ti + si) % 2 != zi {
                    continue;
                }
                let victim = Victim {
                    exe: &cfg.exe,
                    uri: agent.uri(t).to_string(),
                    metrics: &metrics,
                    npy: path,
                };
                // The baseline holds what an uninterrupted request of
                // this size leaves (the agent's reusable buffers).
                warm(&victim.uri, *n)?;
                let name = format!("{} ({label})", stage.name());
                let mut row = scenario(&mut agent, &row_cfg, &name, t, |_| {
                    let mut tried = Tried::default();
                    for _ in 0..kills {
                        victim.kill_at(stage, &mut tried);
                    }
                    tried
                })?;
                if row.leaks.rss_delta_kib > RSS_SLACK_KIB {
                    row.defects += 1;
                    row.notes.push(format!(
                        "RSS {:+} KiB over its baseline: more than the {} MiB allowed",
                        row.leaks.rss_delta_kib,
                        RSS_SLACK_KIB >> 10
                    ));
                }
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// `n` float32 values, as bytes: small integers, so the echo is exact.
fn input(n: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i % 251) as f32).to_le_bytes())
        .collect()
}

fn client_opts() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    }
}

/// One uninterrupted call of `n` elements from this process, its echo
/// checked.
fn warm(uri: &str, n: u64) -> Result<(), TortureError> {
    call(uri, n).map_err(|e| TortureError(format!("{uri}: warm-up call of {MODEL}: {e}")))
}

/// Calls `slow` once with `n` elements on a connection of its own.
fn call(uri: &str, n: u64) -> Result<(), String> {
    let c = Client::connect_with(uri, client_opts()).map_err(|e| e.to_string())?;
    echo(&c.model(MODEL).map_err(|e| e.to_string())?, n)
}

/// Calls `model` once with `n` elements; checks the echo.
fn echo(model: &Model, n: u64) -> Result<(), String> {
    let data = input(n);
    let shape = [n];
    let t = TensorRef::new(DType::F32, &shape, &data).map_err(|e| e.to_string())?;
    let r = model.infer(&[t]).map_err(|e| e.to_string())?;
    match r.outputs.first() {
        Some(y) if y.bytes() == data.as_slice() => Ok(()),
        _ => Err("the echo came back with other bytes".into()),
    }
}

/// Calls `slow` again and again on one connection until `stop` (at most
/// `HOLD_CALLS` times, so a harness that never stops it still ends); how
/// many calls it made.
fn hold(uri: &str, stop: &AtomicBool) -> Result<u64, String> {
    const HOLD_CALLS: u64 = 1000;
    let c = Client::connect_with(uri, client_opts()).map_err(|e| e.to_string())?;
    let m = c.model(MODEL).map_err(|e| e.to_string())?;
    let mut calls = 0;
    while calls < HOLD_CALLS && !stop.load(Ordering::SeqCst) {
        echo(&m, 64)?;
        calls += 1;
    }
    Ok(calls)
}

/// What a kill row needs to start and aim at victims.
struct Victim<'a> {
    exe: &'a Path,
    uri: String,
    metrics: &'a str,
    npy: &'a PathBuf,
}

impl Victim<'_> {
    /// Starts a `tensorwire infer` child calling `slow` with the input
    /// file; its stderr goes to `stderr` (read when a stage is missed).
    fn spawn(&self, stderr: &std::fs::File) -> Result<Child, String> {
        let mut cmd = Command::new(self.exe);
        let stderr = stderr
            .try_clone()
            .map_err(|e| format!("victim stderr: {e}"))?;
        cmd.args(["infer", "--connect", &self.uri, "--model", MODEL, "--input"])
            .arg(format!("x={}", self.npy.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        die_with_parent(&mut cmd);
        cmd.spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.exe.display()))
    }

    /// One victim killed at `stage`: counts it in `tried`, a missed stage
    /// or a failure of anyone else as a defect, with a note either way.
    fn kill_at(&self, stage: Stage, tried: &mut Tried) {
        let note = |tried: &mut Tried, defect: bool, msg: String| {
            tried.defects += u64::from(defect);
            if tried.notes.len() < 8 {
                tried.notes.push(msg);
            }
        };
        let before = match wait_for(self.metrics, STAGE_LIMIT, QueueState::idle) {
            Ok(s) => s,
            Err(e) => return note(tried, true, format!("the model was not idle before: {e}")),
        };
        let stop = AtomicBool::new(false);
        let (outcome, holder_calls, others) = std::thread::scope(|s| {
            // Queued: two clients of our own keep the model held, one
            // running and one waiting, calling again as each answer comes,
            // until the victim is killed; the victim waits behind them
            // however long it takes to start and send (64 MiB over shm
            // takes longer than two runs).
            let mut holders = Vec::new();
            let mut outcome = Ok(String::new());
            if stage == Stage::Queued {
                for _ in 0..2 {
                    let (uri, stop) = (self.uri.as_str(), &stop);
                    holders.push(s.spawn(move || hold(uri, stop)));
                }
                let held = wait_for(self.metrics, STAGE_LIMIT, |q| {
                    q.running == 1 && q.waiting == 1
                });
                if let Err(e) = held {
                    outcome = Err(format!("the model was not held: {e}"));
                }
            }
            if outcome.is_ok() {
                outcome = self.aim(stage, before);
            }
            stop.store(true, Ordering::SeqCst);
            let mut calls = 0;
            let mut others = Vec::new();
            for h in holders {
                match h.join() {
                    Ok(Ok(n)) => calls += n,
                    Ok(Err(e)) => others.push(e),
                    Err(_) => others.push("a holder panicked".into()),
                }
            }
            (outcome, calls, others)
        });
        tried.count += 1;
        let after = wait_for(self.metrics, STAGE_LIMIT, QueueState::idle);
        match (&outcome, &after) {
            (Ok(seen), Ok(a)) => {
                let own_runs = a.runs.saturating_sub(before.runs + holder_calls);
                note(
                    tried,
                    false,
                    format!(
                        "{seen}; then idle again, the victim's request {}",
                        if own_runs == 0 {
                            "dropped unrun".to_string()
                        } else {
                            format!("run to its end ({own_runs} run), its answer discarded")
                        }
                    ),
                )
            }
            (Err(e), _) => note(tried, true, format!("stage not reached: {e}")),
            (Ok(_), Err(e)) => note(tried, true, format!("the model did not go idle: {e}")),
        }
        if !others.is_empty() {
            note(
                tried,
                true,
                format!(
                    "the clients ahead of the victim failed: {}",
                    others.join("; ")
                ),
            );
        }
    }

    /// Starts the victim, waits for `stage`, kills it; says what was seen.
    fn aim(&self, stage: Stage, before: QueueState) -> Result<String, String> {
        let mut stderr = tempfile::tempfile().map_err(|e| format!("victim stderr: {e}"))?;
        let mut child = self.spawn(&stderr)?;
        let r = self.aim_at(&mut child, stage, before);
        // SIGKILL (also when the stage was missed), and reap it.
        let _ = child.kill();
        let status = child.wait().map_err(|e| e.to_string())?;
        let r = r.map_err(|e| {
            // What the victim said, if it ended on its own.
            let mut said = String::new();
            use std::io::Seek;
            let _ = stderr.rewind();
            let _ = (&mut stderr).take(400).read_to_string(&mut said);
            let said = said.trim();
            if said.is_empty() {
                format!("{e}; the victim {status}, saying nothing")
            } else {
                format!("{e}; the victim {status}, saying: {said}")
            }
        })?;
        // A victim that ended on its own was not killed at any stage.
        use std::os::unix::process::ExitStatusExt;
        if status.signal() != Some(libc::SIGKILL) {
            return Err(format!("the victim ended before its kill ({status})"));
        }
        Ok(r)
    }

    fn aim_at(
        &self,
        child: &mut Child,
        stage: Stage,
        before: QueueState,
    ) -> Result<String, String> {
        let m = self.metrics;
        match stage {
            Stage::Queued => {
                let q = wait_for(m, STAGE_LIMIT, |q| q.running == 1 && q.waiting == 2)?;
                Ok(format!("killed while waiting its turn ({q})"))
            }
            Stage::Computing => {
                let q = wait_for(m, STAGE_LIMIT, |q| q.running == 1 && q.in_flight == 1)?;
                Ok(format!("killed while its run was in progress ({q})"))
            }
            Stage::Answered => {
                wait_for(m, STAGE_LIMIT, |q| q.running == 1 && q.in_flight == 1)?;
                // SAFETY: kill(2) on our own child's pid; no memory is involved.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, libc::SIGSTOP);
                }
                let done = wait_for(m, STAGE_LIMIT, |q| q.runs > before.runs)?;
                // Give the answer time to go out, as far as it can.
                std::thread::sleep(Duration::from_millis(100));
                let q = scrape(m, MODEL)?;
                Ok(if q.in_flight == 1 {
                    format!(
                        "stopped during its run, killed while the agent was still writing its \
                         answer (100 ms after the run: {q})"
                    )
                } else {
                    format!(
                        "stopped during its run, killed with its answer written and unread \
                         ({done}; 100 ms later {q})"
                    )
                })
            }
        }
    }
}
