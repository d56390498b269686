//! The figures of a run, each as SVG and PNG, from the rows of this run
//! only ([`write_all`]):
//!
//! 1. `latency_vs_clients`: p50 (solid) and p99 (dashed) against the number
//!    of closed-loop clients, one line per target;
//! 2. `knee`: p99 (solid) and mean (dashed) against the offered load of the
//!    open-loop rows — where the tail bends up (SplitRPC's knee plot);
//! 3. `cdf`: the latency distribution of one client, log latency axis;
//! 4. `throughput_vs_clients`: completed requests per second against
//!    clients;
//! 5. `stages`: where a request's time goes, the stage means stacked per
//!    target (Hanafy et al.'s breakdown figure).
//!
//! When a run holds several models or tensor sizes, figures 1–4 are drawn
//! once per (model, size), named `<figure>_<model>[_<bytes>B]`. A figure
//! without enough points (e.g. a single client count) is skipped.
//!
//! Rows are turned into figure descriptions here; `draw` renders them and
//! `style` gives each framework its hue family (tensorwire blues, raw
//! greys, ttrpc greens, gRPC oranges) and each transport a shade and marker.

mod draw;
mod style;
mod text;

use crate::caller::BenchError;
use crate::console::format_bytes;
use crate::report::stage_names;
use crate::results::{Results, Row};
use draw::{auto_scale, Axis, Bars, Figure, LineChart, Scale, Segment, Series};
use std::path::{Path, PathBuf};
use style::{stage_color, target_rank, target_style};

/// Writes every figure that has data into `dir` (`.svg` and `.png` each)
/// and returns the files written, in order. Writes nothing when no figure
/// has enough points.
pub fn write_all(dir: &Path, results: &Results) -> Result<Vec<PathBuf>, BenchError> {
    let mut out = Vec::new();
    for (stem, fig) in figures(&results.rows) {
        out.extend(draw::save(&fig, dir, &stem)?);
    }
    Ok(out)
}

/// A line of [`write_time_series`]: its legend text and `(seconds, value)`
/// points in time order.
#[derive(Clone, Debug)]
pub struct TimeSeries {
    /// The legend text.
    pub label: String,
    /// `(seconds since the start, value)`.
    pub points: Vec<(f64, f64)>,
}

/// Writes `<stem>.svg` and `<stem>.png` into `dir`: each series against
/// time in seconds, e.g. a soak's p99 per second (`tensorwire torture`).
/// Returns the files written; nothing when no series has two points.
pub fn write_time_series(
    dir: &Path,
    stem: &str,
    title: &str,
    subtitle: &str,
    y_label: &str,
    series: &[TimeSeries],
) -> Result<Vec<PathBuf>, BenchError> {
    let frameworks = ["tensorwire", "grpc", "ttrpc", "raw"];
    let lines: Vec<Series> = series
        .iter()
        .enumerate()
        .map(|(i, s)| Series {
            label: s.label.clone(),
            style: target_style(frameworks[i % frameworks.len()], "unix"),
            dashed: false,
            in_legend: true,
            points: s.points.clone(),
        })
        .collect();
    if !has_a_line(&lines) {
        return Ok(Vec::new());
    }
    let scale = auto_scale(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let fig = Figure::Line(LineChart {
        title: title.into(),
        subtitle: subtitle.into(),
        x: Axis {
            label: "time (s)".into(),
            scale: Scale::Linear,
        },
        y: Axis {
            label: if scale.is_log() {
                format!("{y_label}, log scale")
            } else {
                y_label.into()
            },
            scale,
        },
        series: lines,
        line_kinds: Vec::new(),
    });
    draw::save(&fig, dir, stem)
}

/// The figures the rows support, with their file stems.
fn figures(rows: &[Row]) -> Vec<(String, Figure)> {
    let mut out = Vec::new();
    let closed: Vec<&Row> = rows.iter().filter(|r| r.rate.is_none()).collect();
    let groups = group(&closed);
    for (key, g) in &groups {
        if let Some(f) = latency_vs_clients(key, g) {
            out.push((stem("latency_vs_clients", key, &groups), f));
        }
    }
    let open: Vec<&Row> = rows.iter().filter(|r| r.rate.is_some()).collect();
    let ogroups = group(&open);
    for (key, g) in &ogroups {
        if let Some(f) = knee(key, g) {
            out.push((stem("knee", key, &ogroups), f));
        }
    }
    let single: Vec<&Row> = closed.iter().copied().filter(|r| r.clients == 1).collect();
    let sgroups = group(&single);
    for (key, g) in &sgroups {
        if let Some(f) = cdf(key, g) {
            out.push((stem("cdf", key, &sgroups), f));
        }
    }
    for (key, g) in &groups {
        if let Some(f) = throughput_vs_clients(key, g) {
            out.push((stem("throughput_vs_clients", key, &groups), f));
        }
    }
    if let Some(f) = stages(rows) {
        out.push(("stages".to_string(), f));
    }
    out
}

/// What rows of a figure share: the model and tensor bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    model: String,
    bytes: u64,
}

