//! The tenants file (`serve --tenants tenants.toml`): its TOML shape, and
//! every check made before any of it is used.
//!
//! ```toml
//! [[tenant]]
//! name = "analytics"
//! tokens_sha256 = ["9f86d081…"]   # hex SHA-256 of each accepted token
//! uids = [1000]                     # unix/shm peers with these uids
//! gids = [100]                      # ... or with this primary gid
//! cert_names = ["analytics.example"] # TLS clients whose verified certificate carries this DNS name
//! models = ["digits", "identity"]   # what it may list and call ("*" = all)
//! max_in_flight = 64                # requests in flight, all its sessions
//! max_queued = 32                   # of those, waiting in model queues
//! max_request_bytes = 16_777_216    # one request's payload
//! max_arena_bytes = 67_108_864      # one shm session's arena
//! requests_per_second = 500.0       # sustained rate ...
//! burst = 50                        # ... and how far above it, at once
//! max_connections = 16              # sessions open at once
//! priority = 2                      # best priority level it may ask
//! weight = 1                        # its share of a busy model's queue
//! queue_burst = 1                   # of its requests waiting at once, how many go at its fair turn
//! cpu_cgroup = "/sys/fs/cgroup/cpu/tw/analytics"  # its requests' agent work runs here
//! ```
//!
//! A tenant named `default` (no tokens, uids, gids or certificate names) holds the rights of
//! every identity no other tenant claims; without one, those get no model.
//! An error names the file and the line of the tenant it is in.

use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The name of the tenant unknown identities get.
///
/// # Examples
///
/// ```
/// use server::tenants::{file::{parse, DEFAULT_TENANT}, Identity, Tenants};
/// let t = Tenants::from_specs(parse("[[tenant]]\nname = \"default\"\nmodels = [\"*\"]\n", "t.toml")?);
/// let who = t.resolve(&Identity::REMOTE, None).map_err(|d| d.1)?;
/// assert_eq!(&*who.name, DEFAULT_TENANT);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const DEFAULT_TENANT: &str = "default";
/// Longest tenant name, in bytes.
const MAX_NAME: usize = 64;
/// The largest `queue_burst` a tenant may have.
///
/// # Examples
///
/// This and the other bounds of a tenant's settings ([`MAX_WEIGHT`],
/// [`MIN_ARENA_BYTES`]), as the file's checks apply them:
///
/// ```
/// use server::tenants::file::{parse, MAX_QUEUE_BURST, MAX_WEIGHT, MIN_ARENA_BYTES};
/// let with = |line: String| parse(&format!("[[tenant]]\nname = \"a\"\n{line}\n"), "t.toml");
/// assert!(with(format!("queue_burst = {MAX_QUEUE_BURST}")).is_ok());
/// assert!(with(format!("queue_burst = {}", MAX_QUEUE_BURST + 1)).is_err());
/// assert!(with(format!("weight = {}", MAX_WEIGHT + 1)).is_err());
/// assert!(with(format!("max_arena_bytes = {}", MIN_ARENA_BYTES - 1)).is_err());
/// ```
pub const MAX_QUEUE_BURST: u32 = 1024;
/// The largest weight a tenant may have. Example: [`MAX_QUEUE_BURST`].
pub const MAX_WEIGHT: u32 = 10_000;
/// The smallest arena a tenant may be limited to (a ring and a tensor).
/// Example: [`MAX_QUEUE_BURST`].
pub const MIN_ARENA_BYTES: u64 = 1 << 20;

/// Why a tenants file was refused: the file, the line (when the fault is
/// in one tenant's table or the TOML itself) and what is wrong.
///
/// # Examples
///
/// ```
/// let text = "[[tenant]]\nname = \"a\"\n\n[[tenant]]\nname = \"a\"\n";
/// let e = server::tenants::file::parse(text, "tenants.toml").unwrap_err();
/// assert_eq!(e.line, Some(4));
/// assert_eq!(e.to_string(), "tenants.toml:4: tenant 'a' is declared twice");
/// ```
#[derive(Debug, Error)]
#[error("{path}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct TenantsError {
    /// The file.
    pub path: String,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// One tenant as the file declares it, checked.
