//! The load generators: [`run`] drives [`Caller`]s made by a
//! [`CallerFactory`] under a [`Load`] within [`Bounds`], and returns the
//! latencies, stage splits, errors and throughput of the timed phase as a
//! [`LoadResult`].
//!
//! - **Closed loop** ([`Load::Closed`]): N client threads, each with its
//!   own caller, each calling back to back. Latency is the call's own
//!   duration.
//! - **Open loop** ([`Load::Open`]): requests are due at fixed offsets from
//!   the start (from [`crate::schedule`]); `connections` worker threads take
//!   the next due request, wait for its time and send it. Latency is
//!   measured from the request's **scheduled** time to its completion, not
//!   from when it was actually sent: when the target stalls and requests
//!   queue up behind it, the waiting is counted (no *coordinated
//!   omission*). A request sent more than 1 ms after its time counts as
//!   [`LoadResult::late`].
//!
//! In both, every thread first makes `warmup` untimed calls, then all
//! threads meet at a barrier and the timed phase starts at the same
//! instant for all. A caller that panics does not hang the others or the
//! process: the run stops and returns an error naming the thread.

use crate::caller::{BenchError, Caller, CallerFactory};
use crate::hist::{LatencyHist, StageHists};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// The most client threads or connections a load may have.
pub const MAX_THREADS: usize = 1024;

/// The longest timed phase [`Bounds::duration`] may ask for (30 days).
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// An open-loop request sent more than this after its scheduled time is
/// counted as [`LoadResult::late`].
pub const LATE_AFTER: Duration = Duration::from_millis(1);

/// An open-loop worker sleeps until this long before a request is due,
/// then yields the CPU in a loop until it is (sleeps overshoot by tens of
/// µs; a short yield loop does not, and keeps CPU use moderate).
const SPIN_BEFORE: Duration = Duration::from_micros(100);

/// The longest single sleep while waiting, so that a stop (another thread
/// failed) is noticed soon.
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// Extra time past twice the duration that an open loop keeps sending
/// requests that fell behind their schedule (see [`Load::Open`]).
const DRAIN_EXTRA: Duration = Duration::from_millis(100);

/// How much a load does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Untimed calls per client (closed loop) or connection (open loop)
    /// before the timed phase.
    pub warmup: u64,
    /// How long the timed phase lasts: the closed loop starts no call after
    /// it; the open loop skips the requests scheduled after it.
    pub duration: Option<Duration>,
    /// Timed requests in total over all threads (never exceeded).
    pub requests: Option<u64>,
}

impl Bounds {
    /// Checks that the bounds end the timed phase: at least one of
    /// `duration` and `requests`, neither of them zero, and a duration of
    /// at most [`MAX_DURATION`].
    pub fn check(&self) -> Result<(), BenchError> {
        if self.duration.is_none() && self.requests.is_none() {
            return Err(BenchError::new(
                "a load needs a duration or a request count (or both)",
            ));
        }
        if self.duration == Some(Duration::ZERO) {
            return Err(BenchError::new("the duration must be more than zero"));
        }
        if self.requests == Some(0) {
            return Err(BenchError::new("the request count must be more than zero"));
        }
        if self.duration.is_some_and(|d| d > MAX_DURATION) {
            return Err(BenchError::new(format!(
                "the duration must be at most {} s",
                MAX_DURATION.as_secs()
            )));
        }
        Ok(())
    }
}

