//! Plans and the runner: a [`Plan`] is a list of [`Part`]s (one workload,
//! its targets, the loads to put on them), and [`run_plan`] measures every
//! target under every load, repeat after repeat **interleaved across
//! targets** (repeat 1 of every target, then repeat 2, ...), so a burst of
//! machine noise spreads over all of them instead of skewing one.
//!
//! The named suites regenerate one published experiment each:
//!
//! - [`vaccel`]: the empty-RPC round trip, tensorwire against the raw floors
//!   (blocking and polling),
//!   ttrpc and gRPC over unix/tcp/tcp-nagle, plus the tweet classifier table
//!   (vAccel's setting);
//! - [`breakdown`]: identity 588 KiB, MobileNetV2, ResNet-50 and MiniLM over
//!   every transport, 1 → 16 clients, with the stage breakdown (Hanafy et
//!   al.);
//! - [`load_sweep`]: open-loop Poisson load swept up to and past each
//!   target's capacity, mean and p99 against offered load (SplitRPC);
//! - [`batching`]: dynamic batching off against on (LeNet, the tweet
//!   classifier, MobileNetV2 over shm and unix, closed loop 1 → 64 clients
//!   and an open-loop sweep), each row with the mean batch the agent ran
//!   and the engine's own throughput on batches that size
//!   ([`crate::batching`]), and each closed loop with its hand-off floor
//!   ([`crate::handoff`]);
//! - `tenants`: tenant isolation (a flood at 2× capacity beside a light
//!   tenant, with and without a tenants file); not a plan: it runs two
//!   loads at once, by [`crate::tenants::run`];
//! - `client-modes`: the Rust client's sync, threaded, pipelined, callback
//!   and future modes side by side; not a plan either
//!   ([`crate::client_modes::run`]).

use crate::batching::{
    self as batch, BatchConfig, BatchingFigures, FloorBounds, FloorCache, OfflineBounds,
};
use crate::caller::BenchError;
use crate::console::Console;
use crate::handoff::HandoffBounds;
use crate::load::{Bounds, Load};
use crate::measure::{self, Repeat, RowKey};
use crate::results::Row;
use crate::schedule::{self, Arrival};
use crate::target::{self, BenchEnv, Framework, Net, RunningTarget, TargetSpec};
use crate::workload::Workload;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One workload, the targets serving it, and the loads they get.
#[derive(Clone, Debug)]
pub struct Part {
    /// The model and inputs.
    pub workload: Workload,
    /// What to measure.
    pub targets: Vec<TargetSpec>,
    /// The loads, each measured on every target that supports it.
    pub loads: Vec<LoadSpec>,
    /// Bounds of each measurement.
    pub bounds: Bounds,
    /// Repeats of each (target, load).
    pub repeats: usize,
    /// ONNX Runtime intra-op threads of this part's engines (its agents,
    /// and the offline and hand-off measurements), instead of the run's
    /// `--intra-threads`: a model too small to split runs best on one.
    pub intra_threads: Option<usize>,
}

/// A load to put on the targets.
#[derive(Clone, Debug)]
pub enum LoadSpec {
    /// A fixed load.
    Fixed(Load),
    /// Open loop at `fraction` × the target's own capacity, with
    /// `connections` workers. The capacity is measured first, closed loop
    /// with as many clients as the sweep has connections: what the target
    /// sustains over that many connections, so the knee falls near 1.0
    /// (with one client, targets that serve connections in parallel had
    /// no knee within the sweep).
    OfCapacity {
        /// Fraction of capacity.
        fraction: f64,
        /// Arrival process.
        arrival: Arrival,
        /// Worker connections.
        connections: usize,
    },
}

/// A whole run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The suite name in rows.
    pub suite: String,
    /// Whether the suite pins clients and servers by default (one-client
    /// latency comparisons, where placement would decide the ratios).
    pub pin_by_default: bool,
    /// The parts, in order.
    pub parts: Vec<Part>,
    /// Run the tweet classifier comparison too (vaccel suite).
    pub classifier: Option<ClassifierPart>,
}

/// The tweet classifier comparison: every line of a text file through the
/// classifier, locally and over each transport.
#[derive(Clone, Debug)]
pub struct ClassifierPart {
    /// Transports to compare with the local engine.
    pub transports: Vec<Net>,
    /// At most this many lines of the file.
    pub lines: usize,
    /// Passes over the lines (repeats).
    pub repeats: usize,
}

