//! [`AgentCore`]: what the agent does with one message, whatever transport
//! brought it. Socket sessions and in-process callers both go through here,
//! so validation, errors and timelines are identical on every transport.
//!
//! A request is handled in two steps so that nothing is read or allocated
//! for a request that will be refused: [`AgentCore::prepare`] checks the
//! descriptors against the limits and the model's signature (the payload is
//! still unread), then [`AgentCore::execute`] runs the model on views over
//! the payload wherever it landed.
//!
//! `execute` is made of parts a transport with its own output placement
//! (shared memory) uses directly, so the checks stay shared:
//! [`AgentCore::prepare_in`] (descriptors placed in a region rather than a
//! payload), [`AgentCore::run`] / [`AgentCore::run_into`] (the model through
//! its queue, errors mapped to replies), [`AgentCore::check_outputs`] (what
//! the engine produced matches its dtypes and shapes) and
//! [`AgentCore::respond`] (the Response header and descriptor section for
//! tensors placed wherever the transport put them, timeline stamped, checked
//! against the session's limits).
//!
//! The same steps keep each model's [`ModelStats`](crate::stats::ModelStats): `prepare_via` counts
//! the request for its model and transport, `respond` records a success
//! with its stage durations, and a request that ends without a response
//! (refused, failed, or dropped with its connection) is recorded as a
//! failure when its [`Prepared`] is dropped. [`AgentCore::timeline`] gives
//! the timeline a transport stamps: one that reads the clock while the
//! agent times requests for these statistics (`AgentConfig::request_timing`).

use crate::conns::ConnTable;
use crate::queue::{Ask, Refused};
use crate::registry::{ModelEntry, ModelRegistry};
use crate::stats::Via;
use crate::tenants::{Identity, Seat, Tenant, Tenants, Ticket};
use engine::{Output, OutputData, TensorView};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use wire::BufPool;
use wire::{
    decode_hello_request, decode_model_name, decode_tensor_section_in, encode_error_body,
    encode_hello, encode_model_list, encode_signature, encode_tensor_section, flags,
    layout_payload, Header, Kind, Limits, Placement, Stage, Status, TensorDesc, Timeline,
    TIMELINE_LEN,
};

/// Bytes of large payload buffers the agent keeps for reuse (at most its
/// payload budget: pooled pages stay resident, so a pool larger than the
/// budget would let payload memory outgrow it).
const POOL_BYTES: usize = 512 << 20;

/// The share of the payload budget (1/8) that only requests of one
/// [`RESERVE_STEP`] or less may take: connections that really send large
/// payloads and stall hold the rest at most, so small requests are still
/// taken meanwhile.
const SMALL_SHARE: u64 = 8;
/// Most large payload buffers the agent keeps for reuse.
const POOL_BUFS: usize = 32;

/// How much of the payload budget a request read from a socket takes at a
/// time ([`AgentCore::prepare_streamed`]): its first step when it is
/// admitted, each next one before its bytes are read.
///
/// # Examples
///
/// A 3 MiB request streamed from a socket holds one step of the budget
/// until it asks for more:
///
/// ```
/// use server::dispatch::{AgentCore, RESERVE_STEP};
/// use server::stats::Via;
/// use server::ModelRegistry;
/// # use wire::{encode_tensor_section, DType, Header, TensorDesc};
/// # fn request(id: u64, model_id: u32, len: u64) -> (Header, Vec<u8>) {
/// #     let t = TensorDesc { dtype: DType::U8, shape: vec![len], offset: 0, len };
/// #     let mut desc = Vec::new();
/// #     encode_tensor_section(&[t], None, &mut desc);
/// #     let mut h = Header::new(wire::Kind::Request);
/// #     (h.request_id, h.model_id, h.tensor_count) = (id, model_id, 1);
/// #     (h.desc_len, h.payload_len) = (desc.len() as u32, len);
/// #     (h, desc)
/// # }
/// let core = AgentCore::new(ModelRegistry::with_identity(), wire::Limits::default(), 64 << 20);
/// let (h, desc) = request(1, 0, 3 << 20);
/// let grant = server::dispatch::Grant::open(core.limits);
/// let p = core.prepare_streamed(Via::Unix, &h, &desc, &grant, &core.timeline(&h))
///     .map_err(|r| format!("{:?}", r.header.status))?;
/// assert_eq!(core.payload_budget_left(), (64 << 20) - RESERVE_STEP);
/// assert!(p.reserve_through(2 * RESERVE_STEP)); // before reading the second MiB
/// assert_eq!(core.payload_budget_left(), (64 << 20) - 2 * RESERVE_STEP);
/// drop(p);
/// assert_eq!(core.payload_budget_left(), 64 << 20);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const RESERVE_STEP: u64 = 1 << 20;

/// A message to send back: header, descriptor section (or control body),
/// and, for responses, the outputs whose bytes form the payload.
///
/// Examples: [`AgentCore`] (a response and its payload),
/// [`AgentCore::hello`], [`AgentCore::control`].
#[derive(Debug)]
pub struct Reply {
    /// The reply header (desc_len, tensor_count, payload_len filled in).
    pub header: Header,
    /// The descriptor section or control body.
    pub desc: Vec<u8>,
    /// Output tensors in payload order (empty for control replies).
    pub outputs: Vec<Output>,
}

impl Reply {
    /// A control reply of `kind` with `body`.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::dispatch::Reply;
    /// let r = Reply::control(wire::Kind::Pong, 7, 0, Vec::new());
    /// assert_eq!((r.header.kind, r.header.request_id, r.header.desc_len), (wire::Kind::Pong, 7, 0));
    /// ```
    pub fn control(kind: Kind, request_id: u64, model_id: u32, body: Vec<u8>) -> Reply {
        let mut header = Header::new(kind);
        header.request_id = request_id;
        header.model_id = model_id;
        header.desc_len = body.len() as u32;
        Reply {
            header,
            desc: body,
            outputs: Vec::new(),
        }
    }

    /// An Error reply.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::dispatch::Reply;
    /// use wire::Status;
    /// let r = Reply::error(7, Status::Overloaded, "busy");
    /// assert_eq!(r.header.status, Status::Overloaded);
    /// assert_eq!(wire::decode_error_body(&r.desc)?, "busy");
    /// # Ok::<(), wire::WireError>(())
    /// ```
    pub fn error(request_id: u64, status: Status, message: &str) -> Reply {
        let mut r = Reply::control(Kind::Error, request_id, 0, encode_error_body(message));
        r.header.status = status;
        r
    }

    /// The payload slices of this reply, resolving outputs that alias
    /// inputs. Example: [`AgentCore`].
    pub fn payload<'a>(&'a self, inputs: &[TensorView<'a>]) -> Vec<&'a [u8]> {
        self.outputs.iter().map(|o| o.bytes(inputs)).collect()
    }
}

/// A request that passed every check that does not need its payload.
///
/// Examples: [`AgentCore`] (prepare → views → execute), [`RESERVE_STEP`]
/// (a streamed payload's budget).
#[derive(Debug)]
pub struct Prepared<'a> {
    /// The model it is for (held: a model unloaded meanwhile finishes
    /// this request).
    pub model: Arc<ModelEntry>,
    /// Its tensors, validated.
    pub tensors: Vec<TensorDesc>,
    /// Its id.
    pub request_id: u64,
    /// Whether the client asked for the timeline.
    pub want_timeline: bool,
    /// The session's limits (the response must fit them too).
    pub limits: Limits,
    /// What it asks of the model's queue (priority, timeout), from its
    /// header (its priority capped by its tenant's class).
    pub ask: Ask,
    /// Its count in its tenant's quotas (none without a tenants file).
    pub ticket: Option<Ticket>,
    _in_flight: InFlight<'a>,
}

impl<'a> Prepared<'a> {
    /// Extends the request's share of the payload budget to its first
    /// `end` payload bytes (a request from
    /// [`AgentCore::prepare_streamed`], before it reads them). False when
    /// the budget has no room left: the caller skips the rest of the
    /// payload and refuses the request ([`AgentCore::over_budget`]).
    /// Example: [`RESERVE_STEP`].
    pub fn reserve_through(&self, end: u64) -> bool {
        let held = &self._in_flight.reserved;
        let have = held.load(Ordering::Relaxed);
        if end <= have {
            return true;
        }
        let more = end - have;
        let took = self
            ._in_flight
            .core
            .take_budget(more, self._in_flight.payload_len);
        if took {
            held.fetch_add(more, Ordering::Relaxed);
        }
        took
    }

