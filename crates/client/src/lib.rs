//! The tensorwire client: connect to an agent by URI, look models up by
//! name, and run them — one call at a time ([`Model::infer`]) or many in
//! flight on one connection ([`Model::submit`] then [`Ticket::wait`]).
//!
//! ```no_run
//! use client::{Client, TensorRef};
//! let c = Client::connect("unix:///tmp/tensorwire.sock")?;
//! let model = c.model("digits")?;
//! let x = vec![0f32; 64];
//! let out = model.infer(&[TensorRef::from_slice(&[1, 64], &x)?])?;
//! let logits: Vec<f32> = out.outputs[0].to_vec()?;
//! # Ok::<(), client::ClientError>(())
//! ```
//!
//! Over sockets, requests go out as one vectored write straight from the
//! caller's buffers and responses are read into one aligned buffer that the
//! returned tensors share. There is no I/O thread: whichever caller waits
//! reads the socket, so an answer reaches the caller without a thread
//! hand-off. Over `inproc://` the agent runs on the caller's thread.

mod conn;
mod error;
mod tensor;

pub use conn::{Client, ClientOptions, Model, ModelInfo, Response, Ticket};
pub use error::ClientError;
pub use tensor::{Element, Tensor, TensorRef};
pub use wire::{DType, Limits, ModelSignature, Stage, TensorSpec, Timeline};
