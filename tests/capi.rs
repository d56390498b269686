//! The C library from C: `libtensorwire.so` (crates/capi) built with cargo,
//! the C example `examples/c/infer_digits.c` and the error-path program
//! `tests/c/capi_errors.c` compiled with the system C compiler (`cc`, or
//! `$CC`) with `-Wall -Wextra -Werror` against the committed header, and
//! run as child processes against a real agent serving the digits model on
//! `shm://`, `unix://` and `tcp://`. The logits they print must match
//! `models/build/digits_mlp_expected.bin`.
//!
//! The header's examples too: every function, type and constant in
//! `tensorwire.h` must have an `Example:` block in its doc comment (written
//! in `crates/capi/src`, copied by cbindgen); they are compiled into one
//! program (each example a function, `#line` pointing into the header) and
//! run against the digits agent over `shm://`, and each must print exactly
//! the `// prints:` lines it shows. A failure names the item.
//!
//! Without a C compiler the tests say so on stderr and skip (the examples'
//! presence is still checked).

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

/// One item of the header (a function, type or constant) and the example
/// in its doc comment.
struct HeaderItem {
    /// The C name (`tw_infer`, `tw_tensor`, `TW_DTYPE_F32`, ...).
    name: String,
    /// The example's code lines, without the comment's ` * `, and the
    /// header line number of the first one; `None` when its comment has no
    /// `Example:` block.
    example: Option<(usize, Vec<String>)>,
}

/// The C name a top-level header line declares, if it declares one: a
/// `#define`, a `typedef` (of an enum, a struct, an opaque struct or an
/// integer) or a function prototype. The include guard is not an item.
fn declared_name(line: &str) -> Option<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    if let Some(rest) = line.strip_prefix("#define ") {
        let name = ident(rest);
        return (name != "TENSORWIRE_H").then_some(name);
    }
    if let Some(rest) = line.strip_prefix("typedef ") {
        // `typedef enum NAME {`, `typedef struct NAME {`, or
        // `typedef ... NAME;`.
        if let Some(open) = rest.strip_suffix(" {") {
            return open.rsplit(' ').next().map(ident);
        }
        return rest
            .strip_suffix(';')
            .and_then(|d| d.rsplit(' ').next())
            .map(ident);
    }
    let (head, _) = line.split_once('(')?;
    let name = ident(head.rsplit([' ', '*']).next()?);
    name.starts_with("tw_").then_some(name)
}

/// Every item the header declares, in order, with its example: the
/// ```` ```c ```` block after a ` * Example:` line of the `/** ... */`
/// comment just above it.
fn header_items(header: &str) -> Vec<HeaderItem> {
    let lines: Vec<&str> = header.lines().collect();
    let mut items = Vec::new();
    let mut example: Option<(usize, Vec<String>)> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line == "/**" {
            // A top-level doc comment: find its example, if any.
            example = None;
            i += 1;
            while i < lines.len() && lines[i] != " */" {
                if lines[i] == " * Example:" && lines.get(i + 1) == Some(&" * ```c") {
                    let first = i + 3; // 1-based number of the first code line
                    let mut code = Vec::new();
                    i += 2;
                    while i < lines.len() && lines[i] != " * ```" {
                        let text = lines[i];
                        let text = text
                            .strip_prefix(" * ")
                            .or_else(|| text.strip_prefix(" *"))
                            .unwrap_or_else(|| panic!("header line {}: {text:?}", i + 1));
                        code.push(text.to_string());
                        i += 1;
                    }
                    example = Some((first, code));
                }
                i += 1;
            }
        } else if line.trim().is_empty() || line.starts_with(' ') {
            // Blank, or inside the header's opening comment, an enum, a
            // struct or a prototype's later lines.
        } else if let Some(name) = declared_name(line) {
            items.push(HeaderItem {
                name,
                example: example.take(),
            });
        } else {
            // Any other top-level line (includes, `extern "C"`, the end
            // of an enum or struct) separates a comment from what follows.
            example = None;
        }
        i += 1;
    }
    items
}

/// The lines an example says it prints (`// prints: TEXT`), in order.
fn expected_prints(code: &[String]) -> Vec<String> {
    code.iter()
        .filter_map(|l| l.trim_start().strip_prefix("// prints: "))
        .map(str::to_string)
        .collect()
}

