//! `tensorwire classify`: the tweet classifier of issue 4, in the shape of
//! the original vAccel experiment: every line of a text file is tokenized
//! and classified with one request (batch 1), and the client-side time of
//! each line (tokenize + request + response) is printed:
//!
//! ```text
//! Processing 100 lines from: examples/classifier/tweets.txt
//! Line 1: Duration: 8.61 ms Prediction: neither
//! ...
//! Average (after 4th iteration): 8.50 ms
//! ```
//!
//! The model runs in an agent embedded in this process by default
//! (`--connect inproc://`, the model loaded into it), in the engine directly
//! (`--connect local`), or in a running agent (`--connect unix://...` or
//! `tcp://...`), which must serve it under the name `classifier`
//! (`tensorwire serve --model classifier=models/build/tweet_classifier.onnx
//! ...`; `--model-name` for another name). The label names always come from
//! the model's JSON sidecar (`-m` with `.json`, or `--labels`).
//!
//! `--compare inproc,shm,unix,tcp,tcp?nodelay=0` loads the engine directly
//! (`local`, the reference) and starts a fresh agent per configuration
//! (`inproc` embedded; `shm`/`unix`/`tcp` as `tensorwire serve` child
//! processes, stopped with SIGTERM afterwards and killed on any error), all
//! before the first line; then every line goes through every configuration
//! in rotating order (line i starts at configuration i mod n, and odd passes
//! go the other way round), for `--repeats` passes over the file (3), so
//! that machine drift lands on every configuration alike. It checks that
//! every prediction and every logit is bit-identical to `local`, and prints
//! a table: first inference (cold start), median per-line latency with the
//! min..max of the passes' medians, p99, the RPC tax (the median over lines
//! of the configuration's time minus local's for the same line, absolute
//! and as % of local's median, with the passes' min..max), CPU per line
//! (client + agent) and its ratio to local's, identical. It exits non-zero
//! if any configuration differs.
//!
//! Blank lines are skipped; a line over 512 tokens is truncated with a
//! warning on stderr naming it. A file with no lines prints `No lines to
//! classify in FILE` (on stderr with `--json`) and exits 0 without loading
//! anything.

use super::CmdError;
use classifier::agents::AgentSpec;
use classifier::compare::{self, Workload};
use classifier::paths::{self, DEFAULT_MODEL, DEFAULT_TOKENIZER, SETUP_HINT};
use classifier::run::{self, LineResult, LocalTarget, RemoteTarget, RunReport, Target};
use classifier::{Labels, TextTokenizer, DEFAULT_MODEL_NAME, WARMUP_LINES};
use client::ClientOptions;
use server::Agent;
use std::path::{Path, PathBuf};
use transport::Endpoint;

