//! [`Batcher`]: dynamic batching, so a busy model runs the requests that
//! wait for it together, one engine run per batch.
//!
//! A model with `max_batch > 1` batches along its first dimension: requests
//! whose inputs agree in everything but the first dimension (dtype and the
//! other dims, input by input) can share a run, their inputs stacked along
//! it, and each gets back its own rows of every output.
//!
//! The flow, on the requests' own threads (there is no batching thread: the
//! [`ModelQueue`] admits one request, which leads):
//!
//! 1. A request that finds the model free, with no queue delay to wait
//!    out, runs alone at once on its inputs where they lie (no copy): a
//!    model batches only when it is busy.
//! 2. Otherwise it is *staged*: each input is copied once into its
//!    model's **tensor queue** for that input, a [`TensorRing`] (a memfd
//!    mapped twice back to back), in arrival order; then it waits in line
//!    as a `Member`. A request that finds a queue without room (or one
//!    that cannot be made) is not staged: it waits in line on its own
//!    bytes and runs alone, so what the batcher holds is bounded by its
//!    rings. A request the queue would refuse at once (full, or a priority
//!    the model lacks) is refused before anything is copied.
//! 3. When its turn comes it leads: it takes the compatible members behind
//!    it (`ModelQueue::take_followers`: best turn first, up to
//!    `max_batch` rows, waiting up to `max_queue_delay` for a preferred
//!    size). Members staged back to back in every ring form the batch in
//!    place: the ring's second mapping makes even a batch that wraps past
//!    the ring's end one contiguous tensor, which the engine reads without
//!    a further copy. Otherwise (priorities reordered them) the batch is
//!    gathered into one buffer: a second copy, counted.
//! 4. After the run each member gets its rows of each output (a copy of
//!    those rows; an output that aliases an input — identity — is answered
//!    by that member's own input, no copy), and is woken.
//!
//! A batch the engine refuses (a bad value in one request) is split in
//! halves and each half run again, down to single requests, so only the
//! requests that fail alone fail (one bad request in a batch of n costs
//! about 2·log2(n) extra runs, not n), and their answer says their batch
//! failed first. A model whose outputs turn out not to be batched along
//! the first dimension runs its members one at a time.

use crate::queue::{Ask, ModelQueue, Refused, Turn};
use crate::registry::ModelEntry;
use crate::tenants::Tenant;
use engine::{EngineError, Output, OutputData, TensorView};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use transport::shm::{RingSpan, TensorRing};
use wire::{monotonic_ns, AlignedBuf, DType, Stage, Timeline};

/// Bytes of each tensor queue (one per model input; memory is taken as it
/// is touched). A request that finds its queue full is staged in a buffer
/// of its own instead.
///
/// # Examples
///
/// A batch of 64 rows of 224×224×3 f32 images fits a tensor queue:
///
/// ```
/// use server::batcher::TENSOR_QUEUE_BYTES;
/// assert!(64 * 224 * 224 * 3 * 4 <= TENSOR_QUEUE_BYTES);
/// ```
pub const TENSOR_QUEUE_BYTES: usize = 64 << 20;

/// The most rows a batch may have (`max_batch`).
///
/// # Examples
///
/// This constant and [`MAX_QUEUE_DELAY`] bound what
/// [`BatchPolicy::validate`] accepts:
///
/// ```
/// use server::batcher::{BatchPolicy, MAX_BATCH_LIMIT, MAX_QUEUE_DELAY};
/// let most = BatchPolicy { max_batch: MAX_BATCH_LIMIT, max_queue_delay: MAX_QUEUE_DELAY, preferred: vec![] };
/// assert!(most.validate().is_ok());
/// assert!(BatchPolicy { max_batch: MAX_BATCH_LIMIT + 1, ..most.clone() }.validate().is_err());
/// assert!(BatchPolicy { max_queue_delay: MAX_QUEUE_DELAY * 2, ..most }.validate().is_err());
/// ```
pub const MAX_BATCH_LIMIT: usize = 4096;

/// How long after a tensor queue could not be made none is tried again.
const RING_RETRY: Duration = Duration::from_secs(1);

/// The longest queue delay a model may set. Example: [`MAX_BATCH_LIMIT`].
pub const MAX_QUEUE_DELAY: Duration = Duration::from_secs(10);

/// How a model forms batches (Triton's dynamic batcher settings).
///
/// An agent builds one per model from its [`ModelConfig`](crate::ModelConfig)
/// (`max_batch`, `max_queue_delay_us`, `preferred_batch_sizes`;
/// [`ModelConfig::batch_policy`](crate::ModelConfig::batch_policy)).
///
/// # Examples
///
/// Batches of up to 8 rows, stopping at 4 or 8, the first request waiting
/// at most 200 µs for company; the agent serving a model with it:
///
/// ```
/// use server::batcher::BatchPolicy;
/// use std::time::Duration;
/// let p = BatchPolicy {
///     max_batch: 8,
///     max_queue_delay: Duration::from_micros(200),
///     preferred: vec![4, 8],
/// };
/// p.validate()?;
/// assert!(p.is_on());
///
/// let mut m = server::ModelConfig::new(
///     "digits",
///     concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/build/digits_mlp.onnx"),
/// );
/// (m.max_batch, m.max_queue_delay_us, m.preferred_batch_sizes) = (8, 200, vec![8, 4]);
/// assert_eq!(m.batch_policy(), p);
/// let mut cfg = server::AgentConfig::default();
/// cfg.models.push(m);
/// let agent = server::Agent::start(cfg)?;
/// let digits = agent.core().registry.find("digits").ok_or("served")?;
/// assert_eq!(*digits.batcher.policy(), p);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPolicy {
    /// The most rows (first-dimension entries) in one run; 1: no batching.
    pub max_batch: usize,
    /// How long the first request of a batch may wait for more while
    /// neither `max_batch` nor a preferred size is reached.
    pub max_queue_delay: Duration,
    /// Batch sizes (rows) to prefer: the batch stops growing at one, and a
    /// batch larger than the largest one reachable is cut to it (the rest
    /// wait for the next run). Empty: as large as possible.
    pub preferred: Vec<usize>,
}

impl Default for BatchPolicy {
    /// No batching.
    fn default() -> Self {
        BatchPolicy {
            max_batch: 1,
            max_queue_delay: Duration::ZERO,
            preferred: Vec::new(),
        }
    }
}

impl BatchPolicy {
    /// Whether requests may share runs.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::batcher::BatchPolicy;
    /// assert!(!BatchPolicy::default().is_on()); // max_batch 1
    /// ```
    pub fn is_on(&self) -> bool {
        self.max_batch > 1
    }

