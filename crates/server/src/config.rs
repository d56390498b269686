//! Agent configuration: from command-line flags or a TOML file (same settings).
//!
//! ```toml
//! listen = ["unix:///tmp/tensorwire.sock", "tcp://127.0.0.1:7070"]
//!                          # also grpc://HOST:PORT, http://HOST:PORT: KServe front doors
//! intra_threads = 2        # ONNX Runtime threads per run
//! intra_spinning = true    # intra-op threads spin after a run before sleeping (ONNX Runtime's default)
//! inter_threads = 1
//!
//! [[model]]
//! name = "digits"
//! path = "models/build/digits_mlp.onnx"
//! concurrency = 1          # runs of this model at once, its engine instances (default 1)
//! intra_threads = 1        # this model's ONNX Runtime threads per run (default: the agent's)
//! intra_spinning = false   # whether they spin (default: the agent's intra_spinning)
//! max_queue = 0            # most requests waiting; one more is refused `overloaded` (0 = no limit)
//! priority_levels = 1      # request priorities 1 (highest) ..= this
//! default_priority = 1     # level of a request that names none (default: the lowest)
//! priority_aging_ms = 1000 # a waiting request rises a level per this long (starvation bound)
//! queue_timeout_ms = 0     # longest wait of a request that names no timeout (0 = none)
//! preempt = false          # a request whose turn comes first stops a run in progress (needs ≥ 2 levels)
//! max_batch = 1            # most rows per engine run: > 1 batches waiting requests (dynamic first dim)
//! max_queue_delay_us = 0   # how long a batch's first request may wait for more
//! preferred_batch_sizes = [] # batch sizes to stop at (e.g. [4, 8])
//!
//! [limits]                 # per session; defaults shown
//! max_tensors = 64
//! max_in_flight = 256
//! max_payload = 268435456
//! max_desc_len = 65536
//! max_total_payload = 2147483648  # agent-wide: request payload bytes held at once
//! stall_timeout_ms = 30000 # a peer silent this long mid-message is dropped
//!
//! [connections]            # who may hold how many connections; defaults shown
//! max = 8192               # agent-wide (each costs one file descriptor)
//! max_per_peer = 1024      # per uid (unix, shm), source address (tcp) or CID (vsock); at most max
//! handshake_timeout_ms = 3000  # a connection without a Hello this long is closed
//! idle_timeout_ms = 0      # a session idle this long is closed (0 = never)
//!
//! [socket]                 # unix:// and tcp:// sessions; defaults shown
//! spin_us = 50             # a session polls this long for its next request before parking
//!
//! [shm]                    # shared-memory sessions (shm://name); defaults shown
//! spin_us = 50             # a session spins this long before sleeping on its futex
//! client_bytes = 268435456 # each session's input region (virtual until touched)
//! agent_bytes = 67108864   # each session's output region
//! ring_slots = 256         # 64-byte slots per ring (a power of two, 8..=65536)
//! park_after_ms = 250      # a session quiet this long gives its thread back
//! allow_kernel_pull = false # let clients have their inputs pulled from their memory (mover=kernel)
//!
//! [stats]                  # per-model statistics and metrics; default shown
//! request_timing = true    # time every request's stages (4 clock reads); false: counts only
//!
//! [access]                 # who may reach the agent; defaults shown
//! tenants = ""             # a tenants file (server::tenants): identities, rights, quotas
//! socket_mode = "0600"     # unix:// sockets and shm:// control sockets: owner only
//! socket_group = ""        # their group (a name or a gid; "" = the agent's)
//! insecure = false         # allow tcp/grpc/http listeners beyond loopback (clear text;
//!                          # vsock:// needs no leave: it never leaves the host)
//!
//! [tls]                    # the agent's certificate, for tls://, https:// and grpcs:// listeners
//! cert = ""                # PEM certificate chain, the agent's own first
//! key = ""                 # PEM private key of that certificate
//! client_ca = ""           # PEM CA: when set, clients must show a certificate it signed (mutual TLS)
//! ```
//!
//! `listen` takes the agent's own endpoints (`unix://`, `tcp://`, `tls://`,
//! `shm://`, `inproc://`, which go to [`AgentConfig::listen`]) and the
//! KServe v2 front doors (`grpc://HOST:PORT`, `http://HOST:PORT`, and with
//! TLS `grpcs://HOST:PORT`, `https://HOST:PORT`, which go to
//! [`AgentConfig::front_doors`]): this crate does not serve those itself
//! (it knows no KServe); `tensorwire serve` and the Python `Agent` start
//! them beside the agent with `frontend::FrontDoors`. Any other scheme is
//! refused with an error naming the URI and the schemes there are
//! ([`parse_listen`]).
//!
//! What each `[connections]` limit protects against: `max` keeps the agent
//! inside its file-descriptor limit; `max_per_peer` stops one user (or one
//! address) from taking every slot, so other peers still get in when one
//! floods; `handshake_timeout_ms` stops connections that never say Hello
//! from holding slots at all; `idle_timeout_ms` reclaims sessions a client
//! forgot (off by default: the clients keep their connection for reuse).
//! Waiting and idle connections hold no thread (`server::reactor`).

use crate::batcher::BatchPolicy;
use crate::queue::QueuePolicy;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;
use transport::shm::ShmSizes;
use transport::tls::ServerTlsFiles;
use transport::Endpoint;
use wire::Limits;

/// Longest spin budget a session thread may be given (10 ms): one that
/// spins longer mostly burns a core another thread (an engine's) could use.
///
/// # Examples
///
/// ```
/// use server::config::MAX_SPIN_US;
/// let mut cfg = server::AgentConfig::default();
/// cfg.shm_spin_us = MAX_SPIN_US + 1;
/// assert!(cfg.validate().is_err());
/// cfg.shm_spin_us = MAX_SPIN_US;
/// assert!(cfg.validate().is_ok());
/// ```
pub const MAX_SPIN_US: u64 = 10_000;

/// A configuration that cannot be used.
///
/// # Examples
///
/// ```
/// use server::{AgentConfig, ConfigError};
/// let e = AgentConfig::from_toml("listen = [\"ftp://x\"]").unwrap_err();
/// assert!(matches!(e, ConfigError::Invalid(_)));
/// assert!(e.to_string().contains("unknown scheme 'ftp'"));
/// let e = AgentConfig::from_file("no/such/agent.toml".as_ref()).unwrap_err();
/// assert!(matches!(e, ConfigError::Read { .. }));
/// ```
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A setting is out of range or inconsistent.
    #[error("invalid setting: {0}")]
    Invalid(String),
}