    /// The request's tenant (none without a tenants file, or in-process).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::dispatch::AgentCore;
    /// # use wire::{encode_tensor_section, DType, Header, TensorDesc};
    /// # let t = TensorDesc { dtype: DType::U8, shape: vec![4], offset: 0, len: 4 };
    /// # let mut desc = Vec::new();
    /// # encode_tensor_section(&[t], None, &mut desc);
    /// # let mut h = Header::new(wire::Kind::Request);
    /// # (h.tensor_count, h.desc_len, h.payload_len) = (1, desc.len() as u32, 4);
    /// let core = AgentCore::new(server::ModelRegistry::with_identity(), wire::Limits::default(), 1 << 20);
    /// let p = core.prepare(&h, &desc, &core.limits).map_err(|r| format!("{:?}", r.header.status))?;
    /// assert!(p.tenant().is_none()); // no tenants file
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tenant(&self) -> Option<&Arc<Tenant>> {
        self.ticket.as_ref().map(|t| &t.tenant)
    }

    /// Views over a contiguous payload laid out as the descriptors say
    /// (bounds were checked against `payload_len` in `prepare`).
    /// Example: [`AgentCore`].
    pub fn views<'p>(&'p self, payload: &'p [u8]) -> Vec<TensorView<'p>> {
        self.tensors
            .iter()
            .map(|d| {
                let start = d.offset as usize;
                let end = start + d.len as usize;
                TensorView::new(d.dtype, &d.shape, payload.get(start..end).unwrap_or(&[]))
            })
            .collect()
    }
}

/// Counts a request as in flight, agent-wide and for its model, and holds
/// its share of the payload budget, until dropped (after its reply is
/// sent); a request dropped without a response is counted as failed then.
#[derive(Debug)]
struct InFlight<'a> {
    core: &'a AgentCore,
    /// Payload budget bytes held.
    reserved: AtomicU64,
    /// The request's whole payload (what decides whether it may take the
    /// budget's small share).
    payload_len: u64,
    /// The model, for its statistics (a second handle to `Prepared::model`:
    /// the guard records into it when dropped).
    model: Arc<ModelEntry>,
    /// The request's `received` stamp (0 when not timed).
    arrived: u64,
    /// Set by `respond` once the request has its response.
    answered: AtomicBool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let stats = &self.model.stats;
        if !self.answered.load(Ordering::Relaxed) {
            stats.record_failure(self.arrived);
        }
        stats.finished();
        let core = self.core;
        let reserved = *self.reserved.get_mut();
        if reserved > 0 {
            core.payload_budget.fetch_add(reserved, Ordering::AcqRel);
        }
        if core.in_flight.fetch_sub(1, Ordering::AcqRel) == 1
            && core.closing.load(Ordering::Acquire)
        {
            let _g = core.drain_lock.lock();
            core.drain_cv.notify_all();
        }
    }
}

/// What request `h` asks of `model`'s queue: its header's priority and
/// timeout, with the priority capped by its tenant's class (a tenant whose
/// class is level 2 cannot ask level 1; a class below the model's levels
/// means its lowest).
fn tenant_ask(model: &ModelEntry, h: &Header, ticket: Option<&Ticket>) -> Ask {
    let mut ask = Ask::from_header(h.priority, h.timeout_us);
    if let Some(class) = ticket.and_then(|t| t.tenant.quotas.priority) {
        let policy = model.queue.policy();
        let asked = match ask.priority {
            0 => policy.default_priority,
            p => p,
        };
        ask.priority = asked.max(class.min(policy.priority_levels));
    }
    ask
}

/// Agent-wide counters ([`AgentCore::counters`]).
///
/// # Examples
///
/// ```
/// use std::sync::atomic::Ordering;
/// let agent = server::Agent::start(server::AgentConfig::default())?;
/// let counters = &agent.core().counters;
/// assert_eq!(counters.responses.load(Ordering::Relaxed), 0);
/// assert_eq!(counters.errors.load(Ordering::Relaxed), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests that got a response.
    pub responses: AtomicU64,
    /// Messages answered with an Error.
    pub errors: AtomicU64,
    /// Output bytes the agent copied into shared-memory arenas (owned
    /// engine outputs moved into a session's output region), and into the
    /// regions of the KServe front doors' system shared-memory extension.
    pub shm_output_bytes_copied: AtomicU64,
    /// Output bytes engines were asked to write straight into arenas
    /// ([`engine::Backend::run_into`] over the output region: no copy by
    /// tensorwire; an engine that cannot write in place may still copy
    /// internally, e.g. ONNX Runtime falling back from a wrong output plan).
    /// The KServe front doors count outputs written this way into their
    /// system shared-memory regions here too.
    pub shm_output_bytes_in_place: AtomicU64,
    /// Output bytes answered by pointing at the input they alias (identity):
    /// neither written nor copied.
    pub shm_output_bytes_aliased: AtomicU64,
}

/// What one session may do: the limits in force (agreed in its Hello) and
/// its seat among the agent's tenants (none when the agent has no tenants
/// file, or for in-process callers).
///
/// Examples: [`AgentCore::grant`], [`AgentCore::hello`].
#[derive(Debug)]
pub struct Grant {
    /// The limits in force.
    pub limits: Limits,
    /// Its tenant, rights and quotas.
    pub seat: Option<Seat>,
}

impl Grant {
    /// Limits only, no tenant: every model, within the agent's limits.
    ///
    /// # Examples
    ///
    /// ```
    /// let g = server::dispatch::Grant::open(wire::Limits::default());
    /// assert!(g.seat.is_none());
    /// ```
    pub fn open(limits: Limits) -> Grant {
        Grant { limits, seat: None }
    }
}

/// The agent's shared state: models, limits, shutdown flag, counters.
///
/// Every transport and front door serves requests through one: an
/// embedded [`Agent`](crate::Agent) hands its own out
/// ([`Agent::core`](crate::Agent::core)); a front end of its own (a new
/// protocol in front of the same models, queues and limits) calls
/// [`prepare`](AgentCore::prepare) → [`execute`](AgentCore::execute).
///
/// # Examples
///
/// A front end serving one request for `identity` on the agent's core:
///
/// ```
/// use server::{Agent, AgentConfig};
/// use wire::Kind;
/// # use wire::{encode_tensor_section, DType, Header, TensorDesc};
/// # fn request(id: u64, model_id: u32, len: u64) -> (Header, Vec<u8>) {
/// #     let t = TensorDesc { dtype: DType::U8, shape: vec![len], offset: 0, len };
/// #     let mut desc = Vec::new();
/// #     encode_tensor_section(&[t], None, &mut desc);
/// #     let mut h = Header::new(wire::Kind::Request);
/// #     (h.request_id, h.model_id, h.tensor_count) = (id, model_id, 1);
/// #     (h.desc_len, h.payload_len) = (desc.len() as u32, len);
/// #     (h, desc)
/// # }
/// let agent = Agent::start(AgentConfig::default())?;
/// let core = agent.core();
/// let model = core.registry.find("identity").ok_or("identity is always served")?;
/// let (h, desc) = request(7, model.id, 4);
/// let payload = [1u8, 2, 3, 4];
///
/// let p = core.prepare(&h, &desc, &core.limits).map_err(|r| format!("{:?}", r.header.status))?;
/// assert_eq!(core.in_flight(), 1);
/// let inputs = p.views(&payload);
/// let mut tl = core.timeline(&h);
/// let reply = core.execute(&p, &inputs, &mut tl);
/// assert_eq!((reply.header.kind, reply.header.request_id), (Kind::Response, 7));
/// assert_eq!(reply.payload(&inputs), [&payload[..]]);
/// drop(p); // answered: no longer in flight
/// assert_eq!(core.in_flight(), 0);
/// assert_eq!(agent.stats().responses, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AgentCore {
    /// Every model.
    pub registry: ModelRegistry,
    /// The most any session may use.
    pub limits: Limits,
    /// Counters.
    pub counters: Counters,
    /// Recycled payload buffers (request payloads, in-process outputs).
    pub pool: Arc<BufPool>,
    /// Whether every request is timed for the models' statistics.
    timing: bool,
    /// The tenants, when the agent has a tenants file.
    tenants: Option<Arc<Tenants>>,
    closing: AtomicBool,
    in_flight: AtomicUsize,
    /// Payload bytes that requests in flight may still hold, agent-wide.
    payload_budget: AtomicU64,
    /// The part of it kept for requests of one step ([`SMALL_SHARE`]).
    small_share: u64,
    drain_lock: Mutex<()>,
    drain_cv: Condvar,
    /// Every open connection of the agent, the front doors' too.
    conns: Arc<ConnTable>,
    /// How long a new connection has to start its handshake.
    handshake_timeout: Duration,
    /// How long a peer may stay silent in the middle of a message.
    stall_timeout: Duration,
}

