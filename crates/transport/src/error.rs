//! Transport errors.

use std::io;
use thiserror::Error;
use wire::WireError;

/// Errors opening or using a transport.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use transport::{connect, Endpoint, TransportError};
/// assert!(matches!(Endpoint::parse("tcp:/x"), Err(TransportError::BadUri { .. })));
/// let dir = tempfile::tempdir()?;
/// let ep = Endpoint::Unix(dir.path().join("none.sock"));
/// match connect(&ep, Duration::from_secs(1)) {
///     Err(TransportError::Io { what, source, .. }) => {
///         assert_eq!(what, "connect to");
///         assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
///     }
///     other => panic!("expected an I/O error, got {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Error)]
pub enum TransportError {
    /// The URI could not be parsed, or names no known transport.
    #[error("bad endpoint '{uri}': {reason}")]
    BadUri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No in-process agent is registered under this name.
    #[error("no in-process agent named '{0}' (start one in this process first)")]
    NoInprocAgent(String),
    /// Connecting or binding failed.
    #[error("{what} {endpoint}: {source}")]
    Io {
        /// What was being done ("connect to", "listen on").
        what: &'static str,
        /// The endpoint.
        endpoint: String,
        /// The OS error.
        source: io::Error,
    },
}

/// Why a message could not be received.
///
/// # Examples
///
/// ```
/// use std::os::unix::net::UnixStream;
/// use transport::{RecvError, StreamConn};
/// use wire::Limits;
/// let (a, b) = UnixStream::pair()?;
/// let mut a = StreamConn::from_unix(a, "a".into());
/// drop(b);
/// match a.recv_head(&Limits::default()) {
///     Err(RecvError::Closed) => {} // between messages: a clean end
///     other => panic!("expected Closed, got {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Error)]
pub enum RecvError {
    /// The peer closed the connection cleanly between messages.
    #[error("connection closed by peer")]
    Closed,
    /// Nothing of the next message arrived within the read timeout; the
    /// stream is still in sync and may be read again.
    #[error("timed out waiting for a message")]
    TimedOut,
    /// Parking mode ([`crate::StreamConn::set_parking`]): the next message
    /// has not (entirely) arrived and the read would block. What did arrive
    /// is kept; call again when the socket is readable.
    #[error("no complete message yet")]
    WouldBlock,
    /// The header is invalid or over the limits: the stream cannot be
    /// trusted any more and the connection should be closed.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// The connection failed, or the peer stopped or vanished mid-message.
    #[error("connection failed: {0}")]
    Io(#[from] io::Error),
}