/// One model to serve.
///
/// # Examples
///
/// ```
/// use server::{AgentConfig, ModelConfig};
/// let mut digits = ModelConfig::new("digits", "models/build/digits_mlp.onnx");
/// digits.max_batch = 16;
/// digits.max_queue_delay_us = 500;
/// let cfg = AgentConfig { models: vec![digits], ..AgentConfig::default() };
/// cfg.validate()?;
/// # Ok::<(), server::ConfigError>(())
/// ```
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The name clients ask for.
    pub name: String,
    /// The ONNX file.
    pub path: PathBuf,
    /// How many runs of this model may execute at once (its engine
    /// instances: one ONNX Runtime session each). `instances` in a file.
    #[serde(default = "one", alias = "instances")]
    pub concurrency: usize,
    /// ONNX Runtime intra-op threads of this model's runs; `None`: the
    /// agent's [`AgentConfig::intra_threads`]. A model whose operators are
    /// too small to split (LeNet: ~8 µs a run) gains nothing from a
    /// second thread, and that thread's spinning takes a core its clients
    /// need, while a larger one (MobileNetV2) needs both (figures:
    /// `docs/BENCHMARKS.md`, "Dynamic batching").
    #[serde(default)]
    pub intra_threads: Option<usize>,
    /// Whether this model's intra-op threads spin (ONNX Runtime's
    /// `session.intra_op.allow_spinning`); `None`: the agent's
    /// [`AgentConfig::intra_spinning`]. Off suits a model whose urgent
    /// requests stop others' runs (`preempt`): the stopped run's spinning
    /// threads keep the cores the urgent run needs (figures:
    /// `docs/BENCHMARKS.md`, "Priorities at overload").
    #[serde(default)]
    pub intra_spinning: Option<bool>,
    /// The most requests that may wait for it (0: no limit); one more is
    /// refused `overloaded` at once.
    #[serde(default)]
    pub max_queue: usize,
    /// Request priority levels, 1 (the highest) to this.
    #[serde(default = "one_u8")]
    pub priority_levels: u8,
    /// The level of a request that names none; `None`: the lowest.
    #[serde(default)]
    pub default_priority: Option<u8>,
    /// A waiting request counts one level higher per this many ms waited.
    #[serde(default = "thousand")]
    pub priority_aging_ms: u64,
    /// How long a request that names no timeout may wait (ms; 0 = no
    /// limit).
    #[serde(default)]
    pub queue_timeout_ms: u64,
    /// Whether a request whose turn comes first (a higher priority) stops
    /// a run in progress, which runs again at its own turn
    /// ([`QueuePolicy::preempt`]; ONNX models, runs that are not batched).
    #[serde(default)]
    pub preempt: bool,
    /// The most rows (first-dimension entries) in one engine run; above 1,
    /// requests that wait are batched ([`crate::batcher`]).
    #[serde(default = "one")]
    pub max_batch: usize,
    /// How long the first request of a batch may wait for more (µs).
    #[serde(default)]
    pub max_queue_delay_us: u64,
    /// Batch sizes to stop at.
    #[serde(default)]
    pub preferred_batch_sizes: Vec<usize>,
}

fn one_u8() -> u8 {
    1
}

fn thousand() -> u64 {
    1000
}

fn one() -> usize {
    1
}

