//! [`HttpFrontend`]: the KServe v2 HTTP/REST listener on
//! `http://HOST:PORT` or, over TLS, `https://HOST:PORT` (axum on its own
//! tokio runtime; TLS in `tls`), with JSON tensors,
//! the binary tensor data extension and Triton's system shared-memory
//! extension (`/v2/systemsharedmemory/...`, and `shared_memory_*` tensor
//! parameters). Each inference is turned into the gRPC front door's input
//! tensors and run through the same `infer_over_core` path.

use crate::accept::DoorIncoming;
use crate::access::{self, check_operator};
use crate::datatype::dtype_from_kserve;
use crate::door::{run_request, FrontDoor, INLINE_MAX_BYTES};
use crate::metrics::Metrics;
use crate::model_control;
use crate::proto::infer_parameter::ParameterChoice;
use crate::proto::model_config::SchedulingChoice;
use crate::proto::model_infer_request::InferInputTensor;
use crate::proto::InferParameter;
use crate::proto::{DataType, ModelConfig};
use crate::serve_http::serve_http;
use crate::server::{parse_host_port, FrontendError, Running};
use crate::service::EXTENSIONS;
use crate::service::{
    find_model, infer_over_core, metadata, platform, Caller, InFlight, Output, Requested,
    Scheduling, Shared,
};
use crate::statistics::{model_statistics, stats_json, Refusal};
use crate::sysshm::{shm_ref, PARAM_BYTE_SIZE, PARAM_OFFSET, PARAM_REGION};
use crate::tls::{DoorTls, PlainText, HTTPS_SCHEME};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use server::tenants::Seat;
use server::Via;
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Code, Status};
use transport::tls::ServerTlsFiles;
use wire::DType;

/// The URI scheme of the HTTP front door.
pub const HTTP_SCHEME: &str = "http://";

/// The header giving the JSON part's length when binary data follows it.
const HEADER_LEN: &str = "inference-header-content-length";

/// Room for the JSON on top of the agent's `max_payload`.
const BODY_OVERHEAD: u64 = 1 << 20;

/// The `HOST:PORT` of an `http://HOST:PORT` or `https://HOST:PORT` (TLS)
/// URI (port 0 picks a free one).
pub fn parse_http_uri(uri: &str) -> Result<&str, FrontendError> {
    parse_host_port(uri, &[HTTP_SCHEME, HTTPS_SCHEME], "HTTP").map(|(_, addr)| addr)
}

/// A running KServe v2 HTTP/REST front door.
///
/// Dropping it without [`shutdown`](HttpFrontend::shutdown) stops it the
/// same way. Either must happen outside any tokio runtime.
#[derive(Debug)]
pub struct HttpFrontend(Running);

#[derive(Clone)]
struct App {
    door: Arc<FrontDoor>,
    shared: Arc<Shared>,
    max_body: u64,
    metrics: Arc<Metrics>,
}

impl HttpFrontend {
    /// Starts serving `door` on `listen` (`http://HOST:PORT`). Request
    /// bodies over the core's `max_payload` plus 1 MiB are refused with 413
    /// (on their Content-Length, before they are read). An `https://` door
    /// needs [`HttpFrontend::start_with`].
    pub fn start(listen: &str, door: Arc<FrontDoor>) -> Result<HttpFrontend, FrontendError> {
        HttpFrontend::start_with(listen, door, None)
    }

    /// [`HttpFrontend::start`] for `http://HOST:PORT` or, with the agent's
    /// TLS files, `https://HOST:PORT` (the same routes over TLS, ALPN
    /// `http/1.1`; a client CA in `tls` makes client certificates
    /// required). `tls` is not used by an `http://` door.
    pub fn start_with(
        listen: &str,
        door: Arc<FrontDoor>,
        tls: Option<&ServerTlsFiles>,
    ) -> Result<HttpFrontend, FrontendError> {
        let tls = DoorTls::read_for(listen, HTTPS_SCHEME, tls)?;
        HttpFrontend::start_door(listen, door, tls.as_ref())
    }

    /// Starts a door with its TLS configuration already read.
    pub(crate) fn start_door(
        listen: &str,
        door: Arc<FrontDoor>,
        tls: Option<&DoorTls>,
    ) -> Result<HttpFrontend, FrontendError> {
        let (scheme, addr) = parse_host_port(listen, &[HTTP_SCHEME, HTTPS_SCHEME], "HTTP")?;
        let tls = DoorTls::pick(listen, scheme == HTTPS_SCHEME, tls, DoorTls::http)?;
        let shared = Arc::new(Shared::via(Via::Http));
        let app = App {
            max_body: door.core.limits.max_payload.saturating_add(BODY_OVERHEAD),
            metrics: Arc::new(Metrics::new(door.core.clone())?),
            door,
            shared: shared.clone(),
        };
        let core = app.door.core.clone();
        let head_timeout = core.stall_timeout();
        let router = router(app);
        let stop = |stopped: tokio::sync::oneshot::Receiver<()>| async move {
            let _ = stopped.await;
        };
        // Over connections admitted and past their first byte (and TLS
        // handshake): accept::DoorIncoming.
        Running::start(
            listen,
            addr,
            scheme,
            "tw-http-frontend",
            shared,
            |listener, stopped| async move {
                let incoming = DoorIncoming::start(
                    listener,
                    &core,
                    tls.map(|c| (c, PlainText::HttpError)),
                    false,
                );
                serve_http(incoming, router, head_timeout, stop(stopped)).await;
            },
        )
        .map(HttpFrontend)
    }

