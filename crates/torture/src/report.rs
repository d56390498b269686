//! The run's files: `results.json` (every [`ScenarioResult`]) and
//! `report.md` (the table: scenario → volume tried → defects → others'
//! errors → others' p99 change → leaks), and the one-line form printed as
//! each row completes; `soak.csv` holds the soak's seconds (requests,
//! p99, the agent's RSS and descriptors), drawn as `soak_p99`, `soak_rss`
//! and `soak_fds` (`.svg` and `.png`).

use crate::soak::Second;
use crate::{Report, ScenarioResult, TortureError};
use std::fmt::Write as _;
use std::path::Path;

/// One row as a console line.
pub fn line(r: &ScenarioResult) -> String {
    if r.others_requests == 0 && r.others_errors == 0 {
        // A fault of the agent itself: the client's own outcome.
        return format!(
            "{:<34} {:<5} {}  {}",
            r.name,
            r.transport,
            r.notes.join("; "),
            if r.clean() { "clean" } else { "NOT CLEAN" }
        );
    }
    format!(
        "{:<34} {:<5} tried {:>8}  defects {}  others: {} ok, {} errors, p99 {:.0} -> {:.0} us ({:.2}x)  fds left {}  rss {:+} KiB  {}",
        r.name,
        r.transport,
        r.tried,
        r.defects,
        r.others_requests,
        r.others_errors,
        r.others_p99_before_us,
        r.others_p99_during_us,
        r.others_p99_ratio,
        r.leaks.fds,
        r.leaks.rss_delta_kib,
        if r.clean() { "clean" } else { "NOT CLEAN" }
    )
}

/// The report as Markdown.
pub fn markdown(rep: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# tensorwire torture ({})\n\n`{}` — {:.0} s\n",
        if rep.quick { "quick" } else { "full" },
        rep.command,
        rep.elapsed_s
    );
    s.push_str(
        "| scenario | transport | tried | defects | others ok | others errors | others p99 before → during (µs) | ratio | fds left | RSS Δ KiB |\n\
         |---|---|---:|---:|---:|---:|---|---:|---:|---:|\n",
    );
    for r in &rep.scenarios {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.0} → {:.0} | {:.2} | {} | {:+} |",
            r.name,
            r.transport,
            r.tried,
            r.defects,
            r.others_requests,
            r.others_errors,
            r.others_p99_before_us,
            r.others_p99_during_us,
            r.others_p99_ratio,
            r.leaks.fds,
            r.leaks.rss_delta_kib
        );
    }
    s.push_str("\nNotes:\n\n");
    for r in &rep.scenarios {
        for n in &r.notes {
            let _ = writeln!(s, "- {} / {}: {n}", r.name, r.transport);
        }
    }
    s
}

/// Writes `results.json`, `report.md`, `soak.csv` and the soak's figures
/// into `dir` (created if missing).
pub fn write(dir: &Path, rep: &Report) -> Result<(), TortureError> {
    let err = |what: &str, e: &dyn std::fmt::Display| TortureError(format!("{what}: {e}"));
    std::fs::create_dir_all(dir).map_err(|e| err(&dir.display().to_string(), &e))?;
    let json = serde_json::to_string_pretty(rep).map_err(|e| err("results.json", &e))?;
    let p = dir.join("results.json");
    std::fs::write(&p, json).map_err(|e| err(&p.display().to_string(), &e))?;
    let mut csv = String::from("second,requests,p99_us,rss_kib,fds\n");
    for s in &rep.soak {
        let _ = writeln!(
            csv,
            "{},{},{:.1},{},{}",
            s.t, s.requests, s.p99_us, s.rss_kib, s.fds
        );
    }
    let p = dir.join("soak.csv");
    std::fs::write(&p, csv).map_err(|e| err(&p.display().to_string(), &e))?;
    let p = dir.join("report.md");
    std::fs::write(&p, markdown(rep)).map_err(|e| err(&p.display().to_string(), &e))?;
    plot_soak(dir, &rep.soak).map_err(|e| err("soak figures", &e))?;
    Ok(())
}

/// At most this many points per soak figure (each point has a marker).
const POINTS: usize = 120;

/// Writes `soak_p99`, `soak_rss` and `soak_fds` (`.svg` and `.png`): the
/// soak's p99, the agent's resident memory and its open descriptors over
/// time. Seconds are grouped into windows so that at most [`POINTS`] are
/// drawn; each point is the largest value of its window (a spike stays
/// visible).
fn plot_soak(dir: &Path, soak: &[Second]) -> Result<(), bench::BenchError> {
    let n = soak.len().div_ceil(POINTS).max(1);
    let series = |label: &str, f: &dyn Fn(&Second) -> f64| {
        let points = soak
            .chunks(n)
            .map(|w| (w[0].t as f64, w.iter().map(f).fold(0.0, f64::max)))
            .collect();
        vec![bench::plot::TimeSeries {
            label: label.into(),
            points,
        }]
    };
    let sub = format!("tensorwire torture soak · largest value of each {n} s window");
    bench::plot::write_time_series(
        dir,
        "soak_p99",
        "Soak: p99 of every checked request, per second",
        &sub,
        "latency (µs)",
        &series("p99", &|s| s.p99_us),
    )?;
    bench::plot::write_time_series(
        dir,
        "soak_rss",
        "Soak: the agent's resident memory",
        &sub,
        "RSS (MiB)",
        &series("agent RSS", &|s| s.rss_kib as f64 / 1024.0),
    )?;
    bench::plot::write_time_series(
        dir,
        "soak_fds",
        "Soak: the agent's open descriptors",
        &sub,
        "descriptors",
        &series("agent descriptors", &|s| s.fds as f64),
    )?;
    Ok(())
}