impl Key {
    /// `identity, 4 KiB per request` / `identity, empty request`.
    fn describe(&self) -> String {
        if self.bytes == 0 {
            format!("{}, empty request", self.model)
        } else {
            format!("{}, {} per request", self.model, format_bytes(self.bytes))
        }
    }
}

/// The rows grouped by (model, tensor bytes), in the order first met.
fn group<'a>(rows: &[&'a Row]) -> Vec<(Key, Vec<&'a Row>)> {
    let mut out: Vec<(Key, Vec<&'a Row>)> = Vec::new();
    for &r in rows {
        let k = Key {
            model: r.model.clone(),
            bytes: r.tensor_bytes,
        };
        match out.iter_mut().find(|(x, _)| *x == k) {
            Some((_, v)) => v.push(r),
            None => out.push((k, vec![r])),
        }
    }
    out
}

/// The file stem of a figure for `key`: the bare name when it is the only
/// group, else suffixed with the model (and the size when a model has
/// several).
fn stem(base: &str, key: &Key, groups: &[(Key, Vec<&Row>)]) -> String {
    if groups.len() <= 1 {
        return base.to_string();
    }
    let sizes = groups.iter().filter(|(k, _)| k.model == key.model).count();
    let slug: String = key
        .model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if sizes > 1 {
        format!("{base}_{slug}_{}B", key.bytes)
    } else {
        format!("{base}_{slug}")
    }
}

/// The group's rows split by target, ordered by framework then transport.
fn by_target<'a>(rows: &[&'a Row]) -> Vec<Vec<&'a Row>> {
    let mut out: Vec<Vec<&'a Row>> = Vec::new();
    for &r in rows {
        match out.iter_mut().find(|v| v[0].target == r.target) {
            Some(v) => v.push(r),
            None => out.push(vec![r]),
        }
    }
    out.sort_by(|a, b| {
        target_rank(&a[0].framework, &a[0].transport)
            .cmp(&target_rank(&b[0].framework, &b[0].transport))
            .then_with(|| a[0].target.cmp(&b[0].target))
    });
    out
}

/// `(x, y)` points of one target, sorted by x, one per x (the first met).
fn points(rows: &[&Row], f: impl Fn(&Row) -> Option<(f64, f64)>) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = Vec::new();
    for r in rows {
        if let Some((x, y)) = f(r) {
            if x.is_finite() && y.is_finite() && !pts.iter().any(|p| p.0 == x) {
                pts.push((x, y));
            }
        }
    }
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts
}

/// Maps a row to a point of a series (`None`: the row has none).
type PointFn<'a> = &'a dyn Fn(&Row) -> Option<(f64, f64)>;

/// A solid series and, optionally, a dashed one in the same style.
fn pair(
    rows: &[&Row],
    solid: impl Fn(&Row) -> Option<(f64, f64)>,
    dashed: Option<PointFn<'_>>,
) -> Vec<Series> {
    let first = rows[0];
    let style = target_style(&first.framework, &first.transport);
    let mut out = vec![Series {
        label: first.target.clone(),
        style,
        dashed: false,
        in_legend: true,
        points: points(rows, solid),
    }];
    if let Some(d) = dashed {
        out.push(Series {
            label: first.target.clone(),
            style,
            dashed: true,
            in_legend: false,
            points: points(rows, d),
        });
    }
    out
}

/// Whether some series has at least two points.
fn has_a_line(series: &[Series]) -> bool {
    series.iter().any(|s| s.points.len() >= 2)
}

/// The clients axis: log2 when the counts span 4× or more.
fn clients_axis(rows: &[&Row]) -> Axis {
    let lo = rows.iter().map(|r| r.clients).min().unwrap_or(1).max(1);
    let hi = rows.iter().map(|r| r.clients).max().unwrap_or(1);
    if hi >= lo * 4 {
        Axis {
            label: "concurrent clients (log2 scale)".into(),
            scale: Scale::Log2,
        }
    } else {
        Axis {
            label: "concurrent clients".into(),
            scale: Scale::Linear,
        }
    }
}

