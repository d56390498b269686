//! The `tenants` suite: does one tenant's flood leave another tenant's
//! latency alone? Issue 16's isolation target: *tenant A open loop at 2× the
//! model's capacity, tenant B at 10 %: B's p99 ≤ 1.5× its solo p99; A gets
//! `Overloaded` refusals, not B.*
//!
//! How it is measured ([`run`]):
//!
//! - Two `tensorwire serve` children serve one model whose compute
//!   dominates and is steady (MobileNetV2, a few ms a request), each
//!   listening on shm and unix (one transport per row): one with a tenants
//!   file written here ([`tenants_toml`]: tenant [`FLOOD`] with token
//!   `flood` and `max_queued`, tenant [`LIGHT`] with token `light`, both
//!   weight 1 and `queue_burst` [`QUEUE_BURST`]) and a metrics listener (per-tenant CPU, when the agent has
//!   it); one without a tenants file, its clients unauthenticated: the plain
//!   FIFO queue, the baseline that shows what the tenants buy.
//! - The capacity on each transport first: closed loop, 2 clients, on the
//!   plain agent (what the agent sustains with its model always busy).
//! - Then, per transport, each repeat running the three [`Scenario`]s in
//!   an order rotated every repeat (interleaved, so noise spreads over all):
//!   B alone at [`TenantsConfig::light_factor`] × capacity (`b-solo`), A at
//!   [`TenantsConfig::flood_factor`] × capacity with B beside it on the
//!   tenants agent (`a+b tenants`), and the same on the plain agent
//!   (`a+b fifo`). Both loads are open loop (Poisson,
//!   [`crate::load::Load::Open`]; latency from each request's *scheduled*
//!   time). A's load starts [`TenantsConfig::lead`] before B's and runs as
//!   long past its end, so B's whole window sees the flood; then it stops
//!   ([`crate::load::run_stopping`]): what it could not send by then (its
//!   connections all waiting) is counted as `unsent`, not caught up.
//! - A refused request (`Overloaded`, `TooManyInFlight`) returns at once
//!   and its worker takes the next due request: the schedule does not
//!   wait for it. Refusals are counted per tenant
//!   ([`crate::load::LoadResult::refused`]), apart from other errors.
//! - Around each measurement: the agent's CPU from `/proc`, this process's,
//!   the machine's noise, and each tenant's CPU from the agent's
//!   `tensorwire_tenant_cpu_seconds_total` (tenants agent; absent when the
//!   agent does not export it).
//!
//! Rows ([`TenantFigures`] flattened into [`Row`]): per transport, B solo,
//! A and B with tenants, A and B in FIFO; on B's rows beside a flood the
//! ratio of its p99 to its solo p99 ([`TenantFigures::b_p99_ratio`]).

use crate::caller::{BenchError, Caller, CallerFactory, StageSample};
use crate::console::Console;
use crate::hist::{LatencyHist, CDF_QUANTILES};
use crate::load::{self, Bounds, Load, LoadResult};
use crate::resources;
use crate::results::Row;
use crate::schedule::{self, Arrival};
use crate::stats::spread;
use crate::target::{BenchEnv, Net};
use crate::workload::Workload;
use classifier::agents::AgentProcess;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The suite's name in rows.
pub const SUITE: &str = "tenants";
/// Tenant A: the flood (its token is its name).
pub const FLOOD: &str = "flood";
/// Tenant B: the light tenant (its token is its name).
pub const LIGHT: &str = "light";
/// The model file (in `models/build`).
pub const MODEL_FILE: &str = "mobilenetv2.onnx";
/// The model's name on the agents.
pub const MODEL_NAME: &str = "mobilenetv2";
/// The target: B's p99 beside the flood at most this × its solo p99.
pub const TARGET_RATIO: f64 = 1.5;
/// Seed of B's schedule (the same in every scenario: B's requests are due
/// at the same offsets alone and beside the flood).
const LIGHT_SEED: u64 = crate::suite::SEED;
/// How long past its window the flood may still send requests that fell
/// behind.
const FLOOD_DRAIN: Duration = Duration::from_millis(100);
/// How long after a measurement the per-tenant CPU is read (see
/// [`TenantFigures::tenant_cpu_pct`]).
const TENANT_CPU_SETTLE: Duration = Duration::from_millis(300);
/// Seed of A's schedule.
const FLOOD_SEED: u64 = crate::suite::SEED ^ 0xa5a5;

/// One of the suite's measurements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// B alone, on the tenants agent.
    Solo,
    /// A's flood and B together, on the tenants agent.
    Tenants,
    /// A's flood and B together, on the agent without a tenants file.
    Fifo,
}

impl Scenario {
    /// Every scenario, in the first repeat's order.
    pub const ALL: [Scenario; 3] = [Scenario::Solo, Scenario::Tenants, Scenario::Fifo];

    /// Its name in rows: `b-solo`, `a+b tenants`, `a+b fifo`.
    pub const fn name(self) -> &'static str {
        match self {
            Scenario::Solo => "b-solo",
            Scenario::Tenants => "a+b tenants",
            Scenario::Fifo => "a+b fifo",
        }
    }

    /// Whether A floods the model meanwhile.
    pub const fn has_flood(self) -> bool {
        !matches!(self, Scenario::Solo)
    }

    /// Whether it runs on the agent with the tenants file (clients with
    /// tokens).
    pub const fn uses_tenants(self) -> bool {
        !matches!(self, Scenario::Fifo)
    }

    /// The scenarios of repeat `rep` on the `slot`-th transport: the
    /// order rotated by one each time.
    pub fn order(rep: usize, slot: usize) -> [Scenario; 3] {
        let mut o = Scenario::ALL;
        o.rotate_left((rep + slot) % Scenario::ALL.len());
        o
    }
}

