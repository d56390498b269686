//! Comparing configurations: the same lines through the engine called
//! directly (`local`, the reference) and through agents on each transport,
//! checking that every prediction and every logit is bit-identical to
//! `local`, and tabulating first-inference time, average time and the RPC
//! tax.
//!
//! Configuration names (`--compare` list items): `inproc`, `unix`, `tcp`,
//! `tcp?nodelay=0` (Nagle on; `tcp?nodelay=1` is `tcp`). `local` is always
//! the first row and may be listed or not. `vsock` and `rdma` are refused
//! with an error naming them: those transports are not built yet.

use crate::agents::{AgentSpec, RunningAgent, Transport};
use crate::labels::Labels;
use crate::run::{self, InputLine, LocalTarget, RemoteTarget, RunReport, Stages};
use crate::tokenize::TextTokenizer;
use crate::ClassifierError;
use client::ClientOptions;
use serde::Serialize;
use std::fmt::Write as _;

/// The name of the reference configuration: the engine in this process.
pub const LOCAL: &str = "local";

/// One configuration to compare against `local`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigSpec {
    /// Its name in the table (`inproc`, `unix`, `tcp`, `tcp?nodelay=0`).
    pub name: String,
    /// How the agent is reached.
    pub transport: Transport,
}

/// Parses a `--compare` list such as `inproc,unix,tcp,tcp?nodelay=0`.
/// `local` is dropped (it is always the reference); an unknown, unbuilt
/// (`vsock`, `rdma`) or repeated entry is an error naming it.
pub fn parse_list(list: &str) -> Result<Vec<ConfigSpec>, ClassifierError> {
    let mut out: Vec<ConfigSpec> = Vec::new();
    for item in list.split(',').map(str::trim) {
        let transport = match item {
            "" => {
                return Err(ClassifierError::Config(format!(
                    "empty entry in --compare '{list}'"
                )))
            }
            LOCAL => continue,
            "inproc" | "inproc://" => Transport::Inproc,
            "unix" | "unix://" => Transport::Unix,
            "shm" | "shm://" => Transport::Shm,
            "tcp" | "tcp://" | "tcp?nodelay=1" => Transport::Tcp { nodelay: true },
            "tcp?nodelay=0" => Transport::Tcp { nodelay: false },
            other => {
                let scheme = other.split(['?', ':']).next().unwrap_or(other);
                return Err(ClassifierError::Config(
                    if matches!(scheme, "vsock" | "rdma") {
                        format!(
                            "--compare {other}: the {scheme} transport is not built yet \
                             (available: inproc, shm, unix, tcp, tcp?nodelay=0)"
                        )
                    } else {
                        format!(
                            "--compare: unknown configuration '{other}' \
                             (available: local, inproc, shm, unix, tcp, tcp?nodelay=0)"
                        )
                    },
                ));
            }
        };
        let name = match transport {
            Transport::Inproc => "inproc",
            Transport::Unix => "unix",
            Transport::Shm => "shm",
            Transport::Tcp { nodelay: true } => "tcp",
            Transport::Tcp { nodelay: false } => "tcp?nodelay=0",
        };
        if out.iter().any(|c| c.transport == transport) {
            return Err(ClassifierError::Config(format!(
                "--compare lists {name} twice"
            )));
        }
        out.push(ConfigSpec {
            name: name.to_string(),
            transport,
        });
    }
    Ok(out)
}

/// What every run of a comparison shares.
#[derive(Clone, Debug)]
pub struct Workload<'a> {
    /// The tokenizer.
    pub tokenizer: &'a TextTokenizer,
    /// The label names.
    pub labels: &'a Labels,
    /// The lines to classify.
    pub lines: &'a [InputLine],
    /// The model, its name on agents, threads, and the binary for child agents.
    pub agent: AgentSpec,
    /// Ask agents for every request's timeline (for the stage breakdown).
    pub timelines: bool,
}

