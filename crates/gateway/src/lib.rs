//! The tensorwire gateway: a process that accepts native tensorwire
//! sessions on `tcp://`, `unix://` (or `tls://`) listeners and relays each
//! to an agent on the same machine over `shm://` or `unix://` — so remote
//! clients reach an agent whose fast transports are local only, at the
//! cost of one more hop, and without the agent holding a network listener.
//!
//! It is made of pieces that exist: `transport`'s [`Listener`] and
//! [`StreamConn`](transport::StreamConn) on the client side, the `client`
//! library's session on the agent side. Each downstream session gets its
//! own upstream session, opened at its Hello with its token and limits, so
//! the agent's tenants, quotas and fair queues see every client of the
//! gateway as if it had come directly ([`upstream`]). Requests are checked
//! as the agent checks them, then forwarded without re-encoding the
//! tensors: over `shm://` their bytes are read from the socket straight
//! into the arena, and outputs are written to the socket straight from it;
//! over a socket upstream a request goes out as one `sendmsg` ([`relay`]).
//! When the agent is down or restarting, clients get `unavailable`
//! promptly, and sessions opened after it is back are relayed again.
//!
//! KServe v2 clients (`http://`, `grpc://` and their TLS forms) are served
//! by the agent's own front doors running in the gateway over remote
//! models ([`kserve`]): decoded once, sent on as native requests.
//!
//! ```
//! use gateway::{Gateway, GatewayOptions};
//! use transport::Endpoint;
//! # let dir = std::env::temp_dir().join(format!("tw-gateway-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # std::env::set_var("TENSORWIRE_SHM_DIR", &dir);
//! // The agent, listening on shm:// only (here in this process).
//! let mut cfg = server::AgentConfig::default();
//! cfg.add_listen("shm://agent")?;
//! let agent = server::Agent::start(cfg)?;
//!
//! let gw = Gateway::start(
//!     &[Endpoint::parse("tcp://127.0.0.1:0")?],
//!     "shm://agent",
//!     GatewayOptions::default(),
//! )?;
//! let remote = gw.endpoints()[0].to_string(); // tcp://127.0.0.1:PORT
//! let c = client::Client::connect(&remote)?;
//! let x = [1u8, 2, 3];
//! let r = c.model("identity")?.infer(&[client::TensorRef::from_slice(&[3], &x)?])?;
//! assert_eq!(r.outputs[0].bytes(), x);
//! drop(c);
//! gw.shutdown();
//! agent.shutdown(std::time::Duration::from_secs(5));
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod kserve;
pub mod relay;
pub mod upstream;

use client::{ClientOptions, Limits};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use transport::{Endpoint, Listener, ListenerWaker, StreamWriter, TransportError};
use upstream::Upstream;
use wire::{encode_error_body, BufPool, Header, Kind, Status};

/// How the gateway waits, times out and bounds itself.
#[derive(Clone, Debug)]
pub struct GatewayOptions {
    /// Caps on the limits offered to downstream clients (0 fields: the
    /// agent's). The agent's own limits always apply too.
    pub limits: Limits,
    /// How long a downstream read polls before it blocks (the gateway's
    /// `StreamConn::set_spin`); zero blocks at once.
    pub spin: Duration,
    /// How long a wait for the agent's answer polls before it sleeps.
    pub upstream_spin: Duration,
    /// How long a request may wait for the agent's answer before the
    /// client gets `unavailable`.
    pub upstream_timeout: Duration,
    /// How long opening an upstream session may take.
    pub connect_timeout: Duration,
    /// How long a new connection may take to send its Hello.
    pub handshake_timeout: Duration,
    /// How long a client may stall inside a message (or leave a response
    /// unread) before its connection is closed.
    pub stall_timeout: Duration,
    /// Downstream connections served at once; one more is refused
    /// (`limit-exceeded`) and closed.
    pub max_connections: usize,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            limits: Limits {
                max_tensors: 0,
                max_in_flight: 0,
                max_payload: 0,
                max_desc_len: 0,
            },
            spin: Duration::from_micros(50),
            upstream_spin: transport::shm::WaitPolicy::CLIENT.spin,
            upstream_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(10),
            max_connections: 1024,
        }
    }
}

/// What the accept threads and sessions share.
struct State {
    upstream: Upstream,
    opts: GatewayOptions,
    /// Request buffers for socket upstreams, recycled.
    pool: Arc<BufPool>,
    stopping: AtomicBool,
    live: AtomicUsize,
    /// Send handles of live sessions, to close them at shutdown.
    conns: Mutex<Vec<(u64, StreamWriter)>>,
    next_conn: std::sync::atomic::AtomicU64,
}

/// A running gateway: its listeners' accept threads and the sessions they
/// started. Stop it with [`Gateway::shutdown`] (dropping it does too).
pub struct Gateway {
    state: Arc<State>,
    endpoints: Vec<Endpoint>,
    wakers: Vec<ListenerWaker>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("endpoints", &self.endpoints)
            .field("upstream", &self.state.upstream.uri())
            .finish()
    }
}

impl Gateway {
    /// Binds every endpoint of `listen` (`tcp://`, `unix://`; a `tls://`
    /// listener is bound by the caller with [`Gateway::start_on`]) and
    /// relays the sessions they accept to the agent at `upstream`. The
    /// agent need not be up yet: sessions opened while it is down are
    /// refused `unavailable`.
    pub fn start(
        listen: &[Endpoint],
        upstream: &str,
        opts: GatewayOptions,
    ) -> Result<Gateway, TransportError> {
        let listeners = listen
            .iter()
            .map(Listener::bind)
            .collect::<Result<Vec<_>, _>>()?;
        Gateway::start_on(listeners, upstream, opts)
    }

