//! The agent's standard front doors: protocols other people's clients
//! already speak, served over the same `server::dispatch::AgentCore` as
//! tensorwire's own wire protocol.
//!
//! Today that is the KServe v2 ("Open Inference Protocol") gRPC service,
//! the one Triton serves, and its HTTP/REST twin ([`HttpFrontend`]: JSON
//! tensors and the binary tensor data extension), so `tritonclient.grpc`,
//! `tritonclient.http` and any other stock KServe v2 client work unmodified
//! against `tensorwire serve --listen grpc://HOST:PORT` or `--listen
//! http://HOST:PORT` (or those URIs in the config file's `listen` list, or
//! in the Python `tensorwire.Agent(listen=[...])`). A call is not a second engine: both front doors turn
//! each inference into a tensorwire request (header + descriptor
//! section over the request's own tensor bytes) and runs it through
//! `AgentCore::prepare` and `AgentCore::execute`, so it meets the same
//! registry, limits, payload budget, per-model queue, counters and
//! shutdown as a request that came over `unix://` or `shm://`.
//!
//! Either door also listens over TLS: `grpcs://HOST:PORT` and
//! `https://HOST:PORT` are the same doors over the agent's rustls
//! configuration (`serve --tls-cert FILE --tls-key FILE [--tls-client-ca
//! FILE]`; `tls`), so they may listen beyond loopback without `insecure`.
//!
//! Both also serve Triton's system shared-memory extension (`sysshm`):
//! clients register POSIX shared-memory regions, then send inputs and
//! receive outputs through them instead of the socket; one registry serves
//! both doors.
//!
//! With a tenants file (`serve --tenants FILE`), every call is seated
//! among the agent's tenants by its bearer token (`access`): its tenant's
//! rights decide which models it may list, look up and call.
//!
//! Modules: [`proto`] (the messages and the tonic service and client,
//! generated at build time from `proto/grpc_service.proto` by `protox` and
//! `tonic-prost-build`, no `protoc` needed; the bench peer in
//! `crates/peer-grpc` uses these same types), [`datatype`] (KServe datatype
//! names), `inputs` (a request's tensors checked and gathered),
//! `service` (the `GRPCInferenceService` over the core and the
//! `infer_over_core` path both front doors share), `sysshm` (the
//! registered shared-memory regions and their use by requests), `http`
//! (the REST routes over that same path), `door` (the state the doors
//! share), `server` (the listeners and their tokio runtime), `tls` (the
//! TLS doors' handshakes, off the accept loop),
//! `doors` ([`FrontDoors`]: every door of one agent, the repository and
//! the metrics listener started and stopped as one, in the order
//! `tensorwire serve` and the Python `Agent` share; [`split_listen`] sorts
//! a `listen` list into the agent's endpoints and the doors),
//! `statistics` (Triton's statistics extension, over both doors),
//! `metrics` (Prometheus `/metrics` on every HTTP front door and on the
//! metrics-only [`MetricsListener`]), [`model_config`] (Triton's
//! `config.pbtxt`) and [`repository`] (the model repository and its
//! load/unload control).
//!
//! # Examples
//!
//! An embedded agent with a KServe v2 HTTP door, asked for its health and
//! a model's metadata over plain HTTP/1.1, then stopped in order:
//!
//! ```
//! use frontend::{DoorsConfig, FrontDoors};
//! use std::io::{Read, Write};
//! use std::time::Duration;
//! let agent = server::Agent::start(server::AgentConfig::default())?;
//! let doors = FrontDoors::start(
//!     agent.core().clone(),
//!     DoorsConfig { http: vec!["http://127.0.0.1:0".into()], ..DoorsConfig::default() },
//! )?;
//! let uri = doors.uris()[0].to_string(); // http://127.0.0.1:PORT
//! let get = |path: &str| -> std::io::Result<String> {
//!     let mut s = std::net::TcpStream::connect(uri.trim_start_matches("http://"))?;
//!     write!(s, "GET {path} HTTP/1.1\r\nHost: doc\r\nConnection: close\r\n\r\n")?;
//!     let mut answer = String::new();
//!     s.read_to_string(&mut answer)?;
//!     Ok(answer)
//! };
//! assert!(get("/v2/health/ready")?.starts_with("HTTP/1.1 200"));
//! assert!(get("/v2/models/identity")?.contains(r#""name":"identity""#));
//! assert_eq!(doors.shutdown_with(agent, Duration::from_secs(5)), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod accept;
mod access;
pub mod datatype;
mod door;
mod doors;
mod h2_heads;
mod http;
mod inputs;
mod metrics;
pub mod model_config;
mod model_control;
pub mod repository;
mod serve_http;
mod server;
mod service;
mod statistics;
mod sysshm;
#[cfg(test)]
mod test_support;
mod tls;

pub use datatype::{dtype_from_kserve, kserve_datatype};
pub use door::FrontDoor;
pub use doors::{split_listen, DoorsConfig, FrontDoors, SplitListen};
pub use http::{parse_http_uri, HttpFrontend, HTTP_SCHEME};
pub use metrics::{parse_metrics_uri, Metrics, MetricsListener};
pub use repository::{ControlMode, Repository, RepositoryError, RepositoryOptions};
pub use server::{parse_grpc_uri, FrontendError, GrpcFrontend};
pub use service::KServeService;
pub use tls::{GRPCS_SCHEME, HTTPS_SCHEME};

/// The KServe v2 protocol types and the tonic service and client, generated
/// from `proto/grpc_service.proto` (protobuf package `inference`).
pub mod proto {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("inference");
}

/// The largest gRPC message the front door could ever accept or send:
/// 2 GiB - 1, protobuf's own limit. The limit actually applied to requests
/// is the agent's `max_payload` plus room for the message's other fields
/// ([`GrpcFrontend::start`]).
pub const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

/// The URI scheme of the gRPC front door.
pub const GRPC_SCHEME: &str = "grpc://";
