//! Comparing configurations: the same lines through the engine called
//! directly (`local`, the reference) and through agents on each transport,
//! checking that every prediction and every logit is bit-identical to
//! `local`, and tabulating first-inference time, average time and the RPC
//! tax.
//!
//! Configuration names (`--compare` list items): `inproc`, `unix`, `tcp`,
//! `tcp?nodelay=0` (Nagle on; `tcp?nodelay=1` is `tcp`). `local` is always
//! the first row and may be listed or not. `vsock` and `rdma` are refused
//! with an error naming them: `rdma` is not built yet, and a `vsock` agent
//! lives in another VM or on the host, which `--compare` does not start.

use crate::agents::{AgentSpec, RunningAgent, Transport};
use crate::labels::Labels;
use crate::run::{
    self, InputLine, LineResult, LocalTarget, RemoteTarget, RunReport, Stages, Target,
};
use crate::tokenize::TextTokenizer;
use crate::ClassifierError;
use crate::WARMUP_LINES;
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
                return Err(ClassifierError::Config(if scheme == "vsock" {
                    format!(
                        "--compare {other}: the vsock transport is not among the \
                             configurations --compare starts (its agent runs on the VM's host: \
                             docs/VSOCK.md; available: inproc, shm, unix, tcp, tcp?nodelay=0)"
                    )
                } else if scheme == "rdma" {
                    format!(
                        "--compare {other}: the {scheme} transport is not built yet \
                             (available: inproc, shm, unix, tcp, tcp?nodelay=0)"
                    )
                } else {
                    format!(
                        "--compare: unknown configuration '{other}' \
                             (available: local, inproc, shm, unix, tcp, tcp?nodelay=0)"
                    )
                }));
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
    let mut target = LocalTarget::load(&w.agent.model_path, &w.agent.ort_options())?;
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

/// The order in which line `line` (0-based) of pass `pass` (0-based) goes
/// through `n` configurations (index 0 is `local`): a rotation starting at
/// `(line + pass) mod n`, so that no configuration always goes first and
/// each goes first equally often; odd passes go the other way round, so that
/// a configuration does not always follow the same one (an agent still
/// spinning for its next request, or a warm cache, would then always favour
/// or slow down the same neighbour).
pub fn rotation(line: usize, pass: usize, n: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let start = (line + pass) % n;
    (0..n)
        .map(|k| {
            if pass.is_multiple_of(2) {
                (start + k) % n
            } else {
                (start + n - k) % n
            }
        })
        .collect()
}

/// The median of `v` (the mean of the middle two for an even count);
/// `None` when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The `q` quantile of `v` (nearest rank); `None` when empty.
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return None;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// The tax of one pass: the median over lines of (`other` − `local`) for
/// the same line (ms), over the lines after the first [`WARMUP_LINES`];
/// `None` when there are none (or the runs do not line up).
pub fn pass_tax_ms(local: &RunReport, other: &RunReport) -> Option<f64> {
    median(&paired_diffs_ms(local, other)?)
}

/// `other − local` (ms) for each line after the first [`WARMUP_LINES`].
fn paired_diffs_ms(local: &RunReport, other: &RunReport) -> Option<Vec<f64>> {
    if local.lines.len() != other.lines.len() {
        return None;
    }
    Some(
        local
            .lines
            .iter()
            .zip(&other.lines)
            .skip(WARMUP_LINES)
            .map(|(l, o)| (o.total_ns as f64 - l.total_ns as f64) / 1e6)
            .collect(),
    )
}

/// The measured times (ms) of a pass: the lines after the first
/// [`WARMUP_LINES`].
fn measured_ms(r: &RunReport) -> Vec<f64> {
    r.lines
        .iter()
        .skip(WARMUP_LINES)
        .map(LineResult::total_ms)
        .collect()
}

/// CPU time spent for one configuration over a whole comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuUse {
    /// This process's CPU (all its threads, `getrusage(RUSAGE_SELF)`) while
    /// this configuration's lines were being classified: the client, and
    /// for `local` and `inproc` the engine or agent in this process too.
    pub client_ns: u64,
    /// The child agent's CPU (`/proc/PID/stat`) from before the first pass
    /// to after the last (its polling between requests included); `None`
    /// for `local` and `inproc`.
    pub agent_ns: Option<u64>,
    /// The lines classified (every pass, warm-up included).
    pub lines: u64,
}