    /// The URI it listens on, with the port it was given for port 0.
    pub fn uri(&self) -> &str {
        self.0.uri()
    }

    /// From now on `/v2/health/ready` answers 503.
    pub fn set_not_ready(&self) {
        self.0.set_not_ready();
    }

    /// Stops serving (graceful: requests in flight get up to 5 s).
    pub fn shutdown(self) {
        self.0.shutdown();
    }
}

fn router(app: App) -> Router {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2/models/stats", get(model_stats))
        .route("/v2/models/{name}/stats", get(model_stats))
        .route(
            "/v2/models/{name}/versions/{version}/stats",
            get(model_stats),
        )
        .route("/metrics", get(metrics))
        .route("/v2/models/{name}/config", get(model_config))
        .route(
            "/v2/models/{name}/versions/{version}/config",
            get(model_config),
        )
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{name}/load", post(repository_load))
        .route(
            "/v2/repository/models/{name}/unload",
            post(repository_unload),
        )
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/versions/{version}", get(model_metadata))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(model_ready),
        )
        .route("/v2/models/{name}/infer", post(model_infer))
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(model_infer),
        )
        .route("/v2/systemsharedmemory/status", get(shm_status))
        .route(
            "/v2/systemsharedmemory/region/{name}/status",
            get(shm_region_status),
        )
        .route(
            "/v2/systemsharedmemory/region/{name}/register",
            post(shm_register),
        )
        .route(
            "/v2/systemsharedmemory/region/{name}/unregister",
            post(shm_unregister),
        )
        .route(
            "/v2/systemsharedmemory/unregister",
            post(shm_unregister_all),
        )
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .with_state(app)
}

/// A KServe error body with `status`.
fn error(status: StatusCode, message: &str) -> Response {
    json_response(status, &json!({ "error": message }))
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut r = (status, v.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The seat of the caller whose request has `headers` (its
/// `Authorization`; see [`crate::access`]); none, without reading the
/// headers, when the agent has no tenants.
fn seat_of(app: &App, headers: &HeaderMap) -> Result<Option<Seat>, Status> {
    if app.door.core.tenants().is_none() {
        return Ok(None);
    }
    access::seat(
        &app.door.core,
        headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .map(HeaderValue::as_bytes),
    )
}

/// The HTTP answer to a refusal from the shared path.
fn status_response(s: &Status) -> Response {
    if s.code() == Code::Unauthenticated {
        // RFC 6750: say which scheme the agent wants.
        let mut r = error(StatusCode::UNAUTHORIZED, s.message());
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"tensorwire\""),
        );
        return r;
    }
    let code = match s.code() {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(code, s.message())
}

fn bad(message: impl Into<String>) -> Status {
    Status::invalid_argument(message.into())
}

fn name_version(p: &HashMap<String, String>) -> (String, String) {
    (
        p.get("name").cloned().unwrap_or_default(),
        p.get("version").cloned().unwrap_or_default(),
    )
}

async fn server_metadata() -> Response {
    let mut extensions = vec!["binary_tensor_data"];
    extensions.extend_from_slice(EXTENSIONS);
    json_response(
        StatusCode::OK,
        &json!({
            "name": "tensorwire",
            "version": env!("CARGO_PKG_VERSION"),
            "extensions": extensions,
        }),
    )
}

/// Triton's statistics extension: `v2/models/stats` (every model),
/// `v2/models/NAME/stats`, `v2/models/NAME/versions/V/stats`.
async fn model_stats(
    State(app): State<App>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let (name, version) = name_version(&p);
    let found = seat_of(&app, &headers)
        .and_then(|seat| model_statistics(&app.door.core, seat.as_ref(), &name, &version));
    match found {
        Ok(r) => json_response(StatusCode::OK, &stats_json(&r)),
        Err(s) => status_response(&s),
    }
}

/// Triton's model configuration extension: the config as JSON, with
/// Triton's field and enum names.
async fn model_config(
    State(app): State<App>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let (name, version) = name_version(&p);
    let found = seat_of(&app, &headers)
        .and_then(|seat| model_control::config(&app.door, seat.as_ref(), &name, &version));
    match found {
        Ok(c) => json_response(StatusCode::OK, &config_json(&c)),
        Err(s) => status_response(&s),
    }
}

/// The optional JSON body of a repository call: an object, or nothing.
fn repository_body(body: &Bytes) -> Result<Map<String, Value>, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad("the request body must be a JSON object")),
        Err(e) => Err(bad(format!("the request body is not valid JSON ({e})"))),
    }
}