impl ModelConfig {
    /// `name` served from `path` with every other setting at its default.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelConfig;
    /// let m = ModelConfig::new("digits", "models/build/digits_mlp.onnx");
    /// assert_eq!((m.concurrency, m.max_batch, m.priority_levels), (1, 1, 1));
    /// ```
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>) -> ModelConfig {
        ModelConfig {
            name: name.into(),
            path: path.into(),
            concurrency: 1,
            intra_threads: None,
            intra_spinning: None,
            max_queue: 0,
            priority_levels: 1,
            default_priority: None,
            priority_aging_ms: thousand(),
            queue_timeout_ms: 0,
            preempt: false,
            max_batch: 1,
            max_queue_delay_us: 0,
            preferred_batch_sizes: Vec::new(),
        }
    }

    /// Parses `NAME=PATH[;KEY=VALUE...]` (the `--model` flag): the keys
    /// are those of a `[[model]]` table, each value in TOML syntax
    /// (`max_batch=16;max_queue_delay_us=500;preferred_batch_sizes=[4,8]`).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelConfig;
    /// let m = ModelConfig::parse_flag("digits=models/build/digits_mlp.onnx;max_batch=16;preferred_batch_sizes=[4,8]")?;
    /// assert_eq!(m.name, "digits");
    /// assert_eq!((m.max_batch, m.preferred_batch_sizes.clone()), (16, vec![4, 8]));
    /// assert!(ModelConfig::parse_flag("digits.onnx").is_err()); // no NAME=
    /// assert!(ModelConfig::parse_flag("d=d.onnx;colour=blue").is_err()); // unknown key
    /// # Ok::<(), server::ConfigError>(())
    /// ```
    pub fn parse_flag(s: &str) -> Result<ModelConfig, ConfigError> {
        let mut parts = s.split(';');
        let first = parts.next().unwrap_or_default();
        let (name, path) = first.split_once('=').ok_or_else(|| {
            ConfigError::Invalid(format!(
                "--model takes NAME=PATH.onnx[;KEY=VALUE...], got '{s}'"
            ))
        })?;
        let mut table = toml::Table::new();
        table.insert("name".into(), toml::Value::String(name.into()));
        table.insert("path".into(), toml::Value::String(path.into()));
        for part in parts.filter(|p| !p.trim().is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "--model '{name}': '{part}' is not KEY=VALUE (e.g. max_batch=16)"
                ))
            })?;
            let key = key.trim();
            if key == "name" || key == "path" {
                return Err(ConfigError::Invalid(format!(
                    "--model '{name}': {key} comes first (NAME=PATH), not as an option"
                )));
            }
            let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "--model '{name}': the value of {key} ('{value}') is not a number, \
                         list or string"
                    ))
                })?;
            table.insert(key.into(), value);
        }
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| {
                ConfigError::Invalid(format!("--model '{name}': {}", e.message()))
            })
    }

    /// Its batching settings (checked by [`AgentConfig::validate`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelConfig;
    /// use std::time::Duration;
    /// let mut m = ModelConfig::new("digits", "digits.onnx");
    /// m.max_batch = 8;
    /// m.max_queue_delay_us = 250;
    /// m.preferred_batch_sizes = vec![8, 4, 4];
    /// let p = m.batch_policy();
    /// assert_eq!((p.max_batch, p.max_queue_delay), (8, Duration::from_micros(250)));
    /// assert_eq!(p.preferred, [4, 8]); // sorted, deduplicated
    /// ```
    pub fn batch_policy(&self) -> BatchPolicy {
        let mut preferred = self.preferred_batch_sizes.clone();
        preferred.sort_unstable();
        preferred.dedup();
        BatchPolicy {
            max_batch: self.max_batch,
            max_queue_delay: Duration::from_micros(self.max_queue_delay_us),
            preferred,
        }
    }

    /// Its queue's policy (checked by [`AgentConfig::validate`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelConfig;
    /// use std::time::Duration;
    /// let mut m = ModelConfig::new("digits", "digits.onnx");
    /// m.priority_levels = 3;
    /// m.queue_timeout_ms = 50;
    /// let q = m.queue_policy();
    /// assert_eq!(q.default_priority, 3); // none named: the lowest level
    /// assert_eq!(q.default_timeout, Some(Duration::from_millis(50)));
    /// ```
    pub fn queue_policy(&self) -> QueuePolicy {
        QueuePolicy {
            max_queue: self.max_queue,
            priority_levels: self.priority_levels,
            default_priority: self.default_priority.unwrap_or(self.priority_levels),
            aging: Duration::from_millis(self.priority_aging_ms),
            default_timeout: (self.queue_timeout_ms != 0)
                .then(|| Duration::from_millis(self.queue_timeout_ms)),
            timeout_override: true,
            preempt: self.preempt,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    max_tensors: Option<u32>,
    max_in_flight: Option<u32>,
    max_payload: Option<u64>,
    max_desc_len: Option<u32>,
    max_connections: Option<usize>,
    max_total_payload: Option<u64>,
    stall_timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectionsFile {
    max: Option<usize>,
    max_per_peer: Option<usize>,
    handshake_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SocketFile {
    spin_us: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShmFile {
    spin_us: Option<u64>,
    client_bytes: Option<usize>,
    agent_bytes: Option<usize>,
    ring_slots: Option<u32>,
    park_after_ms: Option<u64>,
    allow_kernel_pull: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatsFile {
    request_timing: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessFile {
    tenants: Option<PathBuf>,
    socket_mode: Option<String>,
    socket_group: Option<String>,
    insecure: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    listen: Vec<String>,
    #[serde(default)]
    model: Vec<ModelConfig>,
    intra_threads: Option<usize>,
    intra_spinning: Option<bool>,
    inter_threads: Option<usize>,
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    connections: ConnectionsFile,
    #[serde(default)]
    socket: SocketFile,
    #[serde(default)]
    shm: ShmFile,
    #[serde(default)]
    stats: StatsFile,
    #[serde(default)]
    access: AccessFile,
    #[serde(default)]
    tls: TlsFile,
}

/// Reads an on/off switch as a flag gives it (`on`/`off`, also
/// `true`/`false`, `1`/`0`, any case); anything else is refused with an
/// error naming the value and what is accepted.
///
/// # Examples
///
/// ```
/// use server::config::parse_switch;
/// assert!(parse_switch("ON")?);
/// assert!(!parse_switch("0")?);
/// assert!(parse_switch("maybe").is_err());
/// # Ok::<(), server::ConfigError>(())
/// ```
pub fn parse_switch(s: &str) -> Result<bool, ConfigError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(ConfigError::Invalid(format!(
            "'{s}' is not a switch: give on or off"
        ))),
    }
}

/// Everything an agent needs to start.
///
/// # Examples
///
/// ```
/// use server::AgentConfig;
/// use std::time::Duration;
/// let mut cfg = AgentConfig {
///     intra_threads: 1,
///     idle_timeout: Some(Duration::from_secs(300)),
///     ..AgentConfig::default()
/// };
/// cfg.add_listen("unix:///run/tensorwire.sock")?;
/// cfg.add_listen("shm://agent")?;
/// cfg.validate()?;
/// assert_eq!(cfg.listen.len(), 2);
/// # Ok::<(), server::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Endpoints to listen on (`inproc://name` registers an in-process agent).
    pub listen: Vec<Endpoint>,
    /// KServe v2 front doors from the `listen` list (`grpc://HOST:PORT`,
    /// `http://HOST:PORT`), as given. [`Agent`](crate::Agent) does not
    /// serve them (this crate knows no KServe): whoever starts the agent
    /// starts them over its core (`tensorwire serve` and the Python `Agent`
    /// do, with `frontend::FrontDoors`, which also checks the rest of each
    /// URI). Only the scheme is checked here ([`parse_listen`]).
    pub front_doors: Vec<String>,
    /// Models to load (the built-in `identity` is always served too).
    pub models: Vec<ModelConfig>,
    /// ONNX Runtime intra-op threads per run.
    pub intra_threads: usize,
    /// Whether ONNX Runtime's intra-op threads spin after a run before they
    /// sleep (`engine::OrtOptions::intra_spinning`; TOML `intra_spinning`,
    /// `serve --intra-spinning on|off`).
    pub intra_spinning: bool,
    /// ONNX Runtime inter-op threads.
    pub inter_threads: usize,
    /// Per-session limits (the most a client may ask for).
    pub limits: Limits,
    /// Most connections open at once, agent-wide (TOML `[connections] max`;
    /// `[limits] max_connections` is read too). Each costs one file
    /// descriptor; pending handshakes count.
    pub max_connections: usize,
    /// Most connections one peer may hold at once (a uid over unix and shm,
    /// a source address over tcp: `transport::PeerId`), below
    /// `max_connections` so that one peer cannot lock the others out
    /// (capped at `max_connections`).
    pub max_connections_per_peer: usize,
    /// A connection that has not completed its Hello this long after it
    /// was accepted is closed.
    pub handshake_timeout: Duration,
    /// A session with nothing in flight for this long is closed (`None`:
    /// never).
    pub idle_timeout: Option<Duration>,
    /// Most request payload bytes held by requests in flight at once,
    /// agent-wide (a request over it is refused with `limit-exceeded`).
    pub max_total_payload: u64,
    /// How long a peer may stall in the middle of a message before its
    /// connection is dropped (also bounds a blocked response write, and how
    /// long a shared-memory session waits for room in a response ring its
    /// client does not drain).
    pub stall_timeout: Duration,
    /// Socket sessions: how long (µs) a session, having answered,
    /// polls its socket for the next request before it parks (gives its
    /// worker back until the socket is readable)
    /// (0 = park at once; see `transport::spin`). Polling answers a client
    /// that sends again within the budget without a wake-up (tens of µs on
    /// a virtual machine) but burns that core meanwhile; a connection whose
    /// requests keep arriving after the budget stops polling by itself.
    pub socket_spin_us: u64,
    /// Shared-memory sessions: how long (µs) a session spins on its
    /// request ring before it sleeps on the arena's futex (0 = sleep at
    /// once). Spinning answers a client that sends again within the budget
    /// without a wake-up (~5 µs each way here) but burns that core.
    pub shm_spin_us: u64,
    /// Shared-memory sessions: bytes of each session's client region (where
    /// the client places input tensors; also bounds a message's payload).
    pub shm_client_bytes: usize,
    /// Shared-memory sessions: bytes of each session's agent region (where
    /// outputs are written until the client releases them).
    pub shm_agent_bytes: usize,
    /// Shared-memory sessions: 64-byte slots per ring (a power of two).
    pub shm_ring_slots: u32,
    /// Shared-memory sessions: a session that has received nothing for this
    /// long stops sleeping on its futex and gives its thread back; the
    /// client's next message wakes it through the control socket (one
    /// byte, a few µs more than a futex wake-up).
    pub shm_park_after: Duration,
    /// Whether every request's stages are timed for the models' statistics
    /// and metrics (`server::stats`): four clock reads a request (~30 ns
    /// each on the VMs measured), which an empty shared-memory round trip
    /// (~0.5 µs) notices. Off, requests are still counted (success,
    /// failure, transport, in flight) but no durations are recorded.
    pub request_timing: bool,
    /// The tenants file (`server::tenants`): who may see and call which
    /// model, with what quotas. `None`: every session may use every model.
    pub tenants: Option<PathBuf>,
    /// Permission bits of the `unix://` sockets and `shm://` control
    /// sockets the agent creates (default 0o600: only its own user can
    /// connect). The directory they are in must let the users in too.
    pub socket_mode: u32,
    /// The group of those sockets (a name or a number; `None`: the
    /// agent's), so that `socket_mode` 0o660 lets that group in.
    pub socket_group: Option<String>,
    /// Allows tcp, gRPC and HTTP listeners (the clear-text ones) on
    /// addresses other than loopback. Off, such a listener is refused at
    /// start, because its tokens and tensors would cross the network in
    /// clear text; `tls://`, `grpcs://` and `https://` need no leave.
    pub insecure: bool,
    /// The agent's certificate and key, and the CA of client certificates
    /// (mutual TLS), for its `tls://` listeners and the `grpcs://` and
    /// `https://` front doors (TOML `[tls]`, `serve --tls-cert --tls-key
    /// --tls-client-ca`).
    pub tls: Option<ServerTlsFiles>,
    /// How the agent moves tensor bytes it must copy ([`crate::movers`];
    /// `serve --mover`): `auto` asks the mover policy (`tensorwire
    /// calibrate`), or one fixed mover. Per process.
    pub mover: transport::mover::MoverChoice,
    /// Whether shm clients may have the agent pull their inputs out of
    /// their own memory (`mover=kernel`, `process_vm_readv`; `serve
    /// --allow-kernel-pull`, TOML `[shm] allow_kernel_pull`). Off by
    /// default: a pull reads another process's memory with the agent's
    /// own rights (which may exceed the client's, and which Yama's
    /// `ptrace_scope` may deny), blocks the worker while the kernel reads
    /// (a client's own slow mapping, e.g. a FUSE file, would hold it), and
    /// trusts the pid the control socket had at connect.
    pub allow_kernel_pull: bool,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            listen: Vec::new(),
            front_doors: Vec::new(),
            models: Vec::new(),
            intra_threads: 2,
            intra_spinning: engine::DEFAULT_INTRA_SPINNING,
            inter_threads: 1,
            limits: Limits::default(),
            max_connections: 8192,
            max_connections_per_peer: 1024,
            handshake_timeout: Duration::from_secs(3),
            idle_timeout: None,
            max_total_payload: 2 << 30,
            stall_timeout: Duration::from_secs(30),
            socket_spin_us: 50,
            shm_spin_us: 50,
            shm_client_bytes: ShmSizes::default().client_len,
            shm_agent_bytes: ShmSizes::default().agent_len,
            shm_ring_slots: ShmSizes::default().ring_capacity,
            shm_park_after: Duration::from_millis(250),
            request_timing: true,
            tenants: None,
            socket_mode: 0o600,
            socket_group: None,
            insecure: false,
            tls: None,
            mover: transport::mover::MoverChoice::Auto,
            allow_kernel_pull: false,
        }
    }
}

impl AgentConfig {
    /// Reads a TOML file on top of the defaults.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::AgentConfig;
    /// let dir = tempfile::tempdir()?;
    /// let file = dir.path().join("agent.toml");
    /// std::fs::write(&file, r#"
    /// listen = ["tcp://127.0.0.1:7070"]
    /// [[model]]
    /// name = "digits"
    /// path = "digits_mlp.onnx"
    /// "#)?;
    /// let cfg = AgentConfig::from_file(&file)?;
    /// // Paths in a file are relative to the file.
    /// assert_eq!(cfg.models[0].path, dir.path().join("digits_mlp.onnx"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_file(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = AgentConfig::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })?;
        // Model and tenants paths in a file are relative to the file.
        if let Some(dir) = path.parent() {
            for m in &mut cfg.models {
                if m.path.is_relative() {
                    m.path = dir.join(&m.path);
                }
            }
            if let Some(t) = cfg.tenants.as_mut().filter(|t| t.is_relative()) {
                *t = dir.join(&*t);
            }
            if let Some(t) = cfg.tls.as_mut() {
                for p in [Some(&mut t.cert), Some(&mut t.key), t.client_ca.as_mut()]
                    .into_iter()
                    .flatten()
                {
                    if p.is_relative() {
                        *p = dir.join(&*p);
                    }
                }
            }
        }
        Ok(cfg)
    }

    /// Parses TOML text on top of the defaults.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::AgentConfig;
    /// let cfg = AgentConfig::from_toml(r#"
    ///     listen = ["unix:///tmp/tw.sock", "grpc://127.0.0.1:8001"]
    ///     intra_threads = 4
    ///     [limits]
    ///     max_in_flight = 32
    /// "#)?;
    /// assert_eq!((cfg.intra_threads, cfg.limits.max_in_flight), (4, 32));
    /// assert_eq!(cfg.front_doors, ["grpc://127.0.0.1:8001"]);
    /// assert_eq!(cfg.inter_threads, AgentConfig::default().inter_threads); // not given
    /// assert!(AgentConfig::from_toml("intra_thread = 4").is_err()); // misspelt
    /// # Ok::<(), server::ConfigError>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<AgentConfig, ConfigError> {
        let f: ConfigFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<text>"),
            message: e.to_string(),
        })?;
        let mut cfg = AgentConfig::default();
        for l in &f.listen {
            cfg.add_listen(l)?;
        }
        cfg.models = f.model;
        if let Some(n) = f.intra_threads {
            cfg.intra_threads = n;
        }
        if let Some(on) = f.intra_spinning {
            cfg.intra_spinning = on;
        }
        if let Some(n) = f.inter_threads {
            cfg.inter_threads = n;
        }
        let l = &f.limits;
        let d = &mut cfg.limits;
        d.max_tensors = l.max_tensors.unwrap_or(d.max_tensors);
        d.max_in_flight = l.max_in_flight.unwrap_or(d.max_in_flight);
        d.max_payload = l.max_payload.unwrap_or(d.max_payload);
        d.max_desc_len = l.max_desc_len.unwrap_or(d.max_desc_len);
        cfg.max_connections = l.max_connections.unwrap_or(cfg.max_connections);
        cfg.max_total_payload = l.max_total_payload.unwrap_or(cfg.max_total_payload);
        let c = &f.connections;
        if l.max_connections.is_some() && c.max.is_some() {
            return Err(ConfigError::Invalid(
                "give the connection limit once: [connections] max (or the older \
                 [limits] max_connections), not both"
                    .into(),
            ));
        }
        cfg.max_connections = c.max.unwrap_or(cfg.max_connections);
        cfg.max_connections_per_peer = c.max_per_peer.unwrap_or(cfg.max_connections_per_peer);
        if let Some(ms) = c.handshake_timeout_ms {
            cfg.handshake_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = c.idle_timeout_ms {
            cfg.idle_timeout = (ms > 0).then(|| Duration::from_millis(ms));
        }
        if let Some(ms) = l.stall_timeout_ms {
            cfg.stall_timeout = Duration::from_millis(ms);
        }
        cfg.socket_spin_us = f.socket.spin_us.unwrap_or(cfg.socket_spin_us);
        let m = &f.shm;
        cfg.shm_spin_us = m.spin_us.unwrap_or(cfg.shm_spin_us);
        cfg.shm_client_bytes = m.client_bytes.unwrap_or(cfg.shm_client_bytes);
        cfg.shm_agent_bytes = m.agent_bytes.unwrap_or(cfg.shm_agent_bytes);
        cfg.shm_ring_slots = m.ring_slots.unwrap_or(cfg.shm_ring_slots);
        if let Some(ms) = m.park_after_ms {
            cfg.shm_park_after = Duration::from_millis(ms);
        }
        cfg.allow_kernel_pull = m.allow_kernel_pull.unwrap_or(cfg.allow_kernel_pull);
        cfg.request_timing = f.stats.request_timing.unwrap_or(cfg.request_timing);
        let a = f.access;
        cfg.tenants = a.tenants.filter(|t| !t.as_os_str().is_empty());
        if let Some(m) = &a.socket_mode {
            cfg.socket_mode = parse_mode(m)?;
        }
        cfg.socket_group = a.socket_group.filter(|g| !g.is_empty());
        cfg.insecure = a.insecure.unwrap_or(cfg.insecure);
        cfg.tls = tls_files(f.tls.cert, f.tls.key, f.tls.client_ca)?;
        Ok(cfg)
    }

    /// Adds one `listen` URI: an endpoint of the agent's own to
    /// [`listen`](Self::listen), a KServe front door to
    /// [`front_doors`](Self::front_doors) ([`parse_listen`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::AgentConfig;
    /// let mut cfg = AgentConfig::default();
    /// cfg.add_listen("tcp://127.0.0.1:7070")?;
    /// cfg.add_listen("http://127.0.0.1:8000")?; // a KServe front door
    /// assert_eq!(cfg.listen.len(), 1);
    /// assert_eq!(cfg.front_doors, ["http://127.0.0.1:8000"]);
    /// assert!(cfg.add_listen("udp://127.0.0.1:1").is_err());
    /// # Ok::<(), server::ConfigError>(())
    /// ```
    pub fn add_listen(&mut self, uri: &str) -> Result<(), ConfigError> {
        match parse_listen(uri)? {
            Listen::Endpoint(ep) => self.listen.push(ep),
            Listen::FrontDoor(uri) => self.front_doors.push(uri),
        }
        Ok(())
    }

    /// The arena sizes of a shared-memory session.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::AgentConfig;
    /// let cfg = AgentConfig { shm_client_bytes: 8 << 20, ..AgentConfig::default() };
    /// let sizes = cfg.shm_sizes();
    /// assert_eq!(sizes.client_len, 8 << 20);
    /// assert_eq!(sizes.ring_capacity, cfg.shm_ring_slots);
    /// ```
    pub fn shm_sizes(&self) -> ShmSizes {
        ShmSizes {
            ring_capacity: self.shm_ring_slots,
            client_len: self.shm_client_bytes,
            agent_len: self.shm_agent_bytes,
            features: if self.allow_kernel_pull {
                transport::shm::layout::FEATURE_PULL
            } else {
                0
            },
        }
    }

    /// Checks that every setting is usable; call before starting an agent.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::AgentConfig;
    /// assert!(AgentConfig::default().validate().is_ok());
    /// let bad = AgentConfig { intra_threads: 0, ..AgentConfig::default() };
    /// let e = bad.validate().unwrap_err();
    /// assert!(e.to_string().contains("intra_threads"));
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.intra_threads == 0 || self.intra_threads > 256 {
            return bad(format!(
                "intra_threads must be 1..=256, not {}",
                self.intra_threads
            ));
        }
        if self.inter_threads == 0 || self.inter_threads > 256 {
            return bad(format!(
                "inter_threads must be 1..=256, not {}",
                self.inter_threads
            ));
        }
        let l = &self.limits;
        if l.max_tensors == 0 || l.max_tensors > 4096 {
            return bad(format!(
                "max_tensors must be 1..=4096, not {}",
                l.max_tensors
            ));
        }
        if l.max_in_flight == 0 {
            return bad("max_in_flight must be at least 1".into());
        }
        if l.max_payload > 1 << 40 {
            return bad(format!("max_payload {} is over 1 TiB", l.max_payload));
        }
        if !(256..=16 << 20).contains(&l.max_desc_len) {
            return bad(format!(
                "max_desc_len must be 256..=16777216, not {}",
                l.max_desc_len
            ));
        }
        if self.max_total_payload < l.max_payload {
            return bad(format!(
                "max_total_payload ({}) must be at least max_payload ({})",
                self.max_total_payload, l.max_payload
            ));
        }
        if !(1..=1 << 20).contains(&self.max_connections) {
            return bad(format!(
                "max connections must be 1..=1048576, not {}",
                self.max_connections
            ));
        }
        if self.max_connections_per_peer == 0 {
            return bad("max connections per peer must be at least 1".into());
        }
        if self.handshake_timeout < Duration::from_millis(10)
            || self.handshake_timeout > Duration::from_secs(600)
        {
            return bad(format!(
                "handshake_timeout_ms must be 10..=600000, not {}",
                self.handshake_timeout.as_millis()
            ));
        }
        if self
            .idle_timeout
            .is_some_and(|t| t < self.handshake_timeout)
        {
            return bad(format!(
                "idle_timeout_ms ({}) must be 0 (never) or at least handshake_timeout_ms ({})",
                self.idle_timeout.map_or(0, |t| t.as_millis()),
                self.handshake_timeout.as_millis()
            ));
        }
        if self.shm_park_after > Duration::from_secs(3600) {
            return bad(format!(
                "shm park_after_ms must be 0..=3600000, not {}",
                self.shm_park_after.as_millis()
            ));
        }
        if self.stall_timeout.is_zero() {
            return bad("stall_timeout_ms must be positive".into());
        }
        if self.socket_spin_us > MAX_SPIN_US {
            return bad(format!(
                "socket spin_us must be 0..={MAX_SPIN_US}, not {}",
                self.socket_spin_us
            ));
        }
        if self.shm_spin_us > MAX_SPIN_US {
            return bad(format!(
                "shm spin_us must be 0..={MAX_SPIN_US}, not {}",
                self.shm_spin_us
            ));
        }
        if !self.shm_ring_slots.is_power_of_two() || !(8..=65536).contains(&self.shm_ring_slots) {
            return bad(format!(
                "shm ring_slots must be a power of two in 8..=65536, not {}",
                self.shm_ring_slots
            ));
        }
        for (what, n) in [
            ("client_bytes", self.shm_client_bytes),
            ("agent_bytes", self.shm_agent_bytes),
        ] {
            if !(4096..=1 << 40).contains(&(n as u64)) {
                return bad(format!("shm {what} must be 4 KiB..=1 TiB, not {n}"));
            }
        }
        if self.socket_mode & !0o777 != 0 || self.socket_mode & 0o600 != 0o600 {
            return bad(format!(
                "socket_mode {:o} must be permission bits (at most 0777) that let the agent's own \
                 user read and write (0600 at least)",
                self.socket_mode
            ));
        }
        let wants_tls = self
            .listen
            .iter()
            .any(|ep| matches!(ep, Endpoint::Tls { .. }))
            || self.front_doors.iter().any(|u| is_tls_front_door(u));
        if wants_tls && self.tls.is_none() {
            return bad(
                "a tls://, grpcs:// or https:// listener needs the agent's certificate: give \
                 --tls-cert FILE --tls-key FILE (TOML [tls] cert, key)"
                    .into(),
            );
        }
        if !self.insecure {
            let beyond = self
                .listen
                .iter()
                .filter_map(|ep| match ep {
                    Endpoint::Tcp { addr, .. } => Some((ep.to_string(), addr.clone())),
                    _ => None,
                })
                .chain(
                    self.front_doors
                        .iter()
                        .filter(|u| !is_tls_front_door(u))
                        .map(|uri| {
                            let rest = uri.split_once("://").map_or("", |(_, r)| r);
                            (
                                uri.clone(),
                                rest.split('/').next().unwrap_or("").to_string(),
                            )
                        }),
                )
                .find(|(_, hostport)| !is_loopback(hostport));
            if let Some((uri, _)) = beyond {
                return bad(format!(
                    "{uri} listens beyond this machine in clear text: tokens and tensors would \
                     cross the network unencrypted. Listen with TLS (tls://, grpcs://, https:// \
                     and --tls-cert/--tls-key), or on 127.0.0.1, or give --insecure (TOML \
                     [access] insecure = true) on a network you trust"
                ));
            }
        }
        let mut names = std::collections::HashSet::new();
        for m in &self.models {
            if m.name.is_empty() || m.name.len() > wire::MAX_NAME_LEN {
                return bad(format!("model name '{}' must be 1..=255 bytes", m.name));
            }
            if m.name == engine::IdentityBackend::NAME {
                return bad("'identity' is built in; choose another model name".into());
            }
            if !names.insert(m.name.as_str()) {
                return bad(format!("model '{}' is listed twice", m.name));
            }
            if m.concurrency == 0 || m.concurrency > 64 {
                return bad(format!(
                    "model '{}': concurrency must be 1..=64, not {}",
                    m.name, m.concurrency
                ));
            }
            if let Some(n @ (0 | 257..)) = m.intra_threads {
                return bad(format!(
                    "model '{}': intra_threads must be 1..=256, not {n}",
                    m.name
                ));
            }
            if let Err(e) = m.queue_policy().validate() {
                return bad(format!("model '{}': {e}", m.name));
            }
            if let Err(e) = m.batch_policy().validate() {
                return bad(format!("model '{}': {e}", m.name));
            }
        }
        Ok(())
    }
}

