//! The `client-modes` suite: what each way of calling the Rust client
//! costs when a caller keeps several requests in flight (issue 17's client
//! modes), on one agent over shm, unix and tcp.
//!
//! Modes ([`Mode`]), each keeping [`DEPTH`] requests in flight except the
//! first:
//!
//! - `sync`: one thread, one request at a time (`Model::infer`): the
//!   baseline, what a request costs alone;
//! - `threads`: [`DEPTH`] threads, each with its own connection, each
//!   calling `infer` (how one gets concurrency without async);
//! - `pipelined`: one thread, one connection, a window of tickets
//!   (`Model::submit`, then `Ticket::wait` on the oldest);
//! - `callback`: one connection, continuation style: each response is
//!   delivered by `Ticket::on_complete` on the session's completion
//!   thread, and its callback submits the next request there;
//! - `future`: [`DEPTH`] tasks on a current-thread tokio runtime, one
//!   connection, each `submit(..).await` in a loop.
//!
//! Latency is from the call that sent a request to the moment its
//! response reached the caller (the callback ran, the future was ready);
//! throughput is completed requests per second. The modes of one transport
//! and workload run in an order rotated every repeat (interleaved, so
//! machine drift spreads over all). Nothing is pinned.

use crate::caller::BenchError;
use crate::console::Console;
use crate::hist::{LatencyHist, CDF_QUANTILES};
use crate::results::Row;
use crate::stats::spread;
use crate::target::BenchEnv;
use classifier::agents::AgentProcess;
use client::{Client, ClientError, DType, Model, TensorRef};
use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The suite's name in rows.
pub const SUITE: &str = "client-modes";
/// Requests each mode but `sync` keeps in flight.
pub const DEPTH: usize = 8;

/// A way of calling the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One request at a time.
    Sync,
    /// [`DEPTH`] threads, a connection each.
    Threads,
    /// One thread, a window of tickets.
    Pipelined,
    /// Completion callbacks.
    Callback,
    /// Futures on a current-thread runtime.
    Future,
}

impl Mode {
    /// Every mode, in the order of the first repeat.
    pub const ALL: [Mode; 5] = [
        Mode::Sync,
        Mode::Threads,
        Mode::Pipelined,
        Mode::Callback,
        Mode::Future,
    ];

    /// Its name in rows.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Threads => "threads",
            Mode::Pipelined => "pipelined",
            Mode::Callback => "callback",
            Mode::Future => "future",
        }
    }

    /// Requests in flight.
    pub fn depth(self) -> usize {
        if self == Mode::Sync {
            1
        } else {
            DEPTH
        }
    }
}

/// What one run of one mode measured.
struct Measured {
    latency: LatencyHist,
    completed: u64,
    errors: u64,
    elapsed: Duration,
}

/// A request: the model, its input's shape and bytes.
struct Work {
    name: &'static str,
    model: String,
    shape: Vec<u64>,
    bytes: Vec<u8>,
}

impl Work {
    fn tensor(&self) -> Result<TensorRef<'_>, BenchError> {
        TensorRef::new(DType::F32, &self.shape, &self.bytes).map_err(err)
    }
}

fn err(e: ClientError) -> BenchError {
    BenchError::new(e.to_string())
}

