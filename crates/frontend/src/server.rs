//! [`GrpcFrontend`]: the KServe v2 gRPC listener on `grpc://HOST:PORT`
//! (or `grpcs://HOST:PORT`, over TLS: `tls`), with its own tokio runtime,
//! serving [`KServeService`] over an agent core until stopped.

use crate::accept::DoorIncoming;
use crate::door::FrontDoor;
use crate::proto::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::service::{KServeService, Shared};
use crate::tls::{DoorTls, PlainText, GRPCS_SCHEME};
use crate::{GRPC_SCHEME, MAX_MESSAGE_BYTES};
use server::Via;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use transport::tls::ServerTlsFiles;

/// How long [`GrpcFrontend::shutdown`] lets calls in flight finish.
const GRACE: Duration = Duration::from_secs(5);

/// How long [`GrpcFrontend::shutdown`] then lets connections close cleanly
/// (last responses sent, GOAWAY exchanged) before dropping them.
const LINGER: Duration = Duration::from_millis(100);

/// Room for a request's fields other than tensor bytes (names, shapes,
/// parameters, protobuf framing) on top of the agent's `max_payload`.
const MESSAGE_OVERHEAD: u64 = 1 << 20;

/// `HOST:PORT` of `SCHEME HOST:PORT`, for any of `schemes` (port 0
/// picks a free one); the scheme it has comes first.
pub(crate) fn parse_host_port<'a>(
    uri: &'a str,
    schemes: &[&'static str],
    what: &str,
) -> Result<(&'static str, &'a str), FrontendError> {
    let bad = |reason: String| FrontendError::BadAddress {
        uri: uri.to_string(),
        reason,
    };
    let Some((scheme, addr)) = schemes
        .iter()
        .find_map(|s| uri.strip_prefix(s).map(|addr| (*s, addr)))
    else {
        let forms: Vec<String> = schemes.iter().map(|s| format!("{s}HOST:PORT")).collect();
        return Err(bad(format!(
            "the {what} front door listens on {}",
            forms.join(" or ")
        )));
    };
    if addr.contains(['/', '?']) {
        return Err(bad(format!(
            "expected {scheme}HOST:PORT, with no path or options"
        )));
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok((scheme, addr)),
        _ => Err(bad(format!("missing or bad port ({scheme}HOST:PORT)"))),
    }
}

