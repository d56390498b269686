//! Library half of the tensorwire command: pieces the subcommands share.
//!
//! - [`npy`]: reading and writing NumPy `.npy` files (tensors in and out).
//! - [`raw`]: the "raw floor" socket ping-pong `tensorwire ping --raw` compares
//!   tensorwire against, and the `raw-echo` peer it runs.
//! - [`raw_shm`]: the shared-memory floor (`tensorwire ping --raw shm`): two
//!   processes ping-pong over one shared page by spinning.
//! - [`stats`]: latency summaries (nearest-rank percentiles) and spreads.

mod child;
pub mod npy;
pub mod raw;
pub mod raw_shm;
pub mod stats;
