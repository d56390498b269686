//! Drawing a figure described as data ([`Figure`]) onto plotters' SVG and
//! bitmap backends with the same code, so the `.svg` and the `.png` of a
//! figure show the same thing.
//!
//! Axes are linear in a transformed space (log10, log2 or none) with tick
//! positions chosen here, so that a log axis gets ticks at 1–2–5 × 10^k
//! and minor grid lines, and labels read as plain numbers (`20`, `1k`).
//!
//! Text in PNGs is drawn with DejaVu Sans, embedded in the binary by the
//! `dejavu` crate ([`super::text`]), so labels are readable on machines
//! without any system font; the same font, registered with plotters'
//! `ab_glyph` loader, sizes the text when laying out SVGs, which name the
//! `sans-serif` family and leave the font to the viewer.

use super::style::{Marker, SeriesStyle};
use super::text::PngBackend;
use crate::caller::BenchError;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Figure size in pixels (bar charts may be taller).
const SIZE: (u32, u32) = (1000, 600);
/// Height of the title block.
const TITLE_H: u32 = 64;
/// The font family used everywhere.
const FAMILY: &str = "sans-serif";

/// How an axis maps values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Linear, from zero.
    Linear,
    /// Base-10 logarithmic.
    Log10,
    /// Base-2 logarithmic (client counts).
    Log2,
}

impl Scale {
    /// Value to axis space; `None` when the value cannot be shown.
    fn fwd(self, v: f64) -> Option<f64> {
        if !v.is_finite() {
            return None;
        }
        match self {
            Scale::Linear => Some(v),
            Scale::Log10 => (v > 0.0).then(|| v.log10()),
            Scale::Log2 => (v > 0.0).then(|| v.log2()),
        }
    }

    /// Axis space back to a value.
    fn inv(self, a: f64) -> f64 {
        match self {
            Scale::Linear => a,
            Scale::Log10 => 10f64.powf(a),
            Scale::Log2 => 2f64.powf(a),
        }
    }

    /// Whether the axis is logarithmic.
    pub fn is_log(self) -> bool {
        matches!(self, Scale::Log10 | Scale::Log2)
    }
}

