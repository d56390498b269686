//! What a bench row measures: a [`TargetSpec`] (framework × transport),
//! started for one workload as a [`RunningTarget`] that hands out
//! [`Caller`]s, and stopped afterwards.
//!
//! - `tensorwire` over `inproc` (the agent embedded in this process), `shm`,
//!   `unix`, `tcp`, `tcp?nodelay=0` (a `tensorwire serve` child process), or
//!   an agent already running (`--connect URI`);
//! - `local`: the engine called directly in this process, no agent, no
//!   transport — the in-process baseline the RPC tax is measured against;
//! - `raw`: the floor, a bare socket or shared-page ping-pong with no
//!   framework (one client; measured by [`crate::raw`] / [`crate::raw_shm`]);
//!   `raw-spin`: the same socket floor with both ends polling before they
//!   block, as tensorwire's socket reads do (the shared-page floor always
//!   polls);
//! - `tensorwire` over its KServe v2 front doors, `grpc` and `http` (a
//!   `tensorwire serve` child with `--listen grpc://…` or `http://…`, on
//!   TCP loopback), called by the same tonic client as the gRPC peer or by
//!   a hyper HTTP/1.1 client with the binary tensor data extension
//!   ([`crate::kserve_http`]);
//! - `tensorwire` through the gateway, `gateway`: a `tensorwire serve`
//!   child on `shm://` and a `tensorwire gateway` child relaying a tcp
//!   loopback listener to it; the client connects to the gateway over tcp
//!   (compare with `tcp`, the same client straight to an agent);
//! - `grpc`, `ttrpc`: the peers, a `tensorwire peer-serve` child process
//!   serving the *same* engine and model over tonic (KServe v2 `ModelInfer`)
//!   or ttrpc, so only the RPC path differs.
//!
//! Every child process is stopped when its target is dropped; nothing
//! outlives a run.

use crate::caller::{BenchError, Caller, CallerFactory, Stage, StageSample, StageSampler};
use crate::placement::{pin_process, Placement};
use crate::workload::{Input, Workload};
use classifier::agents::{AgentProcess, AgentSpec, RunningAgent, Transport};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use transport::mover::MoverChoice;

/// How long each end of the `raw-spin` floor polls before it blocks: the
/// client's default budget (`client::ClientOptions::spin`).
pub const RAW_SPIN: Duration = transport::shm::WaitPolicy::CLIENT.spin;

/// The framework a target runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Framework {
    /// tensorwire's agent and client.
    Tensorwire,
    /// The engine called directly (no transport).
    Local,
    /// A bare socket / shared page with no framework: the floor.
    Raw,
    /// A bare socket whose ends poll ([`RAW_SPIN`]) before they block.
    RawSpin,
    /// tonic gRPC, KServe v2 `ModelInfer`.
    Grpc,
    /// ttrpc-rust.
    Ttrpc,
}

impl Framework {
    /// Its name in results.
    pub const fn name(self) -> &'static str {
        match self {
            Framework::Tensorwire => "tensorwire",
            Framework::Local => "local",
            Framework::Raw => "raw",
            Framework::RawSpin => "raw-spin",
            Framework::Grpc => "grpc",
            Framework::Ttrpc => "ttrpc",
        }
    }

    /// True for the floors (`raw`, `raw-spin`), measured by their own loop.
    pub const fn is_floor(self) -> bool {
        matches!(self, Framework::Raw | Framework::RawSpin)
    }

    /// Parses a `--peers` entry.
    pub fn parse_peer(s: &str) -> Result<Framework, BenchError> {
        match s.trim() {
            "raw" => Ok(Framework::Raw),
            "raw-spin" => Ok(Framework::RawSpin),
            "grpc" => Ok(Framework::Grpc),
            "ttrpc" => Ok(Framework::Ttrpc),
            other => Err(BenchError::new(format!(
                "--peers: unknown peer '{other}' (available: raw, raw-spin, grpc, ttrpc)"
            ))),
        }
    }
}

/// The transport a target uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Net {
    /// No transport (the engine in this process).
    None,
    /// The agent embedded in this process (`inproc://`).
    Inproc,
    /// Shared memory (`shm://`).
    Shm,
    /// A Unix socket.
    Unix,
    /// TCP loopback; `nodelay: false` = Nagle on both ends.
    Tcp {
        /// `TCP_NODELAY`.
        nodelay: bool,
    },
    /// The agent's KServe v2 gRPC front door (`grpc://`, TCP loopback).
    Grpc,
    /// The agent's KServe v2 HTTP/REST front door (`http://`, TCP
    /// loopback), binary tensor data extension.
    Http,
    /// Through a `tensorwire gateway`: client → tcp loopback → gateway →
    /// `shm://` → agent.
    Gateway,
}

impl Net {
    /// Its name in results.
    pub const fn name(self) -> &'static str {
        match self {
            Net::None => "none",
            Net::Inproc => "inproc",
            Net::Shm => "shm",
            Net::Unix => "unix",
            Net::Tcp { nodelay: true } => "tcp",
            Net::Tcp { nodelay: false } => "tcp?nodelay=0",
            Net::Grpc => "grpc",
            Net::Http => "http",
            Net::Gateway => "gateway",
        }
    }

    /// Whether this is one of the agent's KServe front doors.
    pub const fn is_front_door(self) -> bool {
        matches!(self, Net::Grpc | Net::Http)
    }
}

