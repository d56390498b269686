//! The run's files: `results.json` (every [`ScenarioResult`]) and
//! `report.md` (the table: scenario → volume tried → defects → others'
//! errors → others' p99 change → leaks), and the one-line form printed as
//! each row completes; `soak.csv` holds the soak's seconds (requests,
//! p99, the agent's RSS and descriptors): the p99 over time.

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

/// Writes `results.json` and `report.md` into `dir` (created if missing).
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
    Ok(())
}
