//! [`FrontDoor`]: the state every standard front door of one agent shares,
//! whichever listener (gRPC or HTTP) a call arrives on.
//!
//! Triton keeps one set of server-wide state behind all its endpoints: a
//! shared-memory region registered over HTTP can be used by a gRPC
//! request, a model loaded over gRPC is ready over HTTP. `FrontDoor` is
//! that state for tensorwire: the agent's core, and what the extensions
//! add next to it (the system shared-memory regions, [`SystemShm`], and
//! the model repository, [`Repository`], when the agent serves one).

use crate::model_config::{effective, ONNX_PLATFORM};
use crate::proto::ModelConfig;
use crate::repository::Repository;
use crate::sysshm::SystemShm;
use server::dispatch::AgentCore;
use server::ModelEntry;
use std::sync::Arc;

/// The state shared by all KServe front doors of one agent.
#[derive(Debug)]
pub struct FrontDoor {
    /// The agent's core: registry, limits, queues, counters.
    pub(crate) core: Arc<AgentCore>,
    /// The registered system shared-memory regions (Triton's extension).
    pub(crate) shm: SystemShm,
    /// The model repository, if the agent serves one.
    pub(crate) repository: Option<Arc<Repository>>,
}

impl FrontDoor {
    /// Front-door state over `core`.
    pub fn new(core: Arc<AgentCore>) -> Arc<FrontDoor> {
        FrontDoor::with_repository(core, None)
    }

    /// Front-door state over `core` and the model repository it serves
    /// (its index, load and unload calls; its readiness).
    pub fn with_repository(
        core: Arc<AgentCore>,
        repository: Option<Arc<Repository>>,
    ) -> Arc<FrontDoor> {
        Arc::new(FrontDoor {
            core,
            shm: SystemShm::default(),
            repository,
        })
    }

    /// Whether every model the agent should serve is served: always, but
    /// for a repository model that failed to load.
    pub(crate) fn models_ready(&self) -> bool {
        self.repository.as_ref().is_none_or(|r| r.all_ready())
    }

    /// The configuration reported for `model`: the repository's (from its
    /// `config.pbtxt`, completed) when it loaded the model, else one
    /// derived from the model's signature.
    pub(crate) fn model_config(&self, model: &ModelEntry) -> ModelConfig {
        let sig = model.signature();
        let from_repository = self.repository.as_ref().and_then(|r| r.config(&sig.name));
        from_repository.unwrap_or_else(|| {
            let mut c = effective(ModelConfig::default(), sig, model.queue.concurrency());
            if c.platform == ONNX_PLATFORM && !model.outputs_in_place {
                // Not an ONNX Runtime model (the built-in identity).
                c.platform = crate::service::platform(sig).to_string();
                c.backend = String::new();
                c.default_model_filename = String::new();
            }
            c
        })
    }

    /// The agent's core.
    pub fn core(&self) -> &Arc<AgentCore> {
        &self.core
    }
}
