//! The soak: mixed load over every transport at once for a while, every
//! answer checked, the agent's memory and descriptors sampled each second.
//!
//! Per transport, four or five workers run at once: `sized` (sync
//! `identity` calls of 1 B to 1 MiB, random contents, echo checked),
//! `pipelined` (a window of 8 tickets of 4 KiB each, every response checked
//! against its own request's bytes, so a lost, duplicated or swapped answer
//! shows), `digits` (the model, logits checked against the first answer),
//! `churn` (connect, one call, disconnect) and, when its files exist,
//! `classify` (the tweet classifier, lines of the sample file tokenized and
//! classified, logits checked bit for bit against the answers a quiet agent
//! gave before the load started). Latencies go into one bucket per second:
//! the p99 over time.
//!
//! The slopes of RSS and descriptors are fitted over the second half of the
//! run (the first half is the allocator's warm-up) and judged when the run
//! lasts at least [`JUDGED_SECS`]: a descriptor slope above
//! [`FD_SLOPE_LIMIT`] or an RSS slope above [`RSS_SLOPE_LIMIT_KIB`] is a
//! defect. The soak holds about 3 transports x 5 sessions, so a leak of one
//! descriptor per connection (churn makes thousands a minute) or of one
//! byte per request (about 4 million a minute) is far above either limit.

use crate::agent::AgentUnderTest;
use crate::{Config, Leaks, ScenarioResult, TortureError};
use classifier::run::{InputLine, RemoteTarget, Target};
use classifier::TextTokenizer;
use client::{Client, ClientError, DType, Model, TensorRef};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Runs this long or longer are judged on their slopes.
pub const JUDGED_SECS: u64 = 600;
/// Largest RSS slope over the second half that is not a defect, KiB/min.
pub const RSS_SLOPE_LIMIT_KIB: f64 = 1024.0;
/// Largest descriptor slope over the second half that is not a defect,
/// per minute.
pub const FD_SLOPE_LIMIT: f64 = 1.0;
/// The model name the soak's agent serves the classifier under.
const CLASSIFIER: &str = "classifier";

/// The tweet classifier's files, for the soak's `classify` workers.
#[derive(Clone, Debug)]
pub struct ClassifierFiles {
    /// The ONNX model.
    pub model: PathBuf,
    /// Its tokenizer (`tokenizer.json`).
    pub tokenizer: PathBuf,
    /// Lines to classify (one tweet per line).
    pub lines: PathBuf,
}

/// Lines tokenized once, and the logits a quiet agent gave for each.
struct ClassifierWork {
    encoded: Vec<classifier::tokenize::Encoded>,
    reference: Vec<Vec<f32>>,
}

impl ClassifierWork {
    /// Tokenizes up to 32 lines and asks the (still quiet) agent at `uri`
    /// for each line's logits: the answers every later call must repeat.
    fn prepare(files: &ClassifierFiles, uri: &str) -> Result<ClassifierWork, TortureError> {
        let err = |e: &dyn std::fmt::Display| TortureError(format!("soak classifier: {e}"));
        let tok = TextTokenizer::load(&files.tokenizer).map_err(|e| err(&e))?;
        let lines: Vec<InputLine> = classifier::run::read_lines(&files.lines)
            .map_err(|e| err(&e))?
            .into_iter()
            .take(32)
            .collect();
        if lines.is_empty() {
            return Err(err(&format!("{} has no lines", files.lines.display())));
        }
        let mut target =
            RemoteTarget::connect(uri, CLASSIFIER, Default::default()).map_err(|e| err(&e))?;
        let mut encoded = Vec::new();
        let mut reference = Vec::new();
        for l in &lines {
            let enc = tok.encode(&l.text, l.number).map_err(|e| err(&e))?;
            reference.push(target.infer(&enc).map_err(|e| err(&e))?.logits);
            encoded.push(enc);
        }
        Ok(ClassifierWork { encoded, reference })
    }
}

/// One second of the soak.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Second {
    /// Seconds since the start.
    pub t: u64,
    /// Requests completed in it.
    pub requests: u64,
    /// Their p99, µs.
    pub p99_us: f64,
    /// The agent's RSS at its end, KiB.
    pub rss_kib: u64,
    /// The agent's open descriptors at its end.
    pub fds: usize,
}

