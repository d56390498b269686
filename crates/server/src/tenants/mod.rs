//! Tenants: who a session is, what it may see and call, and how much of
//! the agent it may hold.
//!
//! Without a tenants file the agent is *open*: every session sees and
//! calls every model within the agent-wide limits, and nothing here runs.
//! With one (`serve --tenants FILE`, see [`file`](mod@file)), each session is matched
//! to a tenant once, at its Hello ([`Tenants::resolve`]):
//!
//! 1. a Hello carrying a bearer token: the tenant that lists the token's
//!    SHA-256; a token no tenant lists is refused (`permission-denied`),
//!    and the session ends;
//! 2. no token, a TLS client with a verified certificate (mutual TLS):
//!    the tenant listing one of the certificate's DNS names
//!    (`cert_names`);
//! 3. no token, a local peer (unix, shm): the tenant listing its uid
//!    (`SO_PEERCRED`, recorded by the kernel at `connect`), else the
//!    tenant listing its primary gid;
//! 4. anyone else: the tenant named `default`, or, when the file has none,
//!    rights to nothing (and, over shm, the smallest arena).
//!
//! The session then holds a [`Seat`]: its tenant, checked again only when
//! the file was reloaded (a generation number, one atomic load a request),
//! and the last model it was allowed, so an shm request pays one compare
//! for its capability. Quotas are counted in the tenant's [`Usage`], which
//! survives reloads (by name): requests in flight ([`Ticket`], held until
//! the reply), requests waiting in model queues, sessions open, a request
//! rate (GCRA: one compare-and-swap), request and arena bytes (narrowed
//! into the session's limits at its Hello).
//!
//! The agent's work for a tenant is the tenant's (resource amplification):
//! a [`CpuMeter`] charges the CPU time of each session turn to its tenant
//! and, for a tenant with a `cpu_cgroup`, runs the turn in that cgroup
//! ([`cgroup`]).
//!
//! In-process callers (`inproc://`, the embedding program's own code) are
//! the agent's owner and hold no seat.

pub mod cgroup;
pub mod file;

use crate::registry::ModelEntry;
use arc_swap::ArcSwap;
use file::{ModelSet, Quotas, TenantSpec, TenantsError, DEFAULT_TENANT};
use sha2::{Digest, Sha256};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use transport::Credentials;
use wire::{monotonic_ns, Limits, Status};

/// Who is on the other end of a session, as far as the agent can tell.
///
/// # Examples
///
/// A local peer, known by its credentials:
///
/// ```
/// use server::tenants::Identity;
/// let (a, _b) = std::os::unix::net::UnixStream::pair()?;
/// let creds = transport::Credentials::of_unix(&a)?;
/// let who = Identity { creds: Some(creds), ..Identity::default() };
/// assert!(who.describe().starts_with(&format!("uid {} gid {}", creds.uid, creds.gid)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The kernel's record of a local peer (unix, shm).
    pub creds: Option<Credentials>,
    /// A tcp peer's source address.
    pub addr: Option<IpAddr>,
    /// A vsock peer's CID and port (no `SO_PEERCRED` there: such a peer
    /// is matched by its token, else it is `default`).
    pub vsock: Option<transport::vsock::VsockAddr>,
    /// The agent's own process (in-process callers): never checked.
    pub in_process: bool,
    /// The DNS names of a TLS client's verified certificate (mutual TLS).
    pub cert_names: Option<Arc<[String]>>,
}

impl Identity {
    /// The agent's own code, calling in-process.
    ///
    /// # Examples
    ///
    /// In-process callers are the agent's owner: they hold no seat.
    ///
    /// ```
    /// use server::tenants::Identity;
    /// let agent = server::Agent::start(server::AgentConfig::default())?;
    /// let g = agent.core().grant(&Identity::IN_PROCESS, None, &wire::Limits::default()).map_err(|d| d.1)?;
    /// assert!(g.seat.is_none());
    /// assert_eq!(Identity::IN_PROCESS.describe(), "in-process");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const IN_PROCESS: Identity = Identity {
        creds: None,
        addr: None,
        vsock: None,
        in_process: true,
        cert_names: None,
    };

    /// A peer known by nothing but the token it may send (front doors).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::Identity;
    /// assert_eq!(Identity::REMOTE.describe(), "a remote peer");
    /// ```
    pub const REMOTE: Identity = Identity {
        creds: None,
        addr: None,
        vsock: None,
        in_process: false,
        cert_names: None,
    };

    /// For log lines: `uid 1000 (pid 42)`, `address 10.0.0.1`, `vsock
    /// CID 3 port 1024`, `in-process`.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::Identity;
    /// let who = Identity { addr: Some([10, 0, 0, 1].into()), ..Identity::default() };
    /// assert_eq!(who.describe(), "address 10.0.0.1");
    /// ```
    pub fn describe(&self) -> String {
        let cert = match self.cert_names.as_deref() {
            Some([first, ..]) => format!(" (certificate {first})"),
            _ => String::new(),
        };
        match (self.creds, self.addr, self.vsock, self.in_process) {
            (_, _, _, true) => "in-process".into(),
            (Some(c), _, _, _) => format!("uid {} gid {} (pid {})", c.uid, c.gid, c.pid),
            (None, Some(a), _, _) => format!("address {a}{cert}"),
            (None, None, Some(v), _) => format!("vsock CID {} port {}", v.cid, v.port),
            (None, None, None, false) => format!("a remote peer{cert}"),
        }
    }
}

/// A refusal: the status and a message that names what was refused and
/// the tenant. Example: [`Seat::admit`].
pub type Denied = (Status, String);