/// `POST v2/repository/index` (body `{"ready": bool}`, optional): a JSON
/// array of `{name, version, state, reason}`.
async fn repository_index(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let seat = match seat_of(&app, &headers) {
        Ok(seat) => seat,
        Err(s) => return status_response(&s),
    };
    let ready = match repository_body(&body) {
        Ok(m) => m.get("ready").and_then(Value::as_bool).unwrap_or(false),
        Err(s) => return status_response(&s),
    };
    match model_control::index(&app.door, seat.as_ref(), ready) {
        Ok(models) => {
            let list: Vec<Value> = models
                .into_iter()
                .map(|m| {
                    let mut o = Map::new();
                    o.insert("name".into(), json!(m.name));
                    if !m.version.is_empty() {
                        o.insert("version".into(), json!(m.version));
                    }
                    if !m.state.is_empty() {
                        o.insert("state".into(), json!(m.state));
                        o.insert("reason".into(), json!(m.reason));
                    }
                    Value::Object(o)
                })
                .collect();
            json_response(StatusCode::OK, &Value::Array(list))
        }
        Err(s) => status_response(&s),
    }
}

/// Refuses `what` to a caller whose tenant may not change the agent for
/// every tenant ([`access::check_operator`]).
fn operator(app: &App, headers: &HeaderMap, what: &str) -> Result<(), Status> {
    check_operator(seat_of(app, headers)?.as_ref(), what)
}

/// The parameter names of a repository call's body.
fn parameter_names(m: &Map<String, Value>) -> Vec<String> {
    m.get("parameters")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// `POST v2/repository/models/NAME/load`, on a blocking-pool thread.
async fn repository_load(
    State(app): State<App>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(s) = operator(&app, &headers, "load models") {
        return status_response(&s);
    }
    let params = match repository_body(&body) {
        Ok(m) => parameter_names(&m),
        Err(s) => return status_response(&s),
    };
    if let Err(s) = model_control::refuse_parameters("load", params.iter().map(String::as_str)) {
        return status_response(&s);
    }
    let door = app.door.clone();
    let done =
        tokio::task::spawn_blocking(move || model_control::load(&door, &name, &HashMap::new()))
            .await;
    match done {
        Ok(Ok(())) => StatusCode::OK.into_response(),
        Ok(Err(s)) => status_response(&s),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("the load task failed: {e}"),
        ),
    }
}

/// `POST v2/repository/models/NAME/unload` (`unload_dependents` is
/// accepted; there are no ensembles).
async fn repository_unload(
    State(app): State<App>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(s) = operator(&app, &headers, "unload models") {
        return status_response(&s);
    }
    let params = match repository_body(&body) {
        Ok(m) => parameter_names(&m),
        Err(s) => return status_response(&s),
    };
    let others = params.iter().filter(|p| *p != "unload_dependents");
    if let Err(s) = model_control::refuse_parameters("unload", others.map(String::as_str)) {
        return status_response(&s);
    }
    // On a blocking-pool thread: unload waits for a load in progress.
    let door = app.door.clone();
    let done =
        tokio::task::spawn_blocking(move || model_control::unload(&door, &name, &HashMap::new()))
            .await;
    match done {
        Ok(Ok(())) => StatusCode::OK.into_response(),
        Ok(Err(s)) => status_response(&s),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("the unload task failed: {e}"),
        ),
    }
}

/// A model config as Triton's HTTP door writes it.
fn config_json(c: &ModelConfig) -> Value {
    let dtype = |d: i32| {
        DataType::try_from(d)
            .unwrap_or(DataType::TypeInvalid)
            .as_str_name()
    };
    let mut o = Map::new();
    o.insert("name".into(), json!(c.name));
    o.insert("platform".into(), json!(c.platform));
    o.insert("backend".into(), json!(c.backend));
    o.insert("max_batch_size".into(), json!(c.max_batch_size));
    let inputs: Vec<Value> = c
        .input
        .iter()
        .map(|i| json!({"name": i.name, "data_type": dtype(i.data_type), "dims": i.dims, "optional": i.optional}))
        .collect();
    o.insert("input".into(), Value::Array(inputs));
    let outputs: Vec<Value> = c
        .output
        .iter()
        .map(|t| json!({"name": t.name, "data_type": dtype(t.data_type), "dims": t.dims}))
        .collect();
    o.insert("output".into(), Value::Array(outputs));
    let groups: Vec<Value> = c
        .instance_group
        .iter()
        .map(|g| json!({"name": g.name, "kind": g.kind().as_str_name(), "count": g.count, "gpus": g.gpus}))
        .collect();
    o.insert("instance_group".into(), Value::Array(groups));
    o.insert(
        "default_model_filename".into(),
        json!(c.default_model_filename),
    );
    if let Some(SchedulingChoice::DynamicBatching(b)) = &c.scheduling_choice {
        o.insert(
            "dynamic_batching".into(),
            json!({
                "preferred_batch_size": b.preferred_batch_size,
                "max_queue_delay_microseconds": b.max_queue_delay_microseconds,
                "preserve_ordering": b.preserve_ordering,
                "priority_levels": b.priority_levels,
                "default_priority_level": b.default_priority_level,
            }),
        );
    }
    let params: Map<String, Value> = c
        .parameters
        .iter()
        .map(|(k, v)| (k.clone(), json!({"string_value": v.string_value})))
        .collect();
    o.insert("parameters".into(), Value::Object(params));
    Value::Object(o)
}

