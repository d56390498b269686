//! [`ModelStats`]: what the agent counts for each model, whichever transport
//! or front door a request came by; Triton's statistics extension and the
//! Prometheus metrics are read from here.
//!
//! Recording happens in [`AgentCore`](crate::dispatch::AgentCore) (prepare,
//! respond, and the end of a request's life), so native `shm://`,
//! `unix://`, `tcp://` and `inproc://` sessions and the KServe front doors
//! are all counted the same way. The hot path only does relaxed atomic adds
//! on counters that live in the model's entry: no lock, no allocation, and
//! nothing of the metrics library (the exporter reads a [`StatsSnapshot`]
//! when it is scraped).
//!
//! **Durations** come from the request's [`Timeline`] stamps, which cost a
//! clock read each (~30 ns here). They are taken for every request while the
//! agent's `request_timing` is on (the default; `AgentCore::timeline`) and
//! otherwise only for requests whose client asked for their timeline; with
//! timing off, counts still move but no duration is recorded. For one
//! successful request, with the stamps `received` (the core has the
//! request's header), `queued`, `compute_start`, `compute_end` and
//! `response_sent` (the core has built the response, before the transport
//! sends it):
//!
//! | statistic | span | what it covers here |
//! |---|---|---|
//! | `compute_input` | received → queued | descriptors decoded and checked against the signature, the payload read into place (sockets; already in place over shm), tensor views built; front doors: inputs gathered from the KServe message too |
//! | `queue` | queued → compute_start | waiting in the model's queue (0 when admitted at once: one compare-and-swap) |
//! | `compute_infer` | compute_start → compute_end | the engine's run |
//! | `compute_output` | compute_end → response_sent | outputs checked, laid out or placed (shm: copied into the arena, or into the Triton region a front-door caller named, when the engine could not write them in place), the response header and descriptors encoded |
//! | `success` | received → response_sent | the sum of the four above |
//! | `fail` | received → the failure | for a request refused or failed after its model was known |
//!
//! A failure is a request for a known model answered with an error: refused
//! by the core's checks, failed in the engine, a response over the
//! session's limits, or dropped with its connection before it was answered.
//! Requests for no known model are not counted here (the agent's error
//! counter has them).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};
use wire::{monotonic_ns, Timeline};

/// How a request reached the agent: its transport or front door.
///
/// # Examples
///
/// ```
/// use server::stats::Via;
/// let ep = transport::Endpoint::parse("tls://127.0.0.1:9000")?;
/// assert_eq!(Via::of_endpoint(&ep), Via::Tcp); // TLS sessions count with tcp
/// assert_eq!(Via::Grpc.name(), "grpc");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Via {
    /// `inproc://`: the caller's own thread.
    Inproc = 0,
    /// `unix://` sessions.
    Unix = 1,
    /// `tcp://` sessions.
    Tcp = 2,
    /// `shm://` sessions.
    Shm = 3,
    /// The KServe v2 gRPC front door (`grpc://`).
    Grpc = 4,
    /// The KServe v2 HTTP/REST front door (`http://`).
    Http = 5,
    /// `vsock://` sessions.
    Vsock = 6,
    /// A caller that did not say (`AgentCore::prepare` / `prepare_in`).
    #[default]
    Other = 7,
}

impl Via {
    /// How many there are: the length of
    /// [`StatsSnapshot::by_via`], indexed by `Via as usize`.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::stats::Via;
    /// assert_eq!(Via::ALL.len(), Via::COUNT);
    /// assert!(Via::ALL.iter().enumerate().all(|(i, v)| *v as usize == i));
    /// ```
    pub const COUNT: usize = 8;

    /// Every one, in label order. Example: [`Via::COUNT`].
    pub const ALL: [Via; Via::COUNT] = [
        Via::Inproc,
        Via::Unix,
        Via::Tcp,
        Via::Shm,
        Via::Grpc,
        Via::Http,
        Via::Vsock,
        Via::Other,
    ];

