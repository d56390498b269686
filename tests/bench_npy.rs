//! `tensorwire bench --model PATH.onnx --input NAME=FILE.npy`: a real model
//! benchmarked on inputs read from a `.npy` file, in the engine called
//! directly and over a real Unix socket to a `tensorwire serve` child; the
//! file decides the shape (here a batch of 2 where the model's batch is
//! dynamic). A file of the wrong shape, or `--input` without an ONNX model,
//! must fail before anything is measured, with a message naming the input.

use common::{built, run_bin};
use serde_json::Value;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use wire::DType;

/// LeNet's input, as `models/build/lenet_digits.json` declares it:
/// `x: float32[batch, 1, 8, 8]`.
const INPUT: &str = "x";

/// Runs `tensorwire bench ARGS --quiet` (bounded by `limit`); returns
/// (status, stdout, stderr).
fn bench(args: &[&str], limit: Duration) -> (ExitStatus, String, String) {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.push("--quiet");
    run_bin(&all, limit)
}

/// Writes `x` as float32 of `shape`, pixel values 0..16 like the digits.
fn write_input(path: &Path, shape: &[u64]) {
    let n: u64 = shape.iter().product();
    let data: Vec<u8> = (0..n)
        .flat_map(|i| ((i % 17) as f32).to_le_bytes())
        .collect();
    npy::write_npy(path, DType::F32, shape, &data).expect("write .npy");
}

fn num(v: &Value, key: &str) -> f64 {
    v.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"))
}

/// The common arguments: LeNet in-process and over unix, briefly.
fn fast_args<'a>(model: &'a str, input: &'a str) -> Vec<&'a str> {
    vec![
        "--model",
        model,
        "--input",
        input,
        "--transports",
        "local,unix",
        "--requests",
        "50",
        "--warmup",
        "5",
        "--duration",
        "2",
        "--repeats",
        "1",
        "--intra-threads",
        "1",
    ]
}

#[test]
fn bench_sends_inputs_from_npy_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = built("lenet_digits.onnx");
    let model = model.to_str().expect("utf-8 model path");
    let file = dir.path().join("x.npy");
    write_input(&file, &[2, 1, 8, 8]);
    let input = format!("{INPUT}={}", file.display());
    let out_dir = dir.path().join("out");
    let out_str = out_dir.to_str().expect("utf-8 temp path");

    let mut args = fast_args(model, &input);
    args.extend(["--out", out_str]);
    let t0 = Instant::now();
    let (status, stdout, stderr) = bench(&args, Duration::from_secs(60));
    assert!(
        status.success(),
        "bench {args:?} failed: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    eprintln!("bench with a .npy input took {:.1?}", t0.elapsed());

    let text = std::fs::read_to_string(out_dir.join("results.json")).expect("results.json");
    let r: Value = serde_json::from_str(&text).expect("results.json parses");
    assert!(
        r["command"]
            .as_str()
            .is_some_and(|c| c.contains("--input") && c.contains("x.npy")),
        "the command line records the input file: {}",
        r["command"]
    );
    let rows = r["rows"].as_array().expect("rows");
    let targets: Vec<&str> = rows.iter().filter_map(|x| x["target"].as_str()).collect();
    assert_eq!(targets.len(), 2, "one row per target: {targets:?}");
    assert!(targets.contains(&"in-process") && targets.contains(&"tensorwire unix"));
    for row in rows {
        assert_eq!(row["model"], "lenet_digits", "the served name: {row}");
        // The file's shape, not the signature's: f32[2, 1, 8, 8].
        assert_eq!(
            row["tensor_bytes"],
            2 * 64 * 4,
            "bytes from the file: {row}"
        );
        assert!(num(row, "requests") > 0.0, "requests: {row}");
        assert_eq!(num(row, "errors"), 0.0, "errors: {row}");
        let p50 = num(row, "p50_us");
        assert!(p50 > 0.0 && p50 < 10e6, "implausible p50: {row}");
        assert!(num(row, "p99_us") >= p50, "p99 below p50: {row}");
        assert!(num(row, "throughput_rps") > 0.0, "throughput: {row}");
    }
    assert!(out_dir.join("report.md").is_file(), "report.md written");
}

#[test]
fn wrong_npy_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = built("lenet_digits.onnx");
    let model = model.to_str().expect("utf-8 model path");
    let file = dir.path().join("wide.npy");
    write_input(&file, &[1, 1, 8, 9]);
    let input = format!("{INPUT}={}", file.display());

    let (status, _, err) = bench(&fast_args(model, &input), Duration::from_secs(60));
    assert!(!status.success(), "a [1, 1, 8, 9] input must be refused");
    for want in ["input 'x'", "wide.npy", "dimension 3 must be 8"] {
        assert!(err.contains(want), "expected '{want}' in: {err}");
    }

    // `--input` without an ONNX model (the default identity model).
    let (status, _, err) = bench(
        &["--input", &input, "--duration", "0.1"],
        Duration::from_secs(30),
    );
    assert!(!status.success(), "--input with identity must fail");
    assert!(
        err.contains("--input needs an ONNX model"),
        "expected a clear error in: {err}"
    );
}