    /// Checks the settings; the message names the bad one.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::batcher::BatchPolicy;
    /// let p = BatchPolicy { max_batch: 4, preferred: vec![8], ..BatchPolicy::default() };
    /// assert_eq!(
    ///     p.validate().unwrap_err(),
    ///     "preferred_batch_sizes must each be 1..=4 (max_batch), not 8"
    /// );
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_BATCH_LIMIT).contains(&self.max_batch) {
            return Err(format!(
                "max_batch must be 1..={MAX_BATCH_LIMIT}, not {}",
                self.max_batch
            ));
        }
        if self.max_queue_delay > MAX_QUEUE_DELAY {
            return Err(format!(
                "max_queue_delay_us must be at most {} (10 s), not {}",
                MAX_QUEUE_DELAY.as_micros(),
                self.max_queue_delay.as_micros()
            ));
        }
        if let Some(&bad) = self
            .preferred
            .iter()
            .find(|&&p| p == 0 || p > self.max_batch)
        {
            return Err(format!(
                "preferred_batch_sizes must each be 1..={} (max_batch), not {bad}",
                self.max_batch
            ));
        }
        Ok(())
    }

    /// Whether a batch of `rows` stops growing: `max_batch` reached, or a
    /// preferred size.
    pub(crate) fn is_reached(&self, rows: usize) -> bool {
        rows >= self.max_batch
            || self.preferred.contains(&rows)
            || self.preferred.iter().max().is_some_and(|&p| rows >= p)
    }

    /// How many of the candidate followers (their rows, in the order they
    /// would join a leader of `leader_rows`) to take: all of them, or with
    /// preferred sizes, the longest prefix that makes a preferred size (if
    /// any prefix does).
    pub(crate) fn keep(&self, leader_rows: usize, rows: impl Iterator<Item = usize>) -> usize {
        if self.preferred.is_empty() {
            return rows.count();
        }
        let (mut total, mut best, mut n) = (leader_rows, None, 0);
        if self.preferred.contains(&total) {
            best = Some(0);
        }
        for r in rows {
            total += r;
            n += 1;
            if self.preferred.contains(&total) {
                best = Some(n);
            }
        }
        best.unwrap_or(n)
    }
}

/// A model's batcher: its policy and its tensor queues.
///
/// Each model of the registry has one
/// ([`ModelEntry::batcher`](crate::registry::ModelEntry::batcher)).
///
/// # Examples
///
/// Which requests can share a run:
///
/// ```
/// use engine::TensorView;
/// use server::batcher::{BatchPolicy, Batcher};
/// use server::queue::ModelQueue;
/// use std::time::Duration;
/// use wire::DType;
/// let q = ModelQueue::new(1);
/// let x = [0u8; 8 * 16];
/// let two_rows = [TensorView::new(DType::F32, &[2, 4], &x[..32])];
/// let eight_rows = [TensorView::new(DType::F32, &[8, 4], &x)];
///
/// let b = Batcher::new(BatchPolicy { max_batch: 4, ..BatchPolicy::default() });
/// assert!(b.runs_alone(&q, &two_rows)); // the model is free, no delay to wait out
/// assert!(b.runs_alone(&q, &eight_rows)); // more rows than max_batch
///
/// let waits = Batcher::new(BatchPolicy {
///     max_batch: 4,
///     max_queue_delay: Duration::from_micros(100),
///     preferred: vec![],
/// });
/// assert!(!waits.runs_alone(&q, &two_rows)); // it waits 100 µs for company
/// assert_eq!(waits.policy().max_batch, 4);
/// ```
#[derive(Debug)]
pub struct Batcher {
    policy: BatchPolicy,
    /// Bytes of each tensor queue.
    queue_bytes: usize,
    /// One ring per input index, made when first needed. The lock also
    /// orders staging, so members are staged in the same order in every
    /// ring.
    rings: Mutex<Staging>,
}

#[derive(Debug, Default)]
struct Staging {
    rings: Vec<Option<TensorRing>>,
    /// Members staged so far: the order of staging.
    staged: u64,
    /// When making a ring last failed (then none is tried for a second:
    /// requests run alone meanwhile).
    failed_at: Option<Instant>,
}

/// The part of a waiting request its leader needs: its inputs' staged
/// bytes and how they stack, and where its outcome goes.
#[derive(Debug)]
pub(crate) struct Member {
    /// Per input: dtype and the dims after the first.
    key: Vec<(DType, Vec<u64>)>,
    /// Rows: the inputs' common first dimension.
    rows: usize,
    /// Per input, its bytes in that input's tensor queue.
    inputs: Vec<RingSpan>,
    /// When it was staged, among the model's members.
    staged_at: u64,
    /// Set (under the queue's lock) when a leader takes it.
    taken: AtomicBool,
    /// The condition variable it sleeps on in line (set by the queue as it
    /// joins the line): its leader wakes it there once it is answered.
    wake: std::sync::OnceLock<std::sync::Arc<Condvar>>,
    outcome: Mutex<Delivery>,
    answered: Condvar,
    /// The connection its request came on, if a session named one
    /// ([`crate::queue::watch_caller`]): a member whose connection has
    /// closed by the time its batch forms is left out of the run.
    caller: MemberCaller,
}

/// A member's connection (`Caller` is not `Debug`: this says whether there
/// is one).
struct MemberCaller(Option<crate::queue::Caller>);

impl std::fmt::Debug for MemberCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Some(connection)"
        } else {
            "None"
        })
    }
}

/// A member's outcome on its way from its leader.
#[derive(Debug, Default)]
enum Delivery {
    /// Not answered yet.
    #[default]
    Pending,
    /// Answered, not yet read.
    Ready(Outcome),
    /// Read by the member.
    Read,
}

/// What a leader tells a member: its result and the run's times.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Left out of the run: its connection had closed
    /// ([`Refused::CallerGone`]); `result` is then unused.
    gone: bool,
    result: std::thread::Result<Result<Vec<Output>, EngineError>>,
    /// When the batch was formed and the engine started and ended (ns).
    formed: u64,
    start: u64,
    end: u64,
}

impl Outcome {
    /// The outcome of a member left out because its connection closed.
    fn gone() -> Outcome {
        let t = monotonic_ns();
        Outcome {
            gone: true,
            result: Err(Box::new("its connection closed before its batch ran")),
            formed: t,
            start: t,
            end: t,
        }
    }
}

impl Member {
    /// Its rows.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Whether it can share a run with `other`: every input agrees in
    /// dtype and in every dim but the first.
    pub(crate) fn fits_with(&self, other: &Member) -> bool {
        self.key == other.key
    }

    /// Its place in staging order.
    pub(crate) fn staged_at(&self) -> u64 {
        self.staged_at
    }

    /// Marks it taken by a leader (the queue's lock is held).
    pub(crate) fn mark_taken(&self) {
        self.taken.store(true, Ordering::Release);
    }

