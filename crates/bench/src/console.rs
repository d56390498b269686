//! What is printed while a bench runs: one table line on stdout per
//! completed row (the header once, before the first), and a one-line
//! progress bar with an ETA on stderr, redrawn in place, only when stderr is
//! a terminal. Also the row table in markdown ([`format_table`]), which
//! `report.md` uses too, so the console and the report show the same cells.
//!
//! The columns are: target, model, bytes, clients, load/rate,
//! p50 µs [min–max over repeats], p99 µs, mean µs, requests per second,
//! CPU µs per request, and the noise (other processes' CPU use, flagged
//! with `!` above [`NOISE_FLAG_PCT`]).

use crate::results::Row;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Noise (percent of one core used by other processes while a row ran)
/// above which the row is flagged as noisy.
pub const NOISE_FLAG_PCT: f64 = 25.0;

/// Width of the progress bar, in cells.
const BAR_CELLS: usize = 24;

/// How a column's cells are aligned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

/// The table's columns: header, console width, alignment.
const COLUMNS: [(&str, usize, Align); 11] = [
    ("target", 22, Align::Left),
    ("model", 16, Align::Left),
    ("bytes", 8, Align::Right),
    ("clients", 7, Align::Right),
    ("load/rate", 16, Align::Left),
    ("p50 µs [spread]", 22, Align::Right),
    ("p99 µs", 9, Align::Right),
    ("mean", 9, Align::Right),
    ("rps", 9, Align::Right),
    ("CPU µs/req", 10, Align::Right),
    ("noise", 6, Align::Right),
];

/// The live output of a bench run. Table lines go to stdout; the progress
/// bar goes to stderr only when stderr is a terminal and the console is not
/// quiet.
#[derive(Debug)]
pub struct Console {
    quiet: bool,
    tty: bool,
    total: usize,
    done: usize,
    label: String,
    started: Instant,
    header_printed: bool,
    bar_shown: bool,
}

impl Console {
    /// A console; `quiet` turns the progress bar off (the table lines are
    /// still printed). Whether stderr is a terminal is detected here.
    pub fn new(quiet: bool) -> Console {
        Console {
            quiet,
            tty: std::io::stderr().is_terminal(),
            total: 0,
            done: 0,
            label: String::new(),
            started: Instant::now(),
            header_printed: false,
            bar_shown: false,
        }
    }

    /// The run starts: `total_configs` rows are expected.
    pub fn start(&mut self, total_configs: usize) {
        self.total = total_configs;
        self.done = 0;
        self.started = Instant::now();
        self.draw();
    }

    /// The configuration now measured (shown after the progress bar).
    pub fn begin(&mut self, label: &str) {
        self.label = label.to_string();
        self.draw();
    }

    /// A row is complete: prints its table line on stdout (after the header
    /// the first time), clearing the progress bar first.
    pub fn row(&mut self, row: &Row) {
        self.clear();
        let mut out = std::io::stdout().lock();
        // A closed stdout (e.g. `| head`) must not stop the run.
        if !self.header_printed {
            let _ = writeln!(out, "{}", console_header());
            self.header_printed = true;
        }
        let _ = writeln!(out, "{}", console_line(row));
        let _ = out.flush();
        drop(out);
        self.draw();
    }

    /// `done` rows of the total are complete: redraws the progress bar.
    pub fn progress(&mut self, done: usize) {
        self.done = done;
        self.draw();
    }

    /// The run is over: clears the progress bar.
    pub fn finish(&mut self) {
        self.clear();
    }

    /// Whether the progress bar is drawn at all.
    fn live(&self) -> bool {
        self.tty && !self.quiet
    }

    /// Draws the progress bar in place.
    fn draw(&mut self) {
        if !self.live() {
            return;
        }
        let line = progress_line(
            self.done,
            self.total,
            self.started.elapsed(),
            &self.label,
            terminal_columns(),
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.bar_shown = true;
    }

    /// Erases the progress bar, if shown.
    fn clear(&mut self) {
        if self.bar_shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.bar_shown = false;
        }
    }
}

/// The terminal's width from `$COLUMNS`, or 100.
fn terminal_columns() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&c| c >= 40)
        .unwrap_or(100)
}