/// One tenant in force: its rights, quotas and usage.
///
/// # Examples
///
/// ```
/// use server::tenants::{Identity, Tenants};
/// # use server::tenants::{digest, file};
/// # let hex: String = digest(b"s3cret").iter().map(|b| format!("{b:02x}")).collect();
/// # let text = format!("[[tenant]]\nname = \"analytics\"\ntokens_sha256 = [\"{hex}\"]\nmodels = [\"identity\"]\nmax_in_flight = 1\nmax_request_bytes = 1024\n\n[[tenant]]\nname = \"default\"\nmodels = []\n");
/// let tenants = Tenants::from_specs(file::parse(&text, "tenants.toml")?);
/// let t = tenants.resolve(&Identity::REMOTE, Some(b"s3cret")).map_err(|d| d.1)?;
/// assert_eq!(&*t.name, "analytics");
/// assert!(t.may_use("identity") && !t.may_use("digits"));
/// assert_eq!(t.quotas.max_in_flight, Some(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Tenant {
    /// Its name.
    pub name: Arc<str>,
    models: ModelSet,
    /// Its quotas.
    pub quotas: Quotas,
    /// Its share of a busy model's queue (1..=10 000).
    pub weight: u32,
    /// How many of its requests waiting at once start at its fair turn
    /// (`queue`'s module doc; 1..=1024).
    pub queue_burst: u32,
    /// What it holds now, and its counters (kept across reloads).
    pub usage: Arc<Usage>,
    /// Its CPU cgroup's directory, if it has one.
    pub cpu_cgroup: Option<PathBuf>,
    /// That cgroup, opened on first use (`None` when it cannot be: logged
    /// once; `load` and `reload` refuse such a file up front).
    cgroup: OnceLock<Option<cgroup::CpuCgroup>>,
}

impl Tenant {
    /// Its CPU cgroup, opened on first use.
    fn cgroup(&self) -> Option<&cgroup::CpuCgroup> {
        let dir = self.cpu_cgroup.as_ref()?;
        self.cgroup
            .get_or_init(|| match cgroup::CpuCgroup::open(dir) {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!(
                        "tensorwire agent: tenant '{}': cpu_cgroup {}: {e} (its work runs in \
                         the agent's cgroup)",
                        self.name,
                        dir.display()
                    );
                    None
                }
            })
            .as_ref()
    }

    /// Whether it may list and call the model named `name`.
    /// Example: [`Tenant`].
    pub fn may_use(&self, name: &str) -> bool {
        self.models.contains(name)
    }

    /// `limits` narrowed by this tenant's quotas: a request's payload, and
    /// requests in flight on one session.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{Identity, Tenants};
    /// # use server::tenants::{digest, file};
    /// # let hex: String = digest(b"s3cret").iter().map(|b| format!("{b:02x}")).collect();
    /// # let text = format!("[[tenant]]\nname = \"analytics\"\ntokens_sha256 = [\"{hex}\"]\nmodels = [\"identity\"]\nmax_in_flight = 1\nmax_request_bytes = 1024\n\n[[tenant]]\nname = \"default\"\nmodels = []\n");
    /// let t = Tenants::from_specs(file::parse(&text, "t.toml")?)
    ///     .resolve(&Identity::REMOTE, Some(b"s3cret")).map_err(|d| d.1)?;
    /// let l = t.narrow(wire::Limits::default());
    /// assert_eq!((l.max_payload, l.max_in_flight), (1024, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn narrow(&self, mut limits: Limits) -> Limits {
        if let Some(b) = self.quotas.max_request_bytes {
            limits.max_payload = limits.max_payload.min(b);
        }
        if let Some(n) = self.quotas.max_in_flight {
            limits.max_in_flight = limits.max_in_flight.min(n);
        }
        limits
    }
}

/// What a tenant holds now, and what happened to its requests: counted
/// across all its sessions and kept across reloads of the file.
///
/// # Examples
///
/// ```
/// use server::tenants::{file, Identity, Tenants};
/// use std::sync::atomic::Ordering;
/// use std::sync::Arc;
/// let t = Arc::new(Tenants::from_specs(file::parse("[[tenant]]\nname = \"default\"\nmodels = [\"*\"]\n", "t.toml")?));
/// let tenant = t.resolve(&Identity::REMOTE, None).map_err(|d| d.1)?;
/// let registry = server::ModelRegistry::with_identity();
/// let model = registry.find("identity").ok_or("served")?;
/// let seat = t.request_seat(&Identity::REMOTE, None).map_err(|d| d.1)?;
/// let ticket = seat.admit(&model, 16).map_err(|d| d.1)?;
/// assert_eq!(tenant.usage.in_flight.load(Ordering::Relaxed), 1);
/// drop(ticket);
/// assert_eq!(tenant.usage.in_flight.load(Ordering::Relaxed), 0);
/// assert_eq!(tenant.usage.requests.load(Ordering::Relaxed), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct Usage {
    /// Requests between admission and reply.
    pub in_flight: AtomicU32,
    /// Requests waiting in a model's queue.
    pub queued: AtomicU32,
    /// Sessions open.
    pub connections: AtomicU32,
    /// The rate gate's theoretical arrival time (GCRA), monotonic ns.
    rate_tat: AtomicU64,
    /// Requests admitted.
    pub requests: AtomicU64,
    /// Requests and sessions refused for lack of rights.
    pub denied: AtomicU64,
    /// Requests refused by a quota (in flight, queued, bytes, rate,
    /// connections).
    pub over_quota: AtomicU64,
    /// Agent CPU time spent on its requests, ns (while they ran on a
    /// worker: reading, computing, answering).
    pub cpu_ns: AtomicU64,
}

/// A tenant's counters at one moment (for metrics and `stats`).
/// Example: [`Tenants::snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSnapshot {
    /// The tenant.
    pub name: String,
    /// Requests in flight now.
    pub in_flight: u32,
    /// Requests waiting in model queues now.
    pub queued: u32,
    /// Sessions open now.
    pub connections: u32,
    /// Requests admitted since start.
    pub requests: u64,
    /// Requests and sessions refused for lack of rights since start.
    pub denied: u64,
    /// Requests refused by a quota since start.
    pub over_quota: u64,
    /// Agent CPU ns spent on its requests since start.
    pub cpu_ns: u64,
}

/// The tenants in force: one immutable table, swapped whole on reload.
#[derive(Debug)]
struct TenantTable {
    tenants: Vec<Arc<Tenant>>,
    by_token: HashMap<[u8; 32], usize>,
    by_uid: HashMap<u32, usize>,
    by_gid: HashMap<u32, usize>,
    by_cert_name: HashMap<String, usize>,
    /// The tenant of identities no other claims.
    default: Arc<Tenant>,
}