impl AgentCore {
    /// A core serving `registry` under `limits`, with at most
    /// `payload_budget` payload bytes held by requests in flight at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::dispatch::AgentCore;
    /// use server::ModelRegistry;
    /// use std::time::Duration;
    /// let core = AgentCore::new(ModelRegistry::with_identity(), wire::Limits::default(), 1 << 30)
    ///     .with_connections(64, 8, Duration::from_millis(500))
    ///     .with_stall_timeout(Duration::from_secs(5))
    ///     .with_request_timing(false);
    /// assert_eq!(core.payload_budget_left(), 1 << 30);
    /// assert_eq!(core.handshake_timeout(), Duration::from_millis(500));
    /// assert_eq!(core.stall_timeout(), Duration::from_secs(5));
    /// assert!(!core.request_timing());
    /// ```
    pub fn new(registry: ModelRegistry, limits: Limits, payload_budget: u64) -> AgentCore {
        let defaults = crate::config::AgentConfig::default();
        AgentCore {
            registry,
            limits,
            counters: Counters::default(),
            pool: BufPool::new(
                POOL_BYTES.min(usize::try_from(payload_budget).unwrap_or(usize::MAX)),
                POOL_BUFS,
            ),
            timing: true,
            tenants: None,
            closing: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            payload_budget: AtomicU64::new(payload_budget),
            small_share: payload_budget / SMALL_SHARE,
            drain_lock: Mutex::new(()),
            drain_cv: Condvar::new(),
            conns: Arc::new(ConnTable::new(
                defaults.max_connections,
                defaults.max_connections_per_peer,
            )),
            handshake_timeout: defaults.handshake_timeout,
            stall_timeout: defaults.stall_timeout,
        }
    }

