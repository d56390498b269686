//! The hand-off floor: what `clients` blocking callers and one engine can
//! do on this machine with nothing between them.
//!
//! Each caller is a thread of this process with one request (the
//! workload's inputs, batch 1) at a time. It posts the request in its own
//! slot, rings the engine thread's doorbell if that thread sleeps, and
//! sleeps on its slot (futex) until the answer is marked; then it posts
//! the next (closed loop). The engine thread takes every posted request:
//! with batching on, up to `max_batch` of them copied into one batch (the
//! one copy the agent's tensor queues make too) and run together; off,
//! each run alone on the caller's bytes. Then it marks each answered and
//! wakes its caller, and sleeps on its doorbell when nothing is posted.
//! It never waits for company: a model whose agent has a queue delay
//! forms other batches than this.
//!
//! Two waiting policies are measured, and the floor is the better: every
//! thread sleeps at once when it has to wait ([`Waiting::Sleep`]: best
//! with more threads than cores, where a poller takes the core another
//! thread needs), or polls up to 50 µs first ([`Waiting::Poll`]: best with
//! few, where a wake-up of an idle CPU costs tens of µs).
//!
//! No transport, protocol, queue, statistics or output copies: only the
//! wake-ups and the runs any agent serving blocking callers needs. So
//! [`handoff_floor`] is what a lean hand-off gets for a closed loop of
//! that many blocking clients from this engine on this machine: a
//! reference, not a bound. An agent can beat it (batching only while the
//! engine is busy, or waiting for company, forms other batches), and
//! against pre-formed batches of the same size (nobody to wake) it shows
//! the price of waking many threads, which no agent removes while its
//! clients block.

use crate::caller::BenchError;
use crate::hist::LatencyHist;
use crate::stats::spread;
use crate::workload::Input;
use engine::{Backend, TensorView};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use transport::shm::futex;
use transport::spin::Spin;
use wire::AlignedBuf;

/// How long one sleep of a caller or the engine thread lasts at most: the
/// bound on noticing the end of a measurement.
const NAP: Duration = Duration::from_millis(10);

/// How the callers and the engine thread wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// Sleep on the futex at once.
    Sleep,
    /// Poll for up to this long, then sleep.
    Poll(Duration),
}

impl Waiting {
    /// The policies the floor takes the better of.
    pub const BOTH: [Waiting; 2] = [Waiting::Sleep, Waiting::Poll(Duration::from_micros(50))];

    /// Polls `ready` until it holds or the policy's poll is over; whether
    /// it held. The poll is the transports' own ([`Spin`]: a clock read
    /// and a yield every 64 polls), so the floor polls as the agent does.
    fn poll(self, ready: impl Fn() -> bool) -> bool {
        let budget = match self {
            Waiting::Sleep => Duration::ZERO,
            Waiting::Poll(budget) => budget,
        };
        let mut spin = Spin::new(budget, 64);
        loop {
            if ready() {
                return true;
            }
            if !spin.again() {
                return ready();
            }
        }
    }
}

/// One caller's slot, on a cache line of its own.
#[repr(align(64))]
#[derive(Default)]
struct Slot {
    /// The caller's request number (posted when it differs from what the
    /// engine thread last took).
    posted: AtomicU32,
    /// The request number last answered; the caller sleeps on it.
    answered: AtomicU32,
    /// Requests this caller completed.
    done: AtomicU64,
}

/// What the callers and the engine thread share.
struct Desk {
    slots: Vec<Slot>,
    /// Bumped by a caller that finds the engine thread asleep; the engine
    /// thread sleeps on it.
    doorbell: AtomicU32,
    /// Whether the engine thread sleeps (or is about to).
    asleep: AtomicBool,
    /// Set while the timed window lasts: callers record their round
    /// trips.
    timing: AtomicBool,
    /// Set when the measurement is over.
    stop: AtomicBool,
}

impl Desk {
    fn completed(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| s.done.load(Ordering::Relaxed))
            .sum()
    }
}

/// Bounds of one hand-off measurement.
#[derive(Clone, Copy, Debug)]
pub struct HandoffBounds {
    /// Untimed time before each repeat's count starts.
    pub warmup: Duration,
    /// Each repeat's timed window.
    pub duration: Duration,
    /// Repeats; the figure is their median.
    pub repeats: usize,
}

/// What one hand-off measurement gives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HandoffFloor {
    /// Completed requests per second.
    pub rps: f64,
    /// 99th percentile of the callers' round trips (µs).
    pub p99_us: f64,
}

