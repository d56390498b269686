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

/// Runs one inference request's blocking part (the model's queue, the
/// engine) for an async front door.
///
/// When the model is free (`model_free`: `ModelQueue::has_free_run`
/// of the model the request names, or an unknown model, which fails at
/// once), the request runs right here on the tokio worker, as the tonic
/// peer runs its engine: a hand-off to the blocking pool costs two thread
/// wake-ups per request, which made an empty gRPC request ~1.4× slower
/// than the same stack calling the engine inline. A request that would
/// wait for the model is handed to the blocking pool instead, so waiting
/// never holds a worker that other connections (health probes included)
/// need. A panic is caught and returned as a message: it fails this request
/// only.
pub(crate) async fn run_request<R: Send + 'static>(
    model_free: bool,
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, String> {
    if model_free {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            format!("the inference task failed: {what}")
        })
    } else {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| format!("the inference task failed: {e}"))
    }
}

impl FrontDoor {
    /// Whether a request for `name` would run without waiting (see
    /// [`run_request`]); true for an unknown model, which fails at once.
    pub(crate) fn model_free(&self, name: &str) -> bool {
        self.core
            .registry
            .find(name)
            .is_none_or(|m| m.queue.has_free_run())
    }
}
