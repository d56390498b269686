//! [`ClassifierError`]: every way the classifier workload can fail, each
//! naming the file, line or configuration concerned.

use thiserror::Error;

/// Why loading, classifying or comparing failed.
#[derive(Debug, Error)]
pub enum ClassifierError {
    /// The tokenizer file is missing or is not a usable `tokenizer.json`.
    #[error("cannot load tokenizer {path}: {reason}")]
    Tokenizer {
        /// The tokenizer file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A line could not be tokenized.
    #[error("cannot tokenize line {line}: {reason}")]
    Encode {
        /// The line number in its file (1-based).
        line: usize,
        /// What went wrong.
        reason: String,
    },
    /// The labels sidecar is missing or malformed.
    #[error("cannot read labels from {path}: {reason}")]
    Labels {
        /// The JSON file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The input text file cannot be read.
    #[error("cannot read {path}: {reason}")]
    Input {
        /// The text file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The model does not look like a classifier this workload can drive
    /// (inputs, outputs, number of labels).
    #[error("model '{model}': {reason}")]
    Model {
        /// The model's name or file.
        model: String,
        /// What does not fit.
        reason: String,
    },
    /// The engine failed to load or run the model (the error names the file).
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    /// A call through tensorwire failed.
    #[error(transparent)]
    Client(#[from] client::ClientError),
    /// An agent could not be started or stopped.
    #[error("agent for '{config}': {reason}")]
    Agent {
        /// The configuration the agent was for (`inproc`, `unix`, ...).
        config: String,
        /// What went wrong.
        reason: String,
    },
    /// A `--compare` list or option is unusable.
    #[error("{0}")]
    Config(String),
}

impl ClassifierError {
    pub(crate) fn agent(config: &str, reason: impl Into<String>) -> ClassifierError {
        ClassifierError::Agent {
            config: config.to_string(),
            reason: reason.into(),
        }
    }
}
