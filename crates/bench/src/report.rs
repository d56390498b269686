//! `report.md`: a run written up for a reader. It says what was run, where
//! and when, how to read the figures (warm-up excluded, figures from this
//! run only, medians and p99 with the spread over repeats, noisy rows
//! flagged), then per suite the rows as tables grouped by model, tensor
//! size and load kind, each with its **ratios against the baselines
//! measured in the same run** ([`floor_ratio`], [`peer_ratio`],
//! [`door_ratio`], [`shm_gains`]), the stage breakdown where measured, and links to the
//! figures.

use crate::caller::{BenchError, Stage};
use crate::console::{format_bytes, format_table, format_us, is_noisy, NOISE_FLAG_PCT};
use crate::results::{write_file, Results, Row};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The frameworks whose rows get a [`peer_ratio`] against tensorwire.
pub const PEER_FRAMEWORKS: [&str; 2] = ["grpc", "ttrpc"];

/// A comparison of two rows' median latencies.
#[derive(Clone, Debug, PartialEq)]
pub struct Ratio {
    /// What is compared, as `numerator / denominator` target names, e.g.
    /// `ttrpc unix / tensorwire unix`.
    pub label: String,
    /// The numerator's p50 divided by the denominator's p50.
    pub value: f64,
}

impl Ratio {
    /// `label = 6.1×`.
    pub fn display(&self) -> String {
        format!("{} = {}", self.label, format_ratio(self.value))
    }
}

/// Whether two rows measured the same configuration apart from the target:
/// same suite, model, tensor bytes, clients, load kind and offered rate.
pub fn same_config(a: &Row, b: &Row) -> bool {
    let same_rate = match (a.rate, b.rate) {
        (None, None) => true,
        (Some(x), Some(y)) => (x - y).abs() <= 1e-6 * x.abs().max(y.abs()).max(1.0),
        _ => false,
    };
    a.suite == b.suite
        && a.model == b.model
        && a.tensor_bytes == b.tensor_bytes
        && a.clients == b.clients
        && a.load == b.load
        && same_rate
}

/// `p50(numerator) / p50(denominator)`, when both are positive and finite.
fn p50_ratio(numerator: &Row, denominator: &Row) -> Option<f64> {
    let v = numerator.p50_us / denominator.p50_us;
    (numerator.p50_us > 0.0 && denominator.p50_us > 0.0 && v.is_finite()).then_some(v)
}

/// The first row of `rows` with this framework and transport measured
/// under `row`'s configuration.
fn find<'a>(rows: &'a [Row], row: &Row, framework: &str, transport: &str) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.framework == framework && r.transport == transport && same_config(r, row))
}

/// The floors' framework names: a bare socket that blocks, and one whose
/// ends poll first.
const FLOORS: [&str; 2] = ["raw", "raw-spin"];

/// `× floor`: the row's p50 over the p50 of the fastest floor (`raw` or
/// `raw-spin`) with the same transport and configuration ([`same_config`])
/// in `rows`. `None` for a floor row itself or when there is no floor.
pub fn floor_ratio(row: &Row, rows: &[Row]) -> Option<f64> {
    if FLOORS.contains(&row.framework.as_str()) {
        return None;
    }
    let floor = FLOORS
        .iter()
        .filter_map(|f| find(rows, row, f, &row.transport))
        .filter(|f| f.p50_us > 0.0)
        .min_by(|a, b| a.p50_us.total_cmp(&b.p50_us))?;
    p50_ratio(row, floor)
}

/// For a peer row (`grpc`, `ttrpc`): its p50 over the p50 of tensorwire
/// over the same transport and configuration, e.g.
/// `ttrpc unix / tensorwire unix = 6.1×` (how many times slower the peer
/// is). `None` for other rows or when tensorwire was not measured there.
pub fn peer_ratio(row: &Row, rows: &[Row]) -> Option<Ratio> {
    if !PEER_FRAMEWORKS.contains(&row.framework.as_str()) {
        return None;
    }
    let tw = find(rows, row, "tensorwire", &row.transport)?;
    Some(Ratio {
        label: format!("{} / {}", row.target, tw.target),
        value: p50_ratio(row, tw)?,
    })
}