/// Prometheus metrics, text format.
async fn metrics(State(app): State<App>) -> Response {
    app.metrics.response()
}

async fn server_ready(State(app): State<App>) -> StatusCode {
    if app.shared.ready(&app.door) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn model_ready(
    State(app): State<App>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let (name, version) = name_version(&p);
    let found = seat_of(&app, &headers)
        .and_then(|seat| find_model(&app.door.core, seat.as_ref(), &name, &version));
    if let Err(s) = found {
        return status_response(&s);
    }
    if app.shared.ready(&app.door) {
        StatusCode::OK.into_response()
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the agent is shutting down",
        )
    }
}

async fn model_metadata(
    State(app): State<App>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let (name, version) = name_version(&p);
    let found = seat_of(&app, &headers)
        .and_then(|seat| find_model(&app.door.core, seat.as_ref(), &name, &version));
    let model = match found {
        Ok(m) => m,
        Err(s) => return status_response(&s),
    };
    let sig = model.signature();
    let tensors = |ts: &[wire::TensorSpec]| -> Vec<Value> {
        ts.iter()
            .map(|t| {
                let m = metadata(t);
                json!({ "name": m.name, "datatype": m.datatype, "shape": m.shape })
            })
            .collect()
    };
    json_response(
        StatusCode::OK,
        &json!({
            "name": sig.name,
            "versions": [model.version.to_string()],
            "platform": platform(sig),
            "inputs": tensors(&sig.inputs),
            "outputs": tensors(&sig.outputs),
        }),
    )
}

async fn model_infer(
    State(app): State<App>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let _call = InFlight::enter(&app.shared);
    // The caller's tenant, before the body is read.
    let seat = match seat_of(&app, &headers) {
        Ok(seat) => seat,
        Err(s) => return status_response(&s),
    };
    // Refuse an oversized body on its Content-Length, before reading it.
    if let Some(len) = headers.get(header::CONTENT_LENGTH) {
        match len.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) if n > app.max_body => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!(
                        "the request body of {n} bytes is over the limit of {} bytes \
                         (the agent's max_payload + 1 MiB)",
                        app.max_body
                    ),
                )
            }
            Some(_) => {}
            None => return error(StatusCode::BAD_REQUEST, "bad Content-Length header"),
        }
    }
    let limit = usize::try_from(app.max_body).unwrap_or(usize::MAX);
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("cannot read the request body (over {limit} bytes?): {e}"),
            )
        }
    };
    let header_len = match headers.get(HEADER_LEN) {
        None => None,
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<usize>().ok()) {
            Some(n) if n <= body.len() => Some(n),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "bad Inference-Header-Content-Length: must be a number of bytes no \
                         larger than the body ({} bytes)",
                        body.len()
                    ),
                )
            }
        },
    };
    let (name, version) = name_version(&p);
    let (door, shared) = (app.door.clone(), app.shared.clone());
    // Small requests without shared memory run on this worker (see
    // run_request); a region is named in the JSON part.
    let json = &body[..header_len.unwrap_or(body.len())];
    let inline = body.len() <= INLINE_MAX_BYTES
        && door.runs_inline(
            &name,
            body.len(),
            memchr::memmem::find(json, PARAM_REGION.as_bytes()).is_some(),
        );
    match run_request(inline, move || {
        infer(&door, &shared, seat, &name, &version, body, header_len)
    })
    .await
    {
        Ok(Ok(r)) => r,
        Ok(Err(s)) => status_response(&s),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    }
}

/// A parsed JSON inference request.
struct Request {
    id: Option<Value>,
    tensors: Vec<InferInputTensor>,
    raw: Vec<Bytes>,
    /// Requested outputs and whether each goes back as binary data.
    outputs: Vec<(Requested, bool)>,
    binary_default: bool,
    /// `parameters.priority` and `parameters.timeout` (µs).
    sched: Scheduling,
}

