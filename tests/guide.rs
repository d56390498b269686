//! `docs/GUIDE.md`, held to the code it describes.
//!
//! - Its runnable blocks (fenced ```` ```sh run ```` or ```` ```python run
//!   ````) run in document order, each in its own `bash -euo pipefail` (or
//!   the venv's Python), from one scratch directory holding links to
//!   `models/` and `examples/`, with the freshly built `tensorwire` and
//!   `.venv/bin` first on `PATH` and a private `TENSORWIRE_SHM_DIR`. The
//!   page's fixed loopback ports are replaced by free ones (as the KServe
//!   page's runner, `python/tests/test_kserve_docs.py`, does). Agents the
//!   blocks start in the background are stopped by the page's last block;
//!   every block's process group is killed at the end regardless. A block
//!   that fails or outlives its bound fails the test, printing the block,
//!   its output and the tails of the agents' logs. Every other `sh` or
//!   `python` block must say why it is not run (`not-run: REASON`).
//! - The ```` ```rust ```` block is the source of [`predict`] below, byte
//!   for byte, and is run against a real agent.
//! - The configuration reference lists exactly the keys the agent's TOML
//!   accepts (read from its own "unknown field" errors), each default given
//!   parses to the agent's default, and the flags match `tensorwire serve
//!   --help` both ways (defaults too).
//! - The error tables list every wire status, every `ClientError` variant,
//!   every C `TW_*` code and every Python exception, and nothing else.

// guide:rust:begin
use client::{Client, ClientError, ClientOptions, TensorRef};
use std::time::Duration;

/// Runs the digits model on one row of zeros and returns the predicted digit.
fn predict(uri: &str) -> Result<usize, ClientError> {
    let opts = ClientOptions {
        timeout: Duration::from_secs(5),
        want_timeline: true,
        ..ClientOptions::default()
    };
    let c = Client::connect_with(uri, opts)?;
    for info in c.models()? {
        println!("model {} (id {})", info.signature.name, info.id);
    }
    let digits = c.model("digits")?;
    let x = vec![0f32; 64];
    let out = digits.infer(&[TensorRef::from_slice(&[1, 64], &x)?])?;
    let logits: Vec<f32> = out.outputs[0].to_vec()?;
    if let Some(t) = &out.timeline {
        println!("agent timeline: {t:?}");
    }
    match c.model("no-such-model") {
        Err(ClientError::UnknownModel(msg)) => println!("as expected: {msg}"),
        other => println!("unexpected: {:?}", other.map(|_| ())),
    }
    let best = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b]));
    Ok(best.unwrap_or(0))
}
// guide:rust:end

use common::{digits_model, repo_root, run_bin, tensorwire_bin, TestAgent, SETUP_HINT};
use server::{AgentConfig, ModelConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// The page, as compiled into this test (a change to it rebuilds the test).
const GUIDE: &str = include_str!("../docs/GUIDE.md");

/// The longest one block may run.
const BLOCK_LIMIT: Duration = Duration::from_secs(90);

/// The page's loopback ports, each replaced by a free one before a block runs.
const PAGE_PORTS: [&str; 3] = ["127.0.0.1:7070", "127.0.0.1:7071", "127.0.0.1:8000"];

/// One fenced block of the page.
struct Block {
    /// 1-based line of its opening fence.
    line: usize,
    /// The first word of the info string (`sh`, `python`, `rust`, ...).
    lang: String,
    /// The rest of the info string (`run`, `not-run: REASON`, or nothing).
    marker: String,
    code: String,
}

impl Block {
    fn runs(&self) -> bool {
        self.marker == "run"
    }
}

/// Every fenced block of `text`, in order.
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, String, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match open.take() {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    let (lang, marker) = info.split_once(' ').unwrap_or((info, ""));
                    open = Some((i + 1, lang.into(), marker.trim().into(), String::new()));
                }
            }
            Some((start, lang, marker, mut code)) => {
                if line == "```" {
                    out.push(Block {
                        line: start,
                        lang,
                        marker,
                        code,
                    });
                } else {
                    code.push_str(line);
                    code.push('\n');
                    open = Some((start, lang, marker, code));
                }
            }
        }
    }
    assert!(open.is_none(), "GUIDE.md: a fenced block is never closed");
    out
}

/// The text between `<!-- NAME:begin -->` and `<!-- NAME:end -->`.
fn section<'a>(text: &'a str, name: &str) -> &'a str {
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    let start = text
        .find(&begin)
        .unwrap_or_else(|| panic!("GUIDE.md has no `{begin}` marker"))
        + begin.len();
    let len = text[start..]
        .find(&end)
        .unwrap_or_else(|| panic!("GUIDE.md has no `{end}` marker"));
    &text[start..start + len]
}

