//! [`KServeService`]: `GRPCInferenceService` over the agent's
//! [`AgentCore`], and `infer_over_core`, the inference path both front
//! doors share.
//!
//! `ModelInfer` checks the request from the wire (`inputs`), builds the
//! same header and descriptor section a native client would send, and runs
//! it through `AgentCore::prepare` (shutdown, model, limits, signature,
//! payload budget) and `AgentCore::execute` (the model's queue, the
//! engine, output checks, counters) on a blocking-pool thread, with the
//! tensors read where tonic decoded them. Outputs go back as
//! `raw_output_contents`; an output that is an unchanged input (identity)
//! is the request's own buffer, an engine-allocated one is handed over
//! without a copy.
//!
//! Triton's system shared-memory extension ([`crate::sysshm`]) rides on the
//! same path: the `SystemSharedMemory*` calls manage the regions, an input
//! with `shared_memory_*` parameters is read in place from its region, and
//! a requested output with them is written into its region (by ONNX Runtime
//! directly when its size is known before the run, else copied there once)
//! and answered with its name, datatype, shape and those parameters, with
//! an empty entry in `raw_output_contents`.

use crate::access::{self, check_model, check_operator, grpc_authorization};
use crate::datatype::kserve_datatype;
use crate::door::{run_request, FrontDoor};
use crate::inputs::{gather, order_by_signature, Input};
use crate::model_control;
use crate::proto::grpc_inference_service_server::GrpcInferenceService;
use crate::proto::infer_parameter::ParameterChoice;
use crate::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::proto::model_infer_response::InferOutputTensor;
use crate::proto::model_metadata_response::TensorMetadata;
use crate::proto::system_shared_memory_status_response::RegionStatus;
use crate::proto::{
    InferParameter, ModelConfigRequest, ModelConfigResponse, ModelInferRequest, ModelInferResponse,
    ModelMetadataRequest, ModelMetadataResponse, ModelReadyRequest, ModelReadyResponse,
    ModelStatisticsRequest, ModelStatisticsResponse, ModelStreamInferResponse,
    RepositoryIndexRequest, RepositoryIndexResponse, RepositoryModelLoadRequest,
    RepositoryModelLoadResponse, RepositoryModelUnloadRequest, RepositoryModelUnloadResponse,
    ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest, ServerMetadataResponse,
    ServerReadyRequest, ServerReadyResponse, SystemSharedMemoryRegisterRequest,
    SystemSharedMemoryRegisterResponse, SystemSharedMemoryStatusRequest,
    SystemSharedMemoryStatusResponse, SystemSharedMemoryUnregisterRequest,
    SystemSharedMemoryUnregisterResponse,
};
use crate::statistics::{model_statistics, Refusal};
use crate::sysshm::{shm_ref, ShmOutput, ShmRef, PARAM_BYTE_SIZE, PARAM_OFFSET, PARAM_REGION};
use bytes::Bytes;
use engine::{OutputData, TensorView};
use server::dispatch::{AgentCore, Grant, Prepared, Reply};
use server::tenants::Seat;
use server::{ModelEntry, Via};
use std::borrow::Cow;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use wire::{
    decode_error_body, encode_tensor_section, layout_payload, AlignedBuf, DType, Header, Kind,
    Placement, Stage, TensorDesc, TensorSpec, Timeline,
};

/// The named KServe/Triton extensions the front doors serve (server
/// metadata's `extensions`; the HTTP door adds `binary_tensor_data`).
pub const EXTENSIONS: &[&str] = &[
    "model_configuration",
    "model_repository",
    "statistics",
    "system_shared_memory",
];

/// The KServe v2 gRPC service over an agent core.
#[derive(Debug, Clone)]
pub struct KServeService {
    door: Arc<FrontDoor>,
    shared: Arc<Shared>,
}

/// State the service shares with the server that runs it.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Set when the front door begins to stop: `ServerReady` says false.
    pub stopping: AtomicBool,
    /// `ModelInfer` calls being handled (for a graceful stop).
    pub in_flight: AtomicUsize,
    /// Request ids for the core (gRPC ids are strings; these are ours).
    next_id: AtomicU64,
    /// Which front door this is, for the models' statistics.
    pub via: Via,
}

impl Shared {
    /// The state of the front door `via` (gRPC or HTTP).
    pub(crate) fn via(via: Via) -> Shared {
        Shared {
            via,
            ..Shared::default()
        }
    }

    /// Ready for requests: neither the agent nor the front door stopping,
    /// and every model the agent should serve loaded.
    pub(crate) fn ready(&self, door: &FrontDoor) -> bool {
        !door.core.is_closing() && !self.stopping.load(Ordering::Acquire) && door.models_ready()
    }
}

/// Counts one call in flight while alive.
pub(crate) struct InFlight(Arc<Shared>);

