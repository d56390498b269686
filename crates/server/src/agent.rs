//! [`Agent`]: start-up, listeners, connection admission and shutdown.
//!
//! Start-up is all or nothing: every model loads and every endpoint binds,
//! or the agent does not start and the error names what failed. Each
//! listener has an accept thread that only accepts: it asks the
//! [`ConnTable`] to admit the connection (the agent-wide and per-peer
//! limits; a refusal is answered with an Error and closed at once, without
//! waiting for the client) and parks the new session in the [`Reactor`],
//! whose workers read its Hello and serve it (socket sessions:
//! [`session`](crate::session); shared-memory sessions, accepted on the control socket of
//! `shm://name`: [`shm_session`](crate::shm_session)). No connection holds a thread while it
//! waits, for its Hello or between requests, so neither idle clients nor
//! silent ones cost the agent threads; the [`Reaper`] closes connections
//! that do not finish their handshake in `handshake_timeout` (and, when
//! set, sessions idle for `idle_timeout`). Shutdown refuses new requests
//! (clients get `shutting-down`), lets the requests in flight finish and
//! send their responses, closes every connection, and removes the Unix
//! socket files (shm control sockets included).

use crate::config::{AgentConfig, ConfigError};
use crate::conns::{check_fd_limit, Conn, ConnTable, Deadlines, Reaper, Refusal};
use crate::dispatch::{AgentCore, Reply};
use crate::inproc::InprocAgent;
use crate::reactor::Reactor;
use crate::registry::ModelRegistry;
use crate::session::SocketSession;
use crate::shm_session::{ShmHandle, ShmSession, ShmSettings};
use crate::stats::Via;
use crate::tenants::{Identity, Tenants};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use thiserror::Error;
use transport::inproc::Registration;
use transport::{Endpoint, Listener, ListenerWaker, PeerId, StreamConn, TransportError};
use wire::Status;

