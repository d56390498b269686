//! The shared-memory transport (`shm://`; the agent's sessions are in
//! `server::shm_session`, the client's link in `client::shm`): each tenant gets its own sealed memfd [`Arena`], passed over a Unix
//! socket with `SCM_RIGHTS` ([`fdpass`]), so no other process can name or map
//! it; control messages travel through single-producer/single-consumer
//! [`Ring`]s of 64-byte slots inside it; a side with nothing to do sleeps on a
//! [`futex`] word in the arena after spinning briefly.
//!
//! Everything the peer writes into the arena is untrusted: the consumer's
//! ring index is checked before use, slots are copied out before they are validated, and
//! tensor bytes are only ever read as bytes.
//!
//! Beside the transport, [`mirror`] holds the agent's tensor queue memory: a
//! [`TensorRing`] whose memfd is mapped twice back to back, so a batch of
//! back-to-back [`RingSpan`]s is one slice even where it wraps.

pub mod arena;
pub mod channel;
pub mod fdpass;
pub mod futex;
pub mod layout;
pub mod mirror;
pub mod ring;

pub use arena::Arena;
pub use channel::{
    control_path, ShmChannel, ShmError, ShmSizes, WaitPolicy, SLEEP_FUTEX, SLEEP_PARKED,
};
pub use layout::Layout;
pub use mirror::{RingSpan, TensorRing};
pub use ring::{Ring, RingError, SLOT_LEN};
