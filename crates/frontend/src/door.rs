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

/// The most bytes a request may carry to run on a tokio worker.
pub(crate) const INLINE_MAX_BYTES: usize = 64 * 1024;
/// The longest recent engine run for which a request runs on a tokio
/// worker.
const INLINE_MAX_COMPUTE_NS: u64 = 200_000;

/// Runs one inference request's blocking part (parsing, the model's queue,
/// the engine, the answer) for an async front door.
///
/// A request `inline` ([`FrontDoor::runs_inline`]: small, no shared
/// memory, for a model that is free and ran fast lately) runs right here on
/// the tokio worker that read it, as the tonic peer runs its engine: a
/// hand-off to the blocking pool costs two thread wake-ups per request,
/// which made an empty gRPC request ~1.4× slower than the same stack
/// calling the engine inline. Everything else goes to the blocking pool,
/// so long work and waits (for the model, for a shared-memory lease) never
/// hold a worker that other connections and health probes need. The
/// "free" check is a hint: a request that finds the model taken after all
/// waits on the worker, for at most the few short runs ahead of it. A
/// panic is caught and returned as a message: it fails this request only.
pub(crate) async fn run_request<R: Send + 'static>(
    inline: bool,
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, String> {
    if inline {
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
    /// Whether a request for `name` carrying `request_bytes` may run on a
    /// tokio worker ([`run_request`]): it uses no shared memory, carries at
    /// most [`INLINE_MAX_BYTES`], and the model is free now and its recent
    /// runs took at most 200 µs (known only once a request was timed: the
    /// first request, and every request of an agent that does not time
    /// them, goes to the blocking pool). A model that batches never runs
    /// here: its request may wait out a queue delay for others, and would
    /// hold the tokio worker (and every connection it serves) meanwhile.
    /// Nor does a model whose runs may wait on another process
    /// (`Backend::may_block`: the gateway's remote models), however fast
    /// they were: a stalled agent would freeze every connection here.
    /// An unknown model fails at once, so it runs here too.
    pub(crate) fn runs_inline(&self, name: &str, request_bytes: usize, uses_shm: bool) -> bool {
        if uses_shm || request_bytes > INLINE_MAX_BYTES {
            return false;
        }
        self.core.registry.find(name).is_none_or(|m| {
            !m.batcher.policy().is_on()
                && !m.backend.may_block()
                && m.queue.has_free_run()
                && m.stats
                    .recent_compute_ns()
                    .is_some_and(|ns| ns <= INLINE_MAX_COMPUTE_NS)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::Timeline;

    fn door() -> Arc<FrontDoor> {
        FrontDoor::new(crate::test_support::identity_core())
    }

    /// A timed run of `compute_ns` recorded for `name`.
    fn ran(door: &FrontDoor, name: &str, compute_ns: u64) {
        let m = door.core.registry.find(name).expect("model");
        let t =
            Timeline::from_stamps([1000, 1000, 1100, 1100, 1100 + compute_ns, 1200 + compute_ns]);
        m.stats.record_success(&t, true);
    }

    #[test]
    fn only_small_fast_requests_without_shared_memory_run_inline() {
        let d = door();
        assert!(
            !d.runs_inline("identity", 0, false),
            "no run timed yet: the blocking pool"
        );
        ran(&d, "identity", 5_000);
        assert!(d.runs_inline("identity", 0, false));
        assert!(d.runs_inline("identity", INLINE_MAX_BYTES, false));
        assert!(
            !d.runs_inline("identity", INLINE_MAX_BYTES + 1, false),
            "too large"
        );
        assert!(
            !d.runs_inline("identity", 0, true),
            "shared memory may wait for a lease"
        );
        assert!(
            d.runs_inline("nope", 0, false),
            "an unknown model fails at once"
        );
        // Slow runs pull the estimate over the bound.
        for _ in 0..64 {
            ran(&d, "identity", 10 * INLINE_MAX_COMPUTE_NS);
        }
        assert!(!d.runs_inline("identity", 0, false), "a slow model");
    }

    #[test]
    fn a_panic_inline_fails_the_request_only() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let r: Result<(), String> = rt.block_on(run_request(true, || panic!("boom")));
        let e = r.expect_err("the panic is an error");
        assert!(e.contains("boom"), "{e}");
        assert_eq!(rt.block_on(run_request(false, || 7)), Ok(7));
    }
}