/// The body rows of the markdown table in `text` (header and rule
/// skipped), each split into trimmed cells (`\|` is a pipe inside a cell).
fn table_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.replace("\\|", "\u{0}")
                .trim_matches('|')
                .split('|')
                .map(|c| c.replace('\u{0}', "|").trim().to_string())
                .collect()
        })
        .collect()
}

/// The code spans (text between backticks) of a cell.
fn spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The only code span of a cell; panics naming the row otherwise.
fn one_span<'a>(cell: &'a str, row: &[String]) -> &'a str {
    match spans(cell)[..] {
        [s] => s,
        _ => panic!("GUIDE.md: `{cell}` should be one code span, in row {row:?}"),
    }
}

/// Kills every process group started by the runner when dropped (the
/// agents the blocks left running, if the page's last block did not stop
/// them, or a block failed first).
struct Groups(Vec<i32>);

impl Drop for Groups {
    fn drop(&mut self) {
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            for &g in &self.0 {
                // SAFETY: kill(2) on a process group this test created; no
                // memory is shared.
                unsafe { libc::kill(-g, sig) };
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            // SAFETY: as above, signal 0 only checks whether the group exists.
            while self.0.iter().any(|&g| unsafe { libc::kill(-g, 0) } == 0)
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// `n` distinct loopback ports nothing listens on right now. All are held
/// bound until every one is chosen, so the kernel cannot hand out the same
/// port twice (a released ephemeral port is often the next one given).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound port's address").port())
        .collect()
}

/// The last lines of every agent log (`*.out`, `*.err`) in `dir`.
fn log_tails(dir: &Path) -> String {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    let mut s = String::new();
    for p in names {
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
        if ext == "out" || ext == "err" {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            s += &format!("--- {} (last 15 lines)\n{tail}\n", p.display());
        }
    }
    s
}

#[test]
fn every_runnable_block_runs_against_real_agents() {
    let all = blocks(GUIDE);
    for b in &all {
        if matches!(b.lang.as_str(), "sh" | "python") && !b.runs() {
            let reason = b.marker.strip_prefix("not-run:").map(str::trim);
            assert!(
                reason.is_some_and(|r| !r.is_empty()),
                "GUIDE.md line {}: a ```{} block is either `run` or `not-run: REASON`, not `{}`",
                b.line,
                b.lang,
                b.marker
            );
        }
    }
    let runnable: Vec<&Block> = all.iter().filter(|b| b.runs()).collect();
    assert!(
        runnable.len() >= 10,
        "GUIDE.md: only {} runnable blocks found (the marker is ```sh run)",
        runnable.len()
    );
    let root = repo_root();
    let venv_bin = root.join(".venv/bin");
    let python = venv_bin.join("python");
    assert!(
        python.exists(),
        "{} is missing: {SETUP_HINT}",
        python.display()
    );
    digits_model();
    let bin = tensorwire_bin();
    let bin_dir = bin.parent().expect("the binary's directory");

    let scratch = tempfile::tempdir().expect("a scratch directory");
    let work = scratch.path().join("work");
    let shm = scratch.path().join("shm");
    std::fs::create_dir(&work).expect("work dir");
    std::fs::create_dir(&shm).expect("shm dir");
    for link in ["models", "examples"] {
        std::os::unix::fs::symlink(root.join(link), work.join(link)).expect("link into work dir");
    }
    let path = format!(
        "{}:{}:{}",
        bin_dir.display(),
        venv_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let ports: Vec<(&str, String)> = PAGE_PORTS
        .iter()
        .zip(free_ports(PAGE_PORTS.len()))
        .map(|(p, port)| (*p, format!("127.0.0.1:{port}")))
        .collect();

    let mut groups = Groups(Vec::new());
    let started = Instant::now();
    for (i, b) in runnable.iter().enumerate() {
        let mut code = b.code.clone();
        for (page, ours) in &ports {
            code = code.replace(page, ours);
        }
        let (program, script): (&Path, _) = match b.lang.as_str() {
            "sh" => (Path::new("bash"), work.join(format!(".block{i}.sh"))),
            "python" => (&python, work.join(format!(".block{i}.py"))),
            other => panic!("GUIDE.md line {}: cannot run a ```{other} block", b.line),
        };
        std::fs::write(&script, &code).expect("write the block");
        let out_path = work.join(format!(".block{i}.stdout"));
        let err_path = work.join(format!(".block{i}.stderr"));
        let mut cmd = Command::new(program);
        if b.lang == "sh" {
            cmd.args(["-euo", "pipefail"]);
        }
        // Output goes to files, not pipes: agents a block leaves running
        // inherit them, and a pipe would stay open until they exit.
        cmd.arg(&script)
            .current_dir(&work)
            .env("PATH", &path)
            .env("TENSORWIRE_SHM_DIR", &shm)
            .env_remove("TENSORWIRE_TOKEN")
            .stdin(Stdio::null())
            .stdout(File::create(&out_path).expect("stdout file"))
            .stderr(File::create(&err_path).expect("stderr file"))
            .process_group(0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        let pid = i32::try_from(child.id()).expect("a pid");
        groups.0.push(pid);
        let deadline = Instant::now() + BLOCK_LIMIT;
        let status = loop {
            match child.try_wait().expect("wait for the block") {
                Some(s) => break Some(s),
                None if Instant::now() >= deadline => break None,
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        let what = match status {
            Some(s) if s.success() => {
                println!(
                    "GUIDE.md line {} ok ({:.1} s)\n{stdout}",
                    b.line,
                    started.elapsed().as_secs_f64()
                );
                continue;
            }
            Some(s) => format!("failed ({s})"),
            None => {
                let _ = child.kill();
                format!("still running after {BLOCK_LIMIT:?}")
            }
        };
        panic!(
            "GUIDE.md line {}: the ```{} block {what}:\n{code}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n{}",
            b.line,
            b.lang,
            log_tails(&work)
        );
    }
    println!(
        "{} blocks ran in {:.1} s",
        runnable.len(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn the_rust_block_is_the_compiled_example_and_runs() {
    let rust: Vec<Block> = blocks(GUIDE)
        .into_iter()
        .filter(|b| b.lang == "rust")
        .collect();
    assert_eq!(rust.len(), 1, "GUIDE.md should have one ```rust block");
    let src = include_str!("guide.rs");
    let begin = "// guide:rust:begin\n";
    let start = src.find(begin).expect("the begin marker") + begin.len();
    let len = src[start..]
        .find("// guide:rust:end")
        .expect("the end marker");
    assert_eq!(
        rust[0].code,
        &src[start..start + len],
        "GUIDE.md line {}: the ```rust block must be the code between the guide:rust markers \
         of tests/guide.rs, which is compiled and run; copy one into the other",
        rust[0].line
    );
    let agent = TestAgent::start(&[("digits", &digits_model())]);
    let mut answers = BTreeSet::new();
    for (name, uri) in agent.all_uris() {
        let digit = predict(&uri).unwrap_or_else(|e| panic!("the example over {name}: {e}"));
        assert!(digit < 10, "{name}: digit {digit}");
        answers.insert(digit);
    }
    assert_eq!(answers.len(), 1, "transports disagree: {answers:?}");
}

/// The fields a TOML table of the agent's config accepts, read from the
/// "unknown field" error its parser gives for `toml` (which must add a key
/// `zz_not_a_key` to that table); `None` when the error is not that one.
fn accepted_fields(toml: &str) -> Option<Vec<String>> {
    let e = AgentConfig::from_toml(toml).err()?.to_string();
    if !e.contains("unknown field `zz_not_a_key`") {
        return None;
    }
    let list = e.split("expected ").nth(1)?;
    let list = list.strip_prefix("one of ").unwrap_or(list);
    let fields: Vec<String> = list
        .lines()
        .next()
        .unwrap_or("")
        .split(", ")
        .filter_map(|f| f.trim().strip_prefix('`')?.split('`').next())
        .map(String::from)
        .collect();
    (!fields.is_empty()).then_some(fields)
}

/// A `[[model]]` table with its required keys, for `extra` to be added to.
fn model_toml(extra: &str) -> String {
    format!("[[model]]\nname = \"m\"\npath = \"m.onnx\"\n{extra}\n")
}

/// Every key of the agent's TOML, as the guide's first column spells it:
/// `key`, `[table] key` or `[[model]] key`.
fn schema_keys() -> BTreeSet<String> {
    let top = accepted_fields("zz_not_a_key = 1").expect(
        "the agent's config no longer names the fields it accepts in its unknown-field error; \
         tests/guide.rs reads the schema from it",
    );
    let mut keys = BTreeSet::new();
    for k in top {
        if let Some(fields) = accepted_fields(&format!("[{k}]\nzz_not_a_key = 1")) {
            keys.extend(fields.iter().map(|f| format!("[{k}] {f}")));
        } else if k == "model" {
            let fields = accepted_fields(&model_toml("zz_not_a_key = 1"))
                .expect("the [[model]] table's fields");
            keys.extend(fields.iter().map(|f| format!("[[model]] {f}")));
        } else {
            keys.insert(k);
        }
    }
    keys
}

/// `key = value` placed in the key's table (the guide's spelling of `key`).
fn toml_setting(key: &str, value: &str) -> String {
    if let Some(field) = key.strip_prefix("[[model]] ") {
        model_toml(&format!("{field} = {value}"))
    } else if let Some((table, field)) = key.split_once("] ") {
        format!("{table}]\n{field} = {value}\n")
    } else {
        format!("{key} = {value}\n")
    }
}

/// Flags of `tensorwire serve --help` and the `[default: X]` each shows.
fn serve_flags() -> BTreeMap<String, Option<String>> {
    // Built first: run_bin's time limit is for running it, not building it.
    tensorwire_bin();
    let (status, help, _) = run_bin(&["serve", "--help"], Duration::from_secs(60));
    assert!(status.success(), "tensorwire serve --help: {status}");
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let t = line.trim_start();
        let t = t.strip_prefix("-h, ").unwrap_or(t);
        if line.starts_with("  ") && t.starts_with("--") && line.len() - t.len() <= 6 {
            let name: String = t
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            flags.insert(name.clone(), None);
            current = Some(name);
        }
        if let (Some(flag), Some(rest)) = (&current, t.split("[default: ").nth(1)) {
            let value = rest.split(']').next().unwrap_or("").to_string();
            flags.insert(flag.clone(), Some(value));
        }
    }
    flags.remove("--help");
    assert!(
        flags.len() >= 20,
        "could not read serve's flags from --help:\n{help}"
    );
    flags
}

#[test]
fn the_config_reference_matches_the_agent() {
    let rows = table_rows(section(GUIDE, "config-reference"));
    let mut listed = BTreeSet::new();
    let mut flags_listed = BTreeSet::new();
    let default_model = format!("{:?}", ModelConfig::new("m", "m.onnx"));
    let default_cfg = format!("{:?}", AgentConfig::default());
    for row in &rows {
        assert_eq!(row.len(), 4, "GUIDE.md config row: {row:?}");
        let key = one_span(&row[0], row).to_string();
        assert!(listed.insert(key.clone()), "GUIDE.md lists {key} twice");
        flags_listed.extend(
            spans(&row[1])
                .into_iter()
                .filter(|s| s.starts_with("--"))
                .map(String::from),
        );
        let default = row[2].as_str();
        if default == "required" {
            let field = key.strip_prefix("[[model]] ").unwrap_or_else(|| {
                panic!("GUIDE.md: only [[model]] keys can be required, not {key}")
            });
            let without: String = model_toml("")
                .lines()
                .filter(|l| !l.starts_with(&format!("{field} = ")))
                .map(|l| format!("{l}\n"))
                .collect();
            assert!(
                AgentConfig::from_toml(&without).is_err(),
                "GUIDE.md says {key} is required, but the agent takes a model without it"
            );
        } else if default == "unset" {
            // No value equals leaving it out; nothing to parse.
        } else {
            let value = one_span(default, row);
            let text = toml_setting(&key, value);
            let cfg = AgentConfig::from_toml(&text).unwrap_or_else(|e| {
                panic!("GUIDE.md: the default of {key}, `{value}`, does not parse: {e}\n{text}")
            });
            let (got, want) = if key.starts_with("[[model]]") {
                (format!("{:?}", cfg.models[0]), &default_model)
            } else {
                (format!("{cfg:?}"), &default_cfg)
            };
            assert_eq!(
                &got, want,
                "GUIDE.md: {key} = {value} is not the agent's default (fix the default column)"
            );
        }
    }
    let schema = schema_keys();
    let missing: Vec<_> = schema.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&schema).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "GUIDE.md's configuration reference does not match the agent's TOML \
         (crates/server/src/config.rs): keys missing from the guide {missing:?}, keys the \
         agent does not accept {unknown:?}"
    );

    let help = serve_flags();
    for row in table_rows(section(GUIDE, "serve-flags")) {
        let flag = one_span(&row[0], &row).to_string();
        let shown = help.get(&flag).unwrap_or_else(|| {
            panic!("GUIDE.md lists `serve {flag}`, which `tensorwire serve --help` does not have")
        });
        let default = (row[1] != "—").then(|| one_span(&row[1], &row).to_string());
        assert_eq!(
            &default, shown,
            "GUIDE.md: the default of serve {flag} is not the one --help shows"
        );
        flags_listed.insert(flag);
    }
    for flag in &flags_listed {
        assert!(
            help.contains_key(flag),
            "GUIDE.md names `serve {flag}`, which `tensorwire serve --help` does not have"
        );
    }
    let undocumented: Vec<_> = help.keys().filter(|f| !flags_listed.contains(*f)).collect();
    assert!(
        undocumented.is_empty(),
        "`tensorwire serve` has flags GUIDE.md does not describe: {undocumented:?} (add them to \
         the configuration reference or the serve-flags table)"
    );
}

/// The variants of `pub enum NAME` in `src` (lines indented four spaces
/// that start with an upper-case identifier).
fn enum_variants(src: &str, name: &str) -> BTreeSet<String> {
    let head = format!("pub enum {name} {{");
    let body = src
        .split(&head)
        .nth(1)
        .and_then(|b| b.split("\n}").next())
        .unwrap_or_else(|| panic!("no `{head}` found"));
    body.lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(|l| {
            l.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// The `TW_*` codes of the C header's status enum.
fn c_codes() -> BTreeSet<String> {
    let header = std::fs::read_to_string(repo_root().join("crates/capi/include/tensorwire.h"))
        .expect("crates/capi/include/tensorwire.h");
    header
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" = ")?;
            (name.starts_with("TW_") && rest.trim_end_matches(',').parse::<u32>().is_ok())
                .then(|| name.to_string())
        })
        .collect()
}

/// The exception classes of the Python package (`class X(Base): ...`
/// where Base is `Exception` or one of them), as `tw.X`.
fn python_exceptions() -> BTreeSet<String> {
    let stub = std::fs::read_to_string(repo_root().join("python/tensorwire/_native.pyi"))
        .expect("python/tensorwire/_native.pyi");
    let mut found = BTreeSet::from(["Exception".to_string()]);
    for line in stub.lines() {
        let Some(decl) = line.strip_prefix("class ") else {
            continue;
        };
        let Some((name, rest)) = decl.split_once('(') else {
            continue;
        };
        let base = rest.split(')').next().unwrap_or("");
        if found.contains(base) {
            found.insert(name.to_string());
        }
    }
    found.remove("Exception");
    found.into_iter().map(|n| format!("tw.{n}")).collect()
}

#[test]
fn the_error_tables_list_every_status_and_error_kind() {
    let wire_rows = table_rows(section(GUIDE, "errors-wire"));
    let client_rows = table_rows(section(GUIDE, "errors-client"));
    let mut listed_status = BTreeSet::new();
    for row in &wire_rows {
        assert_eq!(row.len(), 7, "GUIDE.md wire error row: {row:?}");
        let code: u32 = row[0]
            .parse()
            .unwrap_or_else(|_| panic!("GUIDE.md: wire code `{}` is not a number", row[0]));
        listed_status.insert((code, one_span(&row[1], row).to_string()));
    }
    let statuses: BTreeSet<(u32, String)> = (0..=u32::from(u16::MAX))
        .filter_map(wire::Status::from_code)
        .map(|s| (s.code(), s.name().to_string()))
        .collect();
    assert_eq!(
        listed_status, statuses,
        "GUIDE.md's wire error table must list every wire::Status (code, name), and no other"
    );

    // (column in the wire table, column in the client table, the kinds there are)
    let client_src = std::fs::read_to_string(repo_root().join("crates/client/src/error.rs"))
        .expect("crates/client/src/error.rs");
    let kinds = [
        (
            "Rust ClientError",
            2,
            0,
            enum_variants(&client_src, "ClientError"),
        ),
        ("C tw_status", 4, 2, c_codes()),
        ("Python exception", 3, 1, python_exceptions()),
    ];
    for (what, wire_col, client_col, real) in kinds {
        let listed: BTreeSet<String> = wire_rows
            .iter()
            .map(|r| &r[wire_col])
            .chain(client_rows.iter().map(|r| &r[client_col]))
            .filter(|c| c.as_str() != "—")
            .map(|c| one_span(c, std::slice::from_ref(c)).to_string())
            .collect();
        let missing: Vec<_> = real.difference(&listed).collect();
        let unknown: Vec<_> = listed.difference(&real).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "GUIDE.md's error tables vs the {what}s: missing {missing:?}, not existing {unknown:?}"
        );
    }
}