/// The agent's tenants: the table in force, the file it came from, and a
/// generation that moves on every reload.
///
/// An agent started with [`AgentConfig::tenants`](crate::AgentConfig::tenants)
/// loads its own (reach it with `agent.core().tenants()`); a program that
/// runs a core of its own gives it one with
/// [`AgentCore::with_tenants`](crate::dispatch::AgentCore::with_tenants).
///
/// # Examples
///
/// An agent whose clients name their tenant with a token:
///
/// ```
/// # use server::tenants::{digest, file};
/// # let hex: String = digest(b"s3cret").iter().map(|b| format!("{b:02x}")).collect();
/// # let text = format!("[[tenant]]\nname = \"analytics\"\ntokens_sha256 = [\"{hex}\"]\nmodels = [\"identity\"]\nmax_in_flight = 1\nmax_request_bytes = 1024\n\n[[tenant]]\nname = \"default\"\nmodels = []\n");
/// # let dir = tempfile::tempdir()?;
/// # let uri = format!("unix://{}", dir.path().join("a.sock").display());
/// let path = dir.path().join("tenants.toml");
/// std::fs::write(&path, &text)?;
/// let mut cfg = server::AgentConfig::default();
/// cfg.add_listen(&uri)?;
/// cfg.tenants = Some(path.clone());
/// let agent = server::Agent::start(cfg)?;
/// let tenants = agent.core().tenants().ok_or("a tenants file was given")?;
/// assert_eq!(tenants.path(), Some(path.as_path()));
///
/// let opts = client::ClientOptions { token: Some("s3cret".into()), ..Default::default() };
/// let c = client::Client::connect_with(&uri, opts)?;
/// c.model("identity")?.infer(&[client::TensorRef::from_slice(&[4], &[0u8; 4])?])?;
/// let analytics = tenants.snapshot().into_iter().find(|t| t.name == "analytics").ok_or("listed")?;
/// assert_eq!(analytics.requests, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Tenants {
    table: ArcSwap<TenantTable>,
    generation: AtomicU64,
    path: Option<PathBuf>,
    /// Usage by tenant name, kept across reloads (a tenant dropped from
    /// the file and added back finds its counters).
    usage: Mutex<HashMap<String, Arc<Usage>>>,
}

/// What a reload changed. Example: [`Tenants::reload`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reloaded {
    /// Tenants in force now.
    pub tenants: usize,
    /// The generation now in force.
    pub generation: u64,
}

impl Tenants {
    /// Reads and checks the tenants file at `path` (its cgroups included:
    /// each must be a cgroup the agent can move threads into and out of).
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("tenants.toml");
    /// std::fs::write(&path, "[[tenant]]\nname = \"ops\"\nuids = [0]\nmodels = [\"*\"]\n")?;
    /// let t = server::tenants::Tenants::load(&path)?;
    /// assert_eq!(t.generation(), 1);
    /// let names: Vec<String> = t.snapshot().into_iter().map(|s| s.name).collect();
    /// assert_eq!(names, ["ops", "default"]); // the implicit default: rights to nothing
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(path: &Path) -> Result<Tenants, TenantsError> {
        let specs = file::read(path)?;
        check_cgroups(&specs, path)?;
        let t = Tenants::from_specs(specs);
        Ok(Tenants {
            path: Some(path.to_path_buf()),
            ..t
        })
    }

    /// Tenants from checked specs (tests, embedding).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{file, Tenants};
    /// let t = Tenants::from_specs(file::parse("[[tenant]]\nname = \"default\"\n", "built-in")?);
    /// assert_eq!(t.path(), None);
    /// assert!(t.reload().is_err()); // nothing to read again
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_specs(specs: Vec<TenantSpec>) -> Tenants {
        let usage = Mutex::new(HashMap::new());
        let table = build(specs, &usage);
        Tenants {
            table: ArcSwap::from_pointee(table),
            generation: AtomicU64::new(1),
            path: None,
            usage,
        }
    }

    /// Reads the file again and puts it in force; on any error the table
    /// in force stays as it was. Sessions keep going: each looks its
    /// tenant up again before its next request.
    ///
    /// # Examples
    ///
    /// What `serve` does on SIGHUP:
    ///
    /// ```
    /// use server::tenants::{Reloaded, Tenants};
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("tenants.toml");
    /// std::fs::write(&path, "[[tenant]]\nname = \"a\"\n")?;
    /// let t = Tenants::load(&path)?;
    /// std::fs::write(&path, "[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"b\"\n")?;
    /// assert_eq!(t.reload()?, Reloaded { tenants: 2, generation: 2 });
    /// std::fs::write(&path, "[[tenant]]\nname = \"a\"\nweight = 0\n")?;
    /// assert!(t.reload().is_err());
    /// assert_eq!(t.generation(), 2); // the table in force stays
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reload(&self) -> Result<Reloaded, TenantsError> {
        let Some(path) = &self.path else {
            return Err(TenantsError {
                path: "(none)".into(),
                line: None,
                message: "these tenants were not read from a file".into(),
            });
        };
        let specs = file::read(path)?;
        check_cgroups(&specs, path)?;
        Ok(self.replace(specs))
    }

