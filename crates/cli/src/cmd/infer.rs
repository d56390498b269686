//! `tensorwire infer`: run a model once on tensors read from .npy files and
//! print (and optionally save) its outputs.
//!
//! `--priority` and `--queue-timeout-ms` go into the request's header
//! (`Model::with_priority`, `Model::with_queue_timeout`): how the agent's
//! queue for the model treats it (`docs/PROTOCOL.md` §12.3). A refusal by
//! the queue (a level the model does not have, a full queue, a timeout
//! spent waiting) fails the command with the agent's message, like any
//! other error.

use super::{connect, parse_models, CmdError, MoverArg, TokenArg, DEFAULT_CONNECT};
use client::{ClientOptions, Stage, TensorRef};
use npy::{read_npy, write_npy, NpyArray};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use wire::DType;

/// Arguments of `infer`.
#[derive(clap::Args)]
pub struct Args {
    /// The agent to use (default: an embedded in-process agent).
    #[arg(long, default_value = DEFAULT_CONNECT)]
    connect: String,
    /// The model to run.
    #[arg(long)]
    model: String,
    /// An input, NAME=FILE.npy (repeatable; names as the model declares them).
    #[arg(long = "input", value_name = "NAME=FILE.npy", required = true)]
    inputs: Vec<String>,
    /// Write each output to DIR/<output name>.npy.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// For the embedded agent (inproc://): models to load, NAME=PATH.onnx.
    #[arg(long = "load", value_name = "NAME=PATH")]
    load: Vec<String>,
    /// Print the agent's per-stage timeline.
    #[arg(long)]
    timeline: bool,
    /// The request's priority level: 1 is the highest, up to the model's
    /// `priority_levels`; 0 = the model's default level. A level the model
    /// does not have is refused (invalid input).
    #[arg(long, value_name = "N", default_value_t = 0)]
    priority: u8,
    /// The longest the request may wait in the agent's queue for the model,
    /// in ms; past it the agent answers `timeout` without computing it.
    /// 0 = the model's default (`queue_timeout_ms` in its config).
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 0,
        value_parser = clap::value_parser!(u64).range(0..=MAX_QUEUE_TIMEOUT_MS)
    )]
    queue_timeout_ms: u64,
    #[command(flatten)]
    token: TokenArg,
    #[command(flatten)]
    mover: MoverArg,
}

/// The longest queue timeout a request header holds (`u32::MAX` µs, ~71 min),
/// in whole ms.
const MAX_QUEUE_TIMEOUT_MS: u64 = u32::MAX as u64 / 1000;

