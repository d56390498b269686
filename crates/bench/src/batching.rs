//! The `batching` suite's own pieces: dynamic batching off against on.
//!
//! - [`BatchConfig`]: a model's batching settings as the agent takes them
//!   on `--model NAME=PATH;max_batch=..;max_queue_delay_us=..`;
//!   [`BatchConfig::ON`] is the suite's "on" setting ([`BatchConfig::FILLING`]
//!   for a model whose batches run for ~100 ms), [`BatchConfig::OFF`] a
//!   plain model (one request per engine run);
//! - [`Counts`], [`read_counts`], [`mean_batch`]: the agent's Triton
//!   statistics (`GET /v2/models/NAME/stats` on its HTTP door) read before
//!   and after a measurement; Δ`inference_count` / Δ`execution_count` is
//!   the mean batch the engine ran (warm-up calls included: they are made
//!   by the same clients just before the timed phase);
//! - [`offline_rps`]: the engine's own throughput on
//!   pre-formed batches of a row's mean batch size, ONNX Runtime called
//!   directly in this process: what batching could reach at best with no
//!   transport, no queue and no batch forming;
//! - [`fill_floors`]: fills both figures into the rows: the offline one,
//!   and each closed-loop row's [`handoff`](crate::handoff) floor (as many
//!   blocking caller threads, nothing but wake-ups between them and the
//!   engine): a reference for what an agent gets for that loop;
//! - [`tables`]: the report's table per model.

use crate::caller::BenchError;
use crate::handoff::{handoff_floor, HandoffBounds, HandoffFloor};
use crate::results::Row;
use crate::stats::spread;
use crate::workload::{Input, Workload};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};
use wire::AlignedBuf;

/// A model's dynamic batching settings on the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchConfig {
    /// The most rows in one engine run (1: no batching).
    pub max_batch: usize,
    /// How long a batch's first request may wait for more, µs.
    pub max_queue_delay_us: u64,
}

impl BatchConfig {
    /// No batching: the model as `--model NAME=PATH` serves it.
    pub const OFF: BatchConfig = BatchConfig {
        max_batch: 1,
        max_queue_delay_us: 0,
    };

    /// The suite's "on": up to 64 rows a run, no waiting for more (a batch
    /// is whatever queued while the engine was busy).
    pub const ON: BatchConfig = BatchConfig {
        max_batch: 64,
        max_queue_delay_us: 0,
    };

    /// The suite's "on" for the tweet classifier: up to 64 rows a run,
    /// waiting up to 20 ms for them. Its batch of ~30 runs for ~110 ms;
    /// with no delay, 64 closed-loop clients settle into two alternating
    /// batches (each request waits for the other's run: p99 2.6–3.3 batch
    /// times); with 20 ms the clients of the batch just answered rejoin
    /// the rest and runs take 61–64 rows, at the same throughput.
    pub const FILLING: BatchConfig = BatchConfig {
        max_batch: 64,
        max_queue_delay_us: 20_000,
    };

    /// Whether the model batches at all.
    pub const fn is_on(self) -> bool {
        self.max_batch > 1
    }

    /// `on` or `off`, as in rows.
    pub const fn name(self) -> &'static str {
        if self.is_on() {
            "on"
        } else {
            "off"
        }
    }

    /// The agent's `--model` value: `NAME=PATH` when off,
    /// `NAME=PATH;max_batch=N;max_queue_delay_us=US` when on.
    pub fn model_arg(self, name: &str, path: &Path) -> OsString {
        let mut m = OsString::from(format!("{name}="));
        m.push(path.as_os_str());
        if self.is_on() {
            m.push(format!(
                ";max_batch={};max_queue_delay_us={}",
                self.max_batch, self.max_queue_delay_us
            ));
        }
        m
    }
}