impl InFlight {
    pub(crate) fn enter(s: &Arc<Shared>) -> InFlight {
        s.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(s.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl KServeService {
    /// A service answering from `door`.
    pub fn new(door: Arc<FrontDoor>) -> KServeService {
        KServeService::with_shared(door, Arc::new(Shared::via(Via::Grpc)))
    }

    pub(crate) fn with_shared(door: Arc<FrontDoor>, shared: Arc<Shared>) -> KServeService {
        KServeService { door, shared }
    }

    fn ready(&self) -> bool {
        self.shared.ready(&self.door)
    }

    /// The seat of the caller of `request` (see [`crate::access`]); none,
    /// without reading the metadata, when the agent has no tenants.
    fn seat<T>(&self, request: &Request<T>) -> Result<Option<Seat>, Status> {
        if self.door.core.tenants().is_none() {
            return Ok(None);
        }
        access::seat(&self.door.core, grpc_authorization(request.metadata()))
    }
}

/// The model `name` at `version` (empty: whichever version is served), or
/// NOT_FOUND naming what is served; PERMISSION_DENIED first when the
/// caller's tenant may not use `name` (whether or not it is served), and
/// the served models named are only those the tenant may use.
pub(crate) fn find_model(
    core: &AgentCore,
    seat: Option<&Seat>,
    name: &str,
    version: &str,
) -> Result<Arc<ModelEntry>, Status> {
    check_model(seat, name)?;
    let m = core.registry.find(name).ok_or_else(|| {
        let served: Vec<String> = core
            .registry
            .names()
            .into_iter()
            .filter(|n| access::may_see(seat, n))
            .collect();
        Status::not_found(format!(
            "unknown model '{name}' (served: {})",
            served.join(", ")
        ))
    })?;
    if !version.is_empty() && version != m.version.to_string() {
        return Err(Status::not_found(format!(
            "model '{name}' has no version '{version}' (version {} is served)",
            m.version
        )));
    }
    Ok(m)
}

type InferStream = Pin<Box<dyn Stream<Item = Result<ModelStreamInferResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GrpcInferenceService for KServeService {
    async fn server_live(
        &self,
        _request: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _request: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse {
            ready: self.ready(),
        }))
    }

    /// Ready when the model exists at that version and the agent is not
    /// shutting down; an unknown model or version is not ready (as Triton
    /// answers), not an error. A model the caller's tenant may not use is
    /// PERMISSION_DENIED.
    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let seat = self.seat(&request)?;
        let req = request.into_inner();
        check_model(seat.as_ref(), &req.name)?;
        let ready = self.ready()
            && find_model(&self.door.core, seat.as_ref(), &req.name, &req.version).is_ok();
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _request: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "tensorwire".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: EXTENSIONS.iter().map(|e| (*e).to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let seat = self.seat(&request)?;
        let req = request.into_inner();
        let model = find_model(&self.door.core, seat.as_ref(), &req.name, &req.version)?;
        let sig = model.signature();
        Ok(Response::new(ModelMetadataResponse {
            name: sig.name.clone(),
            versions: vec![model.version.to_string()],
            platform: platform(sig).to_string(),
            inputs: sig.inputs.iter().map(metadata).collect(),
            outputs: sig.outputs.iter().map(metadata).collect(),
        }))
    }

    /// Triton's statistics extension: every model when `name` is empty,
    /// else that model (NOT_FOUND when unknown, or at another version).
    async fn model_statistics(
        &self,
        request: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let seat = self.seat(&request)?;
        let req = request.into_inner();
        model_statistics(&self.door.core, seat.as_ref(), &req.name, &req.version).map(Response::new)
    }

    /// Triton's model configuration extension.
    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let seat = self.seat(&request)?;
        let req = request.into_inner();
        let config = model_control::config(&self.door, seat.as_ref(), &req.name, &req.version)?;
        Ok(Response::new(ModelConfigResponse {
            config: Some(config),
        }))
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let seat = self.seat(&request)?;
        let req = request.into_inner();
        let models = model_control::index(&self.door, seat.as_ref(), req.ready)?;
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    /// Loads on a blocking-pool thread (ONNX Runtime session creation).
    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        check_operator(self.seat(&request)?.as_ref(), "load models")?;
        let req = request.into_inner();
        let door = self.door.clone();
        tokio::task::spawn_blocking(move || {
            model_control::load(&door, &req.model_name, &req.parameters)
        })
        .await
        .map_err(|e| Status::internal(format!("the load task failed: {e}")))??;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        check_operator(self.seat(&request)?.as_ref(), "unload models")?;
        let req = request.into_inner();
        let door = self.door.clone();
        // On a blocking-pool thread: unload waits for a load in progress.
        tokio::task::spawn_blocking(move || {
            model_control::unload(&door, &req.model_name, &req.parameters)
        })
        .await
        .map_err(|e| Status::internal(format!("the unload task failed: {e}")))??;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let _call = InFlight::enter(&self.shared);
        let seat = self.seat(&request)?;
        let door = self.door.clone();
        let shared = self.shared.clone();
        let req = request.into_inner();
        let inline = runs_inline(&door, &req);
        let answer = run_request(inline, move || infer(&door, &shared, seat, req))
            .await
            .map_err(Status::internal)?;
        answer.map(Response::new)
    }