/// Why the front door could not start.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// The URI is not `grpc[s]://HOST:PORT` (or `http[s]://HOST:PORT`), or
    /// it is a TLS door and the agent has no certificate.
    #[error("bad front door address '{uri}': {reason}")]
    BadAddress {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The address could not be bound.
    #[error("cannot listen on {uri}: {source}")]
    Listen {
        /// The address.
        uri: String,
        /// The OS error.
        source: io::Error,
    },
    /// A TLS door's certificate, key or client CA cannot be used.
    #[error("cannot serve {uri}: {source}")]
    Tls {
        /// The door that needed it.
        uri: String,
        /// The file at fault, and why.
        source: transport::tls::TlsError,
    },
    /// The tokio runtime could not be started.
    #[error("cannot start the tokio runtime: {0}")]
    Runtime(io::Error),
    /// The metrics registry could not be set up.
    #[error("cannot set up the metrics: {0}")]
    Metrics(String),
    /// A `listen` URI is neither a front door nor an endpoint of the
    /// agent's own (unknown scheme, or a bad endpoint).
    #[error(transparent)]
    Config(#[from] server::ConfigError),
    /// The model repository could not be opened, or a model it should
    /// serve at start could not be loaded.
    #[error(transparent)]
    Repository(#[from] crate::repository::RepositoryError),
}

/// The `HOST:PORT` of a `grpc://HOST:PORT` or `grpcs://HOST:PORT` (TLS)
/// URI (port 0 picks a free one).
pub fn parse_grpc_uri(uri: &str) -> Result<&str, FrontendError> {
    parse_host_port(uri, &[GRPC_SCHEME, GRPCS_SCHEME], "gRPC").map(|(_, addr)| addr)
}

/// A running gRPC front door.
///
/// Dropping it without [`shutdown`](GrpcFrontend::shutdown) stops it the
/// same way. Either must happen outside any tokio runtime.
#[derive(Debug)]
pub struct GrpcFrontend(pub(crate) Running);

impl GrpcFrontend {
    /// Starts serving `door` on `listen` (`grpc://HOST:PORT`). Returns once
    /// the socket is listening. Requests larger than the core's
    /// `max_payload` (plus 1 MiB for the message's other fields) are
    /// refused by tonic with RESOURCE_EXHAUSTED before they are decoded.
    /// A `grpcs://` door needs [`GrpcFrontend::start_with`].
    pub fn start(listen: &str, door: Arc<FrontDoor>) -> Result<GrpcFrontend, FrontendError> {
        GrpcFrontend::start_with(listen, door, None)
    }

    /// [`GrpcFrontend::start`] for `grpc://HOST:PORT` or, with the agent's
    /// TLS files, `grpcs://HOST:PORT` (the same service over TLS, ALPN
    /// `h2`; a client CA in `tls` makes client certificates required).
    /// `tls` is not used by a `grpc://` door.
    pub fn start_with(
        listen: &str,
        door: Arc<FrontDoor>,
        tls: Option<&ServerTlsFiles>,
    ) -> Result<GrpcFrontend, FrontendError> {
        let tls = DoorTls::read_for(listen, GRPCS_SCHEME, tls)?;
        GrpcFrontend::start_door(listen, door, tls.as_ref())
    }

    /// Starts a door with its TLS configuration already read.
    pub(crate) fn start_door(
        listen: &str,
        door: Arc<FrontDoor>,
        tls: Option<&DoorTls>,
    ) -> Result<GrpcFrontend, FrontendError> {
        let (scheme, addr) = parse_host_port(listen, &[GRPC_SCHEME, GRPCS_SCHEME], "gRPC")?;
        let tls = DoorTls::pick(listen, scheme == GRPCS_SCHEME, tls, DoorTls::grpc)?;
        let max_message = usize::try_from(
            door.core
                .limits
                .max_payload
                .saturating_add(MESSAGE_OVERHEAD),
        )
        .unwrap_or(MAX_MESSAGE_BYTES)
        .min(MAX_MESSAGE_BYTES);
        let shared = Arc::new(Shared::via(Via::Grpc));
        let core = door.core.clone();
        let service =
            GrpcInferenceServiceServer::new(KServeService::with_shared(door, shared.clone()))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let router = tonic::transport::Server::builder().add_service(service);
        // A dropped sender stops the server too.
        let stop = |stopped: oneshot::Receiver<()>| async move {
            let _ = stopped.await;
        };
        let name = "tw-grpc-frontend";
        Running::start(
            listen,
            addr,
            scheme,
            name,
            shared,
            |listener, stopped| async move {
                let incoming =
                    DoorIncoming::start(listener, &core, tls.map(|c| (c, PlainText::Close)), true);
                let _ = router
                    .serve_with_incoming_shutdown(incoming.into_stream(), stop(stopped))
                    .await;
            },
        )
        .map(GrpcFrontend)
    }

    /// The URI it listens on, with the port it was given for port 0.
    pub fn uri(&self) -> &str {
        self.0.uri()
    }

    /// From now on `ServerReady` answers false (call it when shutdown
    /// begins, before the agent drains).
    pub fn set_not_ready(&self) {
        self.0.set_not_ready();
    }

    /// Stops serving: `ServerReady` false, tonic's graceful shutdown (no new
    /// connections, GOAWAY on open ones); calls in flight get up to 5 s to
    /// finish and 100 ms more to send their responses, then remaining
    /// connections are dropped and the runtime is joined.
    pub fn shutdown(self) {
        self.0.shutdown();
    }
}

/// A front door's listener, tokio runtime and serving task, shared by the
/// gRPC and HTTP front doors.
pub(crate) struct Running {
    uri: String,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("uri", &self.uri).finish()
    }
}

impl Running {
    /// Binds `addr` (from `listen`, which has `scheme`), starts a runtime
    /// and spawns `serve(listener, stopped)` on it, where `stopped`
    /// resolves when the front door is told to stop.
    pub(crate) fn start<F, Fut>(
        listen: &str,
        addr: &str,
        scheme: &str,
        thread_name: &str,
        shared: Arc<Shared>,
        serve: F,
    ) -> Result<Running, FrontendError>
    where
        F: FnOnce(tokio::net::TcpListener, oneshot::Receiver<()>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name(thread_name)
            .build()
            .map_err(FrontendError::Runtime)?;
        let listen_err = |source: io::Error| FrontendError::Listen {
            uri: listen.to_string(),
            source,
        };
        let listener = std::net::TcpListener::bind(addr).map_err(listen_err)?;
        let local = listener.local_addr().map_err(listen_err)?;
        listener.set_nonblocking(true).map_err(listen_err)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = {
            // Registering the socket needs the runtime's reactor.
            let _guard = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener).map_err(listen_err)?;
            runtime.spawn(serve(listener, stopped))
        };
        Ok(Running {
            uri: format!("{scheme}{local}"),
            shared,
            runtime: Some(runtime),
            stop: Some(stop),
            task: Some(task),
        })
    }

    pub(crate) fn uri(&self) -> &str {
        &self.uri
    }

    pub(crate) fn set_not_ready(&self) {
        self.shared.stopping.store(true, Ordering::Release);
    }

    pub(crate) fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.set_not_ready();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            if let Some(mut task) = self.task.take() {
                let shared = &self.shared;
                runtime.block_on(async {
                    let deadline = tokio::time::Instant::now() + GRACE;
                    while !task.is_finished()
                        && shared.in_flight.load(Ordering::Acquire) > 0
                        && tokio::time::Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    let _ = tokio::time::timeout(LINGER, &mut task).await;
                });
            }
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        assert_eq!(
            parse_grpc_uri("grpc://127.0.0.1:0").expect("ok"),
            "127.0.0.1:0"
        );
        assert!(parse_grpc_uri("grpc://[::1]:8001").is_ok());
        for bad in [
            "tcp://127.0.0.1:1",
            "grpc://127.0.0.1",
            "grpc://:1",
            "grpc://h:99999",
            "grpc://h:1/x",
        ] {
            assert!(parse_grpc_uri(bad).is_err(), "{bad}");
        }
    }
}
