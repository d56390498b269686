//! The tensorwire client: connect to an agent by URI, look models up by
//! name, and run them — one call at a time ([`Model::infer`]) or many in
//! flight on one connection ([`Model::submit`] then [`Ticket::wait`]).
//!
//! # Examples
//!
//! A program that embeds the agent (`server::Agent`) and calls it over
//! `inproc://`; against an agent in another process only the URI changes
//! (`unix:///run/tensorwire.sock`, `tcp://127.0.0.1:7070`, `shm://agent`):
//!
//! ```
//! use client::{Client, TensorRef};
//! let mut cfg = server::AgentConfig::default();
//! cfg.add_listen("inproc://agent")?;
//! cfg.models.push(server::ModelConfig::new(
//!     "digits",
//!     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
//! ));
//! let agent = server::Agent::start(cfg)?;
//!
//! let c = Client::connect("inproc://agent")?;
//! let model = c.model("digits")?;
//! let x = vec![0f32; 64];
//! let out = model.infer(&[TensorRef::from_slice(&[1, 64], &x)?])?;
//! let logits: Vec<f32> = out.outputs[0].to_vec()?;
//! assert_eq!(logits.len(), 10);
//! # drop(c);
//! agent.shutdown(std::time::Duration::from_secs(1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Over sockets, requests go out as one vectored write straight from the
//! caller's buffers and responses are read into one aligned buffer that the
//! returned tensors share. There is no I/O thread: whichever caller waits
//! reads the socket, so an answer reaches the caller without a thread
//! hand-off. Over `inproc://` the agent runs on the caller's thread.
//!
//! Over `shm://name` the session has its own shared-memory arena. A tensor
//! made with [`Client::alloc_tensor`] lives in it and is filled in place, so
//! sending it copies nothing; any other input is copied in once. Outputs are
//! read in place too ([`Tensor`] views the arena: the identity model's
//! outputs are its inputs, others lie in the agent's part of the arena
//! until the last view of the response is dropped). The same code runs on
//! every transport ([`TensorBuf`] is an ordinary buffer elsewhere), and
//! [`Client::copy_stats`] counts what the client did copy.
//!
//! ```
//! use client::{Client, DType};
//! # let dir = tempfile::tempdir()?;
//! # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
//! # let mut cfg = server::AgentConfig::default();
//! # cfg.add_listen("shm://agent")?;
//! # cfg.models.push(server::ModelConfig::new(
//! #     "digits",
//! #     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
//! # ));
//! # let _agent = server::Agent::start(cfg)?;
//! let c = Client::connect("shm://agent")?;
//! let model = c.model("digits")?;
//! let mut x = c.alloc_tensor(DType::F32, &[1, 64])?;
//! x.as_mut_slice::<f32>()?.fill(0.5);
//! let out = model.infer(&[x.as_ref()])?;
//! let logits: &[f32] = out.outputs[0].as_slice()?;
//! assert_eq!(c.copy_stats().input_bytes_copied, 0);
//! assert_eq!(logits.len(), 10);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod completion;
mod conn;
mod error;
mod ids;
mod service_time;
mod shm;
mod tensor;

pub use completion::ResponseFuture;
pub use conn::{
    Client, ClientOptions, CopyStats, Model, ModelInfo, Response, ShmInfo, Ticket, MAX_WAIT,
};
pub use error::ClientError;
pub use tensor::{Element, Tensor, TensorBuf, TensorRef};
pub use wire::{DType, Limits, ModelSignature, Stage, TensorSpec, Timeline};
