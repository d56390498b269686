//! `tensorwire bench`: measure tensorwire over each transport, and its peers
//! in the same run, under closed-loop, open-loop or trace-replay load; print
//! a table and write results, a report and plots (`--out DIR`).
//!
//! This module only turns arguments into a [`bench::suite::Plan`]; the
//! harness is the `tensorwire-bench` crate.

use super::CmdError;
use bench::load::{Bounds, Load};
use bench::suite::{self, LoadSpec, Part, Plan};
use bench::target::{self, BenchEnv, Framework, TargetSpec};
use bench::workload::{parse_size, Workload};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Arguments of `bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Run a named suite (vaccel, breakdown, load, batching, tenants,
    /// client-modes)
    /// instead of the options below; each regenerates one published
    /// experiment (batching: dynamic batching off against on; tenants: one
    /// tenant's flood beside another's light load, with and without a
    /// tenants file; it takes --duration, --repeats, --intra-threads and
    /// --spin-us).
    #[arg(long)]
    suite: Option<String>,
    /// The ≤ 1 minute version of a suite (fewer models, shorter rows).
    #[arg(long)]
    quick: bool,
    /// The model: `identity` (sized by --size), or NAME=PATH.onnx / PATH.onnx.
    #[arg(long, default_value = "identity")]
    model: String,
    /// Tensor bytes per identity request, comma-separated (0 = empty RPC;
    /// K/M suffixes).
    #[arg(long, default_value = "0")]
    size: String,
    /// The value of dynamic dimensions other than the batch (e.g. sequence
    /// length) for ONNX models' generated inputs. Unused with --input: the
    /// files decide the shapes.
    #[arg(long, default_value_t = 1)]
    dyn_dim: u64,
    /// Send an input read from a .npy file instead of generated ones,
    /// NAME=FILE.npy (repeatable; the same syntax as `tensorwire infer
    /// --input`, names as the model declares them). Only with --model
    /// PATH.onnx. Once one is given every input of the model needs one; the
    /// files decide the shapes (so --dyn-dim does not apply): dtype and
    /// number of dimensions must match the model, fixed dimensions too,
    /// dynamic ones take any size. Checked before anything is measured.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Transports to start an agent on: local (engine called directly, no
    /// transport), inproc, shm, unix, tcp, tcp?nodelay=0, and the agent's
    /// KServe v2 front doors grpc and http (on TCP loopback; called by a
    /// tonic and a hyper client, binary tensors), and gateway (the client
    /// over tcp to a `tensorwire gateway` relaying to an agent on shm).
    #[arg(long, default_value = "local,inproc,shm,unix,tcp")]
    transports: String,
    /// Baselines measured in the same run: raw (bare socket / shared-page
    /// floor), raw-spin (the socket floor with both ends polling before
    /// they block, as tensorwire's do), grpc (tonic, KServe v2), ttrpc.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Measure an agent that is already running instead (no agent started;
    /// --transports and --peers are ignored). grpc://HOST:PORT and
    /// http://HOST:PORT call its KServe front doors.
    #[arg(long, value_name = "URI")]
    connect: Option<String>,
    /// Closed loop: concurrent clients, comma-separated (each its own
    /// connection and thread).
    #[arg(long, default_value = "1", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Open loop: offered loads in requests/s, comma-separated. Latency is
    /// measured from each request's scheduled time.
    #[arg(long, value_delimiter = ',')]
    rate: Vec<f64>,
    /// Open loop: arrival process, poisson or constant.
    #[arg(long, default_value = "poisson")]
    arrival: String,
    /// Open loop and trace: connections issuing the schedule.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Replay a trace: one timestamp (seconds) per line.
    #[arg(long, value_name = "FILE", conflicts_with = "rate")]
    trace: Option<PathBuf>,
    /// Seconds each measurement runs (at most). Default 2; the tenants
    /// suite: 10, or 3 with --quick.
    #[arg(long)]
    duration: Option<f64>,
    /// Timed requests per measurement (at most).
    #[arg(long)]
    requests: Option<u64>,
    /// Untimed requests per client before each measurement.
    #[arg(long, default_value_t = 100)]
    warmup: u64,
    /// Repeats of each measurement (the spread is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// ONNX Runtime intra-op threads of every engine in the run (but the
    /// batching suite's LeNet, which runs on one).
    #[arg(long, default_value_t = 2)]
    intra_threads: usize,
    /// Do not ask agents for timelines (no stage breakdown). By default
    /// each connection times a sample of its requests, so that the clock
    /// reads add at most 1 % to the mean round trip.
    #[arg(long)]
    no_stages: bool,
    /// Microseconds tensorwire's clients, and the agents the bench starts,
    /// poll before they block (0 = block at once, as the peers do).
    /// Default: tensorwire's (client 200, agent 50).
    #[arg(long, value_name = "US")]
    spin_us: Option<u64>,
    /// Placement: `cross` pins client threads to one CPU and every server
    /// process (agent, peer, raw echo) to another; `same` puts them all on
    /// one CPU; `none` leaves it to the scheduler. Default: cross for the
    /// vaccel suite, none otherwise.
    #[arg(long, value_name = "cross|same|none")]
    pin: Option<String>,
    /// Write results.json, results.csv, report.md and plots here.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// `--mover M`: shm clients send inputs from the heap, moved into the
    /// arena with M (default: inputs allocated in the arena, zero copy).
    #[command(flatten)]
    mover: super::MoverArg,
}