/// What `clients` blocking caller threads get from `backend` through the
/// hand-off described in the module docs (`max_batch` 1: each request its
/// own run): the figures of the [`Waiting`] policy with more requests per
/// second, each figure the median over `bounds.repeats` (the policies
/// alternate within each repeat). `inputs` are one request's (first
/// dimension 1).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tensorwire_bench::handoff::{handoff_floor, HandoffBounds};
/// use tensorwire_bench::workload::Workload;
/// let w = Workload::Identity { bytes: 64 };
/// let backend = w.load_backend(1)?;
/// // One request: one row of 64 bytes (batchable along the first dimension).
/// let (dtype, _, bytes) = w.inputs(backend.signature())?.remove(0);
/// let inputs = vec![(dtype, vec![1, 64], bytes)];
/// let bounds = HandoffBounds {
///     warmup: Duration::from_millis(20),
///     duration: Duration::from_millis(50),
///     repeats: 1,
/// };
/// let floor = handoff_floor(backend.as_ref(), &inputs, 4, 4, &bounds)?;
/// assert!(floor.rps > 0.0 && floor.p99_us > 0.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn handoff_floor(
    backend: &dyn Backend,
    inputs: &[Input],
    clients: usize,
    max_batch: usize,
    bounds: &HandoffBounds,
) -> Result<HandoffFloor, BenchError> {
    if clients == 0 {
        return Err(BenchError::new(
            "the hand-off floor needs at least one client",
        ));
    }
    let mut runs: [Vec<HandoffFloor>; 2] = Default::default();
    for _ in 0..bounds.repeats.max(1) {
        for (policy, runs) in Waiting::BOTH.into_iter().zip(&mut runs) {
            runs.push(one_repeat(
                backend,
                inputs,
                clients,
                max_batch.max(1),
                policy,
                bounds,
            )?);
        }
    }
    let median = |runs: &[HandoffFloor]| HandoffFloor {
        rps: spread(&runs.iter().map(|r| r.rps).collect::<Vec<_>>()).0,
        p99_us: spread(&runs.iter().map(|r| r.p99_us).collect::<Vec<_>>()).0,
    };
    let [sleep, poll] = runs.each_ref().map(|r| median(r));
    Ok(if poll.rps > sleep.rps { poll } else { sleep })
}

fn one_repeat(
    backend: &dyn Backend,
    inputs: &[Input],
    clients: usize,
    max_batch: usize,
    waiting: Waiting,
    bounds: &HandoffBounds,
) -> Result<HandoffFloor, BenchError> {
    let desk = Desk {
        slots: (0..clients).map(|_| Slot::default()).collect(),
        doorbell: AtomicU32::new(0),
        asleep: AtomicBool::new(false),
        timing: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    };
    let mut batch = Batch::new(inputs, max_batch.min(clients))?;
    std::thread::scope(|s| {
        let engine = s.spawn(|| {
            let r = serve(&desk, backend, inputs, &mut batch, waiting);
            // Whatever ended the engine thread ends the callers too.
            desk.stop.store(true, Ordering::SeqCst);
            r
        });
        let callers: Vec<_> = desk
            .slots
            .iter()
            .map(|slot| {
                let desk = &desk;
                s.spawn(move || call(desk, slot, waiting))
            })
            .collect();
        std::thread::sleep(bounds.warmup);
        desk.timing.store(true, Ordering::Relaxed);
        let (n0, t0) = (desk.completed(), Instant::now());
        std::thread::sleep(bounds.duration);
        let (n1, t1) = (desk.completed(), Instant::now());
        desk.timing.store(false, Ordering::Relaxed);
        desk.stop.store(true, Ordering::SeqCst);
        let served = engine
            .join()
            .map_err(|_| BenchError::new("the hand-off engine thread panicked"))?;
        served?;
        let mut hist = LatencyHist::new();
        for caller in callers {
            let h = caller
                .join()
                .map_err(|_| BenchError::new("a hand-off caller thread panicked"))?;
            hist.merge(&h);
        }
        Ok(HandoffFloor {
            rps: (n1 - n0) as f64 / t1.duration_since(t0).as_secs_f64(),
            p99_us: hist.percentile_us(0.99),
        })
    })
}