impl CpuUse {
    /// Client + agent CPU per line (µs); `None` without lines.
    pub fn per_line_us(&self) -> Option<f64> {
        (self.lines > 0)
            .then(|| (self.client_ns + self.agent_ns.unwrap_or(0)) as f64 / 1e3 / self.lines as f64)
    }
}

/// The result of an interleaved comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Interleaved {
    /// The configurations, `local` first.
    pub configs: Vec<String>,
    /// `runs[c][p]`: configuration `c`'s pass `p` (lines in file order).
    pub runs: Vec<Vec<RunReport>>,
    /// CPU per configuration (same order).
    pub cpu: Vec<CpuUse>,
}

impl Interleaved {
    /// Configuration `c`'s passes as one report (every line of the first
    /// pass, then the lines after the first [`WARMUP_LINES`] of the others),
    /// for [`render_stages`] and the averages.
    pub fn merged(&self, c: usize) -> RunReport {
        let mut lines = Vec::new();
        for (p, r) in self.runs[c].iter().enumerate() {
            let skip = if p == 0 { 0 } else { WARMUP_LINES };
            lines.extend(r.lines.iter().skip(skip).cloned());
        }
        RunReport {
            config: self.configs[c].clone(),
            lines,
        }
    }

    /// The first way configuration `c` differs from `local` (any pass,
    /// against local's first pass), or `None`.
    pub fn difference(&self, c: usize) -> Option<String> {
        let reference = self.runs.first()?.first()?;
        self.runs[c].iter().enumerate().find_map(|(p, r)| {
            first_difference(reference, r).map(|d| format!("pass {}: {d}", p + 1))
        })
    }
}

/// CPU time of process `pid` so far (user + system, all threads), from
/// `/proc/PID/stat` (clock-tick resolution).
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) start with
    // the state (field 3); utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0)?;
    Some(ticks * 1_000_000_000 / hz)
}

/// CPU time of this process so far (user + system, all threads).
pub fn self_cpu_ns() -> u64 {
    // SAFETY: getrusage writes only into the zeroed struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0;
        }
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Runs the lines through `local` and every configuration, interleaved:
/// the engine and every agent are started first, then each line goes
/// through every configuration in [`rotation`] order, for `repeats` passes
/// over the lines, so that a drift of the machine lands on all
/// configurations alike. `progress` is told when each pass is done. The
/// agents are stopped at the end (killed on any error, never left running).
///
/// Every engine stays loaded throughout: with more than one intra-op thread
/// and [`AgentSpec::intra_spinning`] on, ONNX Runtime's pool workers spin
/// after each run, and the idle engines' spinning workers then compete with
/// the busy one for the cores (`tensorwire classify` turns it off). `local`
/// is loaded first, with the options the agents get
/// ([`AgentSpec::ort_options`]).
pub fn run_interleaved(
    configs: &[ConfigSpec],
    w: &Workload<'_>,
    repeats: usize,
    progress: &mut dyn FnMut(usize),
) -> Result<Interleaved, ClassifierError> {
    let mut local = LocalTarget::load(&w.agent.model_path, &w.agent.ort_options())?;
    run::check_target(&local, w.labels)?;
    let mut agents: Vec<RunningAgent> = Vec::new();
    let result = (|| {
        let mut remotes = Vec::new();
        for spec in configs {
            let agent = RunningAgent::start(&spec.name, spec.transport, &w.agent)?;
            let opts = ClientOptions {
                want_timeline: w.timelines,
                ..ClientOptions::default()
            };
            let uri = agent.uri().to_string();
            agents.push(agent);
            let t = RemoteTarget::connect(&uri, &w.agent.model_name, opts)?;
            run::check_target(&t, w.labels)?;
            remotes.push(t);
        }
        interleave(
            &mut local,
            &mut remotes,
            &agents,
            configs,
            w,
            repeats,
            progress,
        )
    })();
    // Stop every agent whatever happened; the run's error comes first.
    let mut stopped = Ok(());
    for a in agents {
        let s = a.stop();
        if stopped.is_ok() {
            stopped = s;
        }
    }
    let r = result?;
    stopped?;
    Ok(r)
}

