//! The tweet-classifier workload (issue 4): a BERT-style text classifier
//! called line by line, the way the original vAccel experiment did, through
//! tensorwire over any transport, and compared with the engine called
//! directly in the same process.
//!
//! - [`tokenize`]: the Hugging Face tokenizer (`tokenizer.json`), padding off,
//!   truncation at the model's 512-token limit (truncated lines are flagged).
//! - [`labels`]: the label names from the model's JSON sidecar.
//! - [`run`]: lines of a text file through a [`Target`] (the engine directly,
//!   or a model behind an agent), timing each line on the client: tokenize +
//!   request + response.
//! - [`agents`]: the agents a comparison runs against: embedded in this
//!   process (`inproc`), or `tensorwire serve` child processes on a temporary
//!   Unix socket or TCP loopback port, always stopped (and never left behind).
//! - [`compare`]: the configurations to compare, the comparison table (first
//!   inference, average, RPC tax against `local`, bit-identical outputs) and
//!   its JSON.
//! - [`paths`]: where the default model and tokenizer are, from anywhere in a
//!   checkout.
//!
//! ```
//! use classifier::{labels::Labels, run, tokenize::TextTokenizer};
//! # let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
//! # std::env::set_current_dir(root)?; // the paths below are the repository's
//! let tok = TextTokenizer::load("models/build/minilm_tokenizer.json".as_ref())?;
//! let model = "models/build/tweet_classifier.onnx".as_ref();
//! let labels = Labels::for_model(model)?;
//! let lines = run::read_lines("examples/classifier/tweets.txt".as_ref())?;
//! let mut local = run::LocalTarget::load(model, &engine::OrtOptions::default())?;
//! let first = &lines[..6];
//! let report = run::run_lines("local", &mut local, &tok, &labels, first, &mut |_| {})?;
//! assert_eq!(report.lines.len(), 6);
//! println!("average after the 4th line: {:?} ms", report.avg_ms());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod agents;
pub mod compare;
mod error;
pub mod labels;
pub mod paths;
pub mod run;
pub mod tokenize;

pub use error::ClassifierError;
pub use labels::Labels;
pub use run::{InputLine, LineResult, RunReport, Stages, Target};
pub use tokenize::{Encoded, TextTokenizer, MAX_TOKENS};

/// How many first lines the average leaves out (warm-up), as in the
/// original experiment's "Average (after 4th iteration)".
pub const WARMUP_LINES: usize = 4;

/// The name a running agent must serve the classifier under (unless told
/// otherwise): `tensorwire serve --model classifier=tweet_classifier.onnx`.
pub const DEFAULT_MODEL_NAME: &str = "classifier";