/// What the soak found: its row, and the per-second series.
pub struct SoakResult {
    /// The report row (`soak`, transport `all`).
    pub row: ScenarioResult,
    /// p99, RSS and descriptors per second.
    pub seconds: Vec<Second>,
}

struct Counters {
    ok: AtomicU64,
    errors: AtomicU64,
    wrong: AtomicU64,
    first_errors: Mutex<Vec<String>>,
    /// (second, latency ns) of every completed request.
    lat: Mutex<Vec<(u32, u32)>>,
}

impl Counters {
    fn error(&self, wrong: bool, msg: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if wrong {
            self.wrong.fetch_add(1, Ordering::Relaxed);
        }
        let mut f = self.first_errors.lock().unwrap_or_else(|p| p.into_inner());
        if f.len() < 5 {
            f.push(msg);
        }
    }

    fn done(&self, start: Instant, sent: Instant) {
        self.ok.fetch_add(1, Ordering::Relaxed);
        let sec = start.elapsed().as_secs() as u32;
        let ns = sent.elapsed().as_nanos().min(u32::MAX as u128) as u32;
        self.lat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((sec, ns));
    }
}

/// Runs the soak for `secs` on a fresh agent.
pub fn soak(cfg: &Config, secs: u64) -> Result<SoakResult, TortureError> {
    let model_arg = cfg
        .classifier
        .as_ref()
        .map(|f| format!("{CLASSIFIER}={}", f.model.display()));
    let extra: Vec<&str> = match &model_arg {
        Some(m) => vec!["--model", m],
        None => Vec::new(),
    };
    let agent = AgentUnderTest::start(&cfg.exe, &cfg.digits, &extra)?;
    let work = match &cfg.classifier {
        Some(f) => Some(ClassifierWork::prepare(f, &agent.unix)?),
        None => None,
    };
    let workers: u64 = if work.is_some() { 5 } else { 4 };
    let c = Counters {
        ok: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        wrong: AtomicU64::new(0),
        first_errors: Mutex::new(Vec::new()),
        lat: Mutex::new(Vec::new()),
    };
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let fds0 = agent.fds();
    let rss0 = agent.rss_kib();
    let mut samples: Vec<(f64, u64, usize)> = Vec::new();
    std::thread::scope(|s| {
        for t in &cfg.transports {
            let uri = agent.uri(t).to_string();
            for w in 0..workers {
                let (uri, c, stop, work) = (uri.clone(), &c, &stop, work.as_ref());
                s.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(100 + w);
                    while !stop.load(Ordering::Relaxed) {
                        let r = match w {
                            0 => sized(&uri, &mut rng, c, start, stop),
                            1 => pipelined(&uri, &mut rng, c, start, stop),
                            2 => digits(&uri, c, start, stop),
                            3 => churn(&uri, c, start),
                            _ => match work {
                                Some(w) => classify(&uri, w, c, start, stop),
                                None => Ok(()),
                            },
                        };
                        if let Err(e) = r {
                            c.error(false, format!("{uri}: {e}"));
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                });
            }
        }
        let end = start + Duration::from_secs(secs);
        while Instant::now() < end {
            std::thread::sleep(Duration::from_secs(1).min(end - Instant::now()));
            samples.push((start.elapsed().as_secs_f64(), agent.rss_kib(), agent.fds()));
        }
        stop.store(true, Ordering::Relaxed);
    });
    // The workers' sessions are closed: back to the baseline.
    let fds_left = agent.settle_fds(fds0, Duration::from_secs(5));
    let rss1 = agent.rss_kib();
    let mut lat = c.lat.into_inner().unwrap_or_default();
    lat.sort_unstable();
    let mut seconds: Vec<Second> = samples
        .iter()
        .enumerate()
        .map(|(i, &(_, rss, fds))| Second {
            t: i as u64,
            rss_kib: rss,
            fds,
            ..Second::default()
        })
        .collect();
    for sec in seconds.iter_mut() {
        let lo = lat.partition_point(|&(s, _)| (s as u64) < sec.t);
        let hi = lat.partition_point(|&(s, _)| (s as u64) <= sec.t);
        let mut v: Vec<u32> = lat[lo..hi].iter().map(|&(_, ns)| ns).collect();
        v.sort_unstable();
        sec.requests = v.len() as u64;
        if !v.is_empty() {
            sec.p99_us = v[((v.len() - 1) as f64 * 0.99) as usize] as f64 / 1e3;
        }
    }
    let half = samples.len() / 2;
    let rss_slope = slope(&samples[half..], |s| s.1 as f64) * 60.0;
    let fd_slope = slope(&samples[half..], |s| s.2 as f64) * 60.0;
    let p99s: Vec<f64> = seconds
        .iter()
        .map(|s| s.p99_us)
        .filter(|p| *p > 0.0)
        .collect();
    let (p99_first, p99_last) = (
        p99s.first().copied().unwrap_or(0.0),
        p99s.last().copied().unwrap_or(0.0),
    );
    let mut all: Vec<u32> = lat.iter().map(|&(_, ns)| ns).collect();
    all.sort_unstable();
    let p99_all = all
        .get(((all.len().max(1) - 1) as f64 * 0.99) as usize)
        .map_or(0.0, |&ns| ns as f64 / 1e3);
    let mut notes = vec![
        format!(
            "{} transports x (sized 1 B-1 MiB, pipelined window of 8, digits, churn{}) for {secs} s",
            cfg.transports.len(),
            if work.is_some() { ", classifier" } else { "" }
        ),
        format!(
            "RSS slope {rss_slope:+.0} KiB/min, descriptors slope {fd_slope:+.2}/min (second half); p99 {p99_first:.0} us in the first second, {p99_last:.0} us in the last"
        ),
    ];
    let mut defects = 0;
    if secs < JUDGED_SECS {
        notes.push(format!(
            "slopes not judged: runs of {JUDGED_SECS} s or more are"
        ));
    } else {
        if rss_slope > RSS_SLOPE_LIMIT_KIB {
            defects += 1;
            notes.push(format!(
                "defect: RSS grew {rss_slope:.0} KiB/min over the second half (limit {RSS_SLOPE_LIMIT_KIB:.0})"
            ));
        }
        if fd_slope > FD_SLOPE_LIMIT {
            defects += 1;
            notes.push(format!(
                "defect: descriptors grew {fd_slope:.2}/min over the second half (limit {FD_SLOPE_LIMIT:.0})"
            ));
        }
    }
    let first = c.first_errors.into_inner().unwrap_or_default();
    if !first.is_empty() {
        notes.push(format!("errors: {}", first.join("; ")));
    }
    let alive = {
        let mut a = agent;
        a.check_alive()
    };
    if let Err(e) = alive {
        notes.push(e.0);
        defects += 1;
    }
    let ok = c.ok.into_inner();
    Ok(SoakResult {
        row: ScenarioResult {
            name: "soak".into(),
            transport: cfg.transports.join("+"),
            tried: ok + c.errors.load(Ordering::Relaxed),
            defects,
            others_requests: ok,
            others_errors: c.errors.into_inner(),
            others_wrong: c.wrong.into_inner(),
            others_p99_before_us: p99_first,
            others_p99_during_us: p99_all,
            others_p99_after_us: p99_last,
            others_p99_ratio: if p99_first > 0.0 {
                p99_last / p99_first
            } else {
                0.0
            },
            leaks: Leaks {
                fds: fds_left,
                rss_delta_kib: rss1 as i64 - rss0 as i64,
            },
            seconds: start.elapsed().as_secs_f64(),
            notes,
        },
        seconds,
    })
}

