//! The tweet classifier (issue 4) end to end, against the real model,
//! tokenizer and sample that `scripts/setup.sh` builds and the repository
//! ships: Rust token ids equal the Python `tokenizers` ones for every sample
//! line; `tensorwire classify --compare` over real agents (embedded, Unix
//! socket and TCP child processes) gives bit-identical predictions and
//! logits to the engine called directly; a running agent gives the same;
//! bad and edge-case inputs fail (or pass) with clear messages.
//!
//! Missing model files fail these tests with a message saying to run
//! `bash scripts/setup.sh`; nothing is skipped.

use classifier::compare::{self, Workload};
use classifier::{agents::AgentSpec, run, Labels, TextTokenizer};
use common::{built, repo_root, tensorwire_bin, tensorwire_command, within, ServeProcess};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn model() -> PathBuf {
    let m = built("tweet_classifier.onnx");
    built("tweet_classifier.json");
    m
}

fn tokenizer() -> PathBuf {
    built("minilm_tokenizer.json")
}

/// A file shipped in the repository (fails the test when it is missing).
fn shipped(rel: &str) -> PathBuf {
    let p = repo_root().join(rel);
    assert!(p.is_file(), "{} is missing from the checkout", p.display());
    p
}

fn tweets() -> PathBuf {
    shipped("examples/classifier/tweets.txt")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// The environment variable marking each `classify` run of these tests:
/// the agents it starts inherit it, so any left behind can be found.
const MARK_VAR: &str = "TENSORWIRE_CLASSIFY_TEST_MARK";

static RUN_SEQ: AtomicU64 = AtomicU64::new(0);

/// Runs the binary with `args` in directory `cwd`; then checks that no
/// process it started is still running (no agent left behind).
fn run_in(cwd: &Path, args: &[&str]) -> (ExitStatus, String, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let cwd = cwd.to_path_buf();
    let what = format!("tensorwire {} (in {})", args.join(" "), cwd.display());
    let mark = format!(
        "pid{}-run{}",
        std::process::id(),
        RUN_SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let env_mark = mark.clone();
    let result = within(LIMIT, &what.clone(), move || {
        let out = tensorwire_command()
            .args(&args)
            .current_dir(&cwd)
            .env(MARK_VAR, env_mark)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    });
    let left = processes_marked(&format!("{MARK_VAR}={mark}"));
    assert!(
        left.is_empty(),
        "processes left running by classify: {left:?}"
    );
    result
}

fn classify(args: &[&str]) -> (ExitStatus, String, String) {
    let mut all = vec!["classify"];
    all.extend_from_slice(args);
    run_in(&repo_root(), &all)
}

/// The command lines of running processes whose environment holds `var`
/// (`NAME=VALUE`).
fn processes_marked(var: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|v| v == var.as_bytes()) {
            let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(String::from_utf8_lossy(&cmd).replace('\0', " "));
        }
    }
    found
}

#[test]
fn token_ids_equal_python_tokenizers_for_every_sample_line() {
    let tok = TextTokenizer::load(&tokenizer()).expect("tokenizer");
    let vectors = shipped("examples/classifier/tweets.tokens.json");
    let text = std::fs::read_to_string(&vectors).expect("read token vectors");
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text).expect("token vectors JSON");
    let lines = run::read_lines(&tweets()).expect("sample");
    assert_eq!(
        entries.len(),
        lines.len(),
        "{} has a vector per non-blank line of tweets.txt",
        vectors.display()
    );
    let ids = |v: &serde_json::Value, k: &str| -> Vec<i64> {
        v[k].as_array()
            .unwrap_or_else(|| panic!("{k} is not a list in {v}"))
            .iter()
            .map(|x| x.as_i64().expect("integer id"))
            .collect()
    };
    for (i, (e, line)) in entries.iter().zip(&lines).enumerate() {
        let t = e["text"].as_str().expect("text");
        assert_eq!(
            t, line.text,
            "entry {i} is not line {} of tweets.txt",
            line.number
        );
        let enc = tok.encode(t, line.number).expect("encode");
        assert_eq!(
            enc.input_ids,
            ids(e, "input_ids"),
            "input_ids of line {}: {t}",
            line.number
        );
        assert_eq!(
            enc.attention_mask,
            ids(e, "attention_mask"),
            "attention_mask of {t}"
        );
        assert_eq!(
            enc.token_type_ids,
            ids(e, "token_type_ids"),
            "token_type_ids of {t}"
        );
        assert!(enc.len() < 128, "no line is padded (to 128): {t}");
    }
}

