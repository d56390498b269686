//! The ttrpc server: an `Inference` service over a map of engine backends.

use crate::protocols::inference::{InferRequest, InferResponse, Tensor};
use crate::protocols::inference_ttrpc::{create_inference, Inference};
use crate::PeerError;
use engine::{Backend, DType, EngineError, OutputData, TensorView};
use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use transport::Endpoint;
use ttrpc::{Code, Status};

/// A running ttrpc server serving some models under their names.
///
/// It is ttrpc-rust's synchronous [`ttrpc::Server`] with its default worker
/// pool: per connection a reader thread, a writer thread and 3 (1 to 5)
/// handler threads. It stops on [`shutdown`](Server::shutdown) or when
/// dropped.
pub struct Server {
    /// `None` once stopped.
    inner: Option<ttrpc::Server>,
    /// The listening socket ttrpc accepts on; owned here so that it is
    /// closed (and a Unix socket file removed) after ttrpc has stopped.
    listener: Listening,
    uri: String,
}

pub(crate) enum Listening {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listening {
    fn raw_fd(&self) -> i32 {
        match self {
            Listening::Unix(l, _) => l.as_raw_fd(),
            Listening::Tcp(l) => l.as_raw_fd(),
        }
    }
}

impl Server {
    /// Listens on `listen` (`unix://PATH`, `tcp://HOST:PORT` with port 0 =
    /// any free port, `tcp://...?nodelay=0` to leave Nagle's algorithm on)
    /// and serves `models`, each under its name, until shut down.
    ///
    /// A stale Unix socket file (nobody listening) is replaced; a live one
    /// is an error. With `tcp://` and nodelay on (the default) the listening
    /// socket gets `TCP_NODELAY`, which Linux copies to every accepted
    /// connection.
    pub fn start(
        listen: &str,
        models: Vec<(String, Arc<dyn Backend>)>,
    ) -> Result<Server, PeerError> {
        let endpoint = Endpoint::parse(listen)?;
        let mut map: HashMap<String, Arc<dyn Backend>> = HashMap::with_capacity(models.len());
        for (name, backend) in models {
            if map.contains_key(&name) {
                return Err(PeerError::DuplicateModel(name));
            }
            map.insert(name, backend);
        }
        let (listener, uri) = bind(&endpoint)?;
        let service = create_inference(Arc::new(InferenceService { models: map }));
        let mut inner = ttrpc::Server::new()
            .add_listener(listener.raw_fd())
            .map_err(|source| PeerError::Setup {
                what: "take the listening socket",
                source,
            })?
            .register_service(service);
        inner.start().map_err(|source| PeerError::Setup {
            what: "start the server",
            source,
        })?;
        Ok(Server {
            inner: Some(inner),
            listener,
            uri,
        })
    }

    /// The bound URI (real port for tcp port 0; `?nodelay=0` kept).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Stops accepting, closes every connection, waits for ttrpc's threads
    /// to finish, then closes the listening socket (and removes a Unix
    /// socket file).
    pub fn shutdown(self) {
        // Drop does it.
    }