///
/// # Examples
///
/// ```
/// use server::tenants::file::{parse, ModelSet};
/// let specs = parse(
///     "[[tenant]]\nname = \"ops\"\nuids = [1000]\nmodels = [\"*\"]\nweight = 4\n",
///     "tenants.toml",
/// )?;
/// let ops = &specs[0];
/// assert_eq!((ops.name.as_str(), ops.uids.as_slice(), ops.weight), ("ops", &[1000][..], 4));
/// assert_eq!(ops.models, ModelSet::All);
/// assert_eq!(ops.queue_burst, 1); // the default
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct TenantSpec {
    /// Its name (unique; `default` for unknown identities).
    pub name: String,
    /// SHA-256 digests of the bearer tokens that name it.
    pub tokens_sha256: Vec<[u8; 32]>,
    /// Local peers (unix, shm) with these user ids.
    pub uids: Vec<u32>,
    /// Local peers with these primary group ids (when no tenant lists
    /// their uid).
    pub gids: Vec<u32>,
    /// TLS clients whose verified certificate carries one of these subject
    /// alternative DNS names (mutual TLS, `[tls] client_ca`).
    pub cert_names: Vec<String>,
    /// What it may list and call.
    pub models: ModelSet,
    /// Its quotas (`None`: only the agent's own limits).
    pub quotas: Quotas,
    /// Its share of a busy model's queue against other tenants (1..=10 000).
    pub weight: u32,
    /// How many of its requests waiting at once in one model's line still
    /// start at its fair turn, unpaced (1..=1024; see `queue`'s module
    /// doc): a light tenant's burst is not spread out behind a heavy
    /// one's backlog.
    pub queue_burst: u32,
    /// The CPU cgroup its sessions' worker threads run in while serving it
    /// (an absolute path; see [`super::cgroup`]).
    pub cpu_cgroup: Option<PathBuf>,
}

/// The models a tenant may list and call.
///
/// # Examples
///
/// ```
/// use server::tenants::file::ModelSet;
/// let some = ModelSet::Named(["digits".to_string()].into());
/// assert!(some.contains("digits") && !some.contains("resnet"));
/// assert!(ModelSet::All.contains("resnet"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSet {
    /// Every model (`"*"`).
    All,
    /// These, by name.
    Named(HashSet<String>),
}

impl ModelSet {
    /// Whether `name` is in the set. Example: [`ModelSet`].
    pub fn contains(&self, name: &str) -> bool {
        match self {
            ModelSet::All => true,
            ModelSet::Named(s) => s.contains(name),
        }
    }
}

/// How much of the agent a tenant may hold; `None` fields are unlimited
/// (within the agent's own limits).
///
/// # Examples
///
/// ```
/// use server::tenants::file::{parse, Quotas, Rate};
/// let specs = parse(
///     "[[tenant]]\nname = \"a\"\nmax_in_flight = 8\nrequests_per_second = 100.0\nburst = 10\n",
///     "t.toml",
/// )?;
/// assert_eq!(specs[0].quotas, Quotas {
///     max_in_flight: Some(8),
///     rate: Some(Rate { per_second: 100.0, burst: 10 }),
///     ..Quotas::default()
/// });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Quotas {
    /// Requests in flight at once, over all its sessions.
    pub max_in_flight: Option<u32>,
    /// Requests waiting in model queues at once (part of the in-flight).
    pub max_queued: Option<u32>,
    /// One request's payload, in bytes.
    pub max_request_bytes: Option<u64>,
    /// One shared-memory session's arena, in bytes (at least 1 MiB).
    pub max_arena_bytes: Option<u64>,
    /// Sustained requests per second, with `burst` at once above it.
    pub rate: Option<Rate>,
    /// Sessions open at once.
    pub max_connections: Option<u32>,
    /// The highest priority level (1 = highest) its requests may ask; a
    /// request asking higher is served at this level.
    pub priority: Option<u8>,
}

/// A request rate: `per_second` sustained, `burst` requests at once.
/// Example: [`Quotas`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// Requests per second, sustained.
    pub per_second: f64,
    /// Requests that may come at once after a quiet spell.
    pub burst: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    tenant: Vec<toml::Spanned<TenantToml>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantToml {
    name: String,
    #[serde(default)]
    tokens_sha256: Vec<String>,
    #[serde(default)]
    uids: Vec<u32>,
    #[serde(default)]
    gids: Vec<u32>,
    #[serde(default)]
    cert_names: Vec<String>,
    #[serde(default)]
    models: Vec<String>,
    max_in_flight: Option<u32>,
    max_queued: Option<u32>,
    max_request_bytes: Option<u64>,
    max_arena_bytes: Option<u64>,
    requests_per_second: Option<f64>,
    burst: Option<u32>,
    max_connections: Option<u32>,
    priority: Option<u8>,
    weight: Option<u32>,
    queue_burst: Option<u32>,
    cpu_cgroup: Option<PathBuf>,
}

