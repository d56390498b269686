//! [`Client`]: one session with an agent, over a socket, shared memory or
//! in-process.
//!
//! Requests carry ids; responses may come back in any order and are matched
//! by id. There is no reader thread: a caller waiting for its response takes
//! the reader role, reads frames, keeps the ones meant for others in a map
//! and wakes them. A sender that finds the socket (or request ring) full
//! reads responses while it waits, so pipelining large requests cannot
//! deadlock against an agent that answers in order. The shared-memory
//! specifics (arena allocation, in-place outputs, releases) are in
//! [`crate::shm`].

use crate::completion::Completer;
use crate::error::ClientError;
use crate::ids::{IdMap, IdSet, PendingIds};
use crate::service_time::{ServiceTimes, WaitPlan};
use crate::shm::{Allocation, ShmLink};
use crate::tensor::{Tensor, TensorBuf, TensorBytes, TensorRef};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use transport::inproc::{InprocReply, InprocRequest, InprocService};
use transport::{Endpoint, RecvError, StreamConn, StreamWriter};
use wire::{
    decode_error_body, decode_hello, decode_model_list, decode_signature, decode_tensor_section,
    encode_model_name, encode_tensor_section, flags, layout_payload, monotonic_ns, BufPool, DType,
    Header, Kind, Limits, ModelSignature, PooledBuf, TensorDesc, Timeline, DESC_FIXED_LEN,
    MAX_DIMS,
};

/// The longest a client waits for anything (100 years): a longer timeout
/// is taken as this, so a deadline computed from it cannot overflow the
/// clock.
///
/// # Examples
///
/// ```
/// use client::{Client, TensorRef, MAX_WAIT};
/// use std::time::Duration;
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("inproc://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("inproc://doc")?;
/// let x = [0f32; 64];
/// let ticket = c.model("identity")?.submit(&[TensorRef::from_slice(&[1, 64], &x)?])?;
/// // "Forever": a longer wait is taken as MAX_WAIT, so no deadline overflows.
/// assert!(Duration::MAX > MAX_WAIT);
/// let response = ticket.wait_timeout(Duration::MAX)?;
/// assert_eq!(response.outputs[0].shape, [1, 64]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const MAX_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How a client connects and waits. (`Debug` shows whether a token is
/// set, never the token.)
///
/// # Examples
///
/// ```
/// use client::{Client, ClientOptions, Limits};
/// use std::time::Duration;
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("inproc://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let opts = ClientOptions {
///     timeout: Duration::from_secs(5),
///     // Ask for at most 8 requests in flight (0 fields: the agent's limit).
///     limits: Limits { max_in_flight: 8, ..ClientOptions::default().limits },
///     token: Some("s3cret-token".into()),
///     ..ClientOptions::default()
/// };
/// // Debug output never shows the token.
/// assert!(!format!("{opts:?}").contains("s3cret"));
/// let c = Client::connect_with("inproc://doc", opts)?;
/// assert_eq!(c.limits().max_in_flight, 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ClientOptions {
    /// How long a call waits for its response before [`ClientError::Timeout`].
    pub timeout: Duration,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// Limits to ask the agent for (0 fields = the agent's).
    pub limits: Limits,
    /// Ask the agent for each request's timeline.
    pub want_timeline: bool,
    /// How long a call waiting for its response polls (the ring, or the
    /// socket with non-blocking `recv`s) before it blocks; zero blocks at
    /// once. Polling saves the wake-up (tens of µs on a virtual machine)
    /// when the response comes within the budget, and burns this core
    /// meanwhile; over a socket, a connection whose responses keep coming
    /// later stops polling by itself (`transport::spin::SpinGate`). For a
    /// model whose answers take longer but come on time, a call sleeps
    /// until shortly before the answer is due and polls only then (see
    /// the README, "Waiting for an answer"); zero turns that off too.
    pub spin: Duration,
    /// The bearer token that names this client's tenant in the agent (its
    /// Hello carries it; 1..=1024 bytes). `None`: the agent knows the
    /// client by its uid (unix, shm) or not at all (tcp). Tools read it
    /// from `--token` or the `TENSORWIRE_TOKEN` environment variable.
    pub token: Option<String>,
    /// Marks the session as relayed for a client this process could not
    /// identify (`wire::HELLO_ANONYMOUS`): the agent then knows it by its
    /// token only, never by this process's own uid. For relays (the
    /// gateway); an ordinary client leaves it off.
    pub anonymous: bool,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("limits", &self.limits)
            .field("want_timeline", &self.want_timeline)
            .field("spin", &self.spin)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("anonymous", &self.anonymous)
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            limits: Limits {
                max_tensors: 0,
                max_in_flight: 0,
                max_payload: 0,
                max_desc_len: 0,
            },
            want_timeline: false,
            spin: transport::shm::WaitPolicy::CLIENT.spin,
            token: None,
            anonymous: false,
        }
    }
}

/// A received message: header, descriptor section, payload.
pub(crate) struct Frame {
    header: Header,
    desc: Vec<u8>,
    payload: Payload,
    /// `CLOCK_MONOTONIC` ns when the header had been read (0 unless the
    /// client asks for timelines).
    received_ns: u64,
}

enum Payload {
    Contiguous(PooledBuf),
    PerTensor(Vec<PooledBuf>),
    /// Shared memory: the tensors are in the arena where the descriptors say.
    Arena,
}

/// Tensor bytes the client itself has copied in user space, per session.
///
/// Over `shm://`, inputs sent with [`Client::alloc_tensor`] cost nothing and
/// any other input is copied into the arena once; outputs are read in place.
/// Over `unix://`/`tcp://` inputs go out straight from the caller's memory
/// and responses are read by the kernel into their final buffer: the only
/// user-space move is of the payload bytes that arrived in the 8 KiB header
/// staging buffer (`staged_bytes`). Over `inproc://` the agent copies what
/// it must (outputs that alias inputs), not the client.
///
/// # Examples
///
/// ```
/// use client::{Client, DType, TensorRef};
/// # let dir = tempfile::tempdir()?;
/// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("shm://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("shm://doc")?;
/// let model = c.model("identity")?;
/// // An ordinary slice is copied into the arena once...
/// let x = [1f32; 256];
/// model.infer(&[TensorRef::from_slice(&[256], &x)?])?;
/// // ...a tensor allocated in the arena is not copied at all.
/// let mut y = c.alloc_tensor(DType::F32, &[256])?;
/// y.as_mut_slice::<f32>()?.fill(2.0);
/// model.infer(&[y.as_ref()])?;
/// let stats = c.copy_stats();
/// assert_eq!(stats.requests, 2);
/// assert_eq!(stats.input_bytes_copied, 1024);
/// assert_eq!(stats.output_bytes_copied, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Input tensor bytes copied by the client (shm copy-in).
    pub input_bytes_copied: u64,
    /// Output tensor bytes copied by the client (none on any transport
    /// today: outputs are read where they landed).
    pub output_bytes_copied: u64,
    /// Requests sent.
    pub requests: u64,
    /// Response payload bytes moved out of the socket's staging buffer
    /// (`transport::StreamStats::staged_payload_bytes`; sockets only).
    pub staged_bytes: u64,
}

#[derive(Default)]
struct CopyCounters {
    input: AtomicU64,
    output: AtomicU64,
    requests: AtomicU64,
    staged: AtomicU64,
}

/// The shape of a shared-memory session's arena, and how much of the
/// client's region is free.
///
/// # Examples
///
/// ```
/// use client::{Client, DType};
/// # let dir = tempfile::tempdir()?;
/// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("shm://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("shm://doc")?;
/// let info = c.shm_info().ok_or("not a shared-memory session")?;
/// assert_eq!(info.client_free, info.client_len);
/// let x = c.alloc_tensor(DType::U8, &[4096])?;
/// let now = c.shm_info().ok_or("not a shared-memory session")?;
/// assert!(now.client_free <= info.client_len - x.len());
/// drop(x);
/// assert_eq!(c.shm_info().map(|i| i.client_free), Some(info.client_len));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmInfo {
    /// Bytes of the client's region (input tensors).
    pub client_len: usize,
    /// Bytes of the agent's region (outputs).
    pub agent_len: usize,
    /// Free bytes in the client region now.
    pub client_free: usize,
    /// The largest free block in the client region now.
    pub client_largest_free: usize,
}