/// One thing to measure.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TargetSpec {
    /// The framework.
    pub framework: Framework,
    /// The transport.
    pub net: Net,
    /// An already running tensorwire agent to measure instead of starting
    /// one (`--connect URI`).
    pub connect: Option<String>,
    /// Start the agent with these dynamic batching settings on its model,
    /// and with an HTTP door whose statistics give the mean batch
    /// ([`crate::batching`]); `None`: a plain agent. Native transports
    /// (`shm`, `unix`, `tcp`) and model workloads only.
    pub batching: Option<crate::batching::BatchConfig>,
}

impl TargetSpec {
    /// A target started by the bench.
    pub fn new(framework: Framework, net: Net) -> TargetSpec {
        TargetSpec {
            framework,
            net,
            connect: None,
            batching: None,
        }
    }

    /// tensorwire on `net` with its model's batching set to `batching`.
    pub fn batching(net: Net, batching: crate::batching::BatchConfig) -> TargetSpec {
        TargetSpec {
            batching: Some(batching),
            ..TargetSpec::new(Framework::Tensorwire, net)
        }
    }

    /// Its name in tables: `tensorwire shm`, `raw unix`, `grpc tcp`,
    /// `in-process`, `tensorwire @ URI`, `tensorwire shm batching=on`.
    pub fn label(&self) -> String {
        let base = match (&self.connect, self.framework) {
            (Some(uri), _) => format!("tensorwire @ {uri}"),
            (None, Framework::Local) => "in-process".to_string(),
            (None, f) => format!("{} {}", f.name(), self.net.name()),
        };
        match &self.batching {
            Some(b) => format!("{base} batching={}", b.name()),
            None => base,
        }
    }

    /// Whether the target is a baseline rather than tensorwire.
    pub fn is_peer(&self) -> bool {
        !matches!(self.framework, Framework::Tensorwire | Framework::Local)
    }
}

/// Parses a `--transports` list: `local`, `inproc`, `shm`, `unix`, `tcp`,
/// `tcp?nodelay=0`, and the front doors `grpc`, `http` (repeats and unknown
/// names are errors).
pub fn parse_transports(list: &str) -> Result<Vec<Net>, BenchError> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim) {
        let net = match item {
            "local" | "none" => Net::None,
            "inproc" | "inproc://" => Net::Inproc,
            "shm" | "shm://" => Net::Shm,
            "unix" | "unix://" => Net::Unix,
            "tcp" | "tcp://" | "tcp?nodelay=1" => Net::Tcp { nodelay: true },
            "tcp?nodelay=0" => Net::Tcp { nodelay: false },
            "grpc" | "grpc://" => Net::Grpc,
            "http" | "http://" => Net::Http,
            "gateway" => Net::Gateway,
            other => {
                return Err(BenchError::new(format!(
                    "--transports: unknown transport '{other}' \
                     (available: local, inproc, shm, unix, tcp, tcp?nodelay=0, grpc, http, \
                     gateway)"
                )))
            }
        };
        if out.contains(&net) {
            return Err(BenchError::new(format!(
                "--transports lists {} twice",
                net.name()
            )));
        }
        out.push(net);
    }
    Ok(out)
}

/// The targets for `transports` × (tensorwire + `peers`): tensorwire (or the
/// local baseline for `local`) on every transport, and each peer on the
/// transports it has (raw: unix, tcp, tcp?nodelay=0, shm; raw-spin, grpc
/// and ttrpc: unix, tcp, tcp?nodelay=0). The grpc peer also comes with the
/// `grpc` front door, over tcp, as the door's baseline.
pub fn targets(transports: &[Net], peers: &[Framework]) -> Vec<TargetSpec> {
    let mut out = Vec::new();
    for &net in transports {
        let fw = if net == Net::None {
            Framework::Local
        } else {
            Framework::Tensorwire
        };
        out.push(TargetSpec::new(fw, net));
        for &p in peers {
            let has = match p {
                Framework::Raw => matches!(net, Net::Unix | Net::Tcp { .. } | Net::Shm),
                Framework::RawSpin | Framework::Grpc | Framework::Ttrpc => {
                    matches!(net, Net::Unix | Net::Tcp { .. })
                }
                Framework::Tensorwire | Framework::Local => false,
            };
            if has {
                out.push(TargetSpec::new(p, net));
            }
            // The gRPC door's own comparison: the tonic peer over TCP, the
            // same stack, even when tcp is not among the transports.
            let tcp = Net::Tcp { nodelay: true };
            if net == Net::Grpc && p == Framework::Grpc && !transports.contains(&tcp) {
                out.push(TargetSpec::new(p, tcp));
            }
        }
    }
    out
}