    /// The metrics label value: `inproc`, `unix`, `tcp`, `shm`, `grpc`,
    /// `http`, `vsock` or `other`.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::stats::Via;
    /// let labels: Vec<&str> = Via::ALL.iter().map(|v| v.name()).collect();
    /// assert_eq!(labels, ["inproc", "unix", "tcp", "shm", "grpc", "http", "vsock", "other"]);
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Via::Inproc => "inproc",
            Via::Unix => "unix",
            Via::Tcp => "tcp",
            Via::Shm => "shm",
            Via::Grpc => "grpc",
            Via::Http => "http",
            Via::Vsock => "vsock",
            Via::Other => "other",
        }
    }

    /// The transport of a native endpoint.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::stats::Via;
    /// let ep = transport::Endpoint::parse("shm://tw-demo")?;
    /// assert_eq!(Via::of_endpoint(&ep), Via::Shm);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of_endpoint(ep: &transport::Endpoint) -> Via {
        match ep {
            transport::Endpoint::Inproc(_) => Via::Inproc,
            transport::Endpoint::Unix(_) => Via::Unix,
            // TLS sessions are tcp sessions: counted with them.
            transport::Endpoint::Tcp { .. } | transport::Endpoint::Tls { .. } => Via::Tcp,
            transport::Endpoint::Shm(_) => Via::Shm,
            transport::Endpoint::Vsock { .. } => Via::Vsock,
        }
    }
}

/// Upper bounds (inclusive, in ns) of the duration histograms' buckets:
/// 1, 2.5, 5 per decade from 1 µs to 10 s. Durations above the last fall in
/// the `+Inf` bucket.
///
/// # Examples
///
/// The bucket bounds as Prometheus `le` labels, in seconds, with the
/// `+Inf` bucket ([`DURATION_BUCKETS`] of them):
///
/// ```
/// use server::stats::{DURATION_BOUNDS_NS, DURATION_BUCKETS};
/// let le: Vec<String> = DURATION_BOUNDS_NS.iter().map(|&ns| format!("{}", ns as f64 / 1e9))
///     .chain(["+Inf".to_string()]).collect();
/// assert_eq!(le.len(), DURATION_BUCKETS);
/// assert_eq!((le[0].as_str(), le[21].as_str(), le[22].as_str()), ("0.000001", "10", "+Inf"));
/// ```
pub const DURATION_BOUNDS_NS: [u64; 22] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Buckets of a duration histogram: one per bound, then `+Inf`.
/// Example: [`DURATION_BOUNDS_NS`].
pub const DURATION_BUCKETS: usize = DURATION_BOUNDS_NS.len() + 1;

/// A histogram of durations over [`DURATION_BOUNDS_NS`]: one relaxed add
/// per observation (a bucket found by binary search over 22 bounds).
///
/// # Examples
///
/// ```
/// use server::stats::DurationHistogram;
/// let h = DurationHistogram::default();
/// h.observe(1_000); // bounds are inclusive: the 1 µs bucket
/// h.observe(1_001); // the 2.5 µs one
/// h.observe(60_000_000_000); // a minute: +Inf
/// let b = h.snapshot();
/// assert_eq!((b[0], b[1], b[22]), (1, 1, 1));
/// assert_eq!(b.iter().sum::<u64>(), 3);
/// ```
#[derive(Debug, Default)]
pub struct DurationHistogram {
    /// Observations per bucket (not cumulative).
    counts: [AtomicU64; DURATION_BUCKETS],
}

impl DurationHistogram {
    /// Counts one duration of `ns`. Example: [`DurationHistogram`].
    #[inline]
    pub fn observe(&self, ns: u64) {
        let i = DURATION_BOUNDS_NS.partition_point(|&bound| bound < ns);
        self.counts[i].fetch_add(1, Relaxed);
    }

    /// Observations per bucket (not cumulative; the last is `+Inf`).
    /// Example: [`DurationHistogram`].
    pub fn snapshot(&self) -> [u64; DURATION_BUCKETS] {
        std::array::from_fn(|i| self.counts[i].load(Relaxed))
    }
}