/// A model's outputs, with the agent's timeline when asked for.
///
/// # Examples
///
/// ```
/// use client::{Client, Stage, TensorRef};
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("inproc://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("inproc://doc")?;
/// let x = [1i64, 2, 3];
/// let r = c.model("identity")?.infer_timed(&[TensorRef::from_slice(&[3], &x)?])?;
/// assert_eq!(r.outputs.len(), 1);
/// assert_eq!(r.outputs[0].to_vec::<i64>()?, x);
/// // The agent's stamps and the client's, on the same clock.
/// let t = r.timeline.ok_or("no timeline")?;
/// assert!(r.client_start_ns <= t.get(Stage::Received));
/// assert!(t.get(Stage::ResponseSent) <= r.client_done_ns);
/// assert_eq!(r.input_mover, None); // only shm:// moves inputs itself
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Response {
    /// Outputs in the model's output order.
    pub outputs: Vec<Tensor>,
    /// The agent's stamps, if the request asked for them
    /// ([`ClientOptions::want_timeline`], [`Model::infer_timed`]).
    pub timeline: Option<Timeline>,
    /// `CLOCK_MONOTONIC` ns just before the request was encoded (0 unless
    /// the request asked for its timeline: the four client stamps cost a
    /// clock read each).
    pub client_start_ns: u64,
    /// `CLOCK_MONOTONIC` ns when the request had been handed to the
    /// transport (0 unless timed).
    pub client_sent_ns: u64,
    /// `CLOCK_MONOTONIC` ns when the response header had been read (0 unless
    /// timed).
    pub client_received_ns: u64,
    /// `CLOCK_MONOTONIC` ns when the response was complete (0 unless
    /// timed).
    pub client_done_ns: u64,
    /// Over `shm://`: the data mover that put the request's largest input
    /// into the arena (`Zero` when it already lay there); `None` on other
    /// transports. Part of the request's timeline record.
    pub input_mover: Option<transport::mover::Mover>,
}

/// A model as listed by the agent.
///
/// # Examples
///
/// ```
/// use client::Client;
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("inproc://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("inproc://doc")?;
/// let info = c
///     .models()?
///     .into_iter()
///     .find(|m| m.signature.name == "identity")
///     .ok_or("identity is always served")?;
/// assert_eq!(c.model("identity")?.id(), info.id);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// The id requests use.
    pub id: u32,
    /// Name, inputs and outputs.
    pub signature: ModelSignature,
}

/// Why a stream session is over: every later call fails with it.
#[derive(Clone)]
struct Death {
    why: String,
    /// The peer sent bytes that are not the protocol (another server on
    /// that port, or a broken agent), not a clean end or an I/O failure.
    protocol: bool,
}

impl Death {
    fn gone(why: String) -> Death {
        Death {
            why,
            protocol: false,
        }
    }

    /// The error a call that finds the session dead returns.
    fn error(&self) -> ClientError {
        if self.protocol {
            ClientError::Protocol(self.why.clone())
        } else {
            ClientError::AgentGone(self.why.clone())
        }
    }
}

struct Shared {
    completed: IdMap<Frame>,
    abandoned: IdSet,
    reading: bool,
    dead: Option<Death>,
    /// Ids of requests sent and not yet answered (control messages excluded).
    pending: PendingIds,
    /// Callers blocked on the condition variable: notifying it is a
    /// `futex` call even when no one waits (~1 µs here, a sixth of a
    /// polling Unix-socket round trip), so it is made only when one does.
    waiting: usize,
}

impl StreamLink {
    /// Wakes the callers waiting for the reader role or their response,
    /// if any; `sh` is the state just changed, still locked.
    fn wake(&self, sh: &Shared) {
        if sh.waiting > 0 {
            self.cv.notify_all();
        }
    }
}

struct StreamLink {
    writer: Mutex<StreamWriter>,
    reader: Mutex<StreamConn>,
    shared: Mutex<Shared>,
    cv: Condvar,
}

enum Link {
    Stream(Box<StreamLink>),
    Inproc {
        service: Arc<dyn InprocService>,
        replies: Mutex<IdMap<InprocReply>>,
    },
    Shm(Box<ShmLink>),
}

pub(crate) struct Inner {
    link: Link,
    pub(crate) uri: String,
    pub(crate) opts: ClientOptions,
    limits: Limits,
    recv_limits: Limits,
    next_id: AtomicU64,
    /// Recycled response buffers: a dropped response gives its buffer back.
    pool: Arc<BufPool>,
    stats: CopyCounters,
    /// The thread that completes callbacks and futures, started by the
    /// first of them ([`crate::completion`]).
    pub(crate) completer: Completer,
    /// How long each kind of request's answers take: whether a wait polls
    /// at once or sleeps through the compute first ([`crate::service_time`]).
    service_times: ServiceTimes,
}

/// A session with an agent. Cheap to clone; clones share the connection.
///
/// # Examples
///
/// ```
/// use client::{Client, TensorRef};
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("inproc://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("inproc://doc")?;
/// // Clones share the session: use one per thread.
/// let threads: Vec<_> = (0..4u32)
///     .map(|i| {
///         let c = c.clone();
///         std::thread::spawn(move || -> Result<Vec<u32>, client::ClientError> {
///             let x = [i; 4];
///             let r = c.model("identity")?.infer(&[TensorRef::from_slice(&[4], &x)?])?;
///             r.outputs[0].to_vec()
///         })
///     })
///     .collect();
/// for (i, t) in threads.into_iter().enumerate() {
///     let out = t.join().map_err(|_| "a thread panicked")??;
///     assert_eq!(out, [i as u32; 4]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Client({})", self.inner.uri)
    }
}

/// A model resolved on a session: its id and signature, and what its
/// requests ask of the agent's queue ([`with_priority`](Model::with_priority),
/// [`with_queue_timeout`](Model::with_queue_timeout)).
///
/// # Examples
///
/// ```
/// use client::{Client, TensorRef};
/// use std::time::Duration;
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("inproc://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("inproc://doc")?;
/// let model = c
///     .model("identity")?
///     .with_queue_timeout(Duration::from_millis(100));
/// let x = [0.5f32; 8];
/// let r = model.infer(&[TensorRef::from_slice(&[2, 4], &x)?])?;
/// assert_eq!(r.outputs[0].shape, [2, 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Model {
    client: Client,
    info: ModelInfo,
    /// Priority level of its requests (0: the model's default).
    priority: u8,
    /// Queue timeout of its requests, µs (0: the model's default).
    timeout_us: u32,
}

/// A request in flight. Wait for it with [`Ticket::wait`]; dropping it
/// discards the response when it comes.
///
/// # Examples
///
/// ```
/// use client::{Client, TensorRef};
/// # let mut cfg = server::AgentConfig::default();
/// # cfg.add_listen("inproc://doc")?;
/// # let _agent = server::Agent::start(cfg)?;
/// let c = Client::connect("inproc://doc")?;
/// let model = c.model("identity")?;
/// let inputs: Vec<[u8; 4]> = (0..8).map(|i| [i; 4]).collect();
/// // Eight requests in flight on one session, then their answers.
/// let mut tickets = Vec::new();
/// for x in &inputs {
///     tickets.push(model.submit(&[TensorRef::from_slice(&[4], x)?])?);
/// }
/// for (t, x) in tickets.into_iter().zip(&inputs) {
///     assert_eq!(t.wait()?.outputs[0].bytes(), x);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a ticket's response is discarded unless it is waited for"]
pub struct Ticket {
    client: Client,
    sent: Sent,
    waited: bool,
}

/// A request on its way: what waiting for its answer needs.
/// [`Model::infer`] waits on it directly; [`Model::submit`] wraps it in a
/// [`Ticket`], which holds the client (an `Arc` clone: two atomic
/// operations a request, saved when the caller waits at once).
pub(crate) struct Sent {
    pub(crate) id: u64,
    /// Whether the request asked for its timeline (and the client stamps).
    timed: bool,
    start_ns: u64,
    sent_ns: u64,
    /// Shared memory: the arena allocations the request reads, held until
    /// its response has come (outputs that alias them hold them longer).
    pub(crate) pins: Vec<Arc<Allocation>>,
    /// Shared memory: the mover of the largest input.
    mover: Option<transport::mover::Mover>,
    /// Shared memory and sockets: how the wait for the answer should go.
    pub(crate) plan: Option<WaitPlan>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ticket({})", self.sent.id)
    }
}