/// Runs `infer`.
pub fn run(a: Args) -> Result<(), CmdError> {
    let mut given: Vec<(String, NpyArray)> = Vec::new();
    for spec in &a.inputs {
        let (name, path) = spec
            .split_once('=')
            .ok_or_else(|| format!("--input takes NAME=FILE.npy, got '{spec}'"))?;
        if given.iter().any(|(n, _)| n == name) {
            return Err(format!("input '{name}' is given twice").into());
        }
        given.push((name.to_string(), read_npy(path.as_ref())?));
    }
    let queue_timeout = Duration::from_millis(a.queue_timeout_ms);
    let defaults = ClientOptions::default();
    let opts = ClientOptions {
        want_timeline: a.timeline,
        // Wait for the agent's answer past the queue timeout asked for, so
        // that a request timing out in the queue is reported as such, not
        // as the client giving up.
        timeout: defaults.timeout + queue_timeout,
        ..defaults
    };
    let uri = a.mover.apply_uri(&a.connect)?;
    let c = connect(&uri, &parse_models(&a.load)?, a.token.apply(opts))?;
    let model = c
        .client
        .model(&a.model)?
        .with_priority(a.priority)
        .with_queue_timeout(queue_timeout);
    let sig = model.signature().clone();
    // Put inputs in the model's order; the identity model takes them as given.
    let ordered: Vec<&NpyArray> = if sig.inputs.is_empty() {
        given.iter().map(|(_, arr)| arr).collect()
    } else {
        let mut by_name: HashMap<&str, &NpyArray> =
            given.iter().map(|(n, arr)| (n.as_str(), arr)).collect();
        let mut v = Vec::new();
        for spec in &sig.inputs {
            v.push(by_name.remove(spec.name.as_str()).ok_or_else(|| {
                format!(
                    "model '{}' needs input '{}' ({}): add --input {}=FILE.npy",
                    sig.name,
                    spec.name,
                    spec.describe(),
                    spec.name
                )
            })?);
        }
        if let Some(extra) = by_name.keys().next() {
            return Err(format!("model '{}' has no input named '{extra}'", sig.name).into());
        }
        v
    };
    let tensors: Vec<TensorRef<'_>> = ordered
        .iter()
        .map(|arr| TensorRef::new(arr.dtype, &arr.shape, &arr.data))
        .collect::<Result<_, _>>()?;
    let t = Instant::now();
    let r = model.infer(&tensors)?;
    let elapsed = t.elapsed();
    println!(
        "model {} via {}: {:.3} ms",
        sig.name,
        c.client.uri(),
        elapsed.as_secs_f64() * 1e3
    );
    for (i, out) in r.outputs.iter().enumerate() {
        let name = sig
            .outputs
            .get(i)
            .map_or_else(|| format!("output{i}"), |s| s.name.clone());
        println!(
            "  {name}: {}{:?} = {}",
            out.dtype,
            out.shape,
            preview(out.dtype, out.bytes())
        );
        if let Some(dir) = &a.output_dir {
            std::fs::create_dir_all(dir)?;
            let file: String = name
                .chars()
                .map(|ch| {
                    if ch.is_ascii_alphanumeric() || ch == '_' || ch == '-' {
                        ch
                    } else {
                        '_'
                    }
                })
                .collect();
            let path = dir.join(format!("{file}.npy"));
            write_npy(&path, out.dtype, &out.shape, out.bytes())?;
            println!("    written to {}", path.display());
        }
    }
    if let Some(m) = r.input_mover {
        println!("  input mover: {m}");
    }
    if let Some(tl) = r.timeline {
        println!("  agent timeline (µs from receipt):");
        let base = tl.get(Stage::Received);
        for s in Stage::ALL {
            let v = tl.get(s);
            if v >= base && v != 0 {
                println!("    {:<18} {:>10.1}", s.name(), (v - base) as f64 / 1e3);
            }
        }
    }
    Ok(())
}

/// The first few elements of a tensor, as text.
fn preview(dtype: DType, bytes: &[u8]) -> String {
    const N: usize = 8;
    let size = dtype.size();
    let count = bytes.len() / size;
    let mut items = Vec::new();
    for chunk in bytes.chunks_exact(size).take(N) {
        let mut b8 = [0u8; 8];
        b8[..size].copy_from_slice(chunk);
        let v = u64::from_le_bytes(b8);
        items.push(match dtype {
            DType::F32 => format!("{:.5}", f32::from_bits(v as u32)),
            DType::F64 => format!("{:.5}", f64::from_bits(v)),
            DType::F16 => format!("{:.4}", half::f16::from_bits(v as u16)),
            DType::BF16 => format!("{:.4}", half::bf16::from_bits(v as u16)),
            DType::I8 => (v as u8 as i8).to_string(),
            DType::I16 => (v as u16 as i16).to_string(),
            DType::I32 => (v as u32 as i32).to_string(),
            DType::I64 => (v as i64).to_string(),
            DType::Bool => (v != 0).to_string(),
            _ => v.to_string(),
        });
    }
    let more = if count > N {
        format!(", … ({count} values)")
    } else {
        String::new()
    };
    format!("[{}{more}]", items.join(", "))
}