    /// Answers each request of the stream in order, one at a time; a
    /// request that fails is answered with its `error_message` and the
    /// stream goes on (Triton's behaviour). The stream's token (its
    /// metadata) is checked when it opens, and each request is seated
    /// with it (so a reload of the tenants file applies to the next one).
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<InferStream>, Status> {
        let token = match self.door.core.tenants() {
            None => None,
            Some(_) => {
                let token = access::token(&self.door.core, grpc_authorization(request.metadata()))?;
                // An unknown token refuses the stream at once.
                drop(access::seat_for_token(&self.door.core, token.as_deref())?);
                token
            }
        };
        let mut requests = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let door = self.door.clone();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            loop {
                let req = match requests.message().await {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        break;
                    }
                };
                let _call = InFlight::enter(&shared);
                let (d, s) = (door.clone(), shared.clone());
                let inline = runs_inline(&d, &req);
                let token = token.clone();
                let run = move || {
                    let seat = access::seat_for_token(&d.core, token.as_deref())?;
                    infer(&d, &s, seat, req)
                };
                let answer = match run_request(inline, run).await {
                    Ok(Ok(r)) => ModelStreamInferResponse {
                        error_message: String::new(),
                        infer_response: Some(r),
                    },
                    Ok(Err(status)) => ModelStreamInferResponse {
                        error_message: status.message().to_string(),
                        infer_response: None,
                    },
                    Err(e) => ModelStreamInferResponse {
                        error_message: e,
                        infer_response: None,
                    },
                };
                if tx.send(Ok(answer)).await.is_err() {
                    break;
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }

    /// The status of one registered region, or of all of them for an empty
    /// name; an unknown name is NOT_FOUND.
    async fn system_shared_memory_status(
        &self,
        request: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        self.seat(&request)?;
        let name = request.into_inner().name;
        let regions = self
            .door
            .shm
            .status((!name.is_empty()).then_some(name.as_str()))?
            .into_iter()
            .map(|r| {
                (
                    r.name.clone(),
                    RegionStatus {
                        name: r.name,
                        key: r.key,
                        offset: r.offset,
                        byte_size: r.byte_size,
                    },
                )
            })
            .collect();
        Ok(Response::new(SystemSharedMemoryStatusResponse { regions }))
    }

    /// Registers a region (see the `sysshm` module for the checks).
    async fn system_shared_memory_register(
        &self,
        request: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        check_operator(
            self.seat(&request)?.as_ref(),
            "register shared-memory regions",
        )?;
        let r = request.into_inner();
        self.door
            .shm
            .register(&r.name, &r.key, r.offset, r.byte_size)?;
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    /// Unregisters one region, or all of them for an empty name.
    async fn system_shared_memory_unregister(
        &self,
        request: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        check_operator(
            self.seat(&request)?.as_ref(),
            "unregister shared-memory regions",
        )?;
        let name = request.into_inner().name;
        if name.is_empty() {
            self.door.shm.unregister_all();
        } else {
            self.door.shm.unregister(&name);
        }
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }
}

/// The KServe `platform` of a model.
pub(crate) fn platform(sig: &wire::ModelSignature) -> &'static str {
    if sig.inputs.is_empty() && sig.outputs.is_empty() {
        "tensorwire_identity"
    } else {
        "onnxruntime_onnx"
    }
}

/// A signature tensor as KServe metadata (-1 for a dynamic dimension).
pub(crate) fn metadata(t: &TensorSpec) -> TensorMetadata {
    TensorMetadata {
        name: t.name.clone(),
        datatype: kserve_datatype(t.dtype).to_string(),
        shape: t
            .shape
            .iter()
            .map(|d| d.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)))
            .collect(),
    }
}

/// Whether `req` may run on the tokio worker ([`FrontDoor::runs_inline`]):
/// its bytes (raw contents, plus typed contents at 8 bytes an element)
/// and whether any tensor names a shared-memory region.
fn runs_inline(door: &FrontDoor, req: &ModelInferRequest) -> bool {
    let raw: usize = req.raw_input_contents.iter().map(|b| b.len()).sum();
    let typed: usize = req
        .inputs
        .iter()
        .filter_map(|t| t.contents.as_ref())
        .map(|c| {
            8 * (c.bool_contents.len()
                + c.int_contents.len()
                + c.int64_contents.len()
                + c.uint_contents.len()
                + c.uint64_contents.len()
                + c.fp32_contents.len()
                + c.fp64_contents.len())
                + c.bytes_contents.iter().map(Vec::len).sum::<usize>()
        })
        .sum();
    let shm = req
        .inputs
        .iter()
        .any(|t| t.parameters.contains_key(PARAM_REGION))
        || req
            .outputs
            .iter()
            .any(|o| o.parameters.contains_key(PARAM_REGION));
    door.runs_inline(&req.model_name, raw.saturating_add(typed), shm)
}