    /// Puts `specs` in force (what [`reload`](Self::reload) does once the
    /// file is read and checked).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{file, Identity, Tenants};
    /// let t = Tenants::from_specs(Vec::new()); // nobody: unknown identities get nothing
    /// assert!(!t.resolve(&Identity::REMOTE, None).map_err(|d| d.1)?.may_use("identity"));
    /// let r = t.replace(file::parse("[[tenant]]\nname = \"default\"\nmodels = [\"*\"]\n", "t.toml")?);
    /// assert_eq!(r.generation, t.generation());
    /// assert!(t.resolve(&Identity::REMOTE, None).map_err(|d| d.1)?.may_use("identity"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replace(&self, specs: Vec<TenantSpec>) -> Reloaded {
        let table = build(specs, &self.usage);
        let tenants = table.tenants.len();
        self.table.store(Arc::new(table));
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        Reloaded {
            tenants,
            generation,
        }
    }

    /// The file the tenants came from. Examples: [`Tenants`],
    /// [`Tenants::from_specs`].
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The generation in force (moves on every reload). Example:
    /// [`Tenants::reload`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The tenant of `who` presenting `token` (see the module doc). A token
    /// no tenant lists is refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{Identity, Tenants};
    /// # use server::tenants::{digest, file};
    /// # let hex: String = digest(b"s3cret").iter().map(|b| format!("{b:02x}")).collect();
    /// # let text = format!("[[tenant]]\nname = \"analytics\"\ntokens_sha256 = [\"{hex}\"]\nmodels = [\"identity\"]\nmax_in_flight = 1\nmax_request_bytes = 1024\n\n[[tenant]]\nname = \"default\"\nmodels = []\n");
    /// let t = Tenants::from_specs(file::parse(&text, "t.toml")?);
    /// let who = Identity::REMOTE;
    /// assert_eq!(&*t.resolve(&who, Some(b"s3cret")).map_err(|d| d.1)?.name, "analytics");
    /// assert_eq!(&*t.resolve(&who, None).map_err(|d| d.1)?.name, "default");
    /// let (status, _) = t.resolve(&who, Some(b"guess")).unwrap_err();
    /// assert_eq!(status, wire::Status::PermissionDenied);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resolve(&self, who: &Identity, token: Option<&[u8]>) -> Result<Arc<Tenant>, Denied> {
        self.resolve_digest(who, token.map(digest).as_ref())
    }

    fn resolve_digest(
        &self,
        who: &Identity,
        token: Option<&[u8; 32]>,
    ) -> Result<Arc<Tenant>, Denied> {
        let t = self.table.load();
        if let Some(d) = token {
            return match t.by_token.get(d) {
                Some(&i) => Ok(t.tenants[i].clone()),
                None => {
                    t.default.usage.denied.fetch_add(1, Ordering::Relaxed);
                    Err((
                        Status::PermissionDenied,
                        format!(
                            "the token {} sent is not one the agent accepts (no tenant lists its \
                             SHA-256)",
                            who.describe()
                        ),
                    ))
                }
            };
        }
        let by_cert = who.cert_names.as_deref().and_then(|names| {
            names
                .iter()
                .find_map(|n| t.by_cert_name.get(&n.to_ascii_lowercase()))
                .copied()
        });
        let found = by_cert.or_else(|| {
            who.creds.and_then(|c| {
                t.by_uid
                    .get(&c.uid)
                    .or_else(|| t.by_gid.get(&c.gid))
                    .copied()
            })
        });
        Ok(found.map_or_else(|| t.default.clone(), |i| t.tenants[i].clone()))
    }

    /// Every tenant in force, with its counters (the implicit `default`
    /// too, when the file declares none).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{Identity, TenantSnapshot, Tenants};
    /// use std::sync::Arc;
    /// let t = Arc::new(Tenants::from_specs(Vec::new()));
    /// let _seat = t.seat(&Identity::REMOTE, None).map_err(|d| d.1)?;
    /// assert_eq!(t.snapshot(), [TenantSnapshot {
    ///     name: "default".into(), in_flight: 0, queued: 0, connections: 1,
    ///     requests: 0, denied: 0, over_quota: 0, cpu_ns: 0,
    /// }]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self) -> Vec<TenantSnapshot> {
        let t = self.table.load();
        let mut all: Vec<&Arc<Tenant>> = t.tenants.iter().collect();
        if !t.tenants.iter().any(|x| Arc::ptr_eq(x, &t.default)) {
            all.push(&t.default);
        }
        all.into_iter()
            .map(|x| {
                let u = &x.usage;
                TenantSnapshot {
                    name: x.name.to_string(),
                    in_flight: u.in_flight.load(Ordering::Relaxed),
                    queued: u.queued.load(Ordering::Relaxed),
                    connections: u.connections.load(Ordering::Relaxed),
                    requests: u.requests.load(Ordering::Relaxed),
                    denied: u.denied.load(Ordering::Relaxed),
                    over_quota: u.over_quota.load(Ordering::Relaxed),
                    cpu_ns: u.cpu_ns.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Seats a new session of `who` with `token`: its tenant, counted
    /// against the tenant's `max_connections`.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{file, Identity, Tenants};
    /// use std::sync::Arc;
    /// let t = Arc::new(Tenants::from_specs(file::parse(
    ///     "[[tenant]]\nname = \"default\"\nmax_connections = 1\n", "t.toml")?));
    /// let first = t.seat(&Identity::REMOTE, None).map_err(|d| d.1)?;
    /// let (status, msg) = t.seat(&Identity::REMOTE, None).unwrap_err();
    /// assert_eq!(status, wire::Status::LimitExceeded);
    /// assert!(msg.contains("max_connections (1)"), "{msg}");
    /// drop(first); // the session ended
    /// assert!(t.seat(&Identity::REMOTE, None).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seat(self: &Arc<Self>, who: &Identity, token: Option<&[u8]>) -> Result<Seat, Denied> {
        let digest = token.map(digest);
        let tenant = self.resolve_digest(who, digest.as_ref())?;
        let usage = tenant.usage.clone();
        let max = tenant.quotas.max_connections;
        if !take_one(&usage.connections, max) {
            usage.over_quota.fetch_add(1, Ordering::Relaxed);
            return Err((
                Status::LimitExceeded,
                format!(
                    "tenant '{}' has its max_connections ({}) sessions open already",
                    tenant.name,
                    max.unwrap_or_default()
                ),
            ));
        }
        Ok(Seat {
            tenants: self.clone(),
            who: who.clone(),
            digest,
            generation: Cell::new(self.generation()),
            tenant: RefCell::new(Ok(tenant)),
            allowed: Cell::new(None),
            counted: RefCell::new(Some(usage)),
        })
    }

    /// A seat for one request that comes without a session of its own (a
    /// KServe front door's HTTP or gRPC call): its tenant, not counted in
    /// `max_connections`.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{file, Identity, Tenants};
    /// use std::sync::Arc;
    /// let t = Arc::new(Tenants::from_specs(file::parse(
    ///     "[[tenant]]\nname = \"default\"\nmax_connections = 1\n", "t.toml")?));
    /// let _session = t.seat(&Identity::REMOTE, None).map_err(|d| d.1)?;
    /// let call = t.request_seat(&Identity::REMOTE, None).map_err(|d| d.1)?; // not a session
    /// assert_eq!(call.tenant_name(), "default");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn request_seat(
        self: &Arc<Self>,
        who: &Identity,
        token: Option<&[u8]>,
    ) -> Result<Seat, Denied> {
        let digest = token.map(digest);
        let tenant = self.resolve_digest(who, digest.as_ref())?;
        Ok(Seat {
            tenants: self.clone(),
            who: who.clone(),
            digest,
            generation: Cell::new(self.generation()),
            tenant: RefCell::new(Ok(tenant)),
            allowed: Cell::new(None),
            counted: RefCell::new(None),
        })
    }
}

/// Checks that every tenant's `cpu_cgroup` can take threads, and that
/// they can come back to the agent's own cgroup.
fn check_cgroups(specs: &[TenantSpec], path: &Path) -> Result<(), TenantsError> {
    let fail = |message: String| TenantsError {
        path: path.display().to_string(),
        line: None,
        message,
    };
    for s in specs {
        if let Some(dir) = &s.cpu_cgroup {
            cgroup::CpuCgroup::open(dir).map_err(|e| {
                fail(format!(
                    "tenant '{}': cpu_cgroup {}: {e}",
                    s.name,
                    dir.display()
                ))
            })?;
            cgroup::home().map_err(|e| fail(format!("tenant '{}': {e}", s.name)))?;
        }
    }
    Ok(())
}