/// Why an agent could not start.
///
/// # Examples
///
/// ```
/// use server::{Agent, AgentConfig, AgentError, ModelConfig};
/// let mut cfg = AgentConfig::default();
/// cfg.models.push(ModelConfig::new("m", "no/such/model.onnx"));
/// match Agent::start(cfg) {
///     Err(e @ AgentError::Engine(_)) => assert!(e.to_string().contains("no/such/model.onnx")),
///     other => panic!("expected a load error, got {other:?}"),
/// }
/// let bad = AgentConfig { intra_threads: 0, ..AgentConfig::default() };
/// assert!(matches!(Agent::start(bad), Err(AgentError::Config(_))));
/// ```
#[derive(Debug, Error)]
pub enum AgentError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A model could not be loaded.
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    /// An endpoint could not be bound.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// An in-process name is taken.
    #[error("{0}")]
    Inproc(String),
    /// The tenants file is unusable.
    #[error("tenants file {0}")]
    Tenants(#[from] crate::tenants::file::TenantsError),
    /// A TLS file (certificate, key, client CA) is unusable.
    #[error(transparent)]
    Tls(#[from] transport::tls::TlsError),
}

/// Counters describing a running agent.
///
/// # Examples
///
/// ```
/// use server::{Agent, AgentConfig};
/// # let dir = tempfile::tempdir()?;
/// # let sock = dir.path().join("agent.sock");
/// let mut cfg = AgentConfig::default();
/// cfg.add_listen(&format!("unix://{}", sock.display()))?;
/// let agent = Agent::start(cfg)?;
/// let c = client::Client::connect(&format!("unix://{}", sock.display()))?;
/// let x = [0u8; 16];
/// c.model("identity")?.infer(&[client::TensorRef::from_slice(&[16], &x)?])?;
/// let s = agent.stats();
/// assert_eq!((s.connections, s.accepted, s.responses), (1, 1, 1));
/// // The request stays in flight until its answer has left the agent,
/// // which may be a moment after the client has it:
/// for _ in 0..1000 {
///     if agent.stats().in_flight == 0 { break; }
///     std::thread::sleep(std::time::Duration::from_millis(1));
/// }
/// assert_eq!(agent.stats().in_flight, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Connections open now.
    pub connections: usize,
    /// Connections accepted since start.
    pub accepted: u64,
    /// Connections refused because `max_connections` were open.
    pub refused: u64,
    /// Connections refused because their peer held
    /// `max_connections_per_peer`.
    pub refused_per_peer: u64,
    /// Connections closed for not completing their Hello within
    /// `handshake_timeout`.
    pub handshake_timeouts: u64,
    /// Sessions closed for being idle longer than `idle_timeout`.
    pub idle_timeouts: u64,
    /// Connections closed for stalling mid-message longer than
    /// `stall_timeout` (between reads; a blocked payload read times out
    /// by itself and is not counted here).
    pub stalls: u64,
    /// Connections still in their handshake now.
    pub handshaking: usize,
    /// Sessions idle now (parked with nothing in flight: no thread).
    pub idle: usize,
    /// Distinct peers holding connections now.
    pub peers: usize,
    /// Worker threads now (busy sessions hold one each; see `reactor`).
    pub workers: usize,
    /// Requests answered with a response.
    pub responses: u64,
    /// Messages answered with an error.
    pub errors: u64,
    /// Requests in flight now.
    pub in_flight: usize,
    /// Shared-memory sessions open now (also counted in `connections`).
    pub shm_sessions: usize,
    /// Output bytes the agent copied into shared-memory arenas since start
    /// (owned engine outputs copied into a session's output region).
    pub shm_output_bytes_copied: u64,
    /// Output bytes engines wrote straight into arenas since start.
    pub shm_output_bytes_in_place: u64,
    /// Output bytes answered by pointing at the input they alias (identity)
    /// since start: nothing written.
    pub shm_output_bytes_aliased: u64,
    /// Tensors and bytes the agent moved, per data mover, since start
    /// (this process's agents together: [`crate::movers`]).
    pub movers: transport::mover::MoverStats,
    /// Times a session's worker, polling for its client, found the client
    /// on its own CPU and moved off it, since start
    /// ([`transport::cpu`]).
    pub cpu_moves: u64,
    /// Polls of shared-memory sessions ahead of a client request their
    /// client's rhythm forecast ([`transport::cadence`]), since start:
    /// those that caught the request (no wake-up), and those that missed
    /// it (the request woke the session after all).
    pub shm_forecast_caught: u64,
    /// See [`AgentStats::shm_forecast_caught`].
    pub shm_forecast_missed: u64,
}

/// A running agent.
///
/// # Examples
///
/// ```
/// use server::{Agent, AgentConfig, ModelConfig};
/// use std::time::Duration;
/// let mut cfg = AgentConfig::default();
/// cfg.add_listen("tcp://127.0.0.1:0")?; // port 0: any free port
/// cfg.models.push(ModelConfig::new("digits", concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx")));
/// let agent = Agent::start(cfg)?;
/// let uri = agent.endpoints()[0].to_string(); // the real port
///
/// let c = client::Client::connect(&uri)?;
/// let x = [0f32; 64];
/// let r = c.model("digits")?.infer(&[client::TensorRef::from_slice(&[1, 64], &x)?])?;
/// assert_eq!(r.outputs[0].shape, [1, 10]);
/// drop(c);
/// assert_eq!(agent.shutdown(Duration::from_secs(5)), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Agent {
    core: Arc<AgentCore>,
    conns: Arc<ConnTable>,
    reactor: Option<Arc<Reactor>>,
    reaper: Option<Reaper>,
    acceptors: Vec<(ListenerWaker, JoinHandle<()>)>,
    endpoints: Vec<Endpoint>,
    inproc: Vec<Registration>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

