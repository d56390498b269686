//! `tensorwire bench`: each suite runs in `--quick` mode against real agents
//! and real peers (child processes on real sockets and shared memory), and
//! must produce a well-formed `results.json` whose figures are positive and
//! plausible, plus `results.csv`, `report.md` and plots.

use common::tensorwire_command;
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Runs `tensorwire bench ARGS --out DIR --quiet` and returns results.json.
fn run_bench(args: &[&str], dir: &Path, limit: Duration) -> Value {
    let mut child = tensorwire_command()
        .arg("bench")
        .args(args)
        .arg("--out")
        .arg(dir)
        .arg("--quiet")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tensorwire bench");
    let t0 = Instant::now();
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => break,
            None if t0.elapsed() > limit => {
                let _ = child.kill();
                panic!("tensorwire bench {args:?} ran over {limit:?}");
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    eprintln!("bench {args:?} took {:.1?}:\n{stdout}", t0.elapsed());
    let text = std::fs::read_to_string(dir.join("results.json")).expect("results.json");
    serde_json::from_str(&text).expect("results.json parses")
}

fn num(v: &Value, key: &str) -> f64 {
    v.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"))
}

/// Checks the file's shape and that every row's figures are plausible.
fn check_results(r: &Value, dir: &Path) -> Vec<Value> {
    for key in ["command", "commit", "machine", "rows", "started_unix"] {
        assert!(r.get(key).is_some(), "results.json has no {key}");
    }
    assert!(num(&r["machine"], "cpus") >= 1.0);
    let rows = r["rows"].as_array().expect("rows").clone();
    assert!(!rows.is_empty(), "no rows");
    for row in &rows {
        for key in [
            "suite",
            "target",
            "transport",
            "peer",
            "model",
            "clients",
            "requests",
            "p50_us",
            "p99_us",
            "mean_us",
            "throughput_rps",
            "cpu_us_per_req",
            "stages",
        ] {
            assert!(row.get(key).is_some(), "row has no {key}: {row}");
        }
        let (p50, p99, mean) = (num(row, "p50_us"), num(row, "p99_us"), num(row, "mean_us"));
        assert!(num(row, "requests") > 0.0, "no requests: {row}");
        assert!(p50 > 0.0 && p50 < 10e6, "implausible p50: {row}");
        assert!(p99 >= p50, "p99 below p50: {row}");
        assert!(mean > 0.0, "mean: {row}");
        assert!(num(row, "throughput_rps") > 0.0, "throughput: {row}");
        let spread = row["p50_spread_us"].as_array().expect("spread");
        let (lo, hi) = (
            spread[0].as_f64().expect("min"),
            spread[1].as_f64().expect("max"),
        );
        assert!(lo <= p50 && p50 <= hi, "p50 outside its spread: {row}");
        assert!(num(row, "repeats") >= 3.0, "fewer than 3 repeats: {row}");
        if let Some(cpu) = row["cpu_us_per_req"].as_f64() {
            assert!(cpu > 0.0, "CPU per request: {row}");
        }
    }
    for f in ["results.json", "results.csv", "report.md"] {
        let p = dir.join(f);
        assert!(
            p.metadata().map(|m| m.len() > 0).unwrap_or(false),
            "{f} missing or empty"
        );
    }
    let csv = std::fs::read_to_string(dir.join("results.csv")).expect("csv");
    assert_eq!(csv.lines().count(), rows.len() + 1, "one csv line per row");
    rows
}

fn row<'a>(rows: &'a [Value], target: &str, model: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["target"] == target && r["model"] == model)
        .unwrap_or_else(|| panic!("no row for {target} / {model}"))
}

#[test]
fn vaccel_suite_quick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = run_bench(
        &["--suite", "vaccel", "--quick"],
        dir.path(),
        Duration::from_secs(300),
    );
    let rows = check_results(&r, dir.path());
    for t in [
        "in-process",
        "tensorwire inproc",
        "tensorwire shm",
        "tensorwire unix",
        "tensorwire tcp",
        "tensorwire tcp?nodelay=0",
        "raw shm",
        "raw unix",
        "raw tcp",
        "ttrpc unix",
        "ttrpc tcp",
        "ttrpc tcp?nodelay=0",
        "grpc unix",
        "grpc tcp",
        "grpc tcp?nodelay=0",
    ] {
        let x = row(&rows, t, "identity");
        assert_eq!(x["tensor_bytes"], 0, "the empty RPC: {x}");
        let peer = x["peer"].as_bool().expect("peer");
        assert_eq!(
            peer,
            t.starts_with("raw") || t.starts_with("ttrpc") || t.starts_with("grpc")
        );
    }
    // tensorwire reports its stage split; peers do not.
    assert!(!row(&rows, "tensorwire unix", "identity")["stages"]
        .as_array()
        .expect("stages")
        .is_empty());
    assert!(row(&rows, "grpc unix", "identity")["stages"]
        .as_array()
        .expect("stages")
        .is_empty());
    // The classifier table: local and every transport.
    for t in [
        "in-process",
        "tensorwire shm",
        "tensorwire unix",
        "tensorwire tcp",
    ] {
        let x = row(&rows, t, "tweet-classifier");
        assert!(
            num(x, "p50_us") > 100.0,
            "a BERT call takes more than 0.1 ms: {x}"
        );
    }
    let report = std::fs::read_to_string(dir.path().join("report.md")).expect("report");
    assert!(report.contains("ttrpc unix"), "report names the peers");
}