/// One `ModelInfer`, start to finish, on the calling thread (a tokio worker
/// or a blocking-pool thread: see [`run_request`]), for the caller in
/// `seat` (none without tenants).
fn infer(
    door: &FrontDoor,
    shared: &Shared,
    seat: Option<Seat>,
    mut req: ModelInferRequest,
) -> Result<ModelInferResponse, Status> {
    let model = find_model(
        &door.core,
        seat.as_ref(),
        &req.model_name,
        &req.model_version,
    )?;
    let wanted = requested(&req.outputs)?;
    let version = model.version.to_string();
    let sched = Scheduling::of_grpc(&req.parameters)?;
    let outputs = infer_over_core(
        door,
        shared,
        Caller { seat, sched },
        &model,
        std::mem::take(&mut req.inputs),
        std::mem::take(&mut req.raw_input_contents),
        &wanted,
    )?;
    let (tensors, raw) = outputs
        .into_iter()
        .map(|o| {
            // An output in shared memory says where it is, and keeps its
            // (empty) place in raw_output_contents, as Triton does.
            let parameters = o.shm.as_ref().map(Placed::parameters).unwrap_or_default();
            (
                InferOutputTensor {
                    name: o.name,
                    datatype: o.datatype.to_string(),
                    shape: o.shape,
                    parameters,
                    contents: None,
                },
                o.data,
            )
        })
        .unzip();
    Ok(ModelInferResponse {
        model_name: req.model_name,
        model_version: version,
        id: req.id,
        parameters: HashMap::new(),
        outputs: tensors,
        raw_output_contents: raw,
    })
}

/// The outputs a gRPC request names, each with its place in shared memory
/// if it asks for one.
fn requested(outputs: &[InferRequestedOutputTensor]) -> Result<Vec<Requested>, Status> {
    outputs
        .iter()
        .map(|o| {
            Ok(Requested {
                name: o.name.clone(),
                shm: shm_ref("output", &o.name, &o.parameters)?,
            })
        })
        .collect()
}

/// An output a request names, and where it goes if it asks for a place in
/// a registered shared-memory region.
#[derive(Debug, Clone)]
pub(crate) struct Requested {
    pub name: String,
    pub shm: Option<ShmRef>,
}

/// Where an output was written in shared memory.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    /// The region.
    pub region: String,
    /// Where in the region the output starts.
    pub offset: u64,
    /// The bytes written (the output's size).
    pub byte_size: u64,
}

impl Placed {
    /// As the output's KServe parameters.
    fn parameters(&self) -> HashMap<String, InferParameter> {
        let int = |n: u64| InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(
                i64::try_from(n).unwrap_or(i64::MAX),
            )),
        };
        HashMap::from([
            (
                PARAM_REGION.to_string(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::StringParam(self.region.clone())),
                },
            ),
            (PARAM_OFFSET.to_string(), int(self.offset)),
            (PARAM_BYTE_SIZE.to_string(), int(self.byte_size)),
        ])
    }
}

/// One output of an inference: its KServe datatype, shape and bytes, or
/// where it was written in shared memory (then `data` is empty).
#[derive(Debug, Clone)]
pub(crate) struct Output {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<i64>,
    pub data: Bytes,
    pub shm: Option<Placed>,
}

/// Who sends a front-door inference, and what it asks of the model's
/// queue.
pub(crate) struct Caller {
    /// Its seat among the tenants (none without a tenants file).
    pub seat: Option<Seat>,
    /// Its priority and queue timeout.
    pub sched: Scheduling,
}

