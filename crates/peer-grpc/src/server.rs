//! The tonic server: KServe v2 `ModelInfer` over any [`engine::Backend`].

use crate::proto::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};
use crate::proto::model_infer_response::InferOutputTensor;
use crate::proto::model_metadata_response::TensorMetadata;
use crate::proto::{
    ModelInferRequest, ModelInferResponse, ModelMetadataRequest, ModelMetadataResponse,
    ServerLiveRequest, ServerLiveResponse,
};
use crate::{dtype_from_kserve, kserve_datatype, parse_address, PeerError, MAX_MESSAGE_BYTES};
use bytes::Bytes;
use engine::{Backend, EngineError, OutputData, TensorView};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};
use transport::Endpoint;
use wire::{AlignedBuf, DType, TensorSpec};

/// How long [`Server::shutdown`] waits for calls in flight to finish.
const GRACE: Duration = Duration::from_secs(5);

/// How long [`Server::shutdown`] then lets connections close cleanly (send
/// the last responses, exchange GOAWAY) before dropping them. A blocking
/// client that is not in a call does not answer h2's shutdown PING, so
/// waiting for every connection to close could take the whole grace.
const LINGER: Duration = Duration::from_millis(100);

/// A running gRPC server: owns its tokio multi-thread runtime (tonic's
/// usual setup, one worker per core) and the serving task.
///
/// Dropping it without [`shutdown`](Server::shutdown) shuts it down the same
/// way. Either must happen outside any tokio runtime.
pub struct Server {
    uri: String,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
    socket: Option<PathBuf>,
    in_flight: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("uri", &self.uri).finish()
    }
}

