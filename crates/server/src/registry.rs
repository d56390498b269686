//! [`ModelRegistry`]: every model the agent serves, loaded once, by id and name.
//!
//! Ids are indexes, assigned at start-up; id 0 is always the built-in
//! `identity` model. Clients resolve names to ids once per session.

use crate::config::{AgentConfig, ModelConfig};
use crate::queue::ModelQueue;
use crate::stats::ModelStats;
use engine::{Backend, EngineError, IdentityBackend, OrtBackend, OrtOptions};
use std::collections::HashMap;
use std::sync::Arc;
use wire::ModelSignature;

/// One served model.
pub struct ModelEntry {
    /// The model's id on the wire.
    pub id: u32,
    /// The loaded model.
    pub backend: Arc<dyn Backend>,
    /// Its queue.
    pub queue: ModelQueue,
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
    pub fn signature(&self) -> &ModelSignature {
        self.backend.signature()
    }
}

impl std::fmt::Debug for ModelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelEntry({}, {})", self.id, self.signature().name)
    }
}

/// All models, immutable once the agent starts.
#[derive(Debug, Default)]
pub struct ModelRegistry {
    by_id: Vec<ModelEntry>,
    by_name: HashMap<String, u32>,
}

impl ModelRegistry {
    /// A registry holding only `identity`.
    pub fn with_identity() -> ModelRegistry {
        let mut r = ModelRegistry::default();
        r.add(Arc::new(IdentityBackend::new()), usize::MAX >> 1);
        r
    }

    /// Loads every model of `cfg` (plus `identity`). Fails on the first model
    /// that cannot be loaded, naming it.
    pub fn load(cfg: &AgentConfig) -> Result<ModelRegistry, EngineError> {
        let mut r = ModelRegistry::with_identity();
        for m in &cfg.models {
            r.load_one(m, cfg)?;
        }
        Ok(r)
    }

    fn load_one(&mut self, m: &ModelConfig, cfg: &AgentConfig) -> Result<(), EngineError> {
        let opts = OrtOptions {
            intra_threads: cfg.intra_threads,
            inter_threads: cfg.inter_threads,
            sessions: m.concurrency,
        };
        let backend = OrtBackend::load(&m.name, &m.path, &opts)?;
        self.add_in_place(Arc::new(backend), m.concurrency);
        Ok(())
    }

    /// Adds a loaded backend (tests and embedders use this for custom
    /// backends); returns its id. Its outputs are taken from
    /// [`Backend::run`] (see [`ModelEntry::outputs_in_place`]).
    pub fn add(&mut self, backend: Arc<dyn Backend>, concurrency: usize) -> u32 {
        self.push(backend, concurrency, false)
    }

    /// Adds a backend whose [`Backend::run_into`] writes outputs straight
    /// into the buffers it is given (as [`OrtBackend`]'s does); returns its id.
    pub fn add_in_place(&mut self, backend: Arc<dyn Backend>, concurrency: usize) -> u32 {
        self.push(backend, concurrency, true)
    }

    fn push(&mut self, backend: Arc<dyn Backend>, concurrency: usize, in_place: bool) -> u32 {
        let id = self.by_id.len() as u32;
        self.by_name.insert(backend.signature().name.clone(), id);
        self.by_id.push(ModelEntry {
            id,
            backend,
            queue: ModelQueue::new(concurrency),
            outputs_in_place: in_place,
            stats: ModelStats::default(),
        });
        id
    }

    /// The model with this id.
    pub fn get(&self, id: u32) -> Option<&ModelEntry> {
        self.by_id.get(id as usize)
    }

    /// The model with this name.
    pub fn find(&self, name: &str) -> Option<&ModelEntry> {
        self.by_name.get(name).and_then(|&id| self.get(id))
    }

    /// Every model, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &ModelEntry> {
        self.by_id.iter()
    }
}