/// The progress line: `[#####-----] 3/10  1m05s left  <label>`, cut to
/// `width` characters.
fn progress_line(
    done: usize,
    total: usize,
    elapsed: Duration,
    label: &str,
    width: usize,
) -> String {
    let frac = if total == 0 {
        0.0
    } else {
        (done.min(total) as f64) / (total as f64)
    };
    let filled = ((frac * BAR_CELLS as f64).round() as usize).min(BAR_CELLS);
    let bar: String = "#".repeat(filled) + &"-".repeat(BAR_CELLS - filled);
    let eta = if done == 0 || done >= total {
        if done >= total && total > 0 {
            "done".to_string()
        } else {
            "ETA ?".to_string()
        }
    } else {
        let per = elapsed.as_secs_f64() / done as f64;
        format!("ETA {}", format_duration(per * (total - done) as f64))
    };
    let line = format!("[{bar}] {done}/{total} {eta}  {label}");
    line.chars().take(width.saturating_sub(1)).collect()
}

/// `42s`, `3m05s`, `1h02m`.
fn format_duration(secs: f64) -> String {
    let s = if secs.is_finite() && secs > 0.0 {
        secs.round() as u64
    } else {
        0
    };
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// The console's header line.
fn console_header() -> String {
    let cells: Vec<String> = COLUMNS.iter().map(|c| c.0.to_string()).collect();
    pad_line(&cells)
}

/// One row as a console line (fixed widths; long cells push the rest
/// right rather than being cut).
fn console_line(row: &Row) -> String {
    pad_line(&row_cells(row))
}

/// Pads the cells to the console widths.
fn pad_line(cells: &[String]) -> String {
    let mut out = String::new();
    for (i, (cell, (_, width, align))) in cells.iter().zip(COLUMNS.iter()).enumerate() {
        if i > 0 {
            out.push_str("  ");
        }
        let n = cell.chars().count();
        let pad = " ".repeat(width.saturating_sub(n));
        match align {
            Align::Left => {
                out.push_str(cell);
                if i + 1 < COLUMNS.len() {
                    out.push_str(&pad);
                }
            }
            Align::Right => {
                out.push_str(&pad);
                out.push_str(cell);
            }
        }
    }
    out
}

/// The rows as a markdown table with the console's columns.
pub fn format_table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push('|');
    for (name, _, _) in COLUMNS {
        out.push(' ');
        out.push_str(name);
        out.push_str(" |");
    }
    out.push_str("\n|");
    for (_, _, align) in COLUMNS {
        out.push_str(match align {
            Align::Left => " --- |",
            Align::Right => " ---: |",
        });
    }
    out.push('\n');
    for r in rows {
        out.push('|');
        for cell in row_cells(r) {
            out.push(' ');
            out.push_str(&cell.replace('|', "\\|"));
            out.push_str(" |");
        }
        out.push('\n');
    }
    out
}

/// A row's cells, in [`COLUMNS`] order.
fn row_cells(r: &Row) -> [String; 11] {
    let target = if r.errors > 0 {
        format!("{} ({} errors)", r.target, r.errors)
    } else {
        r.target.clone()
    };
    let load = match r.rate {
        Some(rate) => format!("{} {}/s", r.load, format_count(rate)),
        None => r.load.clone(),
    };
    let p50 = format!(
        "{} [{}–{}]",
        format_us(r.p50_us),
        format_us(r.p50_spread_us[0]),
        format_us(r.p50_spread_us[1])
    );
    let cpu = r.cpu_us_per_req.map_or("–".to_string(), format_us);
    [
        target,
        r.model.clone(),
        format_bytes(r.tensor_bytes),
        r.clients.to_string(),
        load,
        p50,
        format_us(r.p99_us),
        format_us(r.mean_us),
        format_count(r.throughput_rps),
        cpu,
        format_noise(r.noise_cpu_pct),
    ]
}