#[test]
fn breakdown_suite_quick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = run_bench(
        &["--suite", "breakdown", "--quick"],
        dir.path(),
        Duration::from_secs(300),
    );
    let rows = check_results(&r, dir.path());
    let models: std::collections::BTreeSet<&str> =
        rows.iter().filter_map(|r| r["model"].as_str()).collect();
    assert!(models.contains("identity") && models.contains("mobilenetv2"));
    let clients: std::collections::BTreeSet<u64> =
        rows.iter().filter_map(|r| r["clients"].as_u64()).collect();
    assert!(clients.len() >= 2, "several client counts: {clients:?}");
    // A real model's compute dominates its stages over shm.
    let x = row(&rows, "tensorwire shm", "mobilenetv2");
    let stages = x["stages"].as_array().expect("stages");
    let compute = stages
        .iter()
        .find(|s| s["stage"] == "compute")
        .expect("compute stage");
    assert!(num(compute, "p50_us") > 100.0, "MobileNetV2 compute: {x}");
    let figures: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "svg"))
        .collect();
    assert!(!figures.is_empty(), "plots were written");
}

#[test]
fn load_suite_quick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = run_bench(
        &["--suite", "load", "--quick"],
        dir.path(),
        Duration::from_secs(300),
    );
    let rows = check_results(&r, dir.path());
    let open: Vec<&Value> = rows.iter().filter(|r| r["load"] == "poisson").collect();
    assert!(open.len() >= 4, "a sweep per target");
    for x in &open {
        assert!(num(x, "rate") > 0.0, "offered load recorded: {x}");
    }
}

/// The tenants suite, shortened to one 1.5 s repeat: every scenario on both
/// transports, the flood refused on the tenants agent and never the light
/// tenant, B's p99 ratio to its solo p99, the report's tables.
#[test]
fn tenants_suite_quick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = run_bench(
        &[
            "--suite",
            "tenants",
            "--quick",
            "--duration",
            "1.5",
            "--repeats",
            "1",
        ],
        dir.path(),
        Duration::from_secs(180),
    );
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 10, "5 rows per transport: {rows:?}");
    let count = |row: &Value, key: &str| {
        row[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} missing or not a count in {row}"))
    };
    for transport in ["shm", "unix"] {
        let find = |scenario: &str, tenant: &str| {
            rows.iter()
                .find(|x| {
                    x["transport"] == transport
                        && x["scenario"] == scenario
                        && x["tenant"] == tenant
                })
                .unwrap_or_else(|| panic!("no row {transport} {scenario} {tenant}"))
        };
        for (scenario, tenant) in [
            ("b-solo", "light"),
            ("a+b tenants", "flood"),
            ("a+b tenants", "light"),
            ("a+b fifo", "flood"),
            ("a+b fifo", "light"),
        ] {
            let row = find(scenario, tenant);
            assert_eq!(row["suite"], "tenants");
            assert!(num(row, "offered_rps") > 0.0, "{row}");
            assert!(num(row, "completed_rps") > 0.0, "{row}");
            assert!(num(row, "capacity_rps") > 0.0, "{row}");
            let (p50, p99) = (num(row, "p50_us"), num(row, "p99_us"));
            assert!(p50 > 0.0 && p99 >= p50, "{row}");
            if tenant == "light" {
                assert_eq!(
                    count(row, "overloaded"),
                    0,
                    "the light tenant refused: {row}"
                );
            }
            if scenario != "b-solo" && tenant == "light" {
                assert!(num(row, "b_p99_ratio") > 0.0, "{row}");
            }
        }
        let flood = find("a+b tenants", "flood");
        assert!(
            num(flood, "offered_rps") > 10.0 * num(find("b-solo", "light"), "offered_rps"),
            "A offers 2x capacity, B 10 %: {flood}"
        );
        assert!(
            count(flood, "overloaded") > 0,
            "max_queued refuses the flood: {flood}"
        );
        assert_eq!(count(find("a+b fifo", "flood"), "overloaded"), 0);
    }
    let report = std::fs::read_to_string(dir.path().join("report.md")).expect("report");
    assert!(report.contains("tenant isolation"), "{report}");
    assert!(
        report.contains("Target *A gets the refusals, not B*"),
        "{report}"
    );
}