impl Server {
    /// Starts serving `models` on `listen` (`unix://PATH` or
    /// `tcp://HOST:PORT[?nodelay=0]`). A model is called by the name it is
    /// given here, not by its signature's name. Returns once the socket is
    /// listening, so a client may connect straight away. A stale Unix socket
    /// file (one nobody accepts on) is replaced; a live one is an error.
    pub fn start(
        listen: &str,
        models: Vec<(String, Arc<dyn Backend>)>,
    ) -> Result<Server, PeerError> {
        let ep = parse_address(listen)?;
        let mut by_name = HashMap::with_capacity(models.len());
        for (name, backend) in models {
            if by_name.contains_key(&name) {
                return Err(PeerError::DuplicateModel(name));
            }
            by_name.insert(name, backend);
        }
        let in_flight = Arc::new(AtomicUsize::new(0));
        let service = GrpcInferenceServiceServer::new(Inference {
            models: by_name,
            in_flight: in_flight.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("tw-grpc-server")
            .build()
            .map_err(PeerError::Runtime)?;
        let listen_err = |source: std::io::Error| PeerError::Listen {
            uri: listen.to_string(),
            source,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown_signal = async move {
            // A dropped sender stops the server too.
            let _ = stopped.await;
        };
        let router = tonic::transport::Server::builder().add_service(service);
        // Binding registers the socket with the runtime's reactor.
        let _guard = runtime.enter();
        let (uri, socket, task) = match ep {
            Endpoint::Unix(path) => {
                transport::remove_stale_unix_socket(&path).map_err(listen_err)?;
                let listener = tokio::net::UnixListener::bind(&path).map_err(listen_err)?;
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let task =
                    runtime.spawn(router.serve_with_incoming_shutdown(incoming, shutdown_signal));
                (Endpoint::Unix(path.clone()).to_string(), Some(path), task)
            }
            Endpoint::Tcp { addr, nodelay } => {
                let listener = std::net::TcpListener::bind(addr.as_str()).map_err(listen_err)?;
                let local = listener.local_addr().map_err(listen_err)?;
                listener.set_nonblocking(true).map_err(listen_err)?;
                let listener = tokio::net::TcpListener::from_std(listener).map_err(listen_err)?;
                // What `Server::builder().tcp_nodelay(..)` does for `serve`:
                // set on every accepted socket (true unless `?nodelay=0`).
                let incoming = tonic::transport::server::TcpIncoming::from(listener)
                    .with_nodelay(Some(nodelay));
                let task =
                    runtime.spawn(router.serve_with_incoming_shutdown(incoming, shutdown_signal));
                let bound = Endpoint::Tcp {
                    addr: local.to_string(),
                    nodelay,
                };
                (bound.to_string(), None, task)
            }
            // parse_address lets only unix and tcp through.
            other => {
                return Err(PeerError::BadAddress {
                    uri: other.to_string(),
                    reason: "the grpc peer speaks unix:// and tcp:// only".into(),
                })
            }
        };
        drop(_guard);
        Ok(Server {
            uri,
            runtime: Some(runtime),
            stop: Some(stop),
            task: Some(task),
            socket,
            in_flight,
        })
    }

    /// The URI the server listens on: for `tcp://HOST:0` the port it was
    /// given, with `?nodelay=0` kept.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Stops serving: tonic's graceful shutdown (no new connections, GOAWAY
    /// on open ones); calls in flight get up to 5 s to finish and 100 ms
    /// more to send their responses, then remaining (idle) connections are
    /// dropped, the runtime is joined and a Unix socket file removed.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            if let Some(mut task) = self.task.take() {
                let in_flight = &self.in_flight;
                runtime.block_on(async {
                    let deadline = tokio::time::Instant::now() + GRACE;
                    while !task.is_finished()
                        && in_flight.load(Ordering::Acquire) > 0
                        && tokio::time::Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    let _ = tokio::time::timeout(LINGER, &mut task).await;
                });
            }
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
        if let Some(path) = self.socket.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The service: models by name.
struct Inference {
    models: HashMap<String, Arc<dyn Backend>>,
    /// `ModelInfer` calls being handled, for shutdown.
    in_flight: Arc<AtomicUsize>,
}

/// Counts one call in flight while alive.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(n: &'a AtomicUsize) -> InFlight<'a> {
        n.fetch_add(1, Ordering::AcqRel);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Inference {
    fn model(&self, name: &str) -> Result<&Arc<dyn Backend>, Status> {
        self.models.get(name).ok_or_else(|| {
            let mut known: Vec<&str> = self.models.keys().map(String::as_str).collect();
            known.sort_unstable();
            Status::not_found(format!(
                "unknown model '{name}' (served: {})",
                known.join(", ")
            ))
        })
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for Inference {
    async fn server_live(
        &self,
        _request: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let req = request.into_inner();
        let backend = self.model(&req.name)?;
        let sig = backend.signature();
        let meta = |t: &TensorSpec| TensorMetadata {
            name: t.name.clone(),
            datatype: kserve_datatype(t.dtype).to_string(),
            shape: t
                .shape
                .iter()
                .map(|d| d.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)))
                .collect(),
        };
        Ok(Response::new(ModelMetadataResponse {
            name: req.name,
            versions: Vec::new(),
            platform: "tensorwire".to_string(),
            inputs: sig.inputs.iter().map(meta).collect(),
            outputs: sig.outputs.iter().map(meta).collect(),
        }))
    }

    /// Validates the request, then runs the model right here, inline on the
    /// tokio worker that decoded the request, as tonic's examples do their
    /// work in the handler. Inputs are taken in request order (names are
    /// echoed, not matched). An output that is an unchanged input (the
    /// identity model) is sent back as the same `Bytes`, and one the engine
    /// allocated is handed to the response without a copy.
    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let _call = InFlight::enter(&self.in_flight);
        let req = request.into_inner();
        let backend = self.model(&req.model_name)?;
        if req.raw_input_contents.len() != req.inputs.len() {
            return Err(Status::invalid_argument(format!(
                "{} inputs but {} raw_input_contents (this server takes raw contents only)",
                req.inputs.len(),
                req.raw_input_contents.len()
            )));
        }
        let mut dtypes = Vec::with_capacity(req.inputs.len());
        let mut shapes = Vec::with_capacity(req.inputs.len());
        for (t, raw) in req.inputs.iter().zip(&req.raw_input_contents) {
            let (dtype, shape) = check_tensor(&t.name, &t.datatype, &t.shape, raw)?;
            dtypes.push(dtype);
            shapes.push(shape);
        }
        let described: Vec<(DType, &[u64])> = dtypes
            .iter()
            .zip(&shapes)
            .map(|(d, s)| (*d, s.as_slice()))
            .collect();
        backend.check_inputs(&described).map_err(engine_status)?;
        let views: Vec<TensorView<'_>> = dtypes
            .iter()
            .zip(&shapes)
            .zip(&req.raw_input_contents)
            .map(|((d, s), raw)| TensorView::new(*d, s, raw))
            .collect();
        let outputs = backend.run(&views).map_err(engine_status)?;
        drop(views);

        let sig = backend.signature();
        let mut tensors = Vec::with_capacity(outputs.len());
        let mut raw = Vec::with_capacity(outputs.len());
        for (i, out) in outputs.into_iter().enumerate() {
            let (name, bytes) = match out.data {
                OutputData::Input(j) => {
                    let bytes = req.raw_input_contents.get(j).cloned().ok_or_else(|| {
                        Status::internal(format!("output {i} aliases missing input {j}"))
                    })?;
                    let name = sig
                        .outputs
                        .get(i)
                        .map(|s| s.name.clone())
                        .or_else(|| req.inputs.get(j).map(|t| t.name.clone()));
                    (name, bytes)
                }
                OutputData::Owned(buf) => (
                    sig.outputs.get(i).map(|s| s.name.clone()),
                    Bytes::from_owner(OwnedOutput(buf)),
                ),
            };
            tensors.push(InferOutputTensor {
                name: name.unwrap_or_else(|| format!("OUTPUT{i}")),
                datatype: kserve_datatype(out.dtype).to_string(),
                shape: out
                    .shape
                    .iter()
                    .map(|&d| {
                        i64::try_from(d).map_err(|_| {
                            Status::internal(format!("output {i} dimension {d} too large"))
                        })
                    })
                    .collect::<Result<_, _>>()?,
                parameters: HashMap::new(),
                contents: None,
            });
            raw.push(bytes);
        }
        Ok(Response::new(ModelInferResponse {
            model_name: req.model_name,
            model_version: req.model_version,
            id: req.id,
            parameters: HashMap::new(),
            outputs: tensors,
            raw_output_contents: raw,
        }))
    }
}

/// Checks one input tensor: a known datatype, no negative dimension, and raw
/// contents of exactly `product(shape) × size` bytes.
fn check_tensor(
    name: &str,
    datatype: &str,
    shape: &[i64],
    raw: &Bytes,
) -> Result<(DType, Vec<u64>), Status> {
    let dtype = dtype_from_kserve(datatype).ok_or_else(|| {
        Status::invalid_argument(format!(
            "input '{name}': datatype '{datatype}' is not one of BOOL, UINT8..UINT64, \
             INT8..INT64, FP16, FP32, FP64, BF16"
        ))
    })?;
    let dims = shape
        .iter()
        .map(|&d| u64::try_from(d))
        .collect::<Result<Vec<u64>, _>>()
        .map_err(|_| {
            Status::invalid_argument(format!("input '{name}': negative dimension in {shape:?}"))
        })?;
    let expected = dims
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Status::invalid_argument(format!("input '{name}': shape {shape:?} is too large"))
        })?;
    if expected != raw.len() as u64 {
        return Err(Status::invalid_argument(format!(
            "input '{name}': {datatype}{shape:?} needs {expected} bytes, raw_input_contents has {}",
            raw.len()
        )));
    }
    Ok((dtype, dims))
}

/// The gRPC status for an engine error.
fn engine_status(e: EngineError) -> Status {
    match &e {
        EngineError::InvalidInput(_) | EngineError::Unsupported(_) => {
            Status::invalid_argument(e.to_string())
        }
        EngineError::OutOfMemory(_) => Status::resource_exhausted(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

/// An engine-allocated output handed to a `Bytes` without a copy.
struct OwnedOutput(AlignedBuf);

impl AsRef<[u8]> for OwnedOutput {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}
