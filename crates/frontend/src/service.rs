//! [`KServeService`]: `GRPCInferenceService` over the agent's
//! [`AgentCore`].
//!
//! `ModelInfer` checks the request from the wire (`inputs`), builds the
//! same header and descriptor section a native client would send, and runs
//! it through `AgentCore::prepare` (shutdown, model, limits, signature,
//! payload budget) and `AgentCore::execute` (the model's FIFO queue, the
//! engine, output checks, counters) on a blocking-pool thread, with the
//! tensors read where tonic decoded them. Outputs go back as
//! `raw_output_contents`; an output that is an unchanged input (identity)
//! is the request's own buffer, an engine-allocated one is handed over
//! without a copy.

use crate::datatype::kserve_datatype;
use crate::door::FrontDoor;
use crate::inputs::{gather, order_by_signature, Input};
use crate::proto::grpc_inference_service_server::GrpcInferenceService;
use crate::proto::model_infer_request::InferInputTensor;
use crate::proto::model_infer_response::InferOutputTensor;
use crate::proto::model_metadata_response::TensorMetadata;
use crate::proto::{
    ModelInferRequest, ModelInferResponse, ModelMetadataRequest, ModelMetadataResponse,
    ModelReadyRequest, ModelReadyResponse, ModelStatisticsRequest, ModelStatisticsResponse,
    ModelStreamInferResponse, ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest,
    ServerMetadataResponse, ServerReadyRequest, ServerReadyResponse,
};
use crate::statistics::{model_statistics, Refusal};
use bytes::Bytes;
use engine::{OutputData, TensorView};
use server::dispatch::{AgentCore, Reply};
use server::{ModelEntry, Via};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use wire::{
    decode_error_body, encode_tensor_section, layout_payload, AlignedBuf, Header, Kind, Placement,
    Stage, TensorDesc, TensorSpec,
};

/// The only model version tensorwire serves (a model has one version;
/// requests may also leave the version empty).
pub const MODEL_VERSION: &str = "1";

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

    /// Ready for requests: neither the agent nor the front door stopping.
    pub(crate) fn ready(&self, core: &AgentCore) -> bool {
        !core.is_closing() && !self.stopping.load(Ordering::Acquire)
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
        self.shared.ready(&self.door.core)
    }

    /// The model `name` at `version` ("" or "1"), or NOT_FOUND.
    fn model(&self, name: &str, version: &str) -> Result<&ModelEntry, Status> {
        find_model(&self.door.core, name, version)
    }
}

