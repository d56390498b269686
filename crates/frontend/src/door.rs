//! [`FrontDoor`]: the state every standard front door of one agent shares,
//! whichever listener (gRPC or HTTP) a call arrives on.
//!
//! Triton keeps one set of server-wide state behind all its endpoints: a
//! shared-memory region registered over HTTP can be used by a gRPC
//! request, a model loaded over gRPC is ready over HTTP. `FrontDoor` is
//! that state for tensorwire: the agent's core, and what the extensions
//! add next to it (the system shared-memory regions, [`SystemShm`]).

use crate::sysshm::SystemShm;
use server::dispatch::AgentCore;
use std::sync::Arc;

/// The state shared by all KServe front doors of one agent.
#[derive(Debug)]
pub struct FrontDoor {
    /// The agent's core: registry, limits, queues, counters.
    pub(crate) core: Arc<AgentCore>,
    /// The registered system shared-memory regions (Triton's extension).
    pub(crate) shm: SystemShm,
}

impl FrontDoor {
    /// Front-door state over `core`.
    pub fn new(core: Arc<AgentCore>) -> Arc<FrontDoor> {
        Arc::new(FrontDoor {
            core,
            shm: SystemShm::default(),
        })
    }

    /// The agent's core.
    pub fn core(&self) -> &Arc<AgentCore> {
        &self.core
    }
}