    /// As [`Gateway::start`], on listeners already bound.
    pub fn start_on(
        listeners: Vec<Listener>,
        upstream: &str,
        opts: GatewayOptions,
    ) -> Result<Gateway, TransportError> {
        transport::Endpoint::parse(upstream)?;
        let client_opts = ClientOptions {
            timeout: opts.upstream_timeout,
            connect_timeout: opts.connect_timeout,
            spin: opts.upstream_spin,
            ..ClientOptions::default()
        };
        let state = Arc::new(State {
            upstream: Upstream::new(upstream, client_opts),
            pool: BufPool::new(256 << 20, 16),
            opts,
            stopping: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            conns: Mutex::new(Vec::new()),
            next_conn: std::sync::atomic::AtomicU64::new(1),
        });
        let mut gw = Gateway {
            state,
            endpoints: Vec::new(),
            wakers: Vec::new(),
            threads: Vec::new(),
        };
        for l in listeners {
            let io = |source| TransportError::Io {
                what: "listen on",
                endpoint: l.endpoint().to_string(),
                source,
            };
            gw.wakers.push(l.waker().map_err(io)?);
            gw.endpoints.push(l.endpoint().clone());
            let state = gw.state.clone();
            let t = std::thread::Builder::new()
                .name("tw-gw-accept".into())
                .spawn(move || accept_loop(&l, &state))
                .map_err(|e| TransportError::Io {
                    what: "listen on",
                    endpoint: "(accept thread)".into(),
                    source: e,
                })?;
            gw.threads.push(t);
        }
        Ok(gw)
    }

    /// The endpoints listened on (with the ports the system chose).
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// Downstream sessions open now.
    pub fn connections(&self) -> usize {
        self.state.live.load(Ordering::Acquire)
    }

    /// Stops accepting, closes every session, and waits (at most a few
    /// seconds) for their threads to end.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.state.stopping.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for (_, w) in lock(&self.state.conns).iter() {
            let _ = w.shutdown();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while self.state.live.load(Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if !self.state.stopping.load(Ordering::Acquire) {
            self.stop();
        }
    }
}

fn accept_loop(l: &Listener, state: &Arc<State>) {
    loop {
        let conn = match l.accept() {
            Ok(c) => c,
            Err(_) if state.stopping.load(Ordering::Acquire) => return,
            Err(e) => {
                // Out of descriptors or an aborted handshake: pause, go on.
                if !matches!(e.kind(), std::io::ErrorKind::ConnectionAborted) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
        };
        if state.live.fetch_add(1, Ordering::AcqRel) >= state.opts.max_connections {
            state.live.fetch_sub(1, Ordering::AcqRel);
            let msg = format!(
                "the gateway serves {} connections at most; try again later",
                state.opts.max_connections
            );
            let body = encode_error_body(&msg);
            let mut h = Header::new(Kind::Error);
            h.status = Status::LimitExceeded;
            h.desc_len = body.len() as u32;
            let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = conn.send(&h, &body, &[]);
            continue;
        }
        let key = state.next_conn.fetch_add(1, Ordering::Relaxed);
        if let Ok(w) = conn.writer() {
            lock(&state.conns).push((key, w));
        }
        let st = state.clone();
        let spawned = std::thread::Builder::new()
            .name("tw-gw-conn".into())
            .stack_size(256 << 10)
            .spawn(move || {
                relay::serve_connection(conn, &st.upstream, &st.opts, &st.pool);
                lock(&st.conns).retain(|(k, _)| *k != key);
                st.live.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            lock(&state.conns).retain(|(k, _)| *k != key);
            state.live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use client::{Client, DType, TensorRef};

    /// An in-process agent on a Unix socket, and a gateway in front of it
    /// on another.
    fn agent_and_gateway(dir: &std::path::Path) -> (server::Agent, Gateway) {
        let agent = server::Agent::start(server::AgentConfig {
            listen: vec![Endpoint::Unix(dir.join("agent.sock"))],
            ..server::AgentConfig::default()
        })
        .expect("agent");
        let up = format!("unix://{}", dir.join("agent.sock").display());
        let gw = Gateway::start(
            &[Endpoint::Unix(dir.join("gw.sock"))],
            &up,
            GatewayOptions::default(),
        )
        .expect("gateway");
        (agent, gw)
    }

    #[test]
    fn relays_a_session_and_closes_it_at_shutdown() {
        let dir = tempfile_dir();
        let (agent, gw) = agent_and_gateway(&dir);
        let uri = gw.endpoints()[0].to_string();
        let c = Client::connect(&uri).expect("client through the gateway");
        let m = c.model("identity").expect("identity");
        let x = [1u8, 2, 3, 4, 5];
        let r = m
            .infer(&[TensorRef::new(DType::U8, &[5], &x).expect("tensor")])
            .expect("identity through the gateway");
        assert_eq!(r.outputs[0].bytes(), &x);
        assert_eq!(gw.connections(), 1);
        gw.shutdown();
        assert!(c.ping().is_err(), "the session outlived the gateway");
        agent.shutdown(Duration::from_secs(1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_session_is_refused_unavailable_while_the_agent_is_down() {
        let dir = tempfile_dir();
        let up = format!("unix://{}", dir.join("none.sock").display());
        let gw = Gateway::start(
            &[Endpoint::Unix(dir.join("gw.sock"))],
            &up,
            GatewayOptions::default(),
        )
        .expect("gateway");
        match Client::connect(&gw.endpoints()[0].to_string()) {
            Err(client::ClientError::Remote { status, .. }) => {
                assert_eq!(status, Status::Unavailable)
            }
            other => panic!("expected unavailable, got {other:?}"),
        }
        gw.shutdown();
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        use std::sync::atomic::AtomicU64;
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "tw-gw-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).expect("temporary directory");
        d
    }
}