/// A batching row's own figures (flattened into [`Row`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchingFigures {
    /// `off` or `on`.
    pub batching: String,
    /// The agent's `max_batch` for the model (1 when off).
    pub max_batch: usize,
    /// The agent's `max_queue_delay_us` for the model.
    pub max_queue_delay_us: u64,
    /// Requests per engine run over the measurement (median over repeats
    /// of Δinference / Δexecution from the agent's statistics); `None`
    /// when the statistics could not be read.
    pub mean_batch: Option<f64>,
    /// The batch size the offline figure was measured at: `mean_batch`
    /// rounded, at least 1.
    pub offline_batch: Option<usize>,
    /// ONNX Runtime's own rows per second on pre-formed batches of
    /// `offline_batch` rows, in this process (median over repeats).
    pub offline_rps: Option<f64>,
    /// Closed loop: the [`handoff`](crate::handoff) floor, requests per
    /// second that as many blocking caller threads get from the engine in
    /// this process under this `max_batch`, with nothing between them but
    /// futex wake-ups (median over repeats).
    #[serde(default)]
    pub handoff_rps: Option<f64>,
    /// The p99 round trip of that floor's callers (µs).
    #[serde(default)]
    pub handoff_p99_us: Option<f64>,
    /// Open loop: the offered load as a fraction of the target's capacity.
    pub load_fraction: Option<f64>,
}

impl BatchingFigures {
    /// The figures of a row measured under `config`, before the offline
    /// measurement.
    pub fn new(config: BatchConfig, mean_batch: Option<f64>, load_fraction: Option<f64>) -> Self {
        BatchingFigures {
            batching: config.name().to_string(),
            max_batch: config.max_batch,
            max_queue_delay_us: config.max_queue_delay_us,
            mean_batch,
            offline_batch: mean_batch.map(offline_batch),
            offline_rps: None,
            handoff_rps: None,
            handoff_p99_us: None,
            load_fraction,
        }
    }
}

/// A model's two counters from the agent's statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `inference_count`: requests served.
    pub inference: u64,
    /// `execution_count`: engine runs (a batch is one).
    pub execution: u64,
}

/// Requests per engine run between two readings: Δinference /
/// Δexecution. `None` when nothing ran or a counter went back (another
/// agent).
pub fn mean_batch(before: Counts, after: Counts) -> Option<f64> {
    let inferences = after.inference.checked_sub(before.inference)?;
    let executions = after.execution.checked_sub(before.execution)?;
    (executions > 0).then(|| inferences as f64 / executions as f64)
}

/// The median of the repeats' mean batches, when every repeat has one.
pub fn median_batch(per_repeat: &[Option<f64>]) -> Option<f64> {
    let v: Vec<f64> = per_repeat.iter().copied().collect::<Option<_>>()?;
    (!v.is_empty()).then(|| spread(&v).0)
}

/// The batch size of the offline measurement for a mean batch: rounded
/// to the nearest integer, at least 1.
pub fn offline_batch(mean: f64) -> usize {
    if mean.is_finite() && mean >= 1.5 {
        mean.round() as usize
    } else {
        1
    }
}

/// `model`'s counters in a Triton statistics answer
/// (`{"model_stats": [{"name": .., "inference_count": .., "execution_count": ..}]}`;
/// counts as numbers or strings).
pub fn parse_counts(body: &str, model: &str) -> Result<Counts, BenchError> {
    let v: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| BenchError::new(format!("statistics of '{model}': {e}")))?;
    let m = v["model_stats"]
        .as_array()
        .and_then(|a| a.iter().find(|m| m["name"] == model))
        .ok_or_else(|| BenchError::new(format!("statistics without model '{model}'")))?;
    let count = |key: &str| -> Result<u64, BenchError> {
        let x = &m[key];
        x.as_u64()
            .or_else(|| x.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| BenchError::new(format!("statistics of '{model}': no {key}")))
    };
    Ok(Counts {
        inference: count("inference_count")?,
        execution: count("execution_count")?,
    })
}

/// How long reading the statistics may take.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads `model`'s counters from the agent's HTTP door at `uri`
/// (`http://HOST:PORT`): one `GET /v2/models/MODEL/stats` on its own
/// connection.
pub fn read_counts(uri: &str, model: &str) -> Result<Counts, BenchError> {
    let body = http_get(uri, &format!("/v2/models/{model}/stats"))?;
    parse_counts(&body, model)
}

/// The body of `GET PATH` at `uri` (`http://HOST:PORT`), on its own
/// connection, answered with status 200 within a few seconds.
pub fn http_get(uri: &str, path: &str) -> Result<String, BenchError> {
    let err = |what: &str, e: &dyn std::fmt::Display| {
        BenchError::new(format!("{uri}{path}: {what}: {e}"))
    };
    let host = uri
        .strip_prefix("http://")
        .map(|h| h.trim_end_matches('/'))
        .ok_or_else(|| BenchError::new(format!("{uri}: not an http://HOST:PORT address")))?;
    let mut s = std::net::TcpStream::connect(host).map_err(|e| err("connect", &e))?;
    s.set_read_timeout(Some(STATS_TIMEOUT))
        .and_then(|()| s.set_write_timeout(Some(STATS_TIMEOUT)))
        .map_err(|e| err("timeout", &e))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| err("send", &e))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| err("read", &e))?;
    http_body(&raw).map_err(|e| err("answer", &e))
}

