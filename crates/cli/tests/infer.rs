//! `tensorwire infer --priority N --queue-timeout-ms MS`: the flags reach
//! the agent in the request header, and the agent's refusal of a level the
//! model does not have fails the command with the agent's message.
//!
//! Runs the built binary (`CARGO_BIN_EXE_tensorwire`): against the embedded
//! agent (`inproc://`, the identity model: one level), and against a
//! `tensorwire serve --config` child whose digits model has two levels.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use wire::DType;

const LIMIT: Duration = Duration::from_secs(60);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file under `models/build/`; fails (never skips) when it is missing.
fn built(name: &str) -> PathBuf {
    let p = repo_root().join("models/build").join(name);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup.sh first",
        p.display()
    );
    p
}

fn tensorwire() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensorwire"));
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs `tensorwire ARGS` to completion (killed past [`LIMIT`]).
fn run(args: &[&str]) -> Output {
    let mut child = tensorwire()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tensorwire");
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tensorwire {} took over {LIMIT:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A `float32[2]` .npy file in `dir`.
fn small_npy(dir: &Path) -> PathBuf {
    let path = dir.join("x.npy");
    let bytes: Vec<u8> = [1.5f32, 2.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    npy::write_npy(&path, DType::F32, &[2], &bytes).expect("write x.npy");
    path
}

#[test]
fn a_priority_the_model_does_not_have_fails_with_the_agents_message() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let x = small_npy(dir.path());
    let input = format!("x={}", x.display());
    let out = run(&[
        "infer",
        "--model",
        "identity",
        "--input",
        &input,
        "--priority",
        "9",
    ]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "priority 9 accepted: {stderr}");
    assert!(stderr.contains("priority 9"), "{stderr}");
    assert!(stderr.contains("invalid input"), "{stderr}");
    assert!(
        !text(&out.stdout).contains("output0"),
        "{}",
        text(&out.stdout)
    );

    // The identity model's one level, named or by default, with a queue
    // timeout: the request runs.
    for prio in ["0", "1"] {
        let out = run(&[
            "infer",
            "--model",
            "identity",
            "--input",
            &input,
            "--priority",
            prio,
            "--queue-timeout-ms",
            "250",
        ]);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "priority {prio}: {}",
            text(&out.stderr)
        );
        assert!(
            stdout.contains("output0: float32[2] = [1.50000, 2.50000]"),
            "priority {prio}: {stdout}"
        );
    }

    // Values the header cannot carry are refused before anything runs.
    for bad in [
        "--priority=256",
        "--priority=-1",
        "--queue-timeout-ms=4294968",
        "--queue-timeout-ms=-5",
    ] {
        let out = run(&["infer", "--model", "identity", "--input", &input, bad]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        let flag = bad.split('=').next().unwrap();
        assert!(stderr.contains(flag), "{bad}: {stderr}");
    }
}

/// A `tensorwire serve` child, killed when dropped.
struct Serve {
    child: Child,
    uri: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tensorwire serve --config DIR/agent.toml` (listening on a Unix
/// socket in `dir`) and waits for its `listening on` line.
fn serve(dir: &Path, model_toml: &str) -> Serve {
    let sock = dir.join("s.sock");
    let uri = format!("unix://{}", sock.display());
    let toml = format!("listen = [\"{uri}\"]\n\n{model_toml}");
    let config = dir.join("agent.toml");
    std::fs::write(&config, toml).expect("write agent.toml");
    let log = std::fs::File::create(dir.join("serve.log")).expect("log");
    let mut child = tensorwire()
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn tensorwire serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let serve = Serve { child, uri };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with("listening on ") => return serve,
            Ok(_) => {}
            Err(_) => panic!(
                "tensorwire serve printed no `listening on` line within 30 s; its log:\n{}",
                std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
            ),
        }
    }
}

#[test]
fn priorities_reach_a_served_model_with_two_levels() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let model = built("digits_mlp.onnx");
    let agent = serve(
        dir.path(),
        &format!(
            "[[model]]\nname = \"digits\"\npath = \"{}\"\npriority_levels = 2\n\
             queue_timeout_ms = 5000\n",
            model.display()
        ),
    );
    // The digits input: raw f32 [4, 64], as a .npy file.
    let raw = std::fs::read(built("digits_mlp_input.bin")).expect("digits input");
    assert_eq!(raw.len(), 4 * 64 * 4);
    let x = dir.path().join("digits.npy");
    npy::write_npy(&x, DType::F32, &[4, 64], &raw).expect("write digits.npy");
    let input = format!("x={}", x.display());

    let mut logits = Vec::new();
    for (prio, timeout) in [("1", "1000"), ("2", "0"), ("0", "20")] {
        let out_dir = dir.path().join(format!("out-{prio}"));
        let out_arg = out_dir.display().to_string();
        let out = run(&[
            "infer",
            "--connect",
            &agent.uri,
            "--model",
            "digits",
            "--input",
            &input,
            "--priority",
            prio,
            "--queue-timeout-ms",
            timeout,
            "--output-dir",
            &out_arg,
        ]);
        assert!(
            out.status.success(),
            "priority {prio}: {}",
            text(&out.stderr)
        );
        logits.push(std::fs::read(out_dir.join("logits.npy")).expect("logits.npy"));
    }
    assert!(
        logits.windows(2).all(|w| w[0] == w[1]),
        "the same outputs at every level"
    );

    let out = run(&[
        "infer",
        "--connect",
        &agent.uri,
        "--model",
        "digits",
        "--input",
        &input,
        "--priority",
        "3",
    ]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "priority 3 accepted: {stderr}");
    assert!(stderr.contains("priority 3"), "{stderr}");
    assert!(
        stderr.contains("..= 2"),
        "names the model's levels: {stderr}"
    );
}