#[test]
fn over_long_input_is_truncated_like_python_at_512() {
    let tok = TextTokenizer::load(&tokenizer()).expect("tokenizer");
    let text = (0..2000)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let e = tok.encode(&text, 7).expect("encode");
    assert_eq!(e.len(), 512);
    assert_eq!(e.input_ids.first(), Some(&101), "[CLS]");
    assert_eq!(
        e.input_ids.last(),
        Some(&102),
        "[SEP] kept after truncation"
    );
    assert!(
        e.truncated_from.is_some_and(|n| n > 2000),
        "{:?}",
        e.truncated_from
    );
}

/// The crate's own comparison, on real agents: the embedded one, and
/// `tensorwire serve` children on a Unix socket and TCP loopback. Every
/// logit is compared bit for bit here, not only by the command.
#[test]
fn compare_inproc_unix_tcp_bit_identical_to_local() {
    let model = model();
    let tok = TextTokenizer::load(&tokenizer()).expect("tokenizer");
    let labels = Labels::for_model(&model).expect("labels");
    assert_eq!(
        labels.names(),
        ["offensive-language", "hate-speech", "neither"],
        "label order in the sidecar"
    );
    let lines = run::read_lines(&tweets()).expect("sample");
    assert!(
        lines.len() >= 50,
        "the sample has ~100 lines, got {}",
        lines.len()
    );
    let w = Workload {
        tokenizer: &tok,
        labels: &labels,
        lines: &lines,
        agent: AgentSpec {
            model_name: "classifier".into(),
            model_path: model.clone(),
            intra_threads: 2,
            intra_spinning: false,
            serve_exe: tensorwire_bin(),
            spin_us: None,
        },
        timelines: true,
    };
    let local = compare::run_local(&w).expect("local run");
    assert_eq!(local.lines.len(), lines.len());
    for spec in compare::parse_list("inproc,shm,unix,tcp").expect("list") {
        let r = compare::run_config(&spec, &w).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        assert_eq!(r.lines.len(), local.lines.len(), "{}", spec.name);
        for (a, b) in local.lines.iter().zip(&r.lines) {
            assert_eq!(a.prediction, b.prediction, "{} line {}", spec.name, a.line);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&a.logits),
                bits(&b.logits),
                "{} line {}: logits {:?} vs local {:?}",
                spec.name,
                a.line,
                b.logits,
                a.logits
            );
            assert_eq!(b.logits.len(), 3);
            let st = b
                .stages
                .unwrap_or_else(|| panic!("{}: no timeline", spec.name));
            assert!(st.compute_ns > 0, "{}: {st:?}", spec.name);
        }
        assert!(compare::first_difference(&local, &r).is_none());
    }
}