/// Runs the suite: `quick` shortens every measurement to 0.3 s and one
/// repeat. Returns one row per (transport, workload, mode).
pub fn run(
    root: &Path,
    env: &BenchEnv,
    quick: bool,
    duration: Option<Duration>,
    repeats: usize,
    console: &mut Console,
) -> Result<Vec<Row>, BenchError> {
    let duration = duration.unwrap_or(if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(1)
    });
    let repeats = if quick { 1 } else { repeats.max(1) };
    let digits = root.join("models/build/digits_mlp.onnx");
    if !digits.is_file() {
        return Err(BenchError::new(format!(
            "{} is missing: run scripts/setup.sh",
            digits.display()
        )));
    }
    let works = [
        Work {
            name: "empty",
            model: "identity".into(),
            shape: vec![0],
            bytes: Vec::new(),
        },
        Work {
            name: "digits",
            model: "digits".into(),
            shape: vec![4, 64],
            bytes: (0..4 * 64)
                .flat_map(|i| ((i % 17) as f32 / 17.0).to_le_bytes())
                .collect(),
        },
    ];
    let dir = tempfile::Builder::new()
        .prefix("tw-modes-")
        .tempdir()
        .map_err(|e| BenchError::new(format!("temporary directory: {e}")))?;
    let unix = format!("unix://{}", dir.path().join("agent.sock").display());
    let shm = format!("shm://bench-modes-{}", std::process::id());
    let mut model = OsString::from("digits=");
    model.push(digits.as_os_str());
    let mut args: Vec<OsString> = vec![
        "serve".into(),
        // First: the only `listening on` line read is the first (its port).
        "--listen".into(),
        "tcp://127.0.0.1:0".into(),
        "--listen".into(),
        shm.clone().into(),
        "--listen".into(),
        unix.clone().into(),
        "--intra-threads".into(),
        env.intra_threads.to_string().into(),
        "--model".into(),
        model,
    ];
    if let Some(spin) = env.spin {
        for flag in ["--socket-spin-us", "--shm-spin-us"] {
            args.push(flag.into());
            args.push(spin.as_micros().to_string().into());
        }
    }
    console.start(3 * works.len() * Mode::ALL.len());
    console.begin("starting the agent");
    let agent = AgentProcess::spawn(
        "tensorwire client-modes",
        &env.exe,
        &args,
        dir,
        classifier::agents::START_TIMEOUT,
    )
    .map_err(|e| BenchError::new(e.to_string()))?;
    let tcp = agent.uri().to_string();
    let tcp = if tcp.starts_with("tcp://") {
        tcp
    } else {
        return Err(BenchError::new(format!(
            "the agent's first endpoint is {tcp}, expected its tcp one"
        )));
    };
    let mut rows = Vec::new();
    for (net, uri) in [("shm", &shm), ("unix", &unix), ("tcp", &tcp)] {
        for w in &works {
            let mut measured: Vec<Vec<Measured>> = Mode::ALL.iter().map(|_| Vec::new()).collect();
            for rep in 0..repeats {
                for k in 0..Mode::ALL.len() {
                    let i = (k + rep) % Mode::ALL.len();
                    let mode = Mode::ALL[i];
                    console.begin(&format!(
                        "{net} {} {} (repeat {})",
                        w.name,
                        mode.name(),
                        rep + 1
                    ));
                    measured[i].push(measure(uri, w, mode, duration)?);
                }
            }
            for (mode, m) in Mode::ALL.iter().zip(&measured) {
                let row = make_row(net, w, *mode, m);
                console.row(&row);
                rows.push(row);
                console.progress(rows.len());
            }
        }
    }
    console.finish();
    agent
        .stop(classifier::agents::STOP_TIMEOUT)
        .map_err(|e| BenchError::new(e.to_string()))?;
    Ok(rows)
}

