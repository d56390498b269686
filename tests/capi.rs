//! The C library from C: `libtensorwire.so` (crates/capi) built with cargo,
//! the C example `examples/c/infer_digits.c` and the error-path program
//! `tests/c/capi_errors.c` compiled with the system C compiler (`cc`, or
//! `$CC`) with `-Wall -Wextra -Werror` against the committed header, and
//! run as child processes against a real agent serving the digits model on
//! `shm://`, `unix://` and `tcp://`. The logits they print must match
//! `models/build/digits_mlp_expected.bin`.
//!
//! Without a C compiler the tests say so on stderr and skip.

use common::{built, digits_expected, digits_model, repo_root, shm_dir, within};
use server::{Agent, AgentConfig, ModelConfig};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use transport::Endpoint;

const LIMIT: Duration = Duration::from_secs(600);

/// The compiled C programs.
struct CPrograms {
    infer_digits: PathBuf,
    capi_errors: PathBuf,
}

/// The C compiler to use: `$CC`, else `cc`.
fn c_compiler_name() -> String {
    std::env::var("CC")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "cc".into())
}

/// The C compiler, if `CC --version` runs.
fn c_compiler() -> Option<String> {
    let cc = c_compiler_name();
    let ok = Command::new(&cc)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(cc)
}

/// The C programs, built once per test process; `None` (after saying so
/// on stderr, past the test harness's capture) when there is no C
/// compiler.
fn programs() -> Option<&'static CPrograms> {
    static BUILT: OnceLock<Result<Option<CPrograms>, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let Some(cc) = c_compiler() else {
            return Ok(None);
        };
        let lib_dir = build_library()?;
        let out = lib_dir.join("capi-c");
        std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        let root = repo_root();
        Ok(Some(CPrograms {
            infer_digits: compile(&cc, &root.join("examples/c/infer_digits.c"), &out, &lib_dir)?,
            capi_errors: compile(&cc, &root.join("tests/c/capi_errors.c"), &out, &lib_dir)?,
        }))
    });
    match built {
        Ok(Some(p)) => Some(p),
        Ok(None) => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: no C compiler (`{} --version` failed): the C library tests did not \
                 run; install gcc or clang, or set CC",
                c_compiler_name()
            );
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Builds `libtensorwire.so` for this test's profile with `cargo build -p
/// tensorwire-capi` (a no-op when up to date) and returns the directory
/// holding it.
fn build_library() -> Result<PathBuf, String> {
    let dir = common::cargo_build(&["-p", "tensorwire-capi", "--lib"])?;
    let lib = dir.join("libtensorwire.so");
    if lib.is_file() {
        Ok(dir)
    } else {
        Err(format!("built, but {} does not exist", lib.display()))
    }
}

/// Compiles one C file against the header and the library into `out`.
fn compile(cc: &str, src: &Path, out: &Path, lib_dir: &Path) -> Result<PathBuf, String> {
    let stem = src
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| format!("bad source path {}", src.display()))?;
    let exe = out.join(stem);
    let mut cmd = Command::new(cc);
    cmd.args([
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Wpedantic",
        "-Werror",
        "-O1",
    ])
    .arg("-I")
    .arg(repo_root().join("crates/capi/include"))
    .arg(src)
    .arg("-o")
    .arg(&exe)
    .arg("-L")
    .arg(lib_dir)
    .arg("-ltensorwire")
    .arg(format!("-Wl,-rpath,{}", lib_dir.display()));
    let what = format!("{cc} {}", src.display());
    let r = run_bounded(cmd, Duration::from_secs(120), &what)?;
    if !r.status.success() {
        return Err(format!(
            "{what} failed ({}):\n{}{}",
            r.status,
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        ));
    }
    Ok(exe)
}