fn infer(
    door: &FrontDoor,
    shared: &Shared,
    seat: Option<Seat>,
    name: &str,
    version: &str,
    body: Bytes,
    header_len: Option<usize>,
) -> Result<Response, Status> {
    // Model and version first, so an unknown one is a 404 (or one the
    // caller's tenant may not use a 403) whatever the body.
    let model = find_model(&door.core, seat.as_ref(), name, version)?;
    let served_version = model.version;
    // A body that does not parse is a failure of the model (timed from
    // here while the agent times requests).
    let arrived = if door.core.request_timing() {
        wire::monotonic_ns()
    } else {
        0
    };
    let refusal = Refusal::new(&model.stats, shared.via, arrived);
    let req = parse_request(&body, header_len)?;
    refusal.passed();
    let wanted: Vec<Requested> = req.outputs.iter().map(|(r, _)| r.clone()).collect();
    let outputs = infer_over_core(
        door,
        shared,
        Caller {
            seat,
            sched: req.sched,
        },
        &model,
        req.tensors,
        req.raw,
        &wanted,
    )?;
    let mut binary = Vec::new();
    let mut json_outputs = Vec::with_capacity(outputs.len());
    for o in outputs {
        let as_binary = req
            .outputs
            .iter()
            .find(|(r, _)| r.name == o.name)
            .map_or(req.binary_default, |(_, b)| *b);
        let mut t = Map::new();
        t.insert("name".into(), json!(o.name));
        t.insert("datatype".into(), json!(o.datatype));
        t.insert("shape".into(), json!(o.shape));
        if let Some(p) = &o.shm {
            // Written into shared memory: where, and no data here.
            t.insert(
                "parameters".into(),
                json!({
                    PARAM_REGION: p.region,
                    PARAM_OFFSET: p.offset,
                    PARAM_BYTE_SIZE: p.byte_size,
                }),
            );
        } else if as_binary {
            t.insert(
                "parameters".into(),
                json!({ "binary_data_size": o.data.len() }),
            );
            binary.push(o.data);
        } else {
            t.insert("data".into(), to_json(&o)?);
        }
        json_outputs.push(Value::Object(t));
    }
    let mut resp = Map::new();
    resp.insert("model_name".into(), json!(name));
    resp.insert("model_version".into(), json!(served_version.to_string()));
    if let Some(id) = req.id {
        resp.insert("id".into(), id);
    }
    resp.insert("outputs".into(), Value::Array(json_outputs));
    let text = Value::Object(resp).to_string();
    if binary.is_empty() {
        let mut r = (StatusCode::OK, text).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return Ok(r);
    }
    let mut out = Vec::with_capacity(text.len() + binary.iter().map(Bytes::len).sum::<usize>());
    out.extend_from_slice(text.as_bytes());
    for b in &binary {
        out.extend_from_slice(b);
    }
    let mut r = (StatusCode::OK, out).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(HEADER_LEN, HeaderValue::from(text.len()));
    Ok(r)
}

fn parse_request(body: &Bytes, header_len: Option<usize>) -> Result<Request, Status> {
    let json_len = header_len.unwrap_or(body.len());
    let v: Value = serde_json::from_slice(&body[..json_len])
        .map_err(|e| bad(format!("the request is not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("the request must be a JSON object"))?;
    let params = obj.get("parameters");
    let binary_default = match params.and_then(|p| p.get("binary_data_output")) {
        None => false,
        Some(b) => b
            .as_bool()
            .ok_or_else(|| bad("parameters.binary_data_output must be true or false"))?,
    };
    let num = |key: &str| -> Result<Option<u64>, Status> {
        match params.and_then(|p| p.get(key)) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                bad(format!(
                    "parameters.{key} must be a non-negative integer, not {v}"
                ))
            }),
        }
    };
    let sched = Scheduling::new(num("priority")?, num("timeout")?)?;
    let inputs = obj
        .get("inputs")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("the request needs an \"inputs\" list"))?;
    let mut binary = body.slice(json_len..);
    let mut tensors = Vec::with_capacity(inputs.len());
    let mut raw = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        let t = t
            .as_object()
            .ok_or_else(|| bad(format!("inputs[{i}] must be an object")))?;
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("inputs[{i}] needs a string \"name\"")))?
            .to_string();
        let datatype = t
            .get("datatype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("input '{name}' needs a string \"datatype\"")))?
            .to_string();
        let shape = t
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad(format!("input '{name}' needs a \"shape\" list")))?
            .iter()
            .map(Value::as_i64)
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| bad(format!("input '{name}': shape must hold integers")))?;
        let params = shm_parameters("input", &name, t.get("parameters"))?;
        if params.contains_key(PARAM_REGION) {
            // In shared memory: no bytes in the body.
            if t.get("data").is_some()
                || t.get("parameters")
                    .and_then(|p| p.get("binary_data_size"))
                    .is_some()
            {
                return Err(bad(format!(
                    "input '{name}': has both shared memory and data in the request"
                )));
            }
            tensors.push(InferInputTensor {
                name,
                datatype,
                shape,
                parameters: params,
                ..Default::default()
            });
            continue;
        }
        let size = match t.get("parameters").and_then(|p| p.get("binary_data_size")) {
            None => None,
            Some(n) => Some(n.as_u64().ok_or_else(|| {
                bad(format!(
                    "input '{name}': binary_data_size must be a non-negative integer"
                ))
            })?),
        };
        let bytes = match size {
            Some(n) => {
                let n = usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= binary.len())
                    .ok_or_else(|| {
                        bad(format!(
                            "input '{name}': binary_data_size {n} is more than the {} bytes \
                             of binary data left in the body",
                            binary.len()
                        ))
                    })?;
                if t.get("data").is_some() {
                    return Err(bad(format!(
                        "input '{name}': has both binary data and \"data\""
                    )));
                }
                binary.split_to(n)
            }
            None => {
                let data = t
                    .get("data")
                    .ok_or_else(|| bad(format!("input '{name}' has no \"data\"")))?;
                from_json(&name, &datatype, &shape, data)?
            }
        };
        tensors.push(InferInputTensor {
            name,
            datatype,
            shape,
            parameters: params,
            ..Default::default()
        });
        raw.push(bytes);
    }
    if !binary.is_empty() {
        return Err(bad(format!(
            "{} bytes of binary data after the JSON are claimed by no input",
            binary.len()
        )));
    }
    let mut outputs = Vec::new();
    if let Some(list) = obj.get("outputs") {
        let list = list
            .as_array()
            .ok_or_else(|| bad("\"outputs\" must be a list"))?;
        for (i, o) in list.iter().enumerate() {
            let name = o
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("outputs[{i}] needs a string \"name\"")))?;
            let b = match o.get("parameters").and_then(|p| p.get("binary_data")) {
                None => binary_default,
                Some(b) => b.as_bool().ok_or_else(|| {
                    bad(format!(
                        "output '{name}': parameters.binary_data must be true or false"
                    ))
                })?,
            };
            let params = shm_parameters("output", name, o.get("parameters"))?;
            let requested = Requested {
                name: name.to_string(),
                shm: shm_ref("output", name, &params)?,
            };
            outputs.push((requested, b));
        }
    }
    Ok(Request {
        id: obj.get("id").cloned(),
        tensors,
        raw,
        outputs,
        binary_default,
        sched,
    })
}