/// The suite's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantsConfig {
    /// Transports, one row set each (shm and unix).
    pub transports: Vec<Net>,
    /// B's timed phase in each measurement.
    pub duration: Duration,
    /// Repeats of each scenario, interleaved.
    pub repeats: usize,
    /// A starts this long before B and stops this long after it.
    pub lead: Duration,
    /// The capacity measurement's length (closed loop, 2 clients).
    pub probe: Duration,
    /// A's offered load as a multiple of the capacity.
    pub flood_factor: f64,
    /// B's offered load as a multiple of the capacity.
    pub light_factor: f64,
    /// A's `max_queued` in the tenants file.
    pub max_queued: u32,
    /// A's connections (open-loop workers; at most this many of its
    /// requests in flight).
    pub flood_connections: usize,
    /// B's connections.
    pub light_connections: usize,
    /// Untimed calls per connection before each measurement.
    pub warmup: u64,
}

impl TenantsConfig {
    /// The suite's settings: `duration` per measurement (default 10 s, 3 s
    /// with `quick`), `repeats` interleaved repeats.
    pub fn new(
        quick: bool,
        duration: Option<Duration>,
        repeats: usize,
    ) -> Result<TenantsConfig, BenchError> {
        let duration = duration.unwrap_or(Duration::from_secs(if quick { 3 } else { 10 }));
        if duration.is_zero() || duration > Duration::from_secs(3600) {
            return Err(BenchError::new(
                "--duration must be more than 0 and at most 3600 seconds",
            ));
        }
        if repeats == 0 || repeats > 100 {
            return Err(BenchError::new("--repeats must be 1 to 100"));
        }
        Ok(TenantsConfig {
            transports: vec![Net::Shm, Net::Unix],
            duration,
            repeats,
            lead: (duration / 4).clamp(Duration::from_millis(300), Duration::from_secs(1)),
            probe: (duration / 2).clamp(Duration::from_millis(500), Duration::from_secs(3)),
            flood_factor: 2.0,
            light_factor: 0.1,
            max_queued: 8,
            flood_connections: 16,
            light_connections: 4,
            warmup: 2,
        })
    }
}

/// A tenants row's own figures (flattened into [`Row`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantFigures {
    /// `b-solo`, `a+b tenants` or `a+b fifo` ([`Scenario::name`]).
    pub scenario: String,
    /// [`FLOOD`] (A) or [`LIGHT`] (B).
    pub tenant: String,
    /// The offered load, requests per second (the schedule's rate).
    pub offered_rps: f64,
    /// Completed requests per second (median over repeats).
    pub completed_rps: f64,
    /// Smallest and largest per-repeat completed rate.
    pub completed_rps_spread: [f64; 2],
    /// Requests the agent refused at once (`Overloaded`,
    /// `TooManyInFlight`), summed over repeats; not in the row's `errors`.
    pub overloaded: u64,
    /// Smallest and largest per-repeat refusal count.
    pub overloaded_spread: [u64; 2],
    /// Scheduled requests never sent, summed over repeats: all the
    /// tenant's connections were waiting until the flood's window ended
    /// (A beside B only); not in the row's `errors`.
    pub unsent: u64,
    /// B beside the flood: its p99 over its solo p99 on the same transport
    /// (the two rows' medians over repeats); `None` on other rows.
    pub b_p99_ratio: Option<f64>,
    /// Smallest and largest of the per-repeat ratios (repeat i beside the
    /// flood over repeat i alone).
    pub b_p99_ratio_spread: Option<[f64; 2]>,
    /// The model's capacity on this transport (closed loop, 2 clients, on
    /// the plain agent), requests per second.
    pub capacity_rps: f64,
    /// A's `max_queued` on the agent of this row (`None`: no tenants file).
    pub max_queued: Option<u32>,
    /// The agent's CPU over the measurement, percent of one core (median
    /// over repeats).
    pub agent_cpu_pct: Option<f64>,
    /// This tenant's CPU in the agent over the measurement, percent of one
    /// core (the agent's `tensorwire_tenant_cpu_seconds_total`, read
    /// before and 300 ms after, since the agent charges a session's CPU
    /// when its turn ends; `None` without a tenants file or when the agent
    /// does not export it).
    pub tenant_cpu_pct: Option<f64>,
}

/// Both tenants' `queue_burst`: the light tenant's connections, so that
/// its Poisson bursts (all its connections busy at once) go at its fair
/// turn instead of being spaced out behind the flood's backlog; the same
/// for the flood, so the file favours neither.
pub const QUEUE_BURST: usize = 4;

/// The tenants file of the suite: [`FLOOD`] with `max_queued`, [`LIGHT`]
/// without quotas, tokens equal to their names, every model, weight 1.
pub fn tenants_toml(max_queued: u32) -> String {
    let hex = |token: &str| -> String {
        server::tenants::digest(token.as_bytes()).iter().fold(
            String::with_capacity(64),
            |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            },
        )
    };
    format!(
        "# Written by `tensorwire bench --suite tenants`.\n\
         [[tenant]]\n\
         name = \"{FLOOD}\"\n\
         tokens_sha256 = [\"{}\"]\n\
         models = [\"*\"]\n\
         max_queued = {max_queued}\n\
         weight = 1\n\
         queue_burst = {QUEUE_BURST}\n\n\
         [[tenant]]\n\
         name = \"{LIGHT}\"\n\
         tokens_sha256 = [\"{}\"]\n\
         models = [\"*\"]\n\
         weight = 1\n\
         queue_burst = {QUEUE_BURST}\n",
        hex(FLOOD),
        hex(LIGHT)
    )
}

