//! The engine's error type.

use thiserror::Error;

/// Why a model could not be loaded or run.
///
/// # Examples
///
/// ```
/// use engine::{EngineError, OrtBackend, OrtOptions};
/// let e = OrtBackend::load("m", "no/such/model.onnx".as_ref(), &OrtOptions::default());
/// match e {
///     Err(EngineError::Load { path, .. }) => assert_eq!(path, "no/such/model.onnx"),
///     other => panic!("expected a load error, got {other:?}"),
/// }
/// ```
#[derive(Debug, Error)]
pub enum EngineError {
    /// The inputs do not fit the model's signature.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The model file could not be read or parsed.
    #[error("cannot load model {path}: {reason}")]
    Load {
        /// The model file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The ONNX Runtime shared library could not be found or loaded.
    #[error("ONNX Runtime unavailable: {0}")]
    Runtime(String),
    /// The model uses a type tensorwire cannot carry.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The engine failed while running.
    #[error("inference failed: {0}")]
    Run(String),
    /// Memory for outputs could not be allocated.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The model runs elsewhere (a gateway's remote model) and that agent
    /// cannot be reached now: retrying later may succeed.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The run was stopped before it finished ([`RunStop`](crate::RunStop)):
    /// its queue gave the engine to a request whose turn came first, and
    /// the request runs again at its turn.
    #[error("the run was stopped for a request whose turn came first")]
    Stopped,
}
