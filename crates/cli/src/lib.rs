//! Library half of the tensorwire command: pieces the subcommands share.
//!
//! - [`npy`]: reading and writing NumPy `.npy` files (tensors in and out).
//!
//! The raw floors, latency statistics and the benchmark harness live in the
//! `tensorwire-bench` crate (`bench::raw`, `bench::raw_shm`, `bench::stats`).

pub mod npy;