/// For a tensorwire row behind its gRPC front door: its p50 over the p50
/// of the tonic gRPC peer over TCP in the same configuration, e.g.
/// `tensorwire grpc / grpc tcp = 1.02×` (the same protocol and stack, so
/// what the agent's front door adds or saves). `None` for other rows or
/// when the peer was not measured.
pub fn door_ratio(row: &Row, rows: &[Row]) -> Option<Ratio> {
    if row.framework != "tensorwire" || row.transport != "grpc" {
        return None;
    }
    let peer = find(rows, row, "grpc", "tcp")?;
    Some(Ratio {
        label: format!("{} / {}", row.target, peer.target),
        value: p50_ratio(row, peer)?,
    })
}

/// For a tensorwire row over shared memory: each peer's p50 over a Unix
/// socket divided by this row's p50, e.g. `ttrpc unix / tensorwire shm =
/// 18×` — the gain of a vAccel user (ttrpc over a socket today) who moves
/// to tensorwire over shared memory. Empty for other rows.
pub fn shm_gains(row: &Row, rows: &[Row]) -> Vec<Ratio> {
    if row.framework != "tensorwire" || row.transport != "shm" {
        return Vec::new();
    }
    let mut out = Vec::new();
    for peer in ["ttrpc", "grpc"] {
        if let Some(p) = find(rows, row, peer, "unix") {
            if let Some(value) = p50_ratio(p, row) {
                out.push(Ratio {
                    label: format!("{} / {}", p.target, row.target),
                    value,
                });
            }
        }
    }
    out
}

/// A ratio for reading: `0.85×`, `6.1×`, `120×`.
pub fn format_ratio(v: f64) -> String {
    if !v.is_finite() {
        "–".to_string()
    } else if v < 1.0 {
        format!("{v:.2}×")
    } else if v < 100.0 {
        format!("{v:.1}×")
    } else {
        format!("{v:.0}×")
    }
}

/// A date and time in UTC, `YYYY-MM-DD hh:mm:ss UTC`, from seconds since
/// the Unix epoch.
pub fn format_utc(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        (secs % 3600) / 60,
        secs % 60
    )
}

/// Writes `report.md` into `dir`. `figures` are the files written by
/// [`crate::plot::write_all`], linked relative to `dir`.
pub fn write_report(dir: &Path, results: &Results, figures: &[PathBuf]) -> Result<(), BenchError> {
    let text = render(dir, results, figures);
    write_file(&dir.join("report.md"), text.as_bytes())
}

/// The text of `report.md`.
fn render(dir: &Path, results: &Results, figures: &[PathBuf]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# tensorwire bench report\n");
    write_header(&mut out, results);
    write_reading_guide(&mut out, results);
    if results.rows.is_empty() {
        let _ = writeln!(out, "No rows were measured.\n");
    }
    let mut suites: Vec<&str> = Vec::new();
    for r in &results.rows {
        if !suites.contains(&r.suite.as_str()) {
            suites.push(&r.suite);
        }
    }
    for suite in suites {
        let rows: Vec<Row> = results
            .rows
            .iter()
            .filter(|r| r.suite == suite)
            .cloned()
            .collect();
        write_suite(&mut out, suite, &rows);
    }
    write_figures(&mut out, dir, figures);
    out
}

/// Title block: command, commit, date, machine, quick.
fn write_header(out: &mut String, r: &Results) {
    let m = &r.machine;
    let _ = writeln!(out, "- **Command:** `{}`", r.command.replace('`', "'"));
    let _ = writeln!(out, "- **Commit:** `{}`", r.commit);
    let _ = writeln!(
        out,
        "- **Date:** {} (took {:.0} s)",
        format_utc(r.started_unix),
        r.elapsed_s
    );
    let _ = writeln!(
        out,
        "- **Machine:** {}, {} CPUs, {:.1} GiB memory, kernel {}, host `{}`",
        m.cpu_model,
        m.cpus,
        m.mem_kib as f64 / (1024.0 * 1024.0),
        m.kernel,
        m.hostname
    );
    let _ = writeln!(out, "- **Placement:** {}", r.placement);
    let _ = writeln!(
        out,
        "- **Quick run:** {}\n",
        if r.quick {
            "yes (`--quick`: short measurements, indicative only)"
        } else {
            "no"
        }
    );
}