impl Client {
    /// Connects to `uri` with default options.
    ///
    /// # Examples
    ///
    /// An agent embedded in this process, reached over `inproc://`:
    ///
    /// ```
    /// use client::Client;
    /// let mut cfg = server::AgentConfig::default();
    /// cfg.add_listen("inproc://doc-agent")?;
    /// let agent = server::Agent::start(cfg)?;
    ///
    /// let c = Client::connect("inproc://doc-agent")?;
    /// assert_eq!(c.uri(), "inproc://doc-agent");
    /// # drop(c);
    /// # agent.shutdown(std::time::Duration::from_secs(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect(uri: &str) -> Result<Client, ClientError> {
        Client::connect_with(uri, ClientOptions::default())
    }

    /// Connects to `uri` and exchanges the session hello. Timeouts over
    /// [`MAX_WAIT`] are taken as `MAX_WAIT`.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, ClientOptions, TensorRef};
    /// use std::time::Duration;
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let opts = ClientOptions {
    ///     timeout: Duration::from_secs(2),
    ///     want_timeline: true, // every request brings back the agent's stamps
    ///     ..ClientOptions::default()
    /// };
    /// let c = Client::connect_with("inproc://doc", opts)?;
    /// let x = [7u8; 16];
    /// let r = c.model("identity")?.infer(&[TensorRef::from_slice(&[16], &x)?])?;
    /// assert!(r.timeline.is_some());
    /// // A URI with no agent behind it is an error, not a hang.
    /// let e = Client::connect_with("inproc://nobody-here", ClientOptions::default());
    /// assert!(matches!(e, Err(client::ClientError::Connect(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect_with(uri: &str, mut opts: ClientOptions) -> Result<Client, ClientError> {
        opts.timeout = opts.timeout.min(MAX_WAIT);
        opts.connect_timeout = opts.connect_timeout.min(MAX_WAIT);
        let ep = Endpoint::parse(uri)?;
        if let Some(t) = &opts.token {
            wire::check_token(t.as_bytes())
                .map_err(|e| ClientError::InvalidInput(format!("token: {e}")))?;
        }
        let mut shm_limits = None;
        let link = match &ep {
            Endpoint::Shm(name) => {
                let path = transport::shm::control_path(name).map_err(|source| {
                    transport::TransportError::Io {
                        what: "connect to",
                        endpoint: ep.to_string(),
                        source,
                    }
                })?;
                // The Hello travels over the control socket; its id is 1.
                let (link, limits) = ShmLink::connect(
                    &path,
                    &ep.to_string(),
                    &opts,
                    1,
                    transport::mover_param(uri),
                )?;
                shm_limits = Some(limits);
                Link::Shm(Box::new(link))
            }
            Endpoint::Inproc(name) => Link::Inproc {
                service: transport::inproc::lookup(name)
                    .ok_or_else(|| transport::TransportError::NoInprocAgent(name.clone()))?,
                replies: Mutex::new(IdMap::default()),
            },
            _ => {
                let mut conn = transport::connect(&ep, opts.connect_timeout)?;
                conn.set_spin(opts.spin);
                let gone = |e: std::io::Error| ClientError::AgentGone(e.to_string());
                conn.set_read_timeout(Some(opts.timeout)).map_err(gone)?;
                conn.set_write_timeout(Some(opts.timeout)).map_err(gone)?;
                Link::Stream(Box::new(StreamLink {
                    writer: Mutex::new(conn.writer().map_err(gone)?),
                    reader: Mutex::new(conn),
                    shared: Mutex::new(Shared {
                        completed: IdMap::default(),
                        abandoned: IdSet::default(),
                        reading: false,
                        dead: None,
                        pending: PendingIds::default(),
                        waiting: 0,
                    }),
                    cv: Condvar::new(),
                }))
            }
        };
        let mut inner = Inner {
            link,
            uri: ep.to_string(),
            // Until the HelloAck says otherwise, the defaults (PROTOCOL.md §11).
            recv_limits: Limits::default(),
            opts,
            limits: Limits::default(),
            next_id: AtomicU64::new(1),
            pool: BufPool::new(256 << 20, 8),
            stats: CopyCounters::default(),
            completer: Completer::default(),
            service_times: ServiceTimes::default(),
        };
        if let (Some(limits), Link::Shm(s)) = (shm_limits, &inner.link) {
            inner.next_id.store(2, Ordering::Relaxed);
            inner.limits = limits;
            // A response's outputs lie anywhere in the data area (aliased
            // inputs in the client region, the rest in the agent's).
            inner.recv_limits = limits;
            inner.recv_limits.max_payload = limits.max_payload.max(s.layout().data_len as u64);
            return Ok(Client {
                inner: Arc::new(inner),
            });
        }
        let hello = wire::encode_hello_as(
            &inner.opts.limits,
            inner.opts.token.as_deref().map(str::as_bytes),
            inner.opts.anonymous,
        );
        let mut h = Header::new(Kind::Hello);
        h.desc_len = hello.len() as u32;
        let frame = match inner.roundtrip(h, &hello) {
            Ok(f) => f,
            Err(ClientError::AgentGone(msg)) => return Err(inner.refusal_or(msg)),
            Err(e) => return Err(e),
        };
        expect_kind(&frame, Kind::HelloAck)?;
        inner.limits =
            decode_hello(&frame.desc).map_err(|e| ClientError::Protocol(e.to_string()))?;
        // From now on the agent's messages must fit the limits in force.
        inner.recv_limits = inner.limits;
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// The endpoint this client is connected to.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::Client;
    /// # let dir = tempfile::tempdir()?;
    /// # let sock = dir.path().join("agent.sock");
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen(&format!("unix://{}", sock.display()))?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let uri = format!("unix://{}", sock.display());
    /// let c = Client::connect(&uri)?;
    /// assert_eq!(c.uri(), uri);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn uri(&self) -> &str {
        &self.inner.uri
    }

    /// The limits in force for this session.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, ClientOptions, Limits};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// // Asking for nothing gets the agent's limits...
    /// let c = Client::connect("inproc://doc")?;
    /// assert_eq!(c.limits(), Limits::default());
    /// // ...asking for less gets less.
    /// let asked = Limits { max_payload: 1 << 20, ..Limits::default() };
    /// let opts = ClientOptions { limits: asked, ..ClientOptions::default() };
    /// let small = Client::connect_with("inproc://doc", opts)?;
    /// assert_eq!(small.limits().max_payload, 1 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// Looks a model up by name.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, ClientError, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # cfg.models.push(server::ModelConfig::new(
    /// #     "digits",
    /// #     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
    /// # ));
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let digits = c.model("digits")?;
    /// let x = &digits.signature().inputs[0];
    /// assert_eq!((x.name.as_str(), x.dtype), ("x", DType::F32));
    /// assert_eq!(x.shape, [None, Some(64)]); // any batch of 64 pixels
    /// assert!(matches!(c.model("no-such-model"), Err(ClientError::UnknownModel(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn model(&self, name: &str) -> Result<Model, ClientError> {
        if name.is_empty() || name.len() > wire::MAX_NAME_LEN {
            return Err(ClientError::UnknownModel(format!(
                "'{name}' is not a valid model name"
            )));
        }
        let body = encode_model_name(name);
        let mut h = Header::new(Kind::ModelQuery);
        h.desc_len = body.len() as u32;
        let f = self.inner.roundtrip(h, &body)?;
        expect_kind(&f, Kind::ModelInfo)?;
        let signature =
            decode_signature(&f.desc).map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok(Model {
            client: self.clone(),
            info: ModelInfo {
                id: f.header.model_id,
                signature,
            },
            priority: 0,
            timeout_us: 0,
        })
    }

    /// A handle on the model with id `id` on this session, without looking
    /// it up: its signature is empty, so its requests are not checked here
    /// (the agent checks them, and answers `unknown-model` for an id it
    /// does not know). For relays that forward requests whose model ids
    /// their own clients resolved on this session (the gateway); anyone
    /// else should use [`Client::model`].
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let id = c.model("identity")?.id();
    /// // A relay got this id from its own client: no lookup, no signature.
    /// let m = c.model_by_id(id);
    /// assert!(m.signature().inputs.is_empty());
    /// let x = [3u8; 8];
    /// assert_eq!(m.infer(&[TensorRef::from_slice(&[8], &x)?])?.outputs[0].bytes(), x);
    /// // An id the agent does not know is its answer, not the client's.
    /// let none = c.model_by_id(9999).infer(&[TensorRef::from_slice(&[8], &x)?]);
    /// assert!(matches!(none, Err(client::ClientError::UnknownModel(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn model_by_id(&self, id: u32) -> Model {
        Model {
            client: self.clone(),
            info: ModelInfo {
                id,
                signature: ModelSignature {
                    name: String::new(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                },
            },
            priority: 0,
            timeout_us: 0,
        }
    }

    /// Sends a Request that is already encoded for a stream transport —
    /// its header `h`, descriptor section `desc` and whole `payload` (the
    /// tensors at their offsets, padding included) — as one write, with
    /// `h.request_id` replaced by one of this session's ids. For relays (the
    /// gateway) that forward a request without re-encoding it: the caller
    /// has validated the descriptors (the agent validates them again).
    /// Only on `unix://`, `tcp://` and `tls://` sessions; over `shm://`
    /// tensors travel in the arena ([`Client::alloc_tensor`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::Client;
    /// use wire::{encode_tensor_section, DType, Header, Kind, TensorDesc};
    /// # let dir = tempfile::tempdir()?;
    /// # let sock = dir.path().join("agent.sock");
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen(&format!("unix://{}", sock.display()))?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect(&format!("unix://{}", sock.display()))?;
    /// let model = c.model("identity")?;
    /// // A request as it arrived from a downstream client: header, descriptors,
    /// // payload.
    /// let payload = [1u8, 2, 3, 4];
    /// let tensors = [TensorDesc { dtype: DType::U8, shape: vec![4], offset: 0, len: 4 }];
    /// let mut desc = Vec::new();
    /// encode_tensor_section(&tensors, None, &mut desc);
    /// let mut h = Header::new(Kind::Request);
    /// h.request_id = 77; // replaced by one of this session's ids
    /// h.model_id = model.id();
    /// h.tensor_count = 1;
    /// h.desc_len = desc.len() as u32;
    /// h.payload_len = payload.len() as u64;
    /// let r = c.submit_encoded(&h, &desc, &payload)?.wait()?;
    /// assert_eq!(r.outputs[0].bytes(), payload);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit_encoded(
        &self,
        h: &Header,
        desc: &[u8],
        payload: &[u8],
    ) -> Result<Ticket, ClientError> {
        let inner = &self.inner;
        if !matches!(inner.link, Link::Stream(_)) {
            return Err(ClientError::InvalidInput(
                "submit_encoded needs a socket session (unix://, tcp://, tls://)".into(),
            ));
        }
        if h.kind != Kind::Request
            || payload.len() as u64 != h.payload_len
            || desc.len() != h.desc_len as usize
        {
            return Err(ClientError::InvalidInput(
                "not a Request, or its lengths do not match its header".into(),
            ));
        }
        h.check_limits(&inner.limits)
            .map_err(|e| ClientError::LimitExceeded(e.to_string()))?;
        let timed = h.flags & flags::WANT_TIMELINE != 0;
        let start_ns = stamp_if(timed);
        let mut h = *h;
        h.request_id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        inner.send(&h, desc, &[payload])?;
        inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        Ok(Ticket {
            client: self.clone(),
            sent: Sent {
                id: h.request_id,
                timed,
                start_ns,
                sent_ns: stamp_if(timed),
                pins: Vec::new(),
                mover: None,
                plan: None,
            },
            waited: false,
        })
    }

    /// Lists every model the agent serves.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::Client;
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # cfg.models.push(server::ModelConfig::new(
    /// #     "digits",
    /// #     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
    /// # ));
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let mut names: Vec<String> = c.models()?.into_iter().map(|m| m.signature.name).collect();
    /// names.sort();
    /// assert_eq!(names, ["digits", "identity"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn models(&self) -> Result<Vec<ModelInfo>, ClientError> {
        let f = self.inner.roundtrip(Header::new(Kind::ListModels), &[])?;
        expect_kind(&f, Kind::ModelList)?;
        Ok(decode_model_list(&f.desc)
            .map_err(|e| ClientError::Protocol(e.to_string()))?
            .into_iter()
            .map(|(id, signature)| ModelInfo { id, signature })
            .collect())
    }

    /// One Ping/Pong round trip; returns how long it took.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::Client;
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let rtt = c.ping()?; // an error if the agent does not answer in time
    /// println!("empty round trip: {rtt:?}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ping(&self) -> Result<Duration, ClientError> {
        let t = Instant::now();
        let f = self.inner.roundtrip(Header::new(Kind::Ping), &[])?;
        expect_kind(&f, Kind::Pong)?;
        Ok(t.elapsed())
    }

    /// Waits for a submitted request (same as [`Ticket::wait`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let x = [1u16, 2, 3];
    /// let ticket = c.model("identity")?.submit(&[TensorRef::from_slice(&[3], &x)?])?;
    /// let r = c.wait(ticket)?;
    /// assert_eq!(r.outputs[0].to_vec::<u16>()?, x);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(&self, ticket: Ticket) -> Result<Response, ClientError> {
        ticket.wait()
    }

    /// A tensor of `dtype` and `shape` for the caller to fill in place and
    /// send with [`TensorBuf::as_ref`]. Over `shm://` it is allocated in the
    /// session's arena, so sending it copies nothing (a full arena is
    /// [`ClientError::LimitExceeded`]); elsewhere it is an ordinary 64-byte
    /// aligned buffer, so the same code runs on every transport.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let dir = tempfile::tempdir()?;
    /// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("shm://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("shm://doc")?;
    /// let mut x = c.alloc_tensor(DType::F32, &[2, 3])?;
    /// assert!(x.in_arena());
    /// x.as_mut_slice::<f32>()?.copy_from_slice(&[1., 2., 3., 4., 5., 6.]);
    /// let r = c.model("identity")?.infer(&[x.as_ref()])?;
    /// assert_eq!(r.outputs[0].as_slice::<f32>()?, [1., 2., 3., 4., 5., 6.]);
    /// assert_eq!(c.copy_stats().input_bytes_copied, 0); // read where it lay
    /// // More than the session allows is refused before anything is allocated.
    /// let huge = c.alloc_tensor(DType::F64, &[1 << 40]);
    /// assert!(matches!(huge, Err(client::ClientError::LimitExceeded(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn alloc_tensor(&self, dtype: DType, shape: &[u64]) -> Result<TensorBuf, ClientError> {
        if shape.len() > MAX_DIMS {
            return Err(ClientError::InvalidInput(format!(
                "{} dims, at most {MAX_DIMS} allowed",
                shape.len()
            )));
        }
        let len = TensorDesc::byte_len(dtype, shape)
            .ok_or_else(|| ClientError::InvalidInput(format!("shape {shape:?} overflows")))?;
        let max = self.inner.limits.max_payload;
        if len > max {
            return Err(ClientError::LimitExceeded(format!(
                "a {dtype}{shape:?} tensor is {len} bytes, the session allows {max}"
            )));
        }
        let len = usize::try_from(len)
            .map_err(|_| ClientError::LimitExceeded(format!("{len} bytes do not fit memory")))?;
        match &self.inner.link {
            Link::Shm(s) => {
                let a = s
                    .allocator()
                    .alloc(len)
                    .map_err(crate::shm::NoSpace::into_error)?;
                Ok(TensorBuf::arena(dtype, shape, len, a))
            }
            _ => TensorBuf::heap(dtype, shape, len),
        }
    }

    /// Tensor bytes this client has copied in user space so far (see
    /// [`CopyStats`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let dir = tempfile::tempdir()?;
    /// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("shm://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("shm://doc")?;
    /// let x = [0u8; 100];
    /// c.model("identity")?.infer(&[TensorRef::from_slice(&[100], &x)?])?;
    /// let s = c.copy_stats();
    /// assert_eq!((s.requests, s.input_bytes_copied), (1, 100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn copy_stats(&self) -> CopyStats {
        let s = &self.inner.stats;
        CopyStats {
            input_bytes_copied: s.input.load(Ordering::Relaxed),
            output_bytes_copied: s.output.load(Ordering::Relaxed),
            requests: s.requests.load(Ordering::Relaxed),
            staged_bytes: s.staged.load(Ordering::Relaxed),
        }
    }

    /// Input tensors (and their bytes) per data mover on a `shm://`
    /// session: `zero` for inputs sent where they lay in the arena, the
    /// others for inputs moved in (`shm://name?mover=...`; all zero on
    /// other transports, where the kernel moves the bytes).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType, TensorRef};
    /// use transport::mover::Mover;
    /// # let dir = tempfile::tempdir()?;
    /// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("shm://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// // Copy inputs with plain memcpy (the default, `auto`, asks the policy).
    /// let c = Client::connect("shm://doc?mover=memcpy")?;
    /// let model = c.model("identity")?;
    /// let x = [0f32; 1024];
    /// model.infer(&[TensorRef::from_slice(&[1024], &x)?])?;
    /// let y = c.alloc_tensor(DType::F32, &[1024])?;
    /// model.infer(&[y.as_ref()])?;
    /// let m = c.mover_stats();
    /// assert_eq!((m.copies_of(Mover::Memcpy), m.bytes_of(Mover::Memcpy)), (1, 4096));
    /// assert_eq!((m.copies_of(Mover::Zero), m.bytes_of(Mover::Zero)), (1, 4096));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mover_stats(&self) -> transport::mover::MoverStats {
        match &self.inner.link {
            Link::Shm(s) => s.mover_stats(),
            _ => transport::mover::MoverStats::default(),
        }
    }

    /// The arena's regions and the client region's free space, on a
    /// `shm://` session (`None` on other transports).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::Client;
    /// # let dir = tempfile::tempdir()?;
    /// # std::env::set_var("TENSORWIRE_SHM_DIR", dir.path());
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("shm://doc")?;
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let info = Client::connect("shm://doc")?.shm_info().ok_or("not shm")?;
    /// assert!(info.client_len > 0 && info.agent_len > 0);
    /// assert_eq!(info.client_largest_free, info.client_len);
    /// assert_eq!(Client::connect("inproc://doc")?.shm_info(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shm_info(&self) -> Option<ShmInfo> {
        match &self.inner.link {
            Link::Shm(s) => {
                let (client_free, client_largest_free) = s.allocator().usage();
                Some(ShmInfo {
                    client_len: s.allocator().len(),
                    agent_len: s.layout().agent_len(),
                    client_free,
                    client_largest_free,
                })
            }
            _ => None,
        }
    }
}