/// How requests are issued.
#[derive(Clone, Debug, PartialEq)]
pub enum Load {
    /// N client threads, each with its own Caller, each calling back-to-back.
    Closed {
        /// Client threads (1..=[`MAX_THREADS`]).
        clients: usize,
    },
    /// Requests issued at the given offsets (ns from the start, from
    /// [`crate::schedule`]) by `connections` worker threads, each with its
    /// own Caller. Latency of request i = completion time − scheduled time
    /// of i (not the time it was actually sent), so a stalled target's
    /// queueing is measured, not hidden (coordinated omission).
    ///
    /// The run ends when every request has been sent and answered. With a
    /// [`Bounds::duration`], requests scheduled at or after it are skipped,
    /// and requests that fell behind are still sent after it until twice
    /// the duration plus 100 ms has passed; any still unsent then are
    /// counted as errors (the target could not keep up). With
    /// [`Bounds::requests`], only the first that many are sent.
    Open {
        /// Offsets from the start in ns, non-decreasing.
        offsets: Vec<u64>,
        /// Worker threads, each with its own caller (1..=[`MAX_THREADS`]).
        connections: usize,
        /// The schedule's name in results: `poisson`, `constant`, `trace`.
        label: String,
        /// The offered rate in requests per second, when there is one.
        rate: Option<f64>,
    },
}

/// What the timed phase of a load measured.
#[derive(Clone, Debug)]
pub struct LoadResult {
    /// Latencies of the timed requests that succeeded (open loop: from
    /// their scheduled time).
    pub latency: LatencyHist,
    /// Stage splits of the requests whose caller reported one.
    pub stages: StageHists,
    /// Timed requests that succeeded.
    pub completed: u64,
    /// Timed requests that failed (open loop: including those never sent
    /// because the target fell too far behind).
    pub errors: u64,
    /// Of `errors`, the requests the target refused at once without
    /// running them ([`BenchError::is_refusal`]: the agent was overloaded).
    pub refused: u64,
    /// Of `errors`, open-loop requests never sent: every connection was
    /// still waiting when the load had to stop.
    pub unsent: u64,
    /// The earliest error's message.
    pub first_error: Option<String>,
    /// The timed phase: from the common start until the last timed call
    /// returned.
    pub elapsed: Duration,
    /// `completed / elapsed`, requests per second.
    pub throughput_rps: f64,
    /// Open loop: requests sent more than [`LATE_AFTER`] after their
    /// scheduled time (the load generator or the target fell behind); 0 for
    /// the closed loop.
    pub late: u64,
}

/// Runs `load` within `bounds`, making one caller per thread with
/// `factory`.
///
/// Errors: invalid bounds or load (no thread, too many threads, offsets
/// that decrease, no request before the end of the duration), a caller
/// that cannot be made (naming the client or connection), a thread that
/// panicked or could not be started, or every timed request failing (with
/// the first error's message).
pub fn run(
    factory: &CallerFactory,
    load: &Load,
    bounds: &Bounds,
) -> Result<LoadResult, BenchError> {
    run_inner(factory, load, bounds, None)
}

/// [`run`], except that an open loop sends no request later than `stop`
/// after the start (instead of catching up until twice the duration):
/// the requests it could not send by then count as errors
/// ([`LoadResult::unsent`]). For a load that only has to cover a window,
/// such as a flood beside the load being measured.
pub fn run_stopping(
    factory: &CallerFactory,
    load: &Load,
    bounds: &Bounds,
    stop: Duration,
) -> Result<LoadResult, BenchError> {
    run_inner(factory, load, bounds, Some(stop))
}