/// One `tensorwire serve` child listening on shm and unix.
struct SuiteAgent {
    proc: AgentProcess,
    shm: String,
    unix: String,
    /// Its metrics listener (`http://127.0.0.1:PORT`), tenants agent only.
    metrics: Option<String>,
}

impl SuiteAgent {
    /// Starts one: with `tenants` (the file's text) and a metrics listener,
    /// or plain.
    fn start(
        label: &str,
        model: &Path,
        tenants: Option<&str>,
        env: &BenchEnv,
    ) -> Result<SuiteAgent, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix("tw-tenants-")
            .tempdir()
            .map_err(|e| BenchError::new(format!("temporary directory: {e}")))?;
        let unix = format!("unix://{}", dir.path().join("agent.sock").display());
        let shm = format!("shm://bench-tenants-{}-{}", std::process::id(), next_seq());
        let mut m = OsString::from(format!("{MODEL_NAME}="));
        m.push(model.as_os_str());
        let mut args: Vec<OsString> = vec![
            "serve".into(),
            "--listen".into(),
            shm.clone().into(),
            "--listen".into(),
            unix.clone().into(),
            "--intra-threads".into(),
            env.intra_threads.to_string().into(),
            "--model".into(),
            m,
        ];
        if let Some(spin) = env.spin {
            for flag in ["--socket-spin-us", "--shm-spin-us"] {
                args.push(flag.into());
                args.push(spin.as_micros().to_string().into());
            }
        }
        let mut metrics = None;
        if let Some(text) = tenants {
            let file = dir.path().join("tenants.toml");
            crate::results::write_file(&file, text.as_bytes())?;
            args.push("--tenants".into());
            args.push(file.into_os_string());
            // A free port, chosen here (the agent prints the native URIs
            // first; only the first line is read).
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| BenchError::new(format!("a free loopback port: {e}")))?
                .port();
            let uri = format!("http://127.0.0.1:{port}");
            args.push("--metrics-listen".into());
            args.push(uri.clone().into());
            metrics = Some(uri);
        }
        let proc = AgentProcess::spawn(
            label,
            &env.exe,
            &args,
            dir,
            classifier::agents::START_TIMEOUT,
        )
        .map_err(|e| BenchError::new(e.to_string()))?;
        Ok(SuiteAgent {
            proc,
            shm,
            unix,
            metrics,
        })
    }

    fn uri(&self, net: Net) -> Result<&str, BenchError> {
        match net {
            Net::Shm => Ok(&self.shm),
            Net::Unix => Ok(&self.unix),
            other => Err(BenchError::new(format!(
                "the tenants suite runs over shm and unix, not {}",
                other.name()
            ))),
        }
    }

    /// CPU seconds per tenant from the metrics listener; `None` when there
    /// is none or it has no tenant CPU family.
    fn tenant_cpu(&self) -> Option<HashMap<String, f64>> {
        let uri = self.metrics.as_deref()?;
        let body = crate::batching::http_get(uri, "/metrics").ok()?;
        let m = parse_tenant_cpu(&body);
        (!m.is_empty()).then_some(m)
    }

    fn stop(self) -> Result<(), BenchError> {
        self.proc
            .stop(classifier::agents::STOP_TIMEOUT)
            .map_err(|e| BenchError::new(e.to_string()))
    }
}

fn next_seq() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// `tensorwire_tenant_cpu_seconds_total{tenant="NAME"} X` lines of a
/// Prometheus text answer, by tenant.
pub fn parse_tenant_cpu(body: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("tensorwire_tenant_cpu_seconds_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let name = labels.split(',').find_map(|l| {
            l.trim()
                .strip_prefix("tenant=\"")
                .and_then(|v| v.strip_suffix('"'))
        });
        let value = value.split_whitespace().next().and_then(|v| v.parse().ok());
        if let (Some(n), Some(v)) = (name, value) {
            out.insert(n.to_string(), v);
        }
    }
    out
}

/// A tensorwire client of one tenant: refusals become
/// [`BenchError::refusal`]s.
struct TenantCaller {
    model: client::Model,
    bufs: Vec<client::TensorBuf>,
    _client: client::Client,
}

impl Caller for TenantCaller {
    /// Every request asks for its timeline (the stamps cost ~0.3 µs of a
    /// request of milliseconds), so each row splits its latency by stage.
    fn call(&mut self) -> Result<Option<StageSample>, BenchError> {
        let tensors: Vec<client::TensorRef<'_>> = self.bufs.iter().map(|t| t.as_ref()).collect();
        match self.model.infer_timed(&tensors) {
            Ok(r) => {
                let st = r.timeline.as_ref().and_then(|tl| {
                    crate::target::stage_sample(
                        r.client_start_ns,
                        r.client_sent_ns,
                        tl,
                        r.client_received_ns,
                        r.client_done_ns,
                    )
                });
                Ok(st)
            }
            Err(
                e @ (client::ClientError::Overloaded(_) | client::ClientError::TooManyInFlight(_)),
            ) => Err(BenchError::refusal(e)),
            Err(e) => Err(BenchError::new(e.to_string())),
        }
    }
}

