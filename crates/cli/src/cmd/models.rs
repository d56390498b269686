//! `tensorwire models`: list an agent's models and their signatures.

use super::{connect, parse_models, CmdError, TokenArg, DEFAULT_CONNECT};

/// Arguments of `models`.
#[derive(clap::Args)]
pub struct Args {
    /// The agent to ask.
    #[arg(long, default_value = DEFAULT_CONNECT)]
    connect: String,
    /// For the embedded agent (inproc://): models to load, NAME=PATH.onnx.
    #[arg(long = "load", value_name = "NAME=PATH")]
    load: Vec<String>,
    #[command(flatten)]
    token: TokenArg,
}

/// Prints one line per model (those the client's tenant may use).
pub fn run(a: Args) -> Result<(), CmdError> {
    let c = connect(
        &a.connect,
        &parse_models(&a.load)?,
        a.token.apply(Default::default()),
    )?;
    for m in c.client.models()? {
        println!(
            "{:<20} id {:<3} {}",
            m.signature.name,
            m.id,
            super::serve::describe(&m.signature)
        );
    }
    Ok(())
}