    /// This core, counting connections against `max` agent-wide and
    /// `max_per_peer` per peer, and giving new ones `handshake_timeout` to
    /// start their handshake (the agent's `[connections]` settings; a core
    /// made with [`AgentCore::new`] has their defaults).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::conns::{Conn, Refusal};
    /// use server::dispatch::AgentCore;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// let core = AgentCore::new(server::ModelRegistry::with_identity(), wire::Limits::default(), 1 << 30)
    ///     .with_connections(1, 1, Duration::from_secs(1));
    /// let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let _peers = [std::net::TcpStream::connect(l.local_addr()?)?, std::net::TcpStream::connect(l.local_addr()?)?];
    /// let (a, addr) = l.accept()?;
    /// let (b, _) = l.accept()?;
    /// let peer = transport::PeerId::Addr(addr.ip());
    /// let _slot = core.conns().admit(Conn::Tcp(Arc::new(a)), peer).map_err(|r| r.message())?;
    /// assert_eq!(core.conns().admit(Conn::Tcp(Arc::new(b)), peer).err(), Some(Refusal::Full(1)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_connections(
        mut self,
        max: usize,
        max_per_peer: usize,
        handshake_timeout: Duration,
    ) -> AgentCore {
        self.conns = Arc::new(ConnTable::new(max, max_per_peer.min(max)));
        self.handshake_timeout = handshake_timeout;
        self
    }

    /// This core, dropping a peer silent for `stall_timeout` in the middle
    /// of a message (`[limits] stall_timeout_ms`; a core made with
    /// [`AgentCore::new`] has its default, 30 s). Example: [`AgentCore::new`].
    pub fn with_stall_timeout(mut self, stall_timeout: Duration) -> AgentCore {
        self.stall_timeout = stall_timeout;
        self
    }

    /// How long a peer may stay silent in the middle of a message: the
    /// KServe HTTP doors give a request's head this long to arrive.
    ///
    /// # Examples
    ///
    /// The agent's `[limits] stall_timeout_ms`, as a front door reads it:
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut cfg = server::AgentConfig::default();
    /// cfg.stall_timeout = Duration::from_secs(2);
    /// let agent = server::Agent::start(cfg)?;
    /// assert_eq!(agent.core().stall_timeout(), Duration::from_secs(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stall_timeout(&self) -> Duration {
        self.stall_timeout
    }

    /// Every open connection of the agent: listeners its owner runs
    /// beside it (the KServe front doors) admit theirs here too, so they
    /// count against the same limits as the agent's own.
    ///
    /// Examples: [`ConnCounts`](crate::conns::ConnCounts) (an agent's
    /// table read through its core), [`AgentCore::with_connections`].
    pub fn conns(&self) -> &Arc<ConnTable> {
        &self.conns
    }

    /// How long a new connection has to start its handshake before it is
    /// closed (`[connections] handshake_timeout_ms`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut cfg = server::AgentConfig::default();
    /// cfg.handshake_timeout = Duration::from_millis(250);
    /// let agent = server::Agent::start(cfg)?;
    /// assert_eq!(agent.core().handshake_timeout(), Duration::from_millis(250));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }

    /// This core, timing every request for the models' statistics or not
    /// (on by default): four clock reads a request, ~30 ns each here (see
    /// [`crate::stats`]). Off, statistics still count requests but record
    /// no durations. Example: [`AgentCore::new`].
    pub fn with_request_timing(mut self, on: bool) -> AgentCore {
        self.timing = on;
        self
    }

    /// Whether every request is timed for the models' statistics.
    ///
    /// # Examples
    ///
    /// ```
    /// let agent = server::Agent::start(server::AgentConfig::default())?;
    /// assert!(agent.core().request_timing()); // on unless `request_timing = false`
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn request_timing(&self) -> bool {
        self.timing
    }

    /// This core, serving `tenants`: each session is matched to one at its
    /// Hello and may see, call and hold only what its tenant may.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::dispatch::AgentCore;
    /// use server::tenants::{file, Identity, Tenants};
    /// use std::sync::Arc;
    /// let specs = file::parse("[[tenant]]\nname = \"default\"\nmodels = [\"identity\"]\n", "t.toml")?;
    /// let core = AgentCore::new(server::ModelRegistry::with_identity(), wire::Limits::default(), 1 << 30)
    ///     .with_tenants(Some(Arc::new(Tenants::from_specs(specs))));
    /// let g = core.grant(&Identity::REMOTE, None, &wire::Limits::default()).map_err(|d| d.1)?;
    /// assert_eq!(g.seat.ok_or("seated")?.tenant_name(), "default");
    /// assert_eq!(core.tenants().map(|t| t.snapshot().len()), Some(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_tenants(mut self, tenants: Option<Arc<Tenants>>) -> AgentCore {
        self.tenants = tenants;
        self
    }

    /// The tenants, when the agent has a tenants file.
    /// Example: [`AgentCore::with_tenants`].
    pub fn tenants(&self) -> Option<&Arc<Tenants>> {
        self.tenants.as_ref()
    }

    /// The grant of a session of `who` presenting `token` that asked for
    /// `asked` limits: its seat among the tenants (none when the agent has
    /// no tenants file, or for in-process callers) and the limits in force,
    /// the agent's narrowed by its tenant's quotas and by what it asked.
    ///
    /// # Examples
    ///
    /// Without tenants, the limits in force are the agent's narrowed by the
    /// session's:
    ///
    /// ```
    /// use server::tenants::Identity;
    /// let agent = server::Agent::start(server::AgentConfig::default())?;
    /// let asked = wire::Limits { max_in_flight: 4, ..wire::Limits::default() };
    /// let g = agent.core().grant(&Identity::REMOTE, None, &asked).map_err(|d| d.1)?;
    /// assert_eq!(g.limits.max_in_flight, 4);
    /// assert!(g.seat.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grant(
        &self,
        who: &Identity,
        token: Option<&[u8]>,
        asked: &Limits,
    ) -> Result<Grant, (Status, String)> {
        let seat = match &self.tenants {
            Some(t) if !who.in_process => Some(t.seat(who, token)?),
            _ => None,
        };
        let ours = match seat.as_ref().map(Seat::tenant).transpose()? {
            Some(t) => t.narrow(self.limits),
            None => self.limits,
        };
        Ok(Grant {
            limits: ours.narrowed_by(asked),
            seat,
        })
    }

    /// The timeline of request `h`, for its transport to stamp: it reads
    /// the clock when the agent times requests for the models' statistics
    /// or when the client asked for it, and otherwise takes no stamps.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::dispatch::AgentCore;
    /// use wire::{Header, Kind, Stage};
    /// let core = AgentCore::new(server::ModelRegistry::with_identity(), wire::Limits::default(), 1 << 20)
    ///     .with_request_timing(false);
    /// let mut tl = core.timeline(&Header::new(Kind::Request)); // no timeline asked: no stamps
    /// tl.stamp(Stage::Received);
    /// assert_eq!(tl.get(Stage::Received), 0);
    /// ```
    #[inline]
    pub fn timeline(&self, h: &Header) -> Timeline {
        if self.timing {
            Timeline::default()
        } else {
            Timeline::for_request(h)
        }
    }

    /// True once shutdown began: new requests are refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let agent = server::Agent::start(server::AgentConfig::default())?;
    /// let core = agent.core().clone();
    /// assert!(!core.is_closing());
    /// agent.shutdown(Duration::from_secs(1));
    /// assert!(core.is_closing());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Refuses new requests from now on, then waits up to `grace` (at most
    /// 100 years, so the deadline cannot overflow the clock) for those in
    /// flight to finish. Returns how many were still running at the end.
    ///
    /// # Examples
    ///
    /// A request prepared before the close still holds its place; one
    /// after it is refused:
    ///
    /// ```
    /// use server::dispatch::AgentCore;
    /// use std::time::Duration;
    /// # use wire::{encode_tensor_section, DType, Header, TensorDesc};
    /// # fn request(id: u64, model_id: u32, len: u64) -> (Header, Vec<u8>) {
    /// #     let t = TensorDesc { dtype: DType::U8, shape: vec![len], offset: 0, len };
    /// #     let mut desc = Vec::new();
    /// #     encode_tensor_section(&[t], None, &mut desc);
    /// #     let mut h = Header::new(wire::Kind::Request);
    /// #     (h.request_id, h.model_id, h.tensor_count) = (id, model_id, 1);
    /// #     (h.desc_len, h.payload_len) = (desc.len() as u32, len);
    /// #     (h, desc)
    /// # }
    /// let core = AgentCore::new(server::ModelRegistry::with_identity(), wire::Limits::default(), 1 << 20);
    /// let (h, desc) = request(1, 0, 8);
    /// let p = core.prepare(&h, &desc, &core.limits).map_err(|r| format!("{:?}", r.header.status))?;
    /// assert_eq!(core.close_and_drain(Duration::from_millis(10)), 1); // still running
    /// let refused = core.prepare(&h, &desc, &core.limits).err().ok_or("refused")?;
    /// assert_eq!(refused.header.status, wire::Status::ShuttingDown);
    /// drop(p);
    /// assert_eq!(core.close_and_drain(Duration::from_millis(10)), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close_and_drain(&self, grace: Duration) -> usize {
        // SeqCst with the in-flight count: see `prepare_via`.
        self.closing.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + grace.min(Duration::from_secs(100 * 365 * 24 * 3600));
        let mut g = self.drain_lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let n = self.in_flight.load(Ordering::SeqCst);
            let now = Instant::now();
            if n == 0 || now >= deadline {
                return n;
            }
            g = self
                .drain_cv
                .wait_timeout(g, (deadline - now).min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Requests currently between `prepare` and their reply.
    /// Examples: [`AgentCore`], [`AgentCore::close_and_drain`].
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Payload bytes of the agent-wide budget not held by a request now
    /// (all of it when nothing is in flight). Example: [`RESERVE_STEP`].
    pub fn payload_budget_left(&self) -> u64 {
        self.payload_budget.load(Ordering::Acquire)
    }

    /// Answers the Hello of a session of `who`: its [`Grant`] (the limits
    /// in force and its tenant) and the HelloAck; or the Error refusing it
    /// (a token no tenant lists, a tenant's session quota).
    ///
    /// # Examples
    ///
    /// A front end's first message of a session:
    ///
    /// ```
    /// use server::tenants::Identity;
    /// use wire::{decode_hello, encode_hello, Header, Kind, Limits};
    /// let agent = server::Agent::start(server::AgentConfig::default())?;
    /// let body = encode_hello(&Limits { max_in_flight: 2, ..Limits::default() });
    /// let mut h = Header::new(Kind::Hello);
    /// h.desc_len = body.len() as u32;
    /// let (grant, ack) = agent.core().hello(&h, &body, &Identity::REMOTE).map_err(|r| format!("{:?}", r.header.status))?;
    /// assert_eq!(ack.header.kind, Kind::HelloAck);
    /// assert_eq!(decode_hello(&ack.desc)?, grant.limits);
    /// assert_eq!(grant.limits.max_in_flight, 2);
    /// // Anything else first is refused:
    /// let refused = agent.core().hello(&Header::new(Kind::Ping), &[], &Identity::REMOTE).err().ok_or("refused")?;
    /// assert_eq!(refused.header.kind, Kind::Error);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hello(&self, h: &Header, body: &[u8], who: &Identity) -> Result<(Grant, Reply), Reply> {
        if h.kind != Kind::Hello {
            return Err(self.fail(Reply::error(
                h.request_id,
                Status::UnknownKind,
                &format!(
                    "the first message of a session must be Hello, not {:?}",
                    h.kind
                ),
            )));
        }
        let asked = decode_hello_request(body)
            .map_err(|e| self.fail(Reply::error(h.request_id, e.status(), &e.to_string())))?;
        // A relay speaking for a client it could not identify: known by
        // its token only, never by the relay's own credentials.
        let anonymous = Identity {
            cert_names: who.cert_names.clone(),
            ..Identity::REMOTE
        };
        let who = if asked.anonymous { &anonymous } else { who };
        let grant = self
            .grant(who, asked.token, &asked.limits)
            .map_err(|(status, msg)| self.fail(Reply::error(h.request_id, status, &msg)))?;
        let ack = Reply::control(Kind::HelloAck, h.request_id, 0, encode_hello(&grant.limits));
        Ok((grant, ack))
    }

    /// Answers a control message (anything but Hello and Request) on a
    /// session with `grant`: it lists and looks up only the models its
    /// tenant may use.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::dispatch::Grant;
    /// use wire::{decode_model_list, Header, Kind};
    /// let agent = server::Agent::start(server::AgentConfig::default())?;
    /// let core = agent.core();
    /// let grant = Grant::open(core.limits);
    /// let mut ping = Header::new(Kind::Ping);
    /// ping.request_id = 3;
    /// let pong = core.control(&ping, &[], &grant);
    /// assert_eq!((pong.header.kind, pong.header.request_id), (Kind::Pong, 3));
    /// let list = core.control(&Header::new(Kind::ListModels), &[], &grant);
    /// let models = decode_model_list(&list.desc)?;
    /// assert!(models.iter().any(|(_, sig)| sig.name == "identity"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn control(&self, h: &Header, body: &[u8], grant: &Grant) -> Reply {
        let limits = &grant.limits;
        if matches!(h.kind, Kind::Ping | Kind::ListModels) && !body.is_empty() {
            return self.fail(Reply::error(
                h.request_id,
                Status::Malformed,
                &format!("{:?} carries no body, got {} bytes", h.kind, body.len()),
            ));
        }
        match h.kind {
            Kind::Ping => Reply::control(Kind::Pong, h.request_id, 0, Vec::new()),
            Kind::ModelQuery => match decode_model_name(body) {
                Err(e) => self.fail(Reply::error(h.request_id, e.status(), &e.to_string())),
                // Rights first: a tenant learns nothing of models it may
                // not use, not even whether they exist.
                Ok(name) => match self.registry.find(name) {
                    _ if grant.seat.as_ref().is_some_and(|s| !s.may_see(name)) => {
                        let seat = grant.seat.as_ref().map(Seat::tenant_name);
                        if let Some(Ok(t)) = grant.seat.as_ref().map(Seat::tenant) {
                            t.usage.denied.fetch_add(1, Ordering::Relaxed);
                        }
                        self.fail(Reply::error(
                            h.request_id,
                            Status::PermissionDenied,
                            &format!(
                                "tenant '{}' may not use model '{name}' (see the agent's \
                                 tenants file)",
                                seat.unwrap_or_default()
                            ),
                        ))
                    }
                    None => self.fail(Reply::error(
                        h.request_id,
                        Status::UnknownModel,
                        &format!("no model named '{name}' (see `tensorwire models`)"),
                    )),
                    Some(m) => {
                        let mut b = Vec::new();
                        encode_signature(m.signature(), &mut b);
                        Reply::control(Kind::ModelInfo, h.request_id, m.id, b)
                    }
                },
            },
            Kind::ListModels => {
                let list: Vec<_> = self
                    .registry
                    .models()
                    .iter()
                    .filter(|m| {
                        grant
                            .seat
                            .as_ref()
                            .is_none_or(|s| s.may_see(&m.signature().name))
                    })
                    .map(|m| (m.id, m.signature().clone()))
                    .collect();
                let body = encode_model_list(&list);
                if body.len() > limits.max_desc_len as usize {
                    return self.fail(Reply::error(
                        h.request_id,
                        Status::LimitExceeded,
                        &format!(
                            "the model list is {} bytes, over the session's max_desc_len {}",
                            body.len(),
                            limits.max_desc_len
                        ),
                    ));
                }
                Reply::control(Kind::ModelList, h.request_id, 0, body)
            }
            Kind::Hello => self.fail(Reply::error(
                h.request_id,
                Status::UnknownKind,
                "Hello was already exchanged on this session",
            )),
            Kind::Release => self.fail(Reply::error(
                h.request_id,
                Status::UnknownKind,
                "Release only applies to shared-memory sessions",
            )),
            other => self.fail(Reply::error(
                h.request_id,
                Status::UnknownKind,
                &format!("{other:?} is not a message a client sends"),
            )),
        }
    }

    /// Takes `more` bytes of the payload budget for a request whose whole
    /// payload is `payload_len`; false when they are not there. A request
    /// of more than one [`RESERVE_STEP`] must leave the budget's small
    /// share ([`SMALL_SHARE`]) untouched.
    fn take_budget(&self, more: u64, payload_len: u64) -> bool {
        let keep = if payload_len <= RESERVE_STEP {
            0
        } else {
            self.small_share
        };
        self.payload_budget
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(more).filter(|rest| *rest >= keep)
            })
            .is_ok()
    }

    /// The refusal of request `id` (a `len`-byte payload) for want of
    /// payload budget.
    ///
    /// # Examples
    ///
    /// ```
    /// let core = server::dispatch::AgentCore::new(server::ModelRegistry::with_identity(), wire::Limits::default(), 1 << 20);
    /// let r = core.over_budget(9, 1 << 30);
    /// assert_eq!((r.header.request_id, r.header.status), (9, wire::Status::LimitExceeded));
    /// ```
    pub fn over_budget(&self, id: u64, len: u64) -> Reply {
        Reply::error(
            id,
            Status::LimitExceeded,
            &format!(
                "the agent is holding its maximum of request payload bytes in flight; \
                 a {len}-byte request cannot be taken now (retry later)"
            ),
        )
    }

    /// Checks a request before its payload is read: shutdown, model id,
    /// descriptors, and the tensors against the model's signature. (Counted
    /// in the model's statistics as [`Via::Other`], untimed: transports use
    /// [`prepare_via`](AgentCore::prepare_via).) Examples: [`AgentCore`],
    /// [`AgentCore::close_and_drain`] (refused while closing).
    pub fn prepare(&self, h: &Header, desc: &[u8], limits: &Limits) -> Result<Prepared<'_>, Reply> {
        self.prepare_in(h, desc, limits, Placement::Payload)
    }

    /// [`prepare`](AgentCore::prepare) for tensors placed as `placement`
    /// says. With [`Placement::Region`] (shared memory) the tensors already
    /// lie in the client's region and the agent allocates nothing for them,
    /// so they take nothing from the agent-wide payload budget (which
    /// bounds memory the agent allocates for payloads; a session's region
    /// is bounded by its own size). (Counted as [`Via::Other`], untimed,
    /// like [`prepare`](AgentCore::prepare).)
    pub fn prepare_in(
        &self,
        h: &Header,
        desc: &[u8],
        limits: &Limits,
        placement: Placement,
    ) -> Result<Prepared<'_>, Reply> {
        let grant = Grant::open(*limits);
        self.prepare_via(Via::Other, h, desc, &grant, placement, &Timeline::default())
    }

    /// [`prepare_in`](AgentCore::prepare_in) for a request that came `via`
    /// a transport, with the timeline `tl` its transport stamped `received`
    /// on ([`timeline`](AgentCore::timeline)): the request is counted for
    /// its model and transport, and a refusal from here on is recorded as
    /// a failure of the model, timed from `received`. The session's
    /// `grant` decides whether its tenant may call the model, and counts
    /// the request in the tenant's quotas.
    pub fn prepare_via(
        &self,
        via: Via,
        h: &Header,
        desc: &[u8],
        grant: &Grant,
        placement: Placement,
        tl: &Timeline,
    ) -> Result<Prepared<'_>, Reply> {
        let want = match placement {
            Placement::Payload => h.payload_len,
            Placement::Region { .. } => 0,
        };
        self.prepare_reserving(via, h, desc, grant, placement, tl, want)
    }

    /// [`prepare_via`](AgentCore::prepare_via) for a payload still to be
    /// read from a socket: it takes only its first [`RESERVE_STEP`] bytes
    /// of the agent-wide payload budget now, and the rest as it arrives
    /// ([`Prepared::reserve_through`]). So the budget counts bytes the
    /// agent holds, not bytes a peer declared: connections that declare
    /// large payloads and stall cannot take the whole budget from everyone
    /// else with a few bytes each.
    pub fn prepare_streamed(
        &self,
        via: Via,
        h: &Header,
        desc: &[u8],
        grant: &Grant,
        tl: &Timeline,
    ) -> Result<Prepared<'_>, Reply> {
        let want = h.payload_len.min(RESERVE_STEP);
        self.prepare_reserving(via, h, desc, grant, Placement::Payload, tl, want)
    }

    /// The body of the `prepare` family: checks, then takes `want` bytes
    /// of the payload budget.
    #[allow(clippy::too_many_arguments)]
    fn prepare_reserving(
        &self,
        via: Via,
        h: &Header,
        desc: &[u8],
        grant: &Grant,
        placement: Placement,
        tl: &Timeline,
        want: u64,
    ) -> Result<Prepared<'_>, Reply> {
        let id = h.request_id;
        let limits = &grant.limits;
        // Failures are timed like successes: only while the agent times.
        let arrived = if self.timing {
            tl.get(Stage::Received)
        } else {
            0
        };
        if self.is_closing() {
            if let Some(m) = self.registry.get(h.model_id) {
                m.stats.record_refused(via, arrived);
            }
            return Err(self.fail(Reply::error(
                id,
                Status::ShuttingDown,
                "the agent is shutting down and accepts no new requests",
            )));
        }
        let found = self.registry.get(h.model_id);
        // A tenant's rights come before the model's existence: ids it may
        // not call and ids no model has get the same answer, and its
        // probes count against no model's statistics.
        let ticket = match &grant.seat {
            None => None,
            Some(seat) => Some(
                seat.admit_id(h.model_id, found.as_deref(), h.payload_len)
                    .map_err(|(status, msg)| self.fail(Reply::error(id, status, &msg)))?,
            ),
        };
        let model = found.ok_or_else(|| {
            self.fail(Reply::error(
                id,
                Status::UnknownModel,
                &format!(
                    "no model has id {} (resolve names with ModelQuery; a model that was \
                     unloaded or reloaded answers its old id no more)",
                    h.model_id
                ),
            ))
        })?;
        let stats = &model.stats;
        stats.arrived(via);
        // From here a refusal is a failure of this model.
        let refuse = |r: Reply| {
            stats.record_failure(arrived);
            self.fail(r)
        };
        let section = decode_tensor_section_in(h, desc, placement)
            .map_err(|e| refuse(Reply::error(id, e.status(), &e.to_string())))?;
        let metas: Vec<(wire::DType, &[u64])> = section
            .tensors
            .iter()
            .map(|t| (t.dtype, t.shape.as_slice()))
            .collect();
        model
            .backend
            .check_inputs(&metas)
            .map_err(|e| refuse(Reply::error(id, Status::InvalidInput, &e.to_string())))?;
        // Reserve the payload's bytes (or their first step) before any are
        // read: memory held by requests is bounded agent-wide, not only per
        // connection. (Nothing to reserve over shared memory: skip the
        // atomic.)
        let reserved = if want == 0 {
            true
        } else {
            self.take_budget(want, h.payload_len)
        };
        if !reserved {
            return Err(refuse(self.over_budget(id, h.payload_len)));
        }
        // Counted in flight before the second look at `closing` below;
        // `close_and_drain` sets `closing` before it reads the count. With
        // both sides SeqCst, either the drain sees this request or this
        // request sees the drain: none slips past a drain that saw 0.
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        stats.admitted();
        let prepared = Prepared {
            model: model.clone(),
            tensors: section.tensors,
            request_id: id,
            want_timeline: h.flags & flags::WANT_TIMELINE != 0,
            limits: *limits,
            ask: tenant_ask(&model, h, ticket.as_ref()),
            ticket,
            _in_flight: InFlight {
                core: self,
                reserved: AtomicU64::new(want),
                payload_len: h.payload_len,
                model,
                arrived,
                answered: AtomicBool::new(false),
            },
        };
        if self.closing.load(Ordering::SeqCst) {
            // Undone by the guard's drop: the count, the reserved bytes,
            // and the model's failure.
            drop(prepared);
            return Err(self.fail(Reply::error(
                id,
                Status::ShuttingDown,
                "the agent is shutting down and accepts no new requests",
            )));
        }
        Ok(prepared)
    }

    /// Runs a prepared request on `inputs` through its model's queue and
    /// builds the response (or the error), with the outputs laid out as a
    /// payload (stream transports; in-process). Example: [`AgentCore`].
    pub fn execute(&self, p: &Prepared<'_>, inputs: &[TensorView<'_>], tl: &mut Timeline) -> Reply {
        self.execute_placing(p, inputs, tl, |_| Ok(()))
    }

    /// [`execute`](AgentCore::execute), with `place` given the checked
    /// outputs before the response is built: a front door copies the ones
    /// its caller wants elsewhere (Triton's shared-memory regions) there,
    /// so the copy counts in the request's `compute_output` stage as a
    /// native shm session's copy into its arena does. An `Err(message)`
    /// from `place` fails the request as invalid input (an output that does
    /// not fit where the caller wants it).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::{Agent, AgentConfig};
    /// use wire::Kind;
    /// # use wire::{encode_tensor_section, DType, Header, TensorDesc};
    /// # fn request(id: u64, model_id: u32, len: u64) -> (Header, Vec<u8>) {
    /// #     let t = TensorDesc { dtype: DType::U8, shape: vec![len], offset: 0, len };
    /// #     let mut desc = Vec::new();
    /// #     encode_tensor_section(&[t], None, &mut desc);
    /// #     let mut h = Header::new(wire::Kind::Request);
    /// #     (h.request_id, h.model_id, h.tensor_count) = (id, model_id, 1);
    /// #     (h.desc_len, h.payload_len) = (desc.len() as u32, len);
    /// #     (h, desc)
    /// # }
    /// let agent = Agent::start(AgentConfig::default())?;
    /// let core = agent.core();
    /// let model = core.registry.find("identity").ok_or("identity is always served")?;
    /// let payload = [1u8, 2, 3, 4];
    /// let mut elsewhere = [0u8; 4]; // where the caller wants the output
    ///
    /// let (h, desc) = request(7, model.id, 4);
    /// let p = core.prepare(&h, &desc, &core.limits).map_err(|r| format!("{:?}", r.header.status))?;
    /// let inputs = p.views(&payload);
    /// let mut tl = core.timeline(&h);
    /// let reply = core.execute_placing(&p, &inputs, &mut tl, |outputs| {
    ///     elsewhere.copy_from_slice(outputs[0].bytes(&inputs));
    ///     Ok(())
    /// });
    /// assert_eq!((reply.header.kind, elsewhere), (Kind::Response, payload));
    ///
    /// // A place that cannot take the output fails the request.
    /// let (h, desc) = request(8, model.id, 4);
    /// let p = core.prepare(&h, &desc, &core.limits).map_err(|r| format!("{:?}", r.header.status))?;
    /// let inputs = p.views(&payload);
    /// let reply = core.execute_placing(&p, &inputs, &mut tl, |_| Err("no room".into()));
    /// assert_eq!((reply.header.kind, reply.header.status), (Kind::Error, wire::Status::InvalidInput));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execute_placing(
        &self,
        p: &Prepared<'_>,
        inputs: &[TensorView<'_>],
        tl: &mut Timeline,
        place: impl FnOnce(&[Output]) -> Result<(), String>,
    ) -> Reply {
        let outputs = match self.run(p, inputs, tl) {
            Ok(o) => o,
            Err(e) => return e,
        };
        let lens = match self.check_outputs(p, &outputs, inputs) {
            Ok(l) => l,
            Err(e) => return e,
        };
        if let Err(m) = place(&outputs) {
            return self.fail(Reply::error(p.request_id, Status::InvalidInput, &m));
        }
        let Some((offsets, payload_len)) = layout_payload(lens.iter().copied()) else {
            return self.fail(Reply::error(
                p.request_id,
                Status::Internal,
                "output layout overflows",
            ));
        };
        let descs: Vec<TensorDesc> = outputs
            .iter()
            .zip(offsets)
            .zip(&lens)
            .map(|((o, offset), &len)| TensorDesc {
                dtype: o.dtype,
                shape: o.shape.clone(),
                offset,
                len,
            })
            .collect();
        match self.respond(p, &descs, payload_len, tl) {
            Ok(mut r) => {
                r.outputs = outputs;
                r
            }
            Err(e) => e,
        }
    }

    /// Runs the model on `inputs` through its queue (stamping the queue and
    /// compute stages), batched with other requests when the model batches
    /// ([`crate::batcher`]). Engine errors and panics become Error replies.
    pub fn run(
        &self,
        p: &Prepared<'_>,
        inputs: &[TensorView<'_>],
        tl: &mut Timeline,
    ) -> Result<Vec<Output>, Reply> {
        let tenant = p.tenant().map(|t| &**t);
        let result = crate::batcher::run_for(&p.model, p.ask, tenant, tl, inputs);
        self.engine_result(p, result)
    }

    /// Like [`run`](AgentCore::run), with the engine writing output `i`
    /// into `outputs[i]` ([`engine::Backend::run_into`]; sizes from
    /// [`engine::Backend::output_shapes`]). A request that may join a
    /// batch runs through the batcher instead and its outputs are copied
    /// into `outputs` (counted with the batch's output copies).
    pub fn run_into(
        &self,
        p: &Prepared<'_>,
        inputs: &[TensorView<'_>],
        outputs: &mut [&mut [u8]],
        tl: &mut Timeline,
    ) -> Result<(), Reply> {
        if !p.model.batcher.runs_alone(&p.model.queue, inputs) {
            // It may join a batch: the batch's outputs are copied in.
            let produced = self.run(p, inputs, tl)?;
            return self.copy_into(p, &produced, inputs, outputs);
        }
        let backend = &p.model.backend;
        let tenant = p.tenant().map(|t| &**t);
        let result = p.model.queue.run_preemptible(
            p.ask,
            tenant,
            tl,
            || {
                std::panic::catch_unwind(AssertUnwindSafe(|| {
                    backend.run_into(inputs, &mut *outputs)
                }))
            },
            crate::batcher::stopped,
        );
        self.engine_result(p, result)
    }

    /// Copies `produced` into `outputs` (one buffer per output, exactly
    /// its size).
    fn copy_into(
        &self,
        p: &Prepared<'_>,
        produced: &[Output],
        inputs: &[TensorView<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), Reply> {
        let internal = |m: String| self.fail(Reply::error(p.request_id, Status::Internal, &m));
        if produced.len() != outputs.len() {
            return Err(internal(format!(
                "model '{}' gave {} outputs for {} buffers",
                p.model.signature().name,
                produced.len(),
                outputs.len()
            )));
        }
        for (i, (o, dst)) in produced.iter().zip(outputs.iter_mut()).enumerate() {
            let src = o.bytes(inputs);
            if src.len() != dst.len() {
                return Err(internal(format!(
                    "model '{}' output {i} is {} bytes, its buffer {}",
                    p.model.signature().name,
                    src.len(),
                    dst.len()
                )));
            }
            crate::movers().move_bytes(dst, src);
        }
        let bytes: usize = outputs.iter().map(|b| b.len()).sum();
        p.model.stats.record_batch_copy(0, 0, bytes as u64);
        Ok(())
    }

    fn engine_result<T>(
        &self,
        p: &Prepared<'_>,
        result: Result<std::thread::Result<Result<T, engine::EngineError>>, Refused>,
    ) -> Result<T, Reply> {
        let result = match result {
            Ok(r) => r,
            Err(refused) => {
                let status = match refused {
                    Refused::Overloaded { .. } | Refused::TenantQueueFull { .. } => {
                        Status::Overloaded
                    }
                    Refused::Timeout { .. } => Status::Timeout,
                    Refused::BadPriority { .. } => Status::InvalidInput,
                    Refused::CallerGone => Status::Unavailable,
                };
                let msg = format!("model '{}': {refused}", p.model.signature().name);
                return Err(self.fail(Reply::error(p.request_id, status, &msg)));
            }
        };
        match result {
            Ok(Ok(o)) => Ok(o),
            Ok(Err(e)) => {
                let status = match e {
                    engine::EngineError::InvalidInput(_) => Status::InvalidInput,
                    engine::EngineError::Unavailable(_) => Status::Unavailable,
                    _ => Status::EngineError,
                };
                Err(self.fail(Reply::error(p.request_id, status, &e.to_string())))
            }
            Err(_) => Err(self.fail(Reply::error(
                p.request_id,
                Status::Internal,
                &format!("model '{}' panicked", p.model.signature().name),
            ))),
        }
    }

    /// Checks what the engine produced: every output's bytes match its dtype
    /// and shape, and aliases name an input that exists. Returns each
    /// output's byte length.
    pub fn check_outputs(
        &self,
        p: &Prepared<'_>,
        outputs: &[Output],
        inputs: &[TensorView<'_>],
    ) -> Result<Vec<u64>, Reply> {
        let internal = |m: String| self.fail(Reply::error(p.request_id, Status::Internal, &m));
        let mut lens = Vec::with_capacity(outputs.len());
        for (i, o) in outputs.iter().enumerate() {
            let have = o.bytes(inputs).len() as u64;
            if let OutputData::Input(n) = o.data {
                if n >= inputs.len() {
                    return Err(internal(format!("output {i} aliases missing input {n}")));
                }
            }
            let want = TensorDesc::byte_len(o.dtype, &o.shape);
            if want != Some(have) {
                return Err(internal(format!(
                    "engine produced output {i} of {have} bytes for {}{:?}",
                    o.dtype, o.shape
                )));
            }
            lens.push(have);
        }
        Ok(lens)
    }

    /// The Response for `p` describing `descs` (placed by the caller: a
    /// payload layout, or offsets into a shared region) with `payload_len`
    /// bytes of tensors: stamps `ResponseSent` and attaches the timeline if
    /// asked, checks the session's limits, counts the response (and the
    /// model's success, timed from `tl`). The reply carries no outputs; a
    /// caller sending a payload attaches them.
    pub fn respond(
        &self,
        p: &Prepared<'_>,
        descs: &[TensorDesc],
        payload_len: u64,
        tl: &mut Timeline,
    ) -> Result<Reply, Reply> {
        let mut header = Header::new(Kind::Response);
        header.request_id = p.request_id;
        header.model_id = p.model.id;
        header.tensor_count = descs.len() as u32;
        header.payload_len = payload_len;
        // Sized exactly: a response with no tensors and no timeline (an
        // empty RPC) allocates nothing.
        let timeline_len = if p.want_timeline { TIMELINE_LEN } else { 0 };
        let mut desc =
            Vec::with_capacity(descs.iter().map(|d| d.encoded_len()).sum::<usize>() + timeline_len);
        // Taken whenever the timeline stamps (asked, or timed for stats).
        tl.stamp(Stage::ResponseSent);
        if p.want_timeline {
            header.flags |= flags::HAS_TIMELINE;
            encode_tensor_section(descs, Some(tl), &mut desc);
        } else {
            encode_tensor_section(descs, None, &mut desc);
        }
        header.desc_len = desc.len() as u32;
        // A response must fit the session's limits like any message (the
        // client checks them too).
        if let Err(e) = header.check_limits(&p.limits) {
            return Err(self.fail(Reply::error(
                p.request_id,
                Status::LimitExceeded,
                &format!("the response breaks the session limits: {e}"),
            )));
        }
        self.counters.responses.fetch_add(1, Ordering::Relaxed);
        p.model.stats.record_success(tl, self.timing);
        p._in_flight.answered.store(true, Ordering::Relaxed);
        Ok(Reply {
            header,
            desc,
            outputs: Vec::new(),
        })
    }

    /// Counts an error reply and passes it through.
    pub fn fail(&self, r: Reply) -> Reply {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::DType;

    fn request(len: u64) -> (Header, Vec<u8>) {
        let t = TensorDesc {
            dtype: DType::U8,
            shape: vec![len],
            offset: 0,
            len,
        };
        let mut desc = Vec::new();
        encode_tensor_section(&[t], None, &mut desc);
        let mut h = Header::new(Kind::Request);
        h.request_id = 1;
        h.tensor_count = 1;
        h.desc_len = desc.len() as u32;
        h.payload_len = len;
        (h, desc)
    }

    #[test]
    fn a_streamed_payload_takes_the_budget_as_it_arrives() {
        let step = RESERVE_STEP;
        // Four steps: half a step of it is kept for one-step requests.
        let core = AgentCore::new(ModelRegistry::with_identity(), Limits::default(), 4 * step);
        let grant = Grant::open(core.limits);
        let tl = Timeline::default();
        let (big, bd) = request(10 * step);
        // Declared 10 steps against a 3-step budget: admitted on its first.
        let a = core
            .prepare_streamed(Via::Other, &big, &bd, &grant, &tl)
            .expect("its first step fits");
        let b = core
            .prepare_streamed(Via::Other, &big, &bd, &grant, &tl)
            .expect("so does another's");
        // Declared sizes no longer starve a small request.
        let (small, sd) = request(100);
        drop(
            core.prepare(&small, &sd, &core.limits)
                .expect("room is left"),
        );
        assert!(a.reserve_through(2 * step), "the third step fits");
        assert!(!a.reserve_through(3 * step), "a fourth does not");
        assert!(a.reserve_through(step), "what it holds is held");
        drop((a, b));
        let whole = core
            .prepare(&small, &sd, &core.limits)
            .expect("everything given back");
        assert!(whole.reserve_through(100));
        drop(whole);
        assert_eq!(
            core.payload_budget.load(Ordering::Relaxed),
            4 * step,
            "the budget is whole again"
        );
    }

    #[test]
    fn large_payloads_leave_the_small_share_of_the_budget() {
        let step = RESERVE_STEP;
        // Eight steps: one of them only for requests of one step or less.
        let core = AgentCore::new(ModelRegistry::with_identity(), Limits::default(), 8 * step);
        let grant = Grant::open(core.limits);
        let tl = Timeline::default();
        let (big, bd) = request(32 * step);
        let a = core
            .prepare_streamed(Via::Other, &big, &bd, &grant, &tl)
            .expect("its first step fits");
        let mut end = step;
        while a.reserve_through(end + step) {
            end += step;
        }
        assert_eq!(
            end,
            7 * step,
            "a large payload stops short of the small share"
        );
        assert!(
            core.prepare_streamed(Via::Other, &big, &bd, &grant, &tl)
                .is_err(),
            "so does another one's first step"
        );
        let (small, sd) = request(300);
        let (one_step, od) = request(step);
        let s1 = core
            .prepare_streamed(Via::Other, &small, &sd, &grant, &tl)
            .expect("a small request is still taken");
        drop(s1);
        let s2 = core
            .prepare_streamed(Via::Other, &one_step, &od, &grant, &tl)
            .expect("so is one of exactly one step");
        assert!(s2.reserve_through(step));
        drop((a, s2));
        assert_eq!(core.payload_budget.load(Ordering::Relaxed), 8 * step);
    }

    #[test]
    fn the_buffer_pool_keeps_at_most_the_payload_budget() {
        let core = AgentCore::new(ModelRegistry::with_identity(), Limits::default(), 1 << 20);
        let bufs: Vec<_> = (0..3)
            .map(|_| core.pool.take(512 << 10).expect("buffer"))
            .collect();
        drop(bufs);
        assert_eq!(
            core.pool.held(),
            2,
            "two 512 KiB buffers are the 1 MiB budget"
        );
    }

    #[test]
    fn payload_budget_bounds_bytes_in_flight_agent_wide() {
        let core = AgentCore::new(ModelRegistry::with_identity(), Limits::default(), 1000);
        let (h, d) = request(600);
        let first = core.prepare(&h, &d, &core.limits).expect("fits the budget");
        let refused = core
            .prepare(&h, &d, &core.limits)
            .expect_err("over the budget");
        assert_eq!(refused.header.status, Status::LimitExceeded);
        assert_eq!(core.in_flight(), 1);
        let (small, sd) = request(400);
        let second = core
            .prepare(&small, &sd, &core.limits)
            .expect("what is left fits");
        drop((first, second));
        assert_eq!(core.in_flight(), 0);
        assert!(
            core.prepare(&h, &d, &core.limits).is_ok(),
            "budget returned on drop"
        );
    }

    /// No request is admitted past a drain that saw none in flight: while
    /// threads keep preparing requests, `close_and_drain` returns 0 only
    /// when no request holds a `Prepared`, and none is prepared after.
    #[test]
    fn no_request_slips_past_a_drain() {
        use std::sync::atomic::AtomicUsize;
        for _ in 0..20 {
            let core = std::sync::Arc::new(AgentCore::new(
                ModelRegistry::with_identity(),
                Limits::default(),
                1 << 20,
            ));
            let drained = std::sync::Arc::new(AtomicBool::new(false));
            let slipped = std::sync::Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let (core, drained, slipped) = (core.clone(), drained.clone(), slipped.clone());
                    std::thread::spawn(move || {
                        let (h, d) = request(8);
                        while !drained.load(Ordering::SeqCst) || !core.is_closing() {
                            if let Ok(p) = core.prepare(&h, &d, &core.limits) {
                                if drained.load(Ordering::SeqCst) {
                                    slipped.fetch_add(1, Ordering::SeqCst);
                                }
                                drop(p);
                            }
                            if drained.load(Ordering::SeqCst) {
                                break;
                            }
                        }
                    })
                })
                .collect();
            std::thread::yield_now();
            assert_eq!(core.close_and_drain(Duration::from_secs(5)), 0);
            drained.store(true, Ordering::SeqCst);
            for t in threads {
                t.join().expect("thread");
            }
            assert_eq!(slipped.load(Ordering::SeqCst), 0);
            assert_eq!(core.in_flight(), 0);
        }
    }

    /// Fails every run (its inputs: anything).
    struct Failing(wire::ModelSignature);

    impl engine::Backend for Failing {
        fn signature(&self) -> &wire::ModelSignature {
            &self.0
        }
        fn check_inputs(&self, _: &[(DType, &[u64])]) -> Result<(), engine::EngineError> {
            Ok(())
        }
        fn run(&self, _: &[TensorView<'_>]) -> Result<Vec<Output>, engine::EngineError> {
            Err(engine::EngineError::Run("always".into()))
        }
    }

    /// A core serving identity (id 0) and `failing` (id 1).
    fn core_with_failing(timing: bool) -> AgentCore {
        let mut reg = ModelRegistry::with_identity();
        reg.add(
            Arc::new(Failing(wire::ModelSignature {
                name: "failing".into(),
                inputs: Vec::new(),
                outputs: Vec::new(),
            })),
            1,
        );
        AgentCore::new(reg, Limits::default(), 1 << 20).with_request_timing(timing)
    }

    /// One request for `model_id` through prepare_via and execute, as a
    /// socket session does; the reply's kind.
    fn serve(core: &AgentCore, via: Via, model_id: u32) -> Kind {
        let (mut h, d) = request(8);
        h.model_id = model_id;
        let mut tl = core.timeline(&h);
        tl.stamp(Stage::Received);
        let payload = [7u8; 8];
        match core.prepare_via(
            via,
            &h,
            &d,
            &Grant::open(core.limits),
            Placement::Payload,
            &tl,
        ) {
            Err(r) => r.header.kind,
            Ok(p) => {
                tl.stamp(Stage::PayloadInPlace);
                let views = p.views(&payload);
                core.execute(&p, &views, &mut tl).header.kind
            }
        }
    }

    #[test]
    fn every_outcome_is_counted_for_its_model_and_transport() {
        let core = core_with_failing(true);
        for _ in 0..3 {
            assert_eq!(serve(&core, Via::Shm, 0), Kind::Response);
        }
        assert_eq!(serve(&core, Via::Tcp, 0), Kind::Response);
        assert_eq!(serve(&core, Via::Unix, 1), Kind::Error);
        let id = core.registry.get(0).expect("identity").stats.snapshot();
        assert_eq!(id.success.count, 4);
        assert_eq!((id.inference_count, id.execution_count), (4, 4));
        assert_eq!(id.fail.count, 0);
        assert_eq!(id.by_via[Via::Shm as usize], 3);
        assert_eq!(id.by_via[Via::Tcp as usize], 1);
        assert_eq!(id.in_flight, 0);
        assert_eq!(
            id.request_hist.iter().sum::<u64>(),
            4,
            "every success timed"
        );
        assert_eq!(id.compute_hist.iter().sum::<u64>(), 4);
        assert!(id.success.ns > 0 && id.compute_infer.ns > 0);
        assert!(id.success.ns >= id.compute_infer.ns + id.queue.ns);
        assert!(id.last_inference_ms > 0);
        let f = core.registry.get(1).expect("failing").stats.snapshot();
        assert_eq!((f.success.count, f.fail.count), (0, 1));
        assert!(f.fail.ns > 0, "a failure is timed from its arrival");
        assert_eq!(f.by_via[Via::Unix as usize], 1);
        assert_eq!(f.in_flight, 0);
    }

    #[test]
    fn a_placed_output_is_timed_in_compute_output_and_a_refused_place_fails() {
        let core = core_with_failing(true);
        let (h, d) = request(8);
        let payload = [7u8; 8];
        let nap = Duration::from_millis(20);
        let grant = Grant::open(core.limits);
        let admit = |tl: &Timeline| {
            core.prepare_via(Via::Grpc, &h, &d, &grant, Placement::Payload, tl)
                .expect("admitted")
        };
        let mut tl = core.timeline(&h);
        tl.stamp(Stage::Received);
        let p = admit(&tl);
        let views = p.views(&payload);
        let mut placed = Vec::new();
        let reply = core.execute_placing(&p, &views, &mut tl, |outputs| {
            std::thread::sleep(nap); // a copy that takes a while
            placed.extend_from_slice(outputs[0].bytes(&views));
            Ok(())
        });
        assert_eq!(
            (reply.header.kind, placed),
            (Kind::Response, payload.to_vec())
        );
        let stage = tl
            .span(Stage::ComputeEnd, Stage::ResponseSent)
            .expect("stamped");
        assert!(
            stage >= nap.as_nanos() as u64,
            "the place is inside compute_output: {stage} ns"
        );
        drop(p);
        let s = core.registry.get(0).expect("identity").stats.snapshot();
        assert!(
            s.compute_output.ns >= nap.as_nanos() as u64,
            "and in the model's statistics"
        );

        // A place that refuses fails the request: counted, with its message.
        let mut tl = core.timeline(&h);
        let p = admit(&tl);
        let views = p.views(&payload);
        let reply = core.execute_placing(&p, &views, &mut tl, |_| Err("no room for it".into()));
        assert_eq!(
            (reply.header.kind, reply.header.status),
            (Kind::Error, Status::InvalidInput)
        );
        assert_eq!(
            wire::decode_error_body(&reply.desc).as_deref(),
            Ok("no room for it")
        );
        drop(p);
        let s = core.registry.get(0).expect("identity").stats.snapshot();
        assert_eq!((s.success.count, s.fail.count), (1, 1));
    }

    #[test]
    fn refusals_and_abandoned_requests_are_failures() {
        let core = core_with_failing(true);
        let stats = &core.registry.get(0).expect("identity").stats;
        // Refused in prepare: descriptors that do not fit the payload.
        let (mut h, d) = request(8);
        h.payload_len = 4;
        let tl = core.timeline(&h);
        let r = core.prepare_via(
            Via::Tcp,
            &h,
            &d,
            &Grant::open(core.limits),
            Placement::Payload,
            &tl,
        );
        assert_eq!(r.expect_err("refused").header.kind, Kind::Error);
        assert_eq!(stats.snapshot().fail.count, 1);
        assert_eq!(stats.in_flight(), 0, "a refusal is never in flight");
        // Prepared, then dropped without an answer (the peer went away).
        let (h, d) = request(8);
        let p = core
            .prepare_via(
                Via::Tcp,
                &h,
                &d,
                &Grant::open(core.limits),
                Placement::Payload,
                &tl,
            )
            .expect("prepared");
        assert_eq!(stats.in_flight(), 1);
        drop(p);
        let v = stats.snapshot();
        assert_eq!((v.success.count, v.fail.count, v.in_flight), (0, 2, 0));
        assert_eq!(v.by_via[Via::Tcp as usize], 2);
        // Refused at shutdown: still this model's failure.
        core.close_and_drain(Duration::ZERO);
        let (h, d) = request(8);
        assert!(core
            .prepare_via(
                Via::Tcp,
                &h,
                &d,
                &Grant::open(core.limits),
                Placement::Payload,
                &tl
            )
            .is_err());
        assert_eq!(stats.snapshot().fail.count, 3);
    }

    #[test]
    fn without_request_timing_only_counts_move() {
        let core = core_with_failing(false);
        assert!(!core.request_timing());
        assert_eq!(serve(&core, Via::Inproc, 0), Kind::Response);
        assert_eq!(serve(&core, Via::Inproc, 1), Kind::Error);
        let id = core.registry.get(0).expect("identity").stats.snapshot();
        assert_eq!(id.success, crate::stats::CountNs { count: 1, ns: 0 });
        assert_eq!(id.request_hist.iter().sum::<u64>(), 0);
        assert!(id.last_inference_ms > 0, "last_inference without timing");
        let f = core.registry.get(1).expect("failing").stats.snapshot();
        assert_eq!(f.fail, crate::stats::CountNs { count: 1, ns: 0 });
        // A timeline nobody asked for takes no stamps.
        let (h, _) = request(8);
        let mut tl = core.timeline(&h);
        tl.stamp(Stage::Received);
        assert_eq!(tl.get(Stage::Received), 0);
    }
}