/// Whether `host:port` (or `[v6]:port`, or a bare host) names this machine
/// only: `localhost`, 127.0.0.0/8, ::1.
///
/// # Examples
///
/// ```
/// use server::config::is_loopback;
/// assert!(is_loopback("127.0.0.1:7070"));
/// assert!(is_loopback("[::1]:7070"));
/// assert!(is_loopback("localhost"));
/// assert!(!is_loopback("0.0.0.0:7070"));
/// ```
pub fn is_loopback(hostport: &str) -> bool {
    let host = match hostport.rsplit_once(':') {
        Some((h, port)) if !port.contains(']') => h,
        _ => hostport,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The agent's TLS files from their three settings: none, or a
/// certificate with its key (and optionally a client CA); anything else is
/// refused, naming what is missing.
///
/// # Examples
///
/// ```
/// use server::config::tls_files;
/// assert!(tls_files(None, None, None)?.is_none());
/// let files = tls_files(Some("agent.pem".into()), Some("agent.key".into()), None)?;
/// assert!(files.is_some_and(|f| f.client_ca.is_none()));
/// assert!(tls_files(Some("agent.pem".into()), None, None).is_err()); // no key
/// # Ok::<(), server::ConfigError>(())
/// ```
pub fn tls_files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<ServerTlsFiles>, ConfigError> {
    let set = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
    match (set(cert), set(key), set(client_ca)) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), client_ca) => Ok(Some(ServerTlsFiles {
            cert,
            key,
            client_ca,
        })),
        (None, _, _) => Err(ConfigError::Invalid(
            "TLS needs the agent's certificate: --tls-cert FILE (TOML [tls] cert)".into(),
        )),
        (_, None, _) => Err(ConfigError::Invalid(
            "TLS needs the certificate's private key: --tls-key FILE (TOML [tls] key)".into(),
        )),
    }
}