impl Model {
    /// The model's id on this session.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::Client;
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let id = c.model("identity")?.id();
    /// assert!(c.models()?.iter().any(|m| m.id == id && m.signature.name == "identity"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn id(&self) -> u32 {
        self.info.id
    }

    /// The model's name, inputs and outputs.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, DType};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # cfg.models.push(server::ModelConfig::new(
    /// #     "digits",
    /// #     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
    /// # ));
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let sig = c.model("digits")?.signature().clone();
    /// assert_eq!(sig.name, "digits");
    /// assert_eq!(sig.outputs[0].describe(), "float32[?, 10]");
    /// // The client checks a request against it before sending anything.
    /// assert!(sig.check_inputs([(DType::F32, &[1u64, 64][..])].into_iter()).is_ok());
    /// assert!(sig.check_inputs([(DType::F64, &[1u64, 64][..])].into_iter()).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn signature(&self) -> &ModelSignature {
        &self.info.signature
    }

    /// This handle with its requests at priority `level`: 1 is the
    /// highest, up to the model's `priority_levels`; 0 the model's default
    /// level. The agent serves higher levels first (with aging, so lower
    /// ones are not starved); a level the model does not have is refused
    /// (`InvalidInput`).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, ClientError, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// let mut digits = server::ModelConfig::new(
    ///     "digits",
    ///     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
    /// );
    /// digits.priority_levels = 2; // in the agent's config
    /// # cfg.models.push(digits);
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let x = [0f32; 64];
    /// let urgent = c.model("digits")?.with_priority(1);
    /// assert_eq!(urgent.infer(&[TensorRef::from_slice(&[1, 64], &x)?])?.outputs[0].shape, [1, 10]);
    /// // A level the model does not have is refused.
    /// let r = c.model("digits")?.with_priority(3).infer(&[TensorRef::from_slice(&[1, 64], &x)?]);
    /// assert!(matches!(r, Err(ClientError::InvalidInput(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_priority(mut self, level: u8) -> Model {
        self.priority = level;
        self
    }

    /// This handle with its requests waiting at most `timeout` in the
    /// agent's queue for the model: past it a request is answered
    /// [`ClientError::QueueTimeout`] and never computed; the model's own
    /// default timeout, when it has one, caps it. Zero: the model's default.
    /// Whole µs, rounded up, at most `u32::MAX` µs (~71 min; longer is cut
    /// to that). The client's own wait ([`ClientOptions::timeout`]) is
    /// separate and should be longer.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// use std::time::Duration;
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// // Not worth computing if it cannot start within 20 ms (the answer would
    /// // then be ClientError::QueueTimeout).
    /// let model = c.model("identity")?.with_queue_timeout(Duration::from_millis(20));
    /// let x = [1u8; 4];
    /// assert_eq!(model.infer(&[TensorRef::from_slice(&[4], &x)?])?.outputs[0].bytes(), x);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_queue_timeout(mut self, timeout: Duration) -> Model {
        // A part of a µs counts as a whole one: it is not 0 (the default).
        let us = timeout.as_nanos().div_ceil(1000);
        self.timeout_us = u32::try_from(us).unwrap_or(u32::MAX);
        self
    }

    /// Runs the model on `inputs` (in signature order) and waits for the outputs.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # cfg.models.push(server::ModelConfig::new(
    /// #     "digits",
    /// #     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
    /// # ));
    /// # let _agent = server::Agent::start(cfg)?;
    /// # let read_f32 = |name: &str| -> std::io::Result<Vec<f32>> {
    /// #     let path = format!("{}/../../models/build/{name}", env!("CARGO_MANIFEST_DIR"));
    /// #     Ok(std::fs::read(path)?
    /// #         .chunks_exact(4)
    /// #         .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    /// #         .collect())
    /// # };
    /// let c = Client::connect("inproc://doc")?;
    /// let digits = c.model("digits")?;
    /// // Four 8x8 images and the logits numpy computed for them.
    /// let images = read_f32("digits_mlp_input.bin")?;
    /// let expected = read_f32("digits_mlp_expected.bin")?;
    /// let r = digits.infer(&[TensorRef::from_slice(&[4, 64], &images)?])?;
    /// let logits: &[f32] = r.outputs[0].as_slice()?;
    /// assert_eq!(r.outputs[0].shape, [4, 10]);
    /// assert!(logits.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn infer(&self, inputs: &[TensorRef<'_>]) -> Result<Response, ClientError> {
        let sent = self.send_request(inputs, self.client.inner.opts.want_timeline, true)?;
        let timeout = self.client.inner.opts.timeout;
        self.client.inner.finish(sent, timeout)
    }

    /// Like [`infer`](Self::infer), asking for this request's timeline
    /// whatever [`ClientOptions::want_timeline`] says: for callers that
    /// trace a sample of their requests (each timed request costs about ten
    /// clock reads, client and agent together).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, Stage, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?; // no want_timeline
    /// let model = c.model("identity")?;
    /// let x = [0u8; 64];
    /// assert!(model.infer(&[TensorRef::from_slice(&[64], &x)?])?.timeline.is_none());
    /// let r = model.infer_timed(&[TensorRef::from_slice(&[64], &x)?])?;
    /// let t = r.timeline.ok_or("asked for")?;
    /// let compute_ns = t.span(Stage::ComputeStart, Stage::ComputeEnd).ok_or("stamped")?;
    /// let total_ns = r.client_done_ns - r.client_start_ns;
    /// assert!(compute_ns <= total_ns);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn infer_timed(&self, inputs: &[TensorRef<'_>]) -> Result<Response, ClientError> {
        let sent = self.send_request(inputs, true, true)?;
        let timeout = self.client.inner.opts.timeout;
        self.client.inner.finish(sent, timeout)
    }

    /// Sends a request without waiting; many may be in flight on one client.
    ///
    /// Over `shm://`, an input made by [`Client::alloc_tensor`] (or an
    /// output that aliases one) is sent where it lies, without a copy, and
    /// held until the response has come; any other input is copied into the
    /// session's arena once.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let model = c.model("identity")?;
    /// let (a, b) = ([1f32; 4], [2f32; 4]);
    /// let ta = model.submit(&[TensorRef::from_slice(&[4], &a)?])?;
    /// let tb = model.submit(&[TensorRef::from_slice(&[4], &b)?])?;
    /// // Answers are matched by id, whatever order they are waited for in.
    /// assert_eq!(tb.wait()?.outputs[0].to_vec::<f32>()?, b);
    /// assert_eq!(ta.wait()?.outputs[0].to_vec::<f32>()?, a);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit(&self, inputs: &[TensorRef<'_>]) -> Result<Ticket, ClientError> {
        let sent = self.send_request(inputs, self.client.inner.opts.want_timeline, false)?;
        Ok(Ticket {
            client: self.client.clone(),
            sent,
            waited: false,
        })
    }

    /// Like [`submit`](Self::submit), asking for this request's timeline
    /// whatever [`ClientOptions::want_timeline`] says.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, Stage, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let x = [0u8; 8];
    /// let t = c.model("identity")?.submit_timed(&[TensorRef::from_slice(&[8], &x)?])?;
    /// let r = t.wait()?;
    /// let timeline = r.timeline.ok_or("asked for")?;
    /// assert!(timeline.get(Stage::Received) >= r.client_start_ns);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit_timed(&self, inputs: &[TensorRef<'_>]) -> Result<Ticket, ClientError> {
        let sent = self.send_request(inputs, true, false)?;
        Ok(Ticket {
            client: self.client.clone(),
            sent,
            waited: false,
        })
    }

    /// Checks, places and sends a request, asking for the timeline if
    /// `timed`. `may_pull`: the caller waits for the answer while it
    /// borrows the inputs (blocking calls), so over shm the agent may pull
    /// them from where they lie (`mover=kernel`); a submitted request's
    /// inputs are moved into the arena before it returns.
    fn send_request(
        &self,
        inputs: &[TensorRef<'_>],
        timed: bool,
        may_pull: bool,
    ) -> Result<Sent, ClientError> {
        let inner = &self.client.inner;
        let start_ns = stamp_if(timed);
        let sig = &self.info.signature;
        // The identity model (empty signature) takes anything.
        if !sig.inputs.is_empty() {
            sig.check_inputs(inputs.iter().map(|t| (t.dtype, t.shape)))
                .map_err(ClientError::InvalidInput)?;
        }
        let limits = inner.limits;
        if inputs.len() > limits.max_tensors as usize {
            return Err(ClientError::LimitExceeded(format!(
                "{} tensors, the session allows {}",
                inputs.len(),
                limits.max_tensors
            )));
        }
        let shm = match &inner.link {
            Link::Shm(s) => Some(s),
            _ => None,
        };
        // Over shm tensors lie anywhere in the client region and the payload
        // length is their sum; on streams they follow each other, aligned.
        let (offsets, payload_len) = if shm.is_some() {
            let total = inputs
                .iter()
                .try_fold(0u64, |acc, t| acc.checked_add(t.data.len() as u64));
            (Vec::new(), total)
        } else {
            layout_payload(inputs.iter().map(|t| t.data.len() as u64))
                .map_or((Vec::new(), None), |(o, l)| (o, Some(l)))
        };
        let payload_len = payload_len
            .ok_or_else(|| ClientError::LimitExceeded("payload size overflows".into()))?;
        if payload_len > limits.max_payload {
            return Err(ClientError::LimitExceeded(format!(
                "request payload is {payload_len} bytes, the session allows {}",
                limits.max_payload
            )));
        }
        let desc_len: usize = inputs
            .iter()
            .map(|t| DESC_FIXED_LEN + 8 * t.shape.len())
            .sum();
        if desc_len > limits.max_desc_len as usize {
            return Err(ClientError::LimitExceeded(format!(
                "descriptor section is {desc_len} bytes, the session allows {}",
                limits.max_desc_len
            )));
        }
        let mut mover = None;
        let mut pulls = Vec::new();
        let (descs, pins) = match shm {
            Some(s) => {
                let placed = s.place_inputs(inputs, may_pull)?;
                mover = Some(placed.mover);
                pulls = placed.pulls;
                if placed.copied > 0 {
                    inner
                        .stats
                        .input
                        .fetch_add(placed.copied, Ordering::Relaxed);
                }
                (placed.descs, placed.pins)
            }
            None => (
                inputs
                    .iter()
                    .zip(offsets)
                    .map(|(t, offset)| TensorDesc {
                        dtype: t.dtype,
                        shape: t.shape.to_vec(),
                        offset,
                        len: t.data.len() as u64,
                    })
                    .collect(),
                Vec::new(),
            ),
        };
        let mut desc = Vec::with_capacity(desc_len + 8 * pulls.len());
        encode_tensor_section(&descs, None, &mut desc);
        if !pulls.is_empty() {
            // PROTOCOL §14.6, pulled inputs: one source address per tensor.
            if desc.len() + 8 * pulls.len() > limits.max_desc_len as usize {
                return Err(ClientError::LimitExceeded(format!(
                    "descriptor section with pull addresses is {} bytes, the session allows {}",
                    desc.len() + 8 * pulls.len(),
                    limits.max_desc_len
                )));
            }
            for a in &pulls {
                desc.extend_from_slice(&a.to_le_bytes());
            }
        }
        let mut h = Header::new(Kind::Request);
        h.request_id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        h.model_id = self.info.id;
        h.tensor_count = descs.len() as u32;
        h.desc_len = desc.len() as u32;
        h.payload_len = payload_len;
        h.priority = self.priority;
        h.timeout_us = self.timeout_us;
        if timed {
            h.flags |= flags::WANT_TIMELINE;
        }
        if !pulls.is_empty() {
            h.flags |= flags::PULL;
        }
        if shm.is_some() {
            inner.send(&h, &desc, &[])?;
        } else {
            let tensors: Vec<&[u8]> = inputs.iter().map(|t| t.data).collect();
            inner.send(&h, &desc, &tensors)?;
        }
        let kind = ServiceTimes::key(h.model_id, h.payload_len);
        let plan = match &inner.link {
            Link::Inproc { .. } => None,
            Link::Shm(_) => Some(WaitPlan::now(&inner.service_times, kind, false)),
            // A stream's wait reads the clock anyway (its deadline); a
            // client that never polls (`spin` zero) never sleeps first.
            Link::Stream(_) => Some(WaitPlan::now(
                &inner.service_times,
                kind,
                !inner.opts.spin.is_zero(),
            )),
        };
        inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        let sent_ns = stamp_if(timed);
        Ok(Sent {
            id: h.request_id,
            timed,
            start_ns,
            sent_ns,
            pins,
            mover,
            plan,
        })
    }
}