/// The body of a whole HTTP/1.1 answer with status 200 (plain, or
/// `Transfer-Encoding: chunked`).
fn http_body(raw: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("no end of headers in the answer")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("{status}: {body}"));
    }
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if !chunked {
        return Ok(body.to_string());
    }
    let mut out = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n").ok_or("truncated chunk")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size '{size}'"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = after.get(..size).ok_or("truncated chunk")?;
        out.push_str(chunk);
        rest = after[size..].trim_start_matches("\r\n");
    }
}

/// Bounds of the offline measurement.
#[derive(Clone, Copy, Debug)]
pub struct OfflineBounds {
    /// Each repeat runs at most this long (at least one run).
    pub duration: Duration,
    /// Each repeat makes at most this many runs.
    pub runs: usize,
    /// Repeats; the figure is their median.
    pub repeats: usize,
}

/// `inputs` (each of batch 1 along its first dimension) stacked `batch`
/// times along it: one pre-formed batch.
pub fn stack(inputs: &[Input], batch: usize) -> Result<Vec<Input>, BenchError> {
    let mut out = Vec::with_capacity(inputs.len());
    for (dtype, shape, data) in inputs {
        if shape.first() != Some(&1) {
            return Err(BenchError::new(format!(
                "cannot stack an input of shape {shape:?}: its first dimension is not 1"
            )));
        }
        let mut s = shape.clone();
        s[0] = batch as u64;
        let mut buf =
            AlignedBuf::zeroed(data.len() * batch).map_err(|e| BenchError::new(e.to_string()))?;
        for row in buf.chunks_exact_mut(data.len().max(1)) {
            row.copy_from_slice(data);
        }
        out.push((*dtype, s, buf));
    }
    Ok(out)
}

/// Rows per second of `backend` on one batch of `batch` copies of
/// `inputs`: `batch` × runs / seconds, median over `bounds.repeats`
/// repeats after one untimed run.
pub fn offline_rps(
    backend: &dyn engine::Backend,
    inputs: &[Input],
    batch: usize,
    bounds: &OfflineBounds,
) -> Result<f64, BenchError> {
    let stacked = stack(inputs, batch)?;
    let views: Vec<engine::TensorView<'_>> = stacked
        .iter()
        .map(|(d, s, b)| engine::TensorView::new(*d, s, b))
        .collect();
    let run = || {
        backend
            .run(&views)
            .map_err(|e| BenchError::new(format!("batch of {batch}: {e}")))
    };
    run()?;
    let mut rates = Vec::with_capacity(bounds.repeats.max(1));
    for _ in 0..bounds.repeats.max(1) {
        let t0 = Instant::now();
        let mut runs = 0usize;
        loop {
            run()?;
            runs += 1;
            if runs >= bounds.runs.max(1) || t0.elapsed() >= bounds.duration {
                break;
            }
        }
        rates.push((batch * runs) as f64 / t0.elapsed().as_secs_f64());
    }
    Ok(spread(&rates).0)
}

/// Offline figures already measured, by (model, batch size): an error is
/// kept as its message.
pub type OfflineCache = HashMap<(String, usize), Result<f64, String>>;

/// Hand-off floors already measured, by (model, `max_batch` capped at the
/// clients, clients): an error is kept as its message.
pub type HandoffCache = HashMap<(String, usize, usize), Result<HandoffFloor, String>>;

/// Both floors already measured in a run (parts of one model share them).
#[derive(Debug, Default)]
pub struct FloorCache {
    /// `offline_rps` figures.
    pub offline: OfflineCache,
    /// `handoff_rps` / `handoff_p99_us` figures.
    pub handoff: HandoffCache,
}

/// Bounds of both floor measurements.
#[derive(Clone, Copy, Debug)]
pub struct FloorBounds {
    /// Of each offline figure.
    pub offline: OfflineBounds,
    /// Of each hand-off floor.
    pub handoff: HandoffBounds,
}