/// What starting a target needs besides the spec and the workload.
#[derive(Clone, Debug)]
pub struct BenchEnv {
    /// The `tensorwire` binary: runs `serve` for child agents, `peer-serve`
    /// for the peers, and `raw-echo` for the floors.
    pub exe: PathBuf,
    /// ONNX Runtime intra-op threads, for every engine in the run.
    pub intra_threads: usize,
    /// Ask tensorwire agents for every request's timeline (stage
    /// breakdown).
    pub stages: bool,
    /// Pin client threads and server processes ([`Placement`]), or leave
    /// them to the scheduler.
    pub placement: Option<Placement>,
    /// How long tensorwire's clients and the agents the bench starts poll
    /// before they block (`None` = their defaults; zero = block at once).
    pub spin: Option<Duration>,
    /// `--mover`: over shm, inputs are sent from the heap and moved into
    /// the arena with this mover (the URI's `?mover=`) instead of being
    /// allocated in the arena (zero copy, the default); `zero` keeps that.
    pub mover: Option<transport::mover::MoverChoice>,
}

/// A server process a target runs, or none.
enum Server {
    None,
    /// An agent on a native transport.
    Agent(RunningAgent),
    /// A child process printing `listening on URI`: a peer, or an agent
    /// behind a front door.
    Child(AgentProcess),
    /// A `tensorwire gateway` child and the agent it relays to.
    Gateway {
        /// The gateway.
        gateway: AgentProcess,
        /// The agent behind it.
        agent: RunningAgent,
    },
}

/// A started target.
pub struct RunningTarget {
    /// What it is.
    pub spec: TargetSpec,
    /// Makes a caller (a connection) per client; `None` for the raw floor,
    /// which is measured by its own loop ([`crate::raw`]).
    pub factory: Option<Arc<CallerFactory>>,
    /// Request bytes of the workload (the raw floor moves as many).
    pub tensor_bytes: u64,
    /// The agent's KServe HTTP door (`http://127.0.0.1:PORT`), where its
    /// statistics are read; only for targets with
    /// [`TargetSpec::batching`].
    pub stats_uri: Option<String>,
    server: Server,
}

impl std::fmt::Debug for RunningTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunningTarget({})", self.spec.label())
    }
}

impl RunningTarget {
    /// The process id of the separate server process, if there is one.
    pub fn server_pid(&self) -> Option<u32> {
        match &self.server {
            Server::None => None,
            Server::Agent(a) => a.pid(),
            Server::Child(p) => Some(p.pid()),
            Server::Gateway { gateway, .. } => Some(gateway.pid()),
        }
    }

    /// Every separate server process: the gateway target's gateway and
    /// agent, else [`server_pid`](Self::server_pid)'s one (CPU per request
    /// counts them all; placement pins them all to the server CPU).
    pub fn server_pids(&self) -> Vec<u32> {
        match &self.server {
            Server::Gateway { gateway, agent } => {
                std::iter::once(gateway.pid()).chain(agent.pid()).collect()
            }
            _ => self.server_pid().into_iter().collect(),
        }
    }

    /// Stops the server (SIGTERM and wait, for child processes).
    pub fn stop(self) -> Result<(), BenchError> {
        match self.server {
            Server::None => Ok(()),
            Server::Agent(a) => a.stop().map_err(|e| BenchError::new(e.to_string())),
            Server::Child(p) => p
                .stop(classifier::agents::STOP_TIMEOUT)
                .map_err(|e| BenchError::new(e.to_string())),
            Server::Gateway { gateway, agent } => {
                let g = gateway
                    .stop(classifier::agents::STOP_TIMEOUT)
                    .map_err(|e| BenchError::new(e.to_string()));
                agent
                    .stop()
                    .map_err(|e| BenchError::new(e.to_string()))
                    .and(g)
            }
        }
    }
}

/// Starts `spec` serving `workload` (its server process pinned to
/// `env.placement`'s server CPU, if any).
pub fn start(
    spec: &TargetSpec,
    workload: &Workload,
    env: &BenchEnv,
) -> Result<RunningTarget, BenchError> {
    let t = start_unpinned(spec, workload, env)?;
    if let Some(p) = env.placement {
        for pid in t.server_pids() {
            if let Err(e) = pin_process(pid, p.server_cpu) {
                let _ = t.stop();
                return Err(e);
            }
        }
    }
    Ok(t)
}

fn start_unpinned(
    spec: &TargetSpec,
    workload: &Workload,
    env: &BenchEnv,
) -> Result<RunningTarget, BenchError> {
    let label = spec.label();
    let err = |e: String| BenchError::new(format!("{label}: {e}"));
    let bytes_of = |sig: &wire::ModelSignature| -> Result<u64, BenchError> {
        Ok(crate::workload::tensor_bytes(&workload.inputs(sig)?))
    };
    match spec.framework {
        Framework::Local => {
            let backend = workload
                .load_backend(env.intra_threads)
                .map_err(|e| err(e.0))?;
            let tensor_bytes = bytes_of(backend.signature())?;
            let w = workload.clone();
            let factory: Arc<CallerFactory> = Arc::new(move || {
                let inputs = w.inputs(backend.signature())?;
                Ok(Box::new(LocalCaller {
                    backend: backend.clone(),
                    inputs,
                }) as Box<dyn Caller>)
            });
            Ok(RunningTarget {
                spec: spec.clone(),
                factory: Some(factory),
                tensor_bytes,
                stats_uri: None,
                server: Server::None,
            })
        }
        Framework::Raw | Framework::RawSpin => {
            let backend = workload
                .load_backend(env.intra_threads)
                .map_err(|e| err(e.0))?;
            Ok(RunningTarget {
                spec: spec.clone(),
                factory: None,
                tensor_bytes: bytes_of(backend.signature())?,
                stats_uri: None,
                server: Server::None,
            })
        }
        Framework::Tensorwire => start_tensorwire(spec, workload, env).map_err(|e| err(e.0)),
        Framework::Grpc | Framework::Ttrpc => start_peer(spec, workload, env).map_err(|e| err(e.0)),
    }
}