/// Runs the lines through the engine called directly (`local`).
pub fn run_local(w: &Workload<'_>) -> Result<RunReport, ClassifierError> {
    let mut target = LocalTarget::load(&w.agent.model_path, w.agent.intra_threads)?;
    run::run_lines(
        LOCAL,
        &mut target,
        w.tokenizer,
        w.labels,
        w.lines,
        &mut |_| {},
    )
}

/// Starts an agent for `spec`, runs the lines through it, and stops it
/// (the agent is killed on any error, never left running).
pub fn run_config(spec: &ConfigSpec, w: &Workload<'_>) -> Result<RunReport, ClassifierError> {
    let agent = RunningAgent::start(&spec.name, spec.transport, &w.agent)?;
    let opts = ClientOptions {
        want_timeline: w.timelines,
        ..ClientOptions::default()
    };
    let report = RemoteTarget::connect(agent.uri(), &w.agent.model_name, opts).and_then(|mut t| {
        run::run_lines(
            &spec.name,
            &mut t,
            w.tokenizer,
            w.labels,
            w.lines,
            &mut |_| {},
        )
    });
    // Stop the agent whatever happened; the run's error comes first.
    let stopped = agent.stop();
    let report = report?;
    stopped?;
    Ok(report)
}

/// The first way `other` differs from `reference`: a line, prediction or
/// logit (compared bit for bit); `None` when identical.
pub fn first_difference(reference: &RunReport, other: &RunReport) -> Option<String> {
    if reference.lines.len() != other.lines.len() {
        return Some(format!(
            "{} lines, {} has {}",
            other.lines.len(),
            reference.config,
            reference.lines.len()
        ));
    }
    for (r, o) in reference.lines.iter().zip(&other.lines) {
        if r.line != o.line {
            return Some(format!(
                "line {} where {} has line {}",
                o.line, reference.config, r.line
            ));
        }
        if r.prediction != o.prediction {
            return Some(format!(
                "line {}: prediction {} where {} has {}",
                o.line, o.prediction, reference.config, r.prediction
            ));
        }
        if r.logits.len() != o.logits.len() {
            return Some(format!(
                "line {}: {} logits where {} has {}",
                o.line,
                o.logits.len(),
                reference.config,
                r.logits.len()
            ));
        }
        for (i, (a, b)) in r.logits.iter().zip(&o.logits).enumerate() {
            if a.to_bits() != b.to_bits() {
                return Some(format!(
                    "line {}: logit {i} is {b:e} ({:#010x}) where {} has {a:e} ({:#010x})",
                    o.line,
                    b.to_bits(),
                    reference.config,
                    a.to_bits()
                ));
            }
        }
    }
    None
}

/// One row of the comparison table (and one object of its JSON).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The configuration.
    pub config: String,
    /// The first line's time (ms): the cold start.
    pub first_ms: Option<f64>,
    /// The mean time (ms) of the lines after the 4th.
    pub avg_ms: Option<f64>,
    /// `avg_ms` minus local's (ms): the RPC tax.
    pub tax_ms: Option<f64>,
    /// The tax as a percentage of local's `avg_ms`.
    pub tax_pct: Option<f64>,
    /// The median time (ms) of the lines after the 4th.
    pub median_ms: Option<f64>,
    /// `median_ms` minus local's: the tax, less sensitive to outliers.
    pub median_tax_ms: Option<f64>,
    /// Every prediction and logit bit-identical to local's.
    pub identical: bool,
}