fn interleave(
    local: &mut LocalTarget,
    remotes: &mut [RemoteTarget],
    agents: &[RunningAgent],
    configs: &[ConfigSpec],
    w: &Workload<'_>,
    repeats: usize,
    progress: &mut dyn FnMut(usize),
) -> Result<Interleaved, ClassifierError> {
    let n = configs.len() + 1;
    let names: Vec<String> = std::iter::once(LOCAL.to_string())
        .chain(configs.iter().map(|c| c.name.clone()))
        .collect();
    let mut runs: Vec<Vec<RunReport>> = vec![Vec::with_capacity(repeats); n];
    let mut cpu = vec![CpuUse::default(); n];
    let agent_cpu0: Vec<Option<u64>> = agents
        .iter()
        .map(|a| a.pid().and_then(process_cpu_ns))
        .collect();
    for pass in 0..repeats {
        let mut lines: Vec<Vec<LineResult>> = vec![Vec::with_capacity(w.lines.len()); n];
        for (i, l) in w.lines.iter().enumerate() {
            for c in rotation(i, pass, n) {
                let target: &mut dyn Target = if c == 0 { local } else { &mut remotes[c - 1] };
                let cpu0 = self_cpu_ns();
                let r = run::run_line(target, w.tokenizer, w.labels, l)?;
                cpu[c].client_ns += self_cpu_ns().saturating_sub(cpu0);
                cpu[c].lines += 1;
                lines[c].push(r);
            }
        }
        for (c, l) in lines.into_iter().enumerate() {
            runs[c].push(RunReport {
                config: names[c].clone(),
                lines: l,
            });
        }
        progress(pass + 1);
    }
    for (k, a) in agents.iter().enumerate() {
        cpu[k + 1].agent_ns = a
            .pid()
            .and_then(process_cpu_ns)
            .zip(agent_cpu0[k])
            .map(|(after, before)| after.saturating_sub(before));
    }
    Ok(Interleaved {
        configs: names,
        runs,
        cpu,
    })
}

/// One row of the comparison table (and one object of its JSON).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The configuration.
    pub config: String,
    /// Passes over the lines.
    pub passes: usize,
    /// Lines measured per pass (after the first [`WARMUP_LINES`]).
    pub lines: usize,
    /// The first line's time (ms) in the first pass: the cold start.
    pub first_ms: Option<f64>,
    /// The mean time (ms) of the measured lines of every pass.
    pub avg_ms: Option<f64>,
    /// The median time (ms) of the measured lines of every pass.
    pub median_ms: Option<f64>,
    /// The lowest and highest of the passes' medians (ms).
    pub median_spread_ms: Option<[f64; 2]>,
    /// The 99th percentile (ms) of the measured lines of every pass.
    pub p99_ms: Option<f64>,
    /// The RPC tax (ms): the median over lines (every pass) of this
    /// configuration's time minus local's for the same line in the same
    /// rotation.
    pub tax_ms: Option<f64>,
    /// The lowest and highest of the passes' taxes (ms).
    pub tax_spread_ms: Option<[f64; 2]>,
    /// `tax_ms` as a percentage of local's `median_ms`.
    pub tax_pct: Option<f64>,
    /// `tax_spread_ms` as percentages of local's `median_ms`.
    pub tax_pct_spread: Option<[f64; 2]>,
    /// This process's CPU per line (µs) while classifying through this
    /// configuration (the client; for local and inproc, the engine or agent
    /// too).
    pub client_cpu_us: Option<f64>,
    /// The child agent's CPU per line (µs); `null` for local and inproc.
    pub agent_cpu_us: Option<f64>,
    /// Client + agent CPU per line (µs).
    pub cpu_us: Option<f64>,
    /// `cpu_us` over local's.
    pub cpu_vs_local: Option<f64>,
    /// Every prediction and logit of every pass bit-identical to local's.
    pub identical: bool,
}

fn spread_of(v: &[f64]) -> Option<[f64; 2]> {
    let lo = v.iter().copied().reduce(f64::min)?;
    let hi = v.iter().copied().reduce(f64::max)?;
    Some([round4(lo), round4(hi)])
}

