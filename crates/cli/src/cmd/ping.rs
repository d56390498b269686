//! `tensorwire ping`: round trips through the identity model (or any model,
//! with `--model`), over a bare socket pair (`--raw`) as the floor to compare
//! against in the same run, or through no transport at all (`--connect
//! local`: the engine called directly, the baseline of the RPC tax).

use super::{connect, parse_models, CmdError, MoverArg, TokenArg, DEFAULT_CONNECT};
use bench::raw::{self, EchoOptions, RawKind, RawOptions};
use bench::raw_shm::{self, ShmOptions};
use bench::stats::{summarize, Summary};
use client::TensorRef;
use std::process::Command;
use std::time::{Duration, Instant};
use wire::{AlignedBuf, DType, DESC_FIXED_LEN, HEADER_LEN};

/// Arguments of `ping`.
#[derive(clap::Args)]
pub struct Args {
    /// The agent to ping (ignored with --raw). `local` calls the engine
    /// directly in this process, with no transport at all.
    #[arg(long, default_value = DEFAULT_CONNECT)]
    connect: String,
    /// The model to call (default: the built-in identity model). Other models
    /// get seeded random inputs shaped by their signature (dynamic dims = 1).
    #[arg(long, default_value = "identity")]
    model: String,
    /// For the embedded agent (inproc://) and `local`: models to load, NAME=PATH.onnx.
    #[arg(long = "load", value_name = "NAME=PATH")]
    load: Vec<String>,
    /// Measure a bare socket pair instead (no tensorwire code): unix or tcp;
    /// or shm: two processes spinning on one shared page (no syscalls).
    #[arg(long, value_name = "unix|tcp|shm")]
    raw: Option<String>,
    /// Timed round trips.
    #[arg(short = 'n', long, default_value_t = 10_000)]
    iterations: usize,
    /// Untimed round trips first.
    #[arg(long, default_value_t = 1000)]
    warmup: usize,
    /// Stop timing after this many seconds even if fewer than -n round
    /// trips were made (for runs of several clients side by side that
    /// must overlap for their whole run).
    #[arg(long, value_name = "SECS", conflicts_with = "raw")]
    duration: Option<f64>,
    /// Tensor bytes per request (0 = a request with no tensor at all).
    /// Ignored by --raw shm, whose floor is the notification cost alone (the
    /// shm transport leaves payload bytes in place): 8 bytes each way.
    #[arg(long, default_value_t = 0)]
    size: u64,
    /// --raw tcp only: TCP_NODELAY (1) or Nagle (0).
    #[arg(long, default_value = "1", value_name = "0|1")]
    nodelay: String,
    /// --raw only: send each message as two writes (64-byte header, then body).
    #[arg(long)]
    split_writes: bool,
    /// --raw only: pin the echo peer process to this CPU (pin the client with
    /// `taskset`), so the floor is measured with the same placement as the
    /// agent it is compared with: a cross-core wake-up costs ~5 µs here.
    #[arg(long, value_name = "CPU")]
    peer_cpu: Option<usize>,
    /// Microseconds a waiting read polls before it blocks: with --raw, both
    /// ends of the floor; otherwise the client's budget (the agent's is
    /// `serve --socket-spin-us`). Default 200 for both, so that a floor
    /// polls as tensorwire's transports do; 0 blocks at once.
    #[arg(long, value_name = "US")]
    spin_us: Option<u64>,
    /// Ask the agent for every request's timeline and print the median time
    /// of each stage (client → agent, payload, queue, compute, agent → client).
    #[arg(long)]
    stages: bool,
    /// Send `Ping` control messages instead of model requests: the agent
    /// answers each with a `Pong` without touching a model, so the round
    /// trip is the transport and the message framing alone. Set beside an
    /// empty-RPC run, it splits tensorwire's own cost into the message
    /// path and the model path (descriptors, model queue, response).
    #[arg(long, conflicts_with_all = ["raw", "stages", "size"])]
    control: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    token: TokenArg,
    /// With `--mover` (not `zero`), inputs are sent from the heap, so each
    /// request moves them into the arena with that mover; without it they
    /// are allocated in the arena (zero copy).
    #[command(flatten)]
    mover: MoverArg,
}

