//! `tensorwire hold` (hidden, for benchmarks): opens N sessions to an agent,
//! makes one call on each, then keeps them open and idle for a while, so
//! the agent's cost per connected-but-idle client can be measured.

use super::{connect, CmdError};
use std::time::Duration;

/// Arguments of `hold`.
#[derive(clap::Args)]
pub struct Args {
    /// The agent.
    #[arg(long)]
    connect: String,
    /// Sessions to open.
    #[arg(long, default_value_t = 10)]
    clients: usize,
    /// Seconds to hold them idle (at most 3600).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

/// Opens the sessions, prints `holding N`, sleeps, closes them.
pub fn run(a: Args) -> Result<(), CmdError> {
    if a.clients == 0 || a.clients > 4096 || a.seconds > 3600 {
        return Err("--clients must be 1..=4096 and --seconds at most 3600".into());
    }
    let mut held = Vec::with_capacity(a.clients);
    for _ in 0..a.clients {
        let c = connect(&a.connect, &[], Default::default())?;
        c.client.ping()?;
        c.client.model(engine::IdentityBackend::NAME)?.infer(&[])?;
        held.push(c);
    }
    println!("holding {}", held.len());
    use std::io::Write;
    std::io::stdout().flush()?;
    std::thread::sleep(Duration::from_secs(a.seconds));
    Ok(())
}