fn agent_spec(workload: &Workload, env: &BenchEnv) -> AgentSpec {
    AgentSpec {
        model_name: workload.model_name().to_string(),
        model_path: workload.model_path().map(PathBuf::from).unwrap_or_default(),
        intra_threads: env.intra_threads,
        intra_spinning: engine::DEFAULT_INTRA_SPINNING,
        serve_exe: env.exe.clone(),
        spin_us: env.spin.map(|d| d.as_micros() as u64),
    }
}

fn start_tensorwire(
    spec: &TargetSpec,
    workload: &Workload,
    env: &BenchEnv,
) -> Result<RunningTarget, BenchError> {
    if spec.net.is_front_door() || spec.connect.as_deref().is_some_and(is_front_door_uri) {
        return start_front_door(spec, workload, env);
    }
    let mut stats_uri = None;
    let (uri, server) = match (&spec.connect, &spec.batching) {
        (Some(uri), _) => (uri.clone(), Server::None),
        (None, Some(batching)) => {
            let (proc, stats) = start_batching_agent(spec, *batching, workload, env)?;
            stats_uri = Some(stats);
            (proc.uri().to_string(), Server::Child(proc))
        }
        (None, None) if spec.net == Net::Gateway => {
            let agent = start_native_agent(spec, Transport::Shm, workload, env)?;
            let gateway = start_gateway(spec, agent.uri(), env)?;
            (
                gateway.uri().to_string(),
                Server::Gateway { gateway, agent },
            )
        }
        (None, None) => {
            let transport = match spec.net {
                Net::Inproc => Transport::Inproc,
                Net::Shm => Transport::Shm,
                Net::Unix => Transport::Unix,
                Net::Tcp { nodelay } => Transport::Tcp { nodelay },
                Net::None | Net::Grpc | Net::Http | Net::Gateway => {
                    return Err(BenchError::new("tensorwire needs a native transport here"))
                }
            };
            let agent = start_native_agent(spec, transport, workload, env)?;
            (agent.uri().to_string(), Server::Agent(agent))
        }
    };
    let mut opts = client::ClientOptions::default();
    if let Some(spin) = env.spin {
        opts.spin = spin;
    }
    let stages = env.stages;
    let moved = env
        .mover
        .filter(|m| *m != MoverChoice::Fixed(transport::mover::Mover::Zero))
        .filter(|_| uri.starts_with("shm://"));
    let uri = match moved {
        Some(m) => format!("{uri}?mover={m}"),
        None => uri,
    };
    let heap = moved.is_some();
    // Probe once so a wrong URI or model fails here, not in every client.
    let probe = TensorwireCaller::connect(&uri, workload, opts.clone(), stages, heap)?;
    let tensor_bytes = crate::workload::tensor_bytes(&probe.inputs);
    drop(probe);
    let w = workload.clone();
    let factory: Arc<CallerFactory> = Arc::new(move || {
        Ok(Box::new(TensorwireCaller::connect(
            &uri,
            &w,
            opts.clone(),
            stages,
            heap,
        )?) as Box<dyn Caller>)
    });
    Ok(RunningTarget {
        spec: spec.clone(),
        factory: Some(factory),
        tensor_bytes,
        stats_uri,
        server,
    })
}

/// An agent on `transport` serving the workload's model (none to load for
/// the identity model).
fn start_native_agent(
    spec: &TargetSpec,
    transport: Transport,
    workload: &Workload,
    env: &BenchEnv,
) -> Result<RunningAgent, BenchError> {
    match workload {
        // The identity model is always served: no model to load.
        Workload::Identity { .. } => start_identity_agent(&spec.label(), transport, env),
        Workload::Model { .. } => {
            RunningAgent::start(&spec.label(), transport, &agent_spec(workload, env))
                .map_err(|e| BenchError::new(e.to_string()))
        }
    }
}

/// A `tensorwire gateway` child listening on a tcp loopback port and
/// relaying to `upstream` (its polling budgets set like the agents' when
/// `--spin-us` is given).
fn start_gateway(
    spec: &TargetSpec,
    upstream: &str,
    env: &BenchEnv,
) -> Result<AgentProcess, BenchError> {
    let dir = tempfile::Builder::new()
        .prefix("tw-gateway-")
        .tempdir()
        .map_err(|e| BenchError::new(format!("temporary directory: {e}")))?;
    let mut args: Vec<OsString> = vec![
        "gateway".into(),
        "--listen".into(),
        "tcp://127.0.0.1:0".into(),
        "--upstream".into(),
        upstream.into(),
    ];
    if let Some(spin) = env.spin {
        for flag in ["--spin-us", "--upstream-spin-us"] {
            args.push(flag.into());
            args.push(spin.as_micros().to_string().into());
        }
    }
    AgentProcess::spawn(
        &format!("{} (gateway)", spec.label()),
        &env.exe,
        &args,
        dir,
        classifier::agents::START_TIMEOUT,
    )
    .map_err(|e| BenchError::new(e.to_string()))
}