/// Arguments of `classify`.
#[derive(clap::Args)]
pub struct Args {
    /// The classifier (ONNX: int64 input_ids, attention_mask, token_type_ids
    /// [batch, seq] → float32 logits [batch, labels]). Relative paths are
    /// looked up in the current directory, then in the checkout this binary
    /// was built from.
    #[arg(short = 'm', long = "model", value_name = "MODEL", default_value = DEFAULT_MODEL)]
    model: PathBuf,
    /// The tokenizer (a Hugging Face tokenizer.json; padding is turned off
    /// and truncation set to 512 tokens).
    #[arg(short = 't', long = "tokenizer", value_name = "TOKENIZER", default_value = DEFAULT_TOKENIZER)]
    tokenizer: PathBuf,
    /// The text to classify, one item per line (blank lines are skipped).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,
    /// Where the model runs: inproc:// (an agent embedded in this process,
    /// the model loaded into it), local (the engine directly, no agent), or
    /// a running agent at unix:///PATH or tcp://HOST:PORT that serves the
    /// model as `classifier` (see --model-name).
    #[arg(
        long,
        value_name = "URI",
        default_value = "inproc://",
        conflicts_with = "compare"
    )]
    connect: String,
    /// The model's name on the agent.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_MODEL_NAME)]
    model_name: String,
    /// The label names (JSON with a "labels" list in logit order; default:
    /// MODEL with the extension .json).
    #[arg(long, value_name = "FILE")]
    labels: Option<PathBuf>,
    /// Compare configurations against the engine called directly (local):
    /// a comma-separated list of inproc, unix, tcp, tcp?nodelay=0. Each gets
    /// a fresh agent; every prediction and logit must be bit-identical to
    /// local's, or the command fails.
    #[arg(long, value_name = "LIST")]
    compare: Option<String>,
    /// With --compare: passes over the file, each line going through every
    /// configuration in rotating order.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    repeats: u32,
    /// Print JSON instead of text (with --compare: the table as a list of
    /// {config, passes, lines, first_ms, avg_ms, median_ms, median_spread_ms,
    /// p99_ms, tax_ms, tax_spread_ms, tax_pct, tax_pct_spread, client_cpu_us,
    /// agent_cpu_us, cpu_us, cpu_vs_local, identical}).
    #[arg(long)]
    json: bool,
    /// Also print each line's tokenize time, and the agent's stages (mean
    /// over the lines after the 4th: request, payload, queue, compute,
    /// response).
    #[arg(long, short = 'v', visible_alias = "stages")]
    verbose: bool,
    /// ONNX Runtime intra-op threads (for local and the agents started here).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    intra_threads: u32,
    /// Whether ONNX Runtime's intra-op threads spin after a run before they
    /// sleep, on or off (for local and the agents started here alike).
    /// Default off, unlike `serve`: a comparison keeps every configuration's
    /// engine loaded, and with spinning on, the idle engines' threads take
    /// the cores from the busy one (see docs/BENCHMARKS.md).
    #[arg(
        long,
        value_name = "on|off",
        default_value = "off",
        action = clap::ArgAction::Set,
        value_parser = super::parse_switch_flag
    )]
    intra_spinning: bool,
}

impl Args {
    /// The model as every configuration runs it: `local` loads the engine
    /// with the options an agent would ([`AgentSpec::ort_options`]); agents
    /// started here get the same settings.
    fn agent_spec(&self, model: &Path) -> Result<AgentSpec, CmdError> {
        Ok(AgentSpec {
            model_name: self.model_name.clone(),
            model_path: model.to_path_buf(),
            intra_threads: self.intra_threads as usize,
            intra_spinning: self.intra_spinning,
            serve_exe: std::env::current_exe()?,
            spin_us: None,
        })
    }
}

/// Runs `classify`.
pub fn run(a: Args) -> Result<(), CmdError> {
    // A bad --compare list fails before anything is loaded or started.
    let configs = a.compare.as_deref().map(compare::parse_list).transpose()?;
    let file = paths::resolve(&a.file);
    let lines = run::read_lines(&file)?;
    if lines.is_empty() {
        let msg = format!("No lines to classify in {}", file.display());
        if a.json {
            eprintln!("{msg}");
        } else {
            println!("{msg}");
        }
        return Ok(());
    }
    let model = paths::resolve(&a.model);
    let tok_path = paths::resolve(&a.tokenizer);
    let tokenizer = TextTokenizer::load(&tok_path)
        .map_err(|e| with_setup_hint(e.into(), &tok_path, &a.tokenizer, DEFAULT_TOKENIZER))?;
    let needs_model_file = configs.is_some() || !is_remote(&a.connect);
    if needs_model_file && !model.is_file() {
        let e = format!("cannot load model {}: no such file", model.display());
        return Err(with_setup_hint(e.into(), &model, &a.model, DEFAULT_MODEL));
    }
    let labels_path = match &a.labels {
        Some(p) => paths::resolve(p),
        None => Labels::sidecar_path(&model),
    };
    let labels = Labels::load(&labels_path)
        .map_err(|e| with_setup_hint(e.into(), &model, &a.model, DEFAULT_MODEL))?;
    warn_truncated(&tokenizer, &lines, &file)?;

    match configs {
        Some(configs) => run_compare(&a, &file, &model, &tokenizer, &labels, &lines, &configs),
        None => run_single(&a, &file, &model, &tokenizer, &labels, &lines),
    }
}

/// Whether `uri` names an agent this command does not start.
fn is_remote(uri: &str) -> bool {
    uri.starts_with("unix://") || uri.starts_with("tcp://")
}