/// Counts one more in `counter` unless it holds `max` already (`None`: no
/// limit); false when it was full.
fn take_one(counter: &AtomicU32, max: Option<u32>) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            max.is_none_or(|m| n < m).then_some(n + 1)
        })
        .is_ok()
}

/// SHA-256 of a token: what a tenants file lists (as hex) in
/// `tokens_sha256`.
///
/// # Examples
///
/// ```
/// let hex: String = server::tenants::digest(b"test").iter().map(|b| format!("{b:02x}")).collect();
/// assert_eq!(hex, "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
/// ```
pub fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// The table for `specs`, reusing the usage of tenants already known.
fn build(specs: Vec<TenantSpec>, usage: &Mutex<HashMap<String, Arc<Usage>>>) -> TenantTable {
    let mut known = usage.lock().unwrap_or_else(|p| p.into_inner());
    let mut usage_of = |name: &str| {
        known
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(Usage::default()))
            .clone()
    };
    let mut table = TenantTable {
        tenants: Vec::with_capacity(specs.len()),
        by_token: HashMap::new(),
        by_uid: HashMap::new(),
        by_gid: HashMap::new(),
        by_cert_name: HashMap::new(),
        default: Arc::new(Tenant {
            name: DEFAULT_TENANT.into(),
            models: ModelSet::Named(Default::default()),
            // It may use nothing: its sessions get the smallest arena.
            quotas: Quotas {
                max_arena_bytes: Some(file::MIN_ARENA_BYTES),
                ..Quotas::default()
            },
            weight: 1,
            queue_burst: 1,
            usage: usage_of(DEFAULT_TENANT),
            cpu_cgroup: None,
            cgroup: OnceLock::new(),
        }),
    };
    for s in specs {
        let i = table.tenants.len();
        table
            .by_token
            .extend(s.tokens_sha256.iter().map(|d| (*d, i)));
        table.by_uid.extend(s.uids.iter().map(|u| (*u, i)));
        table.by_gid.extend(s.gids.iter().map(|g| (*g, i)));
        table
            .by_cert_name
            .extend(s.cert_names.iter().map(|n| (n.clone(), i)));
        let t = Arc::new(Tenant {
            usage: usage_of(&s.name),
            name: s.name.as_str().into(),
            models: s.models,
            quotas: s.quotas,
            weight: s.weight,
            queue_burst: s.queue_burst,
            cpu_cgroup: s.cpu_cgroup,
            cgroup: OnceLock::new(),
        });
        if &*t.name == DEFAULT_TENANT {
            table.default = t.clone();
        }
        table.tenants.push(t);
    }
    table
}

/// One session's place among the tenants: its tenant (looked up again
/// after a reload), the last model it was allowed, and its count in the
/// tenant's `max_connections` (given back when the seat drops).
///
/// Examples: [`Tenants::seat`], [`Seat::admit`].
#[derive(Debug)]
pub struct Seat {
    tenants: Arc<Tenants>,
    who: Identity,
    digest: Option<[u8; 32]>,
    /// The generation `tenant` was resolved in.
    generation: Cell<u64>,
    /// The tenant, or why it is no more (a token dropped from the file).
    tenant: RefCell<Result<Arc<Tenant>, Denied>>,
    /// The last model id allowed (in `generation`), so a session calling
    /// one model pays one compare for its capability.
    allowed: Cell<Option<u32>>,
    /// The usage whose `connections` this seat counts in (none for a
    /// request's own seat); moved when a reload gives the session another
    /// tenant.
    counted: RefCell<Option<Arc<Usage>>>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        if let Some(u) = self.counted.get_mut() {
            u.connections.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Seat {
    /// The tenant in force for this session, looked up again when the file
    /// was reloaded since.
    ///
    /// # Examples
    ///
    /// A session whose token is dropped from the file loses its tenant at
    /// its next request:
    ///
    /// ```
    /// use server::tenants::{Identity, Tenants};
    /// use std::sync::Arc;
    /// # use server::tenants::{digest, file};
    /// # let hex: String = digest(b"s3cret").iter().map(|b| format!("{b:02x}")).collect();
    /// # let text = format!("[[tenant]]\nname = \"analytics\"\ntokens_sha256 = [\"{hex}\"]\nmodels = [\"identity\"]\nmax_in_flight = 1\nmax_request_bytes = 1024\n\n[[tenant]]\nname = \"default\"\nmodels = []\n");
    /// let t = Arc::new(Tenants::from_specs(file::parse(&text, "t.toml")?));
    /// let seat = t.seat(&Identity::REMOTE, Some(b"s3cret")).map_err(|d| d.1)?;
    /// assert_eq!(&*seat.tenant().map_err(|d| d.1)?.name, "analytics");
    /// t.replace(Vec::new());
    /// assert!(seat.tenant().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tenant(&self) -> Result<Arc<Tenant>, Denied> {
        let now = self.tenants.generation();
        if now != self.generation.get() {
            let t = self.tenants.resolve_digest(&self.who, self.digest.as_ref());
            // The session now counts among its new tenant's sessions (a
            // reload may put a tenant over its max_connections: the limit
            // applies to sessions opened from then on).
            if let (Ok(t), Some(old)) = (&t, self.counted.borrow_mut().as_mut()) {
                if !Arc::ptr_eq(old, &t.usage) {
                    old.connections.fetch_sub(1, Ordering::AcqRel);
                    t.usage.connections.fetch_add(1, Ordering::AcqRel);
                    *old = t.usage.clone();
                }
            }
            *self.tenant.borrow_mut() = t;
            self.generation.set(now);
            self.allowed.set(None);
        }
        self.tenant.borrow().clone()
    }

    /// The name of the tenant in force (for messages). Example:
    /// [`Tenants::request_seat`].
    pub fn tenant_name(&self) -> String {
        self.tenant()
            .map_or_else(|_| "(none)".into(), |t| t.name.to_string())
    }

    /// Whether this session may list and look up the model named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{Identity, Tenants};
    /// use std::sync::Arc;
    /// # use server::tenants::{digest, file};
    /// # let hex: String = digest(b"s3cret").iter().map(|b| format!("{b:02x}")).collect();
    /// # let text = format!("[[tenant]]\nname = \"analytics\"\ntokens_sha256 = [\"{hex}\"]\nmodels = [\"identity\"]\nmax_in_flight = 1\nmax_request_bytes = 1024\n\n[[tenant]]\nname = \"default\"\nmodels = []\n");
    /// let t = Arc::new(Tenants::from_specs(file::parse(&text, "t.toml")?));
    /// let seat = t.seat(&Identity::REMOTE, None).map_err(|d| d.1)?; // no token: default
    /// assert!(!seat.may_see("identity"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn may_see(&self, name: &str) -> bool {
        self.tenant().is_ok_and(|t| t.may_use(name))
    }