/// Microseconds with precision fitting their size: `3.42`, `15.5`, `1234`.
pub fn format_us(us: f64) -> String {
    if !us.is_finite() {
        return "–".to_string();
    }
    let a = us.abs();
    if a < 10.0 {
        format!("{us:.2}")
    } else if a < 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

/// Bytes in binary units: `0`, `512`, `4 KiB`, `1 MiB`, `1.5 MiB`.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return b.to_string();
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if (v - v.round()).abs() < 0.05 {
        format!("{:.0} {}", v, UNITS[unit])
    } else {
        format!("{:.1} {}", v, UNITS[unit])
    }
}

/// A rate or count rounded to an integer (`–` when not finite).
fn format_count(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.0}")
    } else {
        "–".to_string()
    }
}

/// The noise cell: `3%`, or `40% !` above [`NOISE_FLAG_PCT`].
fn format_noise(pct: f64) -> String {
    if !pct.is_finite() {
        return "–".to_string();
    }
    if is_noisy(pct) {
        format!("{pct:.0}% !")
    } else {
        format!("{pct:.0}%")
    }
}

/// Whether a row's noise is above [`NOISE_FLAG_PCT`].
pub fn is_noisy(noise_cpu_pct: f64) -> bool {
    noise_cpu_pct > NOISE_FLAG_PCT
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::sample_row;

    #[test]
    fn markdown_table_has_a_line_per_row_and_escapes_pipes() {
        let mut noisy = sample_row("a|b", 4);
        noisy.noise_cpu_pct = 40.0;
        noisy.rate = Some(1000.0);
        noisy.load = "poisson".into();
        let t = format_table(&[sample_row("tensorwire unix", 1), noisy]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("| target | model | bytes |"));
        assert!(lines[1].contains("---:"));
        assert!(lines[2].contains("| 15.0 [14.5–15.5] |"));
        assert!(lines[3].contains("a\\|b"));
        assert!(lines[3].contains("poisson 1000/s"));
        assert!(lines[3].contains("40% !"));
        assert!(!lines[2].contains('!'));
        // Every line has the same number of (unescaped) separators.
        let seps = |l: &str| l.replace("\\|", "").matches('|').count();
        assert!(lines.iter().all(|l| seps(l) == COLUMNS.len() + 1));
    }

    #[test]
    fn console_lines_line_up_with_the_header() {
        let h = console_header();
        let l = console_line(&sample_row("tensorwire unix", 1));
        assert_eq!(h.chars().count(), l.chars().count());
        assert!(h.starts_with("target "));
        assert!(l.starts_with("tensorwire unix "));
    }

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(format_us(3.4567), "3.46");
        assert_eq!(format_us(15.55), "15.6");
        assert_eq!(format_us(1234.4), "1234");
        assert_eq!(format_bytes(0), "0");
        assert_eq!(format_bytes(4096), "4 KiB");
        assert_eq!(format_bytes(1 << 20), "1 MiB");
        assert_eq!(format_bytes(3 << 19), "1.5 MiB");
        assert_eq!(format_duration(42.0), "42s");
        assert_eq!(format_duration(185.0), "3m05s");
        assert_eq!(format_duration(3720.0), "1h02m");
    }

    #[test]
    fn progress_line_shows_count_and_eta() {
        let l = progress_line(2, 4, Duration::from_secs(10), "tensorwire shm", 100);
        assert!(l.starts_with("[############------------] 2/4 ETA 10s"));
        assert!(l.ends_with("tensorwire shm"));
        assert!(progress_line(0, 4, Duration::ZERO, "x", 100).contains("ETA ?"));
        assert!(progress_line(4, 4, Duration::ZERO, "x", 100).contains("done"));
        assert!(
            progress_line(1, 4, Duration::ZERO, &"y".repeat(300), 80)
                .chars()
                .count()
                < 80
        );
        assert!(progress_line(0, 0, Duration::ZERO, "", 80).contains("0/0"));
    }

    #[test]
    fn a_console_off_a_terminal_prints_no_progress() {
        let mut c = Console::new(false);
        c.tty = false;
        c.start(3);
        c.begin("x");
        c.progress(1);
        c.finish();
        assert!(!c.bar_shown);
        let mut q = Console::new(true);
        q.tty = true;
        q.progress(1);
        assert!(!q.bar_shown);
    }
}
