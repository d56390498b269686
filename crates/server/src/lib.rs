//! The agent: the process that owns the models and answers requests for
//! them over every transport it listens on.
//!
//! An [`Agent`] loads each model once ([`registry`]), listens on any number
//! of endpoints at once, and runs one [`session`] per connection. Every
//! request is validated against the session's limits and the model's
//! signature before its payload is read, is stamped on a
//! [`wire::Timeline`] as it moves, and reaches its engine through the
//! model's [`queue`]: an admission queue (priorities, timeouts, a limit) whose holder runs the model on
//! its own thread, so an uncontended request never changes threads (a
//! cross-core wake-up costs ~5 µs here — more than a Unix-socket round trip).
//! The same [`dispatch`] code serves socket sessions, shared-memory sessions
//! ([`shm_session`]: tensors read in place from the client's arena, outputs
//! aliased or written into it) and in-process callers, and keeps each
//! model's request statistics ([`stats`]) on the way.
//!
//! # Examples
//!
//! A program that runs an agent in-process: configured in code (or from
//! TOML with [`AgentConfig::from_toml`] / [`AgentConfig::from_file`]),
//! listening on a Unix socket that other processes reach, and stopped
//! cleanly:
//!
//! ```
//! use server::{Agent, AgentConfig, ModelConfig};
//! use std::time::Duration;
//! # let dir = tempfile::tempdir()?;
//! # let sock = dir.path().join("agent.sock");
//! let mut cfg = AgentConfig::default();
//! cfg.add_listen(&format!("unix://{}", sock.display()))?;
//! cfg.models.push(ModelConfig::new(
//!     "digits",
//!     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
//! ));
//! let agent = Agent::start(cfg)?;
//!
//! // Any client, in this process or another:
//! let c = client::Client::connect(&format!("unix://{}", sock.display()))?;
//! let x = [0f32; 64];
//! let r = c.model("digits")?.infer(&[client::TensorRef::from_slice(&[1, 64], &x)?])?;
//! assert_eq!(r.outputs[0].shape, [1, 10]);
//! assert_eq!(agent.stats().responses, 1);
//!
//! drop(c);
//! agent.shutdown(Duration::from_secs(5));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod agent;
pub mod batcher;
pub mod config;
pub mod conns;
pub mod dispatch;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod inproc;
pub mod queue;
pub mod reactor;
pub mod region;
pub mod registry;
pub mod session;
pub mod shm_session;
#[cfg(test)]
mod shm_tests;
pub mod stats;
pub mod tenants;

pub use agent::{Agent, AgentError, AgentStats};

/// The agent's data movers: every tensor copy the agent makes (outputs
/// copied into an arena or a caller's buffer, batch staging, gathering and
/// row scattering) goes through this one [`transport::mover::Movers`], per
/// process like the mover policy it asks (`serve --mover`,
/// [`AgentConfig::mover`]; default `auto`).
///
/// # Examples
///
/// ```
/// use transport::mover::Mover;
/// use server::{Agent, AgentConfig};
/// let mut cfg = AgentConfig::default();
/// cfg.mover = "memcpy".parse()?; // serve --mover memcpy
/// let _agent = Agent::start(cfg)?;
/// let copied_before = server::movers().stats().bytes_of(Mover::Memcpy);
/// // ... requests whose outputs the agent copies add to it ...
/// assert!(server::movers().stats().bytes_of(Mover::Memcpy) >= copied_before);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn movers() -> &'static transport::mover::Movers {
    static MOVERS: std::sync::OnceLock<transport::mover::Movers> = std::sync::OnceLock::new();
    MOVERS.get_or_init(transport::mover::Movers::default)
}
pub use batcher::BatchPolicy;
pub use config::{AgentConfig, ConfigError, ModelConfig};
pub use queue::{Ask, QueuePolicy, Refused};
pub use registry::{ModelEntry, ModelRegistry, NewModel};
pub use shm_session::ShmSettings;
pub use stats::{ModelStats, StatsSnapshot, Via};
