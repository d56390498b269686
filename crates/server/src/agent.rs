//! [`Agent`]: start-up, listeners, connection bookkeeping and shutdown.
//!
//! Start-up is all or nothing: every model loads and every endpoint binds,
//! or the agent does not start and the error names what failed. Each
//! listener has an accept thread; each connection a session thread.
//! Shutdown refuses new requests (clients get `shutting-down`), lets the
//! requests in flight finish and send their responses, closes every
//! connection, and removes the Unix socket files.

use crate::config::{AgentConfig, ConfigError};
use crate::dispatch::{AgentCore, Reply};
use crate::inproc::InprocAgent;
use crate::registry::ModelRegistry;
use crate::session;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thiserror::Error;
use transport::inproc::Registration;
use transport::{Endpoint, Listener, ListenerWaker, StreamConn, StreamWriter, TransportError};
use wire::Status;

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
}

/// Open connections, so shutdown can close them.
#[derive(Default)]
struct ConnTable {
    open: Mutex<HashMap<u64, StreamWriter>>,
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
                Endpoint::Shm(_) => {
                    return Err(AgentError::Inproc(format!(
                        "{ep}: the agent does not serve shared-memory sessions yet"
                    )))
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
            let name = format!("tw-accept-{}", acceptors.len());
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || accept_loop(l, core, conns, max, stall))
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

    /// The endpoints listened on (TCP port 0 resolved to the real port).
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The shared core (models, counters).
    pub fn core(&self) -> &Arc<AgentCore> {
        &self.core
    }

    /// Current counters.
    pub fn stats(&self) -> AgentStats {
        let open = self.conns.open.lock().map_or(0, |m| m.len());
        AgentStats {
            connections: open,
            accepted: self.conns.accepted.load(Ordering::Relaxed),
            refused: self.conns.refused.load(Ordering::Relaxed),
            responses: self.core.counters.responses.load(Ordering::Relaxed),
            errors: self.core.counters.errors.load(Ordering::Relaxed),
            in_flight: self.core.in_flight(),
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
        for w in open.values() {
            let _ = w.shutdown();
        }
        while !open.is_empty() && Instant::now() < deadline {
            open = self
                .conns
                .closed
                .wait_timeout(open, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
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
) {
    loop {
        let conn = match l.accept() {
            Ok(c) => c,
            Err(_) if core.is_closing() => break,
            Err(e) => {
                // The waker shuts the socket down; any other error (EMFILE...)
                // is transient: back off briefly instead of spinning.
                if e.raw_os_error() == Some(22) {
                    break;
                }
                eprintln!("tensorwire agent: accept on {} failed: {e}", l.endpoint());
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        if core.is_closing() {
            break;
        }
        let _ = conn.set_read_timeout(Some(stall));
        let _ = conn.set_write_timeout(Some(stall));
        let writer = match conn.writer() {
            Ok(w) => w,
            Err(_) => continue,
        };
        let id = conns.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut open = conns.open.lock().unwrap_or_else(|p| p.into_inner());
            if open.len() >= max {
                drop(open);
                conns.refused.fetch_add(1, Ordering::Relaxed);
                refuse(&conn, max);
                continue;
            }
            open.insert(id, writer);
        }
        conns.accepted.fetch_add(1, Ordering::Relaxed);
        let (core, conns2) = (core.clone(), conns.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("tw-session-{id}"))
            .spawn(move || {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    session::serve(core, conn)
                }));
                let mut open = conns2.open.lock().unwrap_or_else(|p| p.into_inner());
                open.remove(&id);
                conns2.closed.notify_all();
            });
        if spawned.is_err() {
            let mut open = conns.open.lock().unwrap_or_else(|p| p.into_inner());
            open.remove(&id);
        }
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