impl Agent {
    /// Validates `cfg`, loads its models and starts listening on
    /// `cfg.listen`. `cfg.front_doors` (KServe gRPC/HTTP) are not served
    /// here: take them out of the config and start them over
    /// [`core`](Self::core) with `frontend::FrontDoors` (as `serve` and the
    /// Python agent do); a config that still holds some is refused rather
    /// than silently not served.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::{Agent, AgentConfig};
    /// let cfg = AgentConfig::from_toml(r#"
    ///     listen = ["inproc://embedded"]
    ///     [[model]]
    ///     name = "digits"
    ///     path = "../../models/build/digits_mlp.onnx"
    ///     concurrency = 2
    /// "#)?;
    /// # let mut cfg = cfg;
    /// # cfg.models[0].path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx").into();
    /// let agent = Agent::start(cfg)?;
    /// let names = agent.core().registry.names();
    /// assert_eq!(names, ["identity", "digits"]);
    /// // Front doors are the frontend crate's: a config that names one is refused.
    /// let mut doors = AgentConfig::default();
    /// doors.add_listen("http://127.0.0.1:0")?;
    /// assert!(Agent::start(doors).is_err());
    /// # drop(agent);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(cfg: AgentConfig) -> Result<Agent, AgentError> {
        cfg.validate()?;
        let registry = ModelRegistry::load(&cfg)?;
        Agent::with_registry(cfg, registry)
    }

    /// Starts an agent serving an already built registry (for embedding and
    /// tests with custom backends).
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::IdentityBackend;
    /// use server::{Agent, AgentConfig, ModelRegistry};
    /// use std::sync::Arc;
    /// // Any engine::Backend can be served: here a second identity called "echo".
    /// let mut registry = ModelRegistry::with_identity();
    /// registry.add(Arc::new(IdentityBackend::named("echo")), 4);
    /// let mut cfg = AgentConfig::default();
    /// cfg.add_listen("inproc://custom")?;
    /// let _agent = Agent::with_registry(cfg, registry)?;
    ///
    /// let c = client::Client::connect("inproc://custom")?;
    /// let x = [1u8, 2, 3];
    /// let r = c.model("echo")?.infer(&[client::TensorRef::from_slice(&[3], &x)?])?;
    /// assert_eq!(r.outputs[0].bytes(), x);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_registry(cfg: AgentConfig, registry: ModelRegistry) -> Result<Agent, AgentError> {
        cfg.validate()?;
        if !cfg.front_doors.is_empty() {
            return Err(crate::ConfigError::Invalid(format!(
                "the agent does not serve the front doors {} itself: take them out of the \
                 config and start them with frontend::FrontDoors",
                cfg.front_doors.join(", ")
            ))
            .into());
        }
        let tenants = cfg
            .tenants
            .as_deref()
            .map(Tenants::load)
            .transpose()?
            .map(Arc::new);
        let socket_group = cfg.socket_group.as_deref().map(resolve_group).transpose()?;
        crate::movers().set_choice(cfg.mover);
        let core = Arc::new(
            AgentCore::new(registry, cfg.limits, cfg.max_total_payload)
                .with_request_timing(cfg.request_timing)
                .with_tenants(tenants)
                .with_connections(
                    cfg.max_connections,
                    cfg.max_connections_per_peer,
                    cfg.handshake_timeout,
                )
                .with_stall_timeout(cfg.stall_timeout),
        );
        // One table for every connection, the front doors' too
        // (`AgentCore::conns`).
        let conns = core.conns().clone();
        let spawn_err =
            |what: &str, e: std::io::Error| AgentError::Inproc(format!("cannot start {what}: {e}"));
        check_fd_limit(cfg.max_connections);
        // Busy sessions hold a worker each, as many as may be connected.
        let reactor = Arc::new(
            Reactor::new(cfg.max_connections).map_err(|e| spawn_err("the worker pool", e))?,
        );
        let deadlines = Deadlines {
            handshake: cfg.handshake_timeout,
            stall: cfg.stall_timeout,
            idle: cfg.idle_timeout,
        };
        let reaper = Reaper::start(conns.clone(), deadlines)
            .map_err(|e| spawn_err("the reaper thread", e))?;
        // The TLS files are read once, here: a bad one stops the start.
        let tls = cfg
            .tls
            .as_ref()
            .map(transport::tls::server_config)
            .transpose()?;
        // Bind everything first, so a failure starts nothing.
        let mut listeners = Vec::new();
        let mut inproc = Vec::new();
        let mut endpoints = Vec::new();
        for ep in &cfg.listen {
            match ep {
                Endpoint::Inproc(name) => {
                    let reg =
                        transport::inproc::register(name, Arc::new(InprocAgent(core.clone())))
                            .map_err(AgentError::Inproc)?;
                    inproc.push(reg);
                    endpoints.push(ep.clone());
                }
                _ => {
                    let l = match (ep, &tls) {
                        (Endpoint::Tls { .. }, Some(config)) => {
                            Listener::bind_tls(ep, config.clone())?
                        }
                        _ => Listener::bind(ep)?,
                    };
                    l.set_access(cfg.socket_mode, socket_group)
                        .map_err(|source| TransportError::Io {
                            what: "set the owner and mode of",
                            endpoint: ep.to_string(),
                            source,
                        })?;
                    endpoints.push(l.endpoint().clone());
                    listeners.push(l);
                }
            }
        }
        let mut acceptors = Vec::new();
        for l in listeners {
            let waker = l.waker().map_err(|source| TransportError::Io {
                what: "listen on",
                endpoint: l.endpoint().to_string(),
                source,
            })?;
            let ctx = Acceptor {
                core: core.clone(),
                conns: conns.clone(),
                reactor: reactor.clone(),
                stall: cfg.stall_timeout,
                socket_spin: Duration::from_micros(cfg.socket_spin_us),
            };
            let shm = matches!(l.endpoint(), Endpoint::Shm(_)).then(|| ShmSettings {
                sizes: cfg.shm_sizes(),
                spin: Duration::from_micros(cfg.shm_spin_us),
                park_after: cfg.shm_park_after,
                stall: cfg.stall_timeout,
            });
            let name = format!("tw-accept-{}", acceptors.len());
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || match shm {
                    None => ctx.accept_loop(l),
                    Some(shm) => ctx.accept_shm_loop(l, shm),
                })
                .map_err(|e| spawn_err("an accept thread", e))?;
            acceptors.push((waker, handle));
        }
        Ok(Agent {
            core,
            conns,
            reactor: Some(reactor),
            reaper: Some(reaper),
            acceptors,
            endpoints,
            inproc,
        })
    }

    /// The endpoints listened on (TCP port 0 resolved to the real port;
    /// `shm://name` as given).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::{Agent, AgentConfig};
    /// use transport::Endpoint;
    /// let mut cfg = AgentConfig::default();
    /// cfg.add_listen("tcp://127.0.0.1:0")?;
    /// cfg.add_listen("inproc://named")?;
    /// let agent = Agent::start(cfg)?;
    /// match &agent.endpoints()[0] {
    ///     Endpoint::Tcp { addr, .. } => assert!(!addr.ends_with(":0")),
    ///     other => panic!("expected tcp, got {other}"),
    /// }
    /// assert_eq!(agent.endpoints()[1].to_string(), "inproc://named");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The shared core (models, counters).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::{Agent, AgentConfig};
    /// let agent = Agent::start(AgentConfig::default())?; // no listener: nothing to call it yet
    /// let core = agent.core();
    /// assert!(core.registry.find("identity").is_some());
    /// assert_eq!(core.limits, AgentConfig::default().limits);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn core(&self) -> &Arc<AgentCore> {
        &self.core
    }

    /// Current counters.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::{Agent, AgentConfig};
    /// let mut cfg = AgentConfig::default();
    /// cfg.add_listen("inproc://counted")?;
    /// let agent = Agent::start(cfg)?;
    /// let c = client::Client::connect("inproc://counted")?;
    /// let x = [0u8; 4];
    /// let m = c.model("identity")?;
    /// for _ in 0..3 {
    ///     m.infer(&[client::TensorRef::from_slice(&[4], &x)?])?;
    /// }
    /// assert_eq!(agent.stats().responses, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> AgentStats {
        let open = self.conns.counts();
        let t = &self.conns;
        let c = &self.core.counters;
        AgentStats {
            connections: open.open,
            accepted: t.accepted.load(Ordering::Relaxed),
            refused: t.refused.load(Ordering::Relaxed),
            refused_per_peer: t.refused_per_peer.load(Ordering::Relaxed),
            handshake_timeouts: t.handshake_timeouts.load(Ordering::Relaxed),
            idle_timeouts: t.idle_timeouts.load(Ordering::Relaxed),
            stalls: t.stalls.load(Ordering::Relaxed),
            handshaking: open.handshaking,
            idle: open.idle,
            peers: open.peers,
            workers: self.reactor.as_ref().map_or(0, |r| r.stats().workers),
            responses: c.responses.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            in_flight: self.core.in_flight(),
            shm_sessions: open.shm,
            shm_output_bytes_copied: c.shm_output_bytes_copied.load(Ordering::Relaxed),
            shm_output_bytes_in_place: c.shm_output_bytes_in_place.load(Ordering::Relaxed),
            shm_output_bytes_aliased: c.shm_output_bytes_aliased.load(Ordering::Relaxed),
            cpu_moves: transport::cpu::moves_total(),
            shm_forecast_caught: transport::cadence::polls_total().0,
            shm_forecast_missed: transport::cadence::polls_total().1,
            movers: crate::movers().stats(),
        }
    }

    /// Shuts down: stops accepting, refuses new requests, waits up to
    /// `grace` for in-flight requests, closes every connection, removes
    /// socket files. Returns the number of requests still unfinished.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::{Agent, AgentConfig};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// # let sock = dir.path().join("agent.sock");
    /// let mut cfg = AgentConfig::default();
    /// cfg.add_listen(&format!("unix://{}", sock.display()))?;
    /// let agent = Agent::start(cfg)?;
    /// let c = client::Client::connect(&format!("unix://{}", sock.display()))?;
    /// let unfinished = agent.shutdown(Duration::from_secs(5));
    /// assert_eq!(unfinished, 0);
    /// assert!(!sock.exists()); // the socket file is removed
    /// assert!(c.ping().is_err()); // and the session closed
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(mut self, grace: Duration) -> usize {
        self.shutdown_inner(grace)
    }

    fn shutdown_inner(&mut self, grace: Duration) -> usize {
        for (waker, _) in &self.acceptors {
            waker.wake();
        }
        for (_, handle) in self.acceptors.drain(..) {
            let _ = handle.join();
        }
        self.inproc.clear();
        let unfinished = self.core.close_and_drain(grace);
        self.conns.close_all(Duration::from_secs(5));
        self.reaper = None;
        // Stops the workers; sessions still parked (none, unless one did
        // not end in time) close as they drop.
        self.reactor = None;
        unfinished
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if !self.acceptors.is_empty() || !self.core.is_closing() {
            self.shutdown_inner(Duration::from_secs(5));
        }
    }
}