/// The shared path of both front doors, for `model` (the caller looked it
/// up, by name and version, so an unknown one is refused first): checks and
/// gathers the inputs (`tensors` with `raw` bytes for all or none of those
/// not in shared memory, as KServe v2 gRPC's `raw_input_contents`), leases
/// the shared-memory bytes the request reads and writes (inputs are read
/// where they are), builds the request a native client would send and runs
/// it through `AgentCore::prepare` and the model. `wanted` names the
/// outputs to return (all when empty), each written into shared memory if
/// it asks: by the engine itself when it can write into caller buffers and
/// the output sizes are known before the run (ONNX Runtime), else copied
/// there once from the engine's output (counted in the core's
/// `shm_output_bytes_in_place` / `_copied`). The `caller`'s seat goes to
/// the core with the request, which checks its tenant's rights and quotas
/// and counts it. Runs on the calling thread (see [`run_request`] for
/// which one).
pub(crate) fn infer_over_core(
    door: &FrontDoor,
    shared: &Shared,
    caller: Caller,
    model: &ModelEntry,
    tensors: Vec<InferInputTensor>,
    raw: Vec<Bytes>,
    wanted: &[Requested],
) -> Result<Vec<Output>, Status> {
    let Caller { seat, sched } = caller;
    let core = &*door.core;
    // Arrival, for the model's statistics (front-door clients cannot ask
    // for the timeline; it stamps when the agent times requests). From
    // here until the core takes the request, a refusal is counted by
    // `refusal` as a failure of the model.
    let mut tl = core.timeline(&Header::new(Kind::Request));
    tl.stamp(Stage::Received);
    let refusal = Refusal::new(&model.stats, shared.via, tl.get(Stage::Received));
    if core.is_closing() {
        return Err(Status::unavailable(
            "the agent is shutting down and accepts no new requests",
        ));
    }
    let inputs = gather(tensors, raw, core.limits.max_payload)?;
    let sig = model.signature();
    let mut inputs = order_by_signature(sig, inputs)?;
    requested_outputs(sig, wanted)?;

    // Shared memory: lease the bytes the request reads and writes.
    let shm_in: Vec<(String, ShmRef)> = inputs
        .iter()
        .filter_map(|i| Some((format!("input '{}'", i.name), i.shm.clone()?)))
        .collect();
    let shm_out: Vec<(String, ShmRef)> = wanted
        .iter()
        .filter_map(|w| Some((format!("output '{}'", w.name), w.shm.clone()?)))
        .collect();
    let (in_place, out_slots) = door.shm.lease(&shm_in, &shm_out)?;
    for (input, bytes) in inputs.iter_mut().filter(|i| i.shm.is_some()).zip(in_place) {
        input.data = bytes;
    }
    let mut out_slots = out_slots.into_iter();
    let mut dests: Vec<Option<ShmOutput>> = wanted
        .iter()
        .map(|w| w.shm.as_ref().and_then(|_| out_slots.next()))
        .collect();

    // The request as a native client would send it. Tensors all in shared
    // memory are placed as in a region (like a native shm session's: the
    // agent allocates nothing for them, so they take no payload budget).
    let lens: Vec<u64> = inputs.iter().map(|i| i.data.len() as u64).collect();
    let (offsets, layout_len) = layout_payload(lens.iter().copied())
        .ok_or_else(|| Status::invalid_argument("the request's tensors are too large"))?;
    let all_shm = !inputs.is_empty() && inputs.iter().all(|i| i.shm.is_some());
    let descs: Vec<TensorDesc> = inputs
        .iter()
        .zip(offsets)
        .zip(&lens)
        .map(|((i, offset), &len)| TensorDesc {
            dtype: i.dtype,
            shape: i.shape.clone(),
            offset,
            len,
        })
        .collect();
    let mut desc = Vec::new();
    encode_tensor_section(&descs, None, &mut desc);
    let mut h = Header::new(Kind::Request);
    h.request_id = shared.next_id.fetch_add(1, Ordering::Relaxed) + 1;
    h.model_id = model.id;
    // As Triton: a level the model does not have means its default level.
    h.priority = if sched.priority > model.queue.policy().priority_levels {
        0
    } else {
        sched.priority
    };
    h.timeout_us = sched.timeout_us;
    h.tensor_count =
        u32::try_from(descs.len()).map_err(|_| Status::invalid_argument("too many inputs"))?;
    h.desc_len = u32::try_from(desc.len())
        .map_err(|_| Status::invalid_argument("the inputs' shapes are too large"))?;
    let placement = if all_shm {
        h.payload_len = lens.iter().sum();
        Placement::Region { len: layout_len }
    } else {
        h.payload_len = layout_len;
        Placement::Payload
    };
    if let Err(e) = h.check_limits(&core.limits) {
        return Err(error_status(&core.fail(Reply::error(
            h.request_id,
            e.status(),
            &e.to_string(),
        ))));
    }

    refusal.passed();
    // The caller's tenant (its seat, from the call's bearer token; none
    // without a tenants file): the core checks its rights and quotas.
    let grant = Grant {
        limits: core.limits,
        seat,
    };
    let prep = core
        .prepare_via(shared.via, &h, &desc, &grant, placement, &tl)
        .map_err(|r| error_status(&r))?;
    tl.stamp(Stage::PayloadInPlace);
    let views: Vec<TensorView<'_>> = descs
        .iter()
        .zip(&inputs)
        .map(|(d, i)| TensorView::new(d.dtype, &d.shape, &i.data))
        .collect();

    // Outputs in shared memory whose sizes are known before the run are
    // checked before it; with a backend that writes into caller buffers,
    // the engine writes them in place.
    let planned = if dests.iter().any(Option::is_some) {
        planned_outputs(model, &inputs)
    } else {
        None
    };
    if let Some(planned) = &planned {
        for (w, dest) in wanted.iter().zip(&dests) {
            if let (Some(dest), Some(p)) = (dest, planned.iter().find(|p| p.name == w.name)) {
                fits(dest, &w.name, p.dtype, &p.shape, p.len).map_err(Status::invalid_argument)?;
            }
        }
    }
    let outputs = match planned {
        Some(planned) if model.outputs_in_place && !sig.outputs.is_empty() => {
            run_in_place(core, &prep, &views, planned, wanted, &mut dests, &mut tl)?
        }
        _ => {
            // Outputs wanted in shared memory are copied there before the
            // response is built, inside the request's compute_output stage.
            let mut copied = 0u64;
            let reply = core.execute_placing(&prep, &views, &mut tl, |produced| {
                copied = place_copies(produced, &views, sig, &inputs, wanted, &mut dests)?;
                Ok(())
            });
            if reply.header.kind == Kind::Error {
                return Err(error_status(&reply));
            }
            core.counters
                .shm_output_bytes_copied
                .fetch_add(copied, Ordering::Relaxed);
            let outputs = engine_outputs(reply.outputs, sig, &inputs)?;
            let picked = pick(outputs, wanted, sig)?;
            mark_placed(picked, &dests)
        }
    };
    drop(views);
    drop(prep);
    Ok(outputs)
}