/// Fills the floors of every batching row of `workload`'s model in `rows`:
/// `offline_rps` of each row with a mean batch (measured once per batch
/// size), and `handoff_rps` / `handoff_p99_us` of each closed loop (the
/// [`handoff`](crate::handoff) floor of its clients under its
/// `max_batch`, measured once per clients and batch they can form: a
/// 1-client row's off and on share one). What `cache` already holds is not
/// measured again; the rest is, with the engine loaded here once
/// (`intra_threads` as the agents had). `progress` is told what is
/// measured. A failed measurement leaves its figures `None` and says why
/// in the row's note.
pub fn fill_floors(
    rows: &mut [Row],
    workload: &Workload,
    intra_threads: usize,
    bounds: &FloorBounds,
    cache: &mut FloorCache,
    progress: &mut dyn FnMut(&str),
) -> Result<(), BenchError> {
    let model = workload.label();
    let offline_key = |r: &Row| Some((model.clone(), r.batching.as_ref()?.offline_batch?));
    let handoff_key = |r: &Row| {
        let f = r.batching.as_ref()?;
        // The batch never outgrows the clients: one key per batch it can form.
        let rows = f.max_batch.min(r.clients);
        (r.load == "closed").then(|| (model.clone(), rows, r.clients))
    };
    let offline_wanted = missing(rows, &model, offline_key, &cache.offline);
    let handoff_wanted = missing(rows, &model, handoff_key, &cache.handoff);
    if !offline_wanted.is_empty() || !handoff_wanted.is_empty() {
        let backend = workload.load_backend(intra_threads)?;
        let inputs = workload.inputs(backend.signature())?;
        for (m, b) in offline_wanted {
            progress(&format!("offline {m}, batches of {b}"));
            let r = offline_rps(backend.as_ref(), &inputs, b, &bounds.offline);
            cache.offline.insert((m, b), r.map_err(|e| e.0));
        }
        for (m, max_batch, clients) in handoff_wanted {
            progress(&format!(
                "hand-off floor {m}, {clients} clients, max_batch {max_batch}"
            ));
            let r = handoff_floor(
                backend.as_ref(),
                &inputs,
                clients,
                max_batch,
                &bounds.handoff,
            );
            cache
                .handoff
                .insert((m, max_batch, clients), r.map_err(|e| e.0));
        }
    }
    for row in rows.iter_mut().filter(|r| r.model == model) {
        if let Some(k @ (_, b)) = offline_key(row) {
            let what = format!("offline batch of {b}");
            fill_row(row, cache.offline.get(&k), &what, |f, rps| {
                f.offline_rps = Some(rps);
            });
        }
        if let Some(k @ (_, max_batch, clients)) = handoff_key(row) {
            let what = format!("hand-off floor ({clients} clients, max_batch {max_batch})");
            fill_row(row, cache.handoff.get(&k), &what, |f, floor| {
                f.handoff_rps = Some(floor.rps);
                f.handoff_p99_us = Some(floor.p99_us);
            });
        }
    }
    Ok(())
}

/// The keys the rows of `model` need that `cache` lacks, sorted, once each.
fn missing<K: Ord + std::hash::Hash, V>(
    rows: &[Row],
    model: &str,
    key: impl Fn(&Row) -> Option<K>,
    cache: &HashMap<K, V>,
) -> Vec<K> {
    let mut wanted: Vec<K> = rows
        .iter()
        .filter(|r| r.model == model)
        .filter_map(key)
        .filter(|k| !cache.contains_key(k))
        .collect();
    wanted.sort();
    wanted.dedup();
    wanted
}

/// Stores a measured figure in `row` with `set`, or its failure (`what`
/// failed: why) in the row's note.
fn fill_row<V: Copy>(
    row: &mut Row,
    measured: Option<&Result<V, String>>,
    what: &str,
    set: impl FnOnce(&mut BatchingFigures, V),
) {
    match measured {
        Some(Ok(v)) => {
            if let Some(f) = row.batching.as_mut() {
                set(f, *v);
            }
        }
        Some(Err(e)) => {
            if !row.note.is_empty() {
                row.note.push_str("; ");
            }
            let _ = write!(row.note, "{what} failed: {e}");
        }
        None => {}
    }
}

fn load_cell(r: &Row) -> String {
    match r.batching.as_ref().and_then(|f| f.load_fraction) {
        Some(f) => format!("{} {f:.2}× cap", r.load),
        None => r.load.clone(),
    }
}

