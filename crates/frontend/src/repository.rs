//! [`Repository`]: a Triton-layout model repository served by the agent,
//! with models loaded and unloaded while it runs.
//!
//! The layout is Triton's: `DIR/<model>/<version>/model.onnx`, the version
//! a decimal number, with an optional `DIR/<model>/config.pbtxt`
//! ([`crate::model_config`]: batch size, instances, input/output names,
//! version policy). One version of each model is served: the newest,
//! unless the config's `version_policy` names another.
//!
//! Three control modes, named as Triton names them:
//! - `none`: every model in the directory is loaded at start; load and
//!   unload requests are refused.
//! - `explicit`: the models named at start (`--load-model`, `*` for all)
//!   are loaded; clients load, reload and unload models at run time
//!   (KServe `v2/repository/...` and the gRPC repository RPCs).
//! - `poll`: every model is loaded at start, and a thread rescans the
//!   directory every interval: a new model directory is loaded, a removed
//!   one unloaded, a changed one (model file or config) reloaded. Load
//!   and unload requests are refused, as in Triton.
//!
//! Loading goes through the agent's [`ModelRegistry`](server::ModelRegistry):
//! a reload installs the new model under the same name in one step, so
//! requests never see the name missing; requests already running on the
//! old one finish on it. A reload that fails keeps the old model serving.

use crate::model_config::{
    batch_policy, check_against, check_settings, effective, intra_threads, parse_pbtxt,
    queue_policy, DEFAULT_MODEL_FILENAME,
};
use crate::proto::model_version_policy::PolicyChoice;
use crate::proto::ModelConfig;
use engine::{Backend, OrtBackend, OrtOptions};
use server::dispatch::AgentCore;
use server::NewModel;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use std::{fmt, fs, io};

/// The per-model config file's name.
pub const CONFIG_FILE: &str = "config.pbtxt";

/// How models of the repository are loaded and unloaded (Triton's
/// `--model-control-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlMode {
    /// Everything loaded at start; no changes at run time.
    None,
    /// Loaded and unloaded by request.
    Explicit,
    /// Everything loaded at start and the directory rescanned.
    Poll,
}

impl std::str::FromStr for ControlMode {
    type Err = String;

    fn from_str(s: &str) -> Result<ControlMode, String> {
        match s {
            "none" => Ok(ControlMode::None),
            "explicit" => Ok(ControlMode::Explicit),
            "poll" => Ok(ControlMode::Poll),
            other => Err(format!(
                "model control mode '{other}' is not one of none, explicit, poll"
            )),
        }
    }
}

impl fmt::Display for ControlMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ControlMode::None => "none",
            ControlMode::Explicit => "explicit",
            ControlMode::Poll => "poll",
        })
    }
}

/// How to open a repository.
#[derive(Debug, Clone)]
pub struct RepositoryOptions {
    /// The repository directory.
    pub root: PathBuf,
    /// The control mode.
    pub mode: ControlMode,
    /// How often `poll` mode rescans the directory.
    pub poll_interval: Duration,
    /// `explicit` mode: the models to load at start (`*`: all).
    pub load_at_start: Vec<String>,
    /// ONNX Runtime intra-op threads per run (0: ONNX Runtime decides).
    pub intra_threads: usize,
    /// Whether the intra-op threads spin after a run before they sleep
    /// (`engine::OrtOptions::intra_spinning`).
    pub intra_spinning: bool,
    /// ONNX Runtime inter-op threads per run.
    pub inter_threads: usize,
}

/// Why a repository operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RepositoryError {
    /// The directory cannot be read.
    #[error("model repository {path}: {source}")]
    Io {
        /// What could not be read.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The request is not allowed (control mode, reserved name, ...).
    #[error("{0}")]
    Refused(String),
    /// No such model in the repository.
    #[error("model '{name}' is not in the model repository {root} (no directory {root}/{name})")]
    NotFound {
        /// The model asked for.
        name: String,
        /// The repository.
        root: PathBuf,
    },
    /// The model is there but could not be loaded.
    #[error("failed to load model '{name}': {reason}")]
    Load {
        /// The model.
        name: String,
        /// Why.
        reason: String,
    },
}