/// Arguments of the hidden `raw-echo` peer.
#[derive(clap::Args)]
pub struct EchoArgs {
    /// Listen on this Unix socket path.
    #[arg(long, conflicts_with = "tcp")]
    unix: Option<String>,
    /// Listen on this TCP address.
    #[arg(long)]
    tcp: Option<String>,
    /// Echo over this shared-memory file instead (`ping --raw shm`).
    #[arg(long, conflicts_with_all = ["unix", "tcp"])]
    shm: Option<std::path::PathBuf>,
    /// Message length (sockets only).
    #[arg(long, required_unless_present = "shm")]
    len: Option<usize>,
    /// TCP_NODELAY (1) or not (0).
    #[arg(long, default_value = "1")]
    nodelay: String,
    /// Answer with two writes.
    #[arg(long)]
    split_writes: bool,
    /// Pin this process to one CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Microseconds a read polls before it blocks (sockets only).
    #[arg(long, default_value_t = 0)]
    spin_us: u64,
}

/// A `--spin-us` value as a budget, refusing more than the agent allows.
fn spin_budget(us: u64) -> Result<Duration, CmdError> {
    if us > server::config::MAX_SPIN_US {
        return Err(format!(
            "--spin-us must be 0..={}, not {us}",
            server::config::MAX_SPIN_US
        )
        .into());
    }
    Ok(Duration::from_micros(us))
}

fn parse_flag01(s: &str, what: &str) -> Result<bool, CmdError> {
    match s {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(format!("{what} must be 0 or 1, not '{s}'").into()),
    }
}

/// Bytes of a tensorwire request carrying one tensor of `size` bytes (or
/// none for 0): the raw floor sends exactly as many, so both move the same
/// bytes.
pub fn request_bytes(size: u64) -> u64 {
    let desc = if size == 0 {
        0
    } else {
        DESC_FIXED_LEN as u64 + 8
    };
    HEADER_LEN as u64 + desc + size
}

/// The client's spin budget, and the raw floors' by default.
const DEFAULT_SPIN_US: u64 = transport::shm::WaitPolicy::CLIENT.spin.as_micros() as u64;

/// Runs `ping`.
pub fn run(a: Args) -> Result<(), CmdError> {
    if a.iterations == 0 {
        return Err("-n must be at least 1".into());
    }
    if let Some(d) = a.duration {
        if !(d.is_finite() && d > 0.0 && d <= 86_400.0) {
            return Err(format!("--duration must be 0 < SECS <= 86400, not {d}").into());
        }
    }
    let nodelay = parse_flag01(&a.nodelay, "--nodelay")?;
    // (target, samples, request bytes on the wire, tensor bytes)
    let (target, samples, msg_bytes, tensor_bytes) = match &a.raw {
        Some(kind) if kind == "shm" => ping_raw_shm(&a, nodelay)?,
        Some(kind) => {
            let kind = match kind.as_str() {
                "unix" => RawKind::Unix,
                "tcp" => RawKind::Tcp,
                other => return Err(format!("--raw takes unix, tcp or shm, not '{other}'").into()),
            };
            let opts = RawOptions {
                kind,
                iterations: a.iterations,
                warmup: a.warmup,
                msg_len: usize::try_from(request_bytes(a.size))?,
                nodelay,
                split_writes: a.split_writes,
                spin: spin_budget(a.spin_us.unwrap_or(DEFAULT_SPIN_US))?,
            };
            let mut cmd = Command::new(std::env::current_exe()?);
            cmd.arg("raw-echo");
            if let Some(cpu) = a.peer_cpu {
                cmd.args(["--cpu", &cpu.to_string()]);
            }
            let mut name = format!("raw-{kind}");
            if kind == RawKind::Tcp && !nodelay {
                name.push_str("?nodelay=0");
            }
            if a.split_writes {
                name.push_str("+split-writes");
            }
            if !opts.spin.is_zero() {
                name.push_str("+spin");
            }
            (
                name,
                raw::run_raw_ping(&opts, Some(&cmd))?,
                request_bytes(a.size),
                a.size,
            )
        }
        None => {
            if a.split_writes || !nodelay || a.peer_cpu.is_some() {
                return Err("--split-writes, --nodelay and --peer-cpu apply to --raw; for tensorwire use tcp://host:port?nodelay=0 and taskset".into());
            }
            let (samples, inputs) = if a.connect == "local" {
                if a.control {
                    return Err("--control needs an agent: local calls the engine directly".into());
                }
                ping_local(&a)?
            } else {
                ping_tensorwire(&a)?
            };
            let tensor_bytes: u64 = inputs.iter().map(|(_, _, b)| b.len() as u64).sum();
            // A Ping is a bare header.
            let msg_bytes = if a.control {
                HEADER_LEN as u64
            } else {
                message_bytes(&inputs)
            };
            (a.connect.clone(), samples, msg_bytes, tensor_bytes)
        }
    };
    let s = summarize(&samples).ok_or("no samples")?;
    print_summary(&target, &a, &s, msg_bytes, tensor_bytes)
}

