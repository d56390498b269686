//! KServe v2 front doors on the gateway (`--listen http://…`,
//! `grpc://…`, `https://`, `grpcs://`), translated to native.
//!
//! The translation is the agent's own: the gateway runs the same
//! `frontend` doors (JSON and binary tensors, gRPC with streaming, health,
//! metadata, statistics, `/metrics`) over a local `AgentCore` of its own,
//! whose models are the upstream agent's. Each is a [`RemoteModel`]: an
//! `engine::Backend` whose `run` is one native call over a session the
//! doors share with each other ([`UpstreamSession`], pipelined, so
//! concurrent KServe requests are in flight on it at once). So a KServe
//! request is decoded once, by the same code as on the agent, and reaches
//! the agent as a native request; nothing of KServe crosses the hop.
//!
//! What the gateway serves is what the agent served when the gateway
//! started (models it loads later are not seen until the gateway restarts).
//! When the agent is down, a request fails `unavailable` (HTTP 503, gRPC
//! `UNAVAILABLE`) and the next one tries to reconnect. The session carries
//! the gateway's own token (`--token`): through the KServe doors the
//! agent sees one client, the gateway.

use client::{Client, ClientError, ClientOptions, Model, TensorRef};
use engine::{Backend, EngineError, Output, OutputData, TensorView};
use server::{Agent, AgentConfig, ModelRegistry};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use wire::{AlignedBuf, DType, ModelSignature};

/// How many KServe requests one remote model lets run at once (each is a
/// request in flight on the upstream session; the agent's own queue
/// decides what runs).
const CONCURRENCY: usize = 256;

/// The upstream session the KServe doors share, opened again after the
/// agent went away.
pub struct UpstreamSession {
    uri: String,
    opts: ClientOptions,
    state: Mutex<Option<Connected>>,
    /// Requests in flight on the session, all models together: kept
    /// within the session's `max_in_flight`, so a burst of KServe calls
    /// waits here instead of being refused `too-many-in-flight`.
    in_flight: Mutex<usize>,
    room: Condvar,
}

/// A request's place in [`UpstreamSession::in_flight`], given back on drop.
struct Seat<'a>(&'a UpstreamSession);

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        *lock(&self.0.in_flight) -= 1;
        self.0.room.notify_one();
    }
}

struct Connected {
    client: Client,
    models: HashMap<String, Model>,
}

/// Requests in flight on the session when the agent gave no limit yet.
const DEFAULT_IN_FLIGHT: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl UpstreamSession {
    /// A session to `uri` with `opts`, opened at the first use.
    pub fn new(uri: &str, opts: ClientOptions) -> Arc<UpstreamSession> {
        Arc::new(UpstreamSession {
            uri: uri.to_string(),
            opts,
            state: Mutex::new(None),
            in_flight: Mutex::new(0),
            room: Condvar::new(),
        })
    }

    /// Waits (at most the session's timeout) for room among the requests
    /// in flight, then holds a place until the returned seat drops.
    fn seat(&self) -> Result<Seat<'_>, EngineError> {
        let max = lock(&self.state)
            .as_ref()
            .map_or(DEFAULT_IN_FLIGHT, |c| {
                c.client.limits().max_in_flight as usize
            })
            .max(1);
        let deadline = std::time::Instant::now() + self.opts.timeout;
        let mut n = lock(&self.in_flight);
        while *n >= max {
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(EngineError::Unavailable(format!(
                    "{max} requests already in flight to the agent; retry later"
                )));
            }
            n = self
                .room
                .wait_timeout(n, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *n += 1;
        Ok(Seat(self))
    }

    /// The models the agent serves now.
    pub fn models(&self) -> Result<Vec<client::ModelInfo>, ClientError> {
        let c = self.client()?;
        c.models()
    }

    fn client(&self) -> Result<Client, ClientError> {
        let mut st = lock(&self.state);
        if let Some(c) = st.as_ref() {
            return Ok(c.client.clone());
        }
        let client = Client::connect_with(&self.uri, self.opts.clone())?;
        *st = Some(Connected {
            client: client.clone(),
            models: HashMap::new(),
        });
        Ok(client)
    }

    /// The agent's model `name` on the current session (opened if need be).
    fn model(&self, name: &str) -> Result<Model, ClientError> {
        let client = self.client()?;
        if let Some(m) = lock(&self.state)
            .as_ref()
            .and_then(|c| c.models.get(name).cloned())
        {
            return Ok(m);
        }
        let m = client.model(name)?;
        if let Some(c) = lock(&self.state).as_mut() {
            c.models.insert(name.to_string(), m.clone());
        }
        Ok(m)
    }

    /// Forgets the session after it failed (the next call reconnects).
    fn reset(&self) {
        *lock(&self.state) = None;
    }
}

/// One of the upstream agent's models, as a backend of the gateway's core.
pub struct RemoteModel {
    upstream: Arc<UpstreamSession>,
    signature: ModelSignature,
}