/// Whether `a` and `b` are the same model, transport and load (clients,
/// load kind, fraction of capacity), batching aside.
fn same_point(a: &Row, b: &Row) -> bool {
    let frac = |r: &Row| r.batching.as_ref().and_then(|f| f.load_fraction);
    a.model == b.model
        && a.transport == b.transport
        && a.clients == b.clients
        && a.load == b.load
        && match (frac(a), frac(b)) {
            (None, None) => true,
            (Some(x), Some(y)) => (x - y).abs() < 1e-9,
            _ => false,
        }
}

fn rps_cell(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn ratio_cell(num: Option<f64>, den: Option<f64>) -> String {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 && n.is_finite() => crate::report::format_ratio(n / d),
        _ => "–".to_string(),
    }
}

fn us_cell(r: Option<&Row>, f: fn(&Row) -> f64) -> String {
    r.map_or("–".to_string(), |r| crate::console::format_us(f(r)))
}

/// The report's tables of the batching rows in `rows`: one per model, a
/// line per (load, clients, transport) with batching off and on side by
/// side (throughput, on/off, mean batch, offline throughput at that batch,
/// on/offline, p50 and p99 of both). Empty when no row has batching
/// figures.
pub fn tables(rows: &[Row]) -> String {
    let batching: Vec<&Row> = rows.iter().filter(|r| r.batching.is_some()).collect();
    let mut models: Vec<&str> = Vec::new();
    for r in &batching {
        if !models.contains(&r.model.as_str()) {
            models.push(&r.model);
        }
    }
    let mut out = String::new();
    for model in models {
        let of_model: Vec<&Row> = batching
            .iter()
            .copied()
            .filter(|r| r.model == model)
            .collect();
        // One line per point, in the order measured, closed loop first.
        let mut points: Vec<&Row> = Vec::new();
        for r in &of_model {
            if !points.iter().any(|p| same_point(p, r)) {
                points.push(r);
            }
        }
        points.sort_by_key(|r| r.rate.is_some());
        let config = of_model
            .iter()
            .filter_map(|r| r.batching.as_ref())
            .find(|f| f.batching == "on")
            .map_or(String::new(), |f| {
                format!(
                    " (on: max_batch={}, max_queue_delay_us={})",
                    f.max_batch, f.max_queue_delay_us
                )
            });
        let _ = writeln!(out, "### {model}: batching off vs on{config}\n");
        let _ = writeln!(
            out,
            "| load | clients | transport | off rps | on rps | on/off | mean batch | \
             offline rps | on/offline | hand-off floor off / on | on/floor | \
             p50 off µs | p50 on µs | p99 off µs | p99 on µs | floor p99 on µs |"
        );
        let _ = writeln!(
            out,
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for p in points {
            let find = |name: &str| {
                of_model.iter().copied().find(|r| {
                    same_point(r, p) && r.batching.as_ref().is_some_and(|f| f.batching == name)
                })
            };
            let (off, on) = (find("off"), find("on"));
            let on_f = on.and_then(|r| r.batching.as_ref());
            let rps = |r: Option<&Row>| r.map(|r| r.throughput_rps);
            let floor = |r: Option<&Row>| r.and_then(|r| r.batching.as_ref()?.handoff_rps);
            let floors = match (floor(off), floor(on)) {
                (None, None) => "–".to_string(),
                (a, b) => format!(
                    "{} / {}",
                    a.map_or("–".to_string(), rps_cell),
                    b.map_or("–".to_string(), rps_cell)
                ),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                load_cell(p),
                p.clients,
                p.transport,
                rps(off).map_or("–".to_string(), rps_cell),
                rps(on).map_or("–".to_string(), rps_cell),
                ratio_cell(rps(on), rps(off)),
                on_f.and_then(|f| f.mean_batch)
                    .map_or("–".to_string(), |b| format!("{b:.1}")),
                on_f.and_then(|f| f.offline_rps)
                    .map_or("–".to_string(), |v| format!(
                        "{} (B={})",
                        rps_cell(v),
                        on_f.and_then(|f| f.offline_batch).unwrap_or(1)
                    )),
                ratio_cell(rps(on), on_f.and_then(|f| f.offline_rps)),
                floors,
                ratio_cell(rps(on), floor(on)),
                us_cell(off, |r| r.p50_us),
                us_cell(on, |r| r.p50_us),
                us_cell(off, |r| r.p99_us),
                us_cell(on, |r| r.p99_us),
                on_f.and_then(|f| f.handoff_p99_us)
                    .map_or("–".to_string(), |v| format!("{v:.0}")),
            );
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::{sample_results, sample_row};

    #[test]
    fn mean_batch_is_the_delta_of_inferences_over_executions() {
        let before = Counts {
            inference: 100,
            execution: 90,
        };
        let after = Counts {
            inference: 1100,
            execution: 340,
        };
        assert_eq!(mean_batch(before, after), Some(4.0));
        assert_eq!(mean_batch(after, after), None, "nothing ran");
        assert_eq!(mean_batch(after, before), None, "counters went back");
        assert_eq!(median_batch(&[Some(3.0), Some(5.0), Some(4.0)]), Some(4.0));
        assert_eq!(median_batch(&[Some(3.0), None]), None);
        assert_eq!(offline_batch(1.0), 1);
        assert_eq!(offline_batch(1.4), 1);
        assert_eq!(offline_batch(14.6), 15);
        assert_eq!(offline_batch(0.0), 1);
        assert_eq!(offline_batch(f64::NAN), 1);
    }

    #[test]
    fn settings_become_the_model_flag() {
        let p = Path::new("models/build/lenet_digits.onnx");
        assert_eq!(
            BatchConfig::ON.model_arg("lenet", p),
            "lenet=models/build/lenet_digits.onnx;max_batch=64;max_queue_delay_us=0"
        );
        assert_eq!(
            BatchConfig::OFF.model_arg("lenet", p),
            "lenet=models/build/lenet_digits.onnx"
        );
        assert_eq!(
            (BatchConfig::ON.name(), BatchConfig::OFF.name()),
            ("on", "off")
        );
    }

    #[test]
    fn counts_are_read_from_triton_statistics() {
        let body = r#"{"model_stats":[
            {"name":"identity","inference_count":5,"execution_count":5},
            {"name":"lenet","version":"1","inference_count":"120","execution_count":30}]}"#;
        assert_eq!(
            parse_counts(body, "lenet").expect("lenet"),
            Counts {
                inference: 120,
                execution: 30
            }
        );
        assert!(parse_counts(body, "nope").is_err());
        assert!(parse_counts("{}", "lenet").is_err());
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(http_body(plain).expect("plain"), "{}");
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(http_body(chunked).expect("chunked"), "{\"a\":1}");
        assert!(http_body(b"HTTP/1.1 404 Not Found\r\n\r\nno model").is_err());
    }

    #[test]
    fn stacking_repeats_the_rows() {
        let one: Vec<Input> = vec![(
            wire::DType::F32,
            vec![1, 2],
            AlignedBuf::copy_from(&[1, 2, 3, 4, 5, 6, 7, 8]).expect("buf"),
        )];
        let s = stack(&one, 3).expect("stack");
        assert_eq!(s[0].1, [3, 2]);
        assert_eq!(&s[0].2[..], [1, 2, 3, 4, 5, 6, 7, 8].repeat(3).as_slice());
        let two: Vec<Input> = vec![(
            wire::DType::U8,
            vec![2],
            AlignedBuf::copy_from(&[1, 2]).expect("buf"),
        )];
        assert!(stack(&two, 3).is_err());
    }

    fn batching_row(transport: &str, clients: usize, config: BatchConfig, rps: f64) -> Row {
        let mut r = sample_row(&format!("tensorwire {transport}"), clients);
        r.suite = "batching".into();
        r.model = "lenet".into();
        r.transport = transport.into();
        r.throughput_rps = rps;
        let mean = if config.is_on() { 15.6 } else { 1.0 };
        let mut f = BatchingFigures::new(config, Some(mean), None);
        f.offline_rps = Some(if config.is_on() { 80_000.0 } else { 20_000.0 });
        f.handoff_rps = Some(if config.is_on() { 50_000.0 } else { 12_000.0 });
        f.handoff_p99_us = Some(if config.is_on() { 310.0 } else { 900.0 });
        r.batching = Some(f);
        r
    }

    #[test]
    fn the_table_pairs_off_and_on() {
        let rows = vec![
            batching_row("shm", 16, BatchConfig::OFF, 10_000.0),
            batching_row("shm", 16, BatchConfig::ON, 40_000.0),
            batching_row("unix", 16, BatchConfig::OFF, 8_000.0),
            sample_row("other", 1),
        ];
        let t = tables(&rows);
        assert!(
            t.contains("### lenet: batching off vs on (on: max_batch=64, max_queue_delay_us=0)")
        );
        let lines: Vec<&str> = t.lines().filter(|l| l.starts_with("| closed")).collect();
        assert_eq!(lines.len(), 2, "{t}");
        assert!(lines[0].starts_with(
            "| closed | 16 | shm | 10000 | 40000 | 4.0× | 15.6 | 80000 (B=16) | 0.50× | \
             12000 / 50000 | 0.80× |"
        ));
        assert!(lines[1]
            .starts_with("| closed | 16 | unix | 8000 | – | – | – | – | – | 12000 / – | – |"));
        assert!(
            lines[0].ends_with("| 310 |"),
            "the floor's p99 with batching on"
        );
        assert!(lines[1].ends_with("| – |"));
        assert_eq!(tables(&[sample_row("x", 1)]), "");
    }

    #[test]
    fn floors_are_measured_once_and_filled_into_their_rows() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let workload = Workload::Model {
            name: "lenet".into(), // as the rows name it; the digits MLP is smaller
            path: root.join("models/build/digits_mlp.onnx"),
            dyn_dim: 1,
            files: Vec::new(),
        };
        let mut rows = vec![
            batching_row("shm", 4, BatchConfig::OFF, 1.0),
            batching_row("unix", 4, BatchConfig::ON, 1.0),
            batching_row("shm", 4, BatchConfig::ON, 1.0),
            batching_row("shm", 1, BatchConfig::OFF, 1.0),
            batching_row("shm", 1, BatchConfig::ON, 1.0),
        ];
        rows[2].load = "poisson".into(); // open loop: no hand-off floor
        for r in &mut rows {
            let f = r.batching.as_mut().expect("batching figures");
            (f.offline_rps, f.handoff_rps, f.handoff_p99_us) = (None, None, None);
        }
        let quick = Duration::from_millis(30);
        let bounds = FloorBounds {
            offline: OfflineBounds {
                duration: quick,
                runs: 100,
                repeats: 1,
            },
            handoff: HandoffBounds {
                warmup: quick,
                duration: quick,
                repeats: 1,
            },
        };
        let mut cache = FloorCache::default();
        let mut measured = Vec::new();
        fill_floors(&mut rows, &workload, 1, &bounds, &mut cache, &mut |w| {
            measured.push(w.to_string())
        })
        .expect("measured");
        // Offline at batches of 1 (off) and 16 (on, mean 15.6); hand-off
        // floors of 4 clients with max_batch 1 and 64, and one for both
        // 1-client rows (a lone client's batch is 1 either way).
        assert_eq!(measured.len(), 5, "{measured:?}");
        let f = |i: usize| rows[i].batching.clone().expect("batching figures");
        assert_eq!(f(3).handoff_rps, f(4).handoff_rps);
        assert!(f(0).offline_rps.is_some() && f(0).handoff_rps.is_some());
        assert!(f(1).handoff_p99_us.is_some_and(|p| p > 0.0));
        assert!(f(2).offline_rps.is_some() && f(2).handoff_rps.is_none());
        // Measured once: a second fill takes every figure from the cache.
        measured.clear();
        fill_floors(&mut rows, &workload, 1, &bounds, &mut cache, &mut |w| {
            measured.push(w.to_string())
        })
        .expect("filled");
        assert!(measured.is_empty(), "{measured:?}");
    }

    #[test]
    fn figures_round_trip_in_results_json() {
        let rows = vec![
            batching_row("shm", 16, BatchConfig::ON, 40_000.0),
            sample_row("plain", 1),
        ];
        let r = sample_results(rows);
        let dir = tempfile::tempdir().expect("tempdir");
        r.write_json(dir.path()).expect("write");
        let text = std::fs::read_to_string(dir.path().join("results.json")).expect("read");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["rows"][0]["batching"], "on");
        assert_eq!(v["rows"][0]["max_batch"], 64);
        assert_eq!(v["rows"][0]["mean_batch"], 15.6);
        assert!(v["rows"][1].get("batching").is_none());
        let back = crate::results::Results::read_json(&dir.path().join("results.json"))
            .expect("read back");
        assert_eq!(back, r);
    }
}