/// Runs `cmd` to completion (its output in temporary files, so that no
/// pipe can fill up), killing it after `limit`.
fn run_bounded(mut cmd: Command, limit: Duration, what: &str) -> Result<Output, String> {
    let io = |e: std::io::Error| format!("{what}: {e}");
    let mut out = tempfile::tempfile().map_err(io)?;
    let mut err = tempfile::tempfile().map_err(io)?;
    let mut child = cmd
        .stdout(out.try_clone().map_err(io)?)
        .stderr(err.try_clone().map_err(io)?)
        .spawn()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait().map_err(io)? {
            Some(s) => break s,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what}: still running after {limit:?}"));
            }
        }
    };
    let read = |f: &mut std::fs::File| -> Result<Vec<u8>, String> {
        f.seek(SeekFrom::Start(0)).map_err(io)?;
        let mut b = Vec::new();
        f.read_to_end(&mut b).map_err(io)?;
        Ok(b)
    };
    Ok(Output {
        status,
        stdout: read(&mut out)?,
        stderr: read(&mut err)?,
    })
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// An agent in this process serving `digits` on a fresh `shm://` name, a
/// Unix socket and TCP loopback.
struct DigitsAgent {
    _agent: Agent,
    _dir: tempfile::TempDir,
    /// `(transport, uri)` for shm, unix and tcp.
    uris: Vec<(&'static str, String)>,
}

impl DigitsAgent {
    fn start() -> DigitsAgent {
        shm_dir();
        let dir = tempfile::tempdir().expect("temporary directory");
        let name = format!(
            "tw-capi-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let cfg = AgentConfig {
            listen: vec![
                Endpoint::Shm(name),
                Endpoint::Unix(dir.path().join("a.sock")),
                Endpoint::parse("tcp://127.0.0.1:0").expect("tcp endpoint"),
            ],
            models: vec![ModelConfig::new("digits", digits_model())],
            ..AgentConfig::default()
        };
        let agent = Agent::start(cfg).unwrap_or_else(|e| {
            panic!(
                "agent did not start: {e}\n(if a model failed: {})",
                common::SETUP_HINT
            )
        });
        let uris = agent
            .endpoints()
            .iter()
            .map(|ep| {
                let t = match ep {
                    Endpoint::Shm(_) => "shm",
                    Endpoint::Unix(_) => "unix",
                    Endpoint::Tcp { .. } => "tcp",
                    Endpoint::Tls { .. } => "tls",
                    Endpoint::Inproc(_) => "inproc",
                    Endpoint::Vsock { .. } => "vsock",
                };
                (t, ep.to_string())
            })
            .collect();
        DigitsAgent {
            _agent: agent,
            _dir: dir,
            uris,
        }
    }
}

/// Runs a C program with `args`; returns (exit code, stdout, stderr).
fn run(program: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null());
    let what = format!("{} {}", program.display(), args.join(" "));
    let out = run_bounded(cmd, Duration::from_secs(60), &what).unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `row N: logits ... argmax K` lines: the logits and argmax per row.
fn parse_rows(stdout: &str) -> Vec<(Vec<f32>, usize)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("row "))
        .map(|l| {
            let (_, rest) = l.split_once(": logits ").expect("row line");
            let (logits, argmax) = rest.split_once(" argmax ").expect("argmax");
            let logits = logits
                .split_whitespace()
                .map(|v| v.parse().unwrap_or_else(|e| panic!("logit {v}: {e}")))
                .collect();
            (logits, argmax.trim().parse().expect("argmax index"))
        })
        .collect()
}

fn argmax(xs: &[f32]) -> usize {
    xs.iter()
        .enumerate()
        .fold(0, |best, (i, &x)| if x > xs[best] { i } else { best })
}