/// Adds "run `bash scripts/setup.sh`" to an error about a default file
/// that is missing.
fn with_setup_hint(e: CmdError, resolved: &Path, given: &Path, default: &str) -> CmdError {
    if given == Path::new(default) && !resolved.exists() {
        format!("{e} ({SETUP_HINT})").into()
    } else {
        e
    }
}

/// Tokenizes every line once up front, warning on stderr about each line
/// that will be truncated (and failing early on a line that cannot be
/// tokenized).
fn warn_truncated(
    tok: &TextTokenizer,
    lines: &[run::InputLine],
    file: &Path,
) -> Result<(), CmdError> {
    for l in lines {
        if let Some(n) = tok.encode(&l.text, l.number)?.truncated_from {
            eprintln!(
                "tensorwire classify: warning: line {} of {} has {n} tokens; truncated to {}",
                l.number,
                file.display(),
                tok.max_tokens()
            );
        }
    }
    Ok(())
}

/// One run, printed line by line as in the original experiment.
fn run_single(
    a: &Args,
    file: &Path,
    model: &Path,
    tok: &TextTokenizer,
    labels: &Labels,
    lines: &[run::InputLine],
) -> Result<(), CmdError> {
    let spec = a.agent_spec(model)?;
    let opts = ClientOptions {
        want_timeline: a.verbose,
        ..ClientOptions::default()
    };
    // Keeps the embedded agent (if any) alive while the target is used.
    let mut agent: Option<Agent> = None;
    let mut target: Box<dyn Target> = if a.connect == "local" {
        Box::new(LocalTarget::load(model, &spec.ort_options())?)
    } else {
        if let Endpoint::Inproc(name) = Endpoint::parse(&a.connect)? {
            if transport::inproc::lookup(&name).is_none() {
                agent = Some(Agent::start(
                    spec.agent_config(vec![Endpoint::Inproc(name)]),
                )?);
            }
        }
        match RemoteTarget::connect(&a.connect, &a.model_name, opts) {
            Ok(t) => Box::new(t),
            Err(classifier::ClassifierError::Client(client::ClientError::UnknownModel(m))) => {
                return Err(format!(
                    "the agent at {} serves no model '{m}': start it with \
                     `tensorwire serve --model {}=PATH.onnx ...`, or pass --model-name",
                    a.connect, a.model_name
                )
                .into())
            }
            Err(e) => return Err(e.into()),
        }
    };
    if !a.json {
        println!("Processing {} lines from: {}", lines.len(), file.display());
    }
    let mut print_line = |r: &LineResult| {
        if a.json {
            return;
        }
        let mut s = format!(
            "Line {}: Duration: {:.2} ms Prediction: {}",
            r.line,
            r.total_ms(),
            labels.name(r.prediction)
        );
        if a.verbose {
            s.push_str(&format!(
                " (tokenize {:.3} ms, {} tokens)",
                r.tokenize_ns as f64 / 1e6,
                r.tokens
            ));
        }
        println!("{s}");
    };
    let report = run::run_lines(
        &a.connect,
        target.as_mut(),
        tok,
        labels,
        lines,
        &mut print_line,
    )?;
    drop(target);
    if let Some(agent) = agent {
        agent.shutdown(std::time::Duration::from_secs(5));
    }
    if a.json {
        println!("{}", single_json(&report, file, labels));
        return Ok(());
    }
    match report.avg_ms() {
        Some(avg) => println!("Average (after {WARMUP_LINES}th iteration): {avg:.2} ms"),
        None => println!(
            "Average (after {WARMUP_LINES}th iteration): n/a (only {} lines)",
            report.lines.len()
        ),
    }
    if a.verbose {
        print!("{}", compare::render_stages(std::slice::from_ref(&report)));
    }
    Ok(())
}

/// One run as JSON: the summary and every line.
fn single_json(report: &RunReport, file: &Path, labels: &Labels) -> serde_json::Value {
    let lines: Vec<serde_json::Value> = report
        .lines
        .iter()
        .map(|l| {
            serde_json::json!({
                "line": l.line,
                "ms": l.total_ms(),
                "tokenize_ms": l.tokenize_ns as f64 / 1e6,
                "tokens": l.tokens,
                "truncated_from": l.truncated_from,
                "prediction": labels.name(l.prediction),
                "logits": l.logits,
            })
        })
        .collect();
    serde_json::json!({
        "config": report.config,
        "file": file.display().to_string(),
        "first_ms": report.first_ms(),
        "avg_ms": report.avg_ms(),
        "lines": lines,
    })
}