/// A `tensorwire serve` child for a batching target: the native `--listen`
/// of `spec.net`, an HTTP door on a free loopback port for its statistics,
/// and `--model NAME=PATH[;max_batch=..;max_queue_delay_us=..]`. Returns
/// the process (its URI is the native one: the agent prints its endpoints
/// before its doors) and the door's `http://127.0.0.1:PORT`.
fn start_batching_agent(
    spec: &TargetSpec,
    batching: crate::batching::BatchConfig,
    workload: &Workload,
    env: &BenchEnv,
) -> Result<(AgentProcess, String), BenchError> {
    let transport = match spec.net {
        Net::Shm => Transport::Shm,
        Net::Unix => Transport::Unix,
        Net::Tcp { nodelay } => Transport::Tcp { nodelay },
        other => {
            return Err(BenchError::new(format!(
                "batching targets run a child agent on shm, unix or tcp, not {}",
                other.name()
            )))
        }
    };
    let Some(path) = workload.model_path() else {
        return Err(BenchError::new(
            "batching targets need an ONNX model (the identity model has no settings)",
        ));
    };
    let dir = tempfile::Builder::new()
        .prefix("tw-batch-")
        .tempdir()
        .map_err(|e| BenchError::new(format!("temporary directory: {e}")))?;
    // A free port, chosen here (the agent prints the door's URI after the
    // native one, which is the only line the child's start reads).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| BenchError::new(format!("a free loopback port: {e}")))?
        .port();
    let stats_uri = format!("http://127.0.0.1:{port}");
    let mut args: Vec<OsString> = vec![
        "serve".into(),
        "--listen".into(),
        listen_uri(transport, &dir).into(),
        "--listen".into(),
        stats_uri.clone().into(),
        "--intra-threads".into(),
        env.intra_threads.to_string().into(),
        "--model".into(),
        batching.model_arg(workload.model_name(), path),
    ];
    if let Some(spin) = env.spin {
        for flag in ["--socket-spin-us", "--shm-spin-us"] {
            args.push(flag.into());
            args.push(spin.as_micros().to_string().into());
        }
    }
    let proc = AgentProcess::spawn(
        &spec.label(),
        &env.exe,
        &args,
        dir,
        classifier::agents::START_TIMEOUT,
    )
    .map_err(|e| BenchError::new(e.to_string()))?;
    Ok((proc, stats_uri))
}

/// An agent serving only the built-in identity model.
fn start_identity_agent(
    label: &str,
    transport: Transport,
    env: &BenchEnv,
) -> Result<RunningAgent, BenchError> {
    match transport {
        Transport::Inproc => {
            let name = format!("bench-{}-{}", std::process::id(), next_seq());
            let cfg = server::AgentConfig {
                listen: vec![transport::Endpoint::Inproc(name.clone())],
                ..server::AgentConfig::default()
            };
            let agent =
                server::Agent::start(cfg).map_err(|e| BenchError::new(format!("{label}: {e}")))?;
            Ok(RunningAgent::Embedded {
                agent: Some(agent),
                uri: format!("inproc://{name}"),
            })
        }
        _ => {
            let dir = tempfile::Builder::new()
                .prefix("tw-bench-")
                .tempdir()
                .map_err(|e| BenchError::new(format!("temporary directory: {e}")))?;
            let listen = listen_uri(transport, &dir);
            let args: Vec<OsString> = vec!["serve".into(), "--listen".into(), listen.into()];
            let p = AgentProcess::spawn(
                label,
                &env.exe,
                &args,
                dir,
                classifier::agents::START_TIMEOUT,
            )
            .map_err(|e| BenchError::new(e.to_string()))?;
            Ok(RunningAgent::Process(p))
        }
    }
}

fn next_seq() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// Where a child server listens for `transport`.
fn listen_uri(transport: Transport, dir: &tempfile::TempDir) -> String {
    match transport {
        Transport::Unix => format!("unix://{}", dir.path().join("server.sock").display()),
        Transport::Shm => format!("shm://bench-{}-{}", std::process::id(), next_seq()),
        Transport::Tcp { nodelay: true } => "tcp://127.0.0.1:0".to_string(),
        Transport::Tcp { nodelay: false } => "tcp://127.0.0.1:0?nodelay=0".to_string(),
        Transport::Inproc => format!("inproc://bench-{}", next_seq()),
    }
}