/// What an accept thread needs.
struct Acceptor {
    core: Arc<AgentCore>,
    conns: Arc<ConnTable>,
    reactor: Arc<Reactor>,
    stall: Duration,
    socket_spin: Duration,
}

impl Acceptor {
    /// The accept loop of a Unix or TCP listener: admit, then park the
    /// session in the reactor (its Hello is read by a worker).
    fn accept_loop(self, l: Listener) {
        let via = Via::of_endpoint(l.endpoint());
        loop {
            let mut conn = match l.accept() {
                Ok(c) => c,
                Err(e) if accept_failed(&l, &self.core, &e) => break,
                Err(_) => continue,
            };
            if self.core.is_closing() {
                break;
            }
            let (Ok(peer), Ok(writer), Ok(creds)) =
                (conn.peer_id(), conn.writer(), conn.credentials())
            else {
                continue;
            };
            let who = Identity {
                creds,
                addr: match peer {
                    PeerId::Addr(a) => Some(a),
                    PeerId::Uid(_) | PeerId::Vsock(_) => None,
                },
                vsock: conn.vsock_peer(),
                in_process: false,
                cert_names: None,
            };
            let slot = match self.conns.admit(Conn::Stream(writer), peer) {
                Ok(slot) => slot,
                Err(r) => {
                    refuse(&conn, &r);
                    continue;
                }
            };
            let _ = conn.set_read_timeout(Some(self.stall));
            let _ = conn.set_write_timeout(Some(self.stall));
            conn.set_spin(self.socket_spin);
            let session = SocketSession::new(self.core.clone(), conn, who, slot, via);
            // On failure the session drops: connection closed, slot freed.
            let _ = self.reactor.add(Box::new(session));
        }
    }