/// `--compare`: local and one fresh agent per configuration, all started
/// first, then every line through every configuration in rotating order,
/// `--repeats` times.
fn run_compare(
    a: &Args,
    file: &Path,
    model: &Path,
    tok: &TextTokenizer,
    labels: &Labels,
    lines: &[run::InputLine],
    configs: &[compare::ConfigSpec],
) -> Result<(), CmdError> {
    let w = Workload {
        tokenizer: tok,
        labels,
        lines,
        agent: a.agent_spec(model)?,
        timelines: a.verbose,
    };
    let repeats = a.repeats as usize;
    if !a.json {
        println!("Processing {} lines from: {}", lines.len(), file.display());
        println!(
            "model {} ({} labels), {} intra-op threads (spinning {}), batch 1; {repeats} passes, each line \
             through every configuration in rotating order; figures over the lines after the \
             {WARMUP_LINES}th of each pass; tax = median over lines of (configuration - local) \
             for the same line",
            model.display(),
            labels.len(),
            a.intra_threads,
            if a.intra_spinning { "on" } else { "off" }
        );
    }
    if a.intra_threads > 1 && a.intra_spinning && !configs.is_empty() {
        eprintln!(
            "tensorwire classify: warning: with {} intra-op threads and --intra-spinning on, \
             each engine's ONNX Runtime workers spin for a while after every run; with {} \
             engines interleaved they compete for the cores and every latency (and CPU) is \
             inflated. --intra-spinning off (the default) avoids it.",
            a.intra_threads,
            configs.len() + 1
        );
    }
    let started = std::time::Instant::now();
    let x = compare::run_interleaved(configs, &w, repeats, &mut |pass| {
        eprintln!(
            "tensorwire classify: pass {pass}/{repeats} done ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
    })?;
    let rows = compare::table(&x);
    if a.json {
        println!("{}", compare::to_json(&rows));
    } else {
        print!("{}", compare::render(&rows));
        println!(
            "cpu/line: this process's CPU during the configuration's lines (client; for local \
             and inproc the engine or agent too) + the agent process's CPU (agent), per line"
        );
        if a.verbose {
            println!();
            let all: Vec<RunReport> = (0..x.configs.len()).map(|c| x.merged(c)).collect();
            print!("{}", compare::render_stages(&all));
        }
    }
    let mut differing = Vec::new();
    for (c, name) in x.configs.iter().enumerate() {
        if let Some(d) = x.difference(c) {
            eprintln!("tensorwire classify: {name} differs from local: {d}");
            differing.push(name.clone());
        }
    }
    if differing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} not bit-identical to local: {}",
            if differing.len() == 1 {
                "1 configuration is"
            } else {
                "configurations are"
            },
            differing.join(", ")
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(
            ["classify", "-f", "t.txt"]
                .into_iter()
                .chain(flags.iter().copied()),
        )
        .map(|c| c.args)
    }

    #[test]
    fn intra_spinning_reaches_local_and_the_agents() {
        let model = Path::new("m.onnx");
        // Off unless asked: a comparison keeps every engine loaded.
        let default = parse(&[]).unwrap().agent_spec(model).unwrap();
        assert!(!default.intra_spinning);
        for (flag, want) in [("off", false), ("on", true)] {
            let spec = parse(&["--intra-spinning", flag, "--intra-threads", "3"])
                .unwrap()
                .agent_spec(model)
                .unwrap();
            assert_eq!(spec.intra_spinning, want, "{flag}");
            let local = spec.ort_options();
            assert_eq!((local.intra_threads, local.intra_spinning), (3, want));
            let agent = spec.agent_config(Vec::new());
            assert_eq!((agent.intra_threads, agent.intra_spinning), (3, want));
        }
        let e = parse(&["--intra-spinning", "yes"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("'yes'") && e.contains("on or off"), "{e}");
    }
}