    /// Whether a leader took it.
    pub(crate) fn is_taken(&self) -> bool {
        self.taken.load(Ordering::Acquire)
    }

    /// Records the condition variable it sleeps on in line.
    pub(crate) fn set_wake(&self, cv: &std::sync::Arc<Condvar>) {
        let _ = self.wake.set(cv.clone());
    }

    /// The condition variable it sleeps on in line, once it joined it.
    pub(crate) fn wake(&self) -> Option<&Condvar> {
        self.wake.get().map(|c| &**c)
    }

    /// Whether the connection its request came on has closed (a zero-
    /// timeout poll; never for a request without one).
    fn caller_gone(&self) -> bool {
        self.caller
            .0
            .as_ref()
            .is_some_and(|c| transport::hung_up(c.as_fd()))
    }

    /// Whether its leader has not answered it yet.
    fn is_pending(&self) -> bool {
        matches!(
            *self.outcome.lock().unwrap_or_else(|e| e.into_inner()),
            Delivery::Pending
        )
    }

    /// Hands it its outcome, unless it has one already.
    fn answer(&self, o: Outcome) {
        let mut slot = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*slot, Delivery::Pending) {
            *slot = Delivery::Ready(o);
            self.answered.notify_one();
        }
    }

    fn wait_outcome(&self) -> Outcome {
        let mut slot = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Delivery::Ready(o) = std::mem::replace(&mut *slot, Delivery::Read) {
                return o;
            }
            *slot = Delivery::Pending;
            slot = self.answered.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Views of its staged inputs with their own shapes.
    fn views<'a>(&'a self, shapes: &'a [Vec<u64>]) -> Vec<TensorView<'a>> {
        self.key
            .iter()
            .zip(shapes)
            .zip(&self.inputs)
            .map(|(((dtype, _), shape), span)| TensorView::new(*dtype, shape, span.bytes()))
            .collect()
    }

    /// Its inputs' full shapes.
    fn shapes(&self) -> Vec<Vec<u64>> {
        self.key
            .iter()
            .map(|(_, dims)| {
                let mut s = Vec::with_capacity(dims.len() + 1);
                s.push(self.rows as u64);
                s.extend_from_slice(dims);
                s
            })
            .collect()
    }
}

/// The result of a run as the dispatcher maps it: refused by the queue, or
/// the engine's answer (a panic caught). Example: [`run`].
pub type RunResult = Result<std::thread::Result<Result<Vec<Output>, EngineError>>, Refused>;

impl Batcher {
    /// A batcher with `policy` (checked: [`BatchPolicy::validate`]).
    /// Example: [`Batcher`].
    pub fn new(policy: BatchPolicy) -> Batcher {
        Batcher::with_queue_bytes(policy, TENSOR_QUEUE_BYTES)
    }

    /// A batcher whose tensor queues hold `bytes` each (rounded up to
    /// pages).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::batcher::{BatchPolicy, Batcher};
    /// let b = Batcher::with_queue_bytes(BatchPolicy { max_batch: 16, ..BatchPolicy::default() }, 1 << 20);
    /// assert!(b.policy().is_on());
    /// ```
    pub fn with_queue_bytes(policy: BatchPolicy, bytes: usize) -> Batcher {
        Batcher {
            policy,
            queue_bytes: bytes,
            rings: Mutex::new(Staging::default()),
        }
    }

    /// Its policy. Examples: [`Batcher`], [`BatchPolicy`].
    pub fn policy(&self) -> &BatchPolicy {
        &self.policy
    }

