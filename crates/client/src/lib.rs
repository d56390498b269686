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
//! ```no_run
//! use client::{Client, DType};
//! let c = Client::connect("shm://agent")?;
//! let model = c.model("digits")?;
//! let mut x = c.alloc_tensor(DType::F32, &[1, 64])?;
//! x.as_mut_slice::<f32>()?.fill(0.5);
//! let out = model.infer(&[x.as_ref()])?;
//! let logits: &[f32] = out.outputs[0].as_slice()?;
//! assert_eq!(c.copy_stats().input_bytes_copied, 0);
//! # let _ = logits;
//! # Ok::<(), client::ClientError>(())
//! ```

mod completion;
mod conn;
mod error;
mod ids;
mod shm;
mod tensor;

pub use completion::ResponseFuture;
pub use conn::{
    Client, ClientOptions, CopyStats, Model, ModelInfo, Response, ShmInfo, Ticket, MAX_WAIT,
};
pub use error::ClientError;
pub use tensor::{Element, Tensor, TensorBuf, TensorRef};
pub use wire::{DType, Limits, ModelSignature, Stage, TensorSpec, Timeline};