/// Least-squares slope of `f` over the samples' times (per second).
fn slope(samples: &[(f64, u64, usize)], f: impl Fn(&(f64, u64, usize)) -> f64) -> f64 {
    let n = samples.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let my = samples.iter().map(&f).sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for s in samples {
        sxy += (s.0 - mx) * (f(s) - my);
        sxx += (s.0 - mx) * (s.0 - mx);
    }
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

fn session(uri: &str, model: &str) -> Result<(Client, Model), ClientError> {
    let c = Client::connect(uri)?;
    let m = c.model(model)?;
    Ok((c, m))
}

fn sized(
    uri: &str,
    rng: &mut fastrand::Rng,
    c: &Counters,
    start: Instant,
    stop: &AtomicBool,
) -> Result<(), ClientError> {
    let (_c, m) = session(uri, "identity")?;
    while !stop.load(Ordering::Relaxed) {
        let len = 1usize << rng.u32(0..=20);
        let len = rng.usize(len / 2 + 1..=len);
        let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        let sent = Instant::now();
        let r = m.infer(&[TensorRef::new(DType::U8, &[len as u64], &data)?])?;
        if r.outputs.first().map(|o| o.bytes()) == Some(data.as_slice()) {
            c.done(start, sent);
        } else {
            c.error(
                true,
                format!("{uri}: identity echoed other bytes ({len} B)"),
            );
        }
    }
    Ok(())
}

fn pipelined(
    uri: &str,
    rng: &mut fastrand::Rng,
    c: &Counters,
    start: Instant,
    stop: &AtomicBool,
) -> Result<(), ClientError> {
    let (_c, m) = session(uri, "identity")?;
    let mut window = VecDeque::new();
    loop {
        while window.len() < 8 && !stop.load(Ordering::Relaxed) {
            let data: Vec<u8> = (0..4096).map(|_| rng.u8(..)).collect();
            let t = m.submit(&[TensorRef::new(DType::U8, &[4096], &data)?])?;
            window.push_back((Instant::now(), data, t));
        }
        let Some((sent, data, t)) = window.pop_front() else {
            return Ok(());
        };
        let r = t.wait()?;
        if r.outputs.first().map(|o| o.bytes()) == Some(data.as_slice()) {
            c.done(start, sent);
        } else {
            c.error(
                true,
                format!("{uri}: a pipelined answer is not its request's"),
            );
        }
    }
}

fn digits(uri: &str, c: &Counters, start: Instant, stop: &AtomicBool) -> Result<(), ClientError> {
    let (_c, m) = session(uri, "digits")?;
    let x: Vec<u8> = (0..4 * 64)
        .flat_map(|i| (i as f32 / 256.0).to_le_bytes())
        .collect();
    let mut want: Option<Vec<u8>> = None;
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let r = m.infer(&[TensorRef::new(DType::F32, &[4, 64], &x)?])?;
        let got = r
            .outputs
            .first()
            .map(|o| o.bytes().to_vec())
            .unwrap_or_default();
        match &want {
            None => {
                want = Some(got);
                c.done(start, sent);
            }
            Some(w) if *w == got => c.done(start, sent),
            Some(_) => c.error(true, format!("{uri}: digits gave other logits")),
        }
    }
    Ok(())
}