/// Base-10 log when the values span a decade or more, else linear from
/// zero.
pub fn auto_scale(values: impl IntoIterator<Item = f64>) -> Scale {
    let (mut lo, mut hi) = (f64::INFINITY, 0f64);
    for v in values {
        if v.is_finite() && v > 0.0 {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if lo.is_finite() && hi / lo >= 10.0 {
        Scale::Log10
    } else {
        Scale::Linear
    }
}

/// An axis: its description (with units) and scale.
#[derive(Clone, Debug)]
pub struct Axis {
    /// The description, e.g. `latency (µs, log scale)`.
    pub label: String,
    /// How values map.
    pub scale: Scale,
}

/// One line of a line chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// The legend text (usually the target).
    pub label: String,
    /// Color and marker.
    pub style: SeriesStyle,
    /// Dashed (e.g. p99 next to a solid p50).
    pub dashed: bool,
    /// Whether it gets a legend entry (a p99 line shares its p50's).
    pub in_legend: bool,
    /// `(x, y)` points in data units, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Clone, Debug)]
pub struct LineChart {
    /// What it shows.
    pub title: String,
    /// A second line under the title (configuration, reading hints).
    pub subtitle: String,
    /// Horizontal axis.
    pub x: Axis,
    /// Vertical axis.
    pub y: Axis,
    /// The lines.
    pub series: Vec<Series>,
    /// Line kinds explained under the legend: `(text, dashed)`, e.g.
    /// `("p50", false), ("p99", true)`.
    pub line_kinds: Vec<(String, bool)>,
}

/// One stage of stacked bars: its value in each category.
#[derive(Clone, Debug)]
pub struct Segment {
    /// The stage name (legend).
    pub name: String,
    /// Its color.
    pub color: RGBColor,
    /// One value per category (µs).
    pub values: Vec<f64>,
}

/// Stacked horizontal bars.
#[derive(Clone, Debug)]
pub struct Bars {
    /// What it shows.
    pub title: String,
    /// A second line under the title.
    pub subtitle: String,
    /// The value axis description.
    pub x_label: String,
    /// One bar per category, top to bottom.
    pub categories: Vec<String>,
    /// The stacked parts, left to right.
    pub segments: Vec<Segment>,
}

/// A figure to draw.
#[derive(Clone, Debug)]
pub enum Figure {
    /// Lines.
    Line(LineChart),
    /// Stacked bars.
    Bars(Bars),
}

/// Writes `<stem>.svg` and `<stem>.png` into `dir`, returning both paths.
pub fn save(fig: &Figure, dir: &Path, stem: &str) -> Result<Vec<PathBuf>, BenchError> {
    ensure_font()?;
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    let fail = |p: &Path, e: String| BenchError::new(format!("{}: {e}", p.display()));
    {
        let root = SVGBackend::new(&svg, size(fig)).into_drawing_area();
        render(&root, fig).map_err(|e| fail(&svg, e))?;
        root.present().map_err(|e| fail(&svg, e.to_string()))?;
    }
    {
        let (w, h) = size(fig);
        let mut pixels = vec![0u8; w as usize * h as usize * 3];
        {
            let backend = PngBackend::new(
                BitMapBackend::with_buffer(&mut pixels, (w, h)),
                dejavu::sans::regular(),
            )
            .map_err(|e| fail(&png, e))?;
            let root = backend.into_drawing_area();
            render(&root, fig).map_err(|e| fail(&png, e))?;
            root.present().map_err(|e| fail(&png, e.to_string()))?;
        }
        encode_png(&png, &pixels, (w, h)).map_err(|e| fail(&png, e))?;
    }
    Ok(vec![svg, png])
}

/// Writes 8-bit RGB `pixels` as a PNG file.
fn encode_png(path: &Path, pixels: &[u8], (w, h): (u32, u32)) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(err)?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(err)?;
    writer.write_image_data(pixels).map_err(err)?;
    writer.finish().map_err(err)
}

/// The figure's size in pixels: bars grow taller with their count.
fn size(fig: &Figure) -> (u32, u32) {
    match fig {
        Figure::Line(_) => SIZE,
        Figure::Bars(b) => {
            let n = u32::try_from(b.categories.len()).unwrap_or(u32::MAX);
            (
                SIZE.0,
                SIZE.1.max(TITLE_H + 120 + n.saturating_mul(30)).min(4000),
            )
        }
    }
}

/// Registers the embedded DejaVu Sans as `sans-serif` (once).
fn ensure_font() -> Result<(), BenchError> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        plotters::style::register_font(FAMILY, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "the embedded DejaVu Sans font cannot be loaded".to_string())
    })
    .clone()
    .map_err(BenchError::new)
}

/// Any drawing error as text.
fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A text style of the figure's family.
fn font(size: f64, color: &'static RGBColor) -> TextStyle<'static> {
    TextStyle::from((FAMILY, size).into_font()).color(color)
}

const INK: RGBColor = RGBColor(0x20, 0x20, 0x20);
const MUTED: RGBColor = RGBColor(0x60, 0x60, 0x60);

/// Draws a figure onto a drawing area.
fn render<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let (title, subtitle) = match fig {
        Figure::Line(c) => (&c.title, &c.subtitle),
        Figure::Bars(b) => (&b.title, &b.subtitle),
    };
    let (head, body) = root.split_vertically(TITLE_H);
    head.draw(&Text::new(title.clone(), (16, 10), font(21.0, &INK)))
        .map_err(err)?;
    head.draw(&Text::new(subtitle.clone(), (16, 38), font(14.0, &MUTED)))
        .map_err(err)?;
    match fig {
        Figure::Line(c) => draw_lines(&body, c),
        Figure::Bars(b) => draw_bars(&body, b),
    }
}

/// Approximate width in pixels of `text` at `size` px (DejaVu Sans).
fn text_width(text: &str, size: f64) -> u32 {
    (text.chars().count() as f64 * size * 0.58).ceil() as u32
}

