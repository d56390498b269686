//! [`ModelRegistry`]: every model the agent serves, by id and name, and
//! models loaded and unloaded while it runs.
//!
//! Ids are assigned in order and never reused; id 0 is always the built-in
//! `identity` model. Clients resolve names to ids once per session; a model
//! that is unloaded, or reloaded (which gives it a new id), answers its old
//! id with `UnknownModel`, so a client never reaches a different model
//! through an id it resolved earlier.
//!
//! Readers (every request looks its model up) take no lock: the table is
//! an immutable snapshot behind an [`ArcSwap`], and a change (load, unload)
//! publishes a new snapshot. A request holds its [`ModelEntry`] by `Arc`,
//! so a model unloaded while requests run on it finishes them and is
//! dropped (its engine sessions freed) when the last one answers.

use crate::batcher::{BatchPolicy, Batcher};
use crate::config::{AgentConfig, ModelConfig};
use crate::queue::{ModelQueue, QueuePolicy};
use crate::stats::ModelStats;
use arc_swap::ArcSwap;
use engine::{Backend, EngineError, IdentityBackend, OrtBackend, OrtOptions};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wire::ModelSignature;

/// One served model.
///
/// # Examples
///
/// ```
/// use server::{AgentConfig, ModelConfig, ModelRegistry};
/// let cfg = AgentConfig { models: vec![ModelConfig::new("digits", concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"))], ..AgentConfig::default() };
/// let registry = ModelRegistry::load(&cfg)?;
/// let digits = registry.find("digits").ok_or("not loaded")?;
/// assert_eq!((digits.version, digits.outputs_in_place), (1, true));
/// assert_eq!(digits.stats.snapshot().success.count, 0); // nothing served yet
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ModelEntry {
    /// The model's id on the wire.
    pub id: u32,
    /// The model's version (1 unless a model repository says otherwise).
    pub version: u64,
    /// The loaded model.
    pub backend: Arc<dyn Backend>,
    /// Its queue.
    pub queue: ModelQueue,
    /// How it forms batches of waiting requests.
    pub batcher: Batcher,
    /// Whether the backend writes outputs straight into buffers the agent
    /// provides ([`Backend::run_into`] overridden to do so: ONNX Runtime).
    /// Shared-memory sessions then place outputs in the arena before the
    /// run; otherwise they call [`Backend::run`], point outputs that alias
    /// inputs at those inputs (identity: nothing moves) and copy owned
    /// outputs into the arena once (counted).
    pub outputs_in_place: bool,
    /// Its request statistics (every transport and front door).
    pub stats: ModelStats,
}

impl ModelEntry {
    /// The model's signature (name, inputs, outputs).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelRegistry;
    /// let registry = ModelRegistry::with_identity();
    /// let entry = registry.get(0).ok_or("identity is id 0")?;
    /// assert_eq!(entry.signature().name, "identity");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn signature(&self) -> &ModelSignature {
        self.backend.signature()
    }
}

impl std::fmt::Debug for ModelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelEntry({}, {})", self.id, self.signature().name)
    }
}

/// A model to add: its backend, how many runs may execute at once, its
/// version, and whether its backend writes outputs in place.
///
/// # Examples
///
/// ```
/// use engine::IdentityBackend;
/// use server::{BatchPolicy, ModelRegistry, NewModel, QueuePolicy};
/// use std::sync::Arc;
/// let registry = ModelRegistry::with_identity();
/// let id = registry.install(NewModel {
///     backend: Arc::new(IdentityBackend::named("echo")),
///     concurrency: 2,
///     version: 3,
///     outputs_in_place: false,
///     policy: QueuePolicy { max_queue: 100, ..QueuePolicy::default() },
///     batching: BatchPolicy::default(),
/// });
/// assert_eq!(registry.get(id).map(|m| m.version), Some(3));
/// ```
#[derive(Clone)]
pub struct NewModel {
    /// The loaded backend.
    pub backend: Arc<dyn Backend>,
    /// Runs of it that may execute at once (its queue's width).
    pub concurrency: usize,
    /// Its version.
    pub version: u64,
    /// See [`ModelEntry::outputs_in_place`].
    pub outputs_in_place: bool,
    /// How its queue orders and bounds waiting requests.
    pub policy: QueuePolicy,
    /// How it batches waiting requests (checked against its inputs when
    /// installed: [`batch_policy_for`]).
    pub batching: BatchPolicy,
}