type Inputs = Vec<(DType, Vec<u64>, AlignedBuf)>;

/// Bytes of the request carrying `inputs`: header, descriptors, aligned payload.
fn message_bytes(inputs: &Inputs) -> u64 {
    let desc: u64 = inputs
        .iter()
        .map(|(_, s, _)| (DESC_FIXED_LEN + 8 * s.len()) as u64)
        .sum();
    let payload = wire::layout_payload(inputs.iter().map(|(_, _, b)| b.len() as u64))
        .map_or(0, |(_, len)| len);
    HEADER_LEN as u64 + desc + payload
}

/// Inputs for one request: identity gets one u8 tensor of `--size` bytes
/// (none for 0); other models get seeded random tensors from their signature.
fn make_inputs(a: &Args, sig: &wire::ModelSignature) -> Result<Inputs, CmdError> {
    // The same inputs `tensorwire bench` makes (one workload definition).
    if sig.inputs.is_empty() {
        return Ok(bench::workload::identity_inputs(a.size)?);
    }
    Ok(bench::workload::seeded_inputs(
        sig,
        1,
        0x9e37_79b9_7f4a_7c15,
    )?)
}

fn ping_tensorwire(a: &Args) -> Result<(Vec<u64>, Inputs), CmdError> {
    let mut opts = client::ClientOptions {
        want_timeline: a.stages,
        ..Default::default()
    };
    if let Some(us) = a.spin_us {
        opts.spin = spin_budget(us)?;
    }
    let uri = a.mover.apply_uri(&a.connect)?;
    let c = connect(&uri, &parse_models(&a.load)?, a.token.apply(opts))?;
    if a.control {
        // `Client::ping` times its own round trip: timing around it as well
        // would count two more clock reads (~60 ns) than an empty request.
        let samples = sample_loop(a, || {
            let took = c.client.ping()?;
            Ok(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX))
        })?;
        return Ok((samples, Vec::new()));
    }
    let model = c.client.model(&a.model)?;
    let inputs = make_inputs(a, model.signature())?;
    // Each tensor is allocated once where the transport wants it (in the
    // session's arena over shm, so every request is zero-copy) and re-sent.
    let mut bufs = Vec::with_capacity(inputs.len());
    let moved = !matches!(
        a.mover.mover,
        None | Some(transport::mover::MoverChoice::Fixed(
            transport::mover::Mover::Zero
        ))
    );
    if !moved {
        for (dtype, shape, data) in &inputs {
            let mut t = c.client.alloc_tensor(*dtype, shape)?;
            t.as_mut_bytes().copy_from_slice(data);
            bufs.push(t);
        }
    }
    let tensors: Vec<TensorRef<'_>> = if moved {
        inputs
            .iter()
            .map(|(dtype, shape, data)| TensorRef::new(*dtype, shape, data))
            .collect::<Result<_, _>>()?
    } else {
        bufs.iter().map(|t| t.as_ref()).collect()
    };
    let first = model.infer(&tensors)?;
    if model.signature().inputs.is_empty() {
        // Check once that the identity model echoes what it was sent.
        let same = first.outputs.len() == tensors.len()
            && first
                .outputs
                .iter()
                .zip(&tensors)
                .all(|(o, t)| o.bytes() == t.data);
        if !same {
            return Err("the identity model did not return the tensors it was sent".into());
        }
    }
    let mut stages = StageTimes::default();
    let samples = time_loop(a, || {
        let r = model.infer(&tensors)?;
        if r.outputs.len() != first.outputs.len() {
            return Err("the model returned a different number of outputs".into());
        }
        if let Some(tl) = &r.timeline {
            stages.add(r.client_start_ns, tl, r.client_done_ns);
        }
        Ok(())
    })?;
    if a.stages {
        stages.print(a.warmup);
        let cs = c.client.copy_stats();
        println!(
            "client copies: {} input bytes and {} output bytes copied in user space over {} requests; {} payload bytes moved out of the socket staging buffer",
            cs.input_bytes_copied, cs.output_bytes_copied, cs.requests, cs.staged_bytes
        );
        println!("client movers: {}", c.client.mover_stats());
    }
    drop(tensors);
    Ok((samples, inputs))
}