/// A model's state, as the repository index reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    /// Served.
    Ready,
    /// Not served (unloaded, removed, or failed to load; see the reason).
    Unavailable,
    /// Being loaded.
    Loading,
}

impl ModelState {
    /// Triton's name for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Ready => "READY",
            ModelState::Unavailable => "UNAVAILABLE",
            ModelState::Loading => "LOADING",
        }
    }
}

/// One model of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// The model's name.
    pub name: String,
    /// The served version, if any.
    pub version: Option<u64>,
    /// Its state; `None` when it was never loaded.
    pub state: Option<ModelState>,
    /// Why it is in that state.
    pub reason: String,
}

/// What the repository knows of one model it has loaded or tried to.
#[derive(Debug)]
struct Slot {
    state: ModelState,
    version: Option<u64>,
    reason: String,
    /// The effective config of the served model.
    config: Option<ModelConfig>,
    /// The files it was loaded from (poll mode reloads when they change).
    stamp: Stamp,
    /// Whether it should be served (counts toward server readiness).
    wanted: bool,
}

/// Sizes and modification times of a model directory's files.
type Stamp = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// A model repository; see the module documentation.
pub struct Repository {
    opts: RepositoryOptions,
    core: Arc<AgentCore>,
    slots: Mutex<BTreeMap<String, Slot>>,
    /// One load at a time (loads are slow; two of one model must not race).
    loading: Mutex<()>,
    /// Poll mode: directories refused without a slot (a name a `--model`
    /// model has), so each is reported once rather than every pass.
    refused: Mutex<std::collections::BTreeSet<String>>,
}

impl fmt::Debug for Repository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Repository")
            .field("root", &self.opts.root)
            .field("mode", &self.opts.mode)
            .finish()
    }
}

impl Repository {
    /// Opens the repository and loads the models the mode says to load at
    /// start; fails (naming the model and why) if any cannot be loaded, so
    /// an agent never starts without a model it was told to serve.
    pub fn open(
        opts: RepositoryOptions,
        core: Arc<AgentCore>,
    ) -> Result<Arc<Repository>, RepositoryError> {
        if !opts.load_at_start.is_empty() && opts.mode != ControlMode::Explicit {
            return Err(RepositoryError::Refused(format!(
                "--load-model applies to --model-control-mode explicit; mode '{}' loads every \
                 model of the repository",
                opts.mode
            )));
        }
        if opts.mode == ControlMode::Poll && opts.poll_interval.is_zero() {
            return Err(RepositoryError::Refused(
                "the repository poll interval must be at least 1 second".into(),
            ));
        }
        let repo = Arc::new(Repository {
            opts,
            core,
            slots: Mutex::new(BTreeMap::new()),
            loading: Mutex::new(()),
            refused: Mutex::new(std::collections::BTreeSet::new()),
        });
        let names = repo.scan()?;
        let at_start: Vec<String> = match repo.opts.mode {
            ControlMode::None | ControlMode::Poll => names,
            ControlMode::Explicit if repo.opts.load_at_start.iter().any(|n| n == "*") => names,
            ControlMode::Explicit => repo.opts.load_at_start.clone(),
        };
        for name in at_start {
            repo.load_model(&name)?;
        }
        Ok(repo)
    }

    /// The control mode.
    pub fn mode(&self) -> ControlMode {
        self.opts.mode
    }

    /// The repository directory.
    pub fn root(&self) -> &Path {
        &self.opts.root
    }

