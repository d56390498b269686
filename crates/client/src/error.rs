//! [`ClientError`]: every way a call can fail, each saying what went wrong.

use std::time::Duration;
use thiserror::Error;
use wire::Status;

/// Why a client call failed.
///
/// # Examples
///
/// ```
/// use client::{Client, ClientError, TensorRef};
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("inproc://doc")?;
/// # cfg.models.push(server::ModelConfig::new(
/// #     "digits",
/// #     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
/// # ));
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("inproc://doc")?;
/// let digits = c.model("digits")?;
/// let wrong = [0f32; 63]; // the model takes 64 pixels
/// match digits.infer(&[TensorRef::from_slice(&[1, 63], &wrong)?]) {
///     Err(ClientError::InvalidInput(why)) => assert!(why.contains("input 'x'")),
///     other => panic!("expected InvalidInput, got {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Error)]
pub enum ClientError {
    /// The endpoint is malformed or could not be reached.
    #[error("cannot connect: {0}")]
    Connect(#[from] transport::TransportError),
    /// The agent serves no model by this name (or id).
    #[error("unknown model: {0}")]
    UnknownModel(String),
    /// The tensors do not fit the model (count, dtype, shape) or are malformed.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A size or count is over the session's limits.
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    /// The session already has its maximum of requests in flight.
    #[error("too many requests in flight (the session allows {0}); wait for some first")]
    TooManyInFlight(u32),
    /// No response arrived within the timeout.
    #[error("timed out after {0:?} waiting for the agent")]
    Timeout(Duration),
    /// The agent closed the connection or died.
    #[error("agent gone: {0}")]
    AgentGone(String),
    /// The agent is shutting down and refused the request.
    #[error("agent is shutting down: {0}")]
    ShuttingDown(String),
    /// The engine failed to run the model. The message is the agent's,
    /// which already says what kind of failure it was ("inference failed:
    /// …", "out of memory: …", "unsupported: …").
    #[error("{0}")]
    Engine(String),
    /// The model's queue in the agent was full: the request was refused at
    /// once, not run (retry later, or elsewhere).
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// The request waited its whole queue timeout in the agent and was
    /// never computed.
    #[error("timed out in the agent's queue: {0}")]
    QueueTimeout(String),
    /// The client's tenant may not do this (call or see the model, or
    /// connect with this token): the message names the model and tenant.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The agent reported another error.
    #[error("agent error ({status}): {message}")]
    Remote {
        /// The status code.
        status: Status,
        /// The agent's message.
        message: String,
    },
    /// The agent sent something that breaks the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl ClientError {
    /// Maps an Error message from the agent to the matching variant.
    pub(crate) fn from_remote(status: Status, message: String) -> ClientError {
        match status {
            Status::UnknownModel => ClientError::UnknownModel(message),
            Status::InvalidInput | Status::Malformed => ClientError::InvalidInput(message),
            Status::LimitExceeded => ClientError::LimitExceeded(message),
            Status::ShuttingDown => ClientError::ShuttingDown(message),
            Status::EngineError => ClientError::Engine(message),
            Status::Overloaded => ClientError::Overloaded(message),
            Status::Timeout => ClientError::QueueTimeout(message),
            Status::PermissionDenied => ClientError::PermissionDenied(message),
            status => ClientError::Remote { status, message },
        }
    }
}