/// Measures `mode` for `duration` (after a warm-up) on a fresh session.
fn measure(uri: &str, w: &Work, mode: Mode, duration: Duration) -> Result<Measured, BenchError> {
    if mode == Mode::Threads {
        let parts = std::thread::scope(|s| {
            let hs: Vec<_> = (0..DEPTH)
                .map(|_| s.spawn(|| measure(uri, w, Mode::Sync, duration)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(BenchError::new("a client thread panicked")))
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        let mut all = Measured {
            latency: LatencyHist::new(),
            completed: 0,
            errors: 0,
            elapsed: Duration::ZERO,
        };
        for p in parts {
            all.latency.merge(&p.latency);
            all.completed += p.completed;
            all.errors += p.errors;
            all.elapsed = all.elapsed.max(p.elapsed);
        }
        return Ok(all);
    }
    let c = Client::connect(uri).map_err(err)?;
    let m = c.model(&w.model).map_err(err)?;
    let x = w.tensor()?;
    for _ in 0..200 {
        m.infer(&[x]).map_err(err)?;
    }
    let mut out = Measured {
        latency: LatencyHist::new(),
        completed: 0,
        errors: 0,
        elapsed: Duration::ZERO,
    };
    let t0 = Instant::now();
    let end = t0 + duration;
    let done = |r: Result<(), ClientError>, sent: Instant, out: &mut Measured| match r {
        Ok(()) => {
            out.latency.record(sent.elapsed().as_nanos() as u64);
            out.completed += 1;
        }
        Err(_) => out.errors += 1,
    };
    match mode {
        Mode::Sync | Mode::Threads => {
            while Instant::now() < end {
                let sent = Instant::now();
                let r = m.infer(&[x]).map(drop);
                done(r, sent, &mut out);
            }
        }
        Mode::Pipelined => {
            let mut window = VecDeque::with_capacity(DEPTH);
            loop {
                while window.len() < DEPTH && Instant::now() < end {
                    window.push_back((Instant::now(), m.submit(&[x]).map_err(err)?));
                }
                let Some((sent, t)) = window.pop_front() else {
                    break;
                };
                done(t.wait().map(drop), sent, &mut out);
            }
        }
        Mode::Callback => {
            // Continuation style: each callback records its request and
            // submits the next one, on the completion thread; this thread
            // only waits for the last to finish.
            let chain = Arc::new(Chain {
                model: m.clone(),
                shape: w.shape.clone(),
                bytes: w.bytes.clone(),
                end,
                out: Mutex::new(Measured {
                    latency: LatencyHist::new(),
                    completed: 0,
                    errors: 0,
                    elapsed: Duration::ZERO,
                }),
                running: AtomicUsize::new(DEPTH),
                finished: Mutex::new(None),
            });
            let (tx, rx) = mpsc::channel();
            *lock(&chain.finished) = Some(tx);
            for _ in 0..DEPTH {
                Chain::next(&chain);
            }
            rx.recv_timeout(duration + Duration::from_secs(30))
                .map_err(|_| BenchError::new("the callbacks did not finish within 30 s"))?;
            let m = std::mem::replace(
                &mut *lock(&chain.out),
                Measured {
                    latency: LatencyHist::new(),
                    completed: 0,
                    errors: 0,
                    elapsed: Duration::ZERO,
                },
            );
            out = m;
        }
        Mode::Future => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .map_err(|e| BenchError::new(format!("tokio runtime: {e}")))?;
            let parts = rt.block_on(async {
                let tasks: Vec<_> = (0..DEPTH)
                    .map(|_| {
                        let m = m.clone();
                        let shape = w.shape.clone();
                        let bytes = w.bytes.clone();
                        tokio::spawn(async move {
                            let mut h = LatencyHist::new();
                            let (mut ok, mut bad) = (0u64, 0u64);
                            while Instant::now() < end {
                                let sent = Instant::now();
                                let r = match TensorRef::new(DType::F32, &shape, &bytes) {
                                    Ok(x) => match m.submit(&[x]) {
                                        Ok(t) => t.await.map(drop),
                                        Err(e) => Err(e),
                                    },
                                    Err(e) => Err(e),
                                };
                                match r {
                                    Ok(()) => {
                                        h.record(sent.elapsed().as_nanos() as u64);
                                        ok += 1;
                                    }
                                    Err(_) => bad += 1,
                                }
                            }
                            (h, ok, bad)
                        })
                    })
                    .collect();
                let mut parts = Vec::new();
                for t in tasks {
                    parts.push(t.await);
                }
                parts
            });
            for p in parts {
                let (h, ok, bad) = p.map_err(|e| BenchError::new(format!("a task failed: {e}")))?;
                out.latency.merge(&h);
                out.completed += ok;
                out.errors += bad;
            }
        }
    }
    out.elapsed = t0.elapsed();
    Ok(out)
}

/// The callback mode's state: every chain of requests shares it.
struct Chain {
    model: Model,
    shape: Vec<u64>,
    bytes: Vec<u8>,
    end: Instant,
    out: Mutex<Measured>,
    /// Chains still running; the last to stop signals `finished`.
    running: AtomicUsize,
    finished: Mutex<Option<mpsc::Sender<()>>>,
}

impl Chain {
    /// Submits the next request of a chain; its callback records it and
    /// submits the one after, until the measurement's end.
    fn next(chain: &Arc<Chain>) {
        if Instant::now() >= chain.end {
            if chain.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                if let Some(tx) = lock(&chain.finished).take() {
                    let _ = tx.send(());
                }
            }
            return;
        }
        let sent = Instant::now();
        let submitted = TensorRef::new(DType::F32, &chain.shape, &chain.bytes)
            .and_then(|x| chain.model.submit(&[x]));
        match submitted {
            Ok(t) => {
                let c = chain.clone();
                t.on_complete(move |r| {
                    {
                        let mut o = lock(&c.out);
                        match r {
                            Ok(_) => {
                                o.latency.record(sent.elapsed().as_nanos() as u64);
                                o.completed += 1;
                            }
                            Err(_) => o.errors += 1,
                        }
                    }
                    Chain::next(&c);
                });
            }
            Err(_) => {
                lock(&chain.out).errors += 1;
                // Give up this chain: a failing submit would spin.
                if chain.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                    if let Some(tx) = lock(&chain.finished).take() {
                        let _ = tx.send(());
                    }
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn make_row(net: &str, w: &Work, mode: Mode, reps: &[Measured]) -> Row {
    let pick = |f: &dyn Fn(&Measured) -> f64| -> (f64, f64, f64) {
        let v: Vec<f64> = reps.iter().map(f).collect();
        spread(&v)
    };
    let (p50, p50_min, p50_max) = pick(&|m| m.latency.percentile_us(0.5));
    let (p90, _, _) = pick(&|m| m.latency.percentile_us(0.9));
    let (p99, p99_min, p99_max) = pick(&|m| m.latency.percentile_us(0.99));
    let (mean, _, _) = pick(&|m| m.latency.mean_us());
    let (rps, rps_min, rps_max) = pick(&|m| m.completed as f64 / m.elapsed.as_secs_f64().max(1e-9));
    let mut merged = LatencyHist::new();
    for m in reps {
        merged.merge(&m.latency);
    }
    Row {
        suite: SUITE.into(),
        target: format!("tensorwire {net} {}", mode.name()),
        framework: "tensorwire".into(),
        transport: net.into(),
        peer: false,
        model: w.model.clone(),
        tensor_bytes: w.bytes.len() as u64,
        clients: mode.depth(),
        load: "closed".into(),
        rate: None,
        requests: reps.iter().map(|m| m.completed).sum(),
        errors: reps.iter().map(|m| m.errors).sum(),
        warmup: 200,
        repeats: reps.len(),
        p50_us: p50,
        p50_spread_us: [p50_min, p50_max],
        p90_us: p90,
        p99_us: p99,
        p99_spread_us: [p99_min, p99_max],
        mean_us: mean,
        throughput_rps: rps,
        cpu_us_per_req: None,
        agent_cpu_us_per_req: None,
        agent_rss_kib: None,
        stages: Vec::new(),
        cdf: merged.cdf(CDF_QUANTILES),
        noise_cpu_pct: 0.0,
        note: format!(
            "{} in flight; throughput spread {rps_min:.0}..{rps_max:.0} rps",
            mode.depth()
        ),
        batching: None,
        tenants: None,
    }
}

/// The report's table of the client-modes rows in `rows` (empty when there
/// are none): per transport and workload, each mode's throughput and
/// latency, and its throughput against `sync`.
pub fn table(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mine: Vec<&Row> = rows.iter().filter(|r| r.suite == SUITE).collect();
    if mine.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "| transport | model | mode | in flight | req/s | × sync | p50 µs | p99 µs | p50 spread |\n\
         |---|---|---|---:|---:|---:|---:|---:|---|\n",
    );
    for r in &mine {
        let base = mine
            .iter()
            .find(|b| {
                b.transport == r.transport && b.model == r.model && b.target.ends_with(" sync")
            })
            .map_or(f64::NAN, |b| b.throughput_rps);
        let mode = r.target.rsplit(' ').next().unwrap_or_default();
        let _ = writeln!(
            s,
            "| {} | {} | {mode} | {} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1}–{:.1} |",
            r.transport,
            r.model,
            r.clients,
            r.throughput_rps,
            r.throughput_rps / base,
            r.p50_us,
            r.p99_us,
            r.p50_spread_us[0],
            r.p50_spread_us[1]
        );
    }
    s
}
