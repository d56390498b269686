//! The tweet classifier table of the `vaccel` suite: every line of
//! `examples/classifier/tweets.txt` tokenized on the client and classified
//! by the MiniLM tweet classifier, locally (the engine in this process) and
//! through an agent over each transport — vAccel's BERT experiment, with
//! the same code as `tensorwire classify --compare`
//! ([`classifier::compare`]).
//!
//! One pass over the lines is one repeat; a row's latencies are the lines'
//! end-to-end times (tokenize + request + response) after the first
//! [`classifier::WARMUP_LINES`] of each pass. Machine noise is measured
//! over each pass as for every other row (`/proc/stat` against this
//! process and the agents it reaped). CPU per line is not reported: a pass
//! starts its own agent, and loading the model costs more CPU than the
//! hundred lines do.

use crate::caller::BenchError;
use crate::console::Console;
use crate::hist::{LatencyHist, StageHists, CDF_QUANTILES};
use crate::resources;
use crate::results::Row;
use crate::stats::spread;
use crate::suite::ClassifierPart;
use crate::target::{BenchEnv, Net};
use classifier::agents::{AgentSpec, Transport};
use classifier::compare::{self, ConfigSpec};
use classifier::{paths, Labels, TextTokenizer};
use classifier::{RunReport, WARMUP_LINES};

/// The model's name in rows.
pub const MODEL: &str = "tweet-classifier";

/// Runs the comparison: `local` and each transport, `part.repeats` passes
/// each, interleaved.
pub fn run(
    suite: &str,
    part: &ClassifierPart,
    env: &BenchEnv,
    console: &mut Console,
    done_before: usize,
) -> Result<Vec<Row>, BenchError> {
    let e = |x: classifier::ClassifierError| BenchError::new(format!("classifier: {x}"));
    let model = paths::resolve(std::path::Path::new(paths::DEFAULT_MODEL));
    let tokenizer = TextTokenizer::load(&paths::resolve(std::path::Path::new(
        paths::DEFAULT_TOKENIZER,
    )))
    .map_err(e)?;
    let labels = Labels::for_model(&model).map_err(e)?;
    let mut lines =
        classifier::run::read_lines(&paths::resolve(std::path::Path::new(paths::SAMPLE_TWEETS)))
            .map_err(e)?;
    lines.truncate(part.lines.max(WARMUP_LINES + 1));
    let w = compare::Workload {
        tokenizer: &tokenizer,
        labels: &labels,
        lines: &lines,
        agent: AgentSpec {
            model_name: MODEL.into(),
            model_path: model.clone(),
            intra_threads: env.intra_threads,
            intra_spinning: engine::DEFAULT_INTRA_SPINNING,
            serve_exe: env.exe.clone(),
            spin_us: env.spin.map(|d| d.as_micros() as u64),
        },
        timelines: env.stages,
    };
    let mut configs: Vec<(String, Option<ConfigSpec>)> = vec![("local".into(), None)];
    for net in &part.transports {
        let transport = match net {
            Net::Inproc => Transport::Inproc,
            Net::Shm => Transport::Shm,
            Net::Unix => Transport::Unix,
            Net::Tcp { nodelay } => Transport::Tcp { nodelay: *nodelay },
            // The classifier compare runs the native client only.
            Net::None | Net::Grpc | Net::Http | Net::Gateway => continue,
        };
        configs.push((
            net.name().to_string(),
            Some(ConfigSpec {
                name: net.name().to_string(),
                transport,
            }),
        ));
    }
    let mut reports: Vec<Vec<RunReport>> = configs.iter().map(|_| Vec::new()).collect();
    let mut noises: Vec<Vec<f64>> = configs.iter().map(|_| Vec::new()).collect();
    for rep in 0..part.repeats {
        for (i, (name, spec)) in configs.iter().enumerate() {
            console.begin(&format!(
                "classifier {name} ({} lines) repeat {}/{}",
                lines.len(),
                rep + 1,
                part.repeats
            ));
            let sys0 = resources::SystemCpu::snapshot()?;
            let own0 = resources::self_cpu_ns() + resources::reaped_children_cpu_ns()?;
            let t0 = std::time::Instant::now();
            let r = match spec {
                None => compare::run_local(&w),
                Some(s) => compare::run_config(s, &w),
            }
            .map_err(e)?;
            let elapsed = t0.elapsed();
            // The agent of a pass is a child this process reaped by now.
            let own = (resources::self_cpu_ns() + resources::reaped_children_cpu_ns()?)
                .saturating_sub(own0);
            let sys1 = resources::SystemCpu::snapshot()?;
            if elapsed >= crate::measure::NOISE_MIN {
                noises[i].push(resources::noise_cpu_pct(&sys0, &sys1, own, elapsed));
            }
            reports[i].push(r);
        }
    }
    let mut rows = Vec::new();
    for (((name, spec), reps), noise) in configs.iter().zip(&reports).zip(&noises) {
        // Every configuration must give local's predictions and logits.
        if let Some(diff) = reps
            .iter()
            .find_map(|r| compare::first_difference(&reports[0][0], r))
        {
            return Err(BenchError::new(format!(
                "classifier over {name} differs from local: {diff}"
            )));
        }
        let row = to_row(suite, name, spec.is_some(), reps, noise);
        console.row(&row);
        rows.push(row);
        console.progress(done_before + rows.len());
    }
    Ok(rows)
}

