//! A gRPC baseline for `tensorwire bench`: the same engine served over
//! KServe v2 `GRPCInferenceService.ModelInfer` with tonic.
//!
//! `tensorwire bench` compares tensorwire with the RPC frameworks people
//! would otherwise use to put a model behind a socket. This crate is the
//! gRPC one, written the way tonic's own documentation and examples write a
//! service, so that the comparison is fair: the KServe v2 inference protocol
//! (package `inference`, the one Triton and most model servers speak) with
//! tensors carried in `raw_input_contents` / `raw_output_contents`, payloads
//! held in [`bytes::Bytes`] (a prepared request is cloned without copying
//! its tensors), `TCP_NODELAY` on by default like tonic, and no message size
//! cap. [`Server`] serves any [`engine::Backend`]s on a multi-thread tokio
//! runtime, as tonic does; [`Client`] makes one blocking round trip per
//! [`Client::call`] on a current-thread runtime.
//!
//! Addresses are tensorwire URIs ([`transport::Endpoint`]): `unix://PATH`
//! and `tcp://HOST:PORT` (port 0 picks a free one; `?nodelay=0` turns
//! Nagle's algorithm back on at both ends). Other schemes are refused.
//!
//! The protocol messages are the agent's front door's
//! ([`frontend::proto`], generated from the official KServe v2 file with
//! the same names and field numbers): one copy of the proto. This peer
//! implements `ServerLive`, `ModelMetadata` and `ModelInfer` (raw contents
//! only); the other RPCs answer UNIMPLEMENTED.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use engine::{Backend, DType, IdentityBackend, TensorView};
//! use peer_grpc::{Client, Server};
//! let identity: Arc<dyn Backend> = Arc::new(IdentityBackend::new());
//! let server = Server::start("tcp://127.0.0.1:0", vec![("identity".into(), identity)])?;
//! let mut client = Client::connect(server.uri())?;
//! let data = [1u8; 16];
//! let req = client.prepare("identity", &[TensorView::new(DType::F32, &[4], &data)]);
//! let outputs = client.call_outputs(&req)?;
//! assert_eq!((outputs[0].dtype, outputs[0].shape.as_slice()), (DType::F32, &[4][..]));
//! assert_eq!(&outputs[0].data[..], &data[..]);
//! drop(client);
//! server.shutdown();
//! # Ok::<(), peer_grpc::PeerError>(())
//! ```

mod client;
mod server;

use std::io;

pub use client::{Client, OutputTensor, Reply, Request};
pub use server::Server;
/// gRPC status codes, as [`PeerError::code`] gives them.
pub use tonic::Code;
pub use wire::DType;

/// The KServe v2 protocol types and the tonic service and client (the
/// front door's, protobuf package `inference`).
pub use frontend::proto;
/// KServe v2 datatype names, shared with the front door.
pub use frontend::{dtype_from_kserve, kserve_datatype};

/// The largest message either side accepts or sends: 2 GiB - 1, protobuf's
/// own limit (tonic's default of 4 MiB would turn large tensors away; Triton
/// lifts it the same way).
pub const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

/// Why serving or calling failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The URI could not be parsed, or names a transport this peer does not
    /// speak (only `unix://` and `tcp://`).
    #[error("bad address '{uri}': {reason}")]
    BadAddress {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server could not listen on its address.
    #[error("cannot listen on {uri}: {source}")]
    Listen {
        /// The address.
        uri: String,
        /// The OS error.
        source: io::Error,
    },
    /// The client could not connect.
    #[error("cannot connect to {uri}: {reason}")]
    Connect {
        /// The address.
        uri: String,
        /// What went wrong.
        reason: String,
    },
    /// The call failed with a gRPC status (from the server, or from tonic
    /// when the connection broke).
    #[error("grpc status {code:?}: {message}")]
    Status {
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// The response does not hold what the protocol says it must.
    #[error("bad reply: {0}")]
    BadReply(String),
    /// Two models were given the same name.
    #[error("model name '{0}' given twice")]
    DuplicateModel(String),
    /// A model could not be loaded or run.
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    /// The tokio runtime could not be started.
    #[error("cannot start the tokio runtime: {0}")]
    Runtime(io::Error),
}

impl PeerError {
    /// The gRPC status code, if the call failed with one.
    pub fn code(&self) -> Option<Code> {
        match self {
            PeerError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<tonic::Status> for PeerError {
    fn from(s: tonic::Status) -> PeerError {
        PeerError::Status {
            code: s.code(),
            message: s.message().to_string(),
        }
    }
}

/// Parses a tensorwire URI into what this peer can use, or says why not.
fn parse_address(uri: &str) -> Result<transport::Endpoint, PeerError> {
    let ep = transport::Endpoint::parse(uri).map_err(|e| PeerError::BadAddress {
        uri: uri.to_string(),
        reason: e.to_string(),
    })?;
    match ep {
        transport::Endpoint::Unix(_) | transport::Endpoint::Tcp { .. } => Ok(ep),
        other => Err(PeerError::BadAddress {
            uri: uri.to_string(),
            reason: format!(
                "the grpc peer speaks unix:// and tcp:// only, not {}",
                other
                    .to_string()
                    .split("://")
                    .next()
                    .unwrap_or("this scheme")
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert!(parse_address("unix:///tmp/x.sock").is_ok());
        assert!(parse_address("tcp://127.0.0.1:0?nodelay=0").is_ok());
        for (uri, needle) in [
            ("shm://agent", "unix:// and tcp:// only, not shm"),
            ("inproc://a", "not inproc"),
            ("http://x:1", "unknown scheme"),
            ("tcp://x", "missing port"),
        ] {
            let e = parse_address(uri).expect_err(uri).to_string();
            assert!(e.contains(needle), "{uri}: {e}");
        }
    }
}