/// The engine called directly: no agent, no transport, no copies.
fn ping_local(a: &Args) -> Result<(Vec<u64>, Inputs), CmdError> {
    let backend: Box<dyn engine::Backend> = if a.model == engine::IdentityBackend::NAME {
        Box::new(engine::IdentityBackend::new())
    } else {
        let m = parse_models(&a.load)?
            .into_iter()
            .find(|m| m.name == a.model)
            .ok_or_else(|| format!("--connect local needs --load {}=PATH.onnx", a.model))?;
        Box::new(engine::OrtBackend::load(
            &m.name,
            &m.path,
            &engine::OrtOptions::default(),
        )?)
    };
    let inputs = make_inputs(a, backend.signature())?;
    let views: Vec<engine::TensorView<'_>> = inputs
        .iter()
        .map(|(d, s, b)| engine::TensorView::new(*d, s, b))
        .collect();
    let samples = time_loop(a, || {
        backend.run(&views)?;
        Ok(())
    })?;
    drop(views);
    Ok((samples, inputs))
}

/// Per-request stage durations (ns), from the client's stamps and the agent's
/// timeline (both `CLOCK_MONOTONIC`, so comparable on one machine).
#[derive(Default)]
struct StageTimes {
    rows: Vec<[u64; 7]>,
}

impl StageTimes {
    const NAMES: [&'static str; 7] = [
        "client → agent (encode, send, wake, header read)",
        "payload into place",
        "checks until queued",
        "queue wait",
        "compute",
        "response build",
        "agent → client (send, wake, read, decode)",
    ];

    fn add(&mut self, start: u64, tl: &wire::Timeline, done: u64) {
        use wire::Stage::*;
        let g = |s| tl.get(s);
        let points = [
            start,
            g(Received),
            g(PayloadInPlace),
            g(Queued),
            g(ComputeStart),
            g(ComputeEnd),
            g(ResponseSent),
            done,
        ];
        let mut row = [0u64; 7];
        for (i, w) in points.windows(2).enumerate() {
            row[i] = w[1].saturating_sub(w[0]);
        }
        self.rows.push(row);
    }

    fn print(&self, warmup: usize) {
        let rows = self.rows.get(warmup..).unwrap_or(&[]);
        if rows.is_empty() {
            return;
        }
        println!("stages (median of {} requests, µs):", rows.len());
        for (i, name) in Self::NAMES.iter().enumerate() {
            let mut v: Vec<u64> = rows.iter().map(|r| r[i]).collect();
            v.sort_unstable();
            println!("  {:<50} {:>8.2}", name, v[v.len() / 2] as f64 / 1e3);
        }
    }
}

/// Runs `warmup + iterations` calls of `call`, timing the last `iterations`.
fn time_loop(
    a: &Args,
    mut call: impl FnMut() -> Result<(), CmdError>,
) -> Result<Vec<u64>, CmdError> {
    sample_loop(a, || {
        let t = Instant::now();
        call()?;
        Ok(t.elapsed().as_nanos() as u64)
    })
}

/// Takes `warmup + iterations` samples (nanoseconds) from `sample`, keeping
/// the last `iterations`.
fn sample_loop(
    a: &Args,
    mut sample: impl FnMut() -> Result<u64, CmdError>,
) -> Result<Vec<u64>, CmdError> {
    let mut samples = Vec::with_capacity(a.iterations.min(1 << 24));
    let mut until = None;
    for i in 0..a.warmup + a.iterations {
        let ns = sample()?;
        if i >= a.warmup {
            samples.push(ns);
            // Read the clock every 1024 samples only: it is a fifth of an
            // shm round trip.
            if let Some(d) = a.duration.filter(|_| samples.len() % 1024 == 1) {
                let end = *until.get_or_insert_with(|| Instant::now() + Duration::from_secs_f64(d));
                if Instant::now() >= end {
                    break;
                }
            }
        }
    }
    Ok(samples)
}

fn print_summary(
    target: &str,
    a: &Args,
    s: &Summary,
    msg_bytes: u64,
    tensor_bytes: u64,
) -> Result<(), CmdError> {
    let what = if a.raw.is_some() {
        "no framework"
    } else if a.control {
        "Ping/Pong, no model"
    } else {
        a.model.as_str()
    };
    if a.json {
        let mut v = serde_json::to_value(s)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("target".into(), target.into());
            if a.control {
                o.insert("control".into(), true.into());
            } else {
                o.insert("model".into(), a.model.clone().into());
            }
            o.insert("tensor_bytes".into(), tensor_bytes.into());
            o.insert("message_bytes".into(), msg_bytes.into());
            o.insert("warmup".into(), a.warmup.into());
            o.insert("placement".into(), placement(a).into());
        }
        println!("{v}");
    } else {
        println!(
            "{target} [{}; {}]: {} round trips of {} B (tensor {} B), warm-up {}: min {:.2} p50 {:.2} p90 {:.2} p99 {:.2} max {:.2} mean {:.2} µs",
            what,
            placement(a),
            s.count,
            msg_bytes,
            tensor_bytes,
            a.warmup,
            s.min_us,
            s.p50_us,
            s.p90_us,
            s.p99_us,
            s.max_us,
            s.mean_us
        );
    }
    Ok(())
}