/// One model's counters (see the module doc for what each covers).
///
/// Every model of the registry has one
/// ([`ModelEntry::stats`](crate::registry::ModelEntry::stats)), fed by
/// every transport and front door.
///
/// # Examples
///
/// A front door that refuses a request for a known model by its own checks
/// counts it as the model's failure:
///
/// ```
/// use server::stats::{ModelStats, Via};
/// let s = ModelStats::default();
/// s.record_refused(Via::Http, wire::monotonic_ns());
/// let snap = s.snapshot();
/// assert_eq!((snap.fail.count, snap.success.count), (1, 0));
/// assert_eq!(snap.by_via[Via::Http as usize], 1);
/// assert_ne!(snap.last_inference_ms, 0);
/// ```
#[derive(Debug, Default)]
pub struct ModelStats {
    success: AtomicU64,
    failure: AtomicU64,
    failure_ns: AtomicU64,
    compute_input_ns: AtomicU64,
    queue_ns: AtomicU64,
    compute_infer_ns: AtomicU64,
    compute_output_ns: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of the latest answer (0: none yet).
    last_ns: AtomicU64,
    /// Recent engine run time, ns: an exponential moving average (weight
    /// 1/8) of timed requests' `compute_infer`, 0 until one is timed.
    recent_compute_ns: AtomicU64,
    /// Requests between a successful prepare and the end of their reply.
    in_flight: AtomicU64,
    /// Requests for this model per [`Via`] (counted as the core finds the
    /// model, before any other check).
    by_via: [AtomicU64; Via::COUNT],
    request: DurationHistogram,
    queue: DurationHistogram,
    compute: DurationHistogram,
    /// Engine runs of more than one request, and the requests in them.
    batches: AtomicU64,
    batched_requests: AtomicU64,
    /// Bytes the batcher copied: inputs staged into tensor queues, batches
    /// gathered (members not back to back in a queue), and output rows
    /// copied out of a batch's outputs.
    batch_staged_bytes: AtomicU64,
    batch_gathered_bytes: AtomicU64,
    batch_output_bytes: AtomicU64,
}

/// A count and the total of its durations, in ns.
///
/// # Examples
///
/// The mean engine time of a model's requests:
///
/// ```
/// use server::stats::CountNs;
/// let infer = CountNs { count: 4, ns: 2_000_000 };
/// assert_eq!(infer.ns.checked_div(infer.count), Some(500_000));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountNs {
    /// How many.
    pub count: u64,
    /// Their total duration (ns).
    pub ns: u64,
}

/// A model's statistics as read at one moment (each counter is read on its
/// own: a request that finishes meanwhile may show in some and not others).
///
/// # Examples
///
/// A model's statistics after two requests over a Unix socket:
///
/// ```
/// use server::stats::Via;
/// # let dir = tempfile::tempdir()?;
/// # let uri = format!("unix://{}", dir.path().join("a.sock").display());
/// let mut cfg = server::AgentConfig::default();
/// cfg.add_listen(&uri)?;
/// let agent = server::Agent::start(cfg)?;
/// let c = client::Client::connect(&uri)?;
/// let x = [0f32; 8];
/// for _ in 0..2 {
///     c.model("identity")?.infer(&[client::TensorRef::from_slice(&[8], &x)?])?;
/// }
/// let model = agent.core().registry.find("identity").ok_or("served")?;
/// let s = model.stats.snapshot();
/// assert_eq!((s.success.count, s.fail.count, s.inference_count), (2, 0, 2));
/// assert_eq!(s.by_via[Via::Unix as usize], 2);
/// assert_eq!(s.request_hist.iter().sum::<u64>(), 2); // both timed
/// assert!(s.success.ns >= s.compute_infer.ns);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Successful requests, arrival to response.
    pub success: CountNs,
    /// Failed requests, arrival to failure.
    pub fail: CountNs,
    /// Queue waits of successful requests.
    pub queue: CountNs,
    /// Input handling of successful requests.
    pub compute_input: CountNs,
    /// Engine runs of successful requests.
    pub compute_infer: CountNs,
    /// Output handling of successful requests.
    pub compute_output: CountNs,
    /// Inferences performed (one per successful request).
    pub inference_count: u64,
    /// Engine executions: a batch of several requests is one.
    pub execution_count: u64,
    /// Engine runs that served more than one request.
    pub batches: u64,
    /// Requests served in those runs.
    pub batched_requests: u64,
    /// Input bytes copied into tensor queues (each request staged for a
    /// batch is copied once).
    pub batch_staged_bytes: u64,
    /// Input bytes copied again to gather a batch whose members were not
    /// back to back in their tensor queues.
    pub batch_gathered_bytes: u64,
    /// Output bytes copied from a batch's outputs into its members' own.
    pub batch_output_bytes: u64,
    /// When the model was last asked for an inference that was answered,
    /// in ms since the Unix epoch (0: never).
    pub last_inference_ms: u64,
    /// Requests in flight now.
    pub in_flight: u64,
    /// Requests per transport, indexed by `Via as usize`.
    pub by_via: [u64; Via::COUNT],
    /// Successful requests' durations (arrival to response), per bucket.
    pub request_hist: [u64; DURATION_BUCKETS],
    /// Their queue waits, per bucket.
    pub queue_hist: [u64; DURATION_BUCKETS],
    /// Their engine runs, per bucket.
    pub compute_hist: [u64; DURATION_BUCKETS],
}