/// How the figures were obtained, and which rows to read with care.
fn write_reading_guide(out: &mut String, r: &Results) {
    let _ = writeln!(out, "## How to read these figures\n");
    let range = |it: &mut dyn Iterator<Item = u64>| -> String {
        let v: Vec<u64> = it.collect();
        match (v.iter().min(), v.iter().max()) {
            (Some(a), Some(b)) if a == b => a.to_string(),
            (Some(a), Some(b)) => format!("{a}–{b}"),
            _ => "0".to_string(),
        }
    };
    let warmup = range(&mut r.rows.iter().map(|x| x.warmup));
    let repeats = range(&mut r.rows.iter().map(|x| x.repeats as u64));
    let _ = writeln!(
        out,
        "- Every figure comes from **this run only**, on the machine above: the \
         baselines (raw floors, gRPC, ttrpc) were measured in the same run as \
         tensorwire, and nothing is copied from a paper or an earlier run."
    );
    let _ = writeln!(
        out,
        "- Warm-up requests ({warmup} per repeat) are **excluded** from every figure."
    );
    let _ = writeln!(
        out,
        "- Each row aggregates {repeats} repeats of its configuration: latencies \
         are the **median over repeats** of each repeat's p50, p99 and mean, with \
         the min–max of the per-repeat p50 in brackets (the spread). Latencies are \
         in µs; `rps` is completed requests per second; `CPU µs/req` counts the \
         agent (or peer server) and the client process."
    );
    if r.rows.iter().any(|x| x.rate.is_some()) {
        let _ = writeln!(
            out,
            "- Open-loop rows (`poisson`, `constant`, `trace`) measure latency from \
             each request's **scheduled** send time, so queueing behind a slow \
             request is not hidden (no coordinated omission)."
        );
    }
    let _ = writeln!(
        out,
        "- `noise` is the CPU other processes used while a row ran (percent of \
         one core); rows above {NOISE_FLAG_PCT:.0}% are flagged `!` and should be \
         read with care. It is measured only over repeats of at least 250 ms \
         (`/proc/stat` counts 10 ms ticks), and shows 0% for shorter rows."
    );
    let _ = writeln!(
        out,
        "- `× floor` is a row's p50 over the p50 of the fastest raw floor on the \
         same transport in the same configuration: a bare socket whose ends \
         block (`raw`) or poll before they block as tensorwire's do \
         (`raw-spin`), or a shared page; no framework in the path."
    );
    let noisy: Vec<String> = r
        .rows
        .iter()
        .filter(|x| is_noisy(x.noise_cpu_pct))
        .map(|x| format!("{} ({:.0}%)", describe(x), x.noise_cpu_pct))
        .collect();
    if !noisy.is_empty() {
        let _ = writeln!(out, "- **Noisy rows:** {}.", noisy.join("; "));
    }
    let failed: Vec<String> = r
        .rows
        .iter()
        .filter(|x| x.errors > 0)
        .map(|x| format!("{} ({} errors)", describe(x), x.errors))
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(
            out,
            "- **Rows with failed requests:** {}.",
            failed.join("; ")
        );
    }
    let notes: Vec<String> = r
        .rows
        .iter()
        .filter(|x| !x.note.is_empty())
        .map(|x| format!("{}: {}", describe(x), x.note))
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "- **Notes:** {}.", notes.join("; "));
    }
    out.push('\n');
}

/// `target, model, bytes, N clients[, load rate/s]`.
fn describe(r: &Row) -> String {
    let mut s = format!(
        "{}, {}, {} B, {} clients",
        r.target,
        r.model,
        format_bytes(r.tensor_bytes),
        r.clients
    );
    if let Some(rate) = r.rate {
        let _ = write!(s, ", {} {rate:.0}/s", r.load);
    }
    s
}

/// A group heading's key: model, tensor bytes, load kind.
type GroupKey = (String, u64, String);