fn start_peer(
    spec: &TargetSpec,
    workload: &Workload,
    env: &BenchEnv,
) -> Result<RunningTarget, BenchError> {
    let transport = match spec.net {
        Net::Unix => Transport::Unix,
        Net::Tcp { nodelay } => Transport::Tcp { nodelay },
        other => {
            return Err(BenchError::new(format!(
                "{} has no {} transport",
                spec.framework.name(),
                other.name()
            )))
        }
    };
    let dir = tempfile::Builder::new()
        .prefix("tw-peer-")
        .tempdir()
        .map_err(|e| BenchError::new(format!("temporary directory: {e}")))?;
    let args: Vec<OsString> = vec![
        "peer-serve".into(),
        "--peer".into(),
        spec.framework.name().into(),
        "--listen".into(),
        listen_uri(transport, &dir).into(),
        "--intra-threads".into(),
        env.intra_threads.to_string().into(),
    ];
    let proc = spawn_child(spec, env, args, workload, dir)?;
    let uri = proc.uri().to_string();
    let rpc = match spec.framework {
        Framework::Grpc => Rpc::Grpc,
        _ => Rpc::Ttrpc,
    };
    kserve_target(spec, workload, uri, rpc, Server::Child(proc))
}

/// Whether `uri` names one of the agent's front doors (`grpc://`,
/// `http://`), which the native client cannot call.
fn is_front_door_uri(uri: &str) -> bool {
    uri.starts_with("grpc://") || uri.starts_with("http://")
}

/// tensorwire behind a KServe front door: a `tensorwire serve --listen
/// grpc://127.0.0.1:0` (or `http://`) child, or the door at `--connect`.
fn start_front_door(
    spec: &TargetSpec,
    workload: &Workload,
    env: &BenchEnv,
) -> Result<RunningTarget, BenchError> {
    let (uri, server) = match &spec.connect {
        Some(uri) => (uri.clone(), Server::None),
        None => {
            let scheme = spec.net.name();
            let dir = tempfile::Builder::new()
                .prefix("tw-door-")
                .tempdir()
                .map_err(|e| BenchError::new(format!("temporary directory: {e}")))?;
            let args: Vec<OsString> = vec![
                "serve".into(),
                "--listen".into(),
                format!("{scheme}://127.0.0.1:0").into(),
                "--intra-threads".into(),
                env.intra_threads.to_string().into(),
            ];
            let proc = spawn_child(spec, env, args, workload, dir)?;
            (proc.uri().to_string(), Server::Child(proc))
        }
    };
    let rpc = if uri.starts_with("http://") {
        Rpc::Http
    } else {
        Rpc::Grpc
    };
    // The tonic client dials tcp:// addresses; the door prints grpc://.
    let uri = match uri.strip_prefix("grpc://") {
        Some(addr) => format!("tcp://{addr}"),
        None => uri,
    };
    kserve_target(spec, workload, uri, rpc, server)
}

/// Runs `env.exe ARGS --model NAME=PATH` (the model for a model workload)
/// in `dir` and waits for its `listening on URI` line.
fn spawn_child(
    spec: &TargetSpec,
    env: &BenchEnv,
    mut args: Vec<OsString>,
    workload: &Workload,
    dir: tempfile::TempDir,
) -> Result<AgentProcess, BenchError> {
    args.extend(model_args(workload));
    AgentProcess::spawn(
        &spec.label(),
        &env.exe,
        &args,
        dir,
        classifier::agents::START_TIMEOUT,
    )
    .map_err(|e| BenchError::new(e.to_string()))
}

/// `--model NAME=PATH` for a model workload (the identity model is always
/// served).
fn model_args(workload: &Workload) -> Vec<OsString> {
    match workload.model_path() {
        Some(path) => {
            let mut m = OsString::from(format!("{}=", workload.model_name()));
            m.push(path.as_os_str());
            vec!["--model".into(), m]
        }
        None => Vec::new(),
    }
}

/// The RPC stack a [`kserve_target`] calls through.
#[derive(Clone, Copy)]
enum Rpc {
    /// KServe v2 over tonic gRPC.
    Grpc,
    /// KServe v2 over HTTP/1.1, binary tensor data.
    Http,
    /// ttrpc.
    Ttrpc,
}