impl Ticket {
    /// The session and the request, for a completion that is not a wait
    /// ([`crate::completion`]): the ticket no longer abandons it on drop.
    pub(crate) fn into_parts(mut self) -> (Client, Sent) {
        self.waited = true;
        let sent = Sent {
            pins: std::mem::take(&mut self.sent.pins),
            ..self.sent
        };
        (self.client.clone(), sent)
    }

    /// The request id.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let model = c.model("identity")?;
    /// let x = [0u8; 4];
    /// let a = model.submit(&[TensorRef::from_slice(&[4], &x)?])?;
    /// let b = model.submit(&[TensorRef::from_slice(&[4], &x)?])?;
    /// assert_ne!(a.id(), b.id());
    /// # drop((a.wait()?, b.wait()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn id(&self) -> u64 {
        self.sent.id
    }

    /// Waits for this request's response (at most the client's timeout).
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let x = [5i32; 3];
    /// let ticket = c.model("identity")?.submit(&[TensorRef::from_slice(&[3], &x)?])?;
    /// // ... other work while the agent computes ...
    /// assert_eq!(ticket.wait()?.outputs[0].to_vec::<i32>()?, x);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(self) -> Result<Response, ClientError> {
        let timeout = self.client.inner.opts.timeout;
        self.wait_timeout(timeout)
    }

    /// Waits at most `timeout` (at most [`MAX_WAIT`]) for this request's
    /// response. On [`ClientError::Timeout`] the request is given up like a
    /// dropped ticket: its response is discarded when it comes.
    ///
    /// # Examples
    ///
    /// ```
    /// use client::{Client, TensorRef};
    /// use std::time::Duration;
    /// # let mut cfg = server::AgentConfig::default();
    /// # cfg.add_listen("inproc://doc")?;
    /// # let _agent = server::Agent::start(cfg)?;
    /// let c = Client::connect("inproc://doc")?;
    /// let x = [1u8; 4];
    /// let ticket = c.model("identity")?.submit(&[TensorRef::from_slice(&[4], &x)?])?;
    /// match ticket.wait_timeout(Duration::from_secs(1)) {
    ///     Ok(r) => assert_eq!(r.outputs[0].bytes(), x),
    ///     // Given up: the answer is discarded when it comes.
    ///     Err(client::ClientError::Timeout(after)) => println!("no answer in {after:?}"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<Response, ClientError> {
        let timeout = timeout.min(MAX_WAIT);
        self.waited = true;
        let sent = Sent {
            pins: std::mem::take(&mut self.sent.pins),
            ..self.sent
        };
        self.client.inner.finish(sent, timeout)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.waited {
            let pins = std::mem::take(&mut self.sent.pins);
            self.client.inner.abandon(self.sent.id, pins);
        }
    }
}