/// Makes a [`TenantCaller`] per connection to `uri`, with `token` in its
/// Hello (`None`: unauthenticated).
fn factory(
    uri: &str,
    token: Option<&str>,
    workload: &Workload,
    env: &BenchEnv,
) -> Arc<CallerFactory> {
    let mut opts = client::ClientOptions {
        token: token.map(str::to_string),
        ..client::ClientOptions::default()
    };
    if let Some(spin) = env.spin {
        opts.spin = spin;
    }
    let uri = uri.to_string();
    let w = workload.clone();
    Arc::new(move || {
        let e = |x: client::ClientError| BenchError::new(format!("{uri}: {x}"));
        let c = client::Client::connect_with(&uri, opts.clone()).map_err(e)?;
        let model = c.model(w.model_name()).map_err(e)?;
        let inputs = w.inputs(model.signature())?;
        let mut bufs = Vec::with_capacity(inputs.len());
        for (dtype, shape, data) in &inputs {
            let mut t = c.alloc_tensor(*dtype, shape).map_err(e)?;
            t.as_mut_bytes().copy_from_slice(data);
            bufs.push(t);
        }
        Ok(Box::new(TenantCaller {
            model,
            bufs,
            _client: c,
        }) as Box<dyn Caller>)
    })
}

/// One measurement of one scenario on one transport.
struct Measured {
    light: LoadResult,
    flood: Option<LoadResult>,
    wall: Duration,
    /// This process's CPU (both load generators), ns.
    own_cpu_ns: u64,
    /// The agent's CPU, ns.
    agent_cpu_ns: Option<u64>,
    /// Calls made, warm-up included (the CPU per request's denominator).
    calls: u64,
    noise_pct: Option<f64>,
    /// CPU seconds per tenant in the agent over the measurement.
    tenant_cpu_s: Option<HashMap<String, f64>>,
}

/// The schedules of one transport.
struct Schedules {
    capacity: f64,
    light_rate: f64,
    flood_rate: f64,
    light: Vec<u64>,
    flood: Vec<u64>,
}

/// What every measurement needs.
struct Ctx<'a> {
    cfg: &'a TenantsConfig,
    env: &'a BenchEnv,
    workload: &'a Workload,
    tenants: &'a SuiteAgent,
    fifo: &'a SuiteAgent,
}

fn measure(
    ctx: &Ctx<'_>,
    scenario: Scenario,
    net: Net,
    sched: &Schedules,
) -> Result<Measured, BenchError> {
    let cfg = ctx.cfg;
    let agent = if scenario.uses_tenants() {
        ctx.tenants
    } else {
        ctx.fifo
    };
    let uri = agent.uri(net)?;
    let token = |t: &'static str| scenario.uses_tenants().then_some(t);
    let light_f = factory(uri, token(LIGHT), ctx.workload, ctx.env);
    let light_load = Load::Open {
        offsets: sched.light.clone(),
        connections: cfg.light_connections,
        label: Arrival::Poisson.name().to_string(),
        rate: Some(sched.light_rate),
    };
    let light_bounds = Bounds {
        warmup: cfg.warmup,
        duration: Some(cfg.duration),
        requests: None,
    };
    let pid = agent.proc.pid();
    let sys0 = resources::SystemCpu::snapshot()?;
    let own0 = resources::self_cpu_ns();
    let agent0 = resources::process_cpu_ns(pid).ok();
    let tenant0 = agent.tenant_cpu();
    let t0 = Instant::now();
    let (light, flood) = if scenario.has_flood() {
        let flood_f = factory(uri, token(FLOOD), ctx.workload, ctx.env);
        let flood_load = Load::Open {
            offsets: sched.flood.clone(),
            connections: cfg.flood_connections,
            label: Arrival::Poisson.name().to_string(),
            rate: Some(sched.flood_rate),
        };
        let flood_bounds = Bounds {
            warmup: 1,
            duration: Some(cfg.duration + 2 * cfg.lead),
            requests: None,
        };
        std::thread::scope(|s| -> Result<_, BenchError> {
            let h = std::thread::Builder::new()
                .name("bench-flood".into())
                .spawn_scoped(s, || {
                    load::run_stopping(
                        flood_f.as_ref(),
                        &flood_load,
                        &flood_bounds,
                        cfg.duration + 2 * cfg.lead + FLOOD_DRAIN,
                    )
                })
                .map_err(|e| BenchError::new(format!("cannot start the flood's thread: {e}")))?;
            std::thread::sleep(cfg.lead);
            let light = load::run(light_f.as_ref(), &light_load, &light_bounds);
            let flood = h
                .join()
                .map_err(|_| BenchError::new("the flood's load generator panicked"))?;
            let light = light.map_err(|e| BenchError::new(format!("tenant {LIGHT}: {e}")))?;
            let flood = flood.map_err(|e| BenchError::new(format!("tenant {FLOOD}: {e}")))?;
            Ok((light, Some(flood)))
        })?
    } else {
        let light = load::run(light_f.as_ref(), &light_load, &light_bounds)
            .map_err(|e| BenchError::new(format!("tenant {LIGHT}: {e}")))?;
        (light, None)
    };
    let wall = t0.elapsed();
    let own_cpu_ns = resources::self_cpu_ns().saturating_sub(own0);
    let agent_cpu_ns = agent0.and_then(|before| {
        resources::process_cpu_ns(pid)
            .ok()
            .map(|after| after.saturating_sub(before))
    });
    let sys1 = resources::SystemCpu::snapshot()?;
    // The agent charges a session's CPU to its tenant when the session's
    // turn ends (and every few hundred requests): give the sessions just
    // closed time to end theirs.
    if tenant0.is_some() {
        std::thread::sleep(TENANT_CPU_SETTLE);
    }
    let tenant_cpu_s = tenant0.zip(agent.tenant_cpu()).map(|(before, after)| {
        after
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    (v - before.get(k).copied().unwrap_or(0.0)).max(0.0),
                )
            })
            .collect()
    });
    let calls = light.completed
        + light.errors
        + cfg.warmup * cfg.light_connections as u64
        + flood
            .as_ref()
            .map_or(0, |f| f.completed + f.errors + cfg.flood_connections as u64);
    let noise_pct = (wall >= crate::measure::NOISE_MIN).then(|| {
        resources::noise_cpu_pct(&sys0, &sys1, own_cpu_ns + agent_cpu_ns.unwrap_or(0), wall)
    });
    Ok(Measured {
        light,
        flood,
        wall,
        own_cpu_ns,
        agent_cpu_ns,
        calls,
        noise_pct,
        tenant_cpu_s,
    })
}