fn run_inner(
    factory: &CallerFactory,
    load: &Load,
    bounds: &Bounds,
    stop: Option<Duration>,
) -> Result<LoadResult, BenchError> {
    bounds.check()?;
    let (threads, what, mode) = match load {
        Load::Closed { clients } => (
            *clients,
            "client",
            Mode::Closed {
                duration: bounds.duration,
                budget: bounds.requests,
            },
        ),
        Load::Open {
            offsets,
            connections,
            ..
        } => {
            if offsets.windows(2).any(|w| w[0] > w[1]) {
                return Err(BenchError::new(
                    "the open-loop schedule's offsets must be non-decreasing",
                ));
            }
            let mut n = offsets.len();
            if let Some(d) = bounds.duration {
                let d_ns = d.as_nanos();
                n = offsets.partition_point(|&o| u128::from(o) < d_ns);
            }
            if let Some(r) = bounds.requests {
                n = n.min(usize::try_from(r).unwrap_or(usize::MAX));
            }
            if n == 0 {
                return Err(BenchError::new(
                    "the open-loop schedule has no request before the end of the duration",
                ));
            }
            let drain = stop.or_else(|| {
                bounds
                    .duration
                    .map(|d| d.saturating_mul(2).saturating_add(DRAIN_EXTRA))
            });
            (
                *connections,
                "connection",
                Mode::Open {
                    offsets: &offsets[..n],
                    drain,
                },
            )
        }
    };
    if threads == 0 || threads > MAX_THREADS {
        return Err(BenchError::new(format!(
            "the number of {what}s must be between 1 and {MAX_THREADS}, not {threads}"
        )));
    }
    let mut callers: Vec<Box<dyn Caller>> = Vec::with_capacity(threads);
    for i in 0..threads {
        callers.push(factory().map_err(|e| {
            BenchError::new(format!(
                "{what} {i} of {threads}: cannot make a caller: {e}"
            ))
        })?);
    }
    let shared = Shared {
        gate: Gate::new(threads),
        stop: AtomicBool::new(false),
        next: AtomicU64::new(0),
    };
    let outs = run_threads(callers, bounds.warmup, &shared, &mode, what)?;
    let start = shared
        .gate
        .start()
        .ok_or_else(|| BenchError::new("internal error: the timed phase never started"))?;
    summarize(outs, start, &mode)
}

/// What one worker thread does in the timed phase.
enum Mode<'a> {
    /// Back to back until `duration` or the shared `budget` is used up.
    Closed {
        duration: Option<Duration>,
        budget: Option<u64>,
    },
    /// Every offset (already cut to the bounds), sending none after
    /// `drain`.
    Open {
        offsets: &'a [u64],
        drain: Option<Duration>,
    },
}

/// State the worker threads share.
struct Shared {
    /// The barrier between warm-up and the timed phase.
    gate: Gate,
    /// Set when a thread failed: everyone stops.
    stop: AtomicBool,
    /// Closed loop: timed calls taken from the budget; open loop: the next
    /// request index.
    next: AtomicU64,
}

/// A barrier that fixes the common start time and can be broken, so a
/// thread that panicked before reaching it does not leave the others
/// waiting forever.
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

struct GateState {
    waiting_for: usize,
    start: Option<Instant>,
    broken: bool,
}

impl Gate {
    fn new(threads: usize) -> Gate {
        Gate {
            state: Mutex::new(GateState {
                waiting_for: threads,
                start: None,
                broken: false,
            }),
            cv: Condvar::new(),
        }
    }

    /// Waits until every thread has arrived and returns the common start,
    /// or `None` when the gate was broken.
    fn arrive(&self) -> Option<Instant> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.waiting_for = s.waiting_for.saturating_sub(1);
        if s.waiting_for == 0 && !s.broken {
            s.start = Some(Instant::now());
            self.cv.notify_all();
        }
        // Bounded: ends when the last thread arrives or one breaks the gate.
        loop {
            if s.broken {
                return None;
            }
            if let Some(t) = s.start {
                return Some(t);
            }
            s = self.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Releases every waiting thread with `None`.
    fn break_gate(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.broken = true;
        self.cv.notify_all();
    }

    fn start(&self) -> Option<Instant> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .start
    }
}

/// One worker thread's tally.
#[derive(Default)]
struct WorkerOut {
    latency: LatencyHist,
    stages: StageHists,
    completed: u64,
    errors: u64,
    refused: u64,
    first_error: Option<(Instant, String)>,
    late: u64,
    /// When its last timed call returned.
    end: Option<Instant>,
}