impl Inner {
    /// The session's wait estimates.
    pub(crate) fn service_times(&self) -> &ServiceTimes {
        &self.service_times
    }

    /// Whether a [`Inner::pump`] that polls may tell a miss: over shm, where
    /// it polls before it sleeps. A socket's pump blocks at once (its
    /// reads poll by their own [`transport::spin::SpinGate`]).
    pub(crate) fn pump_polls(&self) -> bool {
        matches!(self.link, Link::Shm(_)) && !self.opts.spin.is_zero()
    }

    /// Waits for the response to `sent`.
    fn finish(&self, sent: Sent, timeout: Duration) -> Result<Response, ClientError> {
        let frame = match self.wait_for(sent.id, timeout, sent.plan.as_ref()) {
            Ok(f) => f,
            Err(e) => {
                self.keep_pins(sent.id, sent.pins);
                return Err(e);
            }
        };
        self.complete(&sent, frame)
    }

    /// The response `frame` answers `sent` with, stamped.
    pub(crate) fn complete(&self, sent: &Sent, frame: Frame) -> Result<Response, ClientError> {
        let received_ns = frame.received_ns;
        let mut r = self.response_from(sent.id, frame, &sent.pins)?;
        r.client_start_ns = sent.start_ns;
        r.client_sent_ns = sent.sent_ns;
        r.input_mover = sent.mover;
        r.client_received_ns = received_ns;
        r.client_done_ns = stamp_if(sent.timed);
        Ok(r)
    }