/// One suite: its groups, their ratios, and the stage breakdown.
fn write_suite(out: &mut String, suite: &str, rows: &[Row]) {
    let _ = writeln!(out, "## Suite `{suite}`\n");
    let batching = crate::batching::tables(rows);
    if !batching.is_empty() {
        let _ = writeln!(
            out,
            "Dynamic batching off against on, the same model and transport. rps: \
             completed requests per second (median over repeats); mean batch: \
             requests per engine run from the agent's statistics (warm-up \
             included); offline rps: ONNX Runtime in this process on pre-formed \
             batches of B = the mean batch, rounded (rows per second); \
             on/offline: how much of the engine's batched throughput the agent \
             delivered; hand-off floor (closed loops): as many blocking caller \
             threads and the engine in this process, futex wake-ups and nothing \
             else between them, batching what was posted (off: one run each), \
             never waiting for company; on/floor and floor p99 on: the agent \
             against it, a reference, not a bound.\n"
        );
        out.push_str(&batching);
    }
    let modes = crate::client_modes::table(rows);
    if !modes.is_empty() {
        let _ = writeln!(
            out,
            "The Rust client's modes, one agent, nothing pinned: sync one request \
             at a time; threads: {d} threads with a connection each; pipelined: \
             one thread, a window of {d} tickets; callback: `Ticket::on_complete`; \
             future: {d} tasks awaiting tickets on a current-thread tokio runtime. \
             Latency from the call that sent a request until its response reached \
             the caller; medians over repeats. × sync: throughput over the sync \
             row of the same transport and model.\n",
            d = crate::client_modes::DEPTH
        );
        out.push_str(&modes);
    }
    let tenants = crate::tenants::tables(rows);
    if !tenants.is_empty() {
        let _ = writeln!(
            out,
            "Tenant isolation: tenant A (`flood`) open loop at 2× the model's \
             capacity beside tenant B (`light`) at 10 %, on an agent with a \
             tenants file (A has `max_queued`) and on one without (FIFO, clients \
             unauthenticated), against B alone. Latency from each request's \
             scheduled time; medians over repeats, p99's min–max in brackets. \
             overloaded: requests refused at once (`Overloaded`, \
             `TooManyInFlight`), summed over repeats, not counted in errors; \
             unsent: A's scheduled requests it could not send before its window \
             ended (all its connections waiting), not counted in errors either. \
             B p99 / solo: B's p99 beside the flood over its p99 alone (the \
             rows' medians; per-repeat pairs in brackets). CPU: percent of one \
             core over the measurement, the agent's from `/proc`, each tenant's \
             from the agent's `tensorwire_tenant_cpu_seconds_total` (– when \
             not exported).\n"
        );
        out.push_str(&tenants);
    }
    let mut keys: Vec<GroupKey> = Vec::new();
    for r in rows {
        let k = (r.model.clone(), r.tensor_bytes, r.load.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (model, bytes, load) in &keys {
        let group: Vec<Row> = rows
            .iter()
            .filter(|r| &r.model == model && r.tensor_bytes == *bytes && &r.load == load)
            .cloned()
            .collect();
        let load_name = if load == "closed" {
            "closed loop".to_string()
        } else {
            format!("open loop ({load})")
        };
        let size = if *bytes == 0 && model == "identity" {
            "empty request".to_string()
        } else if *bytes == 0 {
            "inputs of every size".to_string()
        } else {
            format!("{} per request", format_bytes(*bytes))
        };
        let _ = writeln!(out, "### {model}, {size}, {load_name}\n");
        out.push_str(&format_table(&group));
        out.push('\n');
        write_ratios(out, &group, rows);
    }
    write_stages(out, rows);
}

/// The ratio table of a group (rows compared within `suite_rows`), when any
/// row has a ratio.
fn write_ratios(out: &mut String, group: &[Row], suite_rows: &[Row]) {
    let mut lines = Vec::new();
    for r in group {
        let floor = floor_ratio(r, suite_rows);
        let mut cmp: Vec<String> = Vec::new();
        if let Some(p) = peer_ratio(r, suite_rows) {
            cmp.push(p.display());
        }
        if let Some(p) = door_ratio(r, suite_rows) {
            cmp.push(format!("{} (front door vs peer)", p.display()));
        }
        for g in shm_gains(r, suite_rows) {
            let peer = g.label.split(" / ").next().unwrap_or_default();
            cmp.push(format!("{} (gain vs {peer})", g.display()));
        }
        if floor.is_none() && cmp.is_empty() {
            continue;
        }
        let load = match r.rate {
            Some(rate) => format!("{} {rate:.0}/s", r.load),
            None => r.load.clone(),
        };
        lines.push(format!(
            "| {} | {} | {} | {} | {} | {} |",
            r.target.replace('|', "\\|"),
            r.clients,
            load,
            format_us(r.p50_us),
            floor.map_or("–".to_string(), format_ratio),
            if cmp.is_empty() {
                "–".to_string()
            } else {
                cmp.join("; ")
            }
        ));
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Ratios against the baselines of this run (p50 over p50):\n"
    );
    let _ = writeln!(
        out,
        "| target | clients | load/rate | p50 µs | × floor | comparison |"
    );
    let _ = writeln!(out, "| --- | ---: | --- | ---: | ---: | --- |");
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    out.push('\n');
}

/// The stage names present in `rows`, in [`Stage::ALL`] order, then any
/// others in the order met.
pub fn stage_names(rows: &[Row]) -> Vec<String> {
    let mut names: Vec<String> = Stage::ALL
        .iter()
        .map(|s| s.name().to_string())
        .filter(|n| rows.iter().any(|r| r.stages.iter().any(|s| &s.stage == n)))
        .collect();
    for r in rows {
        for s in &r.stages {
            if !names.contains(&s.stage) {
                names.push(s.stage.clone());
            }
        }
    }
    names
}

/// The stage breakdown table of the rows that have one.
fn write_stages(out: &mut String, rows: &[Row]) {
    let with: Vec<&Row> = rows.iter().filter(|r| !r.stages.is_empty()).collect();
    if with.is_empty() {
        return;
    }
    let owned: Vec<Row> = with.iter().map(|r| (*r).clone()).collect();
    let names = stage_names(&owned);
    let _ = writeln!(out, "### Stage breakdown\n");
    let _ = writeln!(
        out,
        "Median µs of each stage of a request (client stamps joined with the \
         agent's timeline). Medians do not add up; the stage **means** do: their \
         sum is shown next to the mean round trip.\n"
    );
    let mut head = String::from("| target | model | bytes | clients | load |");
    let mut sep = String::from("| --- | --- | ---: | ---: | --- |");
    for n in &names {
        let _ = write!(head, " {n} |");
        sep.push_str(" ---: |");
    }
    head.push_str(" Σ stage means | mean |");
    sep.push_str(" ---: | ---: |");
    let _ = writeln!(out, "{head}\n{sep}");
    for r in with {
        let load = match r.rate {
            Some(rate) => format!("{} {rate:.0}/s", r.load),
            None => r.load.clone(),
        };
        let mut line = format!(
            "| {} | {} | {} | {} | {} |",
            r.target.replace('|', "\\|"),
            r.model,
            format_bytes(r.tensor_bytes),
            r.clients,
            load
        );
        for n in &names {
            let cell = r
                .stages
                .iter()
                .find(|s| &s.stage == n)
                .map_or("–".to_string(), |s| format_us(s.p50_us));
            let _ = write!(line, " {cell} |");
        }
        let sum: f64 = r.stages.iter().map(|s| s.mean_us).sum();
        let _ = write!(line, " {} | {} |", format_us(sum), format_us(r.mean_us));
        let _ = writeln!(out, "{line}");
    }
    out.push('\n');
}

/// The figure files, grouped by name with their formats, linked relative
/// to `dir`.
fn write_figures(out: &mut String, dir: &Path, figures: &[PathBuf]) {
    let _ = writeln!(out, "## Figures\n");
    if figures.is_empty() {
        let _ = writeln!(out, "No figures (not enough data points).");
        return;
    }
    let mut stems: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for f in figures {
        let rel = f
            .strip_prefix(dir)
            .map(Path::to_path_buf)
            .unwrap_or_else(|_| {
                f.file_name()
                    .map(PathBuf::from)
                    .unwrap_or_else(|| f.clone())
            });
        let rel_s = rel.to_string_lossy().replace('\\', "/");
        let stem = rel.with_extension("").to_string_lossy().replace('\\', "/");
        let ext = rel
            .extension()
            .map_or("file".to_string(), |e| e.to_string_lossy().to_uppercase());
        match stems.iter_mut().find(|(s, _)| *s == stem) {
            Some((_, v)) => v.push((ext, rel_s)),
            None => stems.push((stem, vec![(ext, rel_s)])),
        }
    }
    for (stem, files) in &stems {
        let links: Vec<String> = files
            .iter()
            .map(|(ext, rel)| format!("[{ext}]({})", rel.replace(' ', "%20")))
            .collect();
        let _ = writeln!(out, "- {stem}: {}", links.join(" · "));
    }
    out.push('\n');
    if let Some((_, files)) = stems.first() {
        if let Some((_, rel)) = files.iter().find(|(e, _)| e == "SVG") {
            let _ = writeln!(out, "![{}]({})", stems[0].0, rel.replace(' ', "%20"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::{sample_results, sample_row};
    use crate::results::StageStat;

    fn row(target: &str, framework: &str, transport: &str, p50: f64) -> Row {
        let mut r = sample_row(target, 1);
        r.suite = "vaccel".into();
        r.framework = framework.into();
        r.transport = transport.into();
        r.peer = framework != "tensorwire";
        r.p50_us = p50;
        if framework != "tensorwire" {
            r.stages.clear();
        }
        r
    }

    fn vaccel_rows() -> Vec<Row> {
        vec![
            row("tensorwire shm", "tensorwire", "shm", 5.0),
            row("raw shm", "raw", "shm", 2.0),
            row("tensorwire unix", "tensorwire", "unix", 15.0),
            row("raw unix", "raw", "unix", 10.0),
            row("ttrpc unix", "ttrpc", "unix", 91.5),
            row("grpc unix", "grpc", "unix", 150.0),
            row("tensorwire tcp", "tensorwire", "tcp", 30.0),
        ]
    }

    #[test]
    fn floor_ratio_uses_the_raw_row_of_the_same_transport() {
        let rows = vaccel_rows();
        assert_eq!(floor_ratio(&rows[0], &rows), Some(2.5));
        assert_eq!(floor_ratio(&rows[2], &rows), Some(1.5));
        assert_eq!(floor_ratio(&rows[4], &rows), Some(9.15));
        // No raw tcp row; a raw row has no floor ratio of its own.
        assert_eq!(floor_ratio(&rows[6], &rows), None);
        assert_eq!(floor_ratio(&rows[1], &rows), None);
    }

    #[test]
    fn floor_ratio_takes_the_fastest_floor() {
        let mut rows = vaccel_rows();
        rows.push(row("raw-spin unix", "raw-spin", "unix", 5.0));
        assert_eq!(floor_ratio(&rows[2], &rows), Some(3.0));
        assert_eq!(floor_ratio(&rows[7], &rows), None);
        rows[7].p50_us = 20.0;
        assert_eq!(floor_ratio(&rows[2], &rows), Some(1.5));
    }

    #[test]
    fn floor_ratio_needs_the_same_configuration() {
        let mut rows = vaccel_rows();
        rows[3].clients = 4;
        assert_eq!(floor_ratio(&rows[2], &rows), None);
        rows[3].clients = 1;
        rows[3].tensor_bytes = 4096;
        assert_eq!(floor_ratio(&rows[2], &rows), None);
        rows[3].tensor_bytes = 0;
        rows[3].load = "poisson".into();
        rows[3].rate = Some(1000.0);
        assert_eq!(floor_ratio(&rows[2], &rows), None);
        rows[2].load = "poisson".into();
        rows[2].rate = Some(1000.0);
        assert_eq!(floor_ratio(&rows[2], &rows), Some(1.5));
        rows[3].p50_us = 0.0;
        assert_eq!(floor_ratio(&rows[2], &rows), None);
    }

    #[test]
    fn peers_are_compared_with_tensorwire_on_their_transport() {
        let rows = vaccel_rows();
        let p = peer_ratio(&rows[4], &rows).expect("ttrpc unix");
        assert_eq!(p.label, "ttrpc unix / tensorwire unix");
        assert!((p.value - 6.1).abs() < 1e-9);
        assert_eq!(p.display(), "ttrpc unix / tensorwire unix = 6.1×");
        assert_eq!(peer_ratio(&rows[5], &rows).map(|p| p.value), Some(10.0));
        assert_eq!(peer_ratio(&rows[0], &rows), None);
        assert_eq!(
            peer_ratio(&rows[3], &rows),
            None,
            "raw is a floor, not a peer"
        );
        let lone = vec![row("grpc tcp", "grpc", "tcp", 100.0)];
        assert_eq!(peer_ratio(&lone[0], &lone), None);
    }

    #[test]
    fn the_grpc_front_door_is_compared_with_the_grpc_peer_over_tcp() {
        let mut rows = vaccel_rows();
        assert_eq!(door_ratio(&rows[0], &rows), None, "not a front door");
        rows.push(row("tensorwire grpc", "tensorwire", "grpc", 120.0));
        assert_eq!(door_ratio(&rows[7], &rows), None, "no grpc tcp peer row");
        rows.push(row("grpc tcp", "grpc", "tcp", 100.0));
        let d = door_ratio(&rows[7], &rows).expect("door vs peer");
        assert_eq!(d.display(), "tensorwire grpc / grpc tcp = 1.2×");
        assert_eq!(door_ratio(&rows[8], &rows), None, "the peer itself");
        // The peer row keeps its own comparison with tensorwire tcp.
        assert_eq!(
            peer_ratio(&rows[8], &rows).map(|p| p.value),
            Some(100.0 / 30.0)
        );
    }

    #[test]
    fn shm_gain_is_against_the_peers_over_unix() {
        let rows = vaccel_rows();
        let g = shm_gains(&rows[0], &rows);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].label, "ttrpc unix / tensorwire shm");
        assert!((g[0].value - 18.3).abs() < 1e-9);
        assert_eq!(g[1].label, "grpc unix / tensorwire shm");
        assert!(shm_gains(&rows[2], &rows).is_empty());
        assert!(shm_gains(&rows[1], &rows).is_empty());
    }

    #[test]
    fn ratios_and_dates_read_well() {
        assert_eq!(format_ratio(0.854), "0.85×");
        assert_eq!(format_ratio(6.1), "6.1×");
        assert_eq!(format_ratio(123.4), "123×");
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn report_has_header_tables_ratios_stages_and_figures() {
        let mut rows = vaccel_rows();
        rows[6].noise_cpu_pct = 40.0;
        rows[0].stages.push(StageStat {
            stage: "to_agent".into(),
            p50_us: 1.5,
            mean_us: 1.7,
        });
        let mut other = sample_row("tensorwire unix", 4);
        other.suite = "breakdown".into();
        other.model = "resnet50".into();
        other.tensor_bytes = 602_112;
        rows.push(other);
        let r = sample_results(rows);
        let dir = tempfile::tempdir().expect("tempdir");
        let figs = vec![
            dir.path().join("knee.svg"),
            dir.path().join("knee.png"),
            dir.path().join("cdf.svg"),
        ];
        write_report(dir.path(), &r, &figs).expect("write");
        let text = std::fs::read_to_string(dir.path().join("report.md")).expect("read");
        assert!(text.starts_with("# tensorwire bench report"));
        assert!(text.contains("`tensorwire bench --suite vaccel`"));
        assert!(text.contains("abc123+dirty"));
        assert!(text.contains("2023-11-14 22:13:20 UTC"));
        assert!(text.contains("Test CPU, 2 CPUs, 24.0 GiB"));
        assert!(text.contains("**Quick run:** yes"));
        assert!(text.contains("this run only"));
        assert!(text.contains("**excluded**"));
        assert!(text.contains("**Noisy rows:** tensorwire tcp"));
        assert!(text.contains("## Suite `vaccel`"));
        assert!(text.contains("## Suite `breakdown`"));
        assert!(text.contains("### identity, empty request, closed loop"));
        assert!(text.contains("### resnet50, 588 KiB per request, closed loop"));
        assert!(text.contains("ttrpc unix / tensorwire unix = 6.1×"));
        assert!(text.contains("ttrpc unix / tensorwire shm = 18.3× (gain vs ttrpc unix)"));
        assert!(text.contains("| tensorwire shm | 1 | closed | 5.00 | 2.5× |"));
        assert!(text.contains("### Stage breakdown"));
        assert!(text.contains("| target | model | bytes | clients | load | to_agent | compute |"));
        assert!(text.contains("- knee: [SVG](knee.svg) · [PNG](knee.png)"));
        assert!(text.contains("- cdf: [SVG](cdf.svg)"));
        assert!(!text.contains(dir.path().to_string_lossy().as_ref()));
    }

    #[test]
    fn an_empty_run_still_gets_a_report() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_report(dir.path(), &sample_results(Vec::new()), &[]).expect("write");
        let text = std::fs::read_to_string(dir.path().join("report.md")).expect("read");
        assert!(text.contains("No rows were measured."));
        assert!(text.contains("No figures"));
    }
}