/// Runs `bench`.
pub fn run(a: Args) -> Result<(), CmdError> {
    let started = std::time::SystemTime::now();
    let t0 = Instant::now();
    let root = classifier::paths::repo_root();
    if a.suite.is_some() && !a.inputs.is_empty() {
        return Err("--input applies to a run of one --model PATH.onnx, not to a --suite".into());
    }
    // The tenants suite runs two loads at once: its own runner, no plan.
    let tenants = match a.suite.as_deref() {
        Some(bench::tenants::SUITE) => Some(bench::tenants::TenantsConfig::new(
            a.quick,
            a.duration.map(duration_arg).transpose()?,
            a.repeats,
        )?),
        _ => None,
    };
    let modes = a.suite.as_deref() == Some(bench::client_modes::SUITE);
    let plan = match &a.suite {
        _ if tenants.is_some() || modes => None,
        Some(name) => Some(suite::suite(name, &root, a.quick)?),
        None => Some(custom_plan(&a)?),
    };
    let pin_by_default = plan.as_ref().is_some_and(|p| p.pin_by_default);
    let pin = a
        .pin
        .clone()
        .unwrap_or_else(|| if pin_by_default { "cross" } else { "none" }.to_string());
    let placement = bench::placement::Placement::parse(&pin)?;
    let env = BenchEnv {
        exe: std::env::current_exe()?,
        intra_threads: a.intra_threads,
        stages: !a.no_stages,
        placement,
        spin: match a.spin_us {
            Some(us) if us > server::config::MAX_SPIN_US => {
                return Err(format!(
                    "--spin-us must be 0..={}, not {us}",
                    server::config::MAX_SPIN_US
                )
                .into())
            }
            Some(us) => Some(std::time::Duration::from_micros(us)),
            None => None,
        },
        mover: a.mover.mover,
    };
    if let Some(p) = &a.mover.mover_policy {
        transport::mover::set_policy_file(p);
    }
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut console = bench::console::Console::new(a.quiet);
    let rows = match (&plan, &tenants) {
        (Some(plan), _) => suite::run_plan(plan, &env, &mut console)?,
        (None, Some(cfg)) => bench::tenants::run(cfg, &root, &env, &mut console)?,
        (None, None) if modes => {
            let duration = a.duration.map(duration_arg).transpose()?;
            let rows =
                bench::client_modes::run(&root, &env, a.quick, duration, a.repeats, &mut console)?;
            println!("{}", bench::client_modes::table(&rows));
            rows
        }
        (None, None) => return Err("nothing to run".into()),
    };
    let results = bench::results::Results {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        commit: bench::resources::tensorwire_commit(&root),
        started_unix: started
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        elapsed_s: t0.elapsed().as_secs_f64(),
        machine: bench::resources::machine_info(),
        placement: bench::placement::Placement::describe(placement),
        quick: a.quick,
        rows,
    };
    if let Some(dir) = &a.out {
        results.write_json(dir)?;
        results.write_csv(dir)?;
        let figures = bench::plot::write_all(dir, &results)?;
        bench::report::write_report(dir, &results, &figures)?;
        println!(
            "wrote {} rows, {} figures and report.md to {}",
            results.rows.len(),
            figures.len(),
            dir.display()
        );
    }
    Ok(())
}