/// Default seed of Poisson schedules.
pub const SEED: u64 = 0x7e15_0a11;

/// Measures every part of `plan`, printing rows as they come.
pub fn run_plan(
    plan: &Plan,
    env: &BenchEnv,
    console: &mut Console,
) -> Result<Vec<Row>, BenchError> {
    let total: usize = plan
        .parts
        .iter()
        .map(|p| p.targets.len() * p.loads.len())
        .sum::<usize>()
        + plan
            .classifier
            .as_ref()
            .map_or(0, |c| c.transports.len() + 1);
    console.start(total);
    // Client threads inherit this thread's CPUs (servers are pinned as
    // they start).
    let old = match env.placement {
        Some(p) => Some(crate::placement::pin_current_thread(p.client_cpu)?),
        None => None,
    };
    let mut rows = Vec::new();
    let mut result = Ok(());
    let mut floors = FloorCache::default();
    for part in &plan.parts {
        result = run_part(&plan.suite, part, env, console, &mut rows, &mut floors);
        if result.is_err() {
            break;
        }
    }
    if let Some(old) = &old {
        crate::placement::restore_current_thread(old);
    }
    result?;
    // The classifier table runs unpinned: its engine uses two threads,
    // locally as in the agent, and pinning would give it one core locally.
    if let Some(c) = &plan.classifier {
        rows.extend(crate::classify::run(
            &plan.suite,
            c,
            env,
            console,
            rows.len(),
        )?);
    }
    console.finish();
    Ok(rows)
}

fn run_part(
    suite: &str,
    part: &Part,
    env: &BenchEnv,
    console: &mut Console,
    rows: &mut Vec<Row>,
    floors: &mut FloorCache,
) -> Result<(), BenchError> {
    let part_env;
    let env = match part.intra_threads {
        Some(n) => {
            part_env = BenchEnv {
                intra_threads: n,
                ..env.clone()
            };
            &part_env
        }
        None => env,
    };
    let first_row = rows.len();
    let mut running: Vec<RunningTarget> = Vec::new();
    for spec in &part.targets {
        console.begin(&format!(
            "starting {} for {}",
            spec.label(),
            part.workload.label()
        ));
        match target::start(spec, &part.workload, env) {
            Ok(t) => running.push(t),
            Err(e) => {
                // The start error is the one to report.
                let _ = stop_all(running);
                return Err(e);
            }
        }
    }
    let result = measure_part(suite, part, &running, env, console, rows);
    let stopped = stop_all(running);
    result?;
    stopped?;
    // Batching rows: the engine's own throughput at each row's mean batch,
    // and the hand-off floor of each closed loop, measured here with the
    // agents stopped.
    if rows[first_row..].iter().any(|r| r.batching.is_some()) {
        let duration = part
            .bounds
            .duration
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        let bounds = FloorBounds {
            offline: OfflineBounds {
                duration,
                runs: 5000,
                repeats: part.repeats,
            },
            handoff: HandoffBounds {
                warmup: duration / 4,
                duration,
                repeats: part.repeats,
            },
        };
        batch::fill_floors(
            &mut rows[first_row..],
            &part.workload,
            env.intra_threads,
            &bounds,
            floors,
            &mut |what| console.begin(what),
        )?;
    }
    Ok(())
}

fn stop_all(running: Vec<RunningTarget>) -> Result<(), BenchError> {
    let mut first = Ok(());
    for t in running {
        let r = t.stop();
        if first.is_ok() {
            first = r;
        }
    }
    first
}