/// A target called through an RPC stack other than tensorwire's own
/// client, at `uri`: the request is shaped by the model's signature, read
/// here from the same file the server loaded (the identity model takes
/// anything).
fn kserve_target(
    spec: &TargetSpec,
    workload: &Workload,
    uri: String,
    rpc: Rpc,
    server: Server,
) -> Result<RunningTarget, BenchError> {
    let sig = match workload {
        Workload::Identity { .. } => {
            engine::Backend::signature(&engine::IdentityBackend::new()).clone()
        }
        Workload::Model { .. } => workload.load_backend(1)?.signature().clone(),
    };
    let inputs = workload.inputs(&sig)?;
    let tensor_bytes = crate::workload::tensor_bytes(&inputs);
    // Identity answers with its inputs; a model's outputs are not checked
    // by size here.
    let expect_output = matches!(workload, Workload::Identity { .. }).then_some(tensor_bytes);
    let names: Vec<String> = match workload {
        Workload::Identity { .. } => (0..inputs.len()).map(|i| format!("input{i}")).collect(),
        Workload::Model { .. } => sig.inputs.iter().map(|t| t.name.clone()).collect(),
    };
    let model = workload.model_name().to_string();
    let inputs = Arc::new(inputs);
    let make = move || -> Result<Box<dyn Caller>, BenchError> {
        let views = views(&inputs);
        Ok(match rpc {
            Rpc::Grpc => {
                let client = peer_grpc::Client::connect(&uri)
                    .map_err(|e| BenchError::new(format!("grpc {uri}: {e}")))?;
                let req = client.prepare_named(&model, &names, &views);
                Box::new(GrpcCaller { client, req })
            }
            Rpc::Http => Box::new(HttpCaller(crate::kserve_http::HttpClient::connect(
                &uri,
                &model,
                &names,
                &inputs,
                expect_output,
            )?)),
            Rpc::Ttrpc => {
                let client = peer_ttrpc::Client::connect(&uri)
                    .map_err(|e| BenchError::new(format!("ttrpc {uri}: {e}")))?;
                let req = client.prepare(&model, &views);
                Box::new(TtrpcCaller { client, req })
            }
        })
    };
    // Probe once so a wrong address or model fails here, not in every
    // client.
    let mut probe = make()?;
    probe
        .call()
        .map_err(|e| BenchError::new(format!("{}: {e}", spec.label())))?;
    drop(probe);
    Ok(RunningTarget {
        spec: spec.clone(),
        factory: Some(Arc::new(make)),
        tensor_bytes,
        stats_uri: None,
        server,
    })
}

fn views(inputs: &[Input]) -> Vec<engine::TensorView<'_>> {
    inputs
        .iter()
        .map(|(d, s, b)| engine::TensorView::new(*d, s, b))
        .collect()
}

/// The engine called directly.
struct LocalCaller {
    backend: Arc<dyn engine::Backend>,
    inputs: Vec<Input>,
}

impl Caller for LocalCaller {
    fn call(&mut self) -> Result<Option<StageSample>, BenchError> {
        let v = views(&self.inputs);
        self.backend
            .run(&v)
            .map_err(|e| BenchError::new(e.to_string()))?;
        Ok(None)
    }
}

/// A tensorwire client with its inputs allocated where the transport wants
/// them (in the session's arena over shm: zero-copy requests), or, with
/// `heap` (bench `--mover`), sent from the heap so that each request moves
/// them with the session's mover.
struct TensorwireCaller {
    model: client::Model,
    bufs: Vec<client::TensorBuf>,
    heap: bool,
    inputs: Vec<Input>,
    /// Which requests ask for their timeline (`None`: none do).
    sampler: Option<StageSampler>,
    _client: client::Client,
}

impl TensorwireCaller {
    fn connect(
        uri: &str,
        workload: &Workload,
        opts: client::ClientOptions,
        stages: bool,
        heap: bool,
    ) -> Result<TensorwireCaller, BenchError> {
        let e = |x: client::ClientError| BenchError::new(format!("{uri}: {x}"));
        let c = client::Client::connect_with(uri, opts).map_err(e)?;
        let model = c.model(workload.model_name()).map_err(e)?;
        let inputs = workload.inputs(model.signature())?;
        let mut bufs = Vec::with_capacity(inputs.len());
        for (dtype, shape, data) in inputs.iter().filter(|_| !heap) {
            let mut t = c.alloc_tensor(*dtype, shape).map_err(e)?;
            t.as_mut_bytes().copy_from_slice(data);
            bufs.push(t);
        }
        Ok(TensorwireCaller {
            model,
            bufs,
            heap,
            inputs,
            sampler: stages.then(StageSampler::new),
            _client: c,
        })
    }
}

impl Caller for TensorwireCaller {
    fn call(&mut self) -> Result<Option<StageSample>, BenchError> {
        let tensors: Vec<client::TensorRef<'_>> = if self.heap {
            self.inputs
                .iter()
                .map(|(dtype, shape, data)| client::TensorRef::new(*dtype, shape, data))
                .collect::<Result<_, _>>()
                .map_err(|e| BenchError::new(e.to_string()))?
        } else {
            self.bufs.iter().map(|t| t.as_ref()).collect()
        };
        let timed = self.sampler.as_mut().is_some_and(|s| s.time_next());
        let r = if timed {
            self.model.infer_timed(&tensors)
        } else {
            self.model.infer(&tensors)
        }
        .map_err(|e| BenchError::new(e.to_string()))?;
        if let Some(s) = self.sampler.as_mut().filter(|_| timed) {
            s.observed(r.client_done_ns.saturating_sub(r.client_start_ns));
        }
        if r.outputs.is_empty()
            && !self.inputs.is_empty()
            && self.model.signature().inputs.is_empty()
        {
            return Err(BenchError::new("the identity model returned no outputs"));
        }
        Ok(r.timeline.as_ref().and_then(|tl| {
            stage_sample(
                r.client_start_ns,
                r.client_sent_ns,
                tl,
                r.client_received_ns,
                r.client_done_ns,
            )
        }))
    }
}