/// True for a front door that speaks TLS (`grpcs://`, `https://`).
///
/// # Examples
///
/// ```
/// use server::config::is_tls_front_door;
/// assert!(is_tls_front_door("grpcs://0.0.0.0:8001"));
/// assert!(!is_tls_front_door("http://127.0.0.1:8000"));
/// ```
pub fn is_tls_front_door(uri: &str) -> bool {
    uri.starts_with("grpcs://") || uri.starts_with("https://")
}

/// Parses permission bits written in octal (`"0660"`, `"660"`, `"0o660"`).
///
/// # Examples
///
/// ```
/// use server::config::parse_mode;
/// assert_eq!(parse_mode("0660")?, 0o660);
/// assert_eq!(parse_mode("0o600")?, 0o600);
/// assert!(parse_mode("rw-rw----").is_err());
/// # Ok::<(), server::ConfigError>(())
/// ```
pub fn parse_mode(s: &str) -> Result<u32, ConfigError> {
    let digits = s.trim_start_matches("0o");
    u32::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o777 && !digits.is_empty())
        .ok_or_else(|| {
            ConfigError::Invalid(format!(
                "socket mode '{s}' must be octal permission bits, e.g. 0600 or 0660"
            ))
        })
}

/// Parses an endpoint URI into a config error on failure.
///
/// # Examples
///
/// ```
/// use server::config::parse_endpoint;
/// assert_eq!(parse_endpoint("shm://agent")?.to_string(), "shm://agent");
/// assert!(parse_endpoint("tcp://no-port").is_err());
/// # Ok::<(), server::ConfigError>(())
/// ```
pub fn parse_endpoint(s: &str) -> Result<Endpoint, ConfigError> {
    Endpoint::parse(s).map_err(|e| ConfigError::Invalid(e.to_string()))
}