/// An output whose dtype and shape are known before the run.
struct Planned {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    len: u64,
}

/// The outputs the model will produce for `inputs`, if the backend can
/// tell before running (names from the signature, or the inputs' for a
/// model that declares none: identity).
fn planned_outputs(model: &ModelEntry, inputs: &[Input]) -> Option<Vec<Planned>> {
    let metas: Vec<(DType, &[u64])> = inputs.iter().map(|i| (i.dtype, &i.shape[..])).collect();
    let shapes = model.backend.output_shapes(&metas)?;
    let sig = model.signature();
    let named: Vec<(&str, DType)> = if sig.outputs.is_empty() {
        inputs.iter().map(|i| (i.name.as_str(), i.dtype)).collect()
    } else {
        sig.outputs
            .iter()
            .map(|s| (s.name.as_str(), s.dtype))
            .collect()
    };
    if named.len() != shapes.len() {
        return None;
    }
    named
        .into_iter()
        .zip(shapes)
        .map(|((name, dtype), shape)| {
            Some(Planned {
                name: name.to_string(),
                dtype,
                len: TensorDesc::byte_len(dtype, &shape)?,
                shape,
            })
        })
        .collect()
}

/// Refuses an output of `len` bytes that does not fit its place in shared
/// memory.
fn fits(dest: &ShmOutput, name: &str, dtype: DType, shape: &[u64], len: u64) -> Result<(), String> {
    if len > dest.capacity() as u64 {
        return Err(format!(
            "output '{name}' is {} bytes ({}{shape:?}), more than the {} bytes its \
             shared_memory_byte_size gives it in shared memory region '{}'",
            len,
            kserve_datatype(dtype),
            dest.capacity(),
            dest.region()
        ));
    }
    Ok(())
}

/// Runs the model with every output written where it goes: outputs in
/// shared memory straight into their regions, the others into fresh
/// buffers handed to the response without a copy.
fn run_in_place(
    core: &AgentCore,
    prep: &Prepared<'_>,
    views: &[TensorView<'_>],
    planned: Vec<Planned>,
    wanted: &[Requested],
    dests: &mut [Option<ShmOutput>],
    tl: &mut Timeline,
) -> Result<Vec<Output>, Status> {
    // Output i of the model goes to wanted[at[i]] when that is in shared
    // memory, else into owned[i].
    let at: Vec<Option<usize>> = planned
        .iter()
        .map(|p| {
            wanted
                .iter()
                .position(|w| w.name == p.name)
                .filter(|&j| dests[j].is_some())
        })
        .collect();
    let mut owned: Vec<Option<AlignedBuf>> = Vec::with_capacity(planned.len());
    for (p, at) in planned.iter().zip(&at) {
        owned.push(match at {
            Some(_) => None,
            None => {
                let len = usize::try_from(p.len).map_err(|_| {
                    Status::invalid_argument(format!("output '{}' is too large", p.name))
                })?;
                Some(
                    AlignedBuf::zeroed(len).map_err(|e| {
                        Status::resource_exhausted(format!("output '{}': {e}", p.name))
                    })?,
                )
            }
        });
    }
    {
        let mut slots: Vec<Option<&mut [u8]>> = (0..planned.len()).map(|_| None).collect();
        for (i, b) in owned.iter_mut().enumerate() {
            if let Some(b) = b {
                slots[i] = Some(b.as_mut_slice());
            }
        }
        for (j, dest) in dests.iter_mut().enumerate() {
            let i = at.iter().position(|a| *a == Some(j));
            if let (Some(i), Some(dest)) = (i, dest) {
                // Fits: checked against the plan before the run.
                let len = usize::try_from(planned[i].len).unwrap_or(usize::MAX);
                slots[i] = dest.as_mut_slice().get_mut(..len);
            }
        }
        let mut bufs = slots
            .into_iter()
            .collect::<Option<Vec<&mut [u8]>>>()
            .ok_or_else(|| Status::internal("an output has no buffer"))?;
        core.run_into(prep, views, &mut bufs, tl)
            .map_err(|r| error_status(&r))?;
    }
    let lens: Vec<u64> = planned.iter().map(|p| p.len).collect();
    let (offsets, payload_len) = layout_payload(lens.iter().copied())
        .ok_or_else(|| Status::internal("output layout overflows"))?;
    let descs: Vec<TensorDesc> = planned
        .iter()
        .zip(offsets)
        .map(|(p, offset)| TensorDesc {
            dtype: p.dtype,
            shape: p.shape.clone(),
            offset,
            len: p.len,
        })
        .collect();
    core.respond(prep, &descs, payload_len, tl)
        .map_err(|r| error_status(&r))?;
    let mut in_place = 0u64;
    let mut outputs = Vec::with_capacity(wanted.len());
    for (j, w) in wanted.iter().enumerate() {
        let i = planned
            .iter()
            .position(|p| p.name == w.name)
            .ok_or_else(|| Status::invalid_argument(format!("no output named '{}'", w.name)))?;
        let p = &planned[i];
        let (data, shm) = match &dests[j] {
            Some(dest) => {
                in_place += p.len;
                (
                    Bytes::new(),
                    Some(Placed {
                        region: dest.region().to_string(),
                        offset: dest.offset(),
                        byte_size: p.len,
                    }),
                )
            }
            None => {
                let buf = owned[i]
                    .take()
                    .ok_or_else(|| Status::internal(format!("output '{}' twice", w.name)))?;
                (Bytes::from_owner(OwnedOutput(buf)), None)
            }
        };
        outputs.push(Output {
            name: p.name.clone(),
            datatype: kserve_datatype(p.dtype),
            shape: dims_i64(&p.shape, i)?,
            data,
            shm,
        });
    }
    core.counters
        .shm_output_bytes_in_place
        .fetch_add(in_place, Ordering::Relaxed);
    Ok(outputs)
}

/// The name of the engine's output `i`: the signature's, else (an output
/// aliasing an input of a model that declares none: identity) that
/// input's, else `OUTPUT<i>`.
fn output_name<'a>(
    i: usize,
    out: &engine::Output,
    sig: &'a wire::ModelSignature,
    inputs: &'a [Input],
) -> Cow<'a, str> {
    if let Some(s) = sig.outputs.get(i) {
        return Cow::Borrowed(&s.name);
    }
    match out.data {
        OutputData::Input(j) if j < inputs.len() => Cow::Borrowed(&inputs[j].name),
        _ => Cow::Owned(format!("OUTPUT{i}")),
    }
}