/// The model's capacity over `uri`: closed loop, 2 clients, `probe` long.
fn capacity(
    uri: &str,
    workload: &Workload,
    env: &BenchEnv,
    probe: Duration,
) -> Result<f64, BenchError> {
    let f = factory(uri, None, workload, env);
    let r = load::run(
        f.as_ref(),
        &Load::Closed { clients: 2 },
        &Bounds {
            warmup: 3,
            duration: Some(probe),
            requests: None,
        },
    )?;
    if r.throughput_rps > 0.0 {
        Ok(r.throughput_rps)
    } else {
        Err(BenchError::new(format!("{uri}: no capacity measured")))
    }
}

/// Runs the suite: starts both agents, measures the capacity and the
/// scenarios on every transport, stops the agents, and returns the rows
/// (printed as they are made).
pub fn run(
    cfg: &TenantsConfig,
    root: &Path,
    env: &BenchEnv,
    console: &mut Console,
) -> Result<Vec<Row>, BenchError> {
    let model: PathBuf = crate::suite::built_model(root, MODEL_FILE)?;
    let workload = Workload::Model {
        name: MODEL_NAME.into(),
        path: model.clone(),
        dyn_dim: 1,
        files: Vec::new(),
    };
    console.start(cfg.transports.len() * 5);
    console.begin("starting the agents (tenants file, plain)");
    let text = tenants_toml(cfg.max_queued);
    let tenants = SuiteAgent::start("tensorwire tenants", &model, Some(&text), env)?;
    let fifo = match SuiteAgent::start("tensorwire fifo", &model, None, env) {
        Ok(a) => a,
        Err(e) => {
            let _ = tenants.stop();
            return Err(e);
        }
    };
    let ctx = Ctx {
        cfg,
        env,
        workload: &workload,
        tenants: &tenants,
        fifo: &fifo,
    };
    let result = run_with(&ctx, console);
    let stopped = [tenants.stop(), fifo.stop()];
    let rows = result?;
    for s in stopped {
        s?;
    }
    console.finish();
    Ok(rows)
}

fn run_with(ctx: &Ctx<'_>, console: &mut Console) -> Result<Vec<Row>, BenchError> {
    let cfg = ctx.cfg;
    let mut schedules = Vec::with_capacity(cfg.transports.len());
    for &net in &cfg.transports {
        console.begin(&format!("capacity of {MODEL_NAME} over {}", net.name()));
        let cap = capacity(ctx.fifo.uri(net)?, ctx.workload, ctx.env, cfg.probe)?;
        let light_rate = cap * cfg.light_factor;
        let flood_rate = cap * cfg.flood_factor;
        schedules.push(Schedules {
            capacity: cap,
            light_rate,
            flood_rate,
            light: schedule::arrivals(
                Arrival::Poisson,
                light_rate,
                cfg.duration,
                None,
                LIGHT_SEED,
            )?,
            flood: schedule::arrivals(
                Arrival::Poisson,
                flood_rate,
                cfg.duration + 2 * cfg.lead,
                None,
                FLOOD_SEED,
            )?,
        });
    }
    let mut measured: HashMap<(usize, Scenario), Vec<Measured>> = HashMap::new();
    for rep in 0..cfg.repeats {
        for (slot, &net) in cfg.transports.iter().enumerate() {
            for scenario in Scenario::order(rep, slot) {
                let s = &schedules[slot];
                console.begin(&format!(
                    "{} {} (A {:.0}/s, B {:.0}/s) repeat {}/{}",
                    net.name(),
                    scenario.name(),
                    if scenario.has_flood() {
                        s.flood_rate
                    } else {
                        0.0
                    },
                    s.light_rate,
                    rep + 1,
                    cfg.repeats
                ));
                let m = measure(ctx, scenario, net, s).map_err(|e| {
                    BenchError::new(format!("{} {}: {e}", net.name(), scenario.name()))
                })?;
                measured.entry((slot, scenario)).or_default().push(m);
            }
        }
    }
    let tensor_bytes = {
        let backend = ctx.workload.load_backend(1)?;
        crate::workload::tensor_bytes(&ctx.workload.inputs(backend.signature())?)
    };
    let mut rows = Vec::new();
    for (slot, &net) in cfg.transports.iter().enumerate() {
        let solo_p99: Vec<f64> = measured
            .get(&(slot, Scenario::Solo))
            .map(|v| {
                v.iter()
                    .map(|m| m.light.latency.percentile_us(0.99))
                    .collect()
            })
            .unwrap_or_default();
        for scenario in Scenario::ALL {
            let Some(ms) = measured.get(&(slot, scenario)) else {
                continue;
            };
            let agent = if scenario.uses_tenants() {
                ctx.tenants
            } else {
                ctx.fifo
            };
            let tenants: &[&str] = if scenario.has_flood() {
                &[FLOOD, LIGHT]
            } else {
                &[LIGHT]
            };
            for &tenant in tenants {
                let row = make_row(&RowInput {
                    cfg,
                    net,
                    scenario,
                    tenant,
                    sched: &schedules[slot],
                    measured: ms,
                    solo_p99: &solo_p99,
                    tensor_bytes,
                    agent_pid: agent.proc.pid(),
                });
                console.row(&row);
                rows.push(row);
                console.progress(rows.len());
            }
        }
    }
    Ok(rows)
}