/// Joins the client's four stamps with the agent's timeline (both
/// `CLOCK_MONOTONIC` on one machine). `None` when a stamp is missing.
pub fn stage_sample(
    start: u64,
    sent: u64,
    tl: &wire::Timeline,
    received: u64,
    done: u64,
) -> Option<StageSample> {
    use wire::Stage as W;
    let mut points = [
        start,
        sent,
        tl.get(W::Received),
        tl.get(W::Queued),
        tl.get(W::ComputeStart),
        tl.get(W::ComputeEnd),
        tl.get(W::ResponseSent),
        received,
        done,
    ];
    if points.contains(&0) {
        return None;
    }
    // A point later than the next one is clamped to it, from the end
    // back: over `inproc://` the client's "sent" stamp comes after the
    // agent has run the request on the caller's thread (and over shm the
    // agent may read a message before the client stamps it sent). Without
    // this the agent's time would be counted twice, once inside client
    // send, and the stages would add up to more than the round trip.
    for i in (0..points.len() - 1).rev() {
        points[i] = points[i].min(points[i + 1]);
    }
    let mut s = StageSample::default();
    for (i, w) in points.windows(2).enumerate() {
        s.0[i] = w[1].saturating_sub(w[0]);
    }
    debug_assert_eq!(Stage::COUNT, points.len() - 1);
    Some(s)
}

struct GrpcCaller {
    client: peer_grpc::Client,
    req: peer_grpc::Request,
}

impl Caller for GrpcCaller {
    fn call(&mut self) -> Result<Option<StageSample>, BenchError> {
        self.client
            .call(&self.req)
            .map_err(|e| BenchError::new(e.to_string()))?;
        Ok(None)
    }
}

struct HttpCaller(crate::kserve_http::HttpClient);

impl Caller for HttpCaller {
    fn call(&mut self) -> Result<Option<StageSample>, BenchError> {
        self.0.call()?;
        Ok(None)
    }
}

struct TtrpcCaller {
    client: peer_ttrpc::Client,
    req: peer_ttrpc::Request,
}

impl Caller for TtrpcCaller {
    fn call(&mut self) -> Result<Option<StageSample>, BenchError> {
        self.client
            .call(&self.req)
            .map_err(|e| BenchError::new(e.to_string()))?;
        Ok(None)
    }
}

/// How long a raw floor's echo peer may take to start.
pub const RAW_START: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_lists_parse() {
        let t = parse_transports("local,inproc,shm,unix,tcp,tcp?nodelay=0").expect("all");
        assert_eq!(t.len(), 6);
        assert!(parse_transports("unix,unix").is_err());
        assert!(parse_transports("vsock").is_err());
        assert!(Framework::parse_peer("zmq").is_err());
        let doors = parse_transports("grpc,http://").expect("the front doors");
        assert_eq!(doors, [Net::Grpc, Net::Http]);
        assert!(doors.iter().all(|n| n.is_front_door()));
    }

    #[test]
    fn the_grpc_door_brings_the_grpc_peer_over_tcp_once() {
        let peers = [Framework::Raw, Framework::Grpc];
        let labels = |nets: &[Net]| -> Vec<String> {
            targets(nets, &peers)
                .iter()
                .map(TargetSpec::label)
                .collect()
        };
        assert_eq!(
            labels(&[Net::Grpc, Net::Http]),
            ["tensorwire grpc", "grpc tcp", "tensorwire http"]
        );
        assert_eq!(
            labels(&[Net::Tcp { nodelay: true }, Net::Grpc]),
            ["tensorwire tcp", "raw tcp", "grpc tcp", "tensorwire grpc"]
        );
    }

    #[test]
    fn peers_only_get_their_transports() {
        let peers = [Framework::Raw, Framework::Grpc, Framework::Ttrpc];
        let t = targets(&[Net::None, Net::Shm, Net::Unix], &peers);
        let labels: Vec<String> = t.iter().map(TargetSpec::label).collect();
        assert_eq!(
            labels,
            [
                "in-process",
                "tensorwire shm",
                "raw shm",
                "tensorwire unix",
                "raw unix",
                "grpc unix",
                "ttrpc unix"
            ]
        );
    }

    #[test]
    fn stages_add_up_to_the_round_trip() {
        let tl = wire::Timeline::from_stamps([110, 120, 130, 140, 150, 160]);
        let s = stage_sample(100, 105, &tl, 170, 180).expect("complete");
        assert_eq!(s.0.iter().sum::<u64>(), 80);
        assert_eq!(s.get(Stage::ClientSend), 5);
        assert_eq!(s.get(Stage::ClientReceive), 10);
        assert!(stage_sample(100, 0, &tl, 170, 180).is_none());
    }

    #[test]
    fn a_synchronous_send_is_not_counted_twice() {
        // inproc: the agent ran 110..160 inside the client's send, which
        // the client stamped done at 165.
        let tl = wire::Timeline::from_stamps([110, 120, 130, 140, 150, 160]);
        let s = stage_sample(100, 165, &tl, 170, 180).expect("complete");
        assert_eq!(s.0.iter().sum::<u64>(), 80, "the stages are the round trip");
        assert_eq!(s.get(Stage::ClientSend), 10, "until the agent had it");
        assert_eq!(s.get(Stage::ToAgent), 0);
        assert_eq!(s.get(Stage::Compute), 10);
    }
}