    /// Sends a control message and waits for its answer.
    fn roundtrip(&self, mut h: Header, body: &[u8]) -> Result<Frame, ClientError> {
        h.request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(&h, body, &[])?;
        self.wait_for(h.request_id, self.opts.timeout, None)
    }

    fn send(&self, h: &Header, desc: &[u8], tensors: &[&[u8]]) -> Result<(), ClientError> {
        match &self.link {
            Link::Shm(s) => {
                debug_assert!(tensors.is_empty(), "shm tensors travel in the arena");
                s.send(
                    h,
                    desc,
                    &self.recv_limits,
                    self.opts.timeout,
                    self.limits.max_in_flight,
                )
            }
            Link::Inproc { service, replies } => {
                let reply = service.call(InprocRequest {
                    header: *h,
                    desc,
                    tensors,
                });
                lock(replies).insert(h.request_id, reply);
                Ok(())
            }
            Link::Stream(s) => {
                {
                    let mut sh = lock(&s.shared);
                    if let Some(d) = &sh.dead {
                        return Err(d.error());
                    }
                    if h.kind == Kind::Request {
                        if sh.pending.len() >= self.limits.max_in_flight as usize {
                            return Err(ClientError::TooManyInFlight(self.limits.max_in_flight));
                        }
                        sh.pending.push(h.request_id);
                    }
                }
                let w = lock(&s.writer);
                let mut drain = || self.read_one_if_free(s);
                w.send_draining(h, desc, tensors, &mut drain, Some(self.opts.timeout))
                    .map_err(|e| {
                        let msg = format!("sending to {} failed: {e}", self.uri);
                        let mut sh = lock(&s.shared);
                        sh.dead.get_or_insert(Death::gone(msg.clone()));
                        s.wake(&sh);
                        ClientError::AgentGone(msg)
                    })
            }
        }
    }

    /// After the Hello could not be sent: an agent that refuses a
    /// connection (a connection limit) answers with an Error and closes at
    /// once, possibly before the Hello was written. Its answer is still
    /// readable and says why; `fallback` is the error when there is none.
    fn refusal_or(&self, fallback: String) -> ClientError {
        let Link::Stream(s) = &self.link else {
            return ClientError::AgentGone(fallback);
        };
        let r = self.read_frame(s);
        let mut sh = lock(&s.shared);
        let before = sh.dead.take();
        self.absorb(&mut sh, r);
        let why = match sh.dead.take() {
            // Its answer said why, or was not tensorwire at all.
            Some(d) if d.protocol || d.why.starts_with("agent closed the session") => d,
            _ => before.unwrap_or(Death::gone(fallback)),
        };
        let e = why.error();
        sh.dead = Some(why);
        e
    }

    /// Called by a blocked sender when the socket is readable: reads one
    /// frame unless another thread is already reading.
    fn read_one_if_free(&self, s: &StreamLink) -> std::io::Result<()> {
        {
            let mut sh = lock(&s.shared);
            if sh.reading {
                drop(sh);
                std::thread::sleep(Duration::from_micros(50));
                return Ok(());
            }
            sh.reading = true;
        }
        let r = self.read_frame(s);
        let mut sh = lock(&s.shared);
        sh.reading = false;
        self.absorb(&mut sh, r);
        s.wake(&sh);
        Ok(())
    }

    /// Files what a read produced: a frame under its request id (dropped if
    /// its caller gave up), or a session-level error or failure as the end
    /// of the session.
    fn absorb(&self, sh: &mut Shared, r: Result<Frame, RecvError>) {
        match r {
            Ok(f) if f.header.kind == Kind::Error && f.header.request_id == 0 => {
                // A session-level error: the agent closes the connection.
                let msg = decode_error_body(&f.desc).unwrap_or_default();
                sh.dead.get_or_insert(Death::gone(format!(
                    "agent closed the session ({}): {msg}",
                    f.header.status
                )));
            }
            Ok(f) => {
                let id = f.header.request_id;
                sh.pending.remove(id);
                if !sh.abandoned.remove(&id) {
                    sh.completed.insert(id, f);
                }
            }
            Err(RecvError::TimedOut) => {}
            Err(RecvError::Closed) => {
                sh.dead
                    .get_or_insert(Death::gone(format!("{} closed the connection", self.uri)));
            }
            Err(RecvError::Wire(e)) => {
                sh.dead.get_or_insert(Death {
                    why: format!("{} does not speak tensorwire: {e}", self.uri),
                    protocol: true,
                });
            }
            Err(e) => {
                sh.dead.get_or_insert(Death::gone(e.to_string()));
            }
        }
    }

    fn read_frame(&self, s: &StreamLink) -> Result<Frame, RecvError> {
        let mut conn = lock(&s.reader);
        let (header, desc) = conn.recv_head(&self.recv_limits)?;
        let received_ns = stamp_if(header.flags & flags::HAS_TIMELINE != 0);
        let mut payload = self.pool.take(header.payload_len as usize)?;
        conn.recv_payload(&mut payload)?;
        self.stats
            .staged
            .store(conn.stats().staged_payload_bytes, Ordering::Relaxed);
        Ok(Frame {
            header,
            desc,
            payload: Payload::Contiguous(payload),
            received_ns,
        })
    }

