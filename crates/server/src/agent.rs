//! [`Agent`]: start-up, listeners, connection bookkeeping and shutdown.
//!
//! Start-up is all or nothing: every model loads and every endpoint binds,
//! or the agent does not start and the error names what failed. Each
//! listener has an accept thread; each connection a session thread (socket
//! sessions: [`session`]; shared-memory sessions, accepted on the control
//! socket of `shm://name`: [`shm_session`], which also bootstraps the
//! arena on that thread, so a slow client never holds up the accept
//! thread). Socket and shared-memory connections share one table and one
//! `max_connections`. Shutdown refuses new requests (clients get
//! `shutting-down`), lets the requests in flight finish and send their
//! responses, closes every connection, and removes the Unix socket files
//! (shm control sockets included).

use crate::config::{AgentConfig, ConfigError};
use crate::dispatch::{AgentCore, Reply};
use crate::inproc::InprocAgent;
use crate::registry::ModelRegistry;
use crate::session;
use crate::shm_session::{self, ShmHandle, ShmSettings};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thiserror::Error;
use transport::inproc::Registration;
use transport::{Endpoint, Listener, ListenerWaker, StreamConn, StreamWriter, TransportError};
use wire::{Header, Status};

/// Why an agent could not start.
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
}

/// Counters describing a running agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Connections open now.
    pub connections: usize,
    /// Connections accepted since start.
    pub accepted: u64,
    /// Connections refused because `max_connections` were open.
    pub refused: u64,
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
}

/// How shutdown reaches an open connection.
enum Conn {
    /// A socket session: shutting its socket down ends its blocked read.
    Stream(StreamWriter),
    /// A shared-memory session.
    Shm(Arc<ShmHandle>),
}

impl Conn {
    fn close(&self) {
        match self {
            Conn::Stream(w) => {
                let _ = w.shutdown();
            }
            Conn::Shm(h) => h.close(),
        }
    }
}

/// Open connections, so shutdown can close them.
#[derive(Default)]
struct ConnTable {
    open: Mutex<HashMap<u64, Conn>>,
    closed: Condvar,
    next: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
}

/// A running agent.
pub struct Agent {
    core: Arc<AgentCore>,
    conns: Arc<ConnTable>,
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
    /// Validates `cfg`, loads its models and starts listening.
    pub fn start(cfg: AgentConfig) -> Result<Agent, AgentError> {
        cfg.validate()?;
        let registry = ModelRegistry::load(&cfg)?;
        Agent::with_registry(cfg, registry)
    }