/// A latency axis, log scale when the values span a decade.
fn latency_axis(values: impl IntoIterator<Item = f64>) -> Axis {
    let scale = auto_scale(values);
    Axis {
        label: if scale.is_log() {
            "latency (µs, log scale)".into()
        } else {
            "latency (µs)".into()
        },
        scale,
    }
}

/// Figure 1: p50 and p99 against clients (closed loop).
fn latency_vs_clients(key: &Key, rows: &[&Row]) -> Option<Figure> {
    let mut series = Vec::new();
    for t in by_target(rows) {
        series.extend(pair(
            &t,
            |r| Some((r.clients as f64, r.p50_us)),
            Some(&|r: &Row| Some((r.clients as f64, r.p99_us))),
        ));
    }
    if !has_a_line(&series) {
        return None;
    }
    Some(Figure::Line(LineChart {
        title: format!("Latency vs concurrent clients — {}", key.describe()),
        subtitle: "closed loop · p50 solid, p99 dashed · µs, median over repeats · this run only"
            .into(),
        x: clients_axis(rows),
        y: latency_axis(rows.iter().flat_map(|r| [r.p50_us, r.p99_us])),
        series,
        line_kinds: vec![("p50".into(), false), ("p99".into(), true)],
    }))
}

/// Figure 2: p99 and mean against offered load (open loop).
fn knee(key: &Key, rows: &[&Row]) -> Option<Figure> {
    let mut series = Vec::new();
    for t in by_target(rows) {
        series.extend(pair(
            &t,
            |r| r.rate.map(|x| (x, r.p99_us)),
            Some(&|r: &Row| r.rate.map(|x| (x, r.mean_us))),
        ));
    }
    if !has_a_line(&series) {
        return None;
    }
    let mut kinds: Vec<&str> = Vec::new();
    for r in rows {
        if !kinds.contains(&r.load.as_str()) {
            kinds.push(&r.load);
        }
    }
    Some(Figure::Line(LineChart {
        title: format!("Tail latency vs offered load — {}", key.describe()),
        subtitle: format!(
            "open loop ({}), latency from the scheduled send time · p99 solid, mean dashed · µs",
            kinds.join(", ")
        ),
        x: Axis {
            label: "offered load (requests/s)".into(),
            scale: Scale::Linear,
        },
        y: latency_axis(rows.iter().flat_map(|r| [r.p99_us, r.mean_us])),
        series,
        line_kinds: vec![("p99".into(), false), ("mean".into(), true)],
    }))
}

/// Figure 3: the latency CDF of one closed-loop client.
fn cdf(key: &Key, rows: &[&Row]) -> Option<Figure> {
    let mut series = Vec::new();
    for t in by_target(rows) {
        // One CDF per target: the first row's.
        let r = t[0];
        let pts: Vec<(f64, f64)> = {
            let mut p: Vec<(f64, f64)> = r
                .cdf
                .iter()
                .filter(|q| q[1].is_finite() && q[1] > 0.0 && (0.0..=1.0).contains(&q[0]))
                .map(|q| (q[1], q[0]))
                .collect();
            p.sort_by(|a, b| a.1.total_cmp(&b.1));
            p
        };
        if pts.len() < 2 {
            continue;
        }
        let mut s = pair(&[r], |_| None, None);
        s[0].points = pts;
        series.extend(s);
    }
    if series.is_empty() {
        return None;
    }
    Some(Figure::Line(LineChart {
        title: format!("Latency distribution, 1 client — {}", key.describe()),
        subtitle: "closed loop · all repeats merged, warm-up excluded · µs, log scale".into(),
        x: Axis {
            label: "latency (µs, log scale)".into(),
            scale: Scale::Log10,
        },
        y: Axis {
            label: "fraction of requests at or below".into(),
            scale: Scale::Linear,
        },
        series,
        line_kinds: Vec::new(),
    }))
}

/// Figure 4: completed requests per second against clients.
fn throughput_vs_clients(key: &Key, rows: &[&Row]) -> Option<Figure> {
    let mut series = Vec::new();
    for t in by_target(rows) {
        series.extend(pair(
            &t,
            |r| Some((r.clients as f64, r.throughput_rps)),
            None,
        ));
    }
    if !has_a_line(&series) {
        return None;
    }
    let scale = auto_scale(rows.iter().map(|r| r.throughput_rps));
    Some(Figure::Line(LineChart {
        title: format!("Throughput vs concurrent clients — {}", key.describe()),
        subtitle: "closed loop · completed requests per second, median over repeats".into(),
        x: clients_axis(rows),
        y: Axis {
            label: if scale.is_log() {
                "requests/s (log scale)".into()
            } else {
                "requests/s".into()
            },
            scale,
        },
        series,
        line_kinds: Vec::new(),
    }))
}

