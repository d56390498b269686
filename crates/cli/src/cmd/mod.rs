//! The subcommands, one module each, plus what they share: connecting to an
//! agent, or starting an embedded one when the URI is `inproc://`.

pub mod bench;
pub mod calibrate;
pub mod classify;
pub mod gateway;
pub mod hold;
pub mod infer;
pub mod models;
pub mod peer_serve;
pub mod ping;
pub mod serve;
pub mod torture;

use client::Client;
use server::{Agent, AgentConfig, ModelConfig};
use transport::Endpoint;

/// Any error a subcommand reports (printed as `tensorwire: error: ...`).
pub type CmdError = Box<dyn std::error::Error>;

/// The endpoint used when none is given: the embedded, in-process agent.
pub const DEFAULT_CONNECT: &str = "inproc://";

/// The bearer token every client subcommand takes: it names the client's
/// tenant in an agent with a tenants file (`serve --tenants`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TokenArg {
    /// Bearer token naming this client's tenant in the agent (sent in the
    /// session's Hello).
    #[arg(
        long,
        env = "TENSORWIRE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
}

impl TokenArg {
    /// `opts` carrying this token (an empty one is no token).
    pub fn apply(&self, opts: client::ClientOptions) -> client::ClientOptions {
        client::ClientOptions {
            token: self.token.clone().filter(|t| !t.is_empty()),
            ..opts
        }
    }
}

/// `--mover` and `--mover-policy`: how tensor bytes are moved (client
/// subcommands: into an `shm://` arena; `serve`: the agent's copies).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct MoverArg {
    /// Data mover: auto (the mover policy of `tensorwire calibrate`),
    /// memcpy, nt (non-temporal stores), kernel (the agent pulls with
    /// process_vm_readv), zero (only inputs already in the arena). On a
    /// client this is the shm:// URI's `?mover=` parameter.
    #[arg(long, value_name = "auto|memcpy|nt|kernel|zero")]
    pub mover: Option<transport::mover::MoverChoice>,
    /// The mover policy file `auto` uses (default: TENSORWIRE_MOVER_POLICY,
    /// else ~/.config/tensorwire/mover-policy.json). Missing or corrupt:
    /// memcpy, with a warning.
    #[arg(long, value_name = "FILE")]
    pub mover_policy: Option<std::path::PathBuf>,
}

impl MoverArg {
    /// Loads the policy file if one was named, and returns `uri` with the
    /// mover as its `?mover=` parameter (shm:// only; on other transports
    /// the kernel moves the bytes and `--mover` is refused).
    pub fn apply_uri(&self, uri: &str) -> Result<String, CmdError> {
        if let Some(p) = &self.mover_policy {
            transport::mover::set_policy_file(p);
        }
        let Some(m) = self.mover else {
            return Ok(uri.to_string());
        };
        if !uri.starts_with("shm://") {
            return Err(format!(
                "--mover applies to shm:// sessions (the client copies nothing on {uri})"
            )
            .into());
        }
        let sep = if uri.contains('?') { '&' } else { '?' };
        Ok(format!("{uri}{sep}mover={m}"))
    }
}

/// A connected client, and the embedded agent it talks to when `uri` is
/// `inproc://...` (kept alive as long as the client is used).
pub struct Connection {
    /// The client.
    pub client: Client,
    /// The embedded agent, if one was started.
    pub _agent: Option<Agent>,
}

/// Connects to `uri`. For `inproc://name` with no agent of that name in this
/// process yet, starts an embedded agent serving `models` first.
pub fn connect(
    uri: &str,
    models: &[ModelConfig],
    opts: client::ClientOptions,
) -> Result<Connection, CmdError> {
    let ep = Endpoint::parse(uri)?;
    let agent = match &ep {
        Endpoint::Inproc(name) if transport::inproc::lookup(name).is_none() => {
            let cfg = AgentConfig {
                listen: vec![ep.clone()],
                models: models.to_vec(),
                ..AgentConfig::default()
            };
            Some(Agent::start(cfg)?)
        }
        _ => {
            if !models.is_empty() {
                return Err("--load only applies to the embedded agent (inproc://)".into());
            }
            None
        }
    };
    let client = Client::connect_with(uri, opts)?;
    Ok(Connection {
        client,
        _agent: agent,
    })
}

/// Parses an on/off flag value (`--intra-spinning on`) for clap: `on`/`off`
/// (also `true`/`false`, `1`/`0`); anything else is refused with a message
/// naming the value ([`server::config::parse_switch`]).
pub fn parse_switch_flag(s: &str) -> Result<bool, String> {
    server::config::parse_switch(s).map_err(|e| match e {
        server::ConfigError::Invalid(m) => m,
        other => other.to_string(),
    })
}

/// Parses repeated `NAME=PATH` model flags.
pub fn parse_models(flags: &[String]) -> Result<Vec<ModelConfig>, CmdError> {
    Ok(flags
        .iter()
        .map(|s| ModelConfig::parse_flag(s))
        .collect::<Result<_, _>>()?)
}