/// An axis' range and ticks in axis space; also the plotters coordinate
/// of the axis (linear in axis space, with exactly these tick positions).
#[derive(Clone, Debug)]
struct Ticks {
    lo: f64,
    hi: f64,
    major: Vec<f64>,
    minor: Vec<f64>,
}

impl Ranged for Ticks {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        if span <= 0.0 || !v.is_finite() {
            return (limit.0 + limit.1) / 2;
        }
        let f = (v - self.lo) / span;
        let px = f64::from(limit.0) + f * f64::from(limit.1 - limit.0);
        px.round().clamp(-1e6, 1e6) as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.minor.clone()
        } else {
            self.major.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// A "nice" step (1, 2, 2.5, 5 × 10^k) for about `n` steps over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let f = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 2.5 {
        2.5
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * mag
}

/// Multiples of `step` in `[lo, hi]`.
fn steps_in(lo: f64, hi: f64, step: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut k = (lo / step).ceil();
    while k * step <= hi + step * 1e-9 && out.len() < 1000 {
        out.push(k * step);
        k += 1.0;
    }
    out
}

/// The range and ticks of an axis holding `values` (data units).
fn ticks(scale: Scale, values: &[f64]) -> Ticks {
    let vs: Vec<f64> = values.iter().filter_map(|&v| scale.fwd(v)).collect();
    let (mut lo, mut hi) = vs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    match scale {
        Scale::Linear => {
            let zero = lo >= 0.0;
            lo = lo.min(0.0);
            if hi - lo <= 0.0 {
                hi = lo + lo.abs().max(1.0);
            }
            let step = nice_step(hi - lo, 6.0);
            let pad = (hi - lo) * 0.04;
            let lo = if zero { 0.0 } else { lo - pad };
            let hi = hi + pad;
            Ticks {
                lo,
                hi,
                major: steps_in(lo, hi, step),
                minor: Vec::new(),
            }
        }
        Scale::Log10 => {
            let span = (hi - lo).max(0.0);
            let pad = (span * 0.04).max(0.05);
            let (mut lo, mut hi) = (lo - pad, hi + pad);
            let mults: &[f64] = if hi - lo > 3.5 {
                &[1.0]
            } else if hi - lo > 1.8 {
                &[1.0, 3.0]
            } else {
                &[1.0, 2.0, 5.0]
            };
            // Widen to the nearest labelled values when they are close.
            let labelled = |k: i32| mults.iter().map(move |m| (m * 10f64.powi(k)).log10());
            let below = (lo.floor() as i32 - 1..=lo.ceil() as i32)
                .flat_map(labelled)
                .filter(|&a| a <= lo)
                .fold(f64::NEG_INFINITY, f64::max);
            if lo - below < 0.08 * (hi - lo).max(1.0) {
                lo = below - 0.01;
            }
            let above = (hi.floor() as i32..=hi.ceil() as i32 + 1)
                .flat_map(labelled)
                .filter(|&a| a >= hi)
                .fold(f64::INFINITY, f64::min);
            if above - hi < 0.08 * (hi - lo).max(1.0) {
                hi = above + 0.01;
            }
            let mut major = Vec::new();
            let mut minor = Vec::new();
            let k0 = lo.floor() as i32;
            let k1 = hi.ceil() as i32;
            for k in k0..=k1 {
                for m in 1..10 {
                    let a = (f64::from(m) * 10f64.powi(k)).log10();
                    if a < lo || a > hi {
                        continue;
                    }
                    if mults.contains(&f64::from(m)) {
                        major.push(a);
                    } else {
                        minor.push(a);
                    }
                }
            }
            if major.len() < 3 {
                // Less than a decade: nice linear values, placed on the log axis.
                let (vlo, vhi) = (10f64.powf(lo), 10f64.powf(hi));
                let step = nice_step(vhi - vlo, 5.0);
                major = steps_in(vlo, vhi, step)
                    .into_iter()
                    .filter(|&v| v > 0.0)
                    .map(f64::log10)
                    .collect();
                minor.clear();
            }
            Ticks {
                lo,
                hi,
                major,
                minor,
            }
        }
        Scale::Log2 => {
            let (lo, hi) = if hi - lo < 1.0 {
                (lo - 0.5, hi + 0.5)
            } else {
                (lo - 0.25, hi + 0.25)
            };
            let major = steps_in(lo, hi, 1.0);
            Ticks {
                lo,
                hi,
                major,
                minor: Vec::new(),
            }
        }
    }
}