/// A caller: post, wake the engine thread if it sleeps, sleep until
/// answered; until the measurement stops. Returns the round trips that
/// ended in the timed window.
fn call(desk: &Desk, slot: &Slot, waiting: Waiting) -> LatencyHist {
    let mut hist = LatencyHist::new();
    let mut seq = 0u32;
    while !desk.stop.load(Ordering::Relaxed) {
        seq = seq.wrapping_add(1);
        let sent = Instant::now();
        // SeqCst on both sides (this store, then the load of `asleep`;
        // the engine thread's store of `asleep`, then its scan): one of
        // the two always sees the other, so no post goes unnoticed.
        slot.posted.store(seq, Ordering::SeqCst);
        if desk.asleep.load(Ordering::SeqCst) {
            desk.doorbell.fetch_add(1, Ordering::SeqCst);
            let _ = futex::wake(&desk.doorbell, 1);
        }
        waiting.poll(|| slot.answered.load(Ordering::Acquire) == seq);
        while slot.answered.load(Ordering::Acquire) != seq {
            if desk.stop.load(Ordering::Relaxed) {
                return hist;
            }
            let _ = futex::wait(&slot.answered, seq.wrapping_sub(1), Some(NAP));
        }
        slot.done.fetch_add(1, Ordering::Relaxed);
        if desk.timing.load(Ordering::Relaxed) {
            hist.record(u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
    }
    hist
}

/// The engine thread: take what is posted, run it, answer, sleep when
/// nothing is.
fn serve(
    desk: &Desk,
    backend: &dyn Backend,
    inputs: &[Input],
    batch: &mut Batch,
    waiting: Waiting,
) -> Result<(), BenchError> {
    let mut taken = vec![0u32; desk.slots.len()];
    let mut ready: Vec<usize> = Vec::with_capacity(desk.slots.len());
    let alone: Vec<TensorView<'_>> = inputs
        .iter()
        .map(|(d, s, b)| TensorView::new(*d, s, b))
        .collect();
    let posted = |taken: &[u32]| {
        desk.slots
            .iter()
            .zip(taken)
            .any(|(s, t)| s.posted.load(Ordering::SeqCst) != *t)
    };
    while !desk.stop.load(Ordering::Relaxed) {
        waiting.poll(|| posted(&taken));
        ready.clear();
        for (i, slot) in desk.slots.iter().enumerate() {
            let p = slot.posted.load(Ordering::SeqCst);
            if p != taken[i] {
                taken[i] = p;
                ready.push(i);
            }
        }
        if ready.is_empty() {
            let bell = desk.doorbell.load(Ordering::SeqCst);
            desk.asleep.store(true, Ordering::SeqCst);
            if !posted(&taken) {
                let _ = futex::wait(&desk.doorbell, bell, Some(NAP));
            }
            desk.asleep.store(false, Ordering::SeqCst);
            continue;
        }
        for group in ready.chunks(batch.max_rows) {
            if batch.max_rows == 1 {
                run(backend, &alone)?;
            } else {
                batch.fill(inputs, group.len());
                run(backend, &batch.views(group.len()))?;
            }
            for &i in group {
                let slot = &desk.slots[i];
                slot.answered.store(taken[i], Ordering::Release);
                let _ = futex::wake(&slot.answered, 1);
            }
        }
    }
    Ok(())
}

fn run(backend: &dyn Backend, views: &[TensorView<'_>]) -> Result<(), BenchError> {
    backend
        .run(views)
        .map(drop)
        .map_err(|e| BenchError::new(format!("hand-off floor: {e}")))
}

/// The engine thread's batch buffers: one per input, room for `max_rows`
/// rows.
struct Batch {
    max_rows: usize,
    dtypes: Vec<wire::DType>,
    shapes: Vec<Vec<u64>>,
    bufs: Vec<AlignedBuf>,
}

impl Batch {
    fn new(inputs: &[Input], max_rows: usize) -> Result<Self, BenchError> {
        let dtypes = inputs.iter().map(|(d, _, _)| *d).collect();
        let mut shapes = Vec::with_capacity(inputs.len());
        let mut bufs = Vec::with_capacity(inputs.len());
        for (_, shape, data) in inputs {
            if max_rows > 1 && shape.first() != Some(&1) {
                return Err(BenchError::new(format!(
                    "cannot batch an input of shape {shape:?}: its first dimension is not 1"
                )));
            }
            shapes.push(shape.clone());
            let bytes = data.len() * if max_rows > 1 { max_rows } else { 0 };
            bufs.push(AlignedBuf::zeroed(bytes).map_err(|e| BenchError::new(e.to_string()))?);
        }
        Ok(Batch {
            max_rows,
            dtypes,
            shapes,
            bufs,
        })
    }

    /// Copies `rows` requests' inputs into the batch (every caller sends
    /// the same bytes, so each row is a copy of `inputs`).
    fn fill(&mut self, inputs: &[Input], rows: usize) {
        for ((_, _, data), buf) in inputs.iter().zip(&mut self.bufs) {
            for row in buf.chunks_exact_mut(data.len().max(1)).take(rows) {
                row.copy_from_slice(data);
            }
        }
        for shape in &mut self.shapes {
            shape[0] = rows as u64;
        }
    }

    /// The batch of `rows` rows as engine inputs.
    fn views(&self, rows: usize) -> Vec<TensorView<'_>> {
        self.shapes
            .iter()
            .zip(&self.bufs)
            .zip(&self.dtypes)
            .map(|((shape, buf), dtype)| {
                let bytes = buf.len() / self.max_rows * rows;
                TensorView::new(*dtype, shape, &buf[..bytes])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::{EngineError, IdentityBackend, Output};
    use std::sync::atomic::AtomicUsize;
    use wire::ModelSignature;

    /// The identity model, a pause in each run, and what the runs were.
    struct Recorder {
        inner: IdentityBackend,
        pause: Duration,
        fail: bool,
        runs: AtomicUsize,
        most_rows: AtomicU64,
    }

    impl Recorder {
        fn new(pause: Duration, fail: bool) -> Self {
            Recorder {
                inner: IdentityBackend::new(),
                pause,
                fail,
                runs: AtomicUsize::new(0),
                most_rows: AtomicU64::new(0),
            }
        }
    }

    impl Backend for Recorder {
        fn signature(&self) -> &ModelSignature {
            self.inner.signature()
        }

        fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
            if self.fail {
                return Err(EngineError::InvalidInput("refused".into()));
            }
            self.runs.fetch_add(1, Ordering::Relaxed);
            self.most_rows
                .fetch_max(inputs[0].shape[0], Ordering::Relaxed);
            std::thread::sleep(self.pause);
            self.inner.run(inputs)
        }
    }

    fn bounds() -> HandoffBounds {
        HandoffBounds {
            warmup: Duration::from_millis(20),
            duration: Duration::from_millis(150),
            repeats: 1,
        }
    }

    /// One request: a row of 64 bytes.
    fn inputs() -> Vec<Input> {
        let row = AlignedBuf::zeroed(64).expect("64 bytes");
        vec![(wire::DType::U8, vec![1, 64], row)]
    }

    #[test]
    fn batching_on_runs_what_queued_meanwhile_together() {
        // Each run pauses 20 ms: while the first one runs, the callers it
        // did not take post, and the next run takes them together.
        let r = Recorder::new(Duration::from_millis(20), false);
        let floor = handoff_floor(&r, &inputs(), 8, 8, &bounds()).expect("measured");
        assert!(floor.rps > 0.0);
        assert!(floor.p99_us >= 20_000.0, "each run pauses 20 ms: {floor:?}");
        assert!(r.most_rows.load(Ordering::Relaxed) >= 2);
    }

    #[test]
    fn batching_off_runs_each_request_alone() {
        let r = Recorder::new(Duration::from_millis(1), false);
        let floor = handoff_floor(&r, &inputs(), 8, 1, &bounds()).expect("measured");
        assert!(floor.rps > 0.0);
        assert_eq!(r.most_rows.load(Ordering::Relaxed), 1);
        assert!(r.runs.load(Ordering::Relaxed) >= 8);
    }

    #[test]
    fn polling_ends_when_ready_or_after_its_budget() {
        let poll = Waiting::Poll(Duration::from_millis(2));
        assert!(poll.poll(|| true));
        let t0 = Instant::now();
        assert!(!poll.poll(|| false));
        assert!(t0.elapsed() >= Duration::from_millis(2));
        assert!(!Waiting::Sleep.poll(|| false));
    }

    #[test]
    fn an_engine_error_ends_the_measurement_with_it() {
        let r = Recorder::new(Duration::ZERO, true);
        let e = handoff_floor(&r, &inputs(), 4, 4, &bounds()).expect_err("the engine refuses");
        assert!(e.0.contains("refused"), "{}", e.0);
        assert!(handoff_floor(&r, &inputs(), 0, 4, &bounds()).is_err());
    }
}