fn to_row(suite: &str, name: &str, remote: bool, reps: &[RunReport], noises: &[f64]) -> Row {
    let hists: Vec<LatencyHist> = reps
        .iter()
        .map(|r| {
            let mut h = LatencyHist::new();
            for l in r.lines.iter().skip(WARMUP_LINES) {
                h.record(l.total_ns);
            }
            h
        })
        .collect();
    let pick = |f: &dyn Fn(&LatencyHist) -> f64| spread(&hists.iter().map(f).collect::<Vec<_>>());
    let (p50, p50_min, p50_max) = pick(&|h| h.percentile_us(0.5));
    let (p99, p99_min, p99_max) = pick(&|h| h.percentile_us(0.99));
    let (p90, _, _) = pick(&|h| h.percentile_us(0.9));
    let (mean, _, _) = pick(&|h| h.mean_us());
    let mut merged = LatencyHist::new();
    for h in &hists {
        merged.merge(h);
    }
    let requests: u64 = hists.iter().map(LatencyHist::count).sum();
    let (noise, _, noise_max) = if noises.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        spread(noises)
    };
    let mut note = String::from(
        "tokenize + request + response per line (unpinned); tensor bytes vary by line",
    );
    if noise_max > 25.0 {
        note.push_str(&format!(
            "; noisy: other processes used up to {noise_max:.0}% of a core"
        ));
    }
    Row {
        suite: suite.into(),
        target: if remote {
            format!("tensorwire {name}")
        } else {
            "in-process".into()
        },
        framework: if remote { "tensorwire" } else { "local" }.into(),
        transport: if remote { name } else { "none" }.into(),
        peer: false,
        model: MODEL.into(),
        tensor_bytes: 0,
        clients: 1,
        load: "closed".into(),
        rate: None,
        requests,
        errors: 0,
        warmup: WARMUP_LINES as u64,
        repeats: reps.len(),
        p50_us: p50,
        p50_spread_us: [p50_min, p50_max],
        p90_us: p90,
        p99_us: p99,
        p99_spread_us: [p99_min, p99_max],
        mean_us: mean,
        throughput_rps: if mean > 0.0 { 1e6 / mean } else { 0.0 },
        cpu_us_per_req: None,
        agent_cpu_us_per_req: None,
        agent_rss_kib: None,
        stages: StageHists::new().stats(),
        cdf: merged.cdf(CDF_QUANTILES),
        noise_cpu_pct: noise,
        note,
        batching: None,
        tenants: None,
    }
}