/// `CLOCK_MONOTONIC_COARSE` ns: the last tick's time (~10 ns a read here,
/// a few ms resolution), for `last_inference` when no stamp was taken.
fn coarse_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

impl ModelStats {
    /// A request for this model arrived by `via`.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::stats::{ModelStats, Via};
    /// let s = ModelStats::default();
    /// s.arrived(Via::Grpc);
    /// assert_eq!(s.snapshot().by_via[Via::Grpc as usize], 1);
    /// ```
    #[inline]
    pub fn arrived(&self, via: Via) {
        self.by_via[via as usize].fetch_add(1, Relaxed);
    }

    /// A request passed the core's checks and is in flight.
    #[inline]
    pub(crate) fn admitted(&self) {
        self.in_flight.fetch_add(1, Relaxed);
    }

    /// A request's reply is done with (answered or failed).
    #[inline]
    pub(crate) fn finished(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }

    /// Counts a successful request. Its durations are recorded from `tl`
    /// when `timed` and its stamps (received, queued, compute start and
    /// end, response sent) are all there and in order; otherwise only the
    /// count moves.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::stats::ModelStats;
    /// use wire::Timeline;
    /// let s = ModelStats::default();
    /// // received, payload in place, queued, compute start, end, response sent (ns)
    /// s.record_success(&Timeline::from_stamps([100, 150, 200, 300, 1_300, 1_500]), true);
    /// s.record_success(&Timeline::default(), true); // no stamps: counted, not timed
    /// let snap = s.snapshot();
    /// assert_eq!(snap.success.count, 2);
    /// assert_eq!((snap.queue.ns, snap.compute_infer.ns, snap.success.ns), (100, 1_000, 1_400));
    /// assert_eq!(s.recent_compute_ns(), Some(1_000));
    /// ```
    #[inline]
    pub fn record_success(&self, tl: &Timeline, timed: bool) {
        self.success.fetch_add(1, Relaxed);
        let [r0, _, q, c0, c1, end] = tl.stamps;
        if timed && r0 != 0 && r0 <= q && q <= c0 && c0 <= c1 && c1 <= end {
            self.compute_input_ns.fetch_add(q - r0, Relaxed);
            self.queue_ns.fetch_add(c0 - q, Relaxed);
            self.compute_infer_ns.fetch_add(c1 - c0, Relaxed);
            self.compute_output_ns.fetch_add(end - c1, Relaxed);
            self.request.observe(end - r0);
            self.queue.observe(c0 - q);
            self.compute.observe(c1 - c0);
            // A hint, not an account: concurrent updates may lose one.
            let old = self.recent_compute_ns.load(Relaxed);
            let x = (c1 - c0).max(1);
            let new = if old == 0 {
                x
            } else {
                (old - old / 8).saturating_add(x / 8).max(1)
            };
            self.recent_compute_ns.store(new, Relaxed);
            self.last_ns.store(end, Relaxed);
        } else {
            self.last_ns.store(coarse_ns(), Relaxed);
        }
    }