    /// Admits one request for `model` carrying `payload` bytes: the
    /// capability (cached per model), the request size, the rate and the
    /// tenant's in-flight quota. The [`Ticket`] counts the request in
    /// flight until it drops.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{Identity, Tenants};
    /// use std::sync::Arc;
    /// use wire::Status;
    /// # use server::tenants::{digest, file};
    /// # let hex: String = digest(b"s3cret").iter().map(|b| format!("{b:02x}")).collect();
    /// # let text = format!("[[tenant]]\nname = \"analytics\"\ntokens_sha256 = [\"{hex}\"]\nmodels = [\"identity\"]\nmax_in_flight = 1\nmax_request_bytes = 1024\n\n[[tenant]]\nname = \"default\"\nmodels = []\n");
    /// let t = Arc::new(Tenants::from_specs(file::parse(&text, "t.toml")?));
    /// let registry = server::ModelRegistry::with_identity();
    /// let model = registry.find("identity").ok_or("served")?;
    /// let seat = t.seat(&Identity::REMOTE, Some(b"s3cret")).map_err(|d| d.1)?;
    /// assert_eq!(seat.admit(&model, 4096).unwrap_err().0, Status::LimitExceeded); // max_request_bytes
    /// let ticket = seat.admit(&model, 16).map_err(|d| d.1)?;
    /// assert_eq!(seat.admit(&model, 16).unwrap_err().0, Status::TooManyInFlight); // max_in_flight 1
    /// ticket.release(); // its answer is leaving
    /// assert!(seat.admit(&model, 16).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit(&self, model: &ModelEntry, payload: u64) -> Result<Ticket, Denied> {
        self.admit_id(model.id, Some(model), payload)
    }

    /// [`admit`](Self::admit) for a request naming model `id`, which the
    /// registry resolved to `model` (`None`: no such model). Rights come
    /// before existence: an id the tenant may not call and an id no model
    /// has get the same answer, naming only the id, so a tenant cannot
    /// learn which models (or names) the agent serves for others.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{Identity, Tenants};
    /// use std::sync::Arc;
    /// # use server::tenants::{digest, file};
    /// # let hex: String = digest(b"s3cret").iter().map(|b| format!("{b:02x}")).collect();
    /// # let text = format!("[[tenant]]\nname = \"analytics\"\ntokens_sha256 = [\"{hex}\"]\nmodels = [\"identity\"]\nmax_in_flight = 1\nmax_request_bytes = 1024\n\n[[tenant]]\nname = \"default\"\nmodels = []\n");
    /// let t = Arc::new(Tenants::from_specs(file::parse(&text, "t.toml")?));
    /// let seat = t.seat(&Identity::REMOTE, Some(b"s3cret")).map_err(|d| d.1)?;
    /// let (status, msg) = seat.admit_id(99, None, 0).unwrap_err(); // no model 99
    /// assert_eq!(status, wire::Status::PermissionDenied);
    /// assert!(msg.contains("may not call model id 99"), "{msg}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit_id(
        &self,
        id: u32,
        model: Option<&ModelEntry>,
        payload: u64,
    ) -> Result<Ticket, Denied> {
        let tenant = self.tenant()?;
        let usage = &tenant.usage;
        if self.allowed.get() != Some(id) {
            if !model.is_some_and(|m| tenant.may_use(&m.signature().name)) {
                usage.denied.fetch_add(1, Ordering::Relaxed);
                return Err((
                    Status::PermissionDenied,
                    format!(
                        "tenant '{}' may not call model id {id} (resolve names with \
                         ModelQuery: it answers for the models this tenant may use)",
                        tenant.name
                    ),
                ));
            }
            self.allowed.set(Some(id));
        }
        let q = tenant.quotas;
        if let Some(max) = q.max_request_bytes.filter(|&m| payload > m) {
            usage.over_quota.fetch_add(1, Ordering::Relaxed);
            return Err((
                Status::LimitExceeded,
                format!(
                    "tenant '{}' may send at most {max} payload bytes a request, not {payload}",
                    tenant.name
                ),
            ));
        }
        // In flight first, then the rate: a request refused for being one
        // too many in flight takes no rate token.
        let max = q.max_in_flight;
        if !take_one(&usage.in_flight, max) {
            usage.over_quota.fetch_add(1, Ordering::Relaxed);
            return Err((
                Status::TooManyInFlight,
                format!(
                    "tenant '{}' has its max_in_flight ({}) requests in flight already, over \
                     all its sessions",
                    tenant.name,
                    max.unwrap_or_default()
                ),
            ));
        }
        let ticket = Ticket::new(tenant);
        if let Some(rate) = q.rate {
            if !gcra(&ticket.tenant.usage.rate_tat, rate.per_second, rate.burst) {
                ticket
                    .tenant
                    .usage
                    .over_quota
                    .fetch_add(1, Ordering::Relaxed);
                return Err((
                    Status::Overloaded,
                    format!(
                        "tenant '{}' is over its rate of {} requests/s (burst {}); retry later",
                        ticket.tenant.name, rate.per_second, rate.burst
                    ),
                ));
            }
        }
        ticket.tenant.usage.requests.fetch_add(1, Ordering::Relaxed);
        Ok(ticket)
    }
}