    /// Every model directory of the repository, and every model it served
    /// that is gone from it, with states.
    pub fn index(&self) -> Result<Vec<IndexEntry>, RepositoryError> {
        let names = self.scan()?;
        let slots = self.slots();
        let mut out: BTreeMap<String, IndexEntry> = names
            .into_iter()
            .map(|name| {
                let e = IndexEntry {
                    name: name.clone(),
                    version: None,
                    state: None,
                    reason: String::new(),
                };
                (name, e)
            })
            .collect();
        for (name, s) in slots.iter() {
            out.insert(
                name.clone(),
                IndexEntry {
                    name: name.clone(),
                    version: s.version,
                    state: Some(s.state),
                    reason: s.reason.clone(),
                },
            );
        }
        Ok(out.into_values().collect())
    }

    /// Whether every model the repository should serve is served (the
    /// server is not ready otherwise).
    pub fn all_ready(&self) -> bool {
        self.slots()
            .values()
            .all(|s| !s.wanted || s.state == ModelState::Ready)
    }

    /// The configuration of `name` as served, if the repository loaded it.
    pub fn config(&self, name: &str) -> Option<ModelConfig> {
        self.slots().get(name).and_then(|s| s.config.clone())
    }

    /// Loads `name`, or reloads it if served (explicit mode only).
    pub fn load(&self, name: &str) -> Result<(), RepositoryError> {
        self.check_explicit("load")?;
        self.load_model(name)
    }