    /// The accept loop of an `shm://` control socket: admit, then park the
    /// session in the reactor (a worker answers its Hello and makes the
    /// arena once the Hello has arrived).
    fn accept_shm_loop(self, l: Listener, shm: ShmSettings) {
        loop {
            let sock = match l.accept_unix() {
                Ok(s) => s,
                Err(e) if accept_failed(&l, &self.core, &e) => break,
                Err(_) => continue,
            };
            if self.core.is_closing() {
                break;
            }
            // Shutdown closes the session through a second handle on the
            // same socket (and wakes it through the arena once it exists).
            let (Ok(peer), Ok(clone)) = (PeerId::of_unix(&sock), sock.try_clone()) else {
                continue;
            };
            let handle = Arc::new(ShmHandle::new(clone));
            let slot = match self.conns.admit(Conn::Shm(handle.clone()), peer) {
                Ok(slot) => slot,
                Err(r) => {
                    refuse_shm(sock, &r);
                    continue;
                }
            };
            let session = ShmSession::new(self.core.clone(), sock, shm, handle, slot);
            let _ = self.reactor.add(Box::new(session));
        }
    }
}

/// A group name or number → its gid.
fn resolve_group(g: &str) -> Result<u32, AgentError> {
    if let Ok(n) = g.parse::<u32>() {
        return Ok(n);
    }
    match nix::unistd::Group::from_name(g) {
        Ok(Some(grp)) => Ok(grp.gid.as_raw()),
        Ok(None) => {
            Err(crate::ConfigError::Invalid(format!("socket_group: no group named '{g}'")).into())
        }
        Err(e) => Err(crate::ConfigError::Invalid(format!("socket_group '{g}': {e}")).into()),
    }
}