/// One published state of the registry.
#[derive(Default)]
struct Table {
    /// Indexed by id; `None` for an id whose model was unloaded.
    by_id: Vec<Option<Arc<ModelEntry>>>,
    by_name: HashMap<String, u32>,
}

/// All served models; see the module documentation.
///
/// # Examples
///
/// ```
/// use engine::IdentityBackend;
/// use server::ModelRegistry;
/// use std::sync::Arc;
/// let mut registry = ModelRegistry::with_identity();
/// let echo = registry.add(Arc::new(IdentityBackend::named("echo")), 1);
/// assert_eq!(registry.find("echo").map(|m| m.id), Some(echo));
/// // Unloaded: its id is never reused, so old clients cannot reach another model.
/// registry.remove("echo");
/// assert!(registry.get(echo).is_none());
/// ```
pub struct ModelRegistry {
    table: ArcSwap<Table>,
    /// Serialises writers (each copies the table, changes it, publishes).
    write: Mutex<()>,
}

impl Default for ModelRegistry {
    fn default() -> ModelRegistry {
        ModelRegistry {
            table: ArcSwap::from_pointee(Table::default()),
            write: Mutex::new(()),
        }
    }
}

impl std::fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.models()).finish()
    }
}

impl ModelRegistry {
    /// A registry holding only `identity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelRegistry;
    /// let r = ModelRegistry::with_identity();
    /// assert_eq!(r.names(), ["identity"]);
    /// assert_eq!(r.find("identity").map(|m| m.id), Some(0));
    /// ```
    pub fn with_identity() -> ModelRegistry {
        let mut r = ModelRegistry::default();
        r.add(Arc::new(IdentityBackend::new()), usize::MAX >> 1);
        r
    }

    /// Loads every model of `cfg` (plus `identity`). Fails on the first model
    /// that cannot be loaded, naming it.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::{AgentConfig, ModelConfig, ModelRegistry};
    /// let mut cfg = AgentConfig::default();
    /// cfg.models.push(ModelConfig::new("digits", concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx")));
    /// let registry = ModelRegistry::load(&cfg)?;
    /// assert_eq!(registry.names(), ["identity", "digits"]);
    /// cfg.models.push(ModelConfig::new("lost", "no/such.onnx"));
    /// assert!(ModelRegistry::load(&cfg).is_err()); // all or nothing
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    pub fn load(cfg: &AgentConfig) -> Result<ModelRegistry, EngineError> {
        let r = ModelRegistry::with_identity();
        for m in &cfg.models {
            let backend = load_onnx(m, cfg)?;
            r.install(NewModel {
                backend,
                concurrency: m.concurrency,
                version: 1,
                outputs_in_place: true,
                policy: m.queue_policy(),
                batching: m.batch_policy(),
            });
        }
        Ok(r)
    }

    /// Adds a loaded backend (tests and embedders use this for custom
    /// backends); returns its id. Its outputs are taken from
    /// [`Backend::run`] (see [`ModelEntry::outputs_in_place`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::IdentityBackend;
    /// use server::ModelRegistry;
    /// use std::sync::Arc;
    /// let mut r = ModelRegistry::with_identity();
    /// let id = r.add(Arc::new(IdentityBackend::named("echo")), 1);
    /// assert_eq!(id, 1); // ids in order; identity is 0
    /// assert!(!r.get(id).is_some_and(|m| m.outputs_in_place));
    /// ```
    pub fn add(&mut self, backend: Arc<dyn Backend>, concurrency: usize) -> u32 {
        self.install(NewModel {
            backend,
            concurrency,
            version: 1,
            outputs_in_place: false,
            policy: QueuePolicy::default(),
            batching: BatchPolicy::default(),
        })
    }