    /// The rows of a request that may share a run: every input has a
    /// first dimension, the same one, between 1 and `max_batch`.
    fn rows_of(&self, inputs: &[TensorView<'_>]) -> Option<usize> {
        if !self.policy.is_on() || inputs.is_empty() {
            return None;
        }
        let rows = *inputs[0].shape.first()?;
        let same = inputs.iter().all(|t| t.shape.first() == Some(&rows));
        let rows = usize::try_from(rows).ok()?;
        (same && (1..=self.policy.max_batch).contains(&rows)).then_some(rows)
    }

    /// Copies `inputs` into the tensor queues as a member of `rows` rows
    /// (counted on `model`); `None` when a queue has no room for them now
    /// (or cannot be made): the request then runs alone on its own bytes.
    fn stage(&self, model: &ModelEntry, inputs: &[TensorView<'_>], rows: usize) -> Option<Member> {
        let mut spans = Vec::with_capacity(inputs.len());
        let staged_at = {
            let mut st = self.rings.lock().unwrap_or_else(|e| e.into_inner());
            if st.rings.len() < inputs.len() {
                if st.failed_at.is_some_and(|t| t.elapsed() < RING_RETRY) {
                    return None;
                }
                for i in st.rings.len()..inputs.len() {
                    // memfd names are at most 249 bytes; this one only shows
                    // in /proc.
                    let name: String = format!("tw-tensor-queue-{i}-{}", model.signature().name)
                        .chars()
                        .take(200)
                        .collect();
                    match TensorRing::new(&name, self.queue_bytes) {
                        Ok(r) => st.rings.push(Some(r)),
                        Err(e) => {
                            eprintln!(
                                "tensorwire agent: model '{}': no tensor queue for input {i} \
                                 ({e}); its requests run alone for now",
                                model.signature().name
                            );
                            st.failed_at = Some(Instant::now());
                            return None;
                        }
                    }
                }
            }
            for (i, t) in inputs.iter().enumerate() {
                let align = t.dtype.size().max(1);
                // Dropping the spans taken so far gives them back.
                spans.push(st.rings[i].as_ref()?.alloc(t.data.len(), align)?);
            }
            st.staged += 1;
            st.staged
        };
        // The copies happen outside the lock: each span is this member's.
        for (t, span) in inputs.iter().zip(spans.iter_mut()) {
            crate::movers().move_bytes(span.bytes_mut(), t.data);
        }
        let bytes: usize = inputs.iter().map(|t| t.data.len()).sum();
        model.stats.record_batch_copy(bytes as u64, 0, 0);
        Some(Member {
            key: inputs
                .iter()
                .map(|t| (t.dtype, t.shape[1..].to_vec()))
                .collect(),
            rows,
            inputs: spans,
            staged_at,
            taken: AtomicBool::new(false),
            wake: std::sync::OnceLock::new(),
            outcome: Mutex::new(Delivery::Pending),
            answered: Condvar::new(),
            caller: MemberCaller(crate::queue::current_caller()),
        })
    }

    /// Whether a request on `inputs` would run alone at once, on its own
    /// bytes: the model does not batch it (batching off, or not stackable),
    /// or the model is free and has no queue delay to wait out (an idle
    /// model has nobody to batch with). A hint, as
    /// [`ModelQueue::has_free_run`] is. Example: [`Batcher`].
    pub fn runs_alone(&self, queue: &ModelQueue, inputs: &[TensorView<'_>]) -> bool {
        self.rows_of(inputs).is_none()
            || (self.policy.max_queue_delay.is_zero() && queue.has_free_run())
    }

    /// The ring of input `i`, if it has one.
    fn ring(&self, i: usize) -> Option<TensorRing> {
        let st = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        st.rings.get(i).cloned().flatten()
    }
}

/// Runs a request on `model` through its queue and, when the model batches
/// and is busy, in a batch with others; stamps the queue and compute
/// stages on `tl`. Outputs are the request's own (as [`engine::Backend::run`]
/// gives them: owned, or aliasing `inputs`). A request of a tenant:
/// [`run_for`].
///
/// # Examples
///
/// ```
/// use engine::TensorView;
/// use server::{batcher, queue::Ask, ModelRegistry};
/// let registry = ModelRegistry::with_identity();
/// let model = registry.find("identity").ok_or("served")?;
/// let x = [7u8; 16];
/// let inputs = [TensorView::new(wire::DType::U8, &[16], &x)];
/// let mut tl = wire::Timeline::default();
/// let outputs = batcher::run(&model, Ask::default(), &mut tl, &inputs)?
///     .map_err(|_| "the engine panicked")??;
/// assert_eq!(outputs[0].bytes(&inputs), x);
/// assert_eq!(model.queue.stats().completed, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run(
    model: &ModelEntry,
    ask: Ask,
    tl: &mut Timeline,
    inputs: &[TensorView<'_>],
) -> RunResult {
    run_for(model, ask, None, tl, inputs)
}

/// Whether a run ended because its queue stopped it for a request whose
/// turn came first ([`ModelQueue::run_preemptible`]).
pub(crate) fn stopped<T>(r: &std::thread::Result<Result<T, engine::EngineError>>) -> bool {
    matches!(r, Ok(Err(engine::EngineError::Stopped)))
}

/// [`run`] for a request of `tenant` (`None`: no tenant): if it waits, it
/// waits at its tenant's fair start and counts in its `queued`
/// ([`ModelQueue::run_for`]); fair starts decide who leads a batch and who
/// joins it.
///
/// # Examples
///
/// A request of the tenant its session is seated as:
///
/// ```
/// use engine::TensorView;
/// use server::tenants::{file, Identity, Tenants};
/// use server::{batcher, queue::Ask, ModelRegistry};
/// use std::sync::Arc;
/// let tenants = Arc::new(Tenants::from_specs(file::parse(
///     "[[tenant]]\nname = \"default\"\nmodels = [\"*\"]\nweight = 2\n",
///     "tenants.toml",
/// )?));
/// let tenant = tenants.resolve(&Identity::REMOTE, None).map_err(|d| d.1)?;
/// let registry = ModelRegistry::with_identity();
/// let model = registry.find("identity").ok_or("served")?;
/// let x = [1u8; 4];
/// let inputs = [TensorView::new(wire::DType::U8, &[4], &x)];
/// let outputs = batcher::run_for(&model, Ask::default(), Some(&tenant), &mut wire::Timeline::default(), &inputs)?
///     .map_err(|_| "the engine panicked")??;
/// assert_eq!(outputs.len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_for(
    model: &ModelEntry,
    ask: Ask,
    tenant: Option<&Tenant>,
    tl: &mut Timeline,
    inputs: &[TensorView<'_>],
) -> RunResult {
    let backend = &model.backend;
    let b = &model.batcher;
    let queue: &ModelQueue = &model.queue;
    let alone = || std::panic::catch_unwind(AssertUnwindSafe(|| backend.run(inputs)));
    let rows = match b.rows_of(inputs) {
        Some(rows) if !b.runs_alone(queue, inputs) => rows,
        // Not stackable, or idle: nobody to batch with; run in place.
        _ => return queue.run_preemptible(ask, tenant, tl, alone, stopped),
    };
    // Refused at once (full, a level the model lacks, the tenant at its
    // max_queued): before any copy.
    queue.check_admissible(ask, tenant)?;
    let queued_at = Instant::now();
    let Some(me) = b.stage(model, inputs, rows) else {
        // No room in a tensor queue: wait on its own bytes, run alone.
        return queue.run_preemptible(ask, tenant, tl, alone, stopped);
    };
    let me = std::sync::Arc::new(me);
    tl.stamp(Stage::Queued);
    match queue.wait_as_member(ask, tenant, &me)? {
        Turn::Taken => {
            let o = me.wait_outcome();
            if o.gone {
                return Err(Refused::CallerGone);
            }
            tl.set(Stage::ComputeStart, o.start.max(o.formed));
            tl.set(Stage::ComputeEnd, o.end);
            Ok(o.result)
        }
        Turn::Lead(slot) => {
            let followers = queue.take_followers(&me, &b.policy, queued_at);
            let answers = Answers(queue, &followers);
            // Requests whose connection closed while they waited (a killed
            // client) are answered at once and not run, the leader's too.
            let mut batch: Vec<&Member> = Vec::with_capacity(followers.len() + 1);
            let leader_gone = me.caller_gone();
            if !leader_gone {
                batch.push(&me);
            }
            for m in &followers {
                if m.caller_gone() {
                    m.answer(Outcome::gone());
                } else {
                    batch.push(m);
                }
            }
            if batch.is_empty() {
                slot.unused();
                return Err(Refused::CallerGone);
            }
            batch.sort_by_key(|m| m.staged_at);
            let (mut outcomes, start, end) = lead(model, &batch);
            // The next batch may form while this one is answered.
            drop(slot);
            let mut mine = None;
            for (m, result) in batch.iter().zip(outcomes.drain(..)) {
                if std::ptr::eq(*m, &*me) {
                    mine = Some(result);
                } else {
                    m.answer(Outcome {
                        gone: false,
                        result,
                        formed: start,
                        start,
                        end,
                    });
                }
            }
            // Wakes the members (each slept in line until now: one
            // wake-up each).
            drop(answers);
            tl.set(Stage::ComputeStart, start);
            tl.set(Stage::ComputeEnd, end);
            if leader_gone {
                return Err(Refused::CallerGone);
            }
            // The leader's result was produced for its own staged copy:
            // an alias still names its input (same bytes).
            Ok(mine.unwrap_or_else(|| Err(Box::new("the batch lost its leader's result"))))
        }
    }
}

/// When dropped, answers every member not answered yet (a leader that
/// panicked between taking members and answering them must not leave them
/// waiting forever) and wakes them all.
struct Answers<'a>(&'a ModelQueue, &'a [std::sync::Arc<Member>]);

impl Drop for Answers<'_> {
    fn drop(&mut self) {
        for m in self.1.iter().filter(|m| m.is_pending()) {
            let t = monotonic_ns();
            m.answer(Outcome {
                gone: false,
                result: Err(Box::new("the leader of its batch failed")),
                formed: t,
                start: t,
                end: t,
            });
        }
        self.0.wake_members(self.1);
    }
}

type MemberResult = std::thread::Result<Result<Vec<Output>, EngineError>>;

/// How one engine run over a group of members ended.
enum GroupRun {
    /// Each member's outputs (in group order).
    Done(Vec<MemberResult>),
    /// The run failed (or its outputs could not be split): why.
    Failed(String),
    /// Its outputs are not batched along the first dimension: running
    /// fewer members together cannot help.
    NotBatched,
}

/// Runs `batch` (in staging order): one engine run on the stacked inputs;
/// if it fails, halves of it again, down to single members (see the
/// module doc). Returns each member's result (in `batch` order) and the
/// first run's start and the last one's end.
fn lead(model: &ModelEntry, batch: &[&Member]) -> (Vec<MemberResult>, u64, u64) {
    let start = monotonic_ns();
    let mut results: Vec<Option<MemberResult>> = batch.iter().map(|_| None).collect();
    bisect(model, batch, &mut results, None);
    let results = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Box::new("a batch member was not run"))))
        .collect();
    (results, start, monotonic_ns())
}