/// The table of an interleaved comparison: `local` first.
pub fn table(x: &Interleaved) -> Vec<Row> {
    let all_ms = |c: usize| -> Vec<f64> { x.runs[c].iter().flat_map(measured_ms).collect() };
    let base_median = median(&all_ms(0));
    let base_cpu = x.cpu.first().and_then(CpuUse::per_line_us);
    let pct = |t: f64| {
        base_median
            .filter(|b| *b > 0.0)
            .map(|b| round4(100.0 * t / b))
    };
    (0..x.configs.len())
        .map(|c| {
            let ms = all_ms(c);
            let pass_medians: Vec<f64> = x.runs[c]
                .iter()
                .filter_map(|r| median(&measured_ms(r)))
                .collect();
            let diffs: Vec<f64> = x.runs[0]
                .iter()
                .zip(&x.runs[c])
                .filter_map(|(l, o)| paired_diffs_ms(l, o))
                .flatten()
                .collect();
            let pass_taxes: Vec<f64> = x.runs[0]
                .iter()
                .zip(&x.runs[c])
                .filter_map(|(l, o)| pass_tax_ms(l, o))
                .collect();
            let tax = median(&diffs);
            let tax_spread = spread_of(&pass_taxes);
            let cpu = x.cpu.get(c).copied().unwrap_or_default();
            let per_line =
                |ns: u64| (cpu.lines > 0).then(|| round4(ns as f64 / 1e3 / cpu.lines as f64));
            let total = cpu.per_line_us();
            Row {
                config: x.configs[c].clone(),
                passes: x.runs[c].len(),
                lines: x.runs[c]
                    .first()
                    .map_or(0, |r| r.lines.len().saturating_sub(WARMUP_LINES)),
                first_ms: x.runs[c].first().and_then(RunReport::first_ms).map(round4),
                avg_ms: (!ms.is_empty()).then(|| round4(ms.iter().sum::<f64>() / ms.len() as f64)),
                median_ms: median(&ms).map(round4),
                median_spread_ms: spread_of(&pass_medians),
                p99_ms: quantile(&ms, 0.99).map(round4),
                tax_ms: tax.map(round4),
                tax_spread_ms: tax_spread,
                tax_pct: tax.and_then(pct),
                tax_pct_spread: tax_spread.and_then(|[a, b]| Some([pct(a)?, pct(b)?])),
                client_cpu_us: per_line(cpu.client_ns),
                agent_cpu_us: cpu.agent_ns.and_then(per_line),
                cpu_us: total.map(round4),
                cpu_vs_local: total
                    .zip(base_cpu)
                    .filter(|(_, b)| *b > 0.0)
                    .map(|(t, b)| round4(t / b)),
                identical: x.difference(c).is_none(),
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

fn range(x: Option<[f64; 2]>, decimals: usize, signed: bool) -> String {
    x.map_or("n/a".into(), |[a, b]| {
        if signed {
            format!("{a:+.decimals$}..{b:+.decimals$}")
        } else {
            format!("{a:.decimals$}..{b:.decimals$}")
        }
    })
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
        "{:<w$}  {:>8}  {:>8}  {:>13}  {:>8}  {:>9}  {:>15}  {:>7}  {:>13}  {:>8}  {:>8}  {:>7}  {}\n",
        "configuration",
        "first",
        "median",
        "passes",
        "p99",
        "tax",
        "tax passes",
        "tax",
        "tax passes",
        "cpu/line",
        "agent",
        "cpu",
        "identical"
    );
    let _ = writeln!(
        s,
        "{:<w$}  {:>8}  {:>8}  {:>13}  {:>8}  {:>9}  {:>15}  {:>7}  {:>13}  {:>8}  {:>8}  {:>7}",
        "",
        "ms",
        "ms",
        "min..max ms",
        "ms",
        "ms",
        "min..max ms",
        "%",
        "min..max %",
        "µs",
        "µs",
        "×local"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<w$}  {:>8}  {:>8}  {:>13}  {:>8}  {:>9}  {:>15}  {:>7}  {:>13}  {:>8}  {:>8}  {:>7}  {}",
            r.config,
            opt(r.first_ms, 2, ""),
            opt(r.median_ms, 3, ""),
            range(r.median_spread_ms, 3, false),
            opt(r.p99_ms, 3, ""),
            r.tax_ms.map_or("n/a".into(), |v| format!("{v:+.3}")),
            range(r.tax_spread_ms, 3, true),
            r.tax_pct.map_or("n/a".into(), |v| format!("{v:+.1}%")),
            range(r.tax_pct_spread, 1, true),
            opt(r.cpu_us, 0, ""),
            opt(r.agent_cpu_us, 0, ""),
            opt(r.cpu_vs_local, 3, ""),
            if r.identical { "yes" } else { "no" }
        );
    }
    s
}

/// The table as a JSON list of [`Row`] objects (`null` where a figure is
/// not available).
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
            ("vsock", "vsock transport is not among the configurations"),
            (
                "vsock://x",
                "vsock transport is not among the configurations",
            ),
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
    fn rotation_visits_every_configuration_once_and_rotates_the_first() {
        let n = 5;
        for pass in 0..4 {
            let mut first = vec![0; n];
            let mut after = vec![vec![0; n]; n];
            for line in 0..10 * n {
                let r = rotation(line, pass, n);
                let mut sorted = r.clone();
                sorted.sort_unstable();
                assert_eq!(
                    sorted,
                    (0..n).collect::<Vec<_>>(),
                    "line {line} pass {pass}"
                );
                first[r[0]] += 1;
                for k in 1..n {
                    after[r[k]][r[k - 1]] += 1;
                }
            }
            assert!(first.iter().all(|&f| f == 10), "pass {pass}: {first:?}");
            if pass == 0 {
                // Line i starts at configuration i mod n and goes up.
                assert_eq!(rotation(0, 0, n), [0, 1, 2, 3, 4]);
                assert_eq!(rotation(7, 0, n), [2, 3, 4, 0, 1]);
            }
            // One direction per pass: a fixed predecessor within a pass.
            assert_eq!(after[1][if pass % 2 == 0 { 0 } else { 2 }], 8 * n);
        }
        // Odd passes go the other way round and start one further on.
        assert_eq!(rotation(0, 1, n), [1, 0, 4, 3, 2]);
        assert_eq!(rotation(3, 2, 4), [1, 2, 3, 0]);
        assert_eq!(rotation(0, 0, 1), [0]);
        assert!(rotation(3, 1, 0).is_empty());
    }

    #[test]
    fn medians_and_quantiles() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&v, 1.0), Some(100.0));
        assert_eq!(quantile(&[7.0], 0.99), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn tax_is_the_median_of_paired_differences() {
        // Local drifts from 2 ms to 10 ms; the other configuration is
        // always 1 ms slower on the same line, except one 50 ms outlier:
        // the paired tax is 1 ms whatever the drift, and the warm-up lines
        // (the first 4) are left out.
        let local = report("local", &[90, 90, 90, 90, 2, 4, 6, 8, 10], None);
        let other = report("shm", &[1, 1, 1, 1, 3, 5, 57, 9, 11], None);
        assert_eq!(pass_tax_ms(&local, &other), Some(1.0));
        // A difference of medians would say 3 ms (6 vs 9).
        assert_eq!(pass_tax_ms(&local, &local), Some(0.0));
        assert_eq!(pass_tax_ms(&local, &report("x", &[1, 2], None)), None);
        let short = report("local", &[1, 2, 3], None);
        assert_eq!(pass_tax_ms(&short, &short), None);
    }

    fn interleaved(local: &[&[u64]], other: &[&[u64]], bump: bool) -> Interleaved {
        let runs = vec![
            local.iter().map(|ms| report("local", ms, None)).collect(),
            other
                .iter()
                .enumerate()
                .map(|(p, ms)| report("unix", ms, (bump && p == 1).then_some((4, 1))))
                .collect(),
        ];
        Interleaved {
            configs: vec!["local".into(), "unix".into()],
            runs,
            cpu: vec![
                CpuUse {
                    client_ns: 4_000_000,
                    agent_ns: None,
                    lines: 2 * local[0].len() as u64,
                },
                CpuUse {
                    client_ns: 1_000_000,
                    agent_ns: Some(3_400_000),
                    lines: 2 * local[0].len() as u64,
                },
            ],
        }
    }

    #[test]
    fn table_rows_and_json() {
        // Two passes of 4 warm-up lines + 2 measured; the second pass is
        // slower for both (drift), the tax is 1 ms in the first and 2 ms in
        // the second.
        let x = interleaved(
            &[&[20, 9, 9, 9, 4, 6], &[9, 9, 9, 9, 8, 10]],
            &[&[30, 9, 9, 9, 5, 7], &[9, 9, 9, 9, 10, 12]],
            false,
        );
        let rows = table(&x);
        assert_eq!(rows.len(), 2);
        let (l, u) = (&rows[0], &rows[1]);
        assert_eq!(l.config, "local");
        assert_eq!((l.passes, l.lines), (2, 2));
        assert_eq!(l.first_ms, Some(20.0));
        assert_eq!(u.first_ms, Some(30.0));
        assert_eq!(l.avg_ms, Some(7.0));
        assert_eq!(l.median_ms, Some(7.0), "4 6 8 10");
        assert_eq!(l.median_spread_ms, Some([5.0, 9.0]));
        assert_eq!(l.p99_ms, Some(10.0));
        assert_eq!(l.tax_ms, Some(0.0));
        assert_eq!(l.tax_pct, Some(0.0));
        assert_eq!(u.tax_ms, Some(1.5), "diffs 1 1 2 2");
        assert_eq!(u.tax_spread_ms, Some([1.0, 2.0]));
        assert_eq!(u.tax_pct, Some(round4(100.0 * 1.5 / 7.0)));
        assert_eq!(
            u.tax_pct_spread,
            Some([round4(100.0 / 7.0), round4(200.0 / 7.0)])
        );
        // CPU: 12 lines each; local 4 ms, unix 1 + 3.4 ms.
        assert_eq!(l.cpu_us, Some(round4(4000.0 / 12.0)));
        assert_eq!(l.agent_cpu_us, None);
        assert_eq!(u.agent_cpu_us, Some(round4(3400.0 / 12.0)));
        assert_eq!(u.cpu_vs_local, Some(1.1));
        assert!(l.identical && u.identical);
        let text = render(&rows);
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(
            text.contains("+1.500") && text.contains("+1.000..+2.000"),
            "{text}"
        );
        assert!(text.contains(" yes"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&to_json(&rows)).expect("json");
        let o = &v[1];
        assert_eq!(o["config"], "unix");
        for k in [
            "first_ms",
            "avg_ms",
            "median_ms",
            "p99_ms",
            "tax_ms",
            "tax_pct",
            "cpu_us",
            "cpu_vs_local",
        ] {
            assert!(o[k].is_number(), "{k} in {o}");
        }
        assert_eq!(o["tax_spread_ms"][1], 2.0);
        assert_eq!(o["identical"], true);
        assert!(v[0]["agent_cpu_us"].is_null());

        // A logit off by one bit in the second pass.
        let bad = interleaved(
            &[&[20, 9, 9, 9, 4, 6], &[9, 9, 9, 9, 8, 10]],
            &[&[30, 9, 9, 9, 5, 7], &[9, 9, 9, 9, 10, 12]],
            true,
        );
        assert!(bad
            .difference(1)
            .expect("differs")
            .starts_with("pass 2: line 5"));
        let rows = table(&bad);
        assert!(rows[0].identical && !rows[1].identical);
        assert!(render(&rows).contains(" no"));
        assert_eq!(bad.merged(1).lines.len(), 6 + 2);

        // Too few lines for the measured figures: n/a and null.
        let short = interleaved(&[&[3, 3]], &[&[4, 4]], false);
        let rows = table(&short);
        assert_eq!(rows[0].median_ms, None);
        assert_eq!(rows[1].tax_ms, None);
        assert!(render(&rows).contains("n/a"));
        assert!(to_json(&rows).contains("null"));
        let st = render_stages(&[short.merged(0)]);
        assert!(st.contains("tokenize") && st.contains("compute"), "{st}");
    }
}