/// What one row is made of.
struct RowInput<'a> {
    cfg: &'a TenantsConfig,
    net: Net,
    scenario: Scenario,
    tenant: &'static str,
    sched: &'a Schedules,
    measured: &'a [Measured],
    /// B's per-repeat solo p99 on this transport.
    solo_p99: &'a [f64],
    tensor_bytes: u64,
    agent_pid: u32,
}

fn make_row(x: &RowInput<'_>) -> Row {
    let is_flood = x.tenant == FLOOD;
    let reps: Vec<&LoadResult> = x
        .measured
        .iter()
        .filter_map(|m| {
            if is_flood {
                m.flood.as_ref()
            } else {
                Some(&m.light)
            }
        })
        .collect();
    let pick = |f: &dyn Fn(&LoadResult) -> f64| -> (f64, f64, f64) {
        let v: Vec<f64> = reps.iter().map(|r| f(r)).collect();
        spread(&v)
    };
    let (p50, p50_min, p50_max) = pick(&|r| r.latency.percentile_us(0.5));
    let (p90, _, _) = pick(&|r| r.latency.percentile_us(0.9));
    let (p99, p99_min, p99_max) = pick(&|r| r.latency.percentile_us(0.99));
    let (mean, _, _) = pick(&|r| r.latency.mean_us());
    let (rps, rps_min, rps_max) = pick(&|r| r.throughput_rps);
    let refused: Vec<u64> = reps.iter().map(|r| r.refused).collect();
    let unsent: u64 = reps.iter().map(|r| r.unsent).sum();
    let errors: u64 = reps
        .iter()
        .map(|r| r.errors.saturating_sub(r.refused + r.unsent))
        .sum();
    let opt_median = |f: &dyn Fn(&Measured) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = x.measured.iter().filter_map(f).collect();
        (v.len() == x.measured.len() && !v.is_empty()).then(|| spread(&v).0)
    };
    let per_call = |ns: u64, m: &Measured| (m.calls > 0).then(|| ns as f64 / 1e3 / m.calls as f64);
    let mut merged = LatencyHist::new();
    let mut stages = crate::hist::StageHists::new();
    for r in &reps {
        stages.merge(&r.stages);
    }
    for r in &reps {
        merged.merge(&r.latency);
    }
    let (ratio, ratio_spread) = if !is_flood
        && x.scenario.has_flood()
        && x.solo_p99.len() == reps.len()
        && !reps.is_empty()
    {
        let (solo, _, _) = spread(x.solo_p99);
        let per: Vec<f64> = reps
            .iter()
            .zip(x.solo_p99)
            .map(|(r, s)| r.latency.percentile_us(0.99) / s)
            .collect();
        let (_, lo, hi) = spread(&per);
        ((solo > 0.0).then(|| p99 / solo), Some([lo, hi]))
    } else {
        (None, None)
    };
    let noises: Vec<f64> = x.measured.iter().filter_map(|m| m.noise_pct).collect();
    let (noise, _, noise_max) = if noises.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        spread(&noises)
    };
    let mut notes: Vec<String> = Vec::new();
    if noise_max > crate::console::NOISE_FLAG_PCT {
        notes.push(format!(
            "noisy: other processes used up to {noise_max:.0}% of a core"
        ));
    }
    if errors > 0 {
        let first = reps
            .iter()
            .find_map(|r| {
                r.first_error
                    .as_deref()
                    .filter(|e| !e.starts_with("refused") && !e.contains("were not sent"))
            })
            .unwrap_or("");
        notes.push(format!("{errors} requests failed (not refusals): {first}"));
    }
    let total_refused: u64 = refused.iter().sum();
    if !is_flood && total_refused > 0 {
        notes.push(format!(
            "the light tenant was refused {total_refused} times"
        ));
    }
    let late: u64 = reps.iter().map(|r| r.late).sum();
    if late > 0 {
        notes.push(format!(
            "{late} requests sent over 1 ms after their time (every connection was waiting)"
        ));
    }
    let connections = if is_flood {
        x.cfg.flood_connections
    } else {
        x.cfg.light_connections
    };
    let offered = if is_flood {
        x.sched.flood_rate
    } else {
        x.sched.light_rate
    };
    let figures = TenantFigures {
        scenario: x.scenario.name().to_string(),
        tenant: x.tenant.to_string(),
        offered_rps: offered,
        completed_rps: rps,
        completed_rps_spread: [rps_min, rps_max],
        overloaded: total_refused,
        unsent,
        overloaded_spread: [
            refused.iter().copied().min().unwrap_or(0),
            refused.iter().copied().max().unwrap_or(0),
        ],
        b_p99_ratio: ratio,
        b_p99_ratio_spread: ratio_spread,
        capacity_rps: x.sched.capacity,
        max_queued: x.scenario.uses_tenants().then_some(x.cfg.max_queued),
        agent_cpu_pct: opt_median(&|m| {
            m.agent_cpu_ns
                .map(|ns| ns as f64 / 1e9 / m.wall.as_secs_f64() * 100.0)
        }),
        tenant_cpu_pct: opt_median(&|m| {
            m.tenant_cpu_s
                .as_ref()
                .and_then(|t| t.get(x.tenant))
                .map(|s| s / m.wall.as_secs_f64() * 100.0)
        }),
    };
    Row {
        suite: SUITE.into(),
        target: format!(
            "tensorwire {} {} {}",
            x.net.name(),
            x.scenario.name(),
            x.tenant
        ),
        framework: "tensorwire".into(),
        transport: x.net.name().into(),
        peer: false,
        model: MODEL_NAME.into(),
        tensor_bytes: x.tensor_bytes,
        clients: connections,
        load: Arrival::Poisson.name().into(),
        rate: Some(offered),
        requests: reps.iter().map(|r| r.completed).sum(),
        errors,
        warmup: if is_flood { 1 } else { x.cfg.warmup },
        repeats: reps.len(),
        p50_us: p50,
        p50_spread_us: [p50_min, p50_max],
        p90_us: p90,
        p99_us: p99,
        p99_spread_us: [p99_min, p99_max],
        mean_us: mean,
        throughput_rps: rps,
        cpu_us_per_req: opt_median(&|m| per_call(m.own_cpu_ns + m.agent_cpu_ns?, m)),
        agent_cpu_us_per_req: opt_median(&|m| per_call(m.agent_cpu_ns?, m)),
        agent_rss_kib: resources::rss_kib(x.agent_pid).ok(),
        stages: stages.stats(),
        cdf: merged.cdf(CDF_QUANTILES),
        noise_cpu_pct: noise,
        note: notes.join("; "),
        batching: None,
        tenants: Some(figures),
    }
}