/// The table: `reference` (local) first, then `others` in order.
pub fn table(reference: &RunReport, others: &[RunReport]) -> Vec<Row> {
    let base = reference.avg_ms();
    let base_median = reference.median_ms();
    std::iter::once(reference)
        .chain(others)
        .map(|r| {
            let avg = r.avg_ms();
            let tax = avg.zip(base).map(|(a, b)| a - b);
            Row {
                config: r.config.clone(),
                first_ms: r.first_ms().map(round4),
                avg_ms: avg.map(round4),
                tax_ms: tax.map(round4),
                tax_pct: tax
                    .zip(base)
                    .filter(|(_, b)| *b > 0.0)
                    .map(|(t, b)| round4(100.0 * t / b)),
                median_ms: r.median_ms().map(round4),
                median_tax_ms: r.median_ms().zip(base_median).map(|(a, b)| round4(a - b)),
                identical: std::ptr::eq(r, reference) || first_difference(reference, r).is_none(),
            }
        })
        .collect()
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

fn opt(x: Option<f64>, decimals: usize, suffix: &str) -> String {
    x.map_or("n/a".into(), |v| format!("{v:.decimals$}{suffix}"))
}

/// The table as text, one row per configuration.
pub fn render(rows: &[Row]) -> String {
    let w = rows
        .iter()
        .map(|r| r.config.len())
        .max()
        .unwrap_or(0)
        .max(13);
    let mut s = format!(
        "{:<w$}  {:>15}  {:>21}  {:>9}  {:>8}  {:>12}  {:>12}  {}\n",
        "configuration",
        "first (ms)",
        "avg after 4th (ms)",
        "tax (ms)",
        "tax (%)",
        "median (ms)",
        "med. tax",
        "identical"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<w$}  {:>15}  {:>21}  {:>9}  {:>8}  {:>12}  {:>12}  {}",
            r.config,
            opt(r.first_ms, 2, ""),
            opt(r.avg_ms, 2, ""),
            opt(r.tax_ms, 2, ""),
            opt(r.tax_pct, 1, "%"),
            opt(r.median_ms, 3, ""),
            opt(r.median_tax_ms, 3, ""),
            if r.identical { "yes" } else { "no" }
        );
    }
    s
}

/// The table as a JSON list of `{config, first_ms, avg_ms, tax_ms,
/// tax_pct, median_ms, median_tax_ms, identical}` objects (`null` where a
/// figure is not available).
pub fn to_json(rows: &[Row]) -> String {
    serde_json::to_string_pretty(rows).unwrap_or_else(|_| "[]".into())
}

