//! Transports: how tensorwire messages get from one process (or thread) to
//! another. Nothing here knows what a model is.
//!
//! An [`Endpoint`] is parsed from a URI (`inproc://name`, `unix:///path`,
//! `tcp://host:port[?nodelay=0]`, `tls://…`, `shm://name`,
//! `vsock://CID:PORT`) and picks the transport at run time. The
//! socket transports share one framing, [`StreamConn`]: a message goes out
//! as a single vectored `sendmsg` straight from the caller's buffers (header,
//! descriptors, then each tensor at its 64-byte aligned offset), and comes in
//! as header → limits check → descriptor section → payload read straight into
//! a destination the receiver chose. [`Listener`] accepts such connections.
//! The [`inproc`] transport hands messages to a service in the same process
//! by function call: no bytes move at all. Every receiver waits the same
//! way, [`spin`]: a bounded busy-wait before it blocks; a waiter that finds
//! its peer on its own CPU steps off it ([`cpu`]), and a receiver whose
//! peer sends in a rhythm polls again when its next message is due
//! ([`cadence`]).
//!
//! # Examples
//!
//! One message each way over a Unix socket, the payload read straight
//! into the buffer the receiver chose:
//!
//! ```
//! use std::time::Duration;
//! use transport::{connect, Endpoint, Listener};
//! use wire::{Header, Kind, Limits};
//! let dir = tempfile::tempdir()?;
//! let ep = Endpoint::parse(&format!("unix://{}", dir.path().join("tw.sock").display()))?;
//! let listener = Listener::bind(&ep)?;
//! let client = connect(&ep, Duration::from_secs(1))?;
//! let mut server = listener.accept()?;
//!
//! let mut h = Header::new(Kind::Request);
//! h.payload_len = 5;
//! client.send(&h, &[], &[b"hello"])?;
//! let (got, _desc) = server.recv_head(&Limits::default())?;
//! let mut payload = vec![0u8; got.payload_len as usize];
//! server.recv_payload(&mut payload)?;
//! assert_eq!(payload, b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cadence;
pub mod cpu;
mod endpoint;
mod error;
pub mod inproc;
mod listener;
pub mod mover;
mod peer;
pub mod shm;
pub mod spin;
mod stream;
pub mod tls;
pub mod vsock;

pub use endpoint::{mover_param, Endpoint};
pub use error::{RecvError, TransportError};
pub use listener::{connect, remove_stale_unix_socket, Listener, ListenerWaker};
pub use peer::{hung_up, Credentials, PeerId};
pub use stream::{StreamConn, StreamStats, StreamWriter, STAGING_LEN};