#[test]
fn classify_compare_command_reports_identical_and_leaves_no_agent() {
    let m = model();
    let t = tokenizer();
    let f = tweets();
    let (st, out, err) = classify(&[
        "-m",
        s(&m),
        "-t",
        s(&t),
        "-f",
        s(&f),
        "--compare",
        "inproc,shm,unix,tcp",
        "--json",
    ]);
    assert!(
        st.success(),
        "classify --compare failed: {st}\nstdout:\n{out}\nstderr:\n{err}"
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("--json output is not a JSON list ({e}):\n{out}"));
    let configs: Vec<&str> = rows
        .iter()
        .map(|r| r["config"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(configs, ["local", "inproc", "shm", "unix", "tcp"]);
    let n = run::read_lines(&f).expect("sample").len();
    for r in &rows {
        assert_eq!(r["identical"], true, "{r}");
        for k in [
            "first_ms",
            "avg_ms",
            "median_ms",
            "p99_ms",
            "tax_ms",
            "tax_pct",
            "client_cpu_us",
            "cpu_us",
            "cpu_vs_local",
        ] {
            assert!(r[k].is_number(), "{k} in {r}");
        }
        for k in ["median_spread_ms", "tax_spread_ms", "tax_pct_spread"] {
            let v = r[k].as_array().unwrap_or_else(|| panic!("{k} in {r}"));
            assert!(v.len() == 2 && v[0].as_f64() <= v[1].as_f64(), "{k} in {r}");
        }
        assert_eq!(r["passes"], 3, "the default --repeats: {r}");
        assert_eq!(r["lines"], n - classifier::WARMUP_LINES, "{r}");
        let p50 = r["median_ms"].as_f64().unwrap_or(0.0);
        assert!(
            p50 > 0.0 && r["p99_ms"].as_f64().unwrap_or(0.0) >= p50,
            "{r}"
        );
        // Child agents report their own CPU; local and inproc run here.
        let child = !matches!(r["config"].as_str(), Some("local" | "inproc"));
        assert_eq!(r["agent_cpu_us"].is_number(), child, "{r}");
    }
    assert_eq!(rows[0]["tax_ms"], 0.0);
    assert_eq!(rows[0]["cpu_vs_local"], 1.0);

    // The text table, from another directory with the default paths
    // (found through the checkout the binary was built from).
    let dir = tempfile::tempdir().expect("tempdir");
    let (st, out, err) = run_in(
        dir.path(),
        &[
            "classify",
            "-f",
            "examples/classifier/tweets.txt",
            "--compare",
            "inproc",
            "--repeats",
            "1",
            "--stages",
        ],
    );
    assert!(st.success(), "{st}\nstdout:\n{out}\nstderr:\n{err}");
    assert!(out.starts_with("Processing "), "{out}");
    assert!(err.contains("pass 1/1 done"), "{err}");
    for needle in [
        "configuration",
        "local",
        "inproc",
        "median",
        "tax",
        "cpu/line",
        "×local",
        "1 passes",
        "yes",
        "tokenize",
        "compute",
    ] {
        assert!(out.contains(needle), "'{needle}' missing:\n{out}");
    }
}

#[test]
fn single_run_prints_each_line_and_the_average() {
    let m = model();
    let t = tokenizer();
    let f = tweets();
    let n = run::read_lines(&f).expect("sample").len();
    let (st, out, err) = classify(&["-m", s(&m), "-t", s(&t), "-f", s(&f)]);
    assert!(st.success(), "{st}\n{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        format!("Processing {n} lines from: {}", f.display())
    );
    assert_eq!(lines.len(), n + 2, "{out}");
    for l in &lines[1..=n] {
        assert!(l.starts_with("Line ") && l.contains(": Duration: "), "{l}");
        assert!(
            ["offensive-language", "hate-speech", "neither"]
                .iter()
                .any(|p| l.ends_with(&format!(" ms Prediction: {p}"))),
            "{l}"
        );
    }
    let avg = lines[n + 1];
    assert!(
        avg.starts_with("Average (after 4th iteration): ") && avg.ends_with(" ms"),
        "{avg}"
    );
}

/// `--connect` to a running agent (child process on a Unix socket) gives
/// the same predictions and logits as the engine called directly.
#[test]
fn a_running_agent_gives_the_local_results() {
    let m = model();
    let t = tokenizer();
    let f = tweets();
    let agent = ServeProcess::spawn(&["--model", &format!("classifier={}", m.display())]);
    let uri = agent.uris[0].clone();
    let json = |connect: &str| -> serde_json::Value {
        let (st, out, err) = classify(&[
            "-m",
            s(&m),
            "-t",
            s(&t),
            "-f",
            s(&f),
            "--connect",
            connect,
            "--json",
        ]);
        assert!(st.success(), "--connect {connect}: {st}\n{out}\n{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let remote = json(&uri);
    let local = json("local");
    assert_eq!(remote["config"], uri.as_str());
    assert_eq!(local["config"], "local");
    let lines = |v: &serde_json::Value| v["lines"].as_array().expect("lines").clone();
    let (r, l) = (lines(&remote), lines(&local));
    assert_eq!(r.len(), l.len());
    for (a, b) in r.iter().zip(&l) {
        assert_eq!(a["line"], b["line"]);
        assert_eq!(a["prediction"], b["prediction"], "line {}", a["line"]);
        assert_eq!(a["logits"], b["logits"], "line {}", a["line"]);
    }

    // A wrong model name says how to serve it.
    let (st, _, err) = classify(&[
        "-m",
        s(&m),
        "-t",
        s(&t),
        "-f",
        s(&f),
        "--connect",
        &uri,
        "--model-name",
        "tweets",
    ]);
    assert!(!st.success());
    assert!(
        err.contains("'tweets'") && err.contains("--model-name"),
        "{err}"
    );
}

#[test]
fn missing_or_corrupt_model_is_named() {
    let t = tokenizer();
    let f = tweets();
    let dir = tempfile::tempdir().expect("tempdir");
    let sidecar = r#"{"labels": ["offensive-language", "hate-speech", "neither"]}"#;

    let missing = dir.path().join("nope.onnx");
    for extra in [
        &[][..],
        &["--compare", "unix"][..],
        &["--connect", "local"][..],
    ] {
        let mut args = vec!["-m", s(&missing), "-t", s(&t), "-f", s(&f)];
        args.extend_from_slice(extra);
        let (st, out, err) = classify(&args);
        assert!(!st.success(), "{extra:?}: {out}");
        assert!(err.contains("nope.onnx"), "{extra:?}: {err}");
        assert!(out.is_empty(), "nothing printed before the error: {out}");
    }

    let bad = dir.path().join("bad.onnx");
    std::fs::write(&bad, b"this is not an ONNX model").expect("write");
    std::fs::write(dir.path().join("bad.json"), sidecar).expect("write");
    for extra in [
        &[][..],
        &["--compare", "inproc,unix"][..],
        &["--connect", "local"][..],
    ] {
        let mut args = vec!["-m", s(&bad), "-t", s(&t), "-f", s(&f)];
        args.extend_from_slice(extra);
        let (st, _, err) = classify(&args);
        assert!(!st.success(), "{extra:?}");
        assert!(err.contains("bad.onnx"), "{extra:?}: {err}");
    }

    // The model is there but its labels sidecar is not.
    let lonely = dir.path().join("lonely.onnx");
    std::fs::copy(model(), &lonely).expect("copy model");
    let (st, _, err) = classify(&["-m", s(&lonely), "-t", s(&t), "-f", s(&f)]);
    assert!(!st.success());
    assert!(
        err.contains("lonely.json") && err.contains("labels"),
        "{err}"
    );
}

#[test]
fn missing_or_corrupt_tokenizer_is_named() {
    let m = model();
    let f = tweets();
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no_tokenizer.json");
    let (st, out, err) = classify(&["-m", s(&m), "-t", s(&missing), "-f", s(&f)]);
    assert!(!st.success(), "{out}");
    assert!(
        err.contains("no_tokenizer.json") && err.contains("tokenizer"),
        "{err}"
    );

    let bad = dir.path().join("broken_tokenizer.json");
    std::fs::write(
        &bad,
        b"{\"version\": \"1.0\", \"model\": {\"type\": \"WordPiece\"",
    )
    .expect("write");
    let (st, _, err) = classify(&["-m", s(&m), "-t", s(&bad), "-f", s(&f), "--compare", "unix"]);
    assert!(!st.success());
    assert!(err.contains("broken_tokenizer.json"), "{err}");
}

#[test]
fn empty_file_says_so_and_succeeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty.txt");
    for body in ["", "\n\n   \n\t\n"] {
        std::fs::write(&empty, body).expect("write");
        let (st, out, err) = classify(&["-f", s(&empty)]);
        assert!(st.success(), "{st}: {err}");
        assert_eq!(
            out.trim(),
            format!("No lines to classify in {}", empty.display())
        );
        assert!(err.is_empty(), "{err}");
        let (st, out, err) = classify(&["-f", s(&empty), "--compare", "inproc,unix", "--json"]);
        assert!(st.success(), "{st}: {err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains("No lines to classify"), "{err}");
    }
    let (st, _, err) = classify(&["-f", s(&dir.path().join("absent.txt"))]);
    assert!(!st.success());
    assert!(err.contains("absent.txt"), "{err}");
}

#[test]
fn an_over_long_line_is_truncated_with_a_warning_and_classified() {
    let m = model();
    let t = tokenizer();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("long.txt");
    let long = (0..2000)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    std::fs::write(
        &file,
        format!("a perfectly normal tweet\n\n{long}\nanother one\n"),
    )
    .expect("write");
    let (st, out, err) = classify(&["-m", s(&m), "-t", s(&t), "-f", s(&file)]);
    assert!(st.success(), "{st}\n{out}\n{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("line 3") && warnings[0].contains("truncated to 512"),
        "{err}"
    );
    assert!(out.contains("Processing 3 lines"), "{out}");
    assert!(out.contains("Line 3: Duration: "), "{out}");
    assert!(out.contains("Line 4: Duration: "), "{out}");
    assert!(out.contains("Average (after 4th iteration): n/a"), "{out}");
}

#[test]
fn unbuilt_transports_are_refused_by_name() {
    for (list, words) in [
        ("inproc,rdma", "rdma transport is not built yet"),
        ("vsock", "vsock transport is not among the configurations"),
    ] {
        let (st, out, err) = classify(&["-f", "/nonexistent.txt", "--compare", list]);
        assert!(!st.success(), "{out}");
        assert!(err.contains(words), "{err}");
    }
}