    /// How long the engine ran on recent timed requests (a moving average,
    /// ns), or `None` before the first timed request (or when the agent
    /// does not time requests). Example: [`ModelStats::record_success`].
    pub fn recent_compute_ns(&self) -> Option<u64> {
        Some(self.recent_compute_ns.load(Relaxed)).filter(|&n| n != 0)
    }

    /// Counts a failed request that arrived at `arrived_ns` (its
    /// `received` stamp; 0 when not timed: only the count moves).
    ///
    /// # Examples
    ///
    /// ```
    /// let s = server::stats::ModelStats::default();
    /// s.record_failure(0);
    /// assert_eq!(s.snapshot().fail, server::stats::CountNs { count: 1, ns: 0 });
    /// ```
    #[cold]
    pub fn record_failure(&self, arrived_ns: u64) {
        self.failure.fetch_add(1, Relaxed);
        if arrived_ns != 0 {
            let now = monotonic_ns();
            self.failure_ns
                .fetch_add(now.saturating_sub(arrived_ns), Relaxed);
            self.last_ns.store(now, Relaxed);
        } else {
            self.last_ns.store(coarse_ns(), Relaxed);
        }
    }

    /// Counts a request refused for this model before it reached the core
    /// (a front door's own checks): it arrived by `via` and failed.
    /// Example: [`ModelStats`].
    #[cold]
    pub fn record_refused(&self, via: Via, arrived_ns: u64) {
        self.arrived(via);
        self.record_failure(arrived_ns);
    }

    /// Counts one engine run of `requests` requests (more than one: a
    /// batch).
    pub(crate) fn record_batch(&self, requests: u64) {
        if requests > 1 {
            self.batches.fetch_add(1, Relaxed);
            self.batched_requests.fetch_add(requests, Relaxed);
        }
    }

    /// Counts bytes the batcher copied: staged into tensor queues,
    /// gathered into a batch, copied out of a batch's outputs.
    pub(crate) fn record_batch_copy(&self, staged: u64, gathered: u64, output: u64) {
        for (c, n) in [
            (&self.batch_staged_bytes, staged),
            (&self.batch_gathered_bytes, gathered),
            (&self.batch_output_bytes, output),
        ] {
            if n != 0 {
                c.fetch_add(n, Relaxed);
            }
        }
    }

