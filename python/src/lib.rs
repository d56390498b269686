//! The native half of the `tensorwire` Python package (`tensorwire._native`):
//! the Rust client and agent exposed to Python with pyo3, on the stable ABI
//! (abi3, CPython ≥ 3.9).
//!
//! The hot path is here, not in Python: a call takes a dict of ndarrays,
//! checks them against the signature, borrows their bytes where they lie
//! (NumPy's C API, through the `numpy` crate, which works on the stable
//! ABI), and answers with ndarrays made over the response's memory. The
//! Python half (`tensorwire/__init__.py`) adds names users read (futures,
//! asyncio, `ModelInfo`, `Outputs.release`) and the docs.
//!
//! - [`errors`]: one Python exception class per [`client::ClientError`] kind.
//! - [`fork`]: the fork generation, so a client used (or dropped) in a child
//!   process never touches its parent's session.
//! - [`arrays`]: ndarrays in (borrowed where they lie) and out (over blocks).
//! - [`block`]: [`Block`], memory NumPy views: an output, or a buffer made
//!   by `Client.empty` (in the shm arena when the session has one).
//! - [`session`]: `Client`, `Model`, `Pending` (a request in flight).
//! - [`agent`]: `Agent`, an agent embedded in the Python process.
//!
//! Every call that waits or copies releases the GIL.

use pyo3::prelude::*;

pub mod agent;
pub mod arrays;
pub mod block;
pub mod errors;
pub mod fork;
pub mod session;

pub use block::Block;

/// The `tensorwire._native` module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    fork::install();
    m.add_class::<session::Client>()?;
    m.add_class::<session::Model>()?;
    m.add_class::<session::Pending>()?;
    m.add_class::<block::Block>()?;
    m.add_class::<agent::Agent>()?;
    errors::register(m)?;
    m.add("DTYPES", wire::DType::ALL.map(|d| d.name()).to_vec())?;
    Ok(())
}
