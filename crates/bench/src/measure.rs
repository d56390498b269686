//! Measuring one started target under one load: each repeat runs the load
//! generator (or the raw floor's own loop), reads CPU time from `/proc`
//! around it, and the repeats are folded into one [`Row`]: the median of the
//! per-repeat figures, with their minimum and maximum as the spread.

use crate::caller::BenchError;
use crate::hist::{LatencyHist, StageHists, CDF_QUANTILES};
use crate::load::{self, Bounds, Load};
use crate::results::Row;
use crate::stats::spread;
use crate::target::{BenchEnv, Framework, Net, RunningTarget};
use crate::{raw, raw_shm, resources};
use std::process::Command;
use std::time::{Duration, Instant};

/// One repeat's figures.
#[derive(Debug)]
pub struct Repeat {
    /// Latencies of the timed requests.
    pub latency: LatencyHist,
    /// Stage splits (tensorwire only).
    pub stages: StageHists,
    /// Timed requests completed.
    pub completed: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Completed requests per second in the timed phase.
    pub throughput_rps: f64,
    /// CPU µs per call (client and server processes, warm-up included in
    /// both the time and the count).
    pub cpu_us_per_req: Option<f64>,
    /// The server process's share.
    pub agent_cpu_us_per_req: Option<f64>,
    /// Other processes' CPU while it ran, % of one core; `None` for a
    /// repeat shorter than [`NOISE_MIN`] (`/proc/stat` counts 10 ms ticks).
    pub noise_cpu_pct: Option<f64>,
}

/// The shortest repeat whose machine noise is worth reporting: `/proc/stat`
/// counts 10 ms ticks, so a 5 ms repeat could read 200 % from one tick.
pub const NOISE_MIN: std::time::Duration = std::time::Duration::from_millis(250);

/// How the load is described in a row: `closed`, `poisson`, ...
pub fn load_label(load: &Load) -> (String, usize, Option<f64>) {
    match load {
        Load::Closed { clients } => ("closed".to_string(), *clients, None),
        Load::Open {
            connections,
            label,
            rate,
            ..
        } => (label.clone(), *connections, *rate),
    }
}

/// Bytes of a tensorwire request carrying one tensor of `size` bytes (or
/// none for 0): the raw socket floor sends exactly as many each way.
pub fn request_bytes(size: u64) -> u64 {
    let desc = if size == 0 {
        0
    } else {
        wire::DESC_FIXED_LEN as u64 + 8
    };
    wire::HEADER_LEN as u64 + desc + size
}

/// Runs one repeat of `load` against `target`.
pub fn measure_once(
    target: &RunningTarget,
    load: &Load,
    bounds: &Bounds,
    env: &BenchEnv,
) -> Result<Repeat, BenchError> {
    let sys0 = resources::SystemCpu::snapshot()?;
    let own0 = resources::self_cpu_ns();
    let reaped0 = resources::reaped_children_cpu_ns()?;
    let pids = target.server_pids();
    let server_cpu = || -> Option<u64> {
        if pids.is_empty() {
            return None;
        }
        pids.iter()
            .map(|&p| resources::process_cpu_ns(p).ok())
            .sum::<Option<u64>>()
    };
    let srv0 = server_cpu();
    let t0 = Instant::now();
    let (r, calls) = match &target.factory {
        Some(f) => {
            let r = load::run(f.as_ref(), load, bounds)?;
            let (_, clients, _) = load_label(load);
            let calls = r.completed + r.errors + bounds.warmup * clients as u64;
            (r, calls)
        }
        None => raw_floor(target, bounds, env)?,
    };
    let elapsed = t0.elapsed();
    // This process, plus any child reaped meanwhile (the raw floor's echo).
    let own = resources::self_cpu_ns().saturating_sub(own0)
        + resources::reaped_children_cpu_ns()?.saturating_sub(reaped0);
    let srv = match srv0 {
        Some(before) => server_cpu().map(|after| after.saturating_sub(before)),
        None => None,
    };
    let sys1 = resources::SystemCpu::snapshot()?;
    let ours = own + srv.unwrap_or(0);
    let per = |ns: u64| (calls > 0).then(|| ns as f64 / 1e3 / calls as f64);
    let cpu_known = pids.is_empty() || srv.is_some();
    Ok(Repeat {
        throughput_rps: r.throughput_rps,
        completed: r.completed,
        errors: r.errors,
        cpu_us_per_req: if cpu_known { per(ours) } else { None },
        agent_cpu_us_per_req: srv.and_then(per),
        noise_cpu_pct: (elapsed >= NOISE_MIN)
            .then(|| resources::noise_cpu_pct(&sys0, &sys1, ours, elapsed)),
        latency: r.latency,
        stages: r.stages,
    })
}

