//! `tensorwire torture`: the reliability suite ([`torture`]): a real agent
//! attacked one way at a time while a well-behaved client is served
//! beside it; prints a row per scenario and, with `--out`, writes
//! `results.json` and `report.md`. Exits non-zero when a row is not clean
//! (a defect, an error of the well-behaved client, a descriptor left
//! behind).

use super::CmdError;
use classifier::paths;
use std::path::{Path, PathBuf};

/// Arguments of `torture`.
#[derive(clap::Args)]
pub struct Args {
    /// The short run (CI, a few minutes): fewer messages, shorter attacks.
    #[arg(long)]
    quick: bool,
    /// Transports to attack, comma-separated (unix, tcp, shm).
    #[arg(long, default_value = "unix,tcp,shm", value_delimiter = ',')]
    transports: Vec<String>,
    /// Hostile messages per socket transport (default: 3 000 quick, 500 000
    /// full).
    #[arg(long)]
    messages: Option<u64>,
    /// Other listeners to attack, comma-separated (tls, vsock, http, grpc;
    /// vsock is skipped, saying why, where this machine cannot reach
    /// itself over it).
    #[arg(long, default_value = "tls,vsock,http,grpc", value_delimiter = ',')]
    listeners: Vec<String>,
    /// Hostile messages per listener of --listeners (default: 600 quick,
    /// 200 000 full).
    #[arg(long)]
    listener_messages: Option<u64>,
    /// Hostile shm clients per shm row (default: 30 quick, 3000 full).
    #[arg(long)]
    shm_rounds: Option<u64>,
    /// Seconds of the soak (default: 20 quick, 3600 full; 0 skips it).
    #[arg(long, value_name = "SECS")]
    soak_secs: Option<u64>,
    /// Run only these groups of scenarios, comma-separated: sockets, shm,
    /// listeners, budget, kills, faults, soak (default: all).
    #[arg(long, value_delimiter = ',', value_parser = parse_group, value_name = "GROUPS")]
    only: Vec<torture::Group>,
    /// Run only the soak, none of the attacks (`--only soak`).
    #[arg(long, conflicts_with = "only")]
    soak_only: bool,
    /// Leave the tweet classifier out of the soak's mix (it is in when
    /// models/build/tweet_classifier.onnx and its tokenizer exist).
    #[arg(long)]
    no_classifier: bool,
    /// Write results.json, report.md, soak.csv and the soak figures here.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The digits model the agent serves beside identity (default:
    /// models/build/digits_mlp.onnx).
    #[arg(long, value_name = "PATH")]
    digits: Option<PathBuf>,
}

/// One `--only` group, named as the help says.
fn parse_group(s: &str) -> Result<torture::Group, String> {
    s.parse()
}

/// Runs `torture`.
pub fn run(a: Args) -> Result<(), CmdError> {
    for t in &a.transports {
        if !["unix", "tcp", "shm"].contains(&t.as_str()) {
            return Err(format!("--transports: '{t}' is not unix, tcp or shm").into());
        }
    }
    for l in &a.listeners {
        if !["tls", "vsock", "http", "grpc"].contains(&l.as_str()) {
            return Err(format!("--listeners: '{l}' is not tls, vsock, http or grpc").into());
        }
    }
    let digits = a
        .digits
        .unwrap_or_else(|| classifier::paths::repo_root().join("models/build/digits_mlp.onnx"));
    if !digits.is_file() {
        return Err(format!(
            "{} is missing: run scripts/setup.sh (or pass --digits PATH)",
            digits.display()
        )
        .into());
    }
    let mut cfg = torture::Config::new(std::env::current_exe()?, digits, a.quick);
    cfg.transports = a.transports;
    if let Some(n) = a.messages {
        if n == 0 || n > 100_000_000 {
            return Err("--messages must be 1 to 100000000".into());
        }
        cfg.messages = n;
    }
    cfg.listeners = a.listeners;
    if let Some(n) = a.shm_rounds {
        if n == 0 || n > 10_000_000 {
            return Err("--shm-rounds must be 1 to 10000000".into());
        }
        cfg.shm_rounds = n;
    }
    if let Some(n) = a.listener_messages {
        if n == 0 || n > 100_000_000 {
            return Err("--listener-messages must be 1 to 100000000".into());
        }
        cfg.listener_messages = n;
    }
    if let Some(s) = a.soak_secs {
        if s > 7 * 24 * 3600 {
            return Err("--soak-secs must be at most a week".into());
        }
        cfg.soak = std::time::Duration::from_secs(s);
    }
    if a.soak_only {
        cfg.groups = vec![torture::Group::Soak];
    } else if !a.only.is_empty() {
        cfg.groups = a.only;
    }
    if cfg.groups == [torture::Group::Soak] && cfg.soak.is_zero() {
        return Err("only the soak, with --soak-secs 0, runs nothing".into());
    }
    if !a.no_classifier {
        let files = torture::soak::ClassifierFiles {
            model: paths::resolve(Path::new(paths::DEFAULT_MODEL)),
            tokenizer: paths::resolve(Path::new(paths::DEFAULT_TOKENIZER)),
            lines: paths::resolve(Path::new(paths::SAMPLE_TWEETS)),
        };
        if [&files.model, &files.tokenizer, &files.lines]
            .iter()
            .all(|p| p.is_file())
        {
            cfg.classifier = Some(files);
        } else {
            println!(
                "the soak runs without the classifier: {} or its tokenizer is missing ({})",
                files.model.display(),
                paths::SETUP_HINT
            );
        }
    }
    let report = torture::run(&cfg, false)?;
    if let Some(dir) = &a.out {
        torture::report::write(dir, &report)?;
        println!(
            "wrote results.json, report.md, soak.csv and the soak figures to {}",
            dir.display()
        );
    }
    let dirty: Vec<String> = report
        .scenarios
        .iter()
        .filter(|r| !r.clean())
        .map(|r| format!("{} / {}", r.name, r.transport))
        .collect();
    if dirty.is_empty() {
        println!("all {} scenarios clean", report.scenarios.len());
        Ok(())
    } else {
        Err(format!("not clean: {}", dirty.join(", ")).into())
    }
}