/// A tick label: `0`, `0.5`, `20`, `350`, `12k`, `1.5M`.
pub fn tick_label(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a < 1e-12 {
        "0".to_string()
    } else if a >= 1e6 {
        format!("{}M", trim(format!("{:.2}", v / 1e6)))
    } else if a >= 1e4 {
        format!("{}k", trim(format!("{:.1}", v / 1e3)))
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.2}"))
    } else {
        trim(format!("{v:.3}"))
    }
}

/// Width of the legend panel for these labels.
fn legend_width(labels: impl Iterator<Item = usize>) -> u32 {
    let longest = labels.max().unwrap_or(0) as f64;
    ((longest * 14.0 * 0.58) as u32 + 70).clamp(140, 330)
}

/// Draws a marker of `style` at `p`.
fn draw_markers<DB: DrawingBackend, X, Y>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    points: &[(f64, f64)],
    style: SeriesStyle,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let c = style.color;
    let pts = points.iter().copied();
    match style.marker {
        Marker::Circle => chart
            .draw_series(pts.map(|p| Circle::new(p, 4, c.filled())))
            .map(drop),
        Marker::Ring => chart
            .draw_series(pts.map(|p| Circle::new(p, 4, c.stroke_width(2))))
            .map(drop),
        Marker::Triangle => chart
            .draw_series(pts.map(|p| TriangleMarker::new(p, 5, c.filled())))
            .map(drop),
        Marker::Square => chart
            .draw_series(
                pts.map(|p| EmptyElement::at(p) + Rectangle::new([(-4, -4), (4, 4)], c.filled())),
            )
            .map(drop),
        Marker::Cross => chart
            .draw_series(pts.map(|p| Cross::new(p, 4, c.stroke_width(2))))
            .map(drop),
        Marker::Diamond => chart
            .draw_series(pts.map(|p| {
                EmptyElement::at(p)
                    + Polygon::new(vec![(0, -5), (5, 0), (0, 5), (-5, 0)], c.filled())
            }))
            .map(drop),
    }
    .map_err(err)
}

/// Draws a marker in pixel space (legend).
fn draw_marker_px<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    style: SeriesStyle,
) -> Result<(), String> {
    let c = style.color;
    match style.marker {
        Marker::Circle => area.draw(&Circle::new((x, y), 4, c.filled())),
        Marker::Ring => area.draw(&Circle::new((x, y), 4, c.stroke_width(2))),
        Marker::Triangle => area.draw(&TriangleMarker::new((x, y), 5, c.filled())),
        Marker::Square => area.draw(&Rectangle::new(
            [(x - 4, y - 4), (x + 4, y + 4)],
            c.filled(),
        )),
        Marker::Cross => area.draw(&Cross::new((x, y), 4, c.stroke_width(2))),
        Marker::Diamond => area.draw(&Polygon::new(
            vec![(x, y - 5), (x + 5, y), (x, y + 5), (x - 5, y)],
            c.filled(),
        )),
    }
    .map_err(err)
}