impl RemoteModel {
    /// The upstream's model with `signature` (its name names it there).
    pub fn new(upstream: Arc<UpstreamSession>, signature: ModelSignature) -> RemoteModel {
        RemoteModel {
            upstream,
            signature,
        }
    }
}

/// The engine error for a failed upstream call: the agent's own verdict
/// where it gave one, `Unavailable` when it could not be reached.
fn engine_error(e: ClientError) -> EngineError {
    match e {
        ClientError::InvalidInput(m) | ClientError::UnknownModel(m) => EngineError::InvalidInput(m),
        // Unreachable, or busy: either way "retry later" (503 / UNAVAILABLE).
        ClientError::Connect(_)
        | ClientError::AgentGone(_)
        | ClientError::Timeout(_)
        | ClientError::ShuttingDown(_)
        | ClientError::Overloaded(_)
        | ClientError::TooManyInFlight(_) => EngineError::Unavailable(format!("the agent: {e}")),
        other => EngineError::Run(format!("the agent: {other}")),
    }
}

impl Backend for RemoteModel {
    fn signature(&self) -> &ModelSignature {
        &self.signature
    }

    fn check_inputs(&self, inputs: &[(DType, &[u64])]) -> Result<(), EngineError> {
        // The agent checks again; a model that declares no inputs
        // (identity) takes anything.
        if self.signature.inputs.is_empty() {
            return Ok(());
        }
        engine::check_against_signature(&self.signature, inputs)
    }

    fn may_block(&self) -> bool {
        // A call to another process: never on the doors' async workers.
        true
    }

    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
        let _seat = self.upstream.seat()?;
        let model = self.upstream.model(&self.signature.name).map_err(|e| {
            self.upstream.reset();
            engine_error(e)
        })?;
        let refs = inputs
            .iter()
            .map(|t| TensorRef::new(t.dtype, t.shape, t.data))
            .collect::<Result<Vec<_>, _>>()
            .map_err(engine_error)?;
        let r = model.infer(&refs).map_err(|e| {
            if matches!(e, ClientError::AgentGone(_) | ClientError::Connect(_)) {
                self.upstream.reset();
            }
            engine_error(e)
        })?;
        r.outputs
            .iter()
            .map(|o| {
                let bytes = o.bytes();
                let mut buf = AlignedBuf::zeroed(bytes.len())
                    .map_err(|e| EngineError::OutOfMemory(e.to_string()))?;
                buf.as_mut_slice().copy_from_slice(bytes);
                Ok(Output {
                    dtype: o.dtype,
                    shape: o.shape.clone(),
                    data: OutputData::Owned(buf),
                })
            })
            .collect()
    }
}

/// The gateway's KServe doors: a local core serving the upstream's models
/// as [`RemoteModel`]s, and the `frontend` doors over it.
pub struct KserveDoors {
    agent: Option<Agent>,
    doors: Option<frontend::FrontDoors>,
}

impl Drop for KserveDoors {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why the KServe doors could not start.
#[derive(Debug)]
pub struct KserveError(pub String);

impl std::fmt::Display for KserveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KserveError {}

impl KserveDoors {
    /// Lists the models of the agent at `upstream` (which must be up),
    /// and opens `doors` over them.
    pub fn start(
        upstream: &str,
        opts: ClientOptions,
        doors: frontend::DoorsConfig,
    ) -> Result<KserveDoors, KserveError> {
        let session = UpstreamSession::new(upstream, opts);
        let models = session
            .models()
            .map_err(|e| KserveError(format!("listing the models of {upstream}: {e}")))?;
        let mut registry = ModelRegistry::default();
        for m in models {
            registry.add(
                Arc::new(RemoteModel::new(session.clone(), m.signature)),
                CONCURRENCY,
            );
        }
        let cfg = AgentConfig {
            listen: Vec::new(),
            ..AgentConfig::default()
        };
        let agent = Agent::with_registry(cfg, registry)
            .map_err(|e| KserveError(format!("the gateway's core: {e}")))?;
        let doors = frontend::FrontDoors::start(agent.core().clone(), doors)
            .map_err(|e| KserveError(e.to_string()))?;
        Ok(KserveDoors {
            agent: Some(agent),
            doors: Some(doors),
        })
    }

    /// The doors' URIs (ports resolved).
    pub fn uris(&self) -> Vec<String> {
        self.doors
            .as_ref()
            .map(|d| d.uris().into_iter().map(String::from).collect())
            .unwrap_or_default()
    }

    /// Stops the doors and the core in order (calls in flight get up to
    /// 5 s).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        match (self.doors.take(), self.agent.take()) {
            (Some(d), Some(a)) => {
                d.shutdown_with(a, std::time::Duration::from_secs(5));
            }
            (Some(d), None) => d.shutdown(),
            (None, Some(a)) => {
                a.shutdown(std::time::Duration::from_secs(5));
            }
            (None, None) => {}
        }
    }
}