    /// Stops serving `name` (explicit mode only).
    pub fn unload(&self, name: &str) -> Result<(), RepositoryError> {
        self.check_explicit("unload")?;
        check_name(name)?;
        let _l = lock(&self.loading);
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return Err(if self.core.registry.find(name).is_some() {
                RepositoryError::Refused(format!(
                    "model '{name}' was not loaded from the model repository (it was given \
                     with --model) and cannot be unloaded"
                ))
            } else {
                RepositoryError::NotFound {
                    name: name.to_string(),
                    root: self.opts.root.clone(),
                }
            });
        };
        let old = self.core.registry.remove(name);
        slot.state = ModelState::Unavailable;
        slot.reason = "unloaded".into();
        slot.version = None;
        slot.config = None;
        slot.wanted = false;
        drop(slots);
        drop(_l);
        // The engine sessions are freed here (or by the last request still
        // running on the model), not under the repository's locks.
        drop(old);
        eprintln!("tensorwire agent: model {name} unloaded");
        Ok(())
    }

    /// One pass of `poll` mode: loads new model directories, unloads
    /// removed ones, reloads changed ones. Errors are recorded in the
    /// index (and logged), never fatal.
    pub fn poll_once(&self) {
        let names = match self.scan() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("tensorwire agent: model repository poll: {e}");
                return;
            }
        };
        let known: Vec<(String, Stamp, bool)> = self
            .slots()
            .iter()
            .map(|(n, s)| (n.clone(), s.stamp.clone(), s.wanted))
            .collect();
        for (name, stamp, wanted) in &known {
            if !names.contains(name) && *wanted {
                let _l = lock(&self.loading);
                self.core.registry.remove(name);
                if let Some(s) = self.slots().get_mut(name) {
                    s.state = ModelState::Unavailable;
                    s.reason = "removed from the model repository".into();
                    s.version = None;
                    s.wanted = false;
                }
                eprintln!("tensorwire agent: model {name} removed from the repository: unloaded");
            } else if names.contains(name)
                && (!*wanted || stamp_of(&self.opts.root.join(name)) != *stamp)
            {
                if let Err(e) = self.load_model(name) {
                    eprintln!("tensorwire agent: model repository poll: {e}");
                }
            }
        }
        for name in names {
            if !known.iter().any(|(n, _, _)| *n == name) && !lock(&self.refused).contains(&name) {
                if let Err(e) = self.load_model(&name) {
                    eprintln!("tensorwire agent: model repository poll: {e}");
                    if matches!(e, RepositoryError::Refused(_)) {
                        lock(&self.refused).insert(name);
                    }
                }
            }
        }
    }

    /// In `poll` mode, starts the thread that calls [`poll_once`](Self::poll_once)
    /// every interval until the returned [`Poller`] is dropped.
    pub fn start_polling(self: &Arc<Self>) -> Option<Poller> {
        if self.opts.mode != ControlMode::Poll {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (repo, flag) = (self.clone(), stop.clone());
        let every = self.opts.poll_interval;
        let thread = std::thread::Builder::new()
            .name("tw-repository-poll".into())
            .spawn(move || loop {
                std::thread::park_timeout(every);
                if flag.load(Ordering::Acquire) {
                    return;
                }
                let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    repo.poll_once();
                }));
                if pass.is_err() {
                    eprintln!(
                        "tensorwire agent: model repository poll: a pass panicked; polling goes on"
                    );
                }
            });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                eprintln!("tensorwire agent: cannot start the model repository poll thread: {e}");
                return None;
            }
        };
        Some(Poller {
            stop,
            thread: Some(thread),
        })
    }

    fn check_explicit(&self, what: &str) -> Result<(), RepositoryError> {
        if self.opts.mode == ControlMode::Explicit {
            Ok(())
        } else {
            Err(RepositoryError::Refused(format!(
                "cannot {what} models: the model control mode is '{}' (start the agent with \
                 --model-control-mode explicit to load and unload models by request)",
                self.opts.mode
            )))
        }
    }

    fn slots(&self) -> MutexGuard<'_, BTreeMap<String, Slot>> {
        lock(&self.slots)
    }

    /// The names of the model directories.
    fn scan(&self) -> Result<Vec<String>, RepositoryError> {
        let root = &self.opts.root;
        let io_err = |source| RepositoryError::Io {
            path: root.clone(),
            source,
        };
        let mut names = Vec::new();
        for entry in fs::read_dir(root).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if entry.path().is_dir() && check_name(&name).is_ok() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Loads (or reloads) `name` from its directory and records the
    /// outcome in its slot.
    fn load_model(&self, name: &str) -> Result<(), RepositoryError> {
        check_name(name)?;
        let _l = lock(&self.loading);
        let from_here = self.slots().contains_key(name);
        if !from_here && self.core.registry.find(name).is_some() {
            return Err(RepositoryError::Refused(format!(
                "model '{name}' is already served (given with --model); the repository's model \
                 of that name is not loaded"
            )));
        }
        let dir = self.opts.root.join(name);
        if !dir.is_dir() {
            return Err(RepositoryError::NotFound {
                name: name.to_string(),
                root: self.opts.root.clone(),
            });
        }
        let stamp = stamp_of(&dir);
        let was_serving = self
            .slots()
            .get(name)
            .is_some_and(|s| s.state == ModelState::Ready);
        {
            let mut slots = self.slots();
            let s = slots.entry(name.to_string()).or_insert_with(|| Slot {
                state: ModelState::Loading,
                version: None,
                reason: String::new(),
                config: None,
                stamp: Vec::new(),
                // An explicit load counts toward readiness once it has
                // succeeded (a client's load must not take the server out
                // of rotation while it runs); the other modes' models
                // should be there from the start.
                wanted: self.opts.mode != ControlMode::Explicit,
            });
            if !was_serving {
                s.state = ModelState::Loading;
            }
            if self.opts.mode != ControlMode::Explicit {
                s.wanted = true;
            }
        }
        let outcome = self.try_load(name, &dir);
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            // Slots are never removed, and this one was made above.
            return outcome.map(|_| ());
        };
        slot.stamp = stamp;
        match outcome {
            Ok((version, config)) => {
                slot.wanted = true;
                slot.state = ModelState::Ready;
                slot.version = Some(version);
                slot.reason = String::new();
                slot.config = Some(config);
                eprintln!(
                    "tensorwire agent: model {name} version {version} loaded from the repository"
                );
                Ok(())
            }
            Err(e) => {
                if was_serving {
                    // The old model keeps serving.
                    slot.reason = format!("reload failed, previous version still served: {e}");
                } else {
                    slot.state = ModelState::Unavailable;
                    slot.reason = e.to_string();
                    slot.version = None;
                    slot.config = None;
                    // A failed explicit load leaves the server ready (the
                    // caller got the error); in the other modes the model
                    // should be there, and the server is not ready.
                    slot.wanted = self.opts.mode != ControlMode::Explicit;
                }
                eprintln!("tensorwire agent: {e}");
                Err(e)
            }
        }
    }

    /// Reads the config, picks the version, loads the ONNX model, checks
    /// the config against it and installs it. Returns the version and the
    /// effective config.
    fn try_load(&self, name: &str, dir: &Path) -> Result<(u64, ModelConfig), RepositoryError> {
        let load_err = |reason: String| RepositoryError::Load {
            name: name.to_string(),
            reason,
        };
        let config_path = dir.join(CONFIG_FILE);
        let config = match fs::read_to_string(&config_path) {
            Ok(text) => parse_pbtxt(&text)
                .map_err(|e| load_err(format!("{}: {e}", config_path.display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => ModelConfig::default(),
            Err(e) => return Err(load_err(format!("{}: {e}", config_path.display()))),
        };
        let instances = check_settings(&config, name).map_err(load_err)?;
        let policy = queue_policy(&config).map_err(load_err)?;
        let batching = batch_policy(&config).map_err(load_err)?;
        let own_threads = intra_threads(&config).map_err(load_err)?;
        let (version, file) = pick_version(dir, &config).map_err(load_err)?;
        let opts = OrtOptions {
            intra_threads: own_threads.unwrap_or(self.opts.intra_threads),
            intra_spinning: self.opts.intra_spinning,
            inter_threads: self.opts.inter_threads,
            sessions: instances,
        };
        let backend = OrtBackend::load(name, &file, &opts).map_err(|e| load_err(e.to_string()))?;
        check_against(&config, backend.signature()).map_err(load_err)?;
        let effective = effective(config, backend.signature(), instances);
        self.core.registry.install(NewModel {
            backend: Arc::new(backend),
            concurrency: instances,
            version,
            outputs_in_place: true,
            policy,
            batching,
        });
        Ok((version, effective))
    }
}

/// The `poll` mode thread; stops it (and waits for a pass in progress)
/// when dropped.
#[derive(Debug)]
pub struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A model directory's name: what the wire can carry, no path tricks,
/// not the built-in `identity`.
fn check_name(name: &str) -> Result<(), RepositoryError> {
    let ok = !name.is_empty()
        && name.len() <= wire::MAX_NAME_LEN
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0']);
    if !ok {
        return Err(RepositoryError::Refused(format!(
            "'{name}' is not a model name (1..={} bytes, no '/', not starting with '.')",
            wire::MAX_NAME_LEN
        )));
    }
    if name == engine::IdentityBackend::NAME {
        return Err(RepositoryError::Refused(
            "'identity' is the agent's built-in model; a repository model cannot take its name"
                .into(),
        ));
    }
    Ok(())
}

/// The version to serve and its model file, as the config's version
/// policy selects (default: the newest). tensorwire serves one version of
/// a model: a policy selecting several is refused.
fn pick_version(dir: &Path, c: &ModelConfig) -> Result<(u64, PathBuf), String> {
    let file_name = if c.default_model_filename.is_empty() {
        DEFAULT_MODEL_FILENAME
    } else {
        c.default_model_filename.as_str()
    };
    if file_name.contains(['/', '\\']) || file_name.starts_with('.') {
        return Err(format!(
            "default_model_filename '{file_name}' must be a plain file name"
        ));
    }
    let mut versions: Vec<u64> = fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()))
        .filter(|v| dir.join(v.to_string()).join(file_name).is_file())
        .collect();
    versions.sort_unstable();
    let newest = versions.last().copied();
    let one = |v: u64| (v, dir.join(v.to_string()).join(file_name));
    let several = |which: &str, vs: &[u64]| {
        format!(
            "version_policy {which} selects {} versions ({vs:?}); tensorwire serves one version \
             of a model",
            vs.len()
        )
    };
    let chosen = match c
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
    {
        None => newest,
        Some(PolicyChoice::Latest(l)) => {
            let n = l.num_versions.max(1) as usize;
            if n > 1 && versions.len() > 1 {
                let vs = &versions[versions.len().saturating_sub(n)..];
                return Err(several("latest", vs));
            }
            newest
        }
        Some(PolicyChoice::All(_)) => {
            if versions.len() > 1 {
                return Err(several("all", &versions));
            }
            newest
        }
        Some(PolicyChoice::Specific(s)) => match s.versions.as_slice() {
            [v] => {
                let v = u64::try_from(*v).map_err(|_| format!("version {v} is negative"))?;
                if !versions.contains(&v) {
                    return Err(format!(
                        "version_policy specific selects version {v}, but {} has no \
                         {v}/{file_name}",
                        dir.display()
                    ));
                }
                Some(v)
            }
            vs => {
                let vs: Vec<u64> = vs.iter().filter_map(|v| u64::try_from(*v).ok()).collect();
                return Err(several("specific", &vs));
            }
        },
    };
    chosen.map(one).ok_or_else(|| {
        format!(
            "no version directory with a {file_name} under {} (expected {}/<version>/{file_name})",
            dir.display(),
            dir.display()
        )
    })
}