    /// Requests in flight now.
    ///
    /// # Examples
    ///
    /// A request between its `prepare` and its reply:
    ///
    /// ```
    /// use server::dispatch::AgentCore;
    /// # use wire::{encode_tensor_section, DType, Header, TensorDesc};
    /// # let t = TensorDesc { dtype: DType::U8, shape: vec![4], offset: 0, len: 4 };
    /// # let mut desc = Vec::new();
    /// # encode_tensor_section(&[t], None, &mut desc);
    /// # let mut h = Header::new(wire::Kind::Request);
    /// # (h.tensor_count, h.desc_len, h.payload_len) = (1, desc.len() as u32, 4);
    /// let core = AgentCore::new(server::ModelRegistry::with_identity(), wire::Limits::default(), 1 << 20);
    /// let p = core.prepare(&h, &desc, &core.limits).map_err(|r| format!("{:?}", r.header.status))?;
    /// assert_eq!(p.model.stats.in_flight(), 1);
    /// let model = p.model.clone();
    /// drop(p); // dropped unanswered: no longer in flight, counted as failed
    /// assert_eq!((model.stats.in_flight(), model.stats.snapshot().fail.count), (0, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    /// Reads every counter. Examples: [`StatsSnapshot`], [`ModelStats`].
    pub fn snapshot(&self) -> StatsSnapshot {
        let success = self.success.load(Relaxed);
        let d = |a: &AtomicU64| CountNs {
            count: success,
            ns: a.load(Relaxed),
        };
        let (compute_input, queue, compute_infer, compute_output) = (
            d(&self.compute_input_ns),
            d(&self.queue_ns),
            d(&self.compute_infer_ns),
            d(&self.compute_output_ns),
        );
        StatsSnapshot {
            success: CountNs {
                count: success,
                ns: compute_input.ns + queue.ns + compute_infer.ns + compute_output.ns,
            },
            fail: CountNs {
                count: self.failure.load(Relaxed),
                ns: self.failure_ns.load(Relaxed),
            },
            queue,
            compute_input,
            compute_infer,
            compute_output,
            inference_count: success,
            // Each batch of n requests is one execution, not n (a request
            // of a batch that then failed makes this an estimate).
            execution_count: success.saturating_sub(
                self.batched_requests
                    .load(Relaxed)
                    .saturating_sub(self.batches.load(Relaxed)),
            ),
            batches: self.batches.load(Relaxed),
            batched_requests: self.batched_requests.load(Relaxed),
            batch_staged_bytes: self.batch_staged_bytes.load(Relaxed),
            batch_gathered_bytes: self.batch_gathered_bytes.load(Relaxed),
            batch_output_bytes: self.batch_output_bytes.load(Relaxed),
            last_inference_ms: wall_ms_of(self.last_ns.load(Relaxed)),
            in_flight: self.in_flight.load(Relaxed),
            by_via: std::array::from_fn(|i| self.by_via[i].load(Relaxed)),
            request_hist: self.request.snapshot(),
            queue_hist: self.queue.snapshot(),
            compute_hist: self.compute.snapshot(),
        }
    }
}