/// The per-configuration breakdown (means over the lines after the 4th,
/// µs): tokenize, then the request's stages. For `local` only compute is
/// measured.
pub fn render_stages(reports: &[RunReport]) -> String {
    let w = reports
        .iter()
        .map(|r| r.config.len())
        .max()
        .unwrap_or(0)
        .max(13);
    let names = Stages::default().named().map(|(n, _)| n);
    let mut s = format!("{:<w$}  {:>10}", "mean µs", "tokenize");
    for n in names {
        let _ = write!(s, "  {n:>10}");
    }
    s.push('\n');
    for r in reports {
        let _ = write!(
            s,
            "{:<w$}  {:>10}",
            r.config,
            opt(r.avg_tokenize_ms().map(|m| m * 1e3), 1, "")
        );
        match r.mean_stages() {
            Some(st) => {
                for (name, ns) in st.named() {
                    let v = if r.config == LOCAL && name != "compute" {
                        "-".to_string()
                    } else {
                        format!("{:.1}", ns as f64 / 1e3)
                    };
                    let _ = write!(s, "  {v:>10}");
                }
            }
            None => {
                for _ in names {
                    let _ = write!(s, "  {:>10}", "n/a");
                }
            }
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::LineResult;

    fn line(n: usize, ms: u64, logits: Vec<f32>) -> LineResult {
        LineResult {
            line: n,
            tokens: 5,
            truncated_from: None,
            tokenize_ns: 10_000,
            total_ns: ms * 1_000_000,
            prediction: crate::labels::argmax(&logits).unwrap_or(0),
            logits,
            stages: None,
        }
    }

    fn report(config: &str, ms: &[u64], bump: Option<(usize, usize)>) -> RunReport {
        RunReport {
            config: config.into(),
            lines: ms
                .iter()
                .enumerate()
                .map(|(i, &t)| {
                    let mut l = vec![0.25, -1.5, i as f32];
                    if bump == Some((i, 1)) {
                        l[1] = f32::from_bits(l[1].to_bits() + 1);
                    }
                    line(i + 1, t, l)
                })
                .collect(),
        }
    }

    #[test]
    fn parses_compare_lists() {
        let l = parse_list("inproc, unix,tcp,tcp?nodelay=0,local").expect("list");
        let names: Vec<&str> = l.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["inproc", "unix", "tcp", "tcp?nodelay=0"]);
        assert_eq!(l[3].transport, Transport::Tcp { nodelay: false });
        assert_eq!(parse_list("tcp?nodelay=1").expect("list")[0].name, "tcp");
        assert!(parse_list("local").expect("list").is_empty());
        for (list, needle) in [
            ("inproc,rdma", "rdma transport is not built yet"),
            ("vsock", "vsock transport is not built yet"),
            ("vsock://x", "vsock transport is not built yet"),
            ("http", "unknown configuration 'http'"),
            ("unix,,tcp", "empty entry"),
            ("tcp,tcp?nodelay=1", "twice"),
        ] {
            let e = parse_list(list).unwrap_err().to_string();
            assert!(e.contains(needle), "{list}: {e}");
        }
    }

    #[test]
    fn differences_are_bit_exact_and_named() {
        let a = report("local", &[9, 5, 5, 5, 4, 6], None);
        assert_eq!(first_difference(&a, &a.clone()), None);
        let b = report("unix", &[9, 5, 5, 5, 4, 6], Some((3, 1)));
        let d = first_difference(&a, &b).expect("differs");
        assert!(d.contains("line 4: logit 1") && d.contains("local"), "{d}");
        let mut c = a.clone();
        c.lines[2].prediction = 0;
        assert!(first_difference(&a, &c)
            .expect("differs")
            .contains("prediction"));
        let mut z = a.clone();
        z.lines[0].logits[0] = -0.0;
        let mut p = a.clone();
        p.lines[0].logits[0] = 0.0;
        assert!(
            first_difference(&z, &p).is_some(),
            "-0.0 and 0.0 differ in bits"
        );
        let short = report("tcp", &[9], None);
        assert!(first_difference(&a, &short)
            .expect("differs")
            .contains("1 lines"));
    }

    #[test]
    fn table_rows_and_json() {
        let local = report("local", &[20, 9, 9, 9, 4, 6], None);
        let unix = report("unix", &[30, 9, 9, 9, 5, 7], None);
        let bad = report("tcp", &[30, 9, 9, 9, 6, 8], Some((5, 1)));
        let rows = table(&local, &[unix, bad]);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].config, "local");
        assert_eq!(rows[0].first_ms, Some(20.0));
        assert_eq!(rows[0].avg_ms, Some(5.0));
        assert_eq!(rows[0].tax_ms, Some(0.0));
        assert_eq!(rows[1].tax_ms, Some(1.0));
        assert_eq!(rows[1].tax_pct, Some(20.0));
        assert!(rows[1].identical);
        assert_eq!(rows[2].tax_pct, Some(40.0));
        assert!(!rows[2].identical);
        let text = render(&rows);
        assert!(text.lines().count() == 4, "{text}");
        assert!(text.contains("20.0%") && text.contains(" no"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&to_json(&rows)).expect("json");
        let o = &v[1];
        assert_eq!(o["config"], "unix");
        for k in ["first_ms", "avg_ms", "tax_ms", "tax_pct", "identical"] {
            assert!(o.get(k).is_some(), "{k} in {o}");
        }
        assert_eq!(v[2]["identical"], false);
        // Too few lines for an average: n/a and null.
        let short = report("local", &[3, 3], None);
        let rows = table(&short, &[]);
        assert_eq!(rows[0].avg_ms, None);
        assert!(render(&rows).contains("n/a"));
        assert!(to_json(&rows).contains("null"));
        let st = render_stages(&[short]);
        assert!(st.contains("tokenize") && st.contains("compute"), "{st}");
    }
}