    /// Starts an agent serving an already built registry (for embedding and
    /// tests with custom backends).
    pub fn with_registry(cfg: AgentConfig, registry: ModelRegistry) -> Result<Agent, AgentError> {
        cfg.validate()?;
        let core = Arc::new(AgentCore::new(registry, cfg.limits, cfg.max_total_payload));
        let conns = Arc::new(ConnTable::default());
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
                    let l = Listener::bind(ep)?;
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
            let (core, conns) = (core.clone(), conns.clone());
            let (max, stall) = (cfg.max_connections, cfg.stall_timeout);
            let socket_spin = Duration::from_micros(cfg.socket_spin_us);
            let shm = matches!(l.endpoint(), Endpoint::Shm(_)).then(|| ShmSettings {
                sizes: cfg.shm_sizes(),
                spin: Duration::from_micros(cfg.shm_spin_us),
                stall,
            });
            let name = format!("tw-accept-{}", acceptors.len());
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || match shm {
                    None => accept_loop(l, core, conns, max, stall, socket_spin),
                    Some(shm) => accept_shm_loop(l, core, conns, max, shm),
                })
                .map_err(|e| AgentError::Inproc(format!("cannot spawn accept thread: {e}")))?;
            acceptors.push((waker, handle));
        }
        Ok(Agent {
            core,
            conns,
            acceptors,
            endpoints,
            inproc,
        })
    }

    /// The endpoints listened on (TCP port 0 resolved to the real port;
    /// `shm://name` as given).
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The shared core (models, counters).
    pub fn core(&self) -> &Arc<AgentCore> {
        &self.core
    }

    /// Current counters.
    pub fn stats(&self) -> AgentStats {
        let (open, shm) = self.conns.open.lock().map_or((0, 0), |m| {
            let shm = m.values().filter(|c| matches!(c, Conn::Shm(_))).count();
            (m.len(), shm)
        });
        let c = &self.core.counters;
        AgentStats {
            connections: open,
            accepted: self.conns.accepted.load(Ordering::Relaxed),
            refused: self.conns.refused.load(Ordering::Relaxed),
            responses: c.responses.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            in_flight: self.core.in_flight(),
            shm_sessions: shm,
            shm_output_bytes_copied: c.shm_output_bytes_copied.load(Ordering::Relaxed),
            shm_output_bytes_in_place: c.shm_output_bytes_in_place.load(Ordering::Relaxed),
            shm_output_bytes_aliased: c.shm_output_bytes_aliased.load(Ordering::Relaxed),
        }
    }

    /// Shuts down: stops accepting, refuses new requests, waits up to
    /// `grace` for in-flight requests, closes every connection, removes
    /// socket files. Returns the number of requests still unfinished.
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
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut open = self.conns.open.lock().unwrap_or_else(|p| p.into_inner());
        for c in open.values() {
            c.close();
        }
        while !open.is_empty() && Instant::now() < deadline {
            open = self
                .conns
                .closed
                .wait_timeout(open, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            // Again: a shared-memory session thread that was between its
            // spin and its sleep when woken would otherwise sleep out its
            // slice; closing twice is harmless.
            for c in open.values() {
                c.close();
            }
        }
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

fn accept_loop(
    l: Listener,
    core: Arc<AgentCore>,
    conns: Arc<ConnTable>,
    max: usize,
    stall: Duration,
    spin: Duration,
) {
    loop {
        let mut conn = match l.accept() {
            Ok(c) => c,
            Err(e) if accept_failed(&l, &core, &e) => break,
            Err(_) => continue,
        };
        if core.is_closing() {
            break;
        }
        let _ = conn.set_read_timeout(Some(stall));
        let _ = conn.set_write_timeout(Some(stall));
        conn.set_spin(spin);
        let writer = match conn.writer() {
            Ok(w) => w,
            Err(_) => continue,
        };
        let Some(id) = conns.register(Conn::Stream(writer), max) else {
            refuse(&conn, max);
            continue;
        };
        let core = core.clone();
        conns.spawn(id, move || session::serve(core, conn));
    }
}

/// The accept loop of an `shm://` control socket: accepts only; the
/// bootstrap (arena creation, Hello) happens on the session's thread.
fn accept_shm_loop(
    l: Listener,
    core: Arc<AgentCore>,
    conns: Arc<ConnTable>,
    max: usize,
    shm: ShmSettings,
) {
    loop {
        let sock = match l.accept_unix() {
            Ok(s) => s,
            Err(e) if accept_failed(&l, &core, &e) => break,
            Err(_) => continue,
        };
        if core.is_closing() {
            break;
        }
        // Shutdown closes the session through a second handle on the same
        // socket (and wakes its thread once the arena exists).
        let Ok(clone) = sock.try_clone() else {
            continue;
        };
        let handle = Arc::new(ShmHandle::new(clone));
        let Some(id) = conns.register(Conn::Shm(handle.clone()), max) else {
            refuse_shm(sock, max);
            continue;
        };
        let core = core.clone();
        conns.spawn(id, move || shm_session::serve(core, sock, shm, &handle));
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

impl ConnTable {
    /// Adds a connection unless `max` are open; returns its id.
    fn register(&self, conn: Conn, max: usize) -> Option<u64> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= max {
            drop(open);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        open.insert(id, conn);
        drop(open);
        self.accepted.fetch_add(1, Ordering::Relaxed);
        Some(id)
    }

    /// Runs `serve` on a new session thread; the connection leaves the
    /// table when it returns (or panics).
    fn spawn(self: &Arc<Self>, id: u64, serve: impl FnOnce() + Send + 'static) {
        let conns = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("tw-session-{id}"))
            .spawn(move || {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(serve));
                conns.remove(id);
            });
        if spawned.is_err() {
            self.remove(id);
        }
    }

    fn remove(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.remove(&id);
        self.closed.notify_all();
    }
}

fn refuse(conn: &StreamConn, max: usize) {
    let r = Reply::error(
        0,
        Status::LimitExceeded,
        &format!("the agent already serves {max} connections"),
    );
    let _ = conn.send(&r.header, &r.desc, &[]);
}

/// Refuses a shared-memory client: answers its Hello with an Error (read
/// briefly first, so the client's write of it does not fail and its
/// request id is echoed), then closes.
fn refuse_shm(mut sock: UnixStream, max: usize) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = sock.set_write_timeout(Some(Duration::from_millis(100)));
    let mut hello = [0u8; 128];
    let n = sock.read(&mut hello).unwrap_or(0);
    let id = Header::decode(&hello[..n]).map_or(0, |h| h.request_id);
    let r = Reply::error(
        id,
        Status::LimitExceeded,
        &format!("the agent already serves {max} connections"),
    );
    let _ = sock.write_all(&[&r.header.encode()[..], &r.desc].concat());
}