pub(crate) fn find_model<'a>(
    core: &'a AgentCore,
    name: &str,
    version: &str,
) -> Result<&'a ModelEntry, Status> {
    let m = core.registry.find(name).ok_or_else(|| {
        let known: Vec<String> = core
            .registry
            .iter()
            .map(|m| m.signature().name.clone())
            .collect();
        Status::not_found(format!(
            "unknown model '{name}' (served: {})",
            known.join(", ")
        ))
    })?;
    if !version.is_empty() && version != MODEL_VERSION {
        return Err(Status::not_found(format!(
            "model '{name}' has no version '{version}' (tensorwire serves version \
             {MODEL_VERSION} only)"
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
    /// answers), not an error.
    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let req = request.into_inner();
        let ready = self.ready() && self.model(&req.name, &req.version).is_ok();
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _request: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "tensorwire".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            // Of the named KServe/Triton extensions, statistics is served
            // (not yet: model repository, shared memory, ...).
            extensions: vec!["statistics".to_string()],
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let req = request.into_inner();
        let model = self.model(&req.name, &req.version)?;
        let sig = model.signature();
        Ok(Response::new(ModelMetadataResponse {
            name: sig.name.clone(),
            versions: vec![MODEL_VERSION.to_string()],
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
        let req = request.into_inner();
        model_statistics(&self.door.core, &req.name, &req.version).map(Response::new)
    }

    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let _call = InFlight::enter(&self.shared);
        let core = self.door.core.clone();
        let shared = self.shared.clone();
        let req = request.into_inner();
        let answer = tokio::task::spawn_blocking(move || infer(&core, &shared, req))
            .await
            .map_err(|e| Status::internal(format!("the inference task failed: {e}")))?;
        answer.map(Response::new)
    }

    /// Answers each request of the stream in order, one at a time; a
    /// request that fails is answered with its `error_message` and the
    /// stream goes on (Triton's behaviour).
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<InferStream>, Status> {
        let mut requests = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let core = self.door.core.clone();
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
                let (c, s) = (core.clone(), shared.clone());
                let answer = match tokio::task::spawn_blocking(move || infer(&c, &s, req)).await {
                    Ok(Ok(r)) => ModelStreamInferResponse {
                        error_message: String::new(),
                        infer_response: Some(r),
                    },
                    Ok(Err(status)) => ModelStreamInferResponse {
                        error_message: status.message().to_string(),
                        infer_response: None,
                    },
                    Err(e) => ModelStreamInferResponse {
                        error_message: format!("the inference task failed: {e}"),
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

/// One `ModelInfer`, start to finish, on the calling (blocking) thread.
fn infer(
    core: &AgentCore,
    shared: &Shared,
    mut req: ModelInferRequest,
) -> Result<ModelInferResponse, Status> {
    let wanted: Vec<String> = req.outputs.iter().map(|o| o.name.clone()).collect();
    let outputs = infer_over_core(
        core,
        shared,
        &req.model_name,
        &req.model_version,
        std::mem::take(&mut req.inputs),
        std::mem::take(&mut req.raw_input_contents),
        &wanted,
    )?;
    let (tensors, raw) = outputs
        .into_iter()
        .map(|o| {
            (
                InferOutputTensor {
                    name: o.name,
                    datatype: o.datatype.to_string(),
                    shape: o.shape,
                    parameters: HashMap::new(),
                    contents: None,
                },
                o.data,
            )
        })
        .unzip();
    Ok(ModelInferResponse {
        model_name: req.model_name,
        model_version: MODEL_VERSION.to_string(),
        id: req.id,
        parameters: HashMap::new(),
        outputs: tensors,
        raw_output_contents: raw,
    })
}

/// One output of an inference: its KServe datatype, shape and bytes.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<i64>,
    pub data: Bytes,
}

/// The shared path of both front doors: finds the model, checks and
/// gathers the inputs (`tensors` with `raw` bytes for all or none of them,
/// as KServe v2 gRPC's `raw_input_contents`), builds the request a native
/// client would send and runs it through `AgentCore::prepare` and
/// `AgentCore::execute`. `wanted` names the outputs to return (all when
/// empty). Runs on the calling (blocking) thread.
pub(crate) fn infer_over_core(
    core: &AgentCore,
    shared: &Shared,
    model_name: &str,
    model_version: &str,
    tensors: Vec<InferInputTensor>,
    raw: Vec<Bytes>,
    wanted: &[String],
) -> Result<Vec<Output>, Status> {
    let model = find_model(core, model_name, model_version)?;
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
    let inputs = order_by_signature(sig, inputs)?;
    requested_outputs(sig, wanted)?;
    // The request as a native client would send it.
    let lens: Vec<u64> = inputs.iter().map(|i| i.data.len() as u64).collect();
    let (offsets, payload_len) = layout_payload(lens.iter().copied())
        .ok_or_else(|| Status::invalid_argument("the request's tensors are too large"))?;
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
    h.tensor_count =
        u32::try_from(descs.len()).map_err(|_| Status::invalid_argument("too many inputs"))?;
    h.desc_len = u32::try_from(desc.len())
        .map_err(|_| Status::invalid_argument("the inputs' shapes are too large"))?;
    h.payload_len = payload_len;
    if let Err(e) = h.check_limits(&core.limits) {
        return Err(error_status(&core.fail(Reply::error(
            h.request_id,
            e.status(),
            &e.to_string(),
        ))));
    }

    refusal.passed();
    let prep = core
        .prepare_via(shared.via, &h, &desc, &core.limits, Placement::Payload, &tl)
        .map_err(|r| error_status(&r))?;
    tl.stamp(Stage::PayloadInPlace);
    let views: Vec<TensorView<'_>> = descs
        .iter()
        .zip(&inputs)
        .map(|(d, i)| TensorView::new(d.dtype, &d.shape, &i.data))
        .collect();
    let reply = core.execute(&prep, &views, &mut tl);
    drop(views);
    drop(prep);
    if reply.header.kind == Kind::Error {
        return Err(error_status(&reply));
    }

    let mut outputs = Vec::with_capacity(reply.outputs.len());
    for (i, out) in reply.outputs.into_iter().enumerate() {
        let (name, bytes) = match out.data {
            OutputData::Input(j) => {
                let input: &Input = inputs.get(j).ok_or_else(|| {
                    Status::internal(format!("output {i} aliases missing input {j}"))
                })?;
                let name = sig.outputs.get(i).map_or(&input.name, |s| &s.name);
                (name.clone(), input.data.clone())
            }
            OutputData::Owned(buf) => (
                sig.outputs
                    .get(i)
                    .map_or_else(|| format!("OUTPUT{i}"), |s| s.name.clone()),
                Bytes::from_owner(OwnedOutput(buf)),
            ),
        };
        let shape = out
            .shape
            .iter()
            .map(|&d| {
                i64::try_from(d)
                    .map_err(|_| Status::internal(format!("output {i} dimension {d} too large")))
            })
            .collect::<Result<Vec<i64>, _>>()?;
        outputs.push(Output {
            name,
            datatype: kserve_datatype(out.dtype),
            shape,
            data: bytes,
        });
    }
    if !wanted.is_empty() {
        let mut picked = Vec::with_capacity(wanted.len());
        for name in wanted {
            let o = outputs.iter().find(|o| &o.name == name).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "model '{}' has no output named '{name}'",
                    sig.name
                ))
            })?;
            picked.push(o.clone());
        }
        outputs = picked;
    }
    Ok(outputs)
}

/// The output names the request asks for, if it names any; names the model
/// does not have are refused before the model runs when its signature
/// declares its outputs.
fn requested_outputs(sig: &wire::ModelSignature, names: &[String]) -> Result<(), Status> {
    if !sig.outputs.is_empty() {
        if let Some(bad) = names
            .iter()
            .find(|n| !sig.outputs.iter().any(|s| &s.name == *n))
        {
            let known: Vec<&str> = sig.outputs.iter().map(|s| s.name.as_str()).collect();
            return Err(Status::invalid_argument(format!(
                "model '{}' has no output named '{bad}' (its outputs: {})",
                sig.name,
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
        W::ShuttingDown => Status::unavailable(message),
        _ => Status::internal(message),
    }
}

/// An engine-allocated output handed to a `Bytes` without a copy.
struct OwnedOutput(AlignedBuf);

impl AsRef<[u8]> for OwnedOutput {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}