fn measure_part(
    suite: &str,
    part: &Part,
    running: &[RunningTarget],
    env: &BenchEnv,
    console: &mut Console,
    rows: &mut Vec<Row>,
) -> Result<(), BenchError> {
    // Capacity (closed loop, one client per connection of the sweep) of
    // each target, when a load needs it.
    let mut capacity: Vec<Option<f64>> = vec![None; running.len()];
    let probe_clients = part
        .loads
        .iter()
        .filter_map(|l| match l {
            LoadSpec::OfCapacity { connections, .. } => Some(*connections),
            LoadSpec::Fixed(_) => None,
        })
        .max();
    if let Some(clients) = probe_clients {
        for (i, t) in running.iter().enumerate() {
            if t.factory.is_none() {
                continue;
            }
            console.begin(&format!("capacity of {}", t.spec.label()));
            let probe = Bounds {
                warmup: part.bounds.warmup,
                duration: Some(part.bounds.duration.unwrap_or(Duration::from_secs(1))),
                requests: None,
            };
            let r = measure::measure_once(t, &Load::Closed { clients }, &probe, env)?;
            capacity[i] = Some(r.throughput_rps);
        }
    }
    for load_spec in &part.loads {
        // Per target: its load (fixed, or from its capacity) and repeats.
        let mut loads: Vec<Option<Load>> = Vec::with_capacity(running.len());
        for (i, t) in running.iter().enumerate() {
            let load = match load_spec {
                LoadSpec::Fixed(l) => Some(l.clone()),
                LoadSpec::OfCapacity {
                    fraction,
                    arrival,
                    connections,
                } => match capacity[i] {
                    Some(c) if c > 0.0 => {
                        let rate = c * fraction;
                        let duration = part.bounds.duration.unwrap_or(Duration::from_secs(2));
                        let offsets = schedule::arrivals(
                            *arrival,
                            rate,
                            duration,
                            part.bounds.requests,
                            SEED,
                        )?;
                        Some(Load::Open {
                            offsets,
                            connections: *connections,
                            label: arrival_name(*arrival).to_string(),
                            rate: Some(rate),
                        })
                    }
                    _ => None,
                },
            };
            loads.push(load.filter(|l| measure::supports(t.spec.framework, l)));
        }
        let mut reps: Vec<Vec<Repeat>> = (0..running.len()).map(|_| Vec::new()).collect();
        // Batching targets: the mean batch of each repeat, from the agent's
        // statistics read around it.
        let mut batches: Vec<Vec<Option<f64>>> = (0..running.len()).map(|_| Vec::new()).collect();
        let model = part.workload.model_name();
        for rep in 0..part.repeats {
            for (i, t) in running.iter().enumerate() {
                let Some(load) = &loads[i] else { continue };
                let (l, c, r) = measure::load_label(load);
                console.begin(&format!(
                    "{} {} {} {}{} repeat {}/{}",
                    t.spec.label(),
                    part.workload.label(),
                    l,
                    c,
                    r.map_or(String::new(), |r| format!(" @ {r:.0}/s")),
                    rep + 1,
                    part.repeats
                ));
                let counts = |t: &RunningTarget| {
                    t.stats_uri
                        .as_deref()
                        .and_then(|uri| batch::read_counts(uri, model).ok())
                };
                let before = counts(t);
                reps[i].push(measure::measure_once(t, load, &part.bounds, env)?);
                if t.spec.batching.is_some() {
                    batches[i].push(
                        before
                            .zip(counts(t))
                            .and_then(|(b, a)| batch::mean_batch(b, a)),
                    );
                }
            }
        }
        for (i, t) in running.iter().enumerate() {
            let Some(load) = &loads[i] else { continue };
            let key = RowKey {
                suite: suite.to_string(),
                model: part.workload.label(),
                tensor_bytes: t.tensor_bytes,
                warmup: part.bounds.warmup,
            };
            let mut row = measure::aggregate(&key, t, load, &reps[i]);
            if let Some(config) = t.spec.batching {
                let fraction = match load_spec {
                    LoadSpec::OfCapacity { fraction, .. } => Some(*fraction),
                    LoadSpec::Fixed(_) => None,
                };
                let mean = batch::median_batch(&batches[i]);
                if mean.is_none() {
                    if !row.note.is_empty() {
                        row.note.push_str("; ");
                    }
                    row.note
                        .push_str("the agent's statistics could not be read");
                }
                row.batching = Some(BatchingFigures::new(config, mean, fraction));
            }
            console.row(&row);
            rows.push(row);
        }
        console.progress(rows.len());
    }
    Ok(())
}

fn arrival_name(a: Arrival) -> &'static str {
    match a {
        Arrival::Poisson => "poisson",
        Arrival::Constant => "constant",
    }
}