/// Runs `group` as one batch and stores each member's result in
/// `results` (same order); a failed group of more than one is split in
/// halves. `failed`: why the larger batch this group came from failed,
/// and its size.
fn bisect(
    model: &ModelEntry,
    group: &[&Member],
    results: &mut [Option<MemberResult>],
    failed: Option<&(String, usize)>,
) {
    if group.len() == 1 {
        let m = group[0];
        let r = run_alone(model, m, &m.shapes());
        results[0] = Some(match (r, failed) {
            (Ok(Err(e)), Some((why, n))) => Ok(Err(EngineError::Run(format!(
                "{e} (run alone after the batch of {n} requests it was in failed: {why})"
            )))),
            (r, _) => r,
        });
        return;
    }
    match run_group(model, group) {
        GroupRun::Done(rs) => {
            for (slot, r) in results.iter_mut().zip(rs) {
                *slot = Some(r);
            }
        }
        GroupRun::NotBatched => {
            let why = (
                "its outputs are not batched along the first dimension".to_string(),
                group.len(),
            );
            for (i, m) in group.iter().enumerate() {
                bisect(
                    model,
                    std::slice::from_ref(m),
                    &mut results[i..=i],
                    Some(&why),
                );
            }
        }
        GroupRun::Failed(why) => {
            // The first failure names the whole batch it happened in.
            let why = failed.cloned().unwrap_or((why, group.len()));
            let half = group.len() / 2;
            let (left, right) = results.split_at_mut(half);
            bisect(model, &group[..half], left, Some(&why));
            bisect(model, &group[half..], right, Some(&why));
        }
    }
}

/// One engine run over `group` (at least two members): their inputs
/// stacked (in place in the rings when back to back, else gathered), the
/// outputs split into each member's rows.
fn run_group(model: &ModelEntry, group: &[&Member]) -> GroupRun {
    let b = &model.batcher;
    let rows: usize = group.iter().map(|m| m.rows).sum();
    let first = group[0];
    let shapes: Vec<Vec<u64>> = first
        .key
        .iter()
        .map(|(_, dims)| {
            let mut s = vec![rows as u64];
            s.extend_from_slice(dims);
            s
        })
        .collect();
    // Per input: the batch in place in its ring, or gathered.
    let rings: Vec<Option<TensorRing>> = (0..shapes.len()).map(|i| b.ring(i)).collect();
    let mut gathered: Vec<Option<AlignedBuf>> = Vec::with_capacity(shapes.len());
    let mut in_place: Vec<Option<&[u8]>> = Vec::with_capacity(shapes.len());
    let mut copied = 0u64;
    for (i, ring) in rings.iter().enumerate() {
        let spans: Vec<&RingSpan> = group.iter().map(|m| &m.inputs[i]).collect();
        match ring.as_ref().and_then(|r| r.joined(&spans)) {
            Some(bytes) => {
                in_place.push(Some(bytes));
                gathered.push(None);
            }
            None => {
                let total: usize = spans.iter().map(|s| s.len()).sum();
                let mut buf = match AlignedBuf::zeroed(total) {
                    Ok(b) => b,
                    Err(e) => return GroupRun::Failed(format!("out of memory gathering it: {e}")),
                };
                let mut at = 0;
                for s in &spans {
                    crate::movers()
                        .move_bytes(&mut buf.as_mut_slice()[at..at + s.len()], s.bytes());
                    at += s.len();
                }
                copied += total as u64;
                in_place.push(None);
                gathered.push(Some(buf));
            }
        }
    }
    model.stats.record_batch_copy(0, copied, 0);
    let views: Vec<TensorView<'_>> = first
        .key
        .iter()
        .zip(&shapes)
        .enumerate()
        .map(|(i, ((dtype, _), shape))| {
            let bytes = match (&in_place[i], &gathered[i]) {
                (Some(b), _) => *b,
                (None, Some(g)) => g.as_slice(),
                (None, None) => &[],
            };
            TensorView::new(*dtype, shape, bytes)
        })
        .collect();
    match std::panic::catch_unwind(AssertUnwindSafe(|| model.backend.run(&views))) {
        Ok(Ok(outputs)) => match split(&outputs, &views, group, rows) {
            Ok(Some((results, copied))) => {
                model.stats.record_batch_copy(0, 0, copied);
                model.stats.record_batch(group.len() as u64);
                GroupRun::Done(results)
            }
            Ok(None) => GroupRun::NotBatched,
            Err(e) => GroupRun::Failed(e),
        },
        Ok(Err(e)) => GroupRun::Failed(e.to_string()),
        Err(_) => GroupRun::Failed("the engine panicked".into()),
    }
}

/// Runs one member's staged inputs alone. An output aliasing input `n`
/// stays an alias: the member's own request input `n` has the same bytes.
fn run_alone(model: &ModelEntry, m: &Member, shapes: &[Vec<u64>]) -> MemberResult {
    let views = m.views(shapes);
    std::panic::catch_unwind(AssertUnwindSafe(|| model.backend.run(&views)))
}