/// The engine's outputs, named, their bytes handed over without a copy
/// (an output aliasing an input is that input's bytes).
fn engine_outputs(
    produced: Vec<engine::Output>,
    sig: &wire::ModelSignature,
    inputs: &[Input],
) -> Result<Vec<Output>, Status> {
    let mut outputs = Vec::with_capacity(produced.len());
    for (i, out) in produced.into_iter().enumerate() {
        let name = output_name(i, &out, sig, inputs).into_owned();
        let bytes = match out.data {
            OutputData::Input(j) => {
                let input: &Input = inputs.get(j).ok_or_else(|| {
                    Status::internal(format!("output {i} aliases missing input {j}"))
                })?;
                input.data.clone()
            }
            OutputData::Owned(buf) => Bytes::from_owner(OwnedOutput(buf)),
        };
        outputs.push(Output {
            name,
            datatype: kserve_datatype(out.dtype),
            shape: dims_i64(&out.shape, i)?,
            data: bytes,
            shm: None,
        });
    }
    Ok(outputs)
}

/// The outputs `wanted` names, in its order (all when it names none).
fn pick(
    outputs: Vec<Output>,
    wanted: &[Requested],
    sig: &wire::ModelSignature,
) -> Result<Vec<Output>, Status> {
    if wanted.is_empty() {
        return Ok(outputs);
    }
    let mut picked = Vec::with_capacity(wanted.len());
    for w in wanted {
        let o = outputs.iter().find(|o| o.name == w.name).ok_or_else(|| {
            Status::invalid_argument(format!(
                "model '{}' has no output named '{}'",
                sig.name, w.name
            ))
        })?;
        picked.push(o.clone());
    }
    Ok(picked)
}