/// The raw floor: its own one-client loop ([`raw::run_raw_ping`] or
/// [`raw_shm::run_shm_ping`]) with the same request size, in a child echo
/// process started from `env.exe raw-echo`.
fn raw_floor(
    target: &RunningTarget,
    bounds: &Bounds,
    env: &BenchEnv,
) -> Result<(load::LoadResult, u64), BenchError> {
    let mut cmd = Command::new(&env.exe);
    cmd.arg("raw-echo");
    if let Some(p) = env.placement {
        cmd.args(["--cpu", &p.server_cpu.to_string()]);
    }
    let run = |iterations: usize, warmup: usize| -> Result<Vec<u64>, BenchError> {
        Ok(match target.spec.net {
            Net::Shm => {
                raw_shm::run_shm_ping(&raw_shm::ShmOptions { iterations, warmup }, Some(&cmd))?
            }
            Net::Unix | Net::Tcp { .. } => {
                let kind = if target.spec.net == Net::Unix {
                    raw::RawKind::Unix
                } else {
                    raw::RawKind::Tcp
                };
                let msg_len = usize::try_from(request_bytes(target.tensor_bytes))
                    .map_err(|_| BenchError::new("message too large"))?;
                raw::run_raw_ping(
                    &raw::RawOptions {
                        kind,
                        iterations,
                        warmup,
                        msg_len,
                        nodelay: target.spec.net != (Net::Tcp { nodelay: false }),
                        split_writes: false,
                        spin: if target.spec.framework == Framework::RawSpin {
                            crate::target::RAW_SPIN
                        } else {
                            Duration::ZERO
                        },
                    },
                    Some(&cmd),
                )?
            }
            other => {
                return Err(BenchError::new(format!(
                    "no raw floor for {}",
                    other.name()
                )))
            }
        })
    };
    let mut iterations = usize::try_from(bounds.requests.unwrap_or(10_000))
        .map_err(|_| BenchError::new("too many requests"))?;
    let mut warmup = usize::try_from(bounds.warmup).unwrap_or(usize::MAX);
    // The floors' loops count round trips, not time: a short probe says how
    // many fit the duration (spinning on one shared core costs two 4 ms
    // scheduler ticks a round trip, 20 000 of them would take minutes).
    if let Some(d) = bounds.duration {
        let probe = run(PROBE, 0)?;
        let mean_ns = probe.iter().sum::<u64>() / probe.len().max(1) as u64;
        let fit = usize::try_from(d.as_nanos() / u128::from(mean_ns.max(1))).unwrap_or(usize::MAX);
        iterations = iterations.min(fit.max(PROBE));
        warmup = warmup.min(iterations / 10);
    }
    let t0 = Instant::now();
    let samples = run(iterations, warmup)?;
    let elapsed = t0.elapsed();
    let mut latency = LatencyHist::new();
    let mut busy_ns: u64 = 0;
    for &s in &samples {
        latency.record(s);
        busy_ns = busy_ns.saturating_add(s);
    }
    let n = samples.len() as u64;
    let r = load::LoadResult {
        latency,
        stages: StageHists::new(),
        completed: n,
        errors: 0,
        refused: 0,
        unsent: 0,
        first_error: None,
        elapsed,
        throughput_rps: if busy_ns > 0 {
            n as f64 / (busy_ns as f64 / 1e9)
        } else {
            0.0
        },
        late: 0,
    };
    Ok((r, n + warmup as u64))
}