    /// Adds a backend whose [`Backend::run_into`] writes outputs straight
    /// into the buffers it is given (as [`OrtBackend`]'s does); returns its id.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::{OrtBackend, OrtOptions};
    /// use server::ModelRegistry;
    /// use std::sync::Arc;
    /// let digits = OrtBackend::load("digits", concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx").as_ref(), &OrtOptions::default())?;
    /// let mut r = ModelRegistry::with_identity();
    /// let id = r.add_in_place(Arc::new(digits), 1); // its run_into writes in place
    /// assert!(r.get(id).is_some_and(|m| m.outputs_in_place));
    /// # Ok::<(), engine::EngineError>(())
    /// ```
    pub fn add_in_place(&mut self, backend: Arc<dyn Backend>, concurrency: usize) -> u32 {
        self.install(NewModel {
            backend,
            concurrency,
            version: 1,
            outputs_in_place: true,
            policy: QueuePolicy::default(),
            batching: BatchPolicy::default(),
        })
    }

    /// Serves `m` under its signature's name while the agent runs, with a
    /// new id; a model already served under that name is replaced in the
    /// same step (requests already running on it finish on it). Returns
    /// the new id.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::IdentityBackend;
    /// use server::{BatchPolicy, ModelRegistry, NewModel, QueuePolicy};
    /// use std::sync::Arc;
    /// let r = ModelRegistry::with_identity();
    /// let model = |version| NewModel {
    ///     backend: Arc::new(IdentityBackend::named("echo")),
    ///     concurrency: 1,
    ///     version,
    ///     outputs_in_place: false,
    ///     policy: QueuePolicy::default(),
    ///     batching: BatchPolicy::default(),
    /// };
    /// let v1 = r.install(model(1));
    /// // A reload under the same name replaces it with a new id.
    /// let v2 = r.install(model(2));
    /// assert_ne!(v1, v2);
    /// assert!(r.get(v1).is_none());
    /// assert_eq!(r.find("echo").map(|m| m.version), Some(2));
    /// ```
    pub fn install(&self, m: NewModel) -> u32 {
        self.update(|t| {
            let id = t.by_id.len() as u32;
            let name = m.backend.signature().name.clone();
            if let Some(old) = t.by_name.insert(name, id) {
                t.by_id[old as usize] = None;
            }
            t.by_id.push(Some(Arc::new(ModelEntry {
                id,
                version: m.version,
                queue: ModelQueue::with_policy(m.concurrency, m.policy),
                batcher: Batcher::new(batch_policy_for(m.backend.signature(), m.batching)),
                backend: m.backend,
                outputs_in_place: m.outputs_in_place,
                stats: ModelStats::default(),
            })));
            id
        })
    }