/// The `shared_memory_*` entries of a tensor's JSON `parameters`, as the
/// gRPC door's parameters (checked by `sysshm::shm_ref`): the region a
/// string, the byte size and offset non-negative integers.
fn shm_parameters(
    kind: &str,
    name: &str,
    params: Option<&Value>,
) -> Result<HashMap<String, InferParameter>, Status> {
    let mut out = HashMap::new();
    let Some(p) = params else {
        return Ok(out);
    };
    if let Some(v) = p.get(PARAM_REGION) {
        let region = v.as_str().ok_or_else(|| {
            bad(format!(
                "{kind} '{name}': parameters.{PARAM_REGION} must be a string"
            ))
        })?;
        out.insert(
            PARAM_REGION.to_string(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam(region.to_string())),
            },
        );
    }
    for key in [PARAM_BYTE_SIZE, PARAM_OFFSET] {
        if let Some(v) = p.get(key) {
            let n = v.as_u64().ok_or_else(|| {
                bad(format!(
                    "{kind} '{name}': parameters.{key} must be a non-negative integer"
                ))
            })?;
            out.insert(
                key.to_string(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::Uint64Param(n)),
                },
            );
        }
    }
    Ok(out)
}

/// `GET /v2/systemsharedmemory/status`: every registered region.
async fn shm_status(State(app): State<App>, headers: HeaderMap) -> Response {
    shm_status_of(&app, &headers, None)
}

/// `GET /v2/systemsharedmemory/region/{name}/status`: one region (404 if
/// unknown).
async fn shm_region_status(
    State(app): State<App>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    shm_status_of(&app, &headers, Some(&name))
}

/// The regions' status, to any caller the agent accepts (with tenants: a
/// known token, or none).
fn shm_status_of(app: &App, headers: &HeaderMap, name: Option<&str>) -> Response {
    let status = seat_of(app, headers).and_then(|_| app.door.shm.status(name));
    match status {
        Ok(regions) => {
            let list: Vec<Value> = regions
                .into_iter()
                .map(|r| {
                    json!({
                        "name": r.name,
                        "key": r.key,
                        "offset": r.offset,
                        "byte_size": r.byte_size,
                    })
                })
                .collect();
            json_response(StatusCode::OK, &Value::Array(list))
        }
        Err(s) => status_response(&s),
    }
}

/// `POST /v2/systemsharedmemory/region/{name}/register` with
/// `{"key": "/k", "offset": 0, "byte_size": n}` (offset optional).
async fn shm_register(
    State(app): State<App>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(s) = operator(&app, &headers, "register shared-memory regions") {
        return status_response(&s);
    }
    let parsed = (|| -> Result<(String, u64, u64), Status> {
        let v: Value = serde_json::from_slice(&body).map_err(|e| {
            bad(format!(
                "the register request is not valid JSON ({e}); expected {{\"key\": ..., \"offset\": ..., \"byte_size\": ...}}"
            ))
        })?;
        let key = v
            .get("key")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("the register request needs a string \"key\""))?;
        let number = |field: &str, default: Option<u64>| -> Result<u64, Status> {
            match v.get(field) {
                None => {
                    default.ok_or_else(|| bad(format!("the register request needs \"{field}\"")))
                }
                Some(n) => n
                    .as_u64()
                    .ok_or_else(|| bad(format!("\"{field}\" must be a non-negative integer"))),
            }
        };
        Ok((
            key.to_string(),
            number("offset", Some(0))?,
            number("byte_size", None)?,
        ))
    })();
    let result = parsed
        .and_then(|(key, offset, byte_size)| app.door.shm.register(&name, &key, offset, byte_size));
    match result {
        Ok(()) => StatusCode::OK.into_response(),
        Err(s) => status_response(&s),
    }
}