#[test]
fn the_c_example_runs_digits_on_every_transport() {
    within(LIMIT, "the C example", || {
        let Some(p) = programs() else { return };
        let agent = DigitsAgent::start();
        let input = built("digits_mlp_input.bin");
        let input = input.to_str().expect("UTF-8 path");
        let expected = digits_expected();
        assert_eq!(agent.uris.len(), 3, "{:?}", agent.uris);
        for (transport, uri) in &agent.uris {
            let (code, stdout, stderr) = run(&p.infer_digits, &[uri, input]);
            let ctx = format!("{transport}: stdout:\n{stdout}\nstderr:\n{stderr}");
            assert_eq!(code, Some(0), "{ctx}");
            assert!(
                stdout.contains("model digits: 1 input(s), 1 output(s)"),
                "{ctx}"
            );
            assert!(stdout.contains("input  0: x float32[?, 64]"), "{ctx}");
            assert!(stdout.contains("output 0: logits float32[?, 10]"), "{ctx}");
            let rows = parse_rows(&stdout);
            assert_eq!(rows.len(), 4, "{ctx}");
            for (r, (logits, best)) in rows.iter().enumerate() {
                let want = &expected[r * 10..r * 10 + 10];
                assert_eq!(logits.len(), 10, "{ctx}");
                for (got, want) in logits.iter().zip(want) {
                    assert!(
                        (got - want).abs() <= 1e-5,
                        "row {r}: {got} vs {want}\n{ctx}"
                    );
                }
                assert_eq!(*best, argmax(want), "row {r} argmax\n{ctx}");
            }
            assert!(stdout.contains("same logits from both inputs"), "{ctx}");
            if *transport == "shm" {
                assert!(
                    stdout.contains("plain input: 1024 input bytes copied"),
                    "{ctx}"
                );
                assert!(
                    stdout.contains(
                        "tw_alloc input: in the shared-memory arena, 0 input bytes copied"
                    ),
                    "the arena input was copied\n{ctx}"
                );
            } else {
                assert!(
                    stdout.contains("tw_alloc input: in ordinary memory, 0 input bytes copied"),
                    "{ctx}"
                );
            }
        }
    });
}

#[test]
fn the_c_example_prints_the_last_error_and_fails() {
    within(LIMIT, "the C example's errors", || {
        let Some(p) = programs() else { return };
        let agent = DigitsAgent::start();
        let input = built("digits_mlp_input.bin");
        let input = input.to_str().expect("UTF-8 path");
        let (code, stdout, stderr) = run(&p.infer_digits, &["bogus://nowhere", input]);
        assert_eq!(code, Some(1), "{stdout}{stderr}");
        assert!(
            stderr.contains("tw_connect failed (TW_ERR_CONNECT): cannot connect: bad endpoint"),
            "{stderr}"
        );
        let (_, unix) = agent.uris.iter().find(|(t, _)| *t == "unix").expect("unix");
        let (code, stdout, stderr) = run(&p.infer_digits, &[unix, input, "nope"]);
        assert_eq!(code, Some(1), "{stdout}{stderr}");
        assert!(
            stderr.contains("tw_model_lookup failed (TW_ERR_UNKNOWN_MODEL): unknown model:"),
            "{stderr}"
        );
        assert!(stderr.contains("'nope'"), "{stderr}");
        let (code, _, stderr) = run(&p.infer_digits, &[unix]);
        assert_eq!(code, Some(2), "usage: {stderr}");
    });
}

#[test]
fn the_c_error_paths_report_their_codes() {
    within(LIMIT, "the C error paths", || {
        let Some(p) = programs() else { return };
        let agent = DigitsAgent::start();
        for (transport, uri) in &agent.uris {
            let (code, stdout, stderr) = run(&p.capi_errors, &[uri]);
            let ctx = format!("{transport}: stdout:\n{stdout}\nstderr:\n{stderr}");
            assert_eq!(code, Some(0), "{ctx}");
            assert!(!stdout.contains("FAIL"), "{ctx}");
            for line in [
                "ok   bad uri: TW_ERR_CONNECT: cannot connect: ",
                "ok   unknown model: TW_ERR_UNKNOWN_MODEL: unknown model: no model named 'no-such-model'",
                "ok   wrong input shape: TW_ERR_INVALID_INPUT: invalid input: model 'digits' input 'x' \
                 must be float32[?, 64], got float32[4, 63]",
                "ok   output buffer too small: TW_ERR_BUFFER_TOO_SMALL: buffer too small: output 0 \
                 (float32[4, 10]) is 160 bytes, its buffer holds 16",
                "ok   needed size reported",
                "ok   wait again, big enough: TW_OK",
                "0 failure(s)",
            ] {
                assert!(stdout.contains(line), "missing `{line}`\n{ctx}");
            }
        }
    });
}