/// Milliseconds since the Unix epoch of the monotonic time `mono_ns` (0
/// stays 0: never).
fn wall_ms_of(mono_ns: u64) -> u64 {
    if mono_ns == 0 {
        return 0;
    }
    let ago = monotonic_ns().saturating_sub(mono_ns);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    now.saturating_sub(ago) / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline(stamps: [u64; 6]) -> Timeline {
        Timeline::from_stamps(stamps)
    }

    #[test]
    fn a_success_splits_its_time_into_the_four_stages() {
        let s = ModelStats::default();
        // received 1000, queued 1300, compute 1300..5300, response 5400.
        s.record_success(&timeline([1000, 1100, 1300, 1300, 5300, 5400]), true);
        s.record_success(&timeline([10_000, 0, 10_500, 12_500, 13_500, 14_000]), true);
        let v = s.snapshot();
        assert_eq!(
            v.success,
            CountNs {
                count: 2,
                ns: 4400 + 4000
            }
        );
        assert_eq!(
            v.compute_input,
            CountNs {
                count: 2,
                ns: 300 + 500
            }
        );
        assert_eq!(v.queue, CountNs { count: 2, ns: 2000 });
        assert_eq!(
            v.compute_infer,
            CountNs {
                count: 2,
                ns: 4000 + 1000
            }
        );
        assert_eq!(
            v.compute_output,
            CountNs {
                count: 2,
                ns: 100 + 500
            }
        );
        assert_eq!((v.inference_count, v.execution_count), (2, 2));
        assert_eq!(v.fail, CountNs::default());
        // 4400 and 4000 ns both fall in the (2.5 µs, 5 µs] bucket.
        assert_eq!(v.request_hist[2], 2);
        assert_eq!(v.request_hist.iter().sum::<u64>(), 2);
        // Queue waits of 0 and 2000 ns: both at most 2.5 µs, 0 in the first.
        assert_eq!((v.queue_hist[0], v.queue_hist[1]), (1, 1));
        assert_eq!((v.compute_hist[0], v.compute_hist[2]), (1, 1));
    }

    #[test]
    fn untimed_or_incomplete_timelines_count_without_durations() {
        let s = ModelStats::default();
        s.record_success(&timeline([1000, 1000, 1300, 1300, 5300, 5400]), false);
        // Timed, but the request's stamps are missing or out of order.
        s.record_success(&Timeline::default(), true);
        s.record_success(&timeline([1000, 0, 900, 1300, 5300, 5400]), true);
        let v = s.snapshot();
        assert_eq!(v.success, CountNs { count: 3, ns: 0 });
        assert_eq!(v.request_hist.iter().sum::<u64>(), 0);
        assert!(v.last_inference_ms > 0, "last_inference moves untimed too");
    }

    #[test]
    fn recent_compute_follows_timed_runs_only() {
        let s = ModelStats::default();
        assert_eq!(s.recent_compute_ns(), None, "nothing timed yet");
        s.record_success(&timeline([1000, 1000, 1300, 1300, 5300, 5400]), false);
        assert_eq!(s.recent_compute_ns(), None, "untimed runs do not count");
        // The first timed run sets it; later ones move it by 1/8.
        s.record_success(&timeline([1000, 1000, 1300, 1300, 9300, 9400]), true);
        assert_eq!(s.recent_compute_ns(), Some(8000));
        s.record_success(
            &timeline([1000, 1000, 1300, 1300, 1300 + 16_000, 20_000]),
            true,
        );
        assert_eq!(s.recent_compute_ns(), Some(8000 - 1000 + 2000));
    }

    #[test]
    fn failures_count_and_time_from_arrival() {
        let s = ModelStats::default();
        s.record_failure(0);
        let before = monotonic_ns();
        s.record_failure(before - 5_000_000);
        s.record_refused(Via::Http, 0);
        let v = s.snapshot();
        assert_eq!(v.fail.count, 3);
        assert!(
            v.fail.ns >= 5_000_000 && v.fail.ns < 5_000_000_000,
            "{}",
            v.fail.ns
        );
        assert_eq!(v.success.count, 0);
        assert_eq!(v.by_via[Via::Http as usize], 1);
        assert_eq!(v.by_via.iter().sum::<u64>(), 1);
    }

    #[test]
    fn histogram_bounds_are_inclusive_and_overflow_goes_to_inf() {
        let h = DurationHistogram::default();
        for ns in [
            0,
            1000,
            1001,
            2500,
            10_000_000_000,
            10_000_000_001,
            u64::MAX,
        ] {
            h.observe(ns);
        }
        let c = h.snapshot();
        assert_eq!(c[0], 2, "0 and 1000 ns are <= 1 µs");
        assert_eq!(c[1], 2, "1001 and 2500 ns are <= 2.5 µs");
        assert_eq!(c[DURATION_BUCKETS - 2], 1, "10 s exactly");
        assert_eq!(c[DURATION_BUCKETS - 1], 2, "over 10 s");
    }

    #[test]
    fn in_flight_and_transports() {
        let s = ModelStats::default();
        s.arrived(Via::Shm);
        s.arrived(Via::Shm);
        s.arrived(Via::Grpc);
        s.admitted();
        s.admitted();
        assert_eq!(s.in_flight(), 2);
        s.finished();
        let v = s.snapshot();
        assert_eq!(v.in_flight, 1);
        assert_eq!(v.by_via[Via::Shm as usize], 2);
        assert_eq!(v.by_via[Via::Grpc as usize], 1);
        let names: Vec<&str> = Via::ALL.iter().map(|v| v.name()).collect();
        assert_eq!(
            names,
            ["inproc", "unix", "tcp", "shm", "grpc", "http", "vsock", "other"]
        );
        for (i, v) in Via::ALL.iter().enumerate() {
            assert_eq!(*v as usize, i);
        }
    }

    #[test]
    fn last_inference_is_wall_clock_ms() {
        let s = ModelStats::default();
        assert_eq!(s.snapshot().last_inference_ms, 0, "never");
        let now = monotonic_ns();
        s.record_success(
            &timeline([now - 10, 0, now - 8, now - 6, now - 4, now]),
            true,
        );
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as u64;
        let got = s.snapshot().last_inference_ms;
        assert!(got <= wall && wall - got < 1000, "{got} vs {wall}");
    }
}