/// `POST /v2/systemsharedmemory/region/{name}/unregister` (an unknown
/// name is not an error, as in Triton).
async fn shm_unregister(
    State(app): State<App>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(s) = operator(&app, &headers, "unregister shared-memory regions") {
        return status_response(&s);
    }
    app.door.shm.unregister(&name);
    StatusCode::OK.into_response()
}

/// `POST /v2/systemsharedmemory/unregister`: every region.
async fn shm_unregister_all(State(app): State<App>, headers: HeaderMap) -> Response {
    if let Err(s) = operator(&app, &headers, "unregister shared-memory regions") {
        return status_response(&s);
    }
    app.door.shm.unregister_all();
    StatusCode::OK.into_response()
}

/// Flattens nested lists of JSON values into `out`.
fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>, depth: usize) -> Result<(), ()> {
    match v {
        Value::Array(items) => {
            if depth > wire::MAX_DIMS {
                return Err(());
            }
            for i in items {
                flatten(i, out, depth + 1)?;
            }
            Ok(())
        }
        other => {
            out.push(other);
            Ok(())
        }
    }
}

/// The little-endian bytes of JSON `data` for an input of `datatype` and
/// `shape`, each value checked to fit.
fn from_json(name: &str, datatype: &str, shape: &[i64], data: &Value) -> Result<Bytes, Status> {
    let Some(dtype) = dtype_from_kserve(datatype) else {
        // Let the shared checks name the datatype problem.
        return Ok(Bytes::new());
    };
    let mut values = Vec::new();
    flatten(data, &mut values, 0)
        .map_err(|()| bad(format!("input '{name}': \"data\" is nested too deeply")))?;
    let elements = shape.iter().try_fold(1u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    if let Some(n) = elements {
        if values.len() as u64 != n {
            return Err(bad(format!(
                "input '{name}': its shape {shape:?} holds {n} {datatype} elements, but \
                 \"data\" has {} values",
                values.len()
            )));
        }
    } else {
        // Bad shape: the shared checks say why.
        return Ok(Bytes::new());
    }
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    for (i, v) in values.iter().enumerate() {
        let misfit = || {
            bad(format!(
                "input '{name}': data[{i}] ({v}) does not fit {datatype}"
            ))
        };
        let int = || v.as_i64().ok_or_else(misfit);
        let uint = || v.as_u64().ok_or_else(misfit);
        let float = || v.as_f64().ok_or_else(misfit);
        match dtype {
            DType::Bool => out.push(u8::from(v.as_bool().ok_or_else(misfit)?)),
            DType::I8 => out.extend(i8::try_from(int()?).map_err(|_| misfit())?.to_le_bytes()),
            DType::I16 => out.extend(i16::try_from(int()?).map_err(|_| misfit())?.to_le_bytes()),
            DType::I32 => out.extend(i32::try_from(int()?).map_err(|_| misfit())?.to_le_bytes()),
            DType::I64 => out.extend(int()?.to_le_bytes()),
            DType::U8 => out.extend(u8::try_from(uint()?).map_err(|_| misfit())?.to_le_bytes()),
            DType::U16 => out.extend(u16::try_from(uint()?).map_err(|_| misfit())?.to_le_bytes()),
            DType::U32 => out.extend(u32::try_from(uint()?).map_err(|_| misfit())?.to_le_bytes()),
            DType::U64 => out.extend(uint()?.to_le_bytes()),
            #[allow(clippy::cast_possible_truncation)]
            DType::F32 => out.extend((float()? as f32).to_le_bytes()),
            DType::F64 => out.extend(float()?.to_le_bytes()),
            DType::F16 | DType::BF16 => {
                return Err(bad(format!(
                    "input '{name}': {datatype} is only accepted as binary data \
                     (parameters.binary_data_size)"
                )))
            }
        }
    }
    Ok(Bytes::from(out))
}

/// An output's bytes as a flat JSON list.
fn to_json(o: &Output) -> Result<Value, Status> {
    let dtype = dtype_from_kserve(o.datatype)
        .ok_or_else(|| Status::internal(format!("output '{}': unknown datatype", o.name)))?;
    let size = dtype.size();
    if size == 0 || !o.data.len().is_multiple_of(size) {
        return Err(Status::internal(format!(
            "output '{}': {} bytes is not a whole number of {} elements",
            o.name,
            o.data.len(),
            o.datatype
        )));
    }
    let vals = o.data.chunks_exact(size).map(|c| -> Value {
        let a = |n: usize| -> [u8; 8] {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&c[..n]);
            b
        };
        match dtype {
            DType::Bool => json!(c[0] != 0),
            DType::I8 => json!(i8::from_le_bytes([c[0]])),
            DType::I16 => json!(i16::from_le_bytes([c[0], c[1]])),
            DType::I32 => json!(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::I64 => json!(i64::from_le_bytes(a(8))),
            DType::U8 => json!(c[0]),
            DType::U16 => json!(u16::from_le_bytes([c[0], c[1]])),
            DType::U32 => json!(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::U64 => json!(u64::from_le_bytes(a(8))),
            DType::F32 => json!(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::F64 => json!(f64::from_le_bytes(a(8))),
            DType::F16 => json!(half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
            DType::BF16 => json!(half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        }
    });
    Ok(Value::Array(vals.collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        assert_eq!(
            parse_http_uri("http://127.0.0.1:0").expect("ok"),
            "127.0.0.1:0"
        );
        for b in ["grpc://h:1", "http://h", "http://h:1/v2"] {
            assert!(parse_http_uri(b).is_err(), "{b}");
        }
    }

    #[test]
    fn shared_memory_parameters() {
        let body = br#"{"inputs":[{"name":"a","shape":[2],"datatype":"FP32","parameters":{"shared_memory_region":"r","shared_memory_byte_size":8,"shared_memory_offset":64}},{"name":"b","shape":[1],"datatype":"UINT8","data":[7]}],"outputs":[{"name":"a","parameters":{"binary_data":false,"shared_memory_region":"o","shared_memory_byte_size":8}},{"name":"b"}]}"#;
        let r = parse_request(&Bytes::from_static(body), None).expect("ok");
        assert_eq!(r.raw.len(), 1, "raw bytes only for the input not in shm");
        assert_eq!(r.raw[0].as_ref(), &[7]);
        let at = shm_ref("input", "a", &r.tensors[0].parameters).expect("params");
        assert_eq!(
            at.map(|a| (a.region, a.offset, a.byte_size)),
            Some(("r".into(), 64, 8))
        );
        let out = r.outputs[0].0.shm.clone().expect("output a in shm");
        assert_eq!(
            (out.region.as_str(), out.offset, out.byte_size),
            ("o", 0, 8)
        );
        assert!(r.outputs[1].0.shm.is_none());
        for (b, needle) in [
            (&br#"{"inputs":[{"name":"a","shape":[1],"datatype":"UINT8","data":[1],"parameters":{"shared_memory_region":"r","shared_memory_byte_size":1}}]}"#[..], "both shared memory and data"),
            (br#"{"inputs":[{"name":"a","shape":[1],"datatype":"UINT8","parameters":{"shared_memory_region":3,"shared_memory_byte_size":1}}]}"#, "must be a string"),
            (br#"{"inputs":[{"name":"a","shape":[1],"datatype":"UINT8","parameters":{"shared_memory_region":"r","shared_memory_byte_size":-1}}]}"#, "non-negative integer"),
            (br#"{"inputs":[],"outputs":[{"name":"y","parameters":{"shared_memory_region":"r"}}]}"#, "must be given"),
            (br#"{"inputs":[],"outputs":[{"name":"y","parameters":{"shared_memory_offset":4}}]}"#, "need"),
        ] {
            let e = parse_request(&Bytes::copy_from_slice(b), None).err().expect("refused");
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains(needle), "{}", e.message());
        }
    }

    #[test]
    fn json_and_binary_inputs() {
        let body = br#"{"inputs":[{"name":"a","shape":[2,2],"datatype":"INT16","data":[[1,2],[3,-1]]},{"name":"b","shape":[2],"datatype":"BOOL","data":[true,false]},{"name":"c","shape":[1],"datatype":"FP16","parameters":{"binary_data_size":2}}]}"#;
        let mut all = body.to_vec();
        all.extend_from_slice(&[0x00, 0x3c]);
        let r = parse_request(&Bytes::from(all), Some(body.len())).expect("ok");
        assert_eq!(r.raw[0].as_ref(), &[1, 0, 2, 0, 3, 0, 0xff, 0xff]);
        assert_eq!(r.raw[1].as_ref(), &[1, 0]);
        assert_eq!(r.raw[2].as_ref(), &[0x00, 0x3c]);
        for (b, needle) in [
            (&br#"{"inputs":[{"name":"a","shape":[3],"datatype":"INT8","data":[1,2]}]}"#[..], "has 2 values"),
            (br#"{"inputs":[{"name":"a","shape":[1],"datatype":"UINT8","data":[300]}]}"#, "does not fit"),
            (br#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP16","data":[1.0]}]}"#, "binary data"),
            (br#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}}]}"#, "more than"),
            (br#"{"inputs":"#, "not valid JSON"),
        ] {
            let e = parse_request(&Bytes::copy_from_slice(b), None).err().expect("refused");
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains(needle), "{}", e.message());
        }
    }
}
