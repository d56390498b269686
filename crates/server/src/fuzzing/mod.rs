//! Fuzzing entry points for the agent (the `fuzzing` cargo feature): whole
//! sessions against a real [`AgentCore`] serving the built-in `identity`
//! model (no ONNX Runtime), driven through the entry points the agent's own
//! listeners use.
//!
//! - [`agent_session`]: a structure-aware sequence of [`SessionOp`]s (Hello
//!   with odd fields, requests with fuzzer-chosen model ids, dtypes, shapes,
//!   offsets and lengths, pipelined; pings, model queries and lists,
//!   Releases, raw bytes) written on a Unix socket into a
//!   [`SocketSession`](crate::session::SocketSession).
//! - [`shm_ring`]: a [`ShmSession`](crate::shm_session::ShmSession)
//!   bootstrapped over a real control socket and memfd arena, whose request
//!   ring, client region and shared words the fuzz input then writes, as a
//!   hostile client would.
//!
//! Both take `&[u8]`, decode it with [`arbitrary`], and are called by the
//! cargo-fuzz targets (`fuzz/fuzz_targets/{agent_session,shm_ring}.rs`) and
//! by `crates/server/tests/fuzz_corpus.rs`, which replays the committed
//! corpora in a plain `cargo test`. Broken invariants are assertions (so
//! the fuzzer reports them as crashes): every request the driver knows was
//! accepted is answered exactly once, in order, with its own id; a valid
//! identity request gets its own bytes back; every tensor a response points
//! at lies inside the arena's data area, an aliased one inside the client's
//! region; a session facing hostile bytes ends instead of looping; and once
//! the sequence is over the core holds nothing (no connection, no request
//! in flight, the whole payload budget, idle queues).

mod shm;
mod socket;

pub use shm::{shm_ring, ShmInput, ShmOp};
pub use socket::{agent_session, SessionInput, SessionOp};

use crate::conns::ConnTable;
use crate::dispatch::AgentCore;
use crate::registry::ModelRegistry;
use arbitrary::Arbitrary;
use engine::IdentityBackend;
use std::sync::Arc;
use wire::{DType, Limits, TensorDesc};

/// The agent-wide payload budget of the fuzzed core (bytes).
const PAYLOAD_BUDGET: u64 = 4 << 20;
/// The fuzzed core's limits: small enough that no input makes it allocate
/// much, large enough that every request the drivers build fits.
const CORE_LIMITS: Limits = Limits {
    max_tensors: 16,
    max_in_flight: 8,
    max_payload: 1 << 20,
    max_desc_len: 4096,
};
/// Most bytes of tensor data one request may carry (larger shapes are
/// still described, their bytes are not sent: see the drivers).
const MAX_REQUEST_BYTES: u64 = 16 << 10;
/// Most operations one input runs.
const MAX_OPS: usize = 64;

/// The core every fuzz input runs against (a fresh one per input, so that
/// an input's outcome does not depend on the ones before it).
struct Fixture {
    core: Arc<AgentCore>,
    conns: Arc<ConnTable>,
    /// Model ids: `identity` (outputs alias inputs) and `identity-in-place`
    /// (the same, through `Backend::run_into` into buffers the agent gives).
    identity: u32,
    in_place: u32,
}

impl Fixture {
    fn new() -> Fixture {
        let mut registry = ModelRegistry::with_identity();
        let in_place = registry.add_in_place(
            Arc::new(IdentityBackend::named("identity-in-place")),
            usize::MAX >> 1,
        );
        let identity = registry
            .find(IdentityBackend::NAME)
            .map(|m| m.id)
            .expect("the registry serves identity");
        let core = AgentCore::new(registry, CORE_LIMITS, PAYLOAD_BUDGET).with_request_timing(false);
        Fixture {
            core: Arc::new(core),
            conns: Arc::new(ConnTable::new(64, 64)),
            identity,
            in_place,
        }
    }

    /// The model id `m` names.
    fn model_id(&self, m: ModelChoice) -> u32 {
        match m {
            ModelChoice::Identity => self.identity,
            ModelChoice::InPlace => self.in_place,
            ModelChoice::Raw(id) => id,
        }
    }

    /// Whether `id` is one of the identity models.
    fn is_identity(&self, id: u32) -> bool {
        id == self.identity || id == self.in_place
    }

    /// Everything a finished session held is given back: no connection
    /// open, no request in flight, the whole payload budget, every queue
    /// idle.
    fn assert_idle(&self) {
        let core = &self.core;
        assert_eq!(self.conns.counts().open, 0, "a connection is still open");
        assert_eq!(core.in_flight(), 0, "requests still in flight");
        assert_eq!(
            core.payload_budget_left(),
            PAYLOAD_BUDGET,
            "payload budget not given back"
        );
        for m in core.registry.models() {
            let q = m.queue.stats();
            assert_eq!(
                (q.running, q.waiting),
                (0, 0),
                "queue of model {} not idle",
                m.id
            );
        }
    }
}

/// Which model a request names.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum ModelChoice {
    /// The built-in `identity`.
    Identity,
    /// `identity-in-place` (outputs written into buffers the agent gives).
    InPlace,
    /// Any id (most name no model).
    Raw(u32),
}

/// One tensor of a request, as the fuzzer describes it.
#[derive(Arbitrary, Clone, Debug)]
pub struct TensorOp {
    /// Wire dtype code (1..=13 are defined).
    pub dtype: u8,
    /// Dimensions (more than 8 is malformed).
    pub dims: Vec<u8>,
    /// Extra 64-byte units of gap before this tensor.
    pub gap: u8,
    /// Seed of the tensor's bytes.
    pub fill: u8,
}

impl TensorOp {
    /// Its dtype, if the code is defined.
    fn dtype(&self) -> Option<DType> {
        DType::from_code(self.dtype).ok()
    }

    /// Its shape on the wire.
    fn shape(&self) -> Vec<u64> {
        self.dims.iter().map(|&d| u64::from(d)).collect()
    }

    /// Its byte length, `None` for an unknown dtype or an overflow.
    fn byte_len(&self) -> Option<u64> {
        TensorDesc::byte_len(self.dtype()?, &self.shape())
    }
}

/// `len` bytes of tensor data seeded by `fill` and the tensor's index.
fn tensor_bytes(len: usize, fill: u8, index: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31).wrapping_add(fill) ^ index as u8)
        .collect()
}

/// A tensor the driver sent, to compare an identity response against.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sent {
    dtype: DType,
    shape: Vec<u64>,
    bytes: Vec<u8>,
}