/// Each member's rows of every output, and the bytes copied for them;
/// `Ok(None)` when an output's first dimension is not the batch's rows;
/// `Err` when memory for a member's rows cannot be had.
fn split(
    outputs: &[Output],
    views: &[TensorView<'_>],
    batch: &[&Member],
    rows: usize,
) -> Result<Option<(Vec<MemberResult>, u64)>, String> {
    let mut per: Vec<Vec<Output>> = batch
        .iter()
        .map(|_| Vec::with_capacity(outputs.len()))
        .collect();
    let mut copied = 0u64;
    for o in outputs {
        let bytes = o.bytes(views);
        if o.shape.first() != Some(&(rows as u64)) || bytes.len() % rows != 0 {
            return Ok(None);
        }
        let row_len = bytes.len() / rows;
        let mut at = 0;
        for (m, out) in batch.iter().zip(per.iter_mut()) {
            let mut shape = o.shape.clone();
            shape[0] = m.rows as u64;
            let len = row_len * m.rows;
            let data = match o.data {
                OutputData::Input(n) => OutputData::Input(n),
                OutputData::Owned(_) => {
                    copied += len as u64;
                    let mut b = AlignedBuf::zeroed(len)
                        .map_err(|e| format!("out of memory splitting its outputs: {e}"))?;
                    crate::movers().move_bytes(b.as_mut_slice(), &bytes[at..at + len]);
                    OutputData::Owned(b)
                }
            };
            at += len;
            out.push(Output {
                dtype: o.dtype,
                shape,
                data,
            });
        }
    }
    Ok(Some((per.into_iter().map(|o| Ok(Ok(o))).collect(), copied)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{QueuePolicy, QueueStats};
    use crate::stats::ModelStats;
    use engine::Backend;
    use std::sync::{Arc, Mutex as StdMutex};
    use wire::{ModelSignature, TensorSpec};

    /// `y = 2x + 1` per f32, rows along the first dimension; refuses a NaN
    /// (the "bad value" of one request); records the rows of each run; the
    /// first run may be held until released.
    struct Affine {
        sig: ModelSignature,
        runs: StdMutex<Vec<u64>>,
        /// The first value of each row, run by run.
        firsts: StdMutex<Vec<Vec<f32>>>,
        hold: StdMutex<Option<std::sync::mpsc::Receiver<()>>>,
    }

    impl Affine {
        fn new(first_dim: Option<u64>) -> (Arc<Affine>, std::sync::mpsc::Sender<()>) {
            let (tx, rx) = std::sync::mpsc::channel();
            let spec = |name: &str| TensorSpec {
                name: name.into(),
                dtype: DType::F32,
                shape: vec![first_dim, None],
            };
            let a = Affine {
                sig: ModelSignature {
                    name: "affine".into(),
                    inputs: vec![spec("x")],
                    outputs: vec![spec("y")],
                },
                runs: StdMutex::new(Vec::new()),
                firsts: StdMutex::new(Vec::new()),
                hold: StdMutex::new(Some(rx)),
            };
            (Arc::new(a), tx)
        }

        fn runs(&self) -> Vec<u64> {
            self.runs.lock().expect("runs").clone()
        }
    }

    impl Backend for Affine {
        fn signature(&self) -> &ModelSignature {
            &self.sig
        }
        fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
            let hold = self.hold.lock().expect("hold").take();
            if let Some(rx) = hold {
                let _ = rx.recv();
            }
            let x = &inputs[0];
            self.runs.lock().expect("runs").push(x.shape[0]);
            let row = x.data.len() / x.shape[0].max(1) as usize;
            self.firsts.lock().expect("firsts").push(
                x.data
                    .chunks(row.max(4))
                    .map(|r| f32::from_le_bytes([r[0], r[1], r[2], r[3]]))
                    .collect(),
            );
            let mut out = AlignedBuf::zeroed(x.data.len()).expect("buf");
            for (o, i) in out
                .as_mut_slice()
                .chunks_exact_mut(4)
                .zip(x.data.chunks_exact(4))
            {
                let v = f32::from_le_bytes([i[0], i[1], i[2], i[3]]);
                if v.is_nan() {
                    return Err(EngineError::InvalidInput("NaN in x".into()));
                }
                o.copy_from_slice(&(2.0 * v + 1.0).to_le_bytes());
            }
            Ok(vec![Output {
                dtype: DType::F32,
                shape: x.shape.to_vec(),
                data: OutputData::Owned(out),
            }])
        }
    }

    fn entry(
        backend: Arc<dyn Backend>,
        policy: BatchPolicy,
        queue_bytes: usize,
    ) -> Arc<ModelEntry> {
        let policy = crate::registry::batch_policy_for(backend.signature(), policy);
        Arc::new(ModelEntry {
            id: 1,
            version: 1,
            backend,
            queue: ModelQueue::with_policy(1, QueuePolicy::default()),
            batcher: Batcher::with_queue_bytes(policy, queue_bytes),
            outputs_in_place: false,
            stats: ModelStats::default(),
        })
    }

    fn batching(max_batch: usize) -> BatchPolicy {
        BatchPolicy {
            max_batch,
            ..BatchPolicy::default()
        }
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    type Answer = Result<(Vec<u64>, Vec<u8>), String>;

    /// Runs `x` (rows × cols f32) on `model` from a new thread.
    fn call(model: &Arc<ModelEntry>, x: Vec<f32>, cols: u64) -> std::thread::JoinHandle<Answer> {
        call_as(model, x, cols, None)
    }

    /// [`call`] for a request of `tenant`.
    fn call_as(
        model: &Arc<ModelEntry>,
        x: Vec<f32>,
        cols: u64,
        tenant: Option<Arc<crate::tenants::Tenant>>,
    ) -> std::thread::JoinHandle<Answer> {
        let model = model.clone();
        std::thread::spawn(move || {
            let bytes = f32s(&x);
            let shape = [x.len() as u64 / cols, cols];
            let view = [TensorView::new(DType::F32, &shape, &bytes)];
            let mut tl = Timeline::default();
            match run_for(&model, Ask::default(), tenant.as_deref(), &mut tl, &view) {
                Ok(Ok(Ok(outs))) => {
                    let o = &outs[0];
                    Ok((o.shape.clone(), o.bytes(&view).to_vec()))
                }
                Ok(Ok(Err(e))) => Err(e.to_string()),
                Ok(Err(_)) => Err("panicked".into()),
                Err(r) => Err(r.to_string()),
            }
        })
    }

    fn wait_queue(model: &ModelEntry, cond: impl Fn(QueueStats) -> bool) {
        let t0 = Instant::now();
        while !cond(model.queue.stats()) {
            assert!(
                t0.elapsed().as_secs() < 10,
                "stuck: {:?}",
                model.queue.stats()
            );
            std::thread::yield_now();
        }
    }

    /// Holds the model with a first request, queues `xs` behind it (in
    /// this order), releases it; returns the first answer and the others.
    fn batch_behind_a_held_run(
        model: &Arc<ModelEntry>,
        tx: std::sync::mpsc::Sender<()>,
        xs: Vec<(Vec<f32>, u64)>,
    ) -> (Answer, Vec<Answer>) {
        let first = call(model, vec![0.0, 0.0], 2);
        wait_queue(model, |s| s.running == 1);
        let mut waiting = Vec::new();
        for (n, (x, cols)) in xs.into_iter().enumerate() {
            waiting.push(call(model, x, cols));
            wait_queue(model, |s| s.waiting == n + 1);
        }
        tx.send(()).expect("release");
        let first = first.join().expect("first");
        let rest = waiting
            .into_iter()
            .map(|h| h.join().expect("waiter"))
            .collect();
        (first, rest)
    }

    fn expect(x: &[f32]) -> Vec<u8> {
        f32s(&x.iter().map(|v| 2.0 * v + 1.0).collect::<Vec<_>>())
    }

    #[test]
    fn a_tenants_request_joins_the_first_batch_behind_a_flood() {
        let t = crate::tenants::Tenants::from_specs(
            crate::tenants::file::parse(
                "[[tenant]]\nname = \"a\"\nuids = [1]\n[[tenant]]\nname = \"b\"\nuids = [2]\n",
                "t.toml",
            )
            .expect("tenants"),
        );
        let tenant = |uid| {
            let who = crate::tenants::Identity {
                creds: Some(transport::Credentials {
                    pid: 1,
                    uid,
                    gid: uid,
                }),
                ..crate::tenants::Identity::REMOTE
            };
            t.resolve(&who, None).expect("tenant")
        };
        let (a, b) = (tenant(1), tenant(2));
        let (affine, tx) = Affine::new(None);
        let model = entry(affine.clone(), batching(2), 1 << 20);
        let first = call(&model, vec![0.0, 0.0], 2);
        wait_queue(&model, |s| s.running == 1);
        let mut waiting = Vec::new();
        for i in 0..4 {
            waiting.push(call_as(
                &model,
                vec![10.0 + i as f32, 0.0],
                2,
                Some(a.clone()),
            ));
            wait_queue(&model, |s| s.waiting == i + 1);
        }
        waiting.push(call_as(&model, vec![99.0, 0.0], 2, Some(b.clone())));
        wait_queue(&model, |s| s.waiting == 5);
        let queued = |t: &crate::tenants::Tenant| t.usage.queued.load(Ordering::SeqCst);
        assert_eq!((queued(&a), queued(&b)), (4, 1));
        tx.send(()).expect("release");
        assert!(first.join().expect("first").is_ok());
        for w in waiting {
            assert!(w.join().expect("waiter").is_ok());
        }
        // a's first leads and takes b's (their fair starts are equal);
        // then a's second and third, then a's fourth alone.
        assert_eq!(affine.runs(), vec![1, 2, 2, 1]);
        let firsts = affine.firsts.lock().expect("firsts").clone();
        assert_eq!(firsts[1], vec![10.0, 99.0], "{firsts:?}");
        assert_eq!((queued(&a), queued(&b)), (0, 0));
    }

    #[test]
    fn waiting_requests_run_as_one_batch_with_their_own_results() {
        let (affine, tx) = Affine::new(None);
        let model = entry(affine.clone(), batching(8), 1 << 20);
        let xs: Vec<(Vec<f32>, u64)> = (0..4)
            .map(|i| (vec![i as f32, -(i as f32), 0.5 * i as f32, 7.0], 2))
            .collect();
        let (first, rest) = batch_behind_a_held_run(&model, tx, xs.clone());
        assert_eq!(first, Ok((vec![1, 2], expect(&[0.0, 0.0]))));
        for ((x, _), got) in xs.iter().zip(rest) {
            // Bit-identical: the engine computes each row the same batched
            // or not.
            assert_eq!(got, Ok((vec![2, 2], expect(x))));
        }
        assert_eq!(
            affine.runs(),
            vec![1, 8],
            "the held run, then one batch of 8 rows"
        );
        let s = model.stats.snapshot();
        assert_eq!((s.batches, s.batched_requests), (1, 4));
        assert_eq!(
            s.batch_staged_bytes,
            4 * 16,
            "each waiting request copied once"
        );
        assert_eq!(s.batch_gathered_bytes, 0, "staged back to back: no gather");
        assert_eq!(s.batch_output_bytes, 4 * 16);
    }

    #[test]
    fn a_batch_that_wraps_the_tensor_queue_is_still_read_in_place() {
        let (affine, tx) = Affine::new(None);
        let page = 4096;
        let model = entry(affine.clone(), batching(64), page);
        // A first batch makes the tensor queue (a ring of one page).
        let (_, rest) = batch_behind_a_held_run(&model, tx, vec![(vec![1.0; 250], 250)]);
        assert_eq!(rest[0], Ok((vec![1, 250], expect(&[1.0; 250]))));
        // Move the ring's head near its end: a span kept alive at 3500
        // stops the empty ring from starting at 0 again.
        let ring = model.batcher.ring(0).expect("the queue was made");
        let x = ring.alloc(3500, 1).expect("x");
        let y = ring.alloc(1, 1).expect("y");
        drop(x);
        assert_eq!(y.offset(), 3500);
        // Two 1000-byte requests staged behind a held run: the first
        // starts at 3504 and wraps past 4096, the second follows it.
        let (hold_tx, hold_rx) = std::sync::mpsc::channel();
        *affine.hold.lock().expect("hold") = Some(hold_rx);
        let xs: Vec<(Vec<f32>, u64)> = vec![(vec![2.0; 250], 250), (vec![3.0; 250], 250)];
        let (_, rest) = batch_behind_a_held_run(&model, hold_tx, xs.clone());
        for ((x, _), got) in xs.iter().zip(rest) {
            assert_eq!(got, Ok((vec![1, 250], expect(x))));
        }
        assert_eq!(affine.runs(), vec![1, 1, 1, 2]);
        let s = model.stats.snapshot();
        assert_eq!(s.batches, 1);
        // Read in place through the ring's second mapping: nothing gathered.
        assert_eq!(s.batch_gathered_bytes, 0);
        drop(y);
        assert_eq!(ring.used(), 0, "every span released");
    }

    #[test]
    fn a_bad_request_fails_alone_and_its_batch_mates_succeed() {
        let (affine, tx) = Affine::new(None);
        let model = entry(affine.clone(), batching(8), 1 << 20);
        let xs = vec![
            (vec![1.0, 2.0], 2),
            (vec![f32::NAN, 2.0], 2),
            (vec![3.0, 4.0], 2),
        ];
        let (_, rest) = batch_behind_a_held_run(&model, tx, xs);
        assert_eq!(rest[0], Ok((vec![1, 2], expect(&[1.0, 2.0]))));
        assert_eq!(rest[2], Ok((vec![1, 2], expect(&[3.0, 4.0]))));
        let e = rest[1].clone().expect_err("NaN fails");
        assert!(
            e.contains("NaN") && e.contains("batch of 3 requests"),
            "the answer says its batch failed first: {e}"
        );
        // Held run, the failed batch of 3, its halves (the first alone, the
        // second of 2 failing again), then the second half's members alone.
        assert_eq!(affine.runs(), vec![1, 3, 1, 2, 1, 1]);
        let s = model.stats.snapshot();
        assert_eq!(
            (s.batches, s.batched_requests),
            (0, 0),
            "no batch succeeded"
        );
    }

    #[test]
    fn requests_of_other_shapes_run_in_separate_batches() {
        let (affine, tx) = Affine::new(None);
        let model = entry(affine.clone(), batching(8), 1 << 20);
        let xs = vec![
            (vec![1.0, 2.0], 2),
            (vec![1.0, 2.0, 3.0], 3),
            (vec![3.0, 4.0], 2),
            (vec![5.0, 6.0, 7.0], 3),
        ];
        let (_, rest) = batch_behind_a_held_run(&model, tx, xs.clone());
        for ((x, cols), got) in xs.iter().zip(rest) {
            assert_eq!(got, Ok((vec![1, *cols], expect(x))));
        }
        let mut runs = affine.runs();
        runs.sort_unstable();
        assert_eq!(
            runs,
            vec![1, 2, 2],
            "held, then the 2-col pair and the 3-col pair"
        );
    }

    #[test]
    fn max_batch_and_preferred_sizes_bound_a_batch() {
        let (affine, tx) = Affine::new(None);
        let model = entry(
            affine.clone(),
            BatchPolicy {
                max_batch: 4,
                max_queue_delay: Duration::ZERO,
                preferred: vec![2],
            },
            1 << 20,
        );
        let xs = (0..5).map(|i| (vec![i as f32], 1)).collect();
        let (_, rest) = batch_behind_a_held_run(&model, tx, xs);
        assert!(rest.iter().all(|r| r.is_ok()), "{rest:?}");
        // Five waiting, preferred size 2: 2, 2, then the last alone.
        assert_eq!(affine.runs(), vec![1, 2, 2, 1]);
    }

    #[test]
    fn a_queue_delay_gathers_requests_that_arrive_in_it() {
        let (affine, tx) = Affine::new(None);
        drop(tx);
        *affine.hold.lock().expect("hold") = None;
        let model = entry(
            affine.clone(),
            BatchPolicy {
                max_batch: 3,
                max_queue_delay: Duration::from_secs(30),
                preferred: Vec::new(),
            },
            1 << 20,
        );
        // The model is idle: the first leads and waits (up to 30 s) until
        // three rows are there.
        let hs: Vec<_> = (0..3).map(|i| call(&model, vec![i as f32], 1)).collect();
        for (i, h) in hs.into_iter().enumerate() {
            assert_eq!(
                h.join().expect("caller"),
                Ok((vec![1, 1], expect(&[i as f32])))
            );
        }
        assert_eq!(affine.runs(), vec![3]);
    }

    #[test]
    fn a_request_that_finds_no_room_in_its_tensor_queue_waits_on_its_own_bytes() {
        let (affine, tx) = Affine::new(None);
        let model = entry(affine.clone(), batching(8), 4096);
        // 3000-byte requests: the first waiting one is staged, the second
        // finds no room and waits (then runs) alone; nothing else is held.
        let xs: Vec<(Vec<f32>, u64)> = vec![(vec![1.0; 750], 750), (vec![2.0; 750], 750)];
        let (_, rest) = batch_behind_a_held_run(&model, tx, xs.clone());
        for ((x, _), got) in xs.iter().zip(rest) {
            assert_eq!(got, Ok((vec![1, 750], expect(x))));
        }
        let s = model.stats.snapshot();
        assert_eq!(s.batch_staged_bytes, 3000, "only the first was copied");
        assert_eq!(s.batches, 0);
        assert_eq!(affine.runs(), vec![1, 1, 1]);
    }

    #[test]
    fn a_request_the_queue_refuses_is_refused_before_it_is_copied() {
        let (affine, tx) = Affine::new(None);
        let policy = crate::registry::batch_policy_for(affine.signature(), batching(8));
        let model = Arc::new(ModelEntry {
            id: 1,
            version: 1,
            backend: affine.clone(),
            queue: ModelQueue::with_policy(
                1,
                QueuePolicy {
                    max_queue: 1,
                    ..QueuePolicy::default()
                },
            ),
            batcher: Batcher::with_queue_bytes(policy, 1 << 20),
            outputs_in_place: false,
            stats: ModelStats::default(),
        });
        let first = call(&model, vec![0.0, 0.0], 2);
        wait_queue(&model, |s| s.running == 1);
        let waiting = call(&model, vec![1.0, 2.0], 2);
        wait_queue(&model, |s| s.waiting == 1);
        let refused = call(&model, vec![3.0, 4.0], 2).join().expect("caller");
        assert!(refused.expect_err("full").contains("full"));
        assert_eq!(
            model.stats.snapshot().batch_staged_bytes,
            8,
            "the refused one was not copied"
        );
        tx.send(()).expect("release");
        first.join().expect("first").expect("ok");
        assert_eq!(
            waiting.join().expect("waiter"),
            Ok((vec![1, 2], expect(&[1.0, 2.0])))
        );
    }

    #[test]
    fn a_fixed_first_dimension_turns_batching_off() {
        let (affine, _tx) = Affine::new(Some(1));
        let p = crate::registry::batch_policy_for(affine.signature(), batching(8));
        assert!(!p.is_on());
        let (affine, _tx) = Affine::new(None);
        assert!(crate::registry::batch_policy_for(affine.signature(), batching(8)).is_on());
        // An output with a fixed first dimension cannot be split back.
        let mut sig = affine.signature().clone();
        sig.outputs[0].shape[0] = Some(1);
        assert!(!crate::registry::batch_policy_for(&sig, batching(8)).is_on());
    }

    #[test]
    fn policies_are_checked_and_sizes_kept() {
        assert!(batching(0).validate().is_err());
        assert!(batching(MAX_BATCH_LIMIT + 1).validate().is_err());
        let p = BatchPolicy {
            max_batch: 8,
            max_queue_delay: Duration::from_millis(1),
            preferred: vec![4, 9],
        };
        assert!(p.validate().unwrap_err().contains("preferred"));
        let p = BatchPolicy {
            preferred: vec![2, 4],
            ..p
        };
        assert!(p.validate().is_ok());
        assert!(p.is_reached(4) && p.is_reached(2) && p.is_reached(5) && !p.is_reached(3));
        // Leader of 1 row and followers of 1, 1, 1, 1 rows: 1+3 = 4.
        assert_eq!(p.keep(1, [1, 1, 1, 1].into_iter()), 3);
        // 1 + 1 + 2 = 4 is a preferred size, 5 is not: the last waits.
        assert_eq!(p.keep(1, [1, 2, 1].into_iter()), 2);
        // No preferred size reachable: all of them.
        assert_eq!(p.keep(3, [3].into_iter()), 1);
    }
}