/// Charges the CPU time of the worker thread running a session's turn to
/// the session's tenant (resource amplification: the agent's work on a
/// tenant's behalf is the tenant's), and runs the turn in the tenant's CPU
/// cgroup when it has one. The thread's CPU clock is a system call here
/// (~1.2 µs on the VMs measured, not in the vDSO), so it is read at the
/// start and end of a turn and every [`CpuMeter::EVERY`] requests within
/// it, never per request.
///
/// # Examples
///
/// A worker's turn for one session, charged to its tenant:
///
/// ```
/// use server::tenants::{CpuMeter, Identity, Tenants};
/// use std::sync::atomic::Ordering;
/// use std::sync::Arc;
/// let t = Arc::new(Tenants::from_specs(Vec::new()));
/// let seat = t.seat(&Identity::REMOTE, None).map_err(|d| d.1)?;
/// let meter = CpuMeter::start(&seat);
/// let mut x = 0u64;
/// for i in 0..1_000_000u64 { x = x.wrapping_add(std::hint::black_box(i)); } // the turn's work
/// meter.finish(&seat);
/// let tenant = seat.tenant().map_err(|d| d.1)?;
/// assert!(tenant.usage.cpu_ns.load(Ordering::Relaxed) > 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CpuMeter {
    since: u64,
    requests: u32,
    /// The thread was moved into its tenant's cgroup: move it home at the end.
    placed: bool,
}

impl CpuMeter {
    /// Requests between two reads of the clock within one turn.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::tenants::{CpuMeter, Identity, Seat, Tenants};
    /// use std::sync::atomic::Ordering;
    /// use std::sync::Arc;
    /// let t = Arc::new(Tenants::from_specs(Vec::new()));
    /// let seat = t.seat(&Identity::REMOTE, None).map_err(|d| d.1)?;
    /// let cpu = |s: &Seat| s.tenant().map(|t| t.usage.cpu_ns.load(Ordering::Relaxed));
    /// let mut meter = CpuMeter::start(&seat);
    /// for _ in 1..CpuMeter::EVERY { meter.tick(&seat); }
    /// assert_eq!(cpu(&seat).map_err(|d| d.1)?, 0); // not charged yet
    /// meter.tick(&seat); // the EVERY-th request reads the clock
    /// assert!(cpu(&seat).map_err(|d| d.1)? > 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const EVERY: u32 = 256;

    /// Starts metering this thread for `seat`'s tenant (and moves it into
    /// the tenant's cgroup, if it has one). Example: [`CpuMeter`].
    pub fn start(seat: &Seat) -> CpuMeter {
        let placed = seat
            .tenant()
            .ok()
            .and_then(|t| Some(t.cgroup()?.enter().is_ok()))
            .unwrap_or(false);
        CpuMeter {
            since: thread_cpu_ns(),
            requests: 0,
            placed,
        }
    }

    /// One request served: every [`Self::EVERY`] requests, charges `seat`.
    /// Example: [`CpuMeter::EVERY`].
    pub fn tick(&mut self, seat: &Seat) {
        self.requests += 1;
        if self.requests >= Self::EVERY {
            self.requests = 0;
            self.charge(seat);
        }
    }

    /// Charges `seat` what this thread spent since the last charge.
    /// Example: [`CpuMeter`] ([`finish`](CpuMeter::finish) charges).
    pub fn charge(&mut self, seat: &Seat) {
        let now = thread_cpu_ns();
        let spent = now.saturating_sub(self.since);
        self.since = now;
        if let Ok(t) = seat.tenant() {
            t.usage.cpu_ns.fetch_add(spent, Ordering::Relaxed);
        }
    }

    /// The turn is over: charges `seat` (and the drop moves the thread back
    /// to the agent's own cgroup). Example: [`CpuMeter`].
    pub fn finish(mut self, seat: &Seat) {
        self.charge(seat);
    }
}

impl Drop for CpuMeter {
    /// Moves the thread back to the agent's own cgroup, however the turn
    /// ended (a turn that returns early or panics included).
    fn drop(&mut self) {
        if self.placed {
            if let Err(e) = cgroup::home().and_then(|h| h.enter().map_err(|e| e.to_string())) {
                eprintln!("tensorwire agent: a worker could not go back to its cgroup: {e}");
            }
        }
    }
}

/// CPU time this thread has used, ns (`CLOCK_THREAD_CPUTIME_ID`).
///
/// # Examples
///
/// ```
/// use server::tenants::thread_cpu_ns;
/// let before = thread_cpu_ns();
/// let mut x = 0u64;
/// for i in 0..1_000_000u64 { x = x.wrapping_add(std::hint::black_box(i)); }
/// assert!(thread_cpu_ns() > before);
/// ```
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// One admitted request's count in its tenant's in-flight quota (given
/// back by [`release`](Ticket::release) or on drop), and what the model
/// queue needs of its tenant. Example: [`Seat::admit`].
#[derive(Debug)]
pub struct Ticket {
    /// The request's tenant.
    pub tenant: Arc<Tenant>,
    released: std::sync::atomic::AtomicBool,
}