impl WorkerOut {
    fn account(
        &mut self,
        r: Result<Option<crate::caller::StageSample>, BenchError>,
        latency: Duration,
        done: Instant,
    ) {
        self.end = Some(done);
        match r {
            Ok(sample) => {
                self.latency
                    .record(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
                if let Some(s) = sample {
                    self.stages.record(&s);
                }
                self.completed += 1;
            }
            Err(e) => {
                self.errors += 1;
                if e.is_refusal() {
                    self.refused += 1;
                }
                if self.first_error.is_none() {
                    self.first_error = Some((done, e.0));
                }
            }
        }
    }
}

/// Starts one thread per caller and joins them; a panic or a failed start
/// becomes an error (after every started thread has ended).
fn run_threads(
    callers: Vec<Box<dyn Caller>>,
    warmup: u64,
    shared: &Shared,
    mode: &Mode<'_>,
    what: &str,
) -> Result<Vec<WorkerOut>, BenchError> {
    let threads = callers.len();
    thread::scope(|scope| {
        let mut handles = Vec::with_capacity(threads);
        let mut failure: Option<BenchError> = None;
        for (i, mut caller) in callers.into_iter().enumerate() {
            let spawned = thread::Builder::new()
                .name(format!("bench-{what}-{i}"))
                .spawn_scoped(scope, move || {
                    let r = catch_unwind(AssertUnwindSafe(|| {
                        worker(caller.as_mut(), warmup, shared, mode)
                    }));
                    if r.is_err() {
                        shared.stop.store(true, Ordering::SeqCst);
                        shared.gate.break_gate();
                    }
                    r.map_err(|p| panic_message(p.as_ref()))
                });
            match spawned {
                Ok(h) => handles.push((i, h)),
                Err(e) => {
                    shared.stop.store(true, Ordering::SeqCst);
                    shared.gate.break_gate();
                    failure = Some(BenchError::new(format!(
                        "cannot start the thread of {what} {i}: {e}"
                    )));
                    break;
                }
            }
        }
        let mut outs = Vec::with_capacity(threads);
        for (i, h) in handles {
            match h.join() {
                Ok(Ok(out)) => outs.push(out),
                Ok(Err(msg)) => {
                    failure.get_or_insert_with(|| {
                        BenchError::new(format!("{what} {i} of {threads} panicked: {msg}"))
                    });
                }
                // The caller's destructor panicked after the work was done.
                Err(p) => {
                    let msg = panic_message(p.as_ref());
                    failure.get_or_insert_with(|| {
                        BenchError::new(format!("{what} {i} of {threads} panicked: {msg}"))
                    });
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(outs),
        }
    })
}

/// The text of a panic's payload.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// One thread: warm-up, the barrier, then the timed phase.
fn worker(caller: &mut dyn Caller, warmup: u64, shared: &Shared, mode: &Mode<'_>) -> WorkerOut {
    let mut out = WorkerOut::default();
    for _ in 0..warmup {
        // Warm-up is untimed; a failure ends it (the timed phase will show
        // whether the caller works).
        if shared.stop.load(Ordering::Relaxed) || caller.call().is_err() {
            break;
        }
    }
    let Some(start) = shared.gate.arrive() else {
        return out;
    };
    match *mode {
        Mode::Closed { duration, budget } => {
            closed_loop(caller, start, duration, budget, shared, &mut out)
        }
        Mode::Open { offsets, drain } => open_loop(caller, start, offsets, drain, shared, &mut out),
    }
    out
}

fn closed_loop(
    caller: &mut dyn Caller,
    start: Instant,
    duration: Option<Duration>,
    budget: Option<u64>,
    shared: &Shared,
    out: &mut WorkerOut,
) {
    // `Bounds::check` keeps the duration small enough for `checked_add`;
    // were it not, stop at once rather than run unbounded.
    let deadline = match duration {
        Some(d) => match start.checked_add(d) {
            Some(t) => Some(t),
            None => return,
        },
        None => None,
    };
    // Bounded: by the deadline or the budget (`Bounds::check` requires one).
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if let Some(b) = budget {
            if shared.next.fetch_add(1, Ordering::Relaxed) >= b {
                break;
            }
        }
        let t0 = Instant::now();
        let r = caller.call();
        let t1 = Instant::now();
        out.account(r, t1.saturating_duration_since(t0), t1);
    }
}

fn open_loop(
    caller: &mut dyn Caller,
    start: Instant,
    offsets: &[u64],
    drain: Option<Duration>,
    shared: &Shared,
    out: &mut WorkerOut,
) {
    let drain_end = drain.and_then(|d| start.checked_add(d));
    // Bounded: one index per turn, up to `offsets.len()`.
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        if drain_end.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        let Some(&offset) = usize::try_from(i).ok().and_then(|i| offsets.get(i)) else {
            break;
        };
        let Some(due) = start.checked_add(Duration::from_nanos(offset)) else {
            break;
        };
        if !wait_until(due, &shared.stop) {
            break;
        }
        let sent = Instant::now();
        if sent.saturating_duration_since(due) > LATE_AFTER {
            out.late += 1;
        }
        let r = caller.call();
        let done = Instant::now();
        out.account(r, done.saturating_duration_since(due), done);
    }
}

/// Waits until `due`: sleeps until [`SPIN_BEFORE`] before it, then yields
/// in a loop. Returns false when `stop` was set meanwhile.
fn wait_until(due: Instant, stop: &AtomicBool) -> bool {
    // Bounded: every turn sleeps or yields, and ends once `due` is reached.
    loop {
        let now = Instant::now();
        if now >= due {
            return true;
        }
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let left = due - now;
        if left > SPIN_BEFORE {
            thread::sleep((left - SPIN_BEFORE).min(MAX_SLEEP));
        } else {
            thread::yield_now();
        }
    }
}

/// Adds the threads' tallies up.
fn summarize(
    outs: Vec<WorkerOut>,
    start: Instant,
    mode: &Mode<'_>,
) -> Result<LoadResult, BenchError> {
    let mut latency = LatencyHist::new();
    let mut stages = StageHists::new();
    let (mut completed, mut errors, mut refused, mut late) = (0u64, 0u64, 0u64, 0u64);
    let mut first_error: Option<(Instant, String)> = None;
    let mut end = start;
    for o in outs {
        latency.merge(&o.latency);
        stages.merge(&o.stages);
        completed += o.completed;
        errors += o.errors;
        refused += o.refused;
        late += o.late;
        if let Some((t, msg)) = o.first_error {
            if first_error.as_ref().is_none_or(|(t0, _)| t < *t0) {
                first_error = Some((t, msg));
            }
        }
        if let Some(e) = o.end {
            end = end.max(e);
        }
    }
    let mut first_error = first_error.map(|(_, m)| m);
    let mut unsent = 0;
    if let Mode::Open { offsets, .. } = mode {
        unsent = (offsets.len() as u64).saturating_sub(completed + errors);
        if unsent > 0 {
            errors += unsent;
            first_error.get_or_insert_with(|| {
                format!(
                    "{unsent} scheduled requests were not sent: the target fell more than the \
                     duration behind the schedule"
                )
            });
        }
    }
    if completed == 0 {
        let msg = first_error.unwrap_or_else(|| "no request was made".to_string());
        return Err(BenchError::new(format!(
            "all {errors} timed requests failed: {msg}"
        )));
    }
    let elapsed = end.saturating_duration_since(start);
    let secs = elapsed.as_secs_f64();
    Ok(LoadResult {
        latency,
        stages,
        completed,
        errors,
        refused,
        unsent,
        first_error,
        elapsed,
        throughput_rps: if secs > 0.0 {
            completed as f64 / secs
        } else {
            0.0
        },
        late,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::{Stage, StageSample};
    use crate::schedule::{arrivals, Arrival};
    use std::sync::Arc;

    const MS: f64 = 1000.0; // µs

    /// Sleeps a fixed time per call; counts calls; may report stages.
    struct Sleeper {
        d: Duration,
        calls: Arc<AtomicU64>,
        stages: bool,
    }

    impl Caller for Sleeper {
        fn call(&mut self) -> Result<Option<StageSample>, BenchError> {
            if !self.d.is_zero() {
                thread::sleep(self.d);
            }
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(self.stages.then_some(StageSample([1_000; Stage::COUNT])))
        }
    }

    fn sleeper(
        d: Duration,
        stages: bool,
    ) -> (
        impl Fn() -> Result<Box<dyn Caller>, BenchError> + Send + Sync,
        Arc<AtomicU64>,
    ) {
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let f = move || {
            Ok(Box::new(Sleeper {
                d,
                calls: c.clone(),
                stages,
            }) as Box<dyn Caller>)
        };
        (f, calls)
    }

    fn timed(ms: u64) -> Bounds {
        Bounds {
            warmup: 2,
            duration: Some(Duration::from_millis(ms)),
            requests: None,
        }
    }

    #[test]
    fn closed_loop_one_and_four_clients() {
        let service = Duration::from_millis(2);
        let (f, _) = sleeper(service, false);
        let one = run(&f, &Load::Closed { clients: 1 }, &timed(150)).unwrap();
        let (f, _) = sleeper(service, true);
        let four = run(&f, &Load::Closed { clients: 4 }, &timed(150)).unwrap();
        for (r, clients) in [(&one, 1.0), (&four, 4.0)] {
            let p50 = r.latency.percentile_us(0.5);
            assert!((2.0 * MS..8.0 * MS).contains(&p50), "p50 {p50}");
            let ideal = clients / 0.002;
            assert!(
                r.throughput_rps > 0.25 * ideal && r.throughput_rps <= 1.02 * ideal,
                "{clients} clients: {} rps",
                r.throughput_rps
            );
            assert_eq!(r.latency.count(), r.completed);
            assert_eq!(r.errors, 0);
            assert_eq!(r.late, 0);
            assert!(r.elapsed >= Duration::from_millis(140), "{:?}", r.elapsed);
        }
        assert!(four.throughput_rps > 1.5 * one.throughput_rps);
        // Stages recorded when the caller reports them.
        assert_eq!(one.stages.count(), 0);
        assert_eq!(four.stages.count(), four.completed);
        assert_eq!(four.stages.stats()[0].p50_us, 1.0);
    }

    #[test]
    fn request_budget_is_exact() {
        let (f, calls) = sleeper(Duration::ZERO, false);
        let b = Bounds {
            warmup: 3,
            duration: None,
            requests: Some(37),
        };
        let r = run(&f, &Load::Closed { clients: 4 }, &b).unwrap();
        assert_eq!(r.completed, 37);
        assert_eq!(r.latency.count(), 37);
        assert_eq!(calls.load(Ordering::SeqCst), 37 + 4 * 3);
        // The budget ends a long duration early, too.
        let (f, calls) = sleeper(Duration::ZERO, false);
        let b = Bounds {
            warmup: 0,
            duration: Some(Duration::from_secs(60)),
            requests: Some(5),
        };
        let r = run(&f, &Load::Closed { clients: 3 }, &b).unwrap();
        assert_eq!((r.completed, calls.load(Ordering::SeqCst)), (5, 5));
    }

    fn constant(rate: f64, n: u64) -> Vec<u64> {
        arrivals(
            Arrival::Constant,
            rate,
            Duration::from_secs(3600),
            Some(n),
            0,
        )
        .unwrap()
    }

    fn open(offsets: Vec<u64>, connections: usize) -> Load {
        Load::Open {
            offsets,
            connections,
            label: "constant".into(),
            rate: None,
        }
    }

    /// Coordinated omission: one connection, requests every 2 ms, a target
    /// that takes 4 ms. Request k is due at 2k ms but can only start at
    /// about 4k ms, so its latency from the schedule is about 2k + 4 ms:
    /// the queueing is counted, not hidden. The same schedule on a fast
    /// target gives its service time.
    #[test]
    fn open_loop_counts_queueing() {
        let service = Duration::from_millis(4);
        let (f, calls) = sleeper(service, false);
        let b = timed(10_000);
        let slow = run(&f, &open(constant(500.0, 60), 1), &b).unwrap();
        assert_eq!(slow.completed, 60);
        assert_eq!(calls.load(Ordering::SeqCst), 62);
        let p50 = slow.latency.percentile_us(0.5);
        let p99 = slow.latency.percentile_us(0.99);
        // Service-time-only latencies would be ~4 ms; queueing makes the
        // median ~60 ms and the tail ~120 ms.
        assert!(p50 > 5.0 * 4.0 * MS, "p50 {p50}");
        assert!(p99 > 20.0 * 4.0 * MS, "p99 {p99}");
        assert!(slow.late > 40, "late {}", slow.late);

        let (f, _) = sleeper(Duration::from_micros(500), false);
        let fast = run(&f, &open(constant(500.0, 60), 1), &b).unwrap();
        assert_eq!(fast.completed, 60);
        let p50 = fast.latency.percentile_us(0.5);
        assert!((0.5 * MS..3.0 * MS).contains(&p50), "p50 {p50}");
        // The schedule sets the pace: 60 requests over ~118 ms.
        assert!(
            fast.elapsed >= Duration::from_millis(118),
            "{:?}",
            fast.elapsed
        );
        assert!(fast.throughput_rps < 520.0, "{}", fast.throughput_rps);
    }

    #[test]
    fn open_loop_bounds() {
        // Offsets after the duration are skipped.
        let (f, calls) = sleeper(Duration::ZERO, false);
        let offsets = vec![0, 1_000_000, 2_000_000, 500_000_000, 10_000_000_000];
        let b = Bounds {
            warmup: 0,
            duration: Some(Duration::from_millis(50)),
            requests: None,
        };
        let r = run(&f, &open(offsets, 2), &b).unwrap();
        assert_eq!((r.completed, r.errors), (3, 0));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert!(r.elapsed < Duration::from_millis(400), "{:?}", r.elapsed);
        // A request count takes the first N.
        let b = Bounds {
            warmup: 1,
            duration: None,
            requests: Some(4),
        };
        let (f, _) = sleeper(Duration::ZERO, true);
        let r = run(&f, &open(constant(10_000.0, 10), 3), &b).unwrap();
        assert_eq!((r.completed, r.stages.count()), (4, 4));
        // Nothing before the end of the duration; decreasing offsets.
        let b = Bounds {
            warmup: 0,
            duration: Some(Duration::from_millis(1)),
            requests: None,
        };
        assert!(run(&f, &open(vec![5_000_000], 1), &b).is_err());
        assert!(run(&f, &open(vec![], 1), &b).is_err());
        let e = run(&f, &open(vec![2, 1], 1), &b).unwrap_err();
        assert!(e.0.contains("non-decreasing"), "{e}");
    }

    #[test]
    fn open_loop_gives_up_on_a_stalled_target() {
        // 20 requests in 20 ms, 50 ms each: by 2 × 20 + 100 ms only 3 have
        // been sent; the other 17 count as errors.
        let (f, _) = sleeper(Duration::from_millis(50), false);
        let r = run(&f, &open(constant(1000.0, 20), 1), &timed(20)).unwrap();
        assert_eq!(r.completed + r.errors, 20);
        assert!((2..=4).contains(&r.completed), "{}", r.completed);
        let msg = r.first_error.unwrap_or_default();
        assert!(msg.contains("not sent"), "{msg}");
    }

    #[test]
    fn a_stopping_open_loop_counts_what_it_did_not_send() {
        // 20 requests in 20 ms, 50 ms each, stopped at 60 ms: two or
        // three are sent, the rest are unsent errors.
        let (f, _) = sleeper(Duration::from_millis(50), false);
        let t = Instant::now();
        let r = run_stopping(
            &f,
            &open(constant(1000.0, 20), 1),
            &timed(20),
            Duration::from_millis(60),
        )
        .unwrap();
        assert!(
            t.elapsed() < Duration::from_millis(1000),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(r.completed + r.errors, 20);
        assert!((1..=3).contains(&r.completed), "{}", r.completed);
        assert_eq!((r.unsent, r.refused), (r.errors, 0));
    }

    /// Fails every call, or every other one.
    struct Failing {
        n: u64,
        every: u64,
    }

    impl Caller for Failing {
        fn call(&mut self) -> Result<Option<StageSample>, BenchError> {
            self.n += 1;
            if self.n.is_multiple_of(self.every) {
                Err(BenchError::new(format!("boom {}", self.n)))
            } else {
                Ok(None)
            }
        }
    }

    #[test]
    fn errors_are_counted_or_fatal() {
        let all = || Ok(Box::new(Failing { n: 0, every: 1 }) as Box<dyn Caller>);
        let b = Bounds {
            warmup: 1,
            duration: None,
            requests: Some(20),
        };
        let e = run(&all, &Load::Closed { clients: 2 }, &b).unwrap_err();
        assert!(e.0.contains("all 20 timed requests failed: boom"), "{e}");
        let e = run(&all, &open(constant(10_000.0, 10), 1), &b).unwrap_err();
        assert!(e.0.contains("boom"), "{e}");

        let half = || Ok(Box::new(Failing { n: 0, every: 2 }) as Box<dyn Caller>);
        let b = Bounds {
            warmup: 0,
            duration: None,
            requests: Some(40),
        };
        let r = run(&half, &Load::Closed { clients: 2 }, &b).unwrap();
        assert_eq!(r.completed + r.errors, 40);
        assert!((10..=30).contains(&r.errors), "{}", r.errors);
        assert_eq!(r.latency.count(), r.completed);
        assert!(r.first_error.is_some_and(|m| m.starts_with("boom")));
    }

    #[test]
    fn bad_loads_and_factories() {
        let (f, _) = sleeper(Duration::ZERO, false);
        let none = Bounds {
            warmup: 0,
            duration: None,
            requests: None,
        };
        assert!(run(&f, &Load::Closed { clients: 1 }, &none).is_err());
        let ok = Bounds {
            warmup: 0,
            duration: None,
            requests: Some(1),
        };
        assert!(run(&f, &Load::Closed { clients: 0 }, &ok).is_err());
        assert!(run(
            &f,
            &Load::Closed {
                clients: MAX_THREADS + 1
            },
            &ok
        )
        .is_err());
        assert!(run(&f, &open(vec![0], 0), &ok).is_err());
        for b in [
            Bounds {
                requests: Some(0),
                ..ok.clone()
            },
            Bounds {
                duration: Some(Duration::ZERO),
                ..none.clone()
            },
            Bounds {
                duration: Some(Duration::MAX),
                ..none.clone()
            },
        ] {
            assert!(b.check().is_err(), "{b:?}");
        }
        // The third caller cannot be made.
        let made = AtomicU64::new(0);
        let flaky = move || {
            if made.fetch_add(1, Ordering::SeqCst) == 2 {
                Err(BenchError::new("refused"))
            } else {
                Ok(Box::new(Failing { n: 0, every: 1000 }) as Box<dyn Caller>)
            }
        };
        let e = run(&flaky, &Load::Closed { clients: 4 }, &ok).unwrap_err();
        assert!(
            e.0.contains("client 2 of 4") && e.0.contains("refused"),
            "{e}"
        );
    }

    /// Panics on its `at`-th call.
    struct Panicky {
        n: u64,
        at: u64,
    }

    impl Caller for Panicky {
        fn call(&mut self) -> Result<Option<StageSample>, BenchError> {
            self.n += 1;
            assert!(self.n != self.at, "caller exploded");
            thread::sleep(Duration::from_micros(200));
            Ok(None)
        }
    }

    #[test]
    fn a_panicking_caller_is_an_error_not_a_hang() {
        // One of three clients panics in warm-up (the others would wait at
        // the barrier), then one in the timed phase.
        for (at, load) in [
            (2, Load::Closed { clients: 3 }),
            (5, Load::Closed { clients: 3 }),
            (5, open(constant(2_000.0, 200), 3)),
        ] {
            let made = AtomicU64::new(0);
            let f = move || {
                let i = made.fetch_add(1, Ordering::SeqCst);
                let at = if i == 1 { at } else { u64::MAX };
                Ok(Box::new(Panicky { n: 0, at }) as Box<dyn Caller>)
            };
            let t = Instant::now();
            let e = run(&f, &load, &timed(5_000)).unwrap_err();
            assert!(
                e.0.contains("1 of 3 panicked") && e.0.contains("caller exploded"),
                "{e}"
            );
            assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        }
    }
}