fn us(v: f64) -> String {
    crate::console::format_us(v)
}

/// The report's tables of the tenants rows in `rows`: one per transport,
/// a line per (scenario, tenant), then whether the target was met. Empty
/// when no row has tenant figures.
pub fn tables(rows: &[Row]) -> String {
    let of: Vec<(&Row, &TenantFigures)> = rows
        .iter()
        .filter_map(|r| r.tenants.as_ref().map(|f| (r, f)))
        .collect();
    let mut nets: Vec<&str> = Vec::new();
    for (r, _) in &of {
        if !nets.contains(&r.transport.as_str()) {
            nets.push(&r.transport);
        }
    }
    let mut out = String::new();
    for net in nets {
        let lines: Vec<&(&Row, &TenantFigures)> =
            of.iter().filter(|(r, _)| r.transport == net).collect();
        let Some((first, f0)) = lines.first() else {
            continue;
        };
        let mq = lines
            .iter()
            .find_map(|(_, f)| f.max_queued)
            .map_or(String::new(), |m| format!(", A's max_queued {m}"));
        let _ = writeln!(
            out,
            "### {} over {net}: tenant isolation (capacity {:.0} rps{mq})\n",
            first.model, f0.capacity_rps
        );
        let _ = writeln!(
            out,
            "| scenario | tenant | conns | offered rps | completed rps | p50 µs | p99 µs (min–max) | \
             overloaded | unsent | errors | B p99 / solo (min–max) | agent CPU % | tenant CPU % |"
        );
        let _ = writeln!(
            out,
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for (r, f) in &lines {
            let ratio = match (f.b_p99_ratio, f.b_p99_ratio_spread) {
                (Some(v), Some([lo, hi])) => format!(
                    "{} ({}–{})",
                    crate::report::format_ratio(v),
                    crate::report::format_ratio(lo),
                    crate::report::format_ratio(hi)
                ),
                (Some(v), None) => crate::report::format_ratio(v),
                _ => "–".to_string(),
            };
            let pct = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.0}"));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.1} | {:.1} | {} | {} ({}–{}) | {} | {} | {} | {} | {} | {} |",
                f.scenario,
                f.tenant,
                r.clients,
                f.offered_rps,
                f.completed_rps,
                us(r.p50_us),
                us(r.p99_us),
                us(r.p99_spread_us[0]),
                us(r.p99_spread_us[1]),
                f.overloaded,
                f.unsent,
                r.errors,
                ratio,
                pct(f.agent_cpu_pct),
                pct(f.tenant_cpu_pct),
            );
        }
        out.push('\n');
        out.push_str(&verdict(&lines));
        out.push('\n');
    }
    out
}