/// Copies the engine's outputs that go to shared memory into their places
/// (once each, with the agent's data mover: streaming stores for large
/// outputs where `tensorwire calibrate` found them faster) and returns the
/// bytes copied; an output that does not fit its place is refused. Runs
/// inside [`AgentCore::execute_placing`], before the response is built.
fn place_copies(
    produced: &[engine::Output],
    views: &[TensorView<'_>],
    sig: &wire::ModelSignature,
    inputs: &[Input],
    wanted: &[Requested],
    dests: &mut [Option<ShmOutput>],
) -> Result<u64, String> {
    let mut copied = 0u64;
    for (w, dest) in wanted.iter().zip(dests.iter_mut()) {
        let Some(dest) = dest else { continue };
        // An output the model does not have is refused by `pick`, after.
        let Some(out) = produced
            .iter()
            .enumerate()
            .find(|(i, o)| output_name(*i, o, sig, inputs) == w.name.as_str())
            .map(|(_, o)| o)
        else {
            continue;
        };
        let bytes = out.bytes(views);
        fits(dest, &w.name, out.dtype, &out.shape, bytes.len() as u64)?;
        server::movers().move_bytes(&mut dest.as_mut_slice()[..bytes.len()], bytes);
        copied += bytes.len() as u64;
    }
    Ok(copied)
}

/// Marks the outputs copied into shared memory by [`place_copies`]: each
/// says where it is and carries no bytes in the response.
fn mark_placed(mut outputs: Vec<Output>, dests: &[Option<ShmOutput>]) -> Vec<Output> {
    for (o, dest) in outputs.iter_mut().zip(dests) {
        if let Some(dest) = dest {
            o.shm = Some(Placed {
                region: dest.region().to_string(),
                offset: dest.offset(),
                byte_size: o.data.len() as u64,
            });
            o.data = Bytes::new();
        }
    }
    outputs
}

/// Output `i`'s dimensions as KServe's `int64`s.
fn dims_i64(shape: &[u64], i: usize) -> Result<Vec<i64>, Status> {
    shape
        .iter()
        .map(|&d| {
            i64::try_from(d)
                .map_err(|_| Status::internal(format!("output {i} dimension {d} too large")))
        })
        .collect()
}

/// The output names the request asks for, if it names any: each once, and
/// names the model does not have are refused before the model runs when
/// its signature declares its outputs.
fn requested_outputs(sig: &wire::ModelSignature, wanted: &[Requested]) -> Result<(), Status> {
    for (i, w) in wanted.iter().enumerate() {
        if wanted[..i].iter().any(|o| o.name == w.name) {
            return Err(Status::invalid_argument(format!(
                "output '{}' is requested twice",
                w.name
            )));
        }
    }
    if !sig.outputs.is_empty() {
        if let Some(bad) = wanted
            .iter()
            .find(|w| !sig.outputs.iter().any(|s| s.name == w.name))
        {
            let known: Vec<&str> = sig.outputs.iter().map(|s| s.name.as_str()).collect();
            return Err(Status::invalid_argument(format!(
                "model '{}' has no output named '{}' (its outputs: {})",
                sig.name,
                bad.name,
                known.join(", ")
            )));
        }
    }
    Ok(())
}

/// The gRPC status of an Error reply from the core.
fn error_status(reply: &Reply) -> Status {
    use wire::Status as W;
    let message = decode_error_body(&reply.desc)
        .unwrap_or_else(|_| format!("the agent refused the request ({:?})", reply.header.status));
    match reply.header.status {
        W::UnknownModel => Status::not_found(message),
        W::InvalidInput | W::Malformed => Status::invalid_argument(message),
        W::LimitExceeded | W::TooManyInFlight => Status::resource_exhausted(message),
        // A full queue is worth retrying (Triton answers UNAVAILABLE too).
        W::ShuttingDown | W::Overloaded | W::Unavailable => Status::unavailable(message),
        W::Timeout => Status::deadline_exceeded(message),
        W::PermissionDenied => Status::permission_denied(message),
        _ => Status::internal(message),
    }
}

/// What a KServe request asks of the model's queue: Triton's request
/// parameters `priority` (1 = the highest level; 0, absent, or a level the
/// model does not have: the model's default, as Triton does) and `timeout`
/// (µs it may wait in the queue; 0 or absent: the model's default),
/// carried to the core in the native header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scheduling {
    pub(crate) priority: u8,
    pub(crate) timeout_us: u32,
}

impl Scheduling {
    /// From a gRPC request's parameters (int64 or uint64 values).
    fn of_grpc(params: &HashMap<String, InferParameter>) -> Result<Scheduling, Status> {
        let num = |key: &str| -> Result<Option<u64>, Status> {
            match params.get(key).and_then(|p| p.parameter_choice.as_ref()) {
                None => Ok(None),
                Some(ParameterChoice::Int64Param(v)) => u64::try_from(*v).map(Some).map_err(|_| {
                    Status::invalid_argument(format!("parameter '{key}' is {v}, must be 0 or more"))
                }),
                Some(ParameterChoice::Uint64Param(v)) => Ok(Some(*v)),
                Some(_) => Err(Status::invalid_argument(format!(
                    "parameter '{key}' must be an integer"
                ))),
            }
        };
        Scheduling::new(num("priority")?, num("timeout")?)
    }

    /// From the two values, range-checked: a priority fits 0..=255, a
    /// timeout 0..=u32::MAX µs.
    pub(crate) fn new(
        priority: Option<u64>,
        timeout_us: Option<u64>,
    ) -> Result<Scheduling, Status> {
        let priority = u8::try_from(priority.unwrap_or(0)).map_err(|_| {
            Status::invalid_argument(format!(
                "parameter 'priority' is {}, must be 0..=255 (1 = the highest level; 0 = the \
                 model's default)",
                priority.unwrap_or(0)
            ))
        })?;
        let timeout_us = u32::try_from(timeout_us.unwrap_or(0)).map_err(|_| {
            Status::invalid_argument(format!(
                "parameter 'timeout' is {} µs, at most {} (~71 min)",
                timeout_us.unwrap_or(0),
                u32::MAX
            ))
        })?;
        Ok(Scheduling {
            priority,
            timeout_us,
        })
    }
}

/// An engine-allocated output handed to a `Bytes` without a copy.
struct OwnedOutput(AlignedBuf);

impl AsRef<[u8]> for OwnedOutput {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}