    /// Stops serving the model named `name`; returns it, or `None` when no
    /// model has that name. Requests already running on it finish.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelRegistry;
    /// let r = ModelRegistry::with_identity();
    /// let gone = r.remove("identity").ok_or("it was served")?;
    /// assert_eq!(gone.id, 0);
    /// assert!(r.remove("identity").is_none());
    /// assert!(r.names().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove(&self, name: &str) -> Option<Arc<ModelEntry>> {
        self.update(|t| {
            let id = t.by_name.remove(name)?;
            t.by_id.get_mut(id as usize).and_then(Option::take)
        })
    }

    /// Copies the table, applies `change` and publishes the result.
    fn update<R>(&self, change: impl FnOnce(&mut Table) -> R) -> R {
        let _w = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let cur = self.table.load();
        let mut next = Table {
            by_id: cur.by_id.clone(),
            by_name: cur.by_name.clone(),
        };
        let r = change(&mut next);
        self.table.store(Arc::new(next));
        r
    }

    /// The model with this id.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelRegistry;
    /// let r = ModelRegistry::with_identity();
    /// assert!(r.get(0).is_some());
    /// assert!(r.get(1).is_none());
    /// ```
    pub fn get(&self, id: u32) -> Option<Arc<ModelEntry>> {
        self.table.load().by_id.get(id as usize)?.clone()
    }

    /// The model with this name.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelRegistry;
    /// let r = ModelRegistry::with_identity();
    /// assert_eq!(r.find("identity").map(|m| m.id), Some(0));
    /// assert!(r.find("digits").is_none());
    /// ```
    pub fn find(&self, name: &str) -> Option<Arc<ModelEntry>> {
        let t = self.table.load();
        let id = *t.by_name.get(name)?;
        t.by_id.get(id as usize)?.clone()
    }

    /// Every model served now, in id order.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::ModelRegistry;
    /// let r = ModelRegistry::with_identity();
    /// let ids: Vec<u32> = r.models().iter().map(|m| m.id).collect();
    /// assert_eq!(ids, [0]);
    /// ```
    pub fn models(&self) -> Vec<Arc<ModelEntry>> {
        self.table.load().by_id.iter().flatten().cloned().collect()
    }

    /// The names of every model served now, in id order.
    ///
    /// # Examples
    ///
    /// ```
    /// use engine::IdentityBackend;
    /// use server::ModelRegistry;
    /// use std::sync::Arc;
    /// let mut r = ModelRegistry::with_identity();
    /// r.add(Arc::new(IdentityBackend::named("b")), 1);
    /// r.add(Arc::new(IdentityBackend::named("a")), 1);
    /// assert_eq!(r.names(), ["identity", "b", "a"]); // id order
    /// ```
    pub fn names(&self) -> Vec<String> {
        self.models()
            .iter()
            .map(|m| m.signature().name.clone())
            .collect()
    }
}

/// The ONNX Runtime settings an agent with `cfg` loads model `m` with
/// (also what a caller that runs the engine without an agent uses to run
/// it the same way: the classifier's `local` baseline).
///
/// # Examples
///
/// ```
/// use server::registry::ort_options;
/// use server::{AgentConfig, ModelConfig};
/// let cfg = AgentConfig { intra_threads: 1, ..AgentConfig::default() };
/// let m = ModelConfig { concurrency: 3, ..ModelConfig::new("digits", "digits.onnx") };
/// let opts = ort_options(&m, &cfg);
/// assert_eq!((opts.intra_threads, opts.sessions), (1, 3));
/// // A model's own settings win over the agent's.
/// let m = ModelConfig { intra_threads: Some(4), intra_spinning: Some(!cfg.intra_spinning), ..m };
/// let opts = ort_options(&m, &cfg);
/// assert_eq!((opts.intra_threads, opts.intra_spinning), (4, !cfg.intra_spinning));
/// ```
pub fn ort_options(m: &ModelConfig, cfg: &AgentConfig) -> OrtOptions {
    OrtOptions {
        intra_threads: m.intra_threads.unwrap_or(cfg.intra_threads),
        intra_spinning: m.intra_spinning.unwrap_or(cfg.intra_spinning),
        inter_threads: cfg.inter_threads,
        sessions: m.concurrency,
    }
}

/// Loads the ONNX model `m` with `cfg`'s ONNX Runtime settings
/// ([`ort_options`]).
///
/// # Examples
///
/// ```
/// use server::registry::load_onnx;
/// use server::{AgentConfig, ModelConfig};
/// let m = ModelConfig::new("digits", concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"));
/// let backend = load_onnx(&m, &AgentConfig::default())?;
/// assert_eq!(backend.signature().name, "digits");
/// # Ok::<(), engine::EngineError>(())
/// ```
pub fn load_onnx(m: &ModelConfig, cfg: &AgentConfig) -> Result<Arc<dyn Backend>, EngineError> {
    let opts = ort_options(m, cfg);
    Ok(Arc::new(OrtBackend::load(&m.name, &m.path, &opts)?))
}

