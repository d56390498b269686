//! `tensorwire calibrate`: measure the data movers, write the mover policy,
//! or evaluate one (`bench::calibrate`).

use super::CmdError;
use bench::calibrate::{self, Plan};
use std::path::PathBuf;

/// Arguments of `calibrate`.
#[derive(clap::Args)]
pub struct Args {
    /// Where to write the policy (default: TENSORWIRE_MOVER_POLICY, else
    /// ~/.config/tensorwire/mover-policy.json).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Fewer sizes (64 B .. 16 MiB), fewer repetitions: under a minute.
    #[arg(long)]
    quick: bool,
    /// Largest size measured, bytes (default 256 MiB; 16 MiB with --quick).
    #[arg(long, value_name = "BYTES")]
    max_size: Option<usize>,
    /// Evaluate this policy instead of writing one: sizes 3·4^k and
    /// concurrency 3 (never trained on), every fixed mover and auto, the
    /// oracle ratio per case and totals; decision cost p50/p99.
    #[arg(long, value_name = "FILE")]
    evaluate: Option<PathBuf>,
    /// Also write the measurements as JSON here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Runs `calibrate`.
pub fn run(a: Args) -> Result<(), CmdError> {
    let max = a
        .max_size
        .unwrap_or(if a.quick { 16 << 20 } else { 256 << 20 });
    if let Some(p) = &a.evaluate {
        if !transport::mover::set_policy_file(p) {
            return Err("a mover policy was already loaded".into());
        }
        let policy = transport::mover::process_policy();
        println!(
            "policy {} ({} entries, {})",
            p.display(),
            policy.entries.len(),
            policy.machine
        );
        let plan = Plan::evaluation(max, a.quick);
        let ev = calibrate::evaluate(&plan);
        print!("{}", calibrate::evaluation_report(&ev));
        for (large, what) in [(false, "sizes 64 B..256 MiB"), (true, "sizes 1..128 MiB")] {
            let (p50, p99) = calibrate::decision_cost(10_000, large);
            println!(
                "decision cost, {what}, 10^6 decisions (batches of 100): p50 {p50:.1} ns, p99 {p99:.1} ns (memcpy below {} B)",
                policy.memcpy_below
            );
        }
        if let Some(j) = &a.json {
            std::fs::write(j, serde_json::to_string_pretty(&ev)?)?;
        }
        return Ok(());
    }
    let out = a
        .out
        .or_else(transport::mover::default_policy_path)
        .ok_or("no --out and no default policy path (set HOME or TENSORWIRE_MOVER_POLICY)")?;
    let plan = Plan::training(max, a.quick);
    eprintln!(
        "measuring {} movers x {} sizes x concurrency {:?} x hot/cold (LLC {} MiB)",
        calibrate::MOVERS.len(),
        plan.sizes.len(),
        plan.concurrency,
        calibrate::llc_bytes() >> 20
    );
    let rows = calibrate::measure(&plan);
    print!("{}", calibrate::table(&rows));
    let policy = calibrate::fit(&rows)?;
    if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d)?;
    }
    policy.save(&out)?;
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&rows)?)?;
    }
    println!("policy written to {}", out.display());
    Ok(())
}