/// Where this measurement ran, as users should read it beside others: the
/// client's CPUs, the raw echo peer's, and how waits wait.
fn placement(a: &Args) -> String {
    let client = match rustix::thread::sched_getaffinity(None) {
        Ok(m) if m.count() == 1 => format!("client pinned to CPU {}", transport::cpu::current()),
        Ok(m) => format!("client unpinned ({} CPUs)", m.count()),
        Err(_) => "client placement unknown".into(),
    };
    let spin = a.spin_us.unwrap_or(DEFAULT_SPIN_US);
    let wait = if a.raw.as_deref() == Some("shm") {
        "both ends poll".to_string()
    } else if a.raw.is_none() && (a.connect == "local" || a.connect.starts_with("inproc:")) {
        "no waiting: a function call".to_string()
    } else if spin == 0 {
        "waits block".to_string()
    } else if a.raw.is_some() {
        format!("both ends poll {spin} µs, then block")
    } else {
        format!("client polls {spin} µs, then blocks")
    };
    match (a.raw.is_some(), a.peer_cpu) {
        (true, Some(c)) => format!("{client}, echo peer on CPU {c}, {wait}"),
        (true, None) => format!("{client}, echo peer unpinned, {wait}"),
        (false, _) => format!("{client}, {wait}"),
    }
}

/// Runs the raw echo peer.
pub fn run_echo(a: EchoArgs) -> Result<(), CmdError> {
    if let Some(path) = &a.shm {
        return run_shm_echo(path, a.cpu);
    }
    let (kind, addr) = match (a.unix, a.tcp) {
        (Some(p), None) => (RawKind::Unix, p),
        (None, Some(t)) => (RawKind::Tcp, t),
        _ => return Err("raw-echo needs exactly one of --unix PATH or --tcp ADDR".into()),
    };
    if let Some(cpu) = a.cpu {
        pin_to_cpu(cpu)?;
    }
    raw::serve_raw_echo(&EchoOptions {
        kind,
        addr,
        len: a.len.ok_or("raw-echo needs --len")?,
        nodelay: parse_flag01(&a.nodelay, "--nodelay")?,
        split_writes: a.split_writes,
        spin: spin_budget(a.spin_us)?,
    })?;
    Ok(())
}

/// Restricts this process to one CPU.
fn pin_to_cpu(cpu: usize) -> Result<(), CmdError> {
    if cpu >= rustix::thread::CpuSet::MAX_CPU {
        return Err(format!("--cpu {cpu} is out of range").into());
    }
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
        .map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))?;
    Ok(())
}

// --- `ping --raw shm`: the shared-memory floor (see `tensorwire_cli::raw_shm`).

/// `ping --raw shm`: (target, samples, request bytes, tensor bytes). `--size`
/// is ignored: 8 bytes (a sequence number) go each way, no tensor.
fn ping_raw_shm(a: &Args, nodelay: bool) -> Result<(String, Vec<u64>, u64, u64), CmdError> {
    if a.split_writes || !nodelay {
        return Err("--split-writes and --nodelay apply to --raw unix|tcp, not shm".into());
    }
    let opts = ShmOptions {
        iterations: a.iterations,
        warmup: a.warmup,
    };
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("raw-echo");
    if let Some(cpu) = a.peer_cpu {
        cmd.args(["--cpu", &cpu.to_string()]);
    }
    let samples = raw_shm::run_shm_ping(&opts, Some(&cmd))?;
    Ok(("raw-shm".to_string(), samples, 8, 0))
}

/// The `raw-echo --shm PATH` peer: pinned first when asked, so the
/// placement is in force before it reports ready.
fn run_shm_echo(path: &std::path::Path, cpu: Option<usize>) -> Result<(), CmdError> {
    if let Some(cpu) = cpu {
        pin_to_cpu(cpu)?;
    }
    raw_shm::serve_shm_echo(path)?;
    Ok(())
}