/// Round trips of the raw floor's probe for its speed.
const PROBE: usize = 20;

/// What a row is about, besides its figures.
#[derive(Clone, Debug)]
pub struct RowKey {
    /// The suite.
    pub suite: String,
    /// The model's label.
    pub model: String,
    /// Tensor bytes per request.
    pub tensor_bytes: u64,
    /// Warm-up calls per client.
    pub warmup: u64,
}

/// Folds `repeats` of one target under one load into a row.
pub fn aggregate(key: &RowKey, target: &RunningTarget, load: &Load, repeats: &[Repeat]) -> Row {
    let (label, clients, rate) = load_label(load);
    let pick = |f: &dyn Fn(&Repeat) -> f64| -> (f64, f64, f64) {
        let v: Vec<f64> = repeats.iter().map(f).collect();
        spread(&v)
    };
    let (p50, p50_min, p50_max) = pick(&|r| r.latency.percentile_us(0.5));
    let (p90, _, _) = pick(&|r| r.latency.percentile_us(0.9));
    let (p99, p99_min, p99_max) = pick(&|r| r.latency.percentile_us(0.99));
    let (mean, _, _) = pick(&|r| r.latency.mean_us());
    let (rps, _, _) = pick(&|r| r.throughput_rps);
    let noises: Vec<f64> = repeats.iter().filter_map(|r| r.noise_cpu_pct).collect();
    let (noise, _, noise_max) = if noises.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        spread(&noises)
    };
    let opt_median = |f: &dyn Fn(&Repeat) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = repeats.iter().filter_map(f).collect();
        (v.len() == repeats.len() && !v.is_empty()).then(|| spread(&v).0)
    };
    let mut merged = LatencyHist::new();
    let mut stages = StageHists::new();
    for r in repeats {
        merged.merge(&r.latency);
        stages.merge(&r.stages);
    }
    // (Repeats shorter than NOISE_MIN have no noise figure; the report
    // says so once rather than on every row.)
    let mut note = String::new();
    if noise_max > 25.0 {
        if !note.is_empty() {
            note.push_str("; ");
        }
        note.push_str(&format!(
            "noisy: other processes used up to {noise_max:.0}% of a core"
        ));
    }
    let errors: u64 = repeats.iter().map(|r| r.errors).sum();
    if errors > 0 {
        if !note.is_empty() {
            note.push_str("; ");
        }
        note.push_str(&format!("{errors} requests failed"));
    }
    let spec = &target.spec;
    Row {
        suite: key.suite.clone(),
        target: spec.label(),
        framework: spec.framework.name().to_string(),
        transport: spec.net.name().to_string(),
        peer: spec.is_peer(),
        model: key.model.clone(),
        tensor_bytes: key.tensor_bytes,
        clients,
        load: label,
        rate,
        requests: repeats.iter().map(|r| r.completed).sum(),
        errors,
        warmup: key.warmup,
        repeats: repeats.len(),
        p50_us: p50,
        p50_spread_us: [p50_min, p50_max],
        p90_us: p90,
        p99_us: p99,
        p99_spread_us: [p99_min, p99_max],
        mean_us: mean,
        throughput_rps: rps,
        cpu_us_per_req: opt_median(&|r| r.cpu_us_per_req),
        agent_cpu_us_per_req: opt_median(&|r| r.agent_cpu_us_per_req),
        agent_rss_kib: target.server_pid().and_then(|p| resources::rss_kib(p).ok()),
        stages: stages.stats(),
        cdf: merged.cdf(CDF_QUANTILES),
        noise_cpu_pct: noise,
        note,
        batching: None,
        tenants: None,
    }
}

/// Whether `framework` can run `load` (the raw floor has one client and
/// no schedule).
pub fn supports(framework: Framework, load: &Load) -> bool {
    !framework.is_floor() || matches!(load, Load::Closed { clients: 1 })
}