/// Figure 5: the stage means stacked per target (and model), from the
/// closed-loop row with the fewest clients of each.
fn stages(rows: &[Row]) -> Option<Figure> {
    let with: Vec<&Row> = rows.iter().filter(|r| !r.stages.is_empty()).collect();
    if with.is_empty() {
        return None;
    }
    // One row per (target, model, bytes): closed loop, fewest clients.
    let mut chosen: Vec<&Row> = Vec::new();
    for &r in &with {
        let same = |c: &&Row| {
            c.target == r.target && c.model == r.model && c.tensor_bytes == r.tensor_bytes
        };
        let better = |c: &Row| {
            (r.rate.is_none() && c.rate.is_some())
                || (r.rate.is_none() == c.rate.is_none() && r.clients < c.clients)
        };
        match chosen.iter().position(same) {
            Some(i) if better(chosen[i]) => chosen[i] = r,
            Some(_) => {}
            None => chosen.push(r),
        }
    }
    let keys = group(&chosen);
    let models: Vec<&String> = keys.iter().map(|(k, _)| &k.model).collect();
    let mut categories = Vec::new();
    let mut ordered: Vec<&Row> = Vec::new();
    for (key, g) in &keys {
        for t in by_target(g) {
            let r = t[0];
            let label = if keys.len() == 1 {
                r.target.clone()
            } else if models.iter().filter(|m| ***m == key.model).count() > 1 {
                format!("{} · {} · {}", key.model, format_bytes(key.bytes), r.target)
            } else {
                format!("{} · {}", key.model, r.target)
            };
            categories.push(label);
            ordered.push(r);
        }
    }
    let owned: Vec<Row> = ordered.iter().map(|r| (*r).clone()).collect();
    let segments: Vec<Segment> = stage_names(&owned)
        .into_iter()
        .map(|name| Segment {
            color: stage_color(&name),
            values: ordered
                .iter()
                .map(|r| {
                    r.stages
                        .iter()
                        .find(|s| s.stage == name)
                        .map_or(0.0, |s| s.mean_us)
                })
                .collect(),
            name,
        })
        .collect();
    let clients: Vec<usize> = ordered.iter().map(|r| r.clients).collect();
    let lo = clients.iter().min().copied().unwrap_or(1);
    let hi = clients.iter().max().copied().unwrap_or(1);
    let clients = if lo == hi {
        format!("{lo} client{}", if lo == 1 { "" } else { "s" })
    } else {
        format!("{lo}–{hi} clients")
    };
    let subtitle = if keys.len() == 1 {
        format!(
            "{} · {clients} · stacked means add up to the mean round trip",
            keys[0].0.describe()
        )
    } else {
        format!("{clients} · stacked means add up to the mean round trip · this run only")
    };
    Some(Figure::Bars(Bars {
        title: "Where a request's time goes — mean µs per stage".into(),
        subtitle,
        x_label: "mean time per request (µs)".into(),
        categories,
        segments,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::{sample_results, sample_row};
    use crate::results::StageStat;

    fn row(target: &str, framework: &str, transport: &str, clients: usize, p50: f64) -> Row {
        let mut r = sample_row(target, clients);
        r.framework = framework.into();
        r.transport = transport.into();
        r.peer = !matches!(framework, "tensorwire" | "local");
        r.p50_us = p50;
        r.p50_spread_us = [p50 * 0.95, p50 * 1.05];
        r.p90_us = p50 * 1.3;
        r.p99_us = p50 * 2.2;
        r.mean_us = p50 * 1.1;
        r.throughput_rps = clients as f64 * 1e6 / p50;
        r.cdf = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0]
            .iter()
            .map(|&q: &f64| [q, p50 * (0.7 + 0.6 * q + 3.0 * q.powi(8))])
            .collect();
        if framework == "tensorwire" {
            let names = [
                "client_send",
                "to_agent",
                "agent_prepare",
                "queue",
                "compute",
                "agent_respond",
                "to_client",
                "client_receive",
            ];
            let share = [0.12, 0.2, 0.08, 0.05, 0.1, 0.1, 0.25, 0.1];
            r.stages = names
                .iter()
                .zip(share)
                .map(|(n, s)| StageStat {
                    stage: (*n).into(),
                    p50_us: p50 * s * 0.9,
                    mean_us: r.mean_us * s,
                })
                .collect();
        } else {
            r.stages.clear();
        }
        r
    }

    fn synthetic() -> Vec<Row> {
        let mut rows = Vec::new();
        let targets = [
            ("tensorwire shm", "tensorwire", "shm", 4.0),
            ("tensorwire unix", "tensorwire", "unix", 14.0),
            ("tensorwire tcp", "tensorwire", "tcp", 24.0),
            ("raw shm", "raw", "shm", 1.5),
            ("raw unix", "raw", "unix", 9.0),
            ("ttrpc unix", "ttrpc", "unix", 85.0),
            ("grpc unix", "grpc", "unix", 140.0),
        ];
        for c in [1usize, 2, 4, 8, 16] {
            for (t, f, tr, p) in targets {
                rows.push(row(t, f, tr, c, p * (1.0 + 0.35 * (c as f64 - 1.0))));
            }
        }
        for (t, f, tr, p) in targets.iter().take(3) {
            for frac in [0.2, 0.4, 0.6, 0.8, 0.95] {
                let mut r = row(t, f, tr, 1, *p);
                r.load = "poisson".into();
                r.rate = Some(frac * 1e6 / p);
                r.p99_us = p * (2.0 + 1.0 / (1.0 - frac));
                r.mean_us = p * (1.0 + 0.5 * frac / (1.0 - frac));
                rows.push(r);
            }
        }
        rows
    }

    fn check_files(files: &[PathBuf]) {
        for f in files {
            let bytes = std::fs::read(f).expect("read figure");
            assert!(!bytes.is_empty(), "{}", f.display());
            match f.extension().and_then(|e| e.to_str()) {
                Some("svg") => {
                    let text = String::from_utf8(bytes).expect("utf-8 svg");
                    let t = text.trim_start();
                    assert!(
                        t.starts_with("<svg") || t.starts_with("<?xml"),
                        "{}",
                        f.display()
                    );
                    assert!(t.trim_end().ends_with("</svg>"), "{}", f.display());
                }
                Some("png") => {
                    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{}", f.display());
                    assert!(bytes.len() > 5000, "{} has no content", f.display());
                }
                other => panic!("unexpected figure {other:?}"),
            }
        }
    }

    #[test]
    fn every_figure_is_written_as_svg_and_png() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = write_all(dir.path(), &sample_results(synthetic())).expect("write");
        let names: Vec<String> = files
            .iter()
            .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        for stem in [
            "latency_vs_clients",
            "knee",
            "cdf",
            "throughput_vs_clients",
            "stages",
        ] {
            assert!(names.contains(&format!("{stem}.svg")), "{names:?}");
            assert!(names.contains(&format!("{stem}.png")), "{names:?}");
        }
        assert_eq!(files.len(), 10);
        check_files(&files);
        let svg = std::fs::read_to_string(dir.path().join("latency_vs_clients.svg")).expect("svg");
        assert!(svg.contains("tensorwire shm"));
        assert!(svg.contains("µs"));
    }

    #[test]
    fn several_models_get_a_figure_each() {
        let mut rows = synthetic();
        let mut more: Vec<Row> = rows
            .iter()
            .filter(|r| r.rate.is_none())
            .cloned()
            .map(|mut r| {
                r.model = "resnet50".into();
                r.tensor_bytes = 602_112;
                r.p50_us += 4000.0;
                r
            })
            .collect();
        rows.append(&mut more);
        let dir = tempfile::tempdir().expect("tempdir");
        let files = write_all(dir.path(), &sample_results(rows)).expect("write");
        for name in [
            "latency_vs_clients_identity.svg",
            "latency_vs_clients_resnet50.png",
            "cdf_resnet50.svg",
            "throughput_vs_clients_identity.png",
            "knee.svg",
            "stages.png",
        ] {
            assert!(dir.path().join(name).is_file(), "{name}");
        }
        check_files(&files);
    }

    #[test]
    fn figures_without_enough_points_are_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(write_all(dir.path(), &sample_results(Vec::new()))
            .expect("no rows")
            .is_empty());
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);

        // One client count: no line figures, but the CDF and stages.
        let one = vec![
            row("tensorwire unix", "tensorwire", "unix", 1, 14.0),
            row("raw unix", "raw", "unix", 1, 9.0),
        ];
        let files = write_all(dir.path(), &sample_results(one)).expect("write");
        let names: Vec<String> = files
            .iter()
            .filter_map(|f| f.file_stem().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        assert_eq!(names, ["cdf", "cdf", "stages", "stages"]);
        check_files(&files);
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope");
        let e = write_all(&missing, &sample_results(synthetic())).expect_err("missing dir");
        assert!(e.0.contains("nope"), "{e}");
    }
}