/// The plan of a run without `--suite`.
fn custom_plan(a: &Args) -> Result<Plan, CmdError> {
    if a.repeats == 0 || a.repeats > 100 {
        return Err("--repeats must be 1 to 100".into());
    }
    let duration = duration_arg(a.duration.unwrap_or(2.0))?;
    if a.clients.is_empty() || a.clients.iter().any(|&c| c == 0 || c > 1024) {
        return Err("--clients must be 1 to 1024".into());
    }
    if a.connections == 0 || a.connections > 1024 {
        return Err("--connections must be 1 to 1024".into());
    }
    let workloads: Vec<Workload> = if a.model == "identity" {
        if !a.inputs.is_empty() {
            return Err(
                "--input needs an ONNX model (--model PATH.onnx or NAME=PATH.onnx); \
                 the identity model takes generated tensors sized by --size"
                    .into(),
            );
        }
        a.size
            .split(',')
            .map(|s| {
                Ok(Workload::Identity {
                    bytes: parse_size(s)?,
                })
            })
            .collect::<Result<_, bench::BenchError>>()?
    } else {
        let (name, path) = match a.model.split_once('=') {
            Some((n, p)) => (n.to_string(), PathBuf::from(p)),
            None => {
                let p = PathBuf::from(&a.model);
                let n = p
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .ok_or("--model: give NAME=PATH.onnx")?
                    .to_string();
                (n, p)
            }
        };
        if !path.is_file() {
            return Err(format!("--model: {} is not a file", path.display()).into());
        }
        vec![Workload::Model {
            name,
            path,
            dyn_dim: a.dyn_dim,
            files: parse_inputs(&a.inputs)?,
        }]
    };
    let targets: Vec<TargetSpec> = match &a.connect {
        Some(uri) => vec![TargetSpec {
            framework: Framework::Tensorwire,
            net: target::Net::None,
            connect: Some(uri.clone()),
            batching: None,
        }],
        None => {
            let nets = target::parse_transports(&a.transports)?;
            let peers = a
                .peers
                .iter()
                .map(|p| Framework::parse_peer(p))
                .collect::<Result<Vec<_>, _>>()?;
            target::targets(&nets, &peers)
        }
    };
    let loads: Vec<LoadSpec> = if let Some(trace) = &a.trace {
        vec![LoadSpec::Fixed(Load::Open {
            offsets: bench::schedule::read_trace(trace)?,
            connections: a.connections,
            label: "trace".into(),
            rate: None,
        })]
    } else if !a.rate.is_empty() {
        let arrival: bench::schedule::Arrival = a.arrival.parse()?;
        a.rate
            .iter()
            .map(|&r| {
                Ok(LoadSpec::Fixed(Load::Open {
                    offsets: bench::schedule::arrivals(
                        arrival,
                        r,
                        duration,
                        a.requests,
                        suite::SEED,
                    )?,
                    connections: a.connections,
                    label: a.arrival.clone(),
                    rate: Some(r),
                }))
            })
            .collect::<Result<_, bench::BenchError>>()?
    } else {
        a.clients
            .iter()
            .map(|&c| LoadSpec::Fixed(Load::Closed { clients: c }))
            .collect()
    };
    Ok(Plan {
        suite: "custom".into(),
        pin_by_default: false,
        parts: workloads
            .into_iter()
            .map(|w| Part {
                workload: w,
                targets: targets.clone(),
                loads: loads.clone(),
                bounds: Bounds {
                    warmup: a.warmup,
                    duration: Some(duration),
                    requests: a.requests,
                },
                repeats: a.repeats,
                intra_threads: None,
            })
            .collect(),
        classifier: None,
    })
}

/// `--duration` in seconds: more than 0, at most 3600.
fn duration_arg(secs: f64) -> Result<Duration, CmdError> {
    if secs > 0.0 && secs <= 3600.0 {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err("--duration must be more than 0 and at most 3600 seconds".into())
    }
}

/// Parses repeated `--input NAME=FILE.npy` flags. Each name must be given
/// once and each file must exist; the rest (names, dtypes, shapes, sizes) is
/// checked against the model's signature by
/// [`bench::workload::file_inputs`] before anything is measured.
fn parse_inputs(flags: &[String]) -> Result<Vec<(String, PathBuf)>, CmdError> {
    let mut files = Vec::with_capacity(flags.len());
    for spec in flags {
        let (name, path) = spec
            .split_once('=')
            .filter(|(n, p)| !n.is_empty() && !p.is_empty())
            .ok_or_else(|| format!("--input takes NAME=FILE.npy, got '{spec}'"))?;
        if files.iter().any(|(n, _)| n == name) {
            return Err(format!("--input: input '{name}' is given twice").into());
        }
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(format!("--input {spec}: {} is not a file", path.display()).into());
        }
        files.push((name.to_string(), path));
    }
    Ok(files)
}
