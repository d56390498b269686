//! `tensorwire ping`: round trips through the identity model, or over a bare
//! socket pair (`--raw`) as the floor to compare against in the same run.

use super::{connect, CmdError, DEFAULT_CONNECT};
use client::TensorRef;
use std::process::Command;
use std::time::Instant;
use tensorwire_cli::raw::{self, EchoOptions, RawKind, RawOptions};
use tensorwire_cli::stats::{summarize, Summary};
use wire::{AlignedBuf, DType, DESC_FIXED_LEN, HEADER_LEN};

/// Arguments of `ping`.
#[derive(clap::Args)]
pub struct Args {
    /// The agent to ping (ignored with --raw).
    #[arg(long, default_value = DEFAULT_CONNECT)]
    connect: String,
    /// Measure a bare socket pair instead (no tensorwire code): unix or tcp.
    #[arg(long, value_name = "unix|tcp")]
    raw: Option<String>,
    /// Timed round trips.
    #[arg(short = 'n', long, default_value_t = 10_000)]
    iterations: usize,
    /// Untimed round trips first.
    #[arg(long, default_value_t = 1000)]
    warmup: usize,
    /// Tensor bytes per request (0 = a request with no tensor at all).
    #[arg(long, default_value_t = 0)]
    size: u64,
    /// --raw tcp only: TCP_NODELAY (1) or Nagle (0).
    #[arg(long, default_value = "1", value_name = "0|1")]
    nodelay: String,
    /// --raw only: send each message as two writes (64-byte header, then body).
    #[arg(long)]
    split_writes: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
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
    /// Message length.
    #[arg(long)]
    len: usize,
    /// TCP_NODELAY (1) or not (0).
    #[arg(long, default_value = "1")]
    nodelay: String,
    /// Answer with two writes.
    #[arg(long)]
    split_writes: bool,
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
    let desc = if size == 0 { 0 } else { DESC_FIXED_LEN as u64 + 8 };
    HEADER_LEN as u64 + desc + size
}

/// Runs `ping`.
pub fn run(a: Args) -> Result<(), CmdError> {
    if a.iterations == 0 {
        return Err("-n must be at least 1".into());
    }
    let nodelay = parse_flag01(&a.nodelay, "--nodelay")?;
    let (target, samples) = match &a.raw {
        Some(kind) => {
            let kind = match kind.as_str() {
                "unix" => RawKind::Unix,
                "tcp" => RawKind::Tcp,
                other => return Err(format!("--raw takes unix or tcp, not '{other}'").into()),
            };
            let opts = RawOptions {
                kind,
                iterations: a.iterations,
                warmup: a.warmup,
                msg_len: usize::try_from(request_bytes(a.size))?,
                nodelay,
                split_writes: a.split_writes,
            };
            let mut cmd = Command::new(std::env::current_exe()?);
            cmd.arg("raw-echo");
            let mut name = format!("raw-{kind}");
            if kind == RawKind::Tcp && !nodelay {
                name.push_str("?nodelay=0");
            }
            if a.split_writes {
                name.push_str("+split-writes");
            }
            (name, raw::run_raw_ping(&opts, Some(&cmd))?)
        }
        None => {
            if a.split_writes || !nodelay {
                return Err("--split-writes and --nodelay apply to --raw; for tensorwire use tcp://host:port?nodelay=0".into());
            }
            (a.connect.clone(), ping_tensorwire(&a)?)
        }
    };
    let s = summarize(&samples).ok_or("no samples")?;
    print_summary(&target, &a, &s)
}

fn ping_tensorwire(a: &Args) -> Result<Vec<u64>, CmdError> {
    let c = connect(&a.connect, &[], Default::default())?;
    let model = c.client.model(engine::IdentityBackend::NAME)?;
    let mut data = AlignedBuf::zeroed(usize::try_from(a.size)?)?;
    for (i, b) in data.iter_mut().enumerate() {
        *b = i as u8;
    }
    let shape = [a.size];
    let tensors: Vec<TensorRef<'_>> = if a.size == 0 {
        Vec::new()
    } else {
        vec![TensorRef::new(DType::U8, &shape, &data)?]
    };
    // Check once that the agent echoes what it was sent.
    let first = model.infer(&tensors)?;
    let echoed_ok = match (first.outputs.first(), tensors.first()) {
        (None, None) => true,
        (Some(o), Some(t)) => o.bytes() == t.data,
        _ => false,
    };
    if !echoed_ok {
        return Err("the identity model did not return the tensor it was sent".into());
    }
    let mut samples = Vec::with_capacity(a.iterations);
    for i in 0..a.warmup + a.iterations {
        let t = Instant::now();
        let r = model.infer(&tensors)?;
        let ns = t.elapsed().as_nanos() as u64;
        if r.outputs.len() != tensors.len() {
            return Err("the identity model returned the wrong number of tensors".into());
        }
        if i >= a.warmup {
            samples.push(ns);
        }
    }
    Ok(samples)
}

fn print_summary(target: &str, a: &Args, s: &Summary) -> Result<(), CmdError> {
    if a.json {
        let mut v = serde_json::to_value(s)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("target".into(), target.into());
            o.insert("size_bytes".into(), a.size.into());
            o.insert("message_bytes".into(), request_bytes(a.size).into());
            o.insert("warmup".into(), a.warmup.into());
        }
        println!("{v}");
    } else {
        println!(
            "{target}: {} round trips of {} B (tensor {} B), warm-up {}: min {:.2} p50 {:.2} p90 {:.2} p99 {:.2} max {:.2} mean {:.2} µs",
            s.count,
            request_bytes(a.size),
            a.size,
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

/// Runs the raw echo peer.
pub fn run_echo(a: EchoArgs) -> Result<(), CmdError> {
    let (kind, addr) = match (a.unix, a.tcp) {
        (Some(p), None) => (RawKind::Unix, p),
        (None, Some(t)) => (RawKind::Tcp, t),
        _ => return Err("raw-echo needs exactly one of --unix PATH or --tcp ADDR".into()),
    };
    raw::serve_raw_echo(&EchoOptions {
        kind,
        addr,
        len: a.len,
        nodelay: parse_flag01(&a.nodelay, "--nodelay")?,
        split_writes: a.split_writes,
    })?;
    Ok(())
}