/// After a failed accept: true when the loop should stop (shutdown woke
/// it); other errors (EMFILE...) are transient: back off briefly instead
/// of spinning.
fn accept_failed(l: &Listener, core: &AgentCore, e: &std::io::Error) -> bool {
    // The waker shuts the socket down: accept fails with EINVAL.
    if core.is_closing() || e.raw_os_error() == Some(22) {
        return true;
    }
    eprintln!("tensorwire agent: accept on {} failed: {e}", l.endpoint());
    std::thread::sleep(Duration::from_millis(20));
    false
}

/// Refuses a socket connection: an Error (request id 0) and a close, at
/// once. The socket is new, so the write lands in an empty buffer and
/// cannot block; the client reads it as the answer to its Hello.
fn refuse(conn: &StreamConn, why: &Refusal) {
    let r = Reply::error(0, Status::LimitExceeded, &why.message());
    let _ = conn.send(&r.header, &r.desc, &[]);
}

/// Refuses a shared-memory client the same way, without reading its Hello
/// first: an accept thread must never wait on a client.
fn refuse_shm(sock: UnixStream, why: &Refusal) {
    let r = Reply::error(0, Status::LimitExceeded, &why.message());
    let _ = sock.set_nonblocking(true);
    let _ = (&sock).write_all(&[&r.header.encode()[..], &r.desc].concat());
}