/// A line chart with its legend on the right.
fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    c: &LineChart,
) -> Result<(), String> {
    let legend: Vec<&Series> = c.series.iter().filter(|s| s.in_legend).collect();
    let lw = legend_width(
        legend
            .iter()
            .map(|s| s.label.chars().count())
            .chain(c.line_kinds.iter().map(|k| k.0.chars().count())),
    );
    let (w, _) = area.dim_in_pixel();
    let (plot, side) = area.split_horizontally(w.saturating_sub(lw));

    let xs: Vec<f64> = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    let ys: Vec<f64> = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .collect();
    let tx = ticks(c.x.scale, &xs);
    let ty = ticks(c.y.scale, &ys);
    let (sx, sy) = (c.x.scale, c.y.scale);
    let y_area = 24
        + ty.major
            .iter()
            .map(|&v| text_width(&tick_label(sy.inv(v)), 14.0))
            .max()
            .unwrap_or(20);
    let mut chart = ChartBuilder::on(&plot)
        .margin_left(10)
        .margin_right(20)
        .margin_top(6)
        .margin_bottom(6)
        .x_label_area_size(52)
        .y_label_area_size(y_area + 26)
        .build_cartesian_2d(tx, ty)
        .map_err(err)?;
    let fx = move |v: &f64| tick_label(sx.inv(*v));
    let fy = move |v: &f64| tick_label(sy.inv(*v));
    chart
        .configure_mesh()
        .x_desc(c.x.label.as_str())
        .y_desc(c.y.label.as_str())
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .label_style(font(14.0, &INK))
        .axis_desc_style(font(15.0, &INK))
        .bold_line_style(BLACK.mix(0.14))
        .light_line_style(BLACK.mix(0.05))
        .axis_style(BLACK.mix(0.6))
        .draw()
        .map_err(err)?;

    for s in &c.series {
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|&(x, y)| Some((sx.fwd(x)?, sy.fwd(y)?)))
            .collect();
        let line = s.style.color.stroke_width(2);
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts.iter().copied(), 8, 5, line))
                .map_err(err)?;
        } else {
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), line))
                .map_err(err)?;
        }
        draw_markers(&mut chart, &pts, s.style)?;
    }

    // Legend: one entry per target, then the line kinds.
    let row_h = 22;
    let mut y = 16;
    side.draw(&Text::new("targets", (8, y - 8), font(13.0, &MUTED)))
        .map_err(err)?;
    y += 14;
    for s in &legend {
        let line = s.style.color.stroke_width(2);
        side.draw(&PathElement::new(vec![(8, y), (38, y)], line))
            .map_err(err)?;
        draw_marker_px(&side, (23, y), s.style)?;
        side.draw(&Text::new(
            s.label.clone(),
            (46, y),
            font(14.0, &INK).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(err)?;
        y += row_h;
    }
    if !c.line_kinds.is_empty() {
        y += 10;
        for (text, dashed) in &c.line_kinds {
            let grey = MUTED.stroke_width(2);
            if *dashed {
                side.draw(&DashedPathElement::new(vec![(8, y), (38, y)], 8, 5, grey))
                    .map_err(err)?;
            } else {
                side.draw(&PathElement::new(vec![(8, y), (38, y)], grey))
                    .map_err(err)?;
            }
            side.draw(&Text::new(
                text.clone(),
                (46, y),
                font(14.0, &INK).pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(err)?;
            y += row_h;
        }
    }
    Ok(())
}

/// Stacked horizontal bars, one per category, with the stage legend on the
/// right and each bar's total at its end.
fn draw_bars<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, b: &Bars) -> Result<(), String> {
    let n = b.categories.len();
    let totals: Vec<f64> = (0..n)
        .map(|i| {
            b.segments
                .iter()
                .map(|s| s.values.get(i).copied().unwrap_or(0.0).max(0.0))
                .sum()
        })
        .collect();
    let lw = legend_width(b.segments.iter().map(|s| s.name.chars().count()));
    let (w, _) = area.dim_in_pixel();
    let (plot, side) = area.split_horizontally(w.saturating_sub(lw));
    let max_total = totals.iter().copied().fold(0.0, f64::max);
    // Room for the total written after the longest bar.
    let tx = ticks(Scale::Linear, &[0.0, max_total * 1.18]);
    let y_area = b
        .categories
        .iter()
        .map(|c| text_width(c, 14.0))
        .max()
        .unwrap_or(40)
        + 16;
    let centers: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
    let mut chart = ChartBuilder::on(&plot)
        .margin_left(10)
        .margin_right(20)
        .margin_top(6)
        .margin_bottom(6)
        .x_label_area_size(52)
        .y_label_area_size(y_area)
        .build_cartesian_2d(
            tx,
            Ticks {
                lo: 0.0,
                hi: n.max(1) as f64,
                major: centers,
                minor: Vec::new(),
            },
        )
        .map_err(err)?;
    // Category i is drawn at row n-1-i so the first is at the top.
    let cats = b.categories.clone();
    let fy = move |v: &f64| {
        let row = v.floor();
        if row < 0.0 {
            return String::new();
        }
        let i = n.saturating_sub(1).saturating_sub(row as usize);
        cats.get(i).cloned().unwrap_or_default()
    };
    let fx = |v: &f64| tick_label(*v);
    chart
        .configure_mesh()
        .x_desc(b.x_label.as_str())
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .label_style(font(14.0, &INK))
        .axis_desc_style(font(15.0, &INK))
        .bold_line_style(BLACK.mix(0.10))
        .axis_style(BLACK.mix(0.6))
        .disable_y_mesh()
        .draw()
        .map_err(err)?;
    for (i, total) in totals.iter().enumerate() {
        let row = (n - 1 - i) as f64;
        let mut x0 = 0.0;
        for s in &b.segments {
            let v = s.values.get(i).copied().unwrap_or(0.0).max(0.0);
            if v <= 0.0 {
                continue;
            }
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, row + 0.18), (x0 + v, row + 0.82)],
                    s.color.filled(),
                )))
                .map_err(err)?;
            x0 += v;
        }
        chart
            .draw_series(std::iter::once(Text::new(
                format!(" {} µs", tick_label(*total)),
                (*total, row + 0.5),
                font(13.0, &INK).pos(Pos::new(HPos::Left, VPos::Center)),
            )))
            .map_err(err)?;
    }
    let mut y = 16;
    side.draw(&Text::new("stages", (8, y - 8), font(13.0, &MUTED)))
        .map_err(err)?;
    y += 14;
    for s in &b.segments {
        side.draw(&Rectangle::new(
            [(10, y - 7), (30, y + 7)],
            s.color.filled(),
        ))
        .map_err(err)?;
        side.draw(&Text::new(
            s.name.clone(),
            (40, y),
            font(14.0, &INK).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(err)?;
        y += 22;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_ticks_fall_on_round_values() {
        let t = ticks(Scale::Log10, &[3.0, 20_000.0]);
        let vals: Vec<String> = t.major.iter().map(|&a| tick_label(10f64.powf(a))).collect();
        assert!(vals.contains(&"10".to_string()), "{vals:?}");
        assert!(vals.contains(&"10k".to_string()), "{vals:?}");
        assert!(!t.minor.is_empty());
        // Under a decade: round linear values.
        let t = ticks(Scale::Log10, &[12.0, 30.0]);
        assert!(t.major.len() >= 3);
        let t = ticks(Scale::Log2, &[1.0, 16.0]);
        let vals: Vec<String> = t.major.iter().map(|&a| tick_label(2f64.powf(a))).collect();
        assert_eq!(vals, ["1", "2", "4", "8", "16"]);
    }

    #[test]
    fn linear_ticks_start_at_zero() {
        let t = ticks(Scale::Linear, &[40.0, 95.0]);
        assert_eq!(t.lo, 0.0);
        assert_eq!(t.major.first().copied(), Some(0.0));
        assert!(t.hi >= 95.0);
        let t = ticks(Scale::Linear, &[]);
        assert!(t.hi > t.lo);
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(tick_label(0.0), "0");
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(20.0), "20");
        assert_eq!(tick_label(350.0), "350");
        assert_eq!(tick_label(12_000.0), "12k");
        assert_eq!(tick_label(1_500_000.0), "1.5M");
        assert_eq!(auto_scale([10.0, 50.0]), Scale::Linear);
        assert_eq!(auto_scale([10.0, 500.0]), Scale::Log10);
    }
}
