//! `tensorwire bench`: the instrument that shows where every microsecond of
//! a model call goes, with tensorwire and its peers measured in the same run.
//!
//! The crate is a set of small pieces, each owning one job:
//!
//! - [`caller`]: what one request is ([`caller::Caller`]) and the stages a
//!   request's time splits into ([`caller::Stage`]);
//! - [`hist`]: latency histograms (HDR) and their percentiles;
//! - [`schedule`]: open-loop arrival times (Poisson, constant, a trace file);
//! - [`load`]: the load generators: closed loop with N clients, open loop on
//!   a schedule (latency measured from the *scheduled* time, so coordinated
//!   omission is not hidden), each bounded by a duration or a request count;
//! - [`placement`]: pinning clients and servers to CPUs (same placement
//!   for every target);
//! - [`resources`]: CPU time and RSS of processes from `/proc`, and the rest
//!   of the machine's CPU use (noise);
//! - [`kserve_http`]: the KServe v2 HTTP client that calls the agent's
//!   `http://` front door (the gRPC one uses the tonic peer's client);
//! - [`raw`], [`raw_shm`], [`child`]: the raw floors (bare sockets, a shared
//!   page) and the child processes they run in;
//! - [`stats`]: nearest-rank summaries and the spread over repeats;
//! - [`results`]: the rows a run produces and `results.json` / `results.csv`;
//! - [`batching`]: the `batching` suite's settings, the agent's statistics
//!   (mean batch) and the engine's offline throughput on pre-formed batches;
//! - [`handoff`]: the hand-off floor of a closed loop of blocking clients
//!   (caller threads and the engine in this process, futex wake-ups and
//!   nothing else);
//! - [`tenants`]: the `tenants` suite (one tenant's flood beside another
//!   tenant's light load, with and without a tenants file), which runs its
//!   own two concurrent open loops rather than a [`suite::Plan`];
//! - [`report`], [`plot`], [`console`]: `report.md`, the SVG/PNG figures, and
//!   what is printed while running.
//!
//! The targets (tensorwire over each transport and front door, the
//! in-process baseline, the raw floors, the gRPC and ttrpc peers), workloads and suites that tie these
//! together are in [`target`], [`workload`] and [`suite`].
//!
//! # Examples
//!
//! The smallest real measurement: tensorwire over `inproc://` (an agent
//! embedded in this process) calling the identity model with 1 KiB, two
//! closed-loop clients, 500 timed requests:
//!
//! ```
//! use std::time::Duration;
//! use tensorwire_bench::load::{self, Bounds, Load};
//! use tensorwire_bench::target::{self, BenchEnv, Framework, Net, TargetSpec};
//! use tensorwire_bench::workload::Workload;
//! use tensorwire_bench::Stage;
//! let env = BenchEnv {
//!     exe: "tensorwire".into(), // runs child agents and peers; an inproc target needs none
//!     intra_threads: 1,
//!     stages: true, // ask for every request's timeline
//!     placement: None,
//!     spin: None,
//!     mover: None,
//! };
//! let spec = TargetSpec::new(Framework::Tensorwire, Net::Inproc);
//! let running = target::start(&spec, &Workload::Identity { bytes: 1024 }, &env)?;
//! let factory = running.factory.clone().ok_or("a tensorwire target has callers")?;
//!
//! let bounds = Bounds { warmup: 20, duration: None, requests: Some(500) };
//! let r = load::run(&*factory, &Load::Closed { clients: 2 }, &bounds)?;
//! assert_eq!((r.completed, r.errors), (500, 0));
//! assert_eq!(r.latency.count(), 500);
//! assert!(r.latency.percentile_us(50.0) <= r.latency.percentile_us(99.0));
//! assert!(r.stages.get(Stage::Compute).is_some_and(|h| h.count() > 0));
//! println!("{}: p50 {:.1} µs, {:.0} req/s", spec.label(), r.latency.percentile_us(50.0), r.throughput_rps);
//! running.stop()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod batching;
pub mod calibrate;
pub mod caller;
pub mod child;
pub mod classify;
pub mod client_modes;
pub mod console;
pub mod handoff;
pub mod hist;
pub mod kserve_http;
pub mod load;
pub mod measure;
pub mod placement;
pub mod plot;
pub mod raw;
pub mod raw_shm;
pub mod report;
pub mod resources;
pub mod results;
pub mod schedule;
pub mod stats;
pub mod suite;
pub mod target;
pub mod tenants;
pub mod workload;

pub use caller::{BenchError, Caller, CallerFactory, Stage, StageSample};