/// Reads and checks the tenants file at `path`.
///
/// # Examples
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("tenants.toml");
/// std::fs::write(&path, "[[tenant]]\nname = \"default\"\nmodels = [\"identity\"]\n")?;
/// let specs = server::tenants::file::read(&path)?;
/// assert!(specs[0].models.contains("identity"));
/// let e = server::tenants::file::read(&dir.path().join("missing.toml")).unwrap_err();
/// assert!(e.message.starts_with("cannot read"), "{e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read(path: &Path) -> Result<Vec<TenantSpec>, TenantsError> {
    let text = std::fs::read_to_string(path).map_err(|e| TenantsError {
        path: path.display().to_string(),
        line: None,
        message: format!("cannot read: {e}"),
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses and checks a tenants file's text (`path` names it in errors).
///
/// # Examples
///
/// ```
/// use server::tenants::file::parse;
/// let specs = parse("[[tenant]]\nname = \"batch\"\ngids = [100]\npriority = 2\n", "t.toml")?;
/// assert_eq!(specs[0].quotas.priority, Some(2));
/// let e = parse("[[tenant]]\nname = \"x\"\ncolour = \"red\"\n", "t.toml").unwrap_err();
/// assert!(e.message.contains("colour"), "{e}"); // unknown keys are refused by name
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn parse(text: &str, path: &str) -> Result<Vec<TenantSpec>, TenantsError> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let file: FileToml = toml::from_str(text).map_err(|e| TenantsError {
        path: path.into(),
        line: e.span().map(|s| line_of(s.start)),
        message: e.message().to_string(),
    })?;
    let mut specs = Vec::with_capacity(file.tenant.len());
    let mut names = HashSet::new();
    let mut tokens: HashMap<[u8; 32], String> = HashMap::new();
    let mut uids: HashMap<u32, String> = HashMap::new();
    let mut gids: HashMap<u32, String> = HashMap::new();
    let mut cert_names: HashMap<String, String> = HashMap::new();
    for t in file.tenant {
        let line = line_of(t.span().start);
        let fail = |message: String| TenantsError {
            path: path.into(),
            line: Some(line),
            message,
        };
        let t = t.into_inner();
        let spec = check(t).map_err(&fail)?;
        let who = format!("tenant '{}'", spec.name);
        if !names.insert(spec.name.clone()) {
            return Err(fail(format!("{who} is declared twice")));
        }
        for d in &spec.tokens_sha256 {
            if let Some(other) = tokens.insert(*d, spec.name.clone()) {
                return Err(fail(format!(
                    "{who}: a token digest is also tenant '{other}''s (a token names one tenant)"
                )));
            }
        }
        for u in &spec.uids {
            if let Some(other) = uids.insert(*u, spec.name.clone()) {
                return Err(fail(format!("{who}: uid {u} is also tenant '{other}''s")));
            }
        }
        for g in &spec.gids {
            if let Some(other) = gids.insert(*g, spec.name.clone()) {
                return Err(fail(format!("{who}: gid {g} is also tenant '{other}''s")));
            }
        }
        for n in &spec.cert_names {
            if let Some(other) = cert_names.insert(n.clone(), spec.name.clone()) {
                return Err(fail(format!(
                    "{who}: certificate name '{n}' is also tenant '{other}''s"
                )));
            }
        }
        specs.push(spec);
    }
    Ok(specs)
}

/// Checks one tenant's table (the message names the tenant).
fn check(t: TenantToml) -> Result<TenantSpec, String> {
    let name = t.name;
    if name.is_empty()
        || name.len() > MAX_NAME
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(format!(
            "tenant name '{name}' must be 1..={MAX_NAME} characters of A-Z a-z 0-9 . _ -"
        ));
    }
    let who = format!("tenant '{name}'");
    if name == DEFAULT_TENANT
        && !(t.tokens_sha256.is_empty()
            && t.uids.is_empty()
            && t.gids.is_empty()
            && t.cert_names.is_empty())
    {
        return Err(format!(
            "{who} holds the rights of identities no other tenant claims: it takes no \
             tokens_sha256, uids, gids or cert_names"
        ));
    }
    if let Some(n) = t.cert_names.iter().find(|n| {
        n.is_empty()
            || n.len() > 253
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-*".contains(&b))
    }) {
        return Err(format!(
            "{who}: cert_names entry '{n}' is not a DNS name (1..=253 characters of A-Z a-z \
             0-9 . -)"
        ));
    }
    let tokens_sha256 = t
        .tokens_sha256
        .iter()
        .map(|h| {
            parse_digest(h).ok_or_else(|| {
                format!(
                    "{who}: tokens_sha256 entry '{h}' is not 64 hex digits (the SHA-256 of a \
                     token: `printf %s TOKEN | sha256sum`)"
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let models = if t.models.iter().any(|m| m == "*") {
        if t.models.len() > 1 {
            return Err(format!("{who}: models lists \"*\" (all) beside names"));
        }
        ModelSet::All
    } else {
        for m in &t.models {
            if m.is_empty() || m.len() > wire::MAX_NAME_LEN {
                return Err(format!(
                    "{who}: model name '{m}' must be 1..={} bytes",
                    wire::MAX_NAME_LEN
                ));
            }
        }
        ModelSet::Named(t.models.into_iter().collect())
    };
    let positive = |what: &str, v: Option<u64>| match v {
        Some(0) => Err(format!("{who}: {what} must be at least 1")),
        _ => Ok(()),
    };
    positive("max_in_flight", t.max_in_flight.map(u64::from))?;
    positive("max_request_bytes", t.max_request_bytes)?;
    positive("max_connections", t.max_connections.map(u64::from))?;
    if let Some(a) = t.max_arena_bytes {
        if a < MIN_ARENA_BYTES {
            return Err(format!(
                "{who}: max_arena_bytes must be at least {MIN_ARENA_BYTES} (1 MiB), not {a}"
            ));
        }
    }
    if let (Some(q), Some(f)) = (t.max_queued, t.max_in_flight) {
        if q > f {
            return Err(format!(
                "{who}: max_queued ({q}) is over max_in_flight ({f}); queued requests are in flight"
            ));
        }
    }
    let rate = match (t.requests_per_second, t.burst) {
        (None, Some(_)) => return Err(format!("{who}: burst needs requests_per_second")),
        (None, None) => None,
        (Some(r), burst) => {
            if !(r.is_finite() && (1e-3..=1e9).contains(&r)) {
                return Err(format!(
                    "{who}: requests_per_second must be 0.001..=1e9 (one per 1000 s at least), \
                     not {r}"
                ));
            }
            let burst = burst.unwrap_or_else(|| (r.ceil() as u32).max(1));
            if !(1..=1_000_000).contains(&burst) {
                return Err(format!("{who}: burst must be 1..=1000000, not {burst}"));
            }
            Some(Rate {
                per_second: r,
                burst,
            })
        }
    };
    if t.priority == Some(0) {
        return Err(format!("{who}: priority levels start at 1 (the highest)"));
    }
    if let Some(c) = t.cpu_cgroup.as_ref().filter(|c| !c.is_absolute()) {
        return Err(format!(
            "{who}: cpu_cgroup '{}' must be an absolute path (a cgroup directory)",
            c.display()
        ));
    }
    let weight = t.weight.unwrap_or(1);
    if weight == 0 || weight > MAX_WEIGHT {
        return Err(format!(
            "{who}: weight must be 1..={MAX_WEIGHT}, not {weight}"
        ));
    }
    let queue_burst = t.queue_burst.unwrap_or(1);
    if queue_burst == 0 || queue_burst > MAX_QUEUE_BURST {
        return Err(format!(
            "{who}: queue_burst must be 1..={MAX_QUEUE_BURST}, not {queue_burst}"
        ));
    }
    Ok(TenantSpec {
        name,
        tokens_sha256,
        uids: t.uids,
        gids: t.gids,
        cert_names: t
            .cert_names
            .iter()
            .map(|n| n.to_ascii_lowercase())
            .collect(),
        models,
        quotas: Quotas {
            max_in_flight: t.max_in_flight,
            max_queued: t.max_queued,
            max_request_bytes: t.max_request_bytes,
            max_arena_bytes: t.max_arena_bytes,
            rate,
            max_connections: t.max_connections,
            priority: t.priority,
        },
        weight,
        queue_burst,
        cpu_cgroup: t.cpu_cgroup,
    })
}

/// 64 hex digits → 32 bytes.
fn parse_digest(h: &str) -> Option<[u8; 32]> {
    let h = h.as_bytes();
    if h.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in h.chunks(2).enumerate() {
        let hex = |c: u8| (c as char).to_digit(16);
        out[i] = (hex(pair[0])? * 16 + hex(pair[1])?) as u8;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn the_documented_shape_parses() {
        let text = format!(
            r#"
[[tenant]]
name = "analytics"
tokens_sha256 = ["{TEST_DIGEST}"]
uids = [1000]
gids = [100]
models = ["digits", "identity"]
max_in_flight = 64
max_queued = 32
max_request_bytes = 16_777_216
max_arena_bytes = 67_108_864
requests_per_second = 500.0
burst = 50
max_connections = 16
priority = 2
weight = 3
queue_burst = 4

[[tenant]]
name = "default"
models = ["*"]
"#
        );
        let t = parse(&text, "t.toml").unwrap();
        assert_eq!(t.len(), 2);
        let a = &t[0];
        assert_eq!(a.name, "analytics");
        // sha256("test")
        assert_eq!(a.tokens_sha256[0][0], 0x9f);
        assert_eq!(a.tokens_sha256[0][31], 0x08);
        assert!(a.models.contains("digits") && !a.models.contains("lenet"));
        assert_eq!(a.quotas.rate.unwrap().burst, 50);
        assert_eq!(a.quotas.priority, Some(2));
        assert_eq!(a.weight, 3);
        assert_eq!(a.queue_burst, 4);
        assert_eq!(t[1].models, ModelSet::All);
        assert_eq!((t[1].weight, t[1].queue_burst), (1, 1));
    }

    #[test]
    fn faults_name_the_file_the_line_and_the_tenant() {
        let bad = |text: &str, want: &str, line: usize| {
            let e = parse(text, "t.toml").unwrap_err();
            assert_eq!(e.line, Some(line), "{e}");
            assert!(
                e.to_string().starts_with(&format!("t.toml:{line}: ")),
                "{e}"
            );
            assert!(e.to_string().contains(want), "{e} lacks {want}");
        };
        let one = "[[tenant]]\nname = \"a\"\n";
        bad(
            &format!("{one}\n[[tenant]]\nname = \"b\"\nweight = 0\n"),
            "weight",
            4,
        );
        bad(&format!("{one}colour = 1\n"), "colour", 3);
        bad(&format!("{one}queue_burst = 0\n"), "queue_burst", 1);
        bad("[[tenant]]\nname = \"a b\"\n", "tenant name", 1);
        bad(
            &format!("{one}\n[[tenant]]\nname = \"a\"\n"),
            "declared twice",
            4,
        );
        bad(
            "[[tenant]]\nname = \"a\"\ntokens_sha256 = [\"abc\"]\n",
            "not 64 hex digits",
            1,
        );
        bad(
            &format!("{one}uids = [7]\n[[tenant]]\nname = \"b\"\nuids = [7]\n"),
            "uid 7 is also tenant 'a'",
            4,
        );
        bad(
            &format!(
                "[[tenant]]\nname = \"a\"\ntokens_sha256 = [\"{TEST_DIGEST}\"]\n\
                 [[tenant]]\nname = \"b\"\ntokens_sha256 = [\"{TEST_DIGEST}\"]\n"
            ),
            "also tenant 'a'",
            4,
        );
        bad(
            "[[tenant]]\nname = \"default\"\nuids = [1]\n",
            "takes no",
            1,
        );
        bad(
            &format!("{one}models = [\"*\", \"x\"]\n"),
            "beside names",
            1,
        );
        bad(&format!("{one}max_in_flight = 0\n"), "max_in_flight", 1);
        bad(
            &format!("{one}max_in_flight = 2\nmax_queued = 3\n"),
            "max_queued",
            1,
        );
        bad(&format!("{one}max_arena_bytes = 4096\n"), "1 MiB", 1);
        bad(
            &format!("{one}requests_per_second = -1.0\n"),
            "requests_per_second",
            1,
        );
        bad(
            &format!("{one}requests_per_second = nan\n"),
            "requests_per_second",
            1,
        );
        bad(&format!("{one}burst = 3\n"), "needs requests_per_second", 1);
        bad(&format!("{one}priority = 0\n"), "priority", 1);
        bad(&format!("{one}cpu_cgroup = \"tw/a\"\n"), "absolute", 1);
        bad(&format!("{one}requests_per_second = 1e-9\n"), "0.001", 1);
        bad(
            &format!("{one}requests_per_second = 1.0\nburst = 0\n"),
            "burst",
            1,
        );
        bad("[[tenant]]\nname = 3\n", "invalid type", 2);
        bad("[tenant\n", "", 1);
    }

    #[test]
    fn an_empty_file_declares_no_tenant() {
        assert!(parse("", "t.toml").unwrap().is_empty());
        assert!(read(Path::new("/nonexistent/t.toml"))
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
    }

    #[test]
    fn digests_are_hex_either_case() {
        let upper = TEST_DIGEST.to_uppercase();
        assert_eq!(parse_digest(&upper), parse_digest(TEST_DIGEST));
        assert!(parse_digest(&TEST_DIGEST[..63]).is_none());
        assert!(parse_digest(&format!("{}g", &TEST_DIGEST[..63])).is_none());
    }
}