impl Ticket {
    fn new(tenant: Arc<Tenant>) -> Ticket {
        Ticket {
            tenant,
            released: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Gives the request's place in its tenant's in-flight quota back now
    /// (its answer is about to leave; the client may send again at once).
    /// Example: [`Seat::admit`] (dropping the ticket afterwards gives
    /// nothing back twice).
    pub fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.tenant.usage.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.release();
    }
}

/// The generic cell rate algorithm: one request at `per_second`, `burst`
/// at once. `tat` is the theoretical arrival time of the next request
/// (monotonic ns); a request is allowed when it comes no more than
/// `(burst - 1)` intervals early, and moves `tat` on by one interval.
fn gcra(tat: &AtomicU64, per_second: f64, burst: u32) -> bool {
    let interval = (1e9 / per_second).max(1.0) as u64;
    let slack = interval.saturating_mul(u64::from(burst.saturating_sub(1)));
    let now = monotonic_ns();
    tat.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
        let t = t.max(now);
        (t - now <= slack).then(|| t.saturating_add(interval))
    })
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(uid: u32, gid: u32) -> Identity {
        Identity {
            creds: Some(Credentials { pid: 1, uid, gid }),
            ..Identity::REMOTE
        }
    }

    fn tenants(text: &str) -> Arc<Tenants> {
        Arc::new(Tenants::from_specs(file::parse(text, "t.toml").unwrap()))
    }

    fn tok(t: &str) -> String {
        digest(t.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn tokens_then_uids_then_gids_then_default() {
        let t = tenants(&format!(
            "[[tenant]]\nname = \"a\"\ntokens_sha256 = [\"{}\"]\nuids = [1]\n\
             [[tenant]]\nname = \"b\"\ngids = [5]\n\
             [[tenant]]\nname = \"default\"\nmodels = [\"identity\"]\n",
            tok("ta")
        ));
        let name = |who: Identity, token: Option<&str>| {
            t.resolve(&who, token.map(str::as_bytes))
                .map(|x| x.name.to_string())
        };
        assert_eq!(name(creds(9, 9), Some("ta")).unwrap(), "a");
        assert_eq!(name(creds(1, 5), None).unwrap(), "a");
        assert_eq!(name(creds(2, 5), None).unwrap(), "b");
        assert_eq!(name(creds(2, 6), None).unwrap(), "default");
        assert_eq!(name(Identity::REMOTE, None).unwrap(), "default");
        // A vsock peer has no uid: its token, else default, like tcp's.
        let guest = Identity {
            vsock: Some(transport::vsock::VsockAddr { cid: 3, port: 1024 }),
            ..Identity::REMOTE
        };
        assert_eq!(name(guest.clone(), Some("ta")).unwrap(), "a");
        assert_eq!(name(guest.clone(), None).unwrap(), "default");
        let (_, msg) = name(guest, Some("wrong")).unwrap_err();
        assert!(msg.contains("vsock CID 3 port 1024"), "{msg}");
        // A token no tenant lists is refused, even for a known uid.
        let (status, msg) = name(creds(1, 5), Some("wrong")).unwrap_err();
        assert_eq!(status, Status::PermissionDenied);
        assert!(msg.contains("not one the agent accepts"), "{msg}");
    }

    #[test]
    fn without_a_default_tenant_the_unknown_get_nothing() {
        let t = tenants("[[tenant]]\nname = \"a\"\nuids = [1]\nmodels = [\"*\"]\n");
        let d = t.resolve(&creds(2, 2), None).unwrap();
        assert_eq!(&*d.name, "default");
        assert!(!d.may_use("identity"));
        assert!(t.resolve(&creds(1, 2), None).unwrap().may_use("anything"));
        assert_eq!(t.snapshot().len(), 2, "the implicit default is listed");
    }

    #[test]
    fn connections_are_counted_and_given_back() {
        let t = tenants("[[tenant]]\nname = \"a\"\nuids = [1]\nmax_connections = 2\n");
        let s1 = t.seat(&creds(1, 1), None).unwrap();
        let _s2 = t.seat(&creds(1, 1), None).unwrap();
        let (status, msg) = t.seat(&creds(1, 1), None).unwrap_err();
        assert_eq!(status, Status::LimitExceeded);
        assert!(msg.contains("max_connections (2)"), "{msg}");
        // Another tenant is not affected.
        let _other = t.seat(&creds(2, 2), None).unwrap();
        drop(s1);
        let _s3 = t.seat(&creds(1, 1), None).unwrap();
        // A front-door request's seat is not a session: not counted.
        let _r = t.request_seat(&creds(1, 1), None).unwrap();
        drop(_s3);
        assert!(t.seat(&creds(1, 1), None).is_ok());
    }

    #[test]
    fn the_rate_gate_allows_the_burst_then_the_rate() {
        let tat = AtomicU64::new(0);
        // 1 request/s, burst 3: three at once, then none for a while.
        let allowed = (0..10).filter(|_| gcra(&tat, 1.0, 3)).count();
        assert_eq!(allowed, 3);
        // A fast rate refills quickly.
        let tat = AtomicU64::new(0);
        assert!((0..5).all(|_| gcra(&tat, 1e9, 5)));
    }

    /// One tenant `name`, token "ta", allowed `model`.
    fn one_token_tenant(name: &str, model: &str) -> Vec<TenantSpec> {
        let text = format!(
            "[[tenant]]\nname = \"{name}\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"{model}\"]\n",
            tok("ta")
        );
        file::parse(&text, "t.toml").unwrap()
    }

    #[test]
    fn a_reload_keeps_usage_and_moves_sessions_to_their_new_tenant() {
        let t = tenants(&format!(
            "[[tenant]]\nname = \"a\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"m\"]\n",
            tok("ta")
        ));
        let seat = t.seat(&Identity::REMOTE, Some(b"ta")).unwrap();
        assert!(seat.may_see("m") && !seat.may_see("n"));
        let usage = seat.tenant().unwrap().usage.clone();
        // Same token, new rights: the seat follows.
        t.replace(one_token_tenant("a", "n"));
        assert!(seat.may_see("n") && !seat.may_see("m"));
        assert!(Arc::ptr_eq(&usage, &seat.tenant().unwrap().usage));
        // Moved to another tenant: the session counts there now.
        t.replace(one_token_tenant("b", "n"));
        let b = seat.tenant().unwrap();
        assert_eq!(&*b.name, "b");
        assert_eq!(b.usage.connections.load(Ordering::Relaxed), 1);
        assert_eq!(usage.connections.load(Ordering::Relaxed), 0);
        t.replace(one_token_tenant("a", "n"));
        assert!(Arc::ptr_eq(&usage, &seat.tenant().unwrap().usage));
        assert_eq!(usage.connections.load(Ordering::Relaxed), 1);
        // The token dropped: the session's requests are refused from now on.
        t.replace(Vec::new());
        assert_eq!(seat.tenant().unwrap_err().0, Status::PermissionDenied);
        drop(seat);
        assert_eq!(usage.connections.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_cpu_meter_charges_the_thread_s_work_to_the_tenant() {
        let t = tenants("[[tenant]]\nname = \"a\"\nuids = [1]\n");
        let seat = t.seat(&creds(1, 1), None).unwrap();
        let mut m = CpuMeter::start(&seat);
        // 20 ms of this thread's CPU time (not wall time: a loaded
        // machine may give it less of a core).
        let until = thread_cpu_ns() + 20_000_000;
        let mut x = 0u64;
        while thread_cpu_ns() < until {
            for _ in 0..1000 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
        }
        assert!(x != 1);
        for _ in 0..CpuMeter::EVERY {
            m.tick(&seat);
        }
        let charged = seat.tenant().unwrap().usage.cpu_ns.load(Ordering::Relaxed);
        assert!(charged >= 20_000_000, "{charged} ns");
        m.finish(&seat);
        assert!(seat.tenant().unwrap().usage.cpu_ns.load(Ordering::Relaxed) >= charged);
    }

    #[test]
    fn a_tenant_narrows_the_session_limits() {
        let t = tenants(
            "[[tenant]]\nname = \"a\"\nuids = [1]\nmax_request_bytes = 100\nmax_in_flight = 3\n",
        );
        let l = t
            .resolve(&creds(1, 1), None)
            .unwrap()
            .narrow(Limits::default());
        assert_eq!((l.max_payload, l.max_in_flight), (100, 3));
        assert_eq!(l.max_tensors, Limits::default().max_tensors);
    }
}