fn classify(
    uri: &str,
    work: &ClassifierWork,
    c: &Counters,
    start: Instant,
    stop: &AtomicBool,
) -> Result<(), ClientError> {
    let mut target = match RemoteTarget::connect(uri, CLASSIFIER, Default::default()) {
        Ok(t) => t,
        Err(e) => {
            c.error(false, format!("{uri}: classifier session: {e}"));
            std::thread::sleep(Duration::from_millis(10));
            return Ok(());
        }
    };
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let line = i % work.encoded.len();
        i += 1;
        let sent = Instant::now();
        match target.infer(&work.encoded[line]) {
            Ok(r) if r.logits == work.reference[line] => c.done(start, sent),
            Ok(_) => c.error(
                true,
                format!("{uri}: the classifier gave other logits for line {line}"),
            ),
            Err(e) => {
                c.error(false, format!("{uri}: classifier: {e}"));
                std::thread::sleep(Duration::from_millis(10));
                return Ok(());
            }
        }
    }
    Ok(())
}

fn churn(uri: &str, c: &Counters, start: Instant) -> Result<(), ClientError> {
    let sent = Instant::now();
    let (_c, m) = session(uri, "identity")?;
    let data = [9u8; 100];
    let r = m.infer(&[TensorRef::new(DType::U8, &[100], &data)?])?;
    if r.outputs.first().map(|o| o.bytes()) == Some(&data[..]) {
        c.done(start, sent);
    } else {
        c.error(true, format!("{uri}: churn echo differs"));
    }
    Ok(())
}