/// The files a model was loaded from: its config and every file of its
/// version directories, with sizes and modification times.
fn stamp_of(dir: &Path) -> Stamp {
    let mut out = Vec::new();
    let mut add = |p: PathBuf| {
        if let Ok(m) = fs::metadata(&p) {
            if m.is_file() {
                out.push((p, m.len(), m.modified().ok()));
            }
        }
    };
    add(dir.join(CONFIG_FILE));
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                if let Ok(files) = fs::read_dir(&p) {
                    for f in files.filter_map(Result::ok) {
                        add(f.path());
                    }
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::model_version_policy::{Latest, Specific};
    use crate::proto::ModelVersionPolicy;

    fn touch(p: &Path) {
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, b"x").expect("write");
    }

    #[test]
    fn versions_follow_the_policy() {
        let d = tempfile::tempdir().expect("tmp");
        let dir = d.path();
        touch(&dir.join("1/model.onnx"));
        touch(&dir.join("3/model.onnx"));
        fs::create_dir_all(dir.join("7")).expect("empty version dir");
        fs::create_dir_all(dir.join("notes")).expect("non-numeric dir");
        let c = ModelConfig::default();
        assert_eq!(pick_version(dir, &c).expect("newest").0, 3);
        let policy = |p| ModelConfig {
            version_policy: Some(ModelVersionPolicy {
                policy_choice: Some(p),
            }),
            ..ModelConfig::default()
        };
        let specific = policy(PolicyChoice::Specific(Specific { versions: vec![1] }));
        assert_eq!(pick_version(dir, &specific).expect("v1").0, 1);
        let missing = policy(PolicyChoice::Specific(Specific { versions: vec![7] }));
        assert!(pick_version(dir, &missing)
            .expect_err("7 has no file")
            .contains("7"));
        let two = policy(PolicyChoice::Latest(Latest { num_versions: 2 }));
        assert!(pick_version(dir, &two)
            .expect_err("two versions")
            .contains("one version"));
        let none = tempfile::tempdir().expect("tmp");
        assert!(pick_version(none.path(), &c)
            .expect_err("no version")
            .contains("no version directory"));
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", ".hidden", "a/b", "identity", &"x".repeat(300)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("digits-v2_1.0").is_ok());
        assert_eq!("poll".parse::<ControlMode>(), Ok(ControlMode::Poll));
        assert!("sometimes".parse::<ControlMode>().is_err());
    }

    #[test]
    fn stamps_change_with_the_files() {
        let d = tempfile::tempdir().expect("tmp");
        touch(&d.path().join("1/model.onnx"));
        let a = stamp_of(d.path());
        assert_eq!(a.len(), 1);
        fs::write(d.path().join("1/model.onnx"), b"longer").expect("write");
        assert_ne!(stamp_of(d.path()), a);
        touch(&d.path().join(CONFIG_FILE));
        assert_eq!(stamp_of(d.path()).len(), 2);
    }
}