/// The schemes of the KServe v2 front doors a `listen` list may name
/// (`grpc://HOST:PORT`, `http://HOST:PORT`, and over TLS `grpcs://`,
/// `https://`); served by the frontend crate,
/// not by this one.
///
/// # Examples
///
/// ```
/// use server::config::FRONT_DOOR_SCHEMES;
/// assert!(FRONT_DOOR_SCHEMES.contains(&"grpc"));
/// ```
pub const FRONT_DOOR_SCHEMES: [&str; 4] = ["grpc", "http", "grpcs", "https"];

/// The schemes of the agent's own endpoints ([`Endpoint`]).
const ENDPOINT_SCHEMES: [&str; 6] = ["inproc", "unix", "tcp", "tls", "shm", "vsock"];

/// One entry of a `listen` list, sorted by its scheme.
///
/// # Examples
///
/// ```
/// use server::config::{parse_listen, Listen};
/// assert!(matches!(parse_listen("unix:///tmp/a.sock")?, Listen::Endpoint(_)));
/// assert_eq!(parse_listen("grpc://127.0.0.1:8001")?, Listen::FrontDoor("grpc://127.0.0.1:8001".into()));
/// # Ok::<(), server::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// An endpoint the agent serves itself (`unix://`, `tcp://`, `shm://`,
    /// `inproc://`).
    Endpoint(Endpoint),
    /// A KServe v2 front door (`grpc://…`, `http://…`), as given: only its
    /// scheme is checked here; the frontend crate checks the rest and
    /// serves it.
    FrontDoor(String),
}