/// One C program running every example in header order, each in its own
/// function under `#line` directives pointing into the header (so a
/// compiler error or a failed `assert` names the header line), between
/// `==> NAME` and `<== NAME` lines on stdout.
fn examples_program(header: &Path, items: &[HeaderItem]) -> String {
    let mut c = String::from(
        "// Generated by tests/capi.rs from the examples in tensorwire.h.\n\
         #include \"tensorwire.h\"\n\n\
         #undef NDEBUG\n\
         #include <assert.h>\n\
         #include <inttypes.h>\n\
         #include <stdio.h>\n\
         #include <string.h>\n\n",
    );
    let mut calls = String::new();
    for (n, item) in items.iter().enumerate() {
        let Some((first, code)) = &item.example else {
            continue;
        };
        c.push_str(&format!(
            "static void example_{n}(const char *uri, tw_client *client) {{\n    \
             (void)uri;\n    (void)client;\n#line {first} \"{}\"\n",
            header.display()
        ));
        for l in code {
            c.push_str(l);
            c.push('\n');
        }
        c.push_str("}\n\n");
        let name = &item.name;
        calls.push_str(&format!(
            "    printf(\"==> {name}\\n\");\n    fflush(stdout);\n    example_{n}(uri, client);\n    \
             printf(\"<== {name}\\n\");\n    fflush(stdout);\n"
        ));
    }
    c.push_str(
        "int main(int argc, char **argv) {\n    \
         if (argc != 2) {\n        fprintf(stderr, \"usage: %s URI\\n\", argv[0]);\n        return 2;\n    }\n    \
         const char *uri = argv[1];\n    \
         tw_client *client = NULL;\n    \
         if (tw_connect(uri, 30.0, &client) != TW_OK) {\n        \
         fprintf(stderr, \"tw_connect %s: %s\\n\", uri, tw_last_error());\n        return 3;\n    }\n",
    );
    c.push_str(&calls);
    c.push_str(
        "    tw_client_close(client);\n    printf(\"all examples ran\\n\");\n    return 0;\n}\n",
    );
    c
}

/// The items whose example holds header line `line`.
fn items_at_line(items: &[HeaderItem], line: usize) -> Vec<&str> {
    items
        .iter()
        .filter(|it| {
            it.example
                .as_ref()
                .is_some_and(|(first, code)| (*first..first + code.len()).contains(&line))
        })
        .map(|it| it.name.as_str())
        .collect()
}

#[test]
fn every_header_item_has_an_example_that_runs() {
    within(LIMIT, "the header's examples", || {
        let header = repo_root().join("crates/capi/include/tensorwire.h");
        let text = std::fs::read_to_string(&header)
            .unwrap_or_else(|e| panic!("{}: {e}", header.display()));
        let items = header_items(&text);
        // The header's functions, types and constants, as cbindgen writes
        // them: a change in its layout must not make items vanish here.
        for name in [
            "tw_infer",
            "tw_tensor",
            "tw_status",
            "tw_client",
            "TW_MAX_DIMS",
        ] {
            assert!(
                items.iter().any(|it| it.name == name),
                "no item {name} found in the header: did its layout change?"
            );
        }
        let missing: Vec<&str> = items
            .iter()
            .filter(|it| it.example.is_none())
            .map(|it| it.name.as_str())
            .collect();
        assert!(
            missing.is_empty(),
            "header items without an `Example:` ```c block in their doc comment: {missing:?}"
        );
        let Some(cc) = c_compiler() else {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: no C compiler: the header's examples were checked for presence, not run"
            );
            return;
        };
        let lib_dir = build_library().unwrap_or_else(|e| panic!("{e}"));
        let out = lib_dir.join("capi-c");
        std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
        let src = out.join("header_examples.c");
        std::fs::write(&src, examples_program(&header, &items))
            .unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let exe = compile(&cc, &src, &out, &lib_dir).unwrap_or_else(|e| {
            // Name the items whose examples the errors point into.
            let header_name = header.display().to_string();
            let mut names: Vec<&str> = e
                .lines()
                .filter_map(|l| l.strip_prefix(header_name.as_str()))
                .filter_map(|l| l.strip_prefix(':')?.split(':').next()?.parse().ok())
                .flat_map(|line| items_at_line(&items, line))
                .collect();
            names.dedup();
            panic!("the examples of {names:?} do not compile:\n{e}")
        });
        let agent = DigitsAgent::start();
        let (_, uri) = agent
            .uris
            .iter()
            .find(|(t, _)| *t == "shm")
            .expect("an shm:// endpoint");
        let (code, stdout, stderr) = run(&exe, &[uri]);
        let printed: Vec<&str> = stdout.lines().collect();
        let mut at = 0;
        for item in &items {
            let Some((first, code_lines)) = &item.example else {
                continue;
            };
            let name = &item.name;
            let ctx = || {
                format!(
                    "the example of {name} (tensorwire.h line {first}):\n{}\nstdout:\n{stdout}\n\
                     stderr:\n{stderr}",
                    code_lines.join("\n")
                )
            };
            let start = format!("==> {name}");
            assert_eq!(printed.get(at), Some(&start.as_str()), "{}", ctx());
            let end = format!("<== {name}");
            let Some(len) = printed[at + 1..].iter().position(|l| *l == end) else {
                panic!(
                    "the example of {name} did not finish (exit {code:?}): {}",
                    ctx()
                );
            };
            let section = &printed[at + 1..at + 1 + len];
            let expected = expected_prints(code_lines);
            let same = expected.len() == section.len()
                && expected.iter().zip(section).all(|(e, g)| g.trim_end() == e);
            assert!(
                same,
                "the example of {name} printed\n{section:#?}\nwhere its `// prints:` lines \
                 say\n{expected:#?}\n{}",
                ctx()
            );
            at += len + 2;
        }
        assert_eq!(
            printed.get(at),
            Some(&"all examples ran"),
            "{stdout}{stderr}"
        );
        assert_eq!(code, Some(0), "{stdout}{stderr}");
    });
}