/// The model `file` of `models/build` under `root` as workload `name`,
/// generated inputs with `dyn_dim` for its dynamic dims.
fn model_workload(
    root: &Path,
    name: &str,
    file: &str,
    dyn_dim: u64,
) -> Result<Workload, BenchError> {
    Ok(Workload::Model {
        name: name.into(),
        path: built_model(root, file)?,
        dyn_dim,
        files: Vec::new(),
    })
}

/// `models/build/NAME`, resolved against the repository (or the current
/// directory); an error naming `scripts/setup.sh` when missing.
pub fn built_model(root: &Path, name: &str) -> Result<PathBuf, BenchError> {
    let p = root.join("models/build").join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(BenchError::new(format!(
            "{} is missing: run `bash scripts/setup.sh` to build the models",
            p.display()
        )))
    }
}

/// The named suites.
pub const SUITES: &[&str] = &[
    "vaccel",
    "breakdown",
    "load",
    "batching",
    "tenants",
    "client-modes",
];

/// The plan of suite `name` (quick = the ≤ 1 minute version).
pub fn suite(name: &str, root: &Path, quick: bool) -> Result<Plan, BenchError> {
    match name {
        "vaccel" => Ok(vaccel(quick)),
        "breakdown" => breakdown(root, quick),
        "load" => load_sweep(root, quick),
        "batching" => batching(root, quick),
        "tenants" | "client-modes" => Err(BenchError::new(format!(
            "the {name} suite is not a plan: it has its own runner"
        ))),
        other => Err(BenchError::new(format!(
            "unknown suite '{other}' (available: {})",
            SUITES.join(", ")
        ))),
    }
}

const ALL_NETS: [Net; 6] = [
    Net::None,
    Net::Inproc,
    Net::Shm,
    Net::Unix,
    Net::Tcp { nodelay: true },
    Net::Tcp { nodelay: false },
];

/// vAccel's experiment: the empty RPC over every transport against the raw
/// floor and the peers, then the classifier table.
pub fn vaccel(quick: bool) -> Plan {
    let peers = [
        Framework::Raw,
        Framework::RawSpin,
        Framework::Ttrpc,
        Framework::Grpc,
    ];
    Plan {
        suite: "vaccel".into(),
        pin_by_default: true,
        parts: vec![Part {
            workload: Workload::Identity { bytes: 0 },
            targets: target::targets(&ALL_NETS, &peers),
            loads: vec![LoadSpec::Fixed(Load::Closed { clients: 1 })],
            bounds: Bounds {
                warmup: if quick { 200 } else { 2000 },
                duration: Some(Duration::from_millis(if quick { 300 } else { 4000 })),
                requests: Some(if quick { 2000 } else { 20_000 }),
            },
            repeats: 3,
            intra_threads: None,
        }],
        classifier: Some(ClassifierPart {
            transports: ALL_NETS[1..].to_vec(),
            lines: if quick { 8 } else { 100 },
            repeats: 3,
        }),
    }
}

/// Hanafy et al.'s breakdown: four models over every transport, 1 → 16
/// clients.
pub fn breakdown(root: &Path, quick: bool) -> Result<Plan, BenchError> {
    let model = |name: &str, file: &str, dyn_dim: u64| model_workload(root, name, file, dyn_dim);
    let mut workloads = vec![
        Workload::Identity { bytes: 588 << 10 },
        model("mobilenetv2", "mobilenetv2.onnx", 1)?,
    ];
    if !quick {
        workloads.push(model("resnet50", "resnet50.onnx", 1)?);
        workloads.push(model("minilm", "minilm_l6.onnx", 64)?);
    }
    let nets: Vec<Net> = if quick {
        vec![Net::None, Net::Shm, Net::Unix, Net::Tcp { nodelay: true }]
    } else {
        ALL_NETS[..5].to_vec()
    };
    let clients: &[usize] = if quick { &[1, 4] } else { &[1, 2, 4, 8, 16] };
    Ok(Plan {
        suite: "breakdown".into(),
        pin_by_default: false,
        parts: workloads
            .into_iter()
            .map(|w| Part {
                workload: w,
                targets: target::targets(&nets, &[]),
                loads: clients
                    .iter()
                    .map(|&c| LoadSpec::Fixed(Load::Closed { clients: c }))
                    .collect(),
                bounds: Bounds {
                    // Per client: with 16 clients on ResNet-50 (~80 ms a
                    // run on 2 cores) more warm-up would dominate the suite.
                    warmup: if quick { 2 } else { 3 },
                    duration: Some(Duration::from_millis(if quick { 250 } else { 1200 })),
                    requests: None,
                },
                repeats: 3,
                intra_threads: None,
            })
            .collect(),
        classifier: None,
    })
}