/// Whether the target held on one transport's rows: B's p99 beside the
/// flood (tenants agent) over its solo p99, and whose requests were
/// refused; the FIFO baseline's ratio beside it.
fn verdict(lines: &[&(&Row, &TenantFigures)]) -> String {
    let find = |scenario: &str, tenant: &str| {
        lines
            .iter()
            .find(|(_, f)| f.scenario == scenario && f.tenant == tenant)
            .map(|(_, f)| *f)
    };
    let mut out = String::new();
    let tenants_b = find(Scenario::Tenants.name(), LIGHT);
    let tenants_a = find(Scenario::Tenants.name(), FLOOD);
    let fifo_b = find(Scenario::Fifo.name(), LIGHT);
    if let Some(b) = tenants_b {
        if let Some(r) = b.b_p99_ratio {
            let _ = write!(
                out,
                "- Target *B's p99 ≤ {TARGET_RATIO}× its solo p99* with tenants: {} ({}).",
                crate::report::format_ratio(r),
                if r <= TARGET_RATIO {
                    "met"
                } else {
                    "**not met**"
                }
            );
            if let Some(fr) = fifo_b.and_then(|f| f.b_p99_ratio) {
                let _ = write!(
                    out,
                    " Without tenants (FIFO): {}.",
                    crate::report::format_ratio(fr)
                );
            }
            out.push('\n');
        }
        let a_refused = tenants_a.map_or(0, |a| a.overloaded);
        let _ = writeln!(
            out,
            "- Target *A gets the refusals, not B*: A refused {a_refused}, B refused {} ({}).",
            b.overloaded,
            if b.overloaded == 0 && a_refused > 0 {
                "met"
            } else {
                "**not met**"
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::{sample_results, sample_row};

    #[test]
    fn the_tenants_file_parses_and_names_both_tenants() {
        let text = tenants_toml(8);
        let specs = server::tenants::file::parse(&text, "tenants.toml").expect("parses");
        assert_eq!(specs.len(), 2);
        let flood = specs.iter().find(|s| s.name == FLOOD).expect("flood");
        assert_eq!(flood.quotas.max_queued, Some(8));
        assert_eq!(
            flood.tokens_sha256,
            vec![server::tenants::digest(FLOOD.as_bytes())]
        );
        let light = specs.iter().find(|s| s.name == LIGHT).expect("light");
        assert_eq!(light.quotas.max_queued, None);
        assert!(light.models.contains(MODEL_NAME));
    }

    #[test]
    fn scenarios_rotate_every_repeat() {
        assert_eq!(Scenario::order(0, 0), Scenario::ALL);
        assert_eq!(
            Scenario::order(1, 0),
            [Scenario::Tenants, Scenario::Fifo, Scenario::Solo]
        );
        assert_eq!(Scenario::order(0, 1), Scenario::order(1, 0));
        assert_eq!(Scenario::order(3, 0), Scenario::ALL);
        let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["b-solo", "a+b tenants", "a+b fifo"]);
    }

    #[test]
    fn settings_are_checked() {
        let c = TenantsConfig::new(true, None, 3).expect("quick");
        assert_eq!(c.duration, Duration::from_secs(3));
        assert_eq!(c.transports, [Net::Shm, Net::Unix]);
        let full = TenantsConfig::new(false, None, 3).expect("full");
        assert_eq!(full.duration, Duration::from_secs(10));
        assert_eq!(full.lead, Duration::from_secs(1));
        let short = TenantsConfig::new(true, Some(Duration::from_millis(200)), 1).expect("short");
        assert_eq!(short.lead, Duration::from_millis(300));
        assert!(TenantsConfig::new(true, Some(Duration::ZERO), 3).is_err());
        assert!(TenantsConfig::new(true, None, 0).is_err());
    }

    #[test]
    fn tenant_cpu_is_read_from_prometheus_text() {
        let body = "# HELP tensorwire_tenant_cpu_seconds_total Agent CPU\n\
                    # TYPE tensorwire_tenant_cpu_seconds_total counter\n\
                    tensorwire_tenant_cpu_seconds_total{tenant=\"flood\"} 1.5\n\
                    tensorwire_tenant_cpu_seconds_total{tenant=\"light\"} 0.25\n\
                    tensorwire_tenant_requests_total{tenant=\"flood\"} 100\n";
        let m = parse_tenant_cpu(body);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get("flood"), Some(&1.5));
        assert_eq!(m.get("light"), Some(&0.25));
        assert!(parse_tenant_cpu("nothing here").is_empty());
    }

    fn tenant_row(scenario: Scenario, tenant: &str, p99: f64, refused: u64) -> Row {
        let mut r = sample_row(&format!("tensorwire shm {} {tenant}", scenario.name()), 4);
        r.suite = SUITE.into();
        r.transport = "shm".into();
        r.model = MODEL_NAME.into();
        r.load = "poisson".into();
        r.p99_us = p99;
        r.p99_spread_us = [p99 * 0.9, p99 * 1.1];
        let light_beside = tenant == LIGHT && scenario.has_flood();
        r.tenants = Some(TenantFigures {
            scenario: scenario.name().into(),
            tenant: tenant.into(),
            offered_rps: if tenant == FLOOD { 400.0 } else { 20.0 },
            completed_rps: 19.5,
            completed_rps_spread: [19.0, 20.0],
            overloaded: refused,
            unsent: 0,
            overloaded_spread: [refused / 3, refused / 2],
            b_p99_ratio: light_beside.then_some(p99 / 7000.0),
            b_p99_ratio_spread: light_beside.then_some([1.0, 2.0]),
            capacity_rps: 200.0,
            max_queued: scenario.uses_tenants().then_some(8),
            agent_cpu_pct: Some(180.0),
            tenant_cpu_pct: None,
        });
        r
    }

    #[test]
    fn the_table_says_whether_the_target_held() {
        let rows = vec![
            tenant_row(Scenario::Solo, LIGHT, 7000.0, 0),
            tenant_row(Scenario::Tenants, FLOOD, 40_000.0, 1200),
            tenant_row(Scenario::Tenants, LIGHT, 9800.0, 0),
            tenant_row(Scenario::Fifo, FLOOD, 90_000.0, 0),
            tenant_row(Scenario::Fifo, LIGHT, 84_000.0, 0),
            sample_row("other", 1),
        ];
        let t = tables(&rows);
        assert!(
            t.contains(
                "### mobilenetv2 over shm: tenant isolation (capacity 200 rps, A's max_queued 8)"
            ),
            "{t}"
        );
        assert_eq!(
            t.lines().filter(|l| l.starts_with("| a+b")).count(),
            4,
            "{t}"
        );
        assert!(
            t.contains("with tenants: 1.4× (met). Without tenants (FIFO): 12.0×."),
            "{t}"
        );
        assert!(t.contains("A refused 1200, B refused 0 (met)"), "{t}");
        assert_eq!(tables(&[sample_row("x", 1)]), "");
    }

    #[test]
    fn figures_round_trip_in_results_json() {
        let rows = vec![
            tenant_row(Scenario::Tenants, LIGHT, 9800.0, 0),
            sample_row("plain", 1),
        ];
        let r = sample_results(rows);
        let dir = tempfile::tempdir().expect("tempdir");
        r.write_json(dir.path()).expect("write");
        let text = std::fs::read_to_string(dir.path().join("results.json")).expect("read");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["rows"][0]["scenario"], "a+b tenants");
        assert_eq!(v["rows"][0]["tenant"], LIGHT);
        assert_eq!(v["rows"][0]["overloaded"], 0);
        assert!(v["rows"][1].get("scenario").is_none());
        let back = crate::results::Results::read_json(&dir.path().join("results.json"))
            .expect("read back");
        assert_eq!(back, r);
    }
}
