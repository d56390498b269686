//! `tensorwire`: the command-line face of tensorwire. Each subcommand lives
//! in its own module under `cmd/`; this file only parses arguments.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// tensorwire: call models in a shared agent at (almost) in-process cost.
#[derive(Parser)]
#[command(name = "tensorwire", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an agent: load models once, listen on one or more endpoints.
    Serve(Box<cmd::serve::Args>),
    /// Relay native sessions from tcp/unix clients to an agent over shm or
    /// unix.
    Gateway(cmd::gateway::Args),
    /// Run a model once on tensors from .npy files.
    Infer(cmd::infer::Args),
    /// List the models an agent serves, with their signatures.
    Models(cmd::models::Args),
    /// Measure round trips through the identity model (or a bare socket).
    Ping(cmd::ping::Args),
    /// Classify the lines of a text file (the tweet classifier), or compare
    /// transports on it against the engine called directly.
    Classify(cmd::classify::Args),
    /// Measure latency, throughput and CPU per request over each transport,
    /// with the raw floor, gRPC and ttrpc peers in the same run; write
    /// results, a report and plots.
    Bench(Box<cmd::bench::Args>),
    /// Attack an agent (hostile bytes, slowloris, idle connections, churn,
    /// killed clients) while a well-behaved client is watched; report what
    /// it survived.
    Torture(cmd::torture::Args),
    /// Measure every data mover × size × concurrency × cache state on this
    /// machine and write the mover policy `--mover auto` uses; or evaluate
    /// a policy on cases it was not fitted on.
    Calibrate(cmd::calibrate::Args),
    /// (internal) Serve the engine over a peer RPC framework for `bench`.
    #[command(hide = true)]
    PeerServe(cmd::peer_serve::Args),
    /// (internal) Hold N idle sessions open (for measuring idle cost).
    #[command(hide = true)]
    Hold(cmd::hold::Args),
    /// (internal) The echo peer of `ping --raw`.
    #[command(hide = true)]
    RawEcho(cmd::ping::EchoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(a) => cmd::serve::run(*a),
        Command::Gateway(a) => cmd::gateway::run(a),
        Command::Infer(a) => cmd::infer::run(a),
        Command::Models(a) => cmd::models::run(a),
        Command::Ping(a) => cmd::ping::run(a),
        Command::Classify(a) => cmd::classify::run(a),
        Command::Bench(a) => cmd::bench::run(*a),
        Command::Torture(a) => cmd::torture::run(a),
        Command::Calibrate(a) => cmd::calibrate::run(a),
        Command::PeerServe(a) => cmd::peer_serve::run(a),
        Command::Hold(a) => cmd::hold::run(a),
        Command::RawEcho(a) => cmd::ping::run_echo(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tensorwire: error: {e}");
            ExitCode::FAILURE
        }
    }
}