/// `[?, 3, 224, 224]`: dims, `?` for a dynamic one.
fn dims_text(shape: &[Option<u64>]) -> String {
    let dims: Vec<String> = shape
        .iter()
        .map(|d| d.map_or_else(|| "?".to_string(), |n| n.to_string()))
        .collect();
    format!("[{}]", dims.join(", "))
}

/// `asked`, unless the model cannot batch: an input whose first dimension
/// is fixed (or that has none) cannot stack requests, and an output whose
/// first dimension is fixed cannot be split back into them, so the model
/// gets `max_batch = 1`, with a warning on stderr saying why.
///
/// # Examples
///
/// ```
/// use server::registry::batch_policy_for;
/// use server::BatchPolicy;
/// use wire::{DType, ModelSignature, TensorSpec};
/// let spec = |first| TensorSpec { name: "t".into(), dtype: DType::F32, shape: vec![first, Some(64)] };
/// let asked = BatchPolicy { max_batch: 8, ..BatchPolicy::default() };
/// let dynamic = ModelSignature { name: "m".into(), inputs: vec![spec(None)], outputs: vec![spec(None)] };
/// assert_eq!(batch_policy_for(&dynamic, asked.clone()).max_batch, 8);
/// // A fixed first dimension cannot stack requests: no batching (and a warning).
/// let fixed = ModelSignature { name: "m".into(), inputs: vec![spec(Some(1))], outputs: vec![spec(None)] };
/// assert_eq!(batch_policy_for(&fixed, asked).max_batch, 1);
/// ```
pub fn batch_policy_for(sig: &ModelSignature, asked: BatchPolicy) -> BatchPolicy {
    if !asked.is_on() {
        return asked;
    }
    let fixed = sig
        .inputs
        .iter()
        .map(|t| ("input", t))
        .chain(sig.outputs.iter().map(|t| ("output", t)))
        // A scalar (no first dimension) can neither stack nor be split.
        .find(|(_, t)| !matches!(t.shape.first(), Some(None)));
    match fixed {
        None => asked,
        Some((kind, t)) => {
            eprintln!(
                "tensorwire agent: model '{}': max_batch {} asked, but {kind} '{}' has shape {} \
                 (no dynamic first dimension to stack requests along): max_batch = 1",
                sig.name,
                asked.max_batch,
                t.name,
                dims_text(&t.shape)
            );
            BatchPolicy::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity_named(name: &str) -> NewModel {
        NewModel {
            backend: Arc::new(IdentityBackend::named(name)),
            concurrency: 1,
            version: 3,
            outputs_in_place: false,
            policy: QueuePolicy::default(),
            batching: BatchPolicy::default(),
        }
    }

    #[test]
    fn install_replace_and_remove_never_reuse_ids() {
        let r = ModelRegistry::with_identity();
        let a = r.install(identity_named("a"));
        assert_eq!(r.find("a").map(|m| (m.id, m.version)), Some((a, 3)));
        let held = r.get(a).expect("installed");
        let a2 = r.install(identity_named("a"));
        assert_ne!(a, a2);
        assert!(r.get(a).is_none(), "the replaced id answers nothing");
        assert_eq!(r.find("a").map(|m| m.id), Some(a2));
        // A request holding the old entry keeps it alive.
        assert_eq!(held.signature().name, "a");
        let removed = r.remove("a").expect("served");
        assert_eq!(removed.id, a2);
        assert!(r.find("a").is_none() && r.get(a2).is_none());
        assert!(r.remove("a").is_none());
        assert_eq!(r.names(), vec!["identity".to_string()]);
        let b = r.install(identity_named("b"));
        assert!(b > a2, "ids are never reused");
    }
}