    fn stop(&mut self) {
        if let Some(inner) = self.inner.take() {
            inner.shutdown();
        }
        if let Listening::Unix(_, path) = &self.listener {
            // Best effort: the file may already have been removed.
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // ttrpc's threads poll the listening socket: stop them before the
        // socket (a field of self) is closed.
        self.stop();
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("uri", &self.uri)
            .field("running", &self.inner.is_some())
            .finish()
    }
}

pub(crate) fn bind(endpoint: &Endpoint) -> Result<(Listening, String), PeerError> {
    let err = |source: io::Error| PeerError::Io {
        what: "listen on",
        uri: endpoint.to_string(),
        source,
    };
    match endpoint {
        Endpoint::Unix(path) => {
            transport::remove_stale_unix_socket(path).map_err(err)?;
            let listener = UnixListener::bind(path).map_err(err)?;
            Ok((
                Listening::Unix(listener, path.clone()),
                endpoint.to_string(),
            ))
        }
        Endpoint::Tcp { addr, nodelay } => {
            let listener = TcpListener::bind(addr.as_str()).map_err(err)?;
            socket2::SockRef::from(&listener)
                .set_nodelay(*nodelay)
                .map_err(err)?;
            let local = listener.local_addr().map_err(err)?;
            let uri = Endpoint::Tcp {
                addr: local.to_string(),
                nodelay: *nodelay,
            }
            .to_string();
            Ok((Listening::Tcp(listener), uri))
        }
        other => Err(PeerError::UnsupportedScheme(other.to_string())),
    }
}

/// The service implementation registered with ttrpc.
struct InferenceService {
    models: HashMap<String, Arc<dyn Backend>>,
}

impl Inference for InferenceService {
    fn infer(&self, _ctx: &ttrpc::TtrpcContext, req: InferRequest) -> ttrpc::Result<InferResponse> {
        self.run(req).map_err(ttrpc::Error::RpcStatus)
    }
}

fn status(code: Code, message: String) -> Status {
    ttrpc::get_status(code, message)
}

fn engine_status(model: &str, e: EngineError) -> Status {
    let code = match &e {
        EngineError::InvalidInput(_) => Code::INVALID_ARGUMENT,
        EngineError::Unsupported(_) => Code::UNIMPLEMENTED,
        EngineError::OutOfMemory(_) => Code::RESOURCE_EXHAUSTED,
        EngineError::Unavailable(_) => Code::UNAVAILABLE,
        EngineError::Stopped => Code::ABORTED,
        EngineError::Load { .. } | EngineError::Runtime(_) | EngineError::Run(_) => Code::INTERNAL,
    };
    status(code, format!("model '{model}': {e}"))
}

impl InferenceService {
    /// Validates the request, runs the model and builds the response.
    /// Every failure is a status for the client; nothing here panics.
    fn run(&self, mut req: InferRequest) -> Result<InferResponse, Status> {
        let Some(backend) = self.models.get(&req.model) else {
            let mut known: Vec<&str> = self.models.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(status(
                Code::NOT_FOUND,
                format!(
                    "no model '{}' (this server has: {})",
                    req.model,
                    known.join(", ")
                ),
            ));
        };

        let mut dtypes = Vec::with_capacity(req.inputs.len());
        for (i, t) in req.inputs.iter().enumerate() {
            let bad = |what: String| {
                status(
                    Code::INVALID_ARGUMENT,
                    format!("input {i} ('{}'): {what}", t.name),
                )
            };
            let dtype = DType::from_name(&t.dtype)
                .ok_or_else(|| bad(format!("unknown dtype '{}'", t.dtype)))?;
            let need = t
                .shape
                .iter()
                .try_fold(dtype.size() as u64, |n, &d| n.checked_mul(d))
                .ok_or_else(|| bad(format!("shape {:?} is too large", t.shape)))?;
            if need != t.data.len() as u64 {
                return Err(bad(format!(
                    "{dtype}{:?} needs {need} bytes, got {}",
                    t.shape,
                    t.data.len()
                )));
            }
            dtypes.push(dtype);
        }

        let outputs = {
            let views: Vec<TensorView<'_>> = req
                .inputs
                .iter()
                .zip(&dtypes)
                .map(|(t, &dtype)| TensorView::new(dtype, &t.shape, &t.data))
                .collect();
            let checks: Vec<(DType, &[u64])> = views.iter().map(|v| (v.dtype, v.shape)).collect();
            backend
                .check_inputs(&checks)
                .map_err(|e| engine_status(&req.model, e))?;
            backend
                .run(&views)
                .map_err(|e| engine_status(&req.model, e))?
        };

        // Outputs into response tensors. An output that aliases an input
        // (identity) takes the input's buffer, which the request owns; only
        // a second alias of the same input copies.
        let signature = backend.signature();
        let mut moved_to: Vec<Option<usize>> = vec![None; req.inputs.len()];
        let mut response = InferResponse::new();
        response.outputs.reserve(outputs.len());
        for (k, out) in outputs.into_iter().enumerate() {
            let mut tensor = Tensor::new();
            tensor.dtype = out.dtype.name().to_string();
            tensor.shape = out.shape;
            match out.data {
                OutputData::Owned(buf) => {
                    tensor.name = signature
                        .outputs
                        .get(k)
                        .map(|s| s.name.clone())
                        .unwrap_or_default();
                    tensor.data = buf.as_slice().to_vec();
                }
                OutputData::Input(i) => {
                    let Some(input) = req.inputs.get_mut(i) else {
                        return Err(status(
                            Code::INTERNAL,
                            format!(
                                "model '{}' output {k} refers to input {i} of {}",
                                req.model,
                                moved_to.len()
                            ),
                        ));
                    };
                    tensor.name = input.name.clone();
                    tensor.data = match moved_to[i] {
                        None => {
                            moved_to[i] = Some(k);
                            std::mem::take(&mut input.data)
                        }
                        Some(first) => response.outputs[first].data.clone(),
                    };
                }
            }
            response.outputs.push(tensor);
        }
        Ok(response)
    }
}