    /// Waits for the answer to `id`; `plan` says how (a request's; `None`:
    /// poll at once, as control messages do).
    fn wait_for(
        &self,
        id: u64,
        timeout: Duration,
        plan: Option<&WaitPlan>,
    ) -> Result<Frame, ClientError> {
        let s = match &self.link {
            Link::Inproc { replies, .. } => {
                let r = lock(replies).remove(&id).ok_or_else(|| {
                    ClientError::Protocol(format!("no in-process reply for request {id}"))
                })?;
                return Ok(Frame {
                    header: r.header,
                    desc: r.desc,
                    payload: Payload::PerTensor(r.tensors),
                    received_ns: stamp_if(r.header.flags & flags::HAS_TIMELINE != 0),
                });
            }
            Link::Shm(s) => {
                let (header, desc) = s.wait_for(
                    id,
                    timeout,
                    self.opts.spin,
                    &self.recv_limits,
                    plan.map(|p| (p, &self.service_times)),
                )?;
                return Ok(Frame {
                    header,
                    desc,
                    received_ns: stamp_if(header.flags & flags::HAS_TIMELINE != 0),
                    payload: Payload::Arena,
                });
            }
            Link::Stream(s) => s,
        };
        let deadline = Instant::now() + timeout;
        // A kind of request whose answers come late but on time: sleep until
        // shortly before the answer is due, then poll for it (as over shm;
        // [`crate::service_time`]).
        let mut sleep_until = plan.and_then(WaitPlan::sleep_until);
        let done = |f| {
            if let Some(p) = plan {
                p.answered(&self.service_times, self.opts.spin);
            }
            Ok(f)
        };
        let mut sh = lock(&s.shared);
        loop {
            if let Some(f) = sh.completed.remove(&id) {
                return done(f);
            }
            if let Some(d) = &sh.dead {
                return Err(d.error());
            }
            let now = Instant::now();
            if now >= deadline {
                // Its answer may still come: drop it then (control calls too).
                sh.abandoned.insert(id);
                return Err(ClientError::Timeout(timeout));
            }
            if sh.reading {
                sh.waiting += 1;
                sh =
                    s.cv.wait_timeout(sh, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                sh.waiting -= 1;
                continue;
            }
            sh.reading = true;
            drop(sh);
            if let Some(until) = sleep_until.take().map(|u| u.min(deadline)) {
                // An early answer ends the sleep; a poll that catches the
                // answer saves the blocking read's wake-up.
                let conn = lock(&s.reader);
                let now = Instant::now();
                let woken = until <= now || conn.wait_readable(until - now).unwrap_or(true);
                if let Some(p) = plan.filter(|_| !woken) {
                    let caught = conn.poll_readable(self.opts.spin).unwrap_or(true);
                    self.service_times.polled(p.key, caught);
                }
            }
            // A deadline shorter than the socket's read timeout is waited
            // for here, between messages: a read would outlast it.
            let short = timeout < self.opts.timeout;
            let ready = !short
                || lock(&s.reader)
                    .wait_readable(deadline.saturating_duration_since(Instant::now()))
                    .unwrap_or(true);
            let r = if ready {
                self.read_frame(s)
            } else {
                Err(RecvError::TimedOut)
            };
            sh = lock(&s.shared);
            sh.reading = false;
            match r {
                Ok(f) if f.header.request_id == id && id != 0 => {
                    sh.pending.remove(id);
                    // Another waiter may be parked until the reader role is free.
                    s.wake(&sh);
                    drop(sh);
                    return done(f);
                }
                other => self.absorb(&mut sh, other),
            }
            s.wake(&sh);
        }
    }

    /// The response to `id` if it is here (or the session's end); `None`
    /// while it may still come. Never waits: [`crate::completion`] asks it
    /// for every request it watches after each [`Inner::pump`].
    pub(crate) fn take_done(&self, id: u64) -> Option<Result<Frame, ClientError>> {
        match &self.link {
            Link::Inproc { .. } => Some(self.wait_for(id, Duration::ZERO, None)),
            Link::Shm(s) => s.take_done(id).map(|r| {
                r.map(|(header, desc)| Frame {
                    received_ns: stamp_if(header.flags & flags::HAS_TIMELINE != 0),
                    header,
                    desc,
                    payload: Payload::Arena,
                })
            }),
            Link::Stream(s) => {
                let mut sh = lock(&s.shared);
                if let Some(f) = sh.completed.remove(&id) {
                    return Some(Ok(f));
                }
                sh.dead.as_ref().map(|d| Err(d.error()))
            }
        }
    }

    /// Receives and files at most one response, waiting at most `limit`
    /// for it (over shm polling first when `poll`, else sleeping at once);
    /// when another caller is reading, waits for it to file something
    /// instead. Responses are filed for whoever waits for them. `true`
    /// when it polled all of `limit` and nothing came (shm only).
    pub(crate) fn pump(&self, limit: Duration, poll: bool) -> bool {
        match &self.link {
            Link::Inproc { .. } => false,
            Link::Shm(s) => {
                let spin = if poll { self.opts.spin } else { Duration::ZERO };
                s.pump(limit, spin, &self.recv_limits)
            }
            Link::Stream(s) => {
                let mut sh = lock(&s.shared);
                if sh.dead.is_some() {
                    return false;
                }
                if sh.reading {
                    sh.waiting += 1;
                    sh =
                        s.cv.wait_timeout(sh, limit)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    sh.waiting -= 1;
                    return false;
                }
                sh.reading = true;
                drop(sh);
                let ready = lock(&s.reader).wait_readable(limit).unwrap_or(true);
                let r = if ready {
                    self.read_frame(s)
                } else {
                    Err(RecvError::TimedOut)
                };
                let mut sh = lock(&s.shared);
                sh.reading = false;
                self.absorb(&mut sh, r);
                s.wake(&sh);
                false
            }
        }
    }

    pub(crate) fn abandon(&self, id: u64, pins: Vec<Arc<Allocation>>) {
        match &self.link {
            Link::Inproc { replies, .. } => {
                lock(replies).remove(&id);
            }
            Link::Shm(s) => s.abandon(id, pins),
            Link::Stream(s) => {
                let mut sh = lock(&s.shared);
                if sh.completed.remove(&id).is_none() && sh.pending.contains(id) {
                    sh.abandoned.insert(id);
                }
            }
        }
    }
}

/// `CLOCK_MONOTONIC` now for a request that asked for its timeline, else 0
/// (no clock read on the hot path nobody looks at).
fn stamp_if(timed: bool) -> u64 {
    if timed {
        monotonic_ns()
    } else {
        0
    }
}

impl Inner {
    /// A failed wait leaves the request's arena allocations with it until
    /// its response comes (shared memory only).
    fn keep_pins(&self, id: u64, pins: Vec<Arc<Allocation>>) {
        if let Link::Shm(s) = &self.link {
            s.keep_pins(id, pins);
        }
    }

    fn response_from(
        &self,
        id: u64,
        f: Frame,
        pins: &[Arc<Allocation>],
    ) -> Result<Response, ClientError> {
        let Link::Shm(s) = &self.link else {
            return into_response(f);
        };
        if f.header.kind != Kind::Response {
            expect_kind(&f, Kind::Response)?;
        }
        let (outputs, timeline) = s.outputs(id, &f.header, &f.desc, pins)?;
        Ok(Response {
            outputs,
            timeline,
            client_start_ns: 0,
            client_sent_ns: 0,
            client_received_ns: 0,
            client_done_ns: 0,
            input_mover: None,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Turns an Error frame into the matching error, and checks the kind.
fn expect_kind(f: &Frame, kind: Kind) -> Result<(), ClientError> {
    if f.header.kind == Kind::Error {
        let msg = decode_error_body(&f.desc).map_err(|e| ClientError::Protocol(e.to_string()))?;
        return Err(ClientError::from_remote(f.header.status, msg));
    }
    if f.header.kind != kind {
        return Err(ClientError::Protocol(format!(
            "expected {kind:?}, agent sent {:?}",
            f.header.kind
        )));
    }
    Ok(())
}

fn into_response(f: Frame) -> Result<Response, ClientError> {
    expect_kind(&f, Kind::Response)?;
    let section = decode_tensor_section(&f.header, &f.desc)
        .map_err(|e| ClientError::Protocol(format!("bad response descriptors: {e}")))?;
    let outputs = match f.payload {
        Payload::Contiguous(buf) => {
            if buf.len() as u64 != f.header.payload_len {
                return Err(ClientError::Protocol(
                    "response payload length mismatch".into(),
                ));
            }
            let buf: Arc<dyn TensorBytes> = Arc::new(buf);
            section
                .tensors
                .into_iter()
                .map(|d| {
                    let r = d.offset as usize..(d.offset + d.len) as usize;
                    Tensor::new(d.dtype, d.shape, buf.clone(), r)
                })
                .collect()
        }
        Payload::PerTensor(bufs) => {
            if bufs.len() != section.tensors.len() {
                return Err(ClientError::Protocol(
                    "in-process reply tensor count mismatch".into(),
                ));
            }
            section
                .tensors
                .into_iter()
                .zip(bufs)
                .map(|(d, b)| {
                    if b.len() as u64 != d.len {
                        return Err(ClientError::Protocol(
                            "in-process tensor length mismatch".into(),
                        ));
                    }
                    let n = b.len();
                    Ok(Tensor::new(d.dtype, d.shape, Arc::new(b), 0..n))
                })
                .collect::<Result<_, _>>()?
        }
        Payload::Arena => {
            return Err(ClientError::Protocol(format!(
                "arena response {} outside a shared-memory session",
                f.header.request_id
            )))
        }
    };
    Ok(Response {
        outputs,
        timeline: section.timeline,
        client_start_ns: 0,
        client_sent_ns: 0,
        client_received_ns: 0,
        client_done_ns: 0,
        input_mover: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_never_show_their_token() {
        let o = ClientOptions {
            token: Some("s3cret-token".into()),
            ..ClientOptions::default()
        };
        let shown = format!("{o:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}