/// Sorts one `listen` URI by scheme: a KServe front door
/// ([`FRONT_DOOR_SCHEMES`]) is kept as given, anything else must parse as
/// an [`Endpoint`]. An unknown scheme is refused with an error naming the
/// URI and every scheme there is.
///
/// # Examples
///
/// ```
/// use server::config::{parse_listen, Listen};
/// match parse_listen("tcp://127.0.0.1:7070")? {
///     Listen::Endpoint(ep) => assert_eq!(ep.to_string(), "tcp://127.0.0.1:7070"),
///     Listen::FrontDoor(uri) => panic!("{uri} is not a front door"),
/// }
/// let e = parse_listen("ws://127.0.0.1:1").unwrap_err();
/// assert!(e.to_string().contains("grpc://")); // names the schemes there are
/// # Ok::<(), server::ConfigError>(())
/// ```
pub fn parse_listen(uri: &str) -> Result<Listen, ConfigError> {
    match uri.split_once("://") {
        Some((scheme, _)) if FRONT_DOOR_SCHEMES.contains(&scheme) => {
            Ok(Listen::FrontDoor(uri.to_string()))
        }
        Some((scheme, _)) if !ENDPOINT_SCHEMES.contains(&scheme) => {
            Err(ConfigError::Invalid(format!(
                "bad listen address '{uri}': unknown scheme '{scheme}' (the agent's endpoints: \
                 inproc://, unix://, tcp://, tls://, shm://; KServe v2 front doors: grpc://, \
                 http://, grpcs://, https://)"
            )))
        }
        _ => parse_endpoint(uri).map(Listen::Endpoint),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_round_trip() {
        let cfg = AgentConfig::from_toml(
            r#"
            listen = ["unix:///tmp/x.sock", "tcp://127.0.0.1:0"]
            intra_threads = 3
            [[model]]
            name = "m"
            path = "m.onnx"
            concurrency = 2
            [limits]
            max_tensors = 8
            stall_timeout_ms = 500
            "#,
        )
        .unwrap();
        assert_eq!(cfg.listen.len(), 2);
        assert_eq!(cfg.intra_threads, 3);
        assert_eq!(cfg.models[0].concurrency, 2);
        assert_eq!(cfg.limits.max_tensors, 8);
        assert_eq!(cfg.stall_timeout, Duration::from_millis(500));
        assert!(cfg.request_timing, "timed by default");
        cfg.validate().unwrap();
        let off = AgentConfig::from_toml("[stats]\nrequest_timing = false").unwrap();
        assert!(!off.request_timing);
    }

    #[test]
    fn intra_spinning_from_toml_and_switches() {
        let d = AgentConfig::default();
        assert_eq!(d.intra_spinning, engine::DEFAULT_INTRA_SPINNING);
        for (text, want) in [("false", false), ("true", true)] {
            let cfg = AgentConfig::from_toml(&format!("intra_spinning = {text}")).unwrap();
            assert_eq!(cfg.intra_spinning, want, "{text}");
        }
        // Not a boolean: refused, naming the key.
        let e = AgentConfig::from_toml("intra_spinning = \"sometimes\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("intra_spinning"), "{e}");
        for (s, want) in [
            ("on", true),
            ("OFF", false),
            ("true", true),
            ("false", false),
            ("1", true),
            ("0", false),
        ] {
            assert_eq!(parse_switch(s).unwrap(), want, "{s}");
        }
        for bad in ["", "yes please", "2", "of"] {
            let e = parse_switch(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("'{bad}'")) && e.contains("on or off"),
                "{e}"
            );
        }
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        assert!(AgentConfig::from_toml("lisen = []").is_err());
        let cfg = AgentConfig {
            intra_threads: 0,
            ..AgentConfig::default()
        };
        assert!(cfg.validate().is_err());
        let mut cfg = AgentConfig::default();
        cfg.models
            .push(ModelConfig::parse_flag("identity=x.onnx").unwrap());
        assert!(cfg.validate().is_err());
        let mut cfg = AgentConfig::default();
        cfg.models
            .push(ModelConfig::parse_flag("a=x.onnx").unwrap());
        cfg.models
            .push(ModelConfig::parse_flag("a=y.onnx").unwrap());
        assert!(cfg.validate().is_err());
        assert!(ModelConfig::parse_flag("nopath").is_err());
    }

    #[test]
    fn a_model_may_set_its_own_intra_threads() {
        let cfg = AgentConfig::from_toml(
            r#"
            intra_threads = 2
            [[model]]
            name = "small"
            path = "s.onnx"
            intra_threads = 1
            [[model]]
            name = "large"
            path = "l.onnx"
            "#,
        )
        .expect("a valid config");
        assert_eq!(cfg.models[0].intra_threads, Some(1));
        assert_eq!(cfg.models[1].intra_threads, None);
        cfg.validate().expect("valid");
        let m = ModelConfig::parse_flag("s=s.onnx;intra_threads=3;intra_spinning=false")
            .expect("a valid flag");
        assert_eq!((m.intra_threads, m.intra_spinning), (Some(3), Some(false)));
        assert!(ModelConfig::parse_flag("s=s.onnx;intra_spinning=sometimes").is_err());
        for n in [0, 257] {
            let mut cfg = AgentConfig::default();
            cfg.models.push(
                ModelConfig::parse_flag(&format!("s=s.onnx;intra_threads={n}"))
                    .expect("parses; checked by validate"),
            );
            let e = cfg.validate().expect_err("out of range").to_string();
            assert!(e.contains("'s': intra_threads must be 1..=256"), "{e}");
        }
    }

    #[test]
    fn model_queue_settings_come_from_the_file_and_are_checked() {
        let cfg = AgentConfig::from_toml(
            r#"
            [[model]]
            name = "m"
            path = "m.onnx"
            instances = 2
            max_queue = 16
            priority_levels = 3
            priority_aging_ms = 250
            queue_timeout_ms = 40
            "#,
        )
        .expect("a valid config");
        let m = &cfg.models[0];
        assert_eq!(m.concurrency, 2, "instances is concurrency");
        let p = m.queue_policy();
        assert_eq!(
            (p.max_queue, p.priority_levels, p.default_priority),
            (16, 3, 3)
        );
        assert_eq!(p.aging, Duration::from_millis(250));
        assert_eq!(p.default_timeout, Some(Duration::from_millis(40)));
        assert_eq!(
            ModelConfig::new("m", "m.onnx").queue_policy(),
            QueuePolicy::default()
        );
        for (bad, needle) in [
            ("priority_levels = 0", "priority_levels"),
            (
                "priority_levels = 2\ndefault_priority = 3",
                "default_priority",
            ),
            ("priority_aging_ms = 0", "aging"),
        ] {
            let e = AgentConfig::from_toml(&format!(
                "[[model]]\nname = \"m\"\npath = \"m.onnx\"\n{bad}\n"
            ))
            .expect("parses")
            .validate()
            .expect_err(bad)
            .to_string();
            assert!(e.contains(needle) && e.contains("model 'm'"), "{bad}: {e}");
        }
    }

    #[test]
    fn front_doors_in_the_listen_list_are_kept_apart() {
        let cfg = AgentConfig::from_toml(
            r#"listen = ["unix:///tmp/x.sock", "grpc://127.0.0.1:0", "http://[::1]:8000", "http://x"]"#,
        )
        .unwrap();
        assert_eq!(cfg.listen, vec![Endpoint::Unix("/tmp/x.sock".into())]);
        // Kept as given, in order: the frontend checks HOST:PORT.
        assert_eq!(
            cfg.front_doors,
            ["grpc://127.0.0.1:0", "http://[::1]:8000", "http://x"]
        );
        // (Host "x" is not loopback.)
        let e = cfg.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("invalid setting: http://x listens beyond"),
            "{e}"
        );
        assert!(AgentConfig::default().front_doors.is_empty());
        assert_eq!(
            parse_listen("grpc://h:1").unwrap(),
            Listen::FrontDoor("grpc://h:1".into())
        );
        assert_eq!(
            parse_listen("shm://a").unwrap(),
            Listen::Endpoint(Endpoint::Shm("a".into()))
        );
        for door in ["grpcs://h:1", "https://h:1"] {
            assert_eq!(parse_listen(door).unwrap(), Listen::FrontDoor(door.into()));
        }
    }

    #[test]
    fn unknown_listen_schemes_are_refused_naming_the_uri() {
        for bad in ["ftp://x", "quic://h:1"] {
            let e = AgentConfig::from_toml(&format!("listen = [\"{bad}\"]"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(bad), "{e}");
            assert!(e.contains("unknown scheme"), "{e}");
            assert!(e.contains("grpc://") && e.contains("unix://"), "{e}");
        }
        // Known schemes keep their own, precise errors.
        let e = AgentConfig::from_toml("listen = [\"tcp://nohost\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tcp://nohost") && e.contains("port"), "{e}");
        let e = parse_listen("no-scheme").unwrap_err().to_string();
        assert!(e.contains("no-scheme"), "{e}");
    }

    /// The TOML shown at the top of this file, as the file says it.
    fn documented_example() -> String {
        let src = include_str!("config.rs");
        let start = src.find("//! ```toml\n").expect("the example") + "//! ```toml\n".len();
        let end = start + src[start..].find("//! ```\n").expect("its end");
        src[start..end]
            .lines()
            .map(|l| l.strip_prefix("//!").unwrap_or(l).trim_start_matches(' '))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn the_documented_example_parses_and_shows_the_real_defaults() {
        let cfg = AgentConfig::from_toml(&documented_example()).unwrap();
        let d = AgentConfig::default();
        assert_eq!(cfg.limits, d.limits);
        assert_eq!(cfg.max_total_payload, d.max_total_payload);
        assert_eq!(cfg.stall_timeout, d.stall_timeout);
        assert_eq!(cfg.max_connections, d.max_connections);
        assert_eq!(cfg.max_connections_per_peer, d.max_connections_per_peer);
        assert_eq!(cfg.handshake_timeout, d.handshake_timeout);
        assert_eq!(cfg.idle_timeout, d.idle_timeout);
        assert_eq!(cfg.socket_spin_us, d.socket_spin_us);
        assert_eq!(cfg.shm_spin_us, d.shm_spin_us);
        assert_eq!(cfg.shm_sizes(), d.shm_sizes());
        assert_eq!(cfg.shm_park_after, d.shm_park_after);
        assert_eq!(
            (cfg.intra_threads, cfg.inter_threads),
            (d.intra_threads, d.inter_threads)
        );
        assert_eq!(
            (
                &cfg.tenants,
                cfg.socket_mode,
                &cfg.socket_group,
                cfg.insecure
            ),
            (&d.tenants, d.socket_mode, &d.socket_group, d.insecure)
        );
        assert_eq!(cfg.tls, d.tls);
    }

    #[test]
    fn tls_settings_parse_and_tls_listeners_need_them() {
        let cfg = AgentConfig::from_toml(
            "listen = [\"tls://0.0.0.0:7443\", \"grpcs://0.0.0.0:8001\"]\n\
             [tls]\ncert = \"a.pem\"\nkey = \"a.key\"\nclient_ca = \"ca.pem\"\n",
        )
        .unwrap();
        let files = cfg.tls.clone().expect("tls");
        assert_eq!(files.cert, PathBuf::from("a.pem"));
        assert_eq!(files.client_ca, Some(PathBuf::from("ca.pem")));
        // TLS listeners beyond loopback need no --insecure.
        cfg.validate().unwrap();
        let mut no_files = cfg.clone();
        no_files.tls = None;
        let e = no_files.validate().unwrap_err().to_string();
        assert!(e.contains("--tls-cert"), "{e}");
        let e = AgentConfig::from_toml("[tls]\ncert = \"a.pem\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tls-key"), "{e}");
        let e = AgentConfig::from_toml("[tls]\nkey = \"a.key\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tls-cert"), "{e}");
        assert!(AgentConfig::from_toml("[tls]\ncrt = \"a.pem\"\n").is_err());
        // Clear text beyond loopback still needs --insecure, TLS or not.
        let mut clear = cfg;
        clear.add_listen("tcp://0.0.0.0:7070").unwrap();
        let e = clear.validate().unwrap_err().to_string();
        assert!(
            e.contains("--insecure") && e.contains("tcp://0.0.0.0:7070"),
            "{e}"
        );
    }

    #[test]
    fn access_settings_parse_and_listeners_beyond_loopback_need_insecure() {
        let cfg = AgentConfig::from_toml(
            "listen = [\"tcp://127.0.0.1:0\", \"grpc://[::1]:0\", \"http://localhost:0\"]\n\
             [access]\ntenants = \"t.toml\"\nsocket_mode = \"0660\"\nsocket_group = \"users\"\n",
        )
        .unwrap();
        assert_eq!(cfg.tenants.as_deref(), Some(Path::new("t.toml")));
        assert_eq!(
            (cfg.socket_mode, cfg.socket_group.as_deref()),
            (0o660, Some("users"))
        );
        cfg.validate().unwrap();
        for open in [
            "tcp://0.0.0.0:7070",
            "grpc://10.1.2.3:8001",
            "http://[::]:8000",
        ] {
            let mut c = AgentConfig::default();
            c.add_listen(open).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(open) && e.contains("--insecure"), "{e}");
            c.insecure = true;
            c.validate().unwrap();
        }
        // vsock reaches the hypervisor's host (and what it routes), never a
        // network: no --insecure needed, as for loopback.
        let mut c = AgentConfig::default();
        c.add_listen("vsock://-1:5000").unwrap();
        c.validate().unwrap();
        for bad in ["0800", "x", "", "01777"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_mode("0o640").unwrap(), 0o640);
        let c = AgentConfig {
            socket_mode: 0o060,
            ..AgentConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("0600 at least"));
        assert!(is_loopback("127.0.0.9:1") && is_loopback("[::1]:5") && is_loopback("localhost"));
        assert!(!is_loopback("example.com:80") && !is_loopback("[::]:1"));
    }

    #[test]
    fn connection_limits_parse_and_are_checked() {
        let d = AgentConfig::default();
        assert_eq!(
            (d.max_connections, d.max_connections_per_peer),
            (8192, 1024)
        );
        assert_eq!(d.handshake_timeout, Duration::from_secs(3));
        assert_eq!(d.idle_timeout, None);
        let cfg = AgentConfig::from_toml(
            "[connections]\nmax = 100\nmax_per_peer = 10\nhandshake_timeout_ms = 200\n\
             idle_timeout_ms = 5000\n[shm]\npark_after_ms = 0\n",
        )
        .unwrap();
        assert_eq!(
            (cfg.max_connections, cfg.max_connections_per_peer),
            (100, 10)
        );
        assert_eq!(cfg.handshake_timeout, Duration::from_millis(200));
        assert_eq!(cfg.idle_timeout, Some(Duration::from_secs(5)));
        assert_eq!(cfg.shm_park_after, Duration::ZERO);
        cfg.validate().unwrap();
        // The older spelling still works, alone.
        let old = AgentConfig::from_toml("[limits]\nmax_connections = 50\n").unwrap();
        assert_eq!(old.max_connections, 50);
        assert!(
            AgentConfig::from_toml("[limits]\nmax_connections = 5\n[connections]\nmax = 5\n")
                .is_err()
        );
        assert!(AgentConfig::from_toml("[connections]\nmaximum = 5\n").is_err());
        for bad in [
            AgentConfig {
                max_connections_per_peer: 0,
                ..AgentConfig::default()
            },
            AgentConfig {
                handshake_timeout: Duration::ZERO,
                ..AgentConfig::default()
            },
            AgentConfig {
                idle_timeout: Some(Duration::from_millis(100)),
                ..AgentConfig::default()
            },
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains("connections") || e.contains("timeout"), "{e}");
        }
    }

    #[test]
    fn shm_settings_parse_and_are_checked() {
        let cfg = AgentConfig::default();
        assert_eq!(cfg.shm_spin_us, 50);
        assert_eq!(cfg.shm_sizes(), ShmSizes::default());
        let cfg = AgentConfig::from_toml(
            "listen = [\"shm://x\"]\n[shm]\nspin_us = 0\nclient_bytes = 65536\n\
             agent_bytes = 8192\nring_slots = 16\n",
        )
        .unwrap();
        assert_eq!(cfg.shm_spin_us, 0);
        assert_eq!(
            cfg.shm_sizes(),
            ShmSizes {
                ring_capacity: 16,
                client_len: 65536,
                agent_len: 8192,
                features: 0,
            }
        );
        cfg.validate().unwrap();
        let pull = AgentConfig::from_toml("[shm]\nallow_kernel_pull = true\n").unwrap();
        assert!(pull.allow_kernel_pull);
        assert_eq!(
            pull.shm_sizes().features,
            transport::shm::layout::FEATURE_PULL
        );
        assert!(AgentConfig::from_toml("[shm]\nspin = 1").is_err());
        assert_eq!(AgentConfig::default().socket_spin_us, 50);
        let cfg = AgentConfig::from_toml("[socket]\nspin_us = 0\n").unwrap();
        assert_eq!(cfg.socket_spin_us, 0);
        assert!(AgentConfig::from_toml("[socket]\nspin = 1").is_err());
        for bad in [
            AgentConfig {
                shm_ring_slots: 12,
                ..AgentConfig::default()
            },
            AgentConfig {
                shm_ring_slots: 4,
                ..AgentConfig::default()
            },
            AgentConfig {
                shm_spin_us: MAX_SPIN_US + 1,
                ..AgentConfig::default()
            },
            AgentConfig {
                socket_spin_us: MAX_SPIN_US + 1,
                ..AgentConfig::default()
            },
            AgentConfig {
                shm_agent_bytes: 100,
                ..AgentConfig::default()
            },
            AgentConfig {
                shm_client_bytes: 0,
                ..AgentConfig::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