/// SplitRPC's sweep: open-loop Poisson arrivals at fractions of each
/// target's capacity.
pub fn load_sweep(root: &Path, quick: bool) -> Result<Plan, BenchError> {
    let fractions: &[f64] = if quick {
        &[0.3, 0.7, 1.2]
    } else {
        &[0.2, 0.5, 0.8, 0.9, 1.0, 1.1, 1.3]
    };
    let mut workloads = vec![Workload::Identity {
        bytes: if quick { 64 << 10 } else { 588 << 10 },
    }];
    if !quick {
        workloads.push(Workload::Model {
            name: "mobilenetv2".into(),
            path: built_model(root, "mobilenetv2.onnx")?,
            dyn_dim: 1,
            files: Vec::new(),
        });
    }
    let nets: Vec<Net> = if quick {
        vec![Net::Shm, Net::Unix]
    } else {
        vec![Net::Inproc, Net::Shm, Net::Unix, Net::Tcp { nodelay: true }]
    };
    Ok(Plan {
        suite: "load".into(),
        pin_by_default: false,
        parts: workloads
            .into_iter()
            .map(|w| Part {
                targets: target::targets(&nets, &[]),
                loads: fractions
                    .iter()
                    .map(|&f| LoadSpec::OfCapacity {
                        fraction: f,
                        arrival: Arrival::Poisson,
                        connections: 4,
                    })
                    .collect(),
                bounds: Bounds {
                    // Per connection, before every repeat. A model needs a
                    // few runs to be warm, and 4 connections × 200 runs of
                    // MobileNetV2 queued behind one engine took 5 s a
                    // repeat: more than the measurement (the suite ran
                    // 736 s, over its 10 minutes).
                    warmup: match (&w, quick) {
                        (_, true) => 20,
                        (Workload::Identity { .. }, false) => 200,
                        (_, false) => 5,
                    },
                    duration: Some(Duration::from_millis(if quick { 300 } else { 1200 })),
                    requests: None,
                },
                workload: w,
                repeats: 3,
                intra_threads: None,
            })
            .collect(),
        classifier: None,
    })
}