/// The client-modes suite: every mode on every transport completes its
/// requests without errors, and the report has its table.
#[test]
fn client_modes_suite_quick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = run_bench(
        &["--suite", "client-modes", "--quick", "--duration", "0.2"],
        dir.path(),
        Duration::from_secs(120),
    );
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(
        rows.len(),
        30,
        "3 transports x 2 models x 5 modes: {rows:?}"
    );
    for net in ["shm", "unix", "tcp"] {
        for model in ["identity", "digits"] {
            for mode in ["sync", "threads", "pipelined", "callback", "future"] {
                let row = row(rows, &format!("tensorwire {net} {mode}"), model);
                assert_eq!(row["suite"], "client-modes");
                assert!(num(row, "requests") > 0.0, "{row}");
                assert_eq!(num(row, "errors"), 0.0, "{row}");
                let (p50, p99) = (num(row, "p50_us"), num(row, "p99_us"));
                assert!(p50 > 0.0 && p99 >= p50, "{row}");
                let depth = if mode == "sync" { 1.0 } else { 8.0 };
                assert_eq!(num(row, "clients"), depth, "{row}");
            }
        }
    }
    let report = std::fs::read_to_string(dir.path().join("report.md")).expect("report");
    assert!(report.contains("| tcp | digits | future | 8 |"), "{report}");
}

/// The agent's KServe front doors as bench targets, beside the tonic peer:
/// identity (empty and 4 KiB, 1 and 2 clients) and LeNet, and an agent
/// already running, reached with `--connect grpc://` and `http://`.
#[test]
fn front_door_targets() {
    let quick = ["--duration", "0.3", "--warmup", "20"];
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = vec![
        "--transports",
        "grpc,http",
        "--peers",
        "grpc",
        "--size",
        "0,4K",
        "--clients",
        "1,2",
    ];
    args.extend(quick);
    let r = run_bench(&args, dir.path(), Duration::from_secs(300));
    let rows = check_results(&r, dir.path());
    for t in ["tensorwire grpc", "tensorwire http"] {
        let x = row(&rows, t, "identity");
        assert_eq!(x["peer"], false, "the front doors are tensorwire: {x}");
        assert_eq!(x["transport"], t.trim_start_matches("tensorwire "));
    }
    // The peer on tcp only (the doors are not transports it has).
    assert!(rows.iter().any(|r| r["target"] == "grpc tcp"));
    assert!(rows.iter().all(|r| r["target"] != "grpc grpc"));
    assert_eq!(
        rows.iter()
            .filter(|r| r["tensor_bytes"] == 4096 && r["clients"] == 2)
            .count(),
        3,
        "every target at 4 KiB with 2 clients: {rows:?}"
    );
    let report = std::fs::read_to_string(dir.path().join("report.md")).expect("report");
    assert!(
        report.contains("tensorwire grpc / grpc tcp"),
        "the report compares the gRPC door with the peer"
    );

    // A real model through both doors: inputs named as the model declares
    // them, or the door would refuse the request.
    let model = format!("lenet={}", common::built("lenet_digits.onnx").display());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = vec!["--model", &model, "--transports", "grpc,http"];
    args.extend(quick);
    let rows = check_results(
        &run_bench(&args, dir.path(), Duration::from_secs(300)),
        dir.path(),
    );
    for t in ["tensorwire grpc", "tensorwire http"] {
        assert!(num(row(&rows, t, "lenet"), "p50_us") > 0.0);
    }

    // --connect to the doors of an agent already running.
    let agent = common::ServeProcess::spawn(&[
        "--listen",
        "grpc://127.0.0.1:0",
        "--listen",
        "http://127.0.0.1:0",
    ]);
    for scheme in ["grpc://", "http://"] {
        let uri = agent
            .uris
            .iter()
            .find(|u| u.starts_with(scheme))
            .unwrap_or_else(|| panic!("no {scheme} door in {:?}", agent.uris));
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args = vec!["--connect", uri.as_str(), "--size", "1K"];
        args.extend(quick);
        let rows = check_results(
            &run_bench(&args, dir.path(), Duration::from_secs(120)),
            dir.path(),
        );
        assert_eq!(rows[0]["target"], format!("tensorwire @ {uri}"));
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    for (args, want) in [
        (vec!["--suite", "nope"], "unknown suite"),
        (vec!["--transports", "vsock"], "unknown transport"),
        (vec!["--peers", "zmq"], "unknown peer"),
        (vec!["--clients", "0"], "--clients"),
        (vec!["--size", "12Q"], "size"),
        (vec!["--rate", "0"], "rate"),
        (vec!["--model", "/nonexistent.onnx"], "not a file"),
    ] {
        let out = tensorwire_command()
            .arg("bench")
            .args(&args)
            .args(["--duration", "0.1", "--quiet"])
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: expected '{want}' in: {err}");
    }
}