/// Dynamic batching off against on: each model served over shm and unix
/// by an agent with [`BatchConfig::OFF`] and one with [`BatchConfig::ON`]
/// ([`BatchConfig::FILLING`] for the tweet classifier; four targets,
/// interleaved), closed loop 1, 4, 16, 64 clients and an
/// open-loop Poisson sweep at fractions of each target's capacity over 16
/// connections. Quick: LeNet at 1 and 16 clients, MobileNetV2 at 16.
/// LeNet's engines use one intra-op thread whatever `--intra-threads`
/// says: its operators are too small to split, and a second thread's
/// spinning takes a core from its clients. After each model's agents
/// stop, the engine is measured alone: offline at each row's mean batch,
/// and the hand-off floor of each closed loop.
pub fn batching(root: &Path, quick: bool) -> Result<Plan, BenchError> {
    let model = |name: &str, file: &str, dyn_dim: u64| model_workload(root, name, file, dyn_dim);
    let closed = |clients: &[usize]| -> Vec<LoadSpec> {
        clients
            .iter()
            .map(|&c| LoadSpec::Fixed(Load::Closed { clients: c }))
            .collect()
    };
    let sweep = || -> Vec<LoadSpec> {
        [0.3, 0.6, 0.9, 1.2]
            .iter()
            .map(|&f| LoadSpec::OfCapacity {
                fraction: f,
                arrival: Arrival::Poisson,
                connections: 16,
            })
            .collect()
    };
    // (workload, loads, warm-up calls per client, the "on" setting, its
    // intra-op threads): LeNet runs in tens of µs, MobileNetV2 and the
    // classifier in milliseconds (64 clients × a few warm-up runs each
    // already take seconds). LeNet's operators are too small to split: one
    // intra-op thread serves it best (a second one's spinning takes a core
    // from 16 clients: 1.3–2.0× fewer requests, a 4 ms p99), as
    // `intra_threads = 1` in its `[[model]]` table would.
    type BatchPart = (Workload, Vec<LoadSpec>, u64, BatchConfig, Option<usize>);
    let mut parts: Vec<BatchPart> = Vec::new();
    if quick {
        parts.push((
            model("lenet", "lenet_digits.onnx", 1)?,
            closed(&[1, 16]),
            50,
            BatchConfig::ON,
            Some(1),
        ));
        parts.push((
            model("mobilenetv2", "mobilenetv2.onnx", 1)?,
            closed(&[16]),
            2,
            BatchConfig::ON,
            None,
        ));
    } else {
        let all = |mut l: Vec<LoadSpec>| {
            l.extend(sweep());
            l
        };
        parts.push((
            model("lenet", "lenet_digits.onnx", 1)?,
            all(closed(&[1, 4, 16, 64])),
            200,
            BatchConfig::ON,
            Some(1),
        ));
        // The tweet classifier at a fixed sequence length (as the
        // breakdown suite feeds MiniLM): requests of one shape batch.
        parts.push((
            model("tweet-classifier", "tweet_classifier.onnx", 64)?,
            all(closed(&[1, 4, 16, 64])),
            2,
            BatchConfig::FILLING,
            None,
        ));
        parts.push((
            model("mobilenetv2", "mobilenetv2.onnx", 1)?,
            all(closed(&[1, 4, 16, 64])),
            2,
            BatchConfig::ON,
            None,
        ));
    }
    let targets = |on: BatchConfig| {
        let mut targets = Vec::new();
        for net in [Net::Shm, Net::Unix] {
            for config in [BatchConfig::OFF, on] {
                targets.push(TargetSpec::batching(net, config));
            }
        }
        targets
    };
    Ok(Plan {
        suite: "batching".into(),
        pin_by_default: false,
        parts: parts
            .into_iter()
            .map(|(workload, loads, warmup, on, intra_threads)| Part {
                intra_threads,
                workload,
                targets: targets(on),
                loads,
                bounds: Bounds {
                    warmup,
                    duration: Some(Duration::from_millis(if quick { 400 } else { 1500 })),
                    requests: None,
                },
                repeats: 3,
            })
            .collect(),
        classifier: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suites_are_known_and_bounded() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        assert!(suite("nope", &root, true).is_err());
        let v = vaccel(true);
        assert!(v.parts[0].targets.len() >= 12, "every transport and peer");
        for p in &v.parts {
            assert!(p.repeats >= 3);
            assert!(p.bounds.duration.is_some());
        }
        assert!(SUITES.contains(&"batching"));
        for quick in [true, false] {
            let b = batching(&root, quick).expect("the models are built");
            assert_eq!(b.suite, "batching");
            for p in &b.parts {
                assert!(p.repeats >= 3);
                assert!(p.bounds.duration.is_some());
                // Off and on on each transport, interleaved in one part.
                let on = p
                    .targets
                    .iter()
                    .filter(|t| t.batching.is_some_and(BatchConfig::is_on));
                let off = p
                    .targets
                    .iter()
                    .filter(|t| t.batching == Some(BatchConfig::OFF));
                assert_eq!((on.count(), off.count()), (2, 2));
            }
            let models: Vec<String> = b.parts.iter().map(|p| p.workload.label()).collect();
            // LeNet alone runs on one intra-op thread.
            let threads: Vec<Option<usize>> = b.parts.iter().map(|p| p.intra_threads).collect();
            assert_eq!(threads[0], Some(1));
            assert!(threads[1..].iter().all(Option::is_none));
            if quick {
                assert_eq!(models, ["lenet", "mobilenetv2"]);
                let measurements: usize = b.parts.iter().map(|p| p.loads.len()).sum();
                assert!(measurements <= 3, "quick stays within a minute or two");
            } else {
                assert_eq!(models, ["lenet", "tweet-classifier", "mobilenetv2"]);
                // The classifier's batches wait to fill; the others' not.
                let on_delay: Vec<u64> = b
                    .parts
                    .iter()
                    .filter_map(|p| {
                        p.targets
                            .iter()
                            .find_map(|t| t.batching.filter(|c| c.is_on()))
                    })
                    .map(|c| c.max_queue_delay_us)
                    .collect();
                assert_eq!(on_delay, [0, 20_000, 0]);
            }
        }
    }
}
