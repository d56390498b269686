//! [`ModelQueue`]: the per-model queue between sessions and the engine.
//!
//! At most `concurrency` runs of the model at once (its engine instances).
//! Whoever is admitted runs the model *on its own thread*: there are no
//! engine worker threads to hand requests to, because waking a sleeping
//! thread on the other core costs ~5 µs each way on these machines, more
//! than the whole socket round trip. When the model is busy, requests wait
//! here, and the time they wait is the timeline's queue stage.
//!
//! Who goes next is decided by the [`QueuePolicy`]: each waiter's *turn*
//! is its *start* plus `(level - 1) × aging` (level 1 is the highest),
//! and the waiter with the earliest turn goes first (between equal turns,
//! the one that came first). A request without a tenant starts when it
//! arrives; a tenant's request starts at its *fair start* (below). So a
//! higher level is served first, and no request starves: a request of
//! level `p` is ahead of every request whose start is more than
//! `(p - 1) × aging` after its own. The turn is fixed when the request
//! arrives and never moves with the clock, so the order of two waiters
//! never changes as they wait (an order that moved with the clock could
//! leave two waiters each deferring to the other with the model free).
//! The one exception is an event, not the clock: a tenant's request moves
//! up when an earlier one of its tenant leaves unserved (below), under the
//! lock, and the waiter to admit next is woken then. A request may wait
//! at most its timeout (its own, capped by the policy's default when
//! there is one); then it leaves the queue answered [`Refused::Timeout`],
//! never computed. With `max_queue` requests already waiting, one more is
//! refused at once ([`Refused::Overloaded`]).
//!
//! A request that had to wait is checked once more when its turn comes:
//! if the connection it came on has been closed meanwhile (its client was
//! killed, or gave up and hung up), it leaves answered
//! [`Refused::CallerGone`] and is not run, so a dead client's request
//! costs no engine run. The connection is the one a session names for its
//! turn on the thread ([`watch_caller`]); a request admitted at once is not
//! checked (no cost on the uncontended path), nor a front door's (HTTP/2
//! multiplexes many requests on a connection). A batch's leader checks
//! itself and the members it took when the batch forms and leaves out those
//! whose connection has closed ([`crate::batcher`]).
//!
//! ## Fairness between tenants
//!
//! A request that carries a tenant ([`crate::tenants::Tenant`], from the
//! agent's tenants file) and must wait gets its fair start from the
//! queue's *virtual clock* (start-time fair queuing, SFQ), one per
//! priority level `p`:
//!
//! ```text
//! due    = max(V_p, last_T)               where its share puts it
//! last_T = due + s × W / weight_T         where T's next request may start
//! v      = max(V_p, due of T's request b_T - 1 places ahead in line,
//!              T's request ahead)         its fair start (b_T: queue_burst)
//! V_p    = min(C, the smallest fair start of the tenants' requests
//!          waiting at level p)
//! C      = the largest fair start admitted so far (at any level), never
//!          behind now - aging; moved up to now when no tenant's request
//!          waits
//! ```
//!
//! `s` is the queue's own estimate of the time between two admissions
//! while requests wait (taken on the waiting path only: before the first
//! measure, 1 ms, or the time the line waited for the runs in progress at
//! its first admission if longer; then the mean of the first 8 measures;
//! then a moving average), and `W` the sum of the weights of the tenants
//! with requests waiting here (T's included). So `s × W / weight_T` is how
//! far apart T's requests would start if the model were shared by weight
//! among the tenants that want it now, and with `s` about right the
//! virtual clock moves at about the speed of real time: fair starts, aging
//! and the arrival times of requests without a tenant stay comparable.
//!
//! A request that leaves the line unserved (its timeout passed) gives its
//! step back: its tenant's later requests still in line move up by it
//! (their turns with them), and so does `last_T`, as far as they would be
//! had it never come, and never behind their level's `V_p` as it is then.
//!
//! `queue_burst` (`b_T`, 1 by default) lets a tenant's burst through: up
//! to `b_T` of its requests waiting at once start at `V_p` (each later
//! one where its share put the one `b_T - 1` places ahead of it), so a
//! light tenant that sends a few requests at once is not spread out
//! behind a heavy tenant's backlog; `last_T` still advances a full step
//! for each, so over time it gets its share and no more. With `b_T` = 1
//! this is plain start-time fair queuing.
//!
//! **The bound.** Take a request `r` of tenant `T` at level `p`, `T` not
//! over its share when `r` comes (`last_T` not ahead of `V_p`: then `T`
//! has no request waiting at that level). `r` starts at `V_p`. Every
//! tenant's request waiting at level `p` has a fair start of at least
//! `V_p`; `V_p` never goes back while `r` waits (admissions only raise
//! `C` and the smallest start waiting; a request joining starts at `V_p`
//! or later; a step given back moves no request behind `V_p`); a tenant's
//! fair starts never decrease, and after its first `b` (its
//! `queue_burst`) they increase strictly; equal turns go by arrival. So
//! ahead of `r` at its level are at most `b` requests of each other
//! tenant (those starting exactly at `V_p`, if any: one with the default
//! `queue_burst`), however many each has queued, and however the clock
//! got there (admissions at other levels,
//! the aging floor, steps given back). Besides those, ahead of `r` are:
//! the runs in progress; requests of higher levels whose turn comes
//! before `r`'s (a higher level `q` goes first, as without tenants: all
//! its requests starting up to `(p - q) × aging` after `V_p`, however
//! many); requests of lower levels that aged past it;
//! and requests without a tenant whose turn comes before `r`'s (their
//! start is their arrival). So: a tenant flooding the model at the same
//! level pushes another's request back by at most `b` runs (one, by
//! default), and only that request's; it is exact for that first request
//! whatever `s` is. A flood that has been waiting long has its `b` starts
//! at `V_p` behind it already (its later requests keep their spacing), so
//! in a steady flood it is about one run; and a light tenant with
//! `queue_burst` ≥ its burst has its whole burst go at that first turn.
//!
//! What it does not cover, honestly:
//!
//! - *`T`'s next requests.* They start `s × W / weight_T` apart; a tenant
//!   that already has requests in line waits its share out behind its own
//!   earlier ones. If another tenant's backlog was given its starts with
//!   `s` far too small (most often: queued while `s` was still the 1 ms
//!   default, before the model's real run time was measured), that backlog
//!   was charged too little and sits at starts close together: `T`'s first
//!   request still goes after at most one of it, but `T`'s later ones go
//!   after all of it, until it drains. With `s` too large, starts spread
//!   ahead of real time, and requests without a tenant go ahead of the
//!   tenants' ones.
//! - *Real time.* `V_p` is never floored above a fair start still waiting
//!   at its level (a floor that passed them would put a newcomer behind a
//!   whole backlog), so a backlog whose starts fell behind real time (`s`
//!   too small, or a lower level starved by higher ones) keeps `V_p`
//!   there until it drains: meanwhile aging and requests without a tenant
//!   compare with a clock that is behind, and tenants' requests at that
//!   level go ahead of requests without a tenant that arrived after their
//!   starts.
//! - *Weights.* Between tenants backlogged at the same level, admissions
//!   follow their weights (3:1 for weights 3 and 1) while `s` is steady; a
//!   change of `s` or of `W` applies to the steps given from then on.
//! - *Timeouts.* A step given back is the step the request was given; had
//!   it never come, its tenant's next one could sometimes have started
//!   earlier still (when it started at `V_p`, its successor goes back to
//!   that `V_p`, not to `last_T` before it). With `queue_burst` > 1, a
//!   request that leaves from a burst at `V_p` gives back only as much as
//!   the requests after it can move (they are at `V_p` already), so its
//!   tenant stays charged up to one step for it: the error is against
//!   the tenant that timed out, never against another.
//!
//! Requests without a tenant (no tenants file, in-process callers) keep
//! `start = arrival`: with no tenants the order is exactly what it was.
//!
//! The per-tenant state (`last_T`, its waiting requests with their starts,
//! steps and levels) lives in the queue's locked state, touched only on
//! the waiting path (a tenant's request joining or leaving scans the
//! tenants' waiting requests once: `V_p`); a tenant with nothing waiting
//! whose `last_T` is behind every level's `V_p` is dropped (it would start
//! at `V_p` anyway). A tenant's `max_queued` bounds its requests waiting in
//! all model queues (its usage's `queued`, counted from joining a line to
//! leaving it: admitted, taken into a batch, timed out): one more is
//! refused at once ([`Refused::TenantQueueFull`]). The uncontended path
//! (one compare-and-swap) looks at no tenant.
//!
//! ## Preemption
//!
//! Without it a request waits for the runs in progress, however urgent:
//! up to one whole run of the model. With [`QueuePolicy::preempt`], the
//! runs in progress count as still in line at their turns: a request that
//! joins the line while every run is taken, and whose turn comes before
//! that of a run in progress, stops the run with the latest turn (one
//! per newcomer, unless a run already being stopped will be free for
//! it). The run ends within one operator ([`engine::RunStop`]: ONNX
//! Runtime's terminate flag, on the run options of the thread that runs
//! it); the newcomer is admitted at its turn as usual; the stopped request
//! gives its run back unused and waits again at its old turn, with no
//! deadline (it was admitted once) and not counted again for its tenant,
//! and runs from the start when its turn comes. Only the order of turns
//! decides, so aging still bounds starvation: a request of level `p` is
//! stopped only by requests whose turns come before its own, those that
//! would have gone first had it waited, so it is stopped at most once by
//! each, and each stop costs it the work done so far. That work is lost
//! for the model too: under a flood of higher levels the lower ones get
//! less done ([`QueueStats::preempted`] counts the stops). Only runs
//! through [`ModelQueue::run_preemptible`] are stopped: a request run
//! alone; a batch's run is not. An engine that cannot stop (identity)
//! finishes its run, and its result is kept.
//!
//! Dynamic batching uses the same line (see [`crate::batcher`]): a
//! request that may share a run waits as a `Member`; when its turn comes
//! it *leads*: holding the run, it takes the compatible members waiting
//! behind it (in turn order, up to the batch's limit, waiting up to the
//! model's queue delay for more) along into one run. A member taken along
//! leaves the line at once; its leader answers it. Fair starts decide the
//! order there too: who leads and who joins.

use crate::batcher::{BatchPolicy, Member};
use crate::tenants::{Tenant, Usage};
use std::cell::RefCell;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use wire::{Stage, Timeline};

/// One run in progress, in [`ModelQueue::word`].
const RUNNING_ONE: u64 = 1;
/// One request waiting, in [`ModelQueue::word`].
const WAITING_ONE: u64 = 1 << 32;
const RUNNING_MASK: u64 = WAITING_ONE - 1;

/// The time between admissions the fair clock assumes before it has
/// measured one.
const DEFAULT_INTERVAL: Duration = Duration::from_millis(1);
/// Bounds of one measured interval between admissions (per request).
const MIN_INTERVAL_NS: u64 = 100;
const MAX_INTERVAL_NS: u64 = 10_000_000_000;
/// The longest gap the fair clock puts between two requests of a tenant.
const MAX_STEP: Duration = Duration::from_secs(86_400);

/// How a model's queue orders and bounds the requests that wait.
///
/// An agent builds one per model from its [`ModelConfig`](crate::ModelConfig)
/// ([`ModelConfig::queue_policy`](crate::ModelConfig::queue_policy)); a
/// program that runs its own [`ModelQueue`] builds it directly.
///
/// # Examples
///
/// Three priority levels, at most 16 waiting, 50 ms for a request that
/// names no timeout:
///
/// ```
/// use server::queue::{Ask, ModelQueue, QueuePolicy, Refused};
/// use std::time::Duration;
/// let policy = QueuePolicy {
///     max_queue: 16,
///     priority_levels: 3,
///     default_priority: 3,
///     default_timeout: Some(Duration::from_millis(50)),
///     ..QueuePolicy::default()
/// };
/// policy.validate()?;
/// let q = ModelQueue::with_policy(1, policy);
/// let mut tl = wire::Timeline::default();
/// assert_eq!(q.run(Ask { priority: 1, timeout: None }, &mut tl, || 7)?, 7);
/// // A level the model does not have is refused before it waits:
/// let r = q.run(Ask { priority: 4, timeout: None }, &mut tl, || 7);
/// assert_eq!(r, Err(Refused::BadPriority { asked: 4, levels: 3 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePolicy {
    /// The most requests that may wait; one more is refused at once
    /// ([`Refused::Overloaded`]). 0: no limit (the agent's in-flight and
    /// payload limits still bound it).
    pub max_queue: usize,
    /// Priority levels, 1 (the highest) to `priority_levels`.
    pub priority_levels: u8,
    /// The level of a request that names none (priority 0).
    pub default_priority: u8,
    /// What one level is worth in waiting time (the starvation bound; see
    /// the module doc). At most a day.
    pub aging: Duration,
    /// How long a request that names no timeout may wait; `None`: as long
    /// as it takes.
    pub default_timeout: Option<Duration>,
    /// Whether a request may name its own timeout (capped by
    /// `default_timeout` when there is one); else requests' timeouts are
    /// ignored.
    pub timeout_override: bool,
    /// Whether a request whose turn comes before that of a run in progress
    /// stops that run (which then waits again at its own turn) rather than
    /// wait for it to end (see "Preemption" in the module doc). Needs at
    /// least two priority levels.
    pub preempt: bool,
}

impl Default for QueuePolicy {
    /// No queue limit, one priority level, aging 1 s, no timeout, no
    /// preemption.
    fn default() -> Self {
        QueuePolicy {
            max_queue: 0,
            priority_levels: 1,
            default_priority: 1,
            aging: Duration::from_secs(1),
            default_timeout: None,
            timeout_override: true,
            preempt: false,
        }
    }
}

impl QueuePolicy {
    /// Checks the settings: 1 ≤ levels, default level within them, a
    /// non-zero aging. The message names the bad setting.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::queue::QueuePolicy;
    /// let mut p = QueuePolicy { priority_levels: 2, ..QueuePolicy::default() };
    /// assert!(p.validate().is_ok());
    /// p.default_priority = 3;
    /// let e = p.validate().unwrap_err();
    /// assert!(e.starts_with("default_priority must be 1..=2"), "{e}");
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        if self.priority_levels == 0 {
            return Err("priority_levels must be at least 1".into());
        }
        if self.default_priority == 0 || self.default_priority > self.priority_levels {
            return Err(format!(
                "default_priority must be 1..={} (the priority levels), not {}",
                self.priority_levels, self.default_priority
            ));
        }
        if self.preempt && self.priority_levels < 2 {
            return Err(
                "preempt needs priority_levels of at least 2 (with one level no request's turn \
                 comes before a run's)"
                    .into(),
            );
        }
        if self.aging.is_zero() || self.aging > Duration::from_secs(86_400) {
            return Err(format!(
                "priority aging must be longer than 0 and at most a day, not {:?}",
                self.aging
            ));
        }
        Ok(())
    }
}

/// What a request asks of the queue: its priority level (0: the policy's
/// default) and how long it may wait (`None`: the policy's default).
///
/// # Examples
///
/// ```
/// use server::queue::Ask;
/// assert_eq!(Ask::default(), Ask { priority: 0, timeout: None }); // the model's defaults
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// 1 = highest; 0 = the model's default level.
    pub priority: u8,
    /// The longest wait; `None` = the model's default.
    pub timeout: Option<Duration>,
}

impl Ask {
    /// The request header's fields: `priority`, and `timeout_us` (0 = none).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::queue::Ask;
    /// use std::time::Duration;
    /// let mut h = wire::Header::new(wire::Kind::Request);
    /// h.priority = 2;
    /// h.timeout_us = 1500;
    /// let a = Ask::from_header(h.priority, h.timeout_us);
    /// assert_eq!(a.timeout, Some(Duration::from_micros(1500)));
    /// assert_eq!(Ask::from_header(0, 0).timeout, None);
    /// ```
    pub fn from_header(priority: u8, timeout_us: u32) -> Ask {
        Ask {
            priority,
            timeout: (timeout_us != 0).then(|| Duration::from_micros(timeout_us.into())),
        }
    }
}

/// Why the queue did not run a request.
///
/// # Examples
///
/// A queue with room for one waiter refuses the next one at once:
///
/// ```
/// use server::queue::{Ask, ModelQueue, QueuePolicy, Refused};
/// use std::sync::Arc;
/// use std::time::Duration;
/// let q = Arc::new(ModelQueue::with_policy(1, QueuePolicy { max_queue: 1, ..QueuePolicy::default() }));
/// let (started_tx, started) = std::sync::mpsc::channel();
/// let (release, release_rx) = std::sync::mpsc::channel::<()>();
/// let runner = { let q = q.clone(); std::thread::spawn(move || {
///     q.run(Ask::default(), &mut wire::Timeline::default(), || {
///         started_tx.send(()).unwrap();
///         release_rx.recv().unwrap();
///     })
/// })};
/// started.recv()?; // the one run is taken
/// let waiter = { let q = q.clone(); std::thread::spawn(move || {
///     q.run(Ask::default(), &mut wire::Timeline::default(), || ())
/// })};
/// for _ in 0..1000 {
///     if q.stats().waiting == 1 { break; }
///     std::thread::sleep(Duration::from_millis(1));
/// }
/// let r = q.run(Ask::default(), &mut wire::Timeline::default(), || ());
/// assert_eq!(r, Err(Refused::Overloaded { max_queue: 1 }));
/// assert!(r.unwrap_err().to_string().contains("queue is full"));
/// release.send(())?;
/// runner.join().unwrap()?;
/// waiter.join().unwrap()?;
/// assert_eq!(q.stats().overloaded, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `max_queue` requests were waiting already.
    Overloaded {
        /// The limit.
        max_queue: usize,
    },
    /// The request waited its whole timeout without being admitted.
    Timeout {
        /// How long it waited.
        waited: Duration,
    },
    /// The priority is above the model's levels.
    BadPriority {
        /// What the request asked.
        asked: u8,
        /// The model's levels.
        levels: u8,
    },
    /// The request's tenant has `max_queued` requests waiting in model
    /// queues already (over all models).
    TenantQueueFull {
        /// The tenant.
        tenant: Arc<str>,
        /// Its limit.
        max_queued: u32,
    },
    /// The connection the request came on was closed while it waited (see
    /// [`watch_caller`]): it was not run.
    CallerGone,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Overloaded { max_queue } => write!(
                f,
                "the model's queue is full ({max_queue} requests wait already; retry later)"
            ),
            Refused::Timeout { waited } => write!(
                f,
                "the request waited {waited:?} in the model's queue, its whole timeout, and was \
                 not computed"
            ),
            Refused::BadPriority { asked, levels } => write!(
                f,
                "priority {asked} is not one of the model's levels (1 = highest ..= {levels}; \
                 0 = the model's default)"
            ),
            Refused::TenantQueueFull { tenant, max_queued } => write!(
                f,
                "tenant '{tenant}' has its max_queued ({max_queued}) requests waiting in model \
                 queues already; retry later"
            ),
            Refused::CallerGone => write!(
                f,
                "the client closed its connection while the request waited in the model's \
                 queue; it was not run"
            ),
        }
    }
}

impl std::error::Error for Refused {}

thread_local! {
    /// The connection the requests this thread runs came on, while a
    /// session's turn names it ([`watch_caller`]).
    static CALLER: RefCell<Option<Caller>> = const { RefCell::new(None) };
}

/// Names `conn` (a session's socket: a native connection's, or a
/// shared-memory session's control socket) as where the requests this
/// thread runs come from, until the guard drops (the one named before
/// comes back then). A request of this thread that waited in a model's
/// queue and finds `conn` closed when its turn comes is not run
/// ([`Refused::CallerGone`]).
///
/// # Examples
///
/// ```
/// use server::queue::{watch_caller, Ask, ModelQueue, Refused};
/// use std::os::unix::net::UnixStream;
/// use std::sync::{mpsc, Arc};
/// use std::time::Duration;
/// let q = Arc::new(ModelQueue::new(1));
/// // Another request holds the model until the waiting one is in line.
/// let (running, is_running) = mpsc::channel();
/// let holder = std::thread::spawn({
///     let q = q.clone();
///     move || {
///         q.run_for(Ask::default(), None, &mut wire::Timeline::default(), || {
///             running.send(()).ok();
///             while q.stats().waiting == 0 {
///                 std::thread::sleep(Duration::from_millis(1));
///             }
///         })
///     }
/// });
/// is_running.recv()?;
/// let (session_end, client_end) = UnixStream::pair()?;
/// let _watch = watch_caller(Arc::new(session_end));
/// drop(client_end); // the client is killed
/// let r = q.run_for(Ask::default(), None, &mut wire::Timeline::default(), || "ran");
/// assert!(matches!(r, Err(Refused::CallerGone)), "waited, then not run");
/// assert!(holder.join().is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn watch_caller(conn: Caller) -> CallerWatch {
    let prev = CALLER.with(|c| c.borrow_mut().replace(conn));
    CallerWatch { prev }
}

/// Names a thread's connection while it lives: [`watch_caller`].
#[must_use = "the connection is named only while the guard lives"]
pub struct CallerWatch {
    prev: Option<Caller>,
}

/// A session's connection, as [`watch_caller`] takes it: a shared handle
/// on its socket (no second descriptor).
pub type Caller = Arc<dyn AsFd + Send + Sync>;

impl std::fmt::Debug for CallerWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerWatch").finish_non_exhaustive()
    }
}

impl Drop for CallerWatch {
    fn drop(&mut self) {
        let prev = self.prev.take();
        CALLER.with(|c| *c.borrow_mut() = prev);
    }
}

/// Whether this thread's named connection (if any) has been closed.
/// The connection this thread's session named ([`watch_caller`]), if any.
pub(crate) fn current_caller() -> Option<Caller> {
    CALLER.with(|c| c.borrow().clone())
}

fn caller_gone() -> bool {
    CALLER.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|conn| transport::hung_up(conn.as_fd()))
    })
}

/// Admission to a model, `concurrency` runs at a time, in the order of a
/// [`QueuePolicy`].
///
/// A request that finds the model free and nobody waiting is admitted by
/// one compare-and-swap on its `word`, without the lock: the
/// common case of an idle or lightly used model costs two atomic
/// operations, not two lock round trips. As soon as one request has to
/// wait, every later one goes through the lock and the policy's order; the
/// fast path opens again when nobody waits.
///
/// Examples: [`QueuePolicy`], [`Refused`], [`ModelQueue::run`].
#[derive(Debug)]
pub struct ModelQueue {
    /// Runs in progress (low 32 bits) and requests waiting (high 32 bits).
    /// A run is counted here from its admission to its end.
    word: AtomicU64,
    state: Mutex<State>,
    /// Leaders waiting out their queue delay wait here (a new member
    /// wakes them); every waiter in line waits on its own condition
    /// variable ([`Waiter::wake`]), so a run ending wakes one waiter, not
    /// all of them.
    gather: Condvar,
    concurrency: usize,
    policy: QueuePolicy,
    /// Runs completed, for stats.
    completed: AtomicU64,
    /// Requests refused for a full queue, and timed out in it.
    overloaded: AtomicU64,
    timed_out: AtomicU64,
    /// Runs stopped for a request whose turn came first.
    preempted: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Arrival numbers.
    next_seq: u64,
    /// Who waits, in arrival order.
    waiters: Vec<Waiter>,
    /// Leaders waiting out their queue delay for more members (each new
    /// waiter wakes them).
    gathering: usize,
    /// The tenants' fair clock.
    fair: Fair,
    /// Runs in progress that may be stopped (preempting queues only).
    running: Vec<RunEntry>,
    /// Their numbers.
    next_run: u64,
}

/// A run in progress that a request whose turn comes first may stop.
#[derive(Debug)]
struct RunEntry {
    id: u64,
    /// Its request's turn (as in line).
    turn: Instant,
    /// Stops the engine run on the thread that runs it.
    stop: Arc<engine::RunStop>,
    /// Whether a waiter stopped it.
    stopped: bool,
}

impl State {
    /// Takes waiter `seq` out of the line (`served`: admitted, or taken
    /// into a batch), with its tenant's accounting.
    fn remove(&mut self, seq: u64, served: bool) {
        self.waiters.retain(|w| w.seq != seq);
        self.fair.left(seq, served, &mut self.waiters);
        if self.waiters.is_empty() {
            self.fair.last_grant = None;
            self.fair.line_since = None;
        }
    }
}

/// The virtual clock of the tenants' requests (see the module doc).
#[derive(Debug, Default)]
struct Fair {
    /// The largest fair start admitted, never behind `now - aging`, moved
    /// up to now when no tenant's request waits (`None` until the first
    /// tenant's request waits). A level's `V` is this, but never past the
    /// smallest fair start waiting at that level ([`Fair::clock_at`]).
    clock: Option<Instant>,
    /// Tenants with requests waiting here, or whose `last_T` is ahead of
    /// the clock.
    tenants: Vec<TenantClock>,
    /// `W`: the sum of the weights of the tenants with requests waiting.
    active_weight: u64,
    /// `s`: ns between two admissions while requests wait, per request
    /// (a moving average; 0 before the first measure).
    interval_ns: u64,
    /// Measures taken into `interval_ns` (up to [`WARM_UP`]): the first
    /// ones are averaged evenly, so a wrong first one is soon forgotten.
    samples: u32,
    /// When the line last gave a run while others still waited, and how
    /// many requests that run served (its leader and the members taken).
    last_grant: Option<(Instant, u32)>,
    /// When the first of the requests waiting now came, until the line
    /// gives a run (before the first measure, the time it waited for
    /// the runs in progress is the estimate: see [`Fair::granted`]).
    line_since: Option<Instant>,
}

/// The measures of the interval between admissions averaged evenly before
/// the moving average takes over.
const WARM_UP: u32 = 8;

/// One tenant's place on a queue's fair clock.
#[derive(Debug)]
struct TenantClock {
    /// The tenant's usage: who it is (kept across reloads of the tenants
    /// file), and its `queued` count.
    usage: Arc<Usage>,
    /// Its weight (as its latest request had it).
    weight: u32,
    /// `last_T`: the earliest fair start of its next request.
    next: Instant,
    /// The least `next` may go back to when a waiting request gives its
    /// step back, if a request served after it bounds it (see
    /// [`Queued::floor`]).
    next_floor: Option<Instant>,
    /// Its requests waiting here, in arrival order.
    waiting: Vec<Queued>,
}

/// A tenant's request waiting in line, on the fair clock.
#[derive(Clone, Copy, Debug)]
struct Queued {
    seq: u64,
    /// Its priority level.
    level: u8,
    /// Its fair start.
    start: Instant,
    /// Where its tenant's share alone put it (`max(V_p, last_T)` when it
    /// came): the start of the request `queue_burst - 1` places after it.
    due: Instant,
    /// How far it moved its tenant's `last_T` on: given back if it
    /// leaves unserved.
    step: Duration,
    /// The least its start may go back to when an earlier request of its
    /// tenant leaves unserved: its level's clock when it came (and the
    /// least start of each request of its tenant served since, plus its
    /// step: the start it would have had without the one that left).
    floor: Instant,
}

impl Fair {
    /// The clock `V` of level `level`: the stored clock, but never past
    /// the smallest fair start waiting at that level; and the same over
    /// all levels (below which a tenant starts at any level's clock).
    fn clock_at(&self, level: u8) -> (Option<Instant>, Option<Instant>) {
        let mut at_level: Option<Instant> = None;
        let mut any: Option<Instant> = None;
        for q in self.tenants.iter().flat_map(|t| &t.waiting) {
            any = Some(any.map_or(q.start, |m| m.min(q.start)));
            if q.level == level {
                at_level = Some(at_level.map_or(q.start, |m| m.min(q.start)));
            }
        }
        let cap = |m: Option<Instant>| match (self.clock, m) {
            (Some(c), Some(m)) => Some(c.min(m)),
            (c, m) => c.or(m),
        };
        (cap(at_level), cap(any))
    }

    /// The fair start of request `seq` of `tenant` at priority `level`
    /// arriving `now` (it joins the line), and `last_T` moved on.
    fn join(
        &mut self,
        tenant: &Tenant,
        seq: u64,
        level: u8,
        now: Instant,
        aging: Duration,
    ) -> Instant {
        let floor = if self.active_weight == 0 {
            // No tenant's request waits here: the clock starts again from
            // now (a busy period begins).
            Some(now)
        } else {
            now.checked_sub(aging)
        };
        self.clock = match (self.clock, floor) {
            (Some(c), Some(f)) => Some(c.max(f)),
            (c, f) => Some(c.or(f).unwrap_or(now)),
        };
        let (clock, lowest) = self.clock_at(level);
        let clock = clock.unwrap_or(now);
        let lowest = lowest.unwrap_or(clock);
        // Nothing waiting and no longer ahead of any level's clock: it
        // would start at the clock anyway.
        self.tenants
            .retain(|t| !t.waiting.is_empty() || t.next > lowest);
        let i = match self
            .tenants
            .iter()
            .position(|t| Arc::ptr_eq(&t.usage, &tenant.usage))
        {
            Some(i) => i,
            None => {
                self.tenants.push(TenantClock {
                    usage: tenant.usage.clone(),
                    weight: tenant.weight,
                    next: clock,
                    next_floor: None,
                    waiting: Vec::new(),
                });
                self.tenants.len() - 1
            }
        };
        let weight = tenant.weight.max(1);
        let t = &mut self.tenants[i];
        if t.waiting.is_empty() {
            self.active_weight += u64::from(weight);
        } else {
            // Its weight changed with a reload of the tenants file.
            self.active_weight =
                self.active_weight.saturating_sub(u64::from(t.weight)) + u64::from(weight);
        }
        t.weight = weight;
        // Where its share puts this request: `last_T`, or the clock.
        let due = t.next.max(clock);
        let s = match self.interval_ns {
            0 => DEFAULT_INTERVAL.as_nanos(),
            ns => u128::from(ns),
        };
        let step_ns = s * u128::from(self.active_weight) / u128::from(weight);
        let step = Duration::from_nanos(u64::try_from(step_ns).unwrap_or(u64::MAX)).min(MAX_STEP);
        t.next = due.checked_add(step).unwrap_or(due);
        // Its burst: it starts where its share put the request
        // `queue_burst - 1` places ahead of it in its line (the clock
        // when there is none), never before its own request ahead of it:
        // so at most `queue_burst` of its requests waiting at once start
        // at any one time, whatever the steps were, and the rest keep
        // their spacing. `last_T` keeps the whole chain: over time the
        // tenant still gets its share, not more.
        let burst = usize::try_from(tenant.queue_burst.max(1)).unwrap_or(1);
        let k = t.waiting.len();
        let anchor = match (k + 1).checked_sub(burst) {
            None => clock,
            Some(i) if i == k => due,
            Some(i) => t.waiting[i].due,
        };
        let start = anchor.max(clock);
        let start = t.waiting.last().map_or(start, |q| start.max(q.start));
        // The least its start may go back to (`next_floor` ≤ `next`, so
        // at most `start`); `last_T` now follows it.
        let floor = t.next_floor.take().map_or(clock, |f| f.max(clock));
        t.waiting.push(Queued {
            seq,
            level,
            start,
            due,
            step,
            floor,
        });
        start
    }

    /// Request `seq` left the line (`served`: admitted or taken into a
    /// batch, and then the clock moves up to its fair start). Unserved
    /// (timed out), it gives its step back: its tenant's later requests
    /// in line move back by it (their turns in `waiters` with them), as
    /// far as their floors allow, and so does `last_T`. Nothing for a
    /// request without a tenant.
    fn left(&mut self, seq: u64, served: bool, waiters: &mut [Waiter]) {
        let Some((ti, i)) = self.tenants.iter().enumerate().find_map(|(ti, t)| {
            let i = t.waiting.iter().position(|q| q.seq == seq)?;
            Some((ti, i))
        }) else {
            return;
        };
        // Its tenant's later requests in line may move back, but never
        // behind their level's clock as it is now (it never goes back
        // while requests wait: a request that started at it keeps its
        // place).
        let mut clocks: Vec<(u8, Instant)> = Vec::new();
        if !served {
            for level in self.tenants[ti].waiting[i + 1..].iter().map(|q| q.level) {
                if !clocks.iter().any(|&(l, _)| l == level) {
                    if let (Some(c), _) = self.clock_at(level) {
                        clocks.push((level, c));
                    }
                }
            }
        }
        let t = &mut self.tenants[ti];
        let gone = t.waiting.remove(i);
        t.usage.queued.fetch_sub(1, Ordering::AcqRel);
        if t.waiting.is_empty() {
            self.active_weight = self.active_weight.saturating_sub(u64::from(t.weight));
        }
        if served {
            self.clock = Some(self.clock.map_or(gone.start, |c| c.max(gone.start)));
            // Should an earlier request of its tenant give its step back
            // later, the next one cannot go back past where it would start
            // after this one at its least.
            let least = gone.floor.checked_add(gone.step).unwrap_or(gone.floor);
            match t.waiting.get_mut(i) {
                Some(q) => q.floor = q.floor.max(least),
                None => t.next_floor = Some(t.next_floor.map_or(least, |f| f.max(least))),
            }
            return;
        }
        // How far the next one in the tenant's chain moves back.
        let mut back = gone.step;
        for q in &mut t.waiting[i..] {
            if back.is_zero() {
                break;
            }
            let least = clocks
                .iter()
                .find(|&&(l, _)| l == q.level)
                .map_or(q.floor, |&(_, c)| q.floor.max(c))
                .min(q.start);
            let to = q.start.checked_sub(back).map_or(least, |s| s.max(least));
            back = q.start - to;
            if !back.is_zero() {
                q.start = to;
                if let Some(w) = waiters.iter_mut().find(|w| w.seq == q.seq) {
                    w.turn = w.turn.checked_sub(back).unwrap_or(w.turn);
                }
            }
        }
        let to = t.next.checked_sub(back).unwrap_or(t.next);
        t.next = t.next_floor.map_or(to, |f| to.max(f.min(t.next)));
    }

    /// The line gave a run at `now` (of `concurrency` at once);
    /// `others_wait`: requests still wait after it (then the time to the
    /// next one measures the model). Before the first measure, the time
    /// the line waited for this run, over `concurrency`, stands in for
    /// one when it is longer than what stands in now (a run lasts at
    /// least that long): so a model much slower than the 1 ms default is
    /// known from its first admission, not its second.
    fn granted(&mut self, now: Instant, others_wait: bool, concurrency: usize) {
        if let (Some(since), 0) = (self.line_since.take(), self.samples) {
            let ns = u64::try_from(now.saturating_duration_since(since).as_nanos())
                .unwrap_or(u64::MAX)
                / u64::try_from(concurrency.max(1)).unwrap_or(1);
            let ns = ns.clamp(MIN_INTERVAL_NS, MAX_INTERVAL_NS);
            let now_ns = match self.interval_ns {
                0 => u64::try_from(DEFAULT_INTERVAL.as_nanos()).unwrap_or(0),
                ns => ns,
            };
            if ns > now_ns {
                self.interval_ns = ns;
            }
        }
        if let Some((then, served)) = self.last_grant {
            let ns = u64::try_from(now.saturating_duration_since(then).as_nanos())
                .unwrap_or(u64::MAX)
                / u64::from(served.max(1));
            let ns = ns.clamp(MIN_INTERVAL_NS, MAX_INTERVAL_NS);
            self.samples = (self.samples + 1).min(WARM_UP);
            // The mean of the measures so far, then a moving average
            // (each new measure weighs 1/8).
            let n = u64::from(self.samples);
            self.interval_ns = self.interval_ns - self.interval_ns / n + ns / n;
        }
        self.last_grant = others_wait.then_some((now, 1));
    }
}

#[derive(Clone, Debug)]
struct Waiter {
    seq: u64,
    /// Arrival + (level - 1) × aging: the earliest goes first.
    turn: Instant,
    deadline: Option<Instant>,
    /// What a leader needs to take it into a batch; `None`: it runs alone.
    member: Option<Arc<Member>>,
    /// Where it sleeps (with the state's lock): woken when it may be
    /// admitted, or taken into a batch.
    wake: Arc<Condvar>,
}

/// How a batchable request's wait in line ended.
pub(crate) enum Turn<'a> {
    /// It holds a run (until the [`RunSlot`] drops): it leads a batch.
    Lead(RunSlot<'a>),
    /// A leader took it into its batch and will answer it.
    Taken,
}

/// A snapshot of a queue's counters.
///
/// # Examples
///
/// ```
/// use server::queue::{Ask, ModelQueue, QueueStats};
/// let q = ModelQueue::new(2);
/// q.run(Ask::default(), &mut wire::Timeline::default(), || ())?;
/// assert_eq!(q.stats(), QueueStats { completed: 1, ..QueueStats::default() });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Runs in progress.
    pub running: usize,
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Runs completed.
    pub completed: u64,
    /// Requests refused because the queue was full.
    pub overloaded: u64,
    /// Requests that waited their whole timeout.
    pub timed_out: u64,
    /// Runs stopped for a request whose turn came first (each such request
    /// ran again later).
    pub preempted: u64,
}

impl ModelQueue {
    /// A queue admitting `concurrency` (≥ 1, at most 2^31) runs at once,
    /// waiters in arrival order (the default policy).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::queue::{ModelQueue, QueuePolicy};
    /// let q = ModelQueue::new(0); // clamped to one run
    /// assert_eq!(q.concurrency(), 1);
    /// assert_eq!(*q.policy(), QueuePolicy::default());
    /// ```
    pub fn new(concurrency: usize) -> ModelQueue {
        ModelQueue::with_policy(concurrency, QueuePolicy::default())
    }

    /// A queue admitting `concurrency` runs at once, ordered and bounded by
    /// `policy` (checked by the caller: [`QueuePolicy::validate`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::queue::{ModelQueue, QueuePolicy};
    /// let p = QueuePolicy { max_queue: 8, ..QueuePolicy::default() };
    /// let q = ModelQueue::with_policy(4, p);
    /// assert_eq!((q.concurrency(), q.policy().max_queue), (4, 8));
    /// ```
    pub fn with_policy(concurrency: usize, policy: QueuePolicy) -> ModelQueue {
        ModelQueue {
            word: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            gather: Condvar::new(),
            concurrency: concurrency.clamp(1, 1 << 31),
            policy,
            completed: AtomicU64::new(0),
            overloaded: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            preempted: AtomicU64::new(0),
        }
    }

    /// How many runs it admits at once. Example: [`ModelQueue::new`].
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// Its policy. Example: [`ModelQueue::with_policy`].
    pub fn policy(&self) -> &QueuePolicy {
        &self.policy
    }

    /// Whether a request arriving now would run without waiting: a run is
    /// free and nobody waits. A hint only (it may change at once); callers
    /// use it to choose where to run a request, never for correctness.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::queue::{Ask, ModelQueue};
    /// let q = ModelQueue::new(1);
    /// assert!(q.has_free_run());
    /// q.run(Ask::default(), &mut wire::Timeline::default(), || assert!(!q.has_free_run()))?;
    /// assert!(q.has_free_run());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn has_free_run(&self) -> bool {
        self.word.load(Ordering::Relaxed) < self.concurrency as u64
    }

    /// Waits for this request's turn (as `ask` and the policy say), runs
    /// `f` on the calling thread, and stamps `Queued`, `ComputeStart` and
    /// `ComputeEnd` on `timeline`. A request admitted at once (one
    /// compare-and-swap) gets its `Queued` time as `ComputeStart` too,
    /// rather than a second clock read (~30 ns) for a wait of a few ns.
    /// A request refused (full queue, timeout, unknown priority) never runs
    /// `f`. A request of a tenant: [`run_for`](Self::run_for).
    ///
    /// # Examples
    ///
    /// ```
    /// use server::queue::{Ask, ModelQueue};
    /// use wire::{Stage, Timeline};
    /// let q = ModelQueue::new(1);
    /// let mut tl = Timeline::default();
    /// let sum = q.run(Ask::default(), &mut tl, || 2 + 2)?;
    /// assert_eq!(sum, 4);
    /// assert!(tl.get(Stage::ComputeEnd) >= tl.get(Stage::ComputeStart));
    /// assert_ne!(tl.get(Stage::Queued), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run<R>(
        &self,
        ask: Ask,
        timeline: &mut Timeline,
        f: impl FnOnce() -> R,
    ) -> Result<R, Refused> {
        self.run_for(ask, None, timeline, f)
    }

    /// [`run`](Self::run) for a request of `tenant` (`None`: no tenant):
    /// if it must wait, it waits at its fair start and counts in the
    /// tenant's `queued` (refused at once at its `max_queued`; see the
    /// module doc). Admitted at once, it costs what [`run`](Self::run)
    /// costs: the tenant is not looked at.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::queue::{Ask, ModelQueue};
    /// use server::tenants::{file, Identity, Tenants};
    /// let specs = file::parse("[[tenant]]\nname = \"default\"\nmodels = [\"*\"]\n", "t.toml")?;
    /// let tenant = Tenants::from_specs(specs).resolve(&Identity::REMOTE, None).map_err(|d| d.1)?;
    /// let q = ModelQueue::new(1);
    /// let r = q.run_for(Ask::default(), Some(&tenant), &mut wire::Timeline::default(), || "ran")?;
    /// assert_eq!(r, "ran");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_for<R>(
        &self,
        ask: Ask,
        tenant: Option<&Tenant>,
        timeline: &mut Timeline,
        f: impl FnOnce() -> R,
    ) -> Result<R, Refused> {
        self.check_level(ask)?;
        timeline.stamp(Stage::Queued);
        let waited = !self.try_admit_at_once();
        if waited {
            self.admit_in_turn(ask, tenant, None, None)?;
        }
        // Released on every exit, including a panic inside `f`.
        let slot = RunSlot(self);
        if waited && caller_gone() {
            slot.unused();
            return Err(Refused::CallerGone);
        }
        let _slot = slot;
        if waited {
            timeline.stamp(Stage::ComputeStart);
        } else {
            timeline.set(Stage::ComputeStart, timeline.get(Stage::Queued));
        }
        let r = f();
        timeline.stamp(Stage::ComputeEnd);
        Ok(r)
    }

    /// [`run_for`](Self::run_for) for a run that may be stopped. When the
    /// policy preempts ([`QueuePolicy::preempt`]), a request
    /// whose turn comes before this one's stops it while it runs: `f` then
    /// ends early with a result `stopped` recognizes, the run is given to
    /// the earlier turn, and this request waits again at its own turn and
    /// calls `f` anew when that comes (see "Preemption" in the module doc).
    /// The run is stopped through this thread's [`engine::RunStop`]; an
    /// engine that cannot stop finishes its run, and a run that finished
    /// although it was asked to stop keeps its result.
    /// Otherwise this is exactly `run_for`. `Queued` is stamped once;
    /// `ComputeStart` at the admission of the run that counts, so time
    /// lost to a stopped run shows as queueing.
    ///
    /// # Examples
    ///
    /// ```
    /// use server::queue::{Ask, ModelQueue, QueuePolicy};
    /// let p = QueuePolicy { priority_levels: 2, preempt: true, ..QueuePolicy::default() };
    /// let q = ModelQueue::with_policy(1, p);
    /// let mut tl = wire::Timeline::default();
    /// let r = q.run_preemptible(Ask::default(), None, &mut tl, || Ok::<_, ()>(7), |r| r.is_err())?;
    /// assert_eq!(r, Ok(7));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_preemptible<R>(
        &self,
        ask: Ask,
        tenant: Option<&Tenant>,
        timeline: &mut Timeline,
        mut f: impl FnMut() -> R,
        stopped: impl Fn(&R) -> bool,
    ) -> Result<R, Refused> {
        if !self.policy.preempt {
            return self.run_for(ask, tenant, timeline, f);
        }
        let stop = engine::RunStop::for_this_thread();
        self.check_level(ask)?;
        timeline.stamp(Stage::Queued);
        let mut rejoin = None;
        loop {
            let (turn, waited) = match rejoin {
                None if self.try_admit_at_once() => (self.turn_on_arrival(ask), false),
                None => (
                    self.admitted(self.admit_in_turn(ask, tenant, None, None)?),
                    true,
                ),
                Some(turn) => {
                    let again = self.admit_in_turn(ask, None, None, Some(turn))?;
                    (self.admitted(again), true)
                }
            };
            let slot = RunSlot(self);
            if waited && caller_gone() {
                slot.unused();
                return Err(Refused::CallerGone);
            }
            let Some(run) = self.start_running(turn, &stop) else {
                // A request whose turn comes first joined the line while
                // this one was being admitted: it goes first.
                self.preempted.fetch_add(1, Ordering::Relaxed);
                slot.unused();
                rejoin = Some(turn);
                continue;
            };
            timeline.stamp(Stage::ComputeStart);
            let r = f();
            if run.finish() && stopped(&r) {
                self.preempted.fetch_add(1, Ordering::Relaxed);
                drop(r);
                slot.unused();
                rejoin = Some(turn);
                continue;
            }
            timeline.stamp(Stage::ComputeEnd);
            return Ok(r);
        }
    }

    /// The turn of a request admitted at once (no tenant's fair start is
    /// taken on that path: it starts when it arrives).
    fn turn_on_arrival(&self, ask: Ask) -> Instant {
        let now = Instant::now();
        now.checked_add(self.behind(ask)).unwrap_or(now)
    }

    /// A level the model does not have is refused before the request waits.
    fn check_level(&self, ask: Ask) -> Result<(), Refused> {
        let levels = self.policy.priority_levels;
        if ask.priority > levels {
            return Err(Refused::BadPriority {
                asked: ask.priority,
                levels,
            });
        }
        Ok(())
    }

    /// How far behind its start a request's turn is: `(level - 1) × aging`
    /// (level 0 is the policy's default level). At most 254 days (levels ≤
    /// 255, aging ≤ a day): no overflow.
    fn behind(&self, ask: Ask) -> Duration {
        let level = self.level_of(ask);
        self.policy
            .aging
            .saturating_mul(u32::from(level.saturating_sub(1)))
    }

    /// The request's level: its own, or the policy's default for 0.
    fn level_of(&self, ask: Ask) -> u8 {
        if ask.priority == 0 {
            self.policy.default_priority
        } else {
            ask.priority
        }
    }

    /// The turn `admit_in_turn` admitted a request at (one that is not a
    /// member always is admitted when it returns `Ok`).
    fn admitted(&self, turn: Option<Instant>) -> Instant {
        turn.unwrap_or_else(Instant::now)
    }

    /// Registers the run about to start at `turn` so that waiters may stop
    /// it; `None` if a waiter whose turn comes first already waits for a
    /// run (it joined after this request's admission, before this
    /// registration, so it could not stop it).
    fn start_running(&self, turn: Instant, stop: &Arc<engine::RunStop>) -> Option<Running<'_>> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let stopping = s.running.iter().filter(|r| r.stopped).count();
        let before = s.waiters.iter().filter(|w| w.turn < turn).count();
        if before > stopping {
            return None;
        }
        let id = s.next_run;
        s.next_run += 1;
        stop.clear();
        s.running.push(RunEntry {
            id,
            turn,
            stop: stop.clone(),
            stopped: false,
        });
        Some(Running {
            queue: self,
            id,
            stop: stop.clone(),
            done: false,
        })
    }

    /// A request whose turn is `turn` has just joined the line (the lock
    /// is held): if every run is taken, none is being stopped for the
    /// waiters ahead of it, and a run in progress has a later turn, stops
    /// the one with the latest turn.
    fn preempt_for(&self, s: &mut State, turn: Instant) {
        if ((self.word.load(Ordering::Acquire) & RUNNING_MASK) as usize) < self.concurrency {
            return; // a run is free
        }
        let stopping = s.running.iter().filter(|r| r.stopped).count();
        let before = s.waiters.iter().filter(|w| w.turn < turn).count();
        if stopping > before {
            return; // a run being stopped will be free for it
        }
        let latest = s
            .running
            .iter_mut()
            .filter(|r| !r.stopped && r.turn > turn)
            .max_by_key(|r| r.turn);
        if let Some(r) = latest {
            r.stopped = true;
            r.stop.stop();
        }
    }

    /// Waits in line as a request that may share a run (`member`): returns
    /// [`Turn::Lead`] when admitted (it then takes followers:
    /// [`take_followers`](Self::take_followers)) or [`Turn::Taken`] once a
    /// leader took it along (its outcome then arrives in the member). A
    /// request that finds the model free and nobody waiting leads at once.
    /// The caller stamped `Queued`. `tenant`: as in [`run_for`](Self::run_for).
    pub(crate) fn wait_as_member(
        &self,
        ask: Ask,
        tenant: Option<&Tenant>,
        member: &Arc<Member>,
    ) -> Result<Turn<'_>, Refused> {
        self.check_level(ask)?;
        if self.try_admit_at_once()
            || self
                .admit_in_turn(ask, tenant, Some(member), None)?
                .is_some()
        {
            Ok(Turn::Lead(RunSlot(self)))
        } else {
            Ok(Turn::Taken)
        }
    }

    /// For a leader holding a run: takes the members waiting in line that
    /// can share its run, best turn first, as `policy` says: up to
    /// `max_batch` rows in all, waiting until `since + max_queue_delay` for
    /// more while neither `max_batch` nor a preferred size is reached. The
    /// members taken leave the line (their requests no longer wait, and
    /// their deadlines no longer apply: they will be computed).
    pub(crate) fn take_followers(
        &self,
        leader: &Member,
        policy: &BatchPolicy,
        since: Instant,
    ) -> Vec<Arc<Member>> {
        let room = policy.max_batch.saturating_sub(leader.rows());
        let until = since.checked_add(policy.max_queue_delay).unwrap_or(since);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut told_pool = false;
        let mut chosen = loop {
            let now = Instant::now();
            let chosen = Self::compatible(&s.waiters, leader, room, now);
            let rows = leader.rows() + chosen.iter().map(|&(_, r)| r).sum::<usize>();
            if policy.is_reached(rows) || now >= until {
                break chosen;
            }
            if !told_pool {
                // It waits for members: other workers must read their
                // requests. Then look again.
                told_pool = true;
                s = self.tell_pool(s);
                continue;
            }
            s.gathering += 1;
            s = self
                .gather
                .wait_timeout(s, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            s.gathering -= 1;
        };
        chosen.truncate(policy.keep(leader.rows(), chosen.iter().map(|&(_, r)| r)));
        if chosen.is_empty() {
            return Vec::new();
        }
        let mut taken = Vec::with_capacity(chosen.len());
        let mut taken_seqs = Vec::with_capacity(chosen.len());
        s.waiters.retain(|w| {
            let take = chosen.iter().any(|&(seq, _)| seq == w.seq);
            if take {
                if let Some(m) = &w.member {
                    // Not woken now: it sleeps on until its outcome is
                    // ready ([`wake_members`](Self::wake_members)), one
                    // wake-up in all.
                    m.mark_taken();
                    taken.push(m.clone());
                    taken_seqs.push(w.seq);
                }
            }
            !take
        });
        for seq in taken_seqs {
            let State { fair, waiters, .. } = &mut *s;
            fair.left(seq, true, waiters);
        }
        // The run that took them served them too (for the interval
        // between admissions).
        if s.waiters.is_empty() {
            s.fair.last_grant = None;
            s.fair.line_since = None;
        } else if let Some((_, served)) = &mut s.fair.last_grant {
            *served = served.saturating_add(u32::try_from(taken.len()).unwrap_or(u32::MAX));
        }
        self.word
            .fetch_sub(WAITING_ONE * taken.len() as u64, Ordering::Relaxed);
        // Arrival order: the order their inputs were staged in.
        taken.sort_by_key(|m| m.staged_at());
        taken
    }

    /// Wakes `members`, taken by a leader that has now answered them (each
    /// sleeps in line on its own condition variable until then, or already
    /// waits for its outcome: then this wake is spurious and harmless).
    pub(crate) fn wake_members(&self, members: &[Arc<Member>]) {
        let _s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for m in members {
            if let Some(w) = m.wake() {
                w.notify_one();
            }
        }
    }

    /// The members in `waiters` that fit with `leader` (not past their
    /// deadline at `now`), best turn first, while their rows fit in
    /// `room`: (seq, rows) each.
    fn compatible(
        waiters: &[Waiter],
        leader: &Member,
        room: usize,
        now: Instant,
    ) -> Vec<(u64, usize)> {
        let mut fits: Vec<&Waiter> = waiters
            .iter()
            .filter(|w| w.deadline.is_none_or(|d| now < d))
            .filter(|w| w.member.as_ref().is_some_and(|m| m.fits_with(leader)))
            .collect();
        fits.sort_by_key(|w| (w.turn, w.seq));
        let mut left = room;
        let mut chosen = Vec::new();
        for w in fits {
            let rows = w.member.as_ref().map_or(0, |m| m.rows());
            if rows > left {
                // A smaller one further back may still fit; keep looking.
                continue;
            }
            left -= rows;
            chosen.push((w.seq, rows));
        }
        chosen
    }

    /// Refuses at once what [`run`](Self::run) would refuse before any
    /// wait: a priority the model lacks, a full queue (counted), or a
    /// `tenant` at its `max_queued` (counted in its usage). A snapshot: a
    /// request that passes may still be refused when it joins the line.
    /// Callers use it to refuse before they spend work on a request (the
    /// batcher's staging copy).
    pub(crate) fn check_admissible(
        &self,
        ask: Ask,
        tenant: Option<&Tenant>,
    ) -> Result<(), Refused> {
        self.check_level(ask)?;
        let max = self.policy.max_queue;
        if max != 0 && (self.word.load(Ordering::Relaxed) >> 32) as usize >= max {
            self.overloaded.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Overloaded { max_queue: max });
        }
        if let Some(t) = tenant {
            if let Some(m) = t.quotas.max_queued {
                if t.usage.queued.load(Ordering::Acquire) >= m {
                    return Err(Self::tenant_full(t, m));
                }
            }
        }
        Ok(())
    }

    /// Counts one more request of `tenant` waiting (its usage's `queued`),
    /// or refuses it at its `max_queued`.
    fn count_queued(tenant: &Tenant) -> Result<(), Refused> {
        let queued = &tenant.usage.queued;
        match tenant.quotas.max_queued {
            None => {
                queued.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Some(m) => queued
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < m).then_some(n + 1)
                })
                .map(|_| ())
                .map_err(|_| Self::tenant_full(tenant, m)),
        }
    }

    /// The refusal of a request of `tenant` at its `max_queued` (`m`),
    /// counted in its usage.
    fn tenant_full(tenant: &Tenant, m: u32) -> Refused {
        tenant.usage.over_quota.fetch_add(1, Ordering::Relaxed);
        Refused::TenantQueueFull {
            tenant: tenant.name.clone(),
            max_queued: m,
        }
    }

    /// Admits the caller if a run is free and nobody waits.
    fn try_admit_at_once(&self) -> bool {
        let w = self.word.load(Ordering::Relaxed);
        w < self.concurrency as u64
            && self
                .word
                .compare_exchange(w, w + RUNNING_ONE, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    /// Waits in line until this request is the policy's best waiter and a
    /// run is free, then takes the run (`Ok(Some(its turn))`); or, for a
    /// `member`, until a leader takes it along (`Ok(None)`); or leaves the
    /// line refused.
    /// A request of `tenant` waits at its fair start, counted in the
    /// tenant's `queued` until it leaves the line. A request whose run was
    /// stopped waits again at its old turn (`rejoin`): it is not refused
    /// for a full queue, has no deadline and is not counted again for its
    /// tenant (the caller passes no tenant).
    fn admit_in_turn(
        &self,
        ask: Ask,
        tenant: Option<&Tenant>,
        member: Option<&Arc<Member>>,
        rejoin: Option<Instant>,
    ) -> Result<Option<Instant>, Refused> {
        let p = &self.policy;
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if rejoin.is_none() && p.max_queue != 0 && s.waiters.len() >= p.max_queue {
            self.overloaded.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Overloaded {
                max_queue: p.max_queue,
            });
        }
        if let Some(t) = tenant {
            // Given back when it leaves the line (`Fair::left`).
            Self::count_queued(t)?;
        }
        // From here the fast path is closed (the waiting count is not 0).
        self.word.fetch_add(WAITING_ONE, Ordering::Relaxed);
        let arrived = Instant::now();
        let behind = self.behind(ask);
        let timeout = match (
            ask.timeout.filter(|_| p.timeout_override),
            p.default_timeout,
        ) {
            _ if rejoin.is_some() => None,
            (Some(own), Some(cap)) => Some(own.min(cap)),
            (own, default) => own.or(default),
        };
        let wake = Arc::new(Condvar::new());
        if let Some(m) = member {
            m.set_wake(&wake);
        }
        let seq = s.next_seq;
        let start = match tenant {
            None => arrived,
            Some(t) => s.fair.join(t, seq, self.level_of(ask), arrived, p.aging),
        };
        let turn = rejoin.unwrap_or_else(|| start.checked_add(behind).unwrap_or(start));
        let me = Waiter {
            seq,
            turn,
            deadline: timeout.and_then(|t| arrived.checked_add(t)),
            member: member.cloned(),
            wake: wake.clone(),
        };
        let deadline = me.deadline;
        s.next_seq += 1;
        if s.waiters.is_empty() {
            s.fair.line_since = Some(arrived);
        }
        s.waiters.push(me);
        if p.preempt {
            self.preempt_for(&mut s, turn);
        }
        if member.is_some() && s.gathering > 0 {
            // A leader waiting for members may take this one.
            self.gather.notify_all();
        }
        let mut told_pool = false;
        let admitted_at = loop {
            if member.is_some_and(|m| m.is_taken()) {
                // Its leader removed it from the line and the count. A
                // wake meant for it (a run freed) passes on.
                self.wake_best(&s);
                return Ok(None);
            }
            let now = Instant::now();
            // Admission first: a request that is next and finds a free run
            // is admitted (one past its deadline is never next: `best`
            // leaves it out, and it leaves below).
            if self.best(&s.waiters, now) == Some(seq) {
                // A run ending does not take the lock to decrement, so take
                // a free run by compare-and-swap, as the fast path does.
                let w = self.word.load(Ordering::Relaxed);
                if (w & RUNNING_MASK) < self.concurrency as u64
                    && self
                        .word
                        .compare_exchange(
                            w,
                            w + RUNNING_ONE - WAITING_ONE,
                            Ordering::Acquire,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                {
                    break now;
                }
                if (self.word.load(Ordering::Relaxed) & RUNNING_MASK) < self.concurrency as u64 {
                    continue; // the word changed under us: try again
                }
            }
            if deadline.is_some_and(|d| now >= d) {
                s.remove(seq, false);
                self.word.fetch_sub(WAITING_ONE, Ordering::Relaxed);
                self.timed_out.fetch_add(1, Ordering::Relaxed);
                // The next waiter may be another one now.
                self.wake_best(&s);
                return Err(Refused::Timeout {
                    waited: now - arrived,
                });
            }
            if !told_pool {
                // About to wait (the requests behind this one, a batch's
                // members among them, must still be read). Then look again.
                told_pool = true;
                s = self.tell_pool(s);
                continue;
            }
            // Woken when it is the best waiter and a run is free (a run
            // ending, a waiter admitted or leaving: they lock before
            // waking, so the wake cannot fall between the check above and
            // this wait), when a leader takes it, or by its deadline.
            s = match deadline {
                None => wake.wait(s).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(now);
                    wake.wait_timeout(s, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        };
        s.remove(seq, true);
        let others_wait = !s.waiters.is_empty();
        s.fair.granted(admitted_at, others_wait, self.concurrency);
        // The next waiter may be admissible too (concurrency > 1).
        self.wake_best(&s);
        Ok(Some(turn))
    }

    /// Tells the agent's worker pool that this thread is about to wait
    /// ([`crate::reactor::will_block`]: on a worker, another one is
    /// started if none is left to read connections), outside the lock (it
    /// may start a thread); returns the lock taken again.
    fn tell_pool<'a>(
        &'a self,
        s: std::sync::MutexGuard<'a, State>,
    ) -> std::sync::MutexGuard<'a, State> {
        drop(s);
        crate::reactor::will_block();
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the waiter to admit next if a run is free (the state's lock
    /// is held). Only that one: it wakes the next in turn when it is
    /// admitted or leaves.
    fn wake_best(&self, s: &State) {
        if (self.word.load(Ordering::Acquire) & RUNNING_MASK) >= self.concurrency as u64 {
            return;
        }
        let best = self.best(&s.waiters, Instant::now());
        if let Some(w) = s.waiters.iter().find(|w| Some(w.seq) == best) {
            w.wake.notify_one();
        }
    }

    /// The waiter to admit next: the earliest turn, the earliest arrival
    /// among equal turns; waiters past their deadline at `now` are leaving
    /// and not chosen. (A scan: the line is as long as the requests that
    /// wait, at most `max_queue` when set.)
    fn best(&self, waiters: &[Waiter], now: Instant) -> Option<u64> {
        waiters
            .iter()
            .filter(|w| w.deadline.is_none_or(|d| now < d))
            .min_by_key(|w| (w.turn, w.seq))
            .map(|w| w.seq)
    }

    /// Current counters. Example: [`QueueStats`].
    pub fn stats(&self) -> QueueStats {
        let w = self.word.load(Ordering::Relaxed);
        QueueStats {
            running: (w & RUNNING_MASK) as usize,
            waiting: (w >> 32) as usize,
            completed: self.completed.load(Ordering::Relaxed),
            overloaded: self.overloaded.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            preempted: self.preempted.load(Ordering::Relaxed),
        }
    }
}

/// A run registered in [`State::running`] until it finishes (also on a
/// panic): then nobody can stop it any more, and its thread's stop flag is
/// cleared for the next run.
struct Running<'a> {
    queue: &'a ModelQueue,
    id: u64,
    stop: Arc<engine::RunStop>,
    done: bool,
}

impl Running<'_> {
    /// Ends the registration; whether a waiter stopped the run.
    fn finish(mut self) -> bool {
        let stopped = self.unregister();
        self.done = true;
        stopped
    }

    fn unregister(&self) -> bool {
        let mut s = self.queue.state.lock().unwrap_or_else(|e| e.into_inner());
        let at = s.running.iter().position(|r| r.id == self.id);
        let stopped = at.is_some_and(|i| s.running.swap_remove(i).stopped);
        drop(s);
        // Nobody can stop it any more: the next run starts clear.
        self.stop.clear();
        stopped
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.unregister();
        }
    }
}

/// A run held from admission until dropped (also on a panic).
pub(crate) struct RunSlot<'a>(&'a ModelQueue);

impl RunSlot<'_> {
    /// Gives the run back unused (its request will not run): not counted
    /// as a completed run.
    pub(crate) fn unused(self) {
        let q = self.0;
        std::mem::forget(self);
        q.release_run();
    }
}

impl Drop for RunSlot<'_> {
    fn drop(&mut self) {
        self.0.completed.fetch_add(1, Ordering::Relaxed);
        self.0.release_run();
    }
}

impl ModelQueue {
    /// Ends a run (done or unused), waking the next waiter if one waits.
    fn release_run(&self) {
        let before = self.word.fetch_sub(RUNNING_ONE, Ordering::Release);
        // Waking costs a syscall: only when someone waits. The lock orders
        // this wake after a waiter's check (see `admit_in_turn`).
        if before >= WAITING_ONE {
            let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            self.wake_best(&s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    #[test]
    fn stamps_in_order() {
        let q = ModelQueue::new(1);
        let mut tl = Timeline::default();
        let v = q.run(Ask::default(), &mut tl, || 5).unwrap();
        assert_eq!(v, 5);
        assert!(tl.get(Stage::Queued) <= tl.get(Stage::ComputeStart));
        assert!(tl.get(Stage::ComputeStart) <= tl.get(Stage::ComputeEnd));
        // Admitted at once: no second clock read for a wait of one CAS.
        assert_ne!(tl.get(Stage::Queued), 0);
        assert_eq!(tl.get(Stage::Queued), tl.get(Stage::ComputeStart));
        assert_eq!(q.stats().completed, 1);
    }

    #[test]
    fn bounds_concurrency() {
        for conc in [1, 2, 3] {
            let q = Arc::new(ModelQueue::new(conc));
            let now = Arc::new(AtomicUsize::new(0));
            let peak = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (q, now, peak) = (q.clone(), now.clone(), peak.clone());
                    std::thread::spawn(move || {
                        for _ in 0..50 {
                            q.run(Ask::default(), &mut Timeline::default(), || {
                                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(n, Ordering::SeqCst);
                                std::thread::yield_now();
                                now.fetch_sub(1, Ordering::SeqCst);
                            })
                            .unwrap();
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert!(peak.load(Ordering::SeqCst) <= conc);
            assert_eq!(q.stats().completed, 400);
            assert_eq!(q.stats().running, 0);
        }
    }

    #[test]
    fn waiters_are_admitted_first_come_first_served() {
        let q = Arc::new(ModelQueue::new(1));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        // The holder takes the only run (fast path) and keeps it.
        let holder = {
            let q = q.clone();
            std::thread::spawn(move || {
                q.run(Ask::default(), &mut Timeline::default(), || {
                    hold_rx.recv().unwrap()
                })
                .unwrap();
            })
        };
        let wait_for = |cond: &dyn Fn(QueueStats) -> bool| {
            let t0 = std::time::Instant::now();
            while !cond(q.stats()) {
                assert!(t0.elapsed().as_secs() < 10, "queue stuck: {:?}", q.stats());
                std::thread::yield_now();
            }
        };
        wait_for(&|s| s.running == 1);
        let mut waiters = Vec::new();
        for i in 0..4 {
            let (q, order) = (q.clone(), order.clone());
            waiters.push(std::thread::spawn(move || {
                q.run(Ask::default(), &mut Timeline::default(), || {
                    order.lock().unwrap().push(i)
                })
                .unwrap();
            }));
            // Each takes its ticket before the next arrives.
            wait_for(&|s| s.waiting == i + 1);
        }
        // A newcomer while others wait must not slip in by the fast path.
        assert!(!q.try_admit_at_once());
        hold_tx.send(()).unwrap();
        holder.join().unwrap();
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(
            q.stats(),
            QueueStats {
                running: 0,
                waiting: 0,
                completed: 5,
                ..QueueStats::default()
            }
        );
        // Nobody waits: the fast path is open again.
        assert!(q.try_admit_at_once());
    }

    #[test]
    fn panic_releases_slot() {
        let q = ModelQueue::new(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            q.run(Ask::default(), &mut Timeline::default(), || panic!("boom"))
        }));
        assert!(r.is_err());
        assert_eq!(q.run(Ask::default(), &mut Timeline::default(), || 1), Ok(1));
    }

    /// A queue whose one run is held until the returned sender sends (or
    /// is dropped), and a way to wait for its counters.
    fn held(
        policy: QueuePolicy,
    ) -> (
        Arc<ModelQueue>,
        std::sync::mpsc::Sender<()>,
        std::thread::JoinHandle<()>,
    ) {
        let q = Arc::new(ModelQueue::with_policy(1, policy));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let q = q.clone();
            std::thread::spawn(move || {
                q.run(Ask::default(), &mut Timeline::default(), || {
                    let _ = rx.recv();
                })
                .unwrap();
            })
        };
        wait_stats(&q, |s| s.running == 1);
        (q, tx, holder)
    }

    fn wait_stats(q: &ModelQueue, cond: impl Fn(QueueStats) -> bool) {
        let t0 = Instant::now();
        while !cond(q.stats()) {
            assert!(t0.elapsed().as_secs() < 10, "queue stuck: {:?}", q.stats());
            std::thread::yield_now();
        }
    }

    /// Starts a waiter asking `ask` that records `tag` when it runs, and
    /// waits until it is in line.
    fn waiter(
        q: &Arc<ModelQueue>,
        ask: Ask,
        tag: &'static str,
        order: &Arc<Mutex<Vec<&'static str>>>,
    ) -> std::thread::JoinHandle<Result<(), Refused>> {
        // Counted once in line, and still once if it has timed out since.
        let seen = |s: QueueStats| s.waiting as u64 + s.timed_out;
        let before = seen(q.stats());
        let (q2, order) = (q.clone(), order.clone());
        let h = std::thread::spawn(move || {
            q2.run(ask, &mut Timeline::default(), || {
                order.lock().unwrap().push(tag)
            })
        });
        wait_stats(q, |s| seen(s) == before + 1);
        h
    }

    fn at(priority: u8) -> Ask {
        Ask {
            priority,
            timeout: None,
        }
    }

    #[test]
    fn higher_priority_goes_first_then_arrival_order() {
        // Aging an hour: no waiter ages during the test.
        let policy = QueuePolicy {
            priority_levels: 3,
            default_priority: 2,
            aging: Duration::from_secs(3600),
            ..QueuePolicy::default()
        };
        let (q, tx, holder) = held(policy);
        let order = Arc::new(Mutex::new(Vec::new()));
        let ws = [
            waiter(&q, at(3), "low", &order),
            waiter(&q, at(0), "default-a", &order),
            waiter(&q, at(1), "high", &order),
            waiter(&q, at(2), "default-b", &order),
        ];
        tx.send(()).unwrap();
        holder.join().unwrap();
        for w in ws {
            assert_eq!(w.join().unwrap(), Ok(()));
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["high", "default-a", "default-b", "low"]
        );
    }

    #[test]
    fn a_low_priority_request_ages_past_newcomers() {
        // Two levels, aging 30 ms: a low request that waited longer than
        // that counts as high, and came first.
        let policy = QueuePolicy {
            priority_levels: 2,
            default_priority: 2,
            aging: Duration::from_millis(30),
            ..QueuePolicy::default()
        };
        let (q, tx, holder) = held(policy);
        let order = Arc::new(Mutex::new(Vec::new()));
        let low = waiter(&q, at(2), "low", &order);
        std::thread::sleep(Duration::from_millis(80));
        let high = waiter(&q, at(1), "high", &order);
        tx.send(()).unwrap();
        holder.join().unwrap();
        low.join().unwrap().unwrap();
        high.join().unwrap().unwrap();
        assert_eq!(*order.lock().unwrap(), ["low", "high"]);
    }

    #[test]
    fn a_request_whose_timeout_passes_in_line_is_never_run() {
        let cap = Duration::from_millis(400);
        let (q, tx, holder) = held(QueuePolicy {
            default_timeout: Some(cap),
            ..QueuePolicy::default()
        });
        let order = Arc::new(Mutex::new(Vec::new()));
        let ask = |t: u64| Ask {
            priority: 0,
            timeout: Some(Duration::from_millis(t)),
        };
        let t0 = Instant::now();
        let own = waiter(&q, ask(200), "own timeout", &order);
        let default = waiter(&q, Ask::default(), "policy timeout", &order);
        let capped = waiter(&q, ask(60_000), "capped by the policy", &order);
        for (w, least) in [(own, 200), (default, 400), (capped, 400)] {
            match w.join().unwrap() {
                Err(Refused::Timeout { waited }) => {
                    assert!(waited >= Duration::from_millis(least), "{waited:?}")
                }
                other => panic!("expected a timeout, got {other:?}"),
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the policy caps a request's own timeout"
        );
        assert_eq!(q.stats().timed_out, 3);
        assert_eq!(q.stats().waiting, 0);
        tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(order.lock().unwrap().is_empty(), "nothing timed out ran");
        // The fast path is open again.
        assert_eq!(q.run(Ask::default(), &mut Timeline::default(), || 3), Ok(3));
    }

    #[test]
    fn turns_are_fixed_at_arrival_so_the_order_never_flips() {
        // Level 2 arriving at 0 has its turn at 1 aging; level 1 arriving
        // at 0.5 agings has its turn then, and is ahead at every moment;
        // arriving at 1.5 agings it is behind, at every moment.
        let q = ModelQueue::with_policy(
            1,
            QueuePolicy {
                priority_levels: 2,
                default_priority: 2,
                aging: Duration::from_millis(100),
                ..QueuePolicy::default()
            },
        );
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let w = |seq, level: u32, arrived_ms| Waiter {
            seq,
            turn: at(arrived_ms) + Duration::from_millis(100) * (level - 1),
            deadline: None,
            member: None,
            wake: Arc::new(Condvar::new()),
        };
        for now_ms in [50, 120, 149, 151, 199, 250, 10_000] {
            let now = at(now_ms);
            assert_eq!(q.best(&[w(0, 2, 0), w(1, 1, 50)], now), Some(1), "{now_ms}");
            assert_eq!(
                q.best(&[w(0, 2, 0), w(1, 1, 150)], now),
                Some(0),
                "{now_ms}"
            );
        }
        // Equal turns: arrival order. Past its deadline: not chosen.
        assert_eq!(q.best(&[w(3, 2, 0), w(4, 1, 100)], at(0)), Some(3));
        let mut late = w(5, 1, 0);
        late.deadline = Some(at(10));
        assert_eq!(q.best(&[late, w(6, 2, 0)], at(20)), Some(6));
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_a_bad_priority_is_refused() {
        let (q, tx, holder) = held(QueuePolicy {
            max_queue: 2,
            ..QueuePolicy::default()
        });
        let order = Arc::new(Mutex::new(Vec::new()));
        let a = waiter(&q, Ask::default(), "a", &order);
        let b = waiter(&q, Ask::default(), "b", &order);
        let r = q.run(Ask::default(), &mut Timeline::default(), || ());
        assert_eq!(r, Err(Refused::Overloaded { max_queue: 2 }));
        assert_eq!(q.stats().overloaded, 1);
        assert_eq!(
            q.run(at(2), &mut Timeline::default(), || ()),
            Err(Refused::BadPriority {
                asked: 2,
                levels: 1
            })
        );
        tx.send(()).unwrap();
        holder.join().unwrap();
        a.join().unwrap().unwrap();
        b.join().unwrap().unwrap();
        assert_eq!(*order.lock().unwrap(), ["a", "b"]);
    }

    fn tenants(text: &str) -> crate::tenants::Tenants {
        crate::tenants::Tenants::from_specs(
            crate::tenants::file::parse(text, "t.toml").expect("tenants file"),
        )
    }

    /// The tenant of local uid `uid`.
    fn tenant_of(t: &crate::tenants::Tenants, uid: u32) -> Arc<Tenant> {
        let who = crate::tenants::Identity {
            creds: Some(transport::Credentials {
                pid: 1,
                uid,
                gid: uid,
            }),
            ..crate::tenants::Identity::REMOTE
        };
        t.resolve(&who, None).expect("a tenant")
    }

    /// [`waiter`] for a request of `tenant`.
    fn tenant_waiter(
        q: &Arc<ModelQueue>,
        ask: Ask,
        tenant: &Arc<Tenant>,
        tag: &'static str,
        order: &Arc<Mutex<Vec<&'static str>>>,
    ) -> std::thread::JoinHandle<Result<(), Refused>> {
        let seen = |s: QueueStats| s.waiting as u64 + s.timed_out;
        let before = seen(q.stats());
        let (q2, order, tenant) = (q.clone(), order.clone(), tenant.clone());
        let h = std::thread::spawn(move || {
            q2.run_for(ask, Some(&tenant), &mut Timeline::default(), || {
                order.lock().unwrap().push(tag)
            })
        });
        wait_stats(q, |s| seen(s) == before + 1);
        h
    }

    /// [`tenant_waiter`] that runs `f`.
    fn tenant_waiter_with(
        q: &Arc<ModelQueue>,
        ask: Ask,
        tenant: &Arc<Tenant>,
        f: impl FnOnce() + Send + 'static,
    ) -> std::thread::JoinHandle<Result<(), Refused>> {
        let seen = |s: QueueStats| s.waiting as u64 + s.timed_out;
        let before = seen(q.stats());
        let (q2, tenant) = (q.clone(), tenant.clone());
        let h =
            std::thread::spawn(move || q2.run_for(ask, Some(&tenant), &mut Timeline::default(), f));
        wait_stats(q, |s| seen(s) == before + 1);
        h
    }

    fn queued(t: &Tenant) -> u32 {
        t.usage.queued.load(Ordering::SeqCst)
    }

    /// Aging an hour: no waiter ages, and the fair clock's floor (now -
    /// aging) never moves during a test.
    fn no_aging() -> QueuePolicy {
        QueuePolicy {
            aging: Duration::from_secs(3600),
            ..QueuePolicy::default()
        }
    }

    const TWO: &str =
        "[[tenant]]\nname = \"a\"\nuids = [1]\n[[tenant]]\nname = \"b\"\nuids = [2]\n";

    #[test]
    fn a_tenant_flooding_the_model_does_not_push_another_back() {
        let t = tenants(TWO);
        let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let (q, tx, holder) = held(no_aging());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut ws: Vec<_> = (0..20)
            .map(|_| tenant_waiter(&q, Ask::default(), &a, "a", &order))
            .collect();
        ws.push(tenant_waiter(&q, Ask::default(), &b, "b", &order));
        assert_eq!((queued(&a), queued(&b)), (20, 1));
        tx.send(()).unwrap();
        holder.join().unwrap();
        for w in ws {
            assert_eq!(w.join().unwrap(), Ok(()));
        }
        let order = order.lock().unwrap();
        let b_at = order.iter().position(|&x| x == "b").unwrap();
        // First come first served would put it 21st; its fair start is
        // the clock's, as A's first request's.
        assert!(b_at <= 1, "b admitted {}th: {order:?}", b_at + 1);
        assert_eq!((queued(&a), queued(&b)), (0, 0));
        // Nobody waits: the fast path is open again.
        assert!(q.try_admit_at_once());
    }

    #[test]
    fn a_tenants_burst_goes_at_its_turn_up_to_its_queue_burst() {
        // a has 20 waiting; then b sends 4 at once. Where b's last one
        // goes, by a's and b's queue_burst.
        let last_b = |a_burst: u32, b_burst: u32| {
            let t = tenants(&format!(
                "[[tenant]]\nname = \"a\"\nuids = [1]\nqueue_burst = {a_burst}\n\
                 [[tenant]]\nname = \"b\"\nuids = [2]\nqueue_burst = {b_burst}\n"
            ));
            let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
            let (q, tx, holder) = held(no_aging());
            let order = Arc::new(Mutex::new(Vec::new()));
            let mut ws: Vec<_> = (0..20)
                .map(|_| tenant_waiter(&q, Ask::default(), &a, "a", &order))
                .collect();
            ws.extend((0..4).map(|_| tenant_waiter(&q, Ask::default(), &b, "b", &order)));
            tx.send(()).unwrap();
            holder.join().unwrap();
            for w in ws {
                assert_eq!(w.join().unwrap(), Ok(()));
            }
            let order = order.lock().unwrap();
            assert_eq!(order.iter().filter(|&&x| x == "b").count(), 4);
            order.iter().rposition(|&x| x == "b").unwrap()
        };
        // One at its turn (the default): b's requests are spaced by its
        // share, its last behind several of a's.
        let paced = last_b(1, 1);
        assert!(paced >= 9, "b's last admitted {}th", paced + 1);
        // Four: all of b's go at its turn, behind a's first only (it
        // started at the same clock, and came first).
        assert_eq!(last_b(1, 4), 4);
        // a's burst of 4 too: b's four go after a's first four (at most
        // queue_burst of each other tenant's go ahead of a request at
        // its turn), and before the rest of a's backlog.
        assert_eq!(last_b(4, 4), 7);
    }

    #[test]
    fn backlogged_tenants_are_admitted_by_weight() {
        let t = tenants(
            "[[tenant]]\nname = \"a\"\nuids = [1]\nweight = 3\n\
             [[tenant]]\nname = \"b\"\nuids = [2]\nweight = 1\n",
        );
        let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let (q, tx, holder) = held(no_aging());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut ws = Vec::new();
        for _ in 0..12 {
            ws.push(tenant_waiter(&q, Ask::default(), &a, "a", &order));
        }
        for _ in 0..12 {
            ws.push(tenant_waiter(&q, Ask::default(), &b, "b", &order));
        }
        tx.send(()).unwrap();
        holder.join().unwrap();
        for w in ws {
            assert_eq!(w.join().unwrap(), Ok(()));
        }
        let order = order.lock().unwrap();
        // While both have requests waiting (the first 16 admissions), a
        // gets three for b's one.
        let a_first = order[..16].iter().filter(|&&x| x == "a").count();
        assert!((11..=13).contains(&a_first), "{a_first} of 16: {order:?}");
        assert_eq!((queued(&a), queued(&b)), (0, 0));
    }

    #[test]
    fn priorities_still_come_first_between_tenants() {
        let t = tenants(TWO);
        let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let (q, tx, holder) = held(QueuePolicy {
            priority_levels: 2,
            default_priority: 2,
            ..no_aging()
        });
        let order = Arc::new(Mutex::new(Vec::new()));
        let ws = [
            tenant_waiter(&q, at(2), &b, "b low", &order),
            tenant_waiter(&q, at(2), &a, "a low", &order),
            tenant_waiter(&q, at(1), &a, "a high", &order),
            tenant_waiter(&q, at(1), &a, "a high 2", &order),
        ];
        tx.send(()).unwrap();
        holder.join().unwrap();
        for w in ws {
            assert_eq!(w.join().unwrap(), Ok(()));
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["a high", "a high 2", "b low", "a low"]
        );
    }

    #[test]
    fn max_queued_refuses_a_tenants_extra_waiter_over_all_models() {
        let t = tenants(
            "[[tenant]]\nname = \"a\"\nuids = [1]\nmax_queued = 2\n\
             [[tenant]]\nname = \"b\"\nuids = [2]\nmax_queued = 2\n",
        );
        let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let (q1, tx1, holder1) = held(no_aging());
        let (q2, tx2, holder2) = held(no_aging());
        let order = Arc::new(Mutex::new(Vec::new()));
        let a1 = tenant_waiter(&q1, Ask::default(), &a, "a1", &order);
        let a2 = tenant_waiter(&q2, Ask::default(), &a, "a2", &order);
        assert_eq!(queued(&a), 2, "counted over both models");
        // A third of a's, on either model: refused at once, never run.
        let refused = Refused::TenantQueueFull {
            tenant: "a".into(),
            max_queued: 2,
        };
        let r = q1.run_for(Ask::default(), Some(&a), &mut Timeline::default(), || ());
        assert_eq!(r, Err(refused.clone()));
        let msg = refused.to_string();
        assert!(
            msg.contains("tenant 'a'") && msg.contains("max_queued (2)"),
            "{msg}"
        );
        assert_eq!(q1.check_admissible(Ask::default(), Some(&a)), Err(refused));
        assert_eq!(a.usage.over_quota.load(Ordering::SeqCst), 2);
        // Another tenant still gets in line; and a's request that times
        // out gives its place back.
        let b1 = tenant_waiter(&q1, Ask::default(), &b, "b1", &order);
        assert_eq!(q1.check_admissible(Ask::default(), Some(&b)), Ok(()));
        assert_eq!((queued(&a), queued(&b)), (2, 1));
        tx1.send(()).unwrap();
        holder1.join().unwrap();
        assert_eq!(a1.join().unwrap(), Ok(()));
        assert_eq!(b1.join().unwrap(), Ok(()));
        assert_eq!((queued(&a), queued(&b)), (1, 0));
        let late = Ask {
            priority: 0,
            timeout: Some(Duration::from_millis(20)),
        };
        let a3 = tenant_waiter(&q2, late, &a, "a3", &order);
        assert!(matches!(a3.join().unwrap(), Err(Refused::Timeout { .. })));
        assert_eq!(queued(&a), 1, "the timed-out one left");
        tx2.send(()).unwrap();
        holder2.join().unwrap();
        assert_eq!(a2.join().unwrap(), Ok(()));
        assert_eq!((queued(&a), queued(&b)), (0, 0));
        assert_eq!(*order.lock().unwrap(), ["a1", "b1", "a2"]);
    }

    #[test]
    fn a_light_tenant_waits_about_one_run_behind_a_closed_loop_flood() {
        // a keeps 6 requests in line (6 closed-loop callers), b sends one
        // at a time, each run as long as a's. For each of b's requests,
        // count the runs of a's admitted between its call and its run:
        // first come first served gives about 5; the fair clock about 1.
        // (A clock floored at real time, `v = max(now, last_T)` with steps
        // of `s / weight`, drifts to first come first served once b has
        // had its share for a while: about 5 by the end of this run.)
        let t = tenants(TWO);
        let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let q = Arc::new(ModelQueue::with_policy(1, no_aging()));
        let a_runs = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let work = || {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            }
        };
        let flood: Vec<_> = (0..6)
            .map(|_| {
                let (q, a, a_runs, stop) = (q.clone(), a.clone(), a_runs.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        q.run_for(Ask::default(), Some(&a), &mut Timeline::default(), || {
                            a_runs.fetch_add(1, Ordering::SeqCst);
                            work();
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        // Let the flood fill the line.
        while a_runs.load(Ordering::SeqCst) < 50 {
            std::thread::yield_now();
        }
        let mut ahead = Vec::new();
        for _ in 0..200 {
            let before = a_runs.load(Ordering::SeqCst);
            let at_run = q
                .run_for(Ask::default(), Some(&b), &mut Timeline::default(), || {
                    let r = a_runs.load(Ordering::SeqCst);
                    work();
                    r
                })
                .unwrap();
            ahead.push(at_run - before);
        }
        stop.store(true, Ordering::SeqCst);
        for f in flood {
            f.join().unwrap();
        }
        let mean = ahead.iter().sum::<usize>() as f64 / ahead.len() as f64;
        assert!(mean <= 3.0, "a's runs ahead of each of b's: {ahead:?}");
        assert_eq!((queued(&a), queued(&b)), (0, 0));
    }

    const THREE: &str =
        "[[tenant]]\nname = \"a\"\nuids = [1]\n[[tenant]]\nname = \"b\"\nuids = [2]\n\
                         [[tenant]]\nname = \"h\"\nuids = [3]\n";

    /// The position (from 0) of `tag` in `order`.
    fn place(order: &[&'static str], tag: &str) -> usize {
        order.iter().position(|&x| x == tag).expect("it ran")
    }

    #[test]
    fn a_higher_levels_admissions_do_not_push_a_lower_level_newcomer_back() {
        // a has 10 requests waiting at level 2, h 10 at level 1; h's run
        // first, then a's first holds the model. b arriving at level 2
        // then starts where a's next one does, not behind all of a's: the
        // admissions of h (level 1) moved the clock past a's starts, but
        // a level's clock never passes the starts waiting at that level.
        let t = tenants(THREE);
        let (a, b, h) = (tenant_of(&t, 1), tenant_of(&t, 2), tenant_of(&t, 3));
        let (q, tx, holder) = held(QueuePolicy {
            priority_levels: 2,
            default_priority: 2,
            ..no_aging()
        });
        let order = Arc::new(Mutex::new(Vec::new()));
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(Some(gate_rx)));
        let mut ws = Vec::new();
        for _ in 0..10 {
            let (order, gate) = (order.clone(), gate.clone());
            ws.push(tenant_waiter_with(&q, at(2), &a, move || {
                order.lock().unwrap().push("a");
                // The first of a's to run holds the model.
                let rx = gate.lock().unwrap().take();
                if let Some(rx) = rx {
                    let _ = rx.recv();
                }
            }));
        }
        for _ in 0..10 {
            ws.push(tenant_waiter(&q, at(1), &h, "h", &order));
        }
        tx.send(()).unwrap();
        holder.join().unwrap();
        // h's 10, then a's first (holding the model).
        let t0 = Instant::now();
        while order.lock().unwrap().len() < 11 {
            assert!(t0.elapsed().as_secs() < 10, "stuck: {:?}", order);
            std::thread::yield_now();
        }
        ws.push(tenant_waiter(&q, at(2), &b, "b", &order));
        gate_tx.send(()).unwrap();
        for w in ws {
            assert_eq!(w.join().unwrap(), Ok(()));
        }
        let order = order.lock().unwrap();
        assert_eq!(
            order[..11],
            ["h"; 10].iter().chain(&["a"]).copied().collect::<Vec<_>>()[..]
        );
        // At most one of a's between a's running one and b.
        let b_at = place(&order, "b");
        assert!(b_at <= 12, "b admitted {}th of 21: {order:?}", b_at + 1);
        assert_eq!((queued(&a), queued(&b), queued(&h)), (0, 0, 0));
    }

    #[test]
    fn a_request_that_times_out_in_line_gives_its_tenant_its_step_back() {
        // a has 20 requests waiting; b sends 10 that time out in line, then
        // one more: it starts where a's first one does (as if the 10 had
        // never come), not behind all of a's.
        let t = tenants(TWO);
        let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let (q, tx, holder) = held(no_aging());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut ws: Vec<_> = (0..20)
            .map(|_| tenant_waiter(&q, Ask::default(), &a, "a", &order))
            .collect();
        let late = Ask {
            priority: 0,
            timeout: Some(Duration::from_millis(1)),
        };
        let gone: Vec<_> = (0..10)
            .map(|_| tenant_waiter(&q, late, &b, "b late", &order))
            .collect();
        for g in gone {
            assert!(matches!(g.join().unwrap(), Err(Refused::Timeout { .. })));
        }
        assert_eq!(q.stats().timed_out, 10);
        ws.push(tenant_waiter(&q, Ask::default(), &b, "b", &order));
        tx.send(()).unwrap();
        holder.join().unwrap();
        for w in ws {
            assert_eq!(w.join().unwrap(), Ok(()));
        }
        let order = order.lock().unwrap();
        assert!(!order.contains(&"b late"));
        let b_at = place(&order, "b");
        assert!(b_at <= 1, "b admitted {}th of 21: {order:?}", b_at + 1);
        assert_eq!((queued(&a), queued(&b)), (0, 0));
    }

    #[test]
    fn a_later_request_of_the_tenant_moves_up_when_an_earlier_one_times_out() {
        // b's two requests wait; the first times out: the second moves to
        // where the first was (ahead of a's later ones).
        let t = tenants(TWO);
        let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let (q, tx, holder) = held(no_aging());
        let order = Arc::new(Mutex::new(Vec::new()));
        // (Usually it times out after the others came; if not, b's next
        // one starts at V when it comes.)
        let late = Ask {
            priority: 0,
            timeout: Some(Duration::from_millis(100)),
        };
        // b: starts V (times out) and V + 1 step; a: V, V + 2 steps, ...
        let gone = tenant_waiter(&q, late, &b, "b late", &order);
        let mut ws = vec![tenant_waiter(&q, Ask::default(), &b, "b", &order)];
        ws.extend((0..10).map(|_| tenant_waiter(&q, Ask::default(), &a, "a", &order)));
        assert!(matches!(gone.join().unwrap(), Err(Refused::Timeout { .. })));
        tx.send(()).unwrap();
        holder.join().unwrap();
        for w in ws {
            assert_eq!(w.join().unwrap(), Ok(()));
        }
        let order = order.lock().unwrap();
        // b now starts at V, as a's first; it came first.
        assert_eq!(place(&order, "b"), 0, "{order:?}");
        assert_eq!((queued(&a), queued(&b)), (0, 0));
    }

    #[test]
    fn the_aging_floor_never_lifts_the_clock_past_starts_still_waiting() {
        // Aging 1 ms: once 20 ms have passed, `now - aging` is past every
        // start a's 10 requests got (1 ms apart: the interval was not
        // measured yet). b arriving then must not start behind them all.
        let t = tenants(TWO);
        let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let (q, tx, holder) = held(QueuePolicy {
            aging: Duration::from_millis(1),
            ..QueuePolicy::default()
        });
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut ws: Vec<_> = (0..10)
            .map(|_| tenant_waiter(&q, Ask::default(), &a, "a", &order))
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        ws.push(tenant_waiter(&q, Ask::default(), &b, "b", &order));
        tx.send(()).unwrap();
        holder.join().unwrap();
        for w in ws {
            assert_eq!(w.join().unwrap(), Ok(()));
        }
        let order = order.lock().unwrap();
        let b_at = place(&order, "b");
        assert!(b_at <= 1, "b admitted {}th of 11: {order:?}", b_at + 1);
    }

    /// A waiter in line at `turn` (for [`Fair`] alone).
    fn line_waiter(seq: u64, turn: Instant) -> Waiter {
        Waiter {
            seq,
            turn,
            deadline: None,
            member: None,
            wake: Arc::new(Condvar::new()),
        }
    }

    /// The fair starts of `tenant`'s requests waiting in `f`.
    fn starts(f: &Fair, tenant: &Tenant) -> Vec<(u64, Instant)> {
        f.tenants
            .iter()
            .find(|t| Arc::ptr_eq(&t.usage, &tenant.usage))
            .map(|t| t.waiting.iter().map(|q| (q.seq, q.start)).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_step_given_back_moves_the_tenants_later_requests_and_turns_back() {
        let t = tenants(TWO);
        let (a, b) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let hour = Duration::from_secs(3600);
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut f = Fair {
            interval_ns: 1_000_000,
            samples: WARM_UP,
            ..Fair::default()
        };
        let mut line = Vec::new();
        // b alone: steps of 1 ms; then a beside it: steps of 2 ms.
        for (seq, who) in [(0, &b), (1, &b), (2, &b), (3, &a), (4, &a)] {
            let start = f.join(who, seq, 1, t0, hour);
            line.push(line_waiter(seq, start));
        }
        assert_eq!(starts(&f, &b), [(0, t0), (1, t0 + ms(1)), (2, t0 + ms(2))]);
        assert_eq!(starts(&f, &a), [(3, t0), (4, t0 + ms(2))]);
        // b's second times out: its third takes its place, and its next
        // request starts a step earlier.
        line.retain(|w| w.seq != 1);
        f.left(1, false, &mut line);
        assert_eq!(starts(&f, &b), [(0, t0), (2, t0 + ms(1))]);
        assert_eq!(line.iter().find(|w| w.seq == 2).unwrap().turn, t0 + ms(1));
        // Its first is served, then its third times out: back to where
        // the first put it.
        line.retain(|w| w.seq != 0);
        f.left(0, true, &mut line);
        line.retain(|w| w.seq != 2);
        f.left(2, false, &mut line);
        assert_eq!(f.join(&b, 5, 1, t0, hour), t0 + ms(1));
        // a's are where they were.
        assert_eq!(starts(&f, &a), [(3, t0), (4, t0 + ms(2))]);
    }

    #[test]
    fn a_step_given_back_passes_a_served_request_only_as_far_as_it_could_go() {
        let t = tenants(TWO);
        let b = tenant_of(&t, 2);
        let hour = Duration::from_secs(3600);
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut f = Fair {
            interval_ns: 1_000_000,
            samples: WARM_UP,
            ..Fair::default()
        };
        let mut line = Vec::new();
        // Level 2 at 0 ms; level 1 when the aging floor has lifted the
        // clock to 5 ms: at 5 ms; level 2 again: at 6 ms.
        for (seq, level, now) in [(0, 2, t0), (1, 1, t0 + hour + ms(5)), (2, 2, t0 + hour)] {
            let start = f.join(&b, seq, level, now, hour);
            line.push(line_waiter(seq, start));
        }
        assert_eq!(starts(&f, &b), [(0, t0), (1, t0 + ms(5)), (2, t0 + ms(6))]);
        // The level-1 one is served; then the first times out: the third
        // stays at 6 ms (had the first never come, the second would still
        // have started at 5 ms), not 5.
        line.retain(|w| w.seq != 1);
        f.left(1, true, &mut line);
        line.retain(|w| w.seq != 0);
        f.left(0, false, &mut line);
        assert_eq!(starts(&f, &b), [(2, t0 + ms(6))]);
        assert_eq!(line[0].turn, t0 + ms(6));
    }

    #[test]
    fn a_step_given_back_never_moves_a_request_behind_its_levels_clock() {
        // a: level 2 at 0 ms, level 1 at 1 and 2 ms. c arrives at level 1
        // when the aging floor has lifted the clock past 1 ms: level 1's
        // clock is 1 ms (a's smallest start there), and c starts there.
        // a's level-2 one timing out then must not move a's level-1 ones
        // ahead of c's start (two of a's before c).
        let t = tenants(THREE);
        let (a, c) = (tenant_of(&t, 1), tenant_of(&t, 2));
        let aging = Duration::from_secs(3600);
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut f = Fair {
            interval_ns: 1_000_000,
            samples: WARM_UP,
            ..Fair::default()
        };
        let mut line = Vec::new();
        for (seq, level) in [(0, 2), (1, 1), (2, 1)] {
            let start = f.join(&a, seq, level, t0, aging);
            line.push(line_waiter(seq, start));
        }
        let start = f.join(&c, 3, 1, t0 + aging + ms(5), aging);
        assert_eq!(start, t0 + ms(1));
        line.push(line_waiter(3, start));
        line.retain(|w| w.seq != 0);
        f.left(0, false, &mut line);
        assert_eq!(starts(&f, &a), [(1, t0 + ms(1)), (2, t0 + ms(2))]);
    }

    #[test]
    fn the_interval_is_known_from_the_first_admission_and_averaged_at_first() {
        let t = tenants(TWO);
        let a = tenant_of(&t, 1);
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // The line formed at 0; the run in progress ended at 20 ms: a run
        // takes at least 20 ms, not the 1 ms default.
        let mut f = Fair {
            line_since: Some(t0),
            ..Fair::default()
        };
        f.granted(t0 + ms(20), true, 1);
        assert_eq!(f.interval_ns, 20_000_000);
        let v = f.join(&a, 0, 1, t0 + ms(20), Duration::from_secs(3600));
        assert_eq!(
            f.join(&a, 1, 1, t0 + ms(20), Duration::from_secs(3600)),
            v + ms(20)
        );
        // Measures then replace it, averaged evenly at first: 30, then
        // (30 + 10) / 2.
        f.granted(t0 + ms(50), true, 1);
        assert_eq!(f.interval_ns, 30_000_000);
        f.granted(t0 + ms(60), true, 1);
        assert_eq!(f.interval_ns, 20_000_000);
    }

    #[test]
    fn policies_are_checked() {
        assert!(QueuePolicy::default().validate().is_ok());
        let bad = |p: QueuePolicy| p.validate().unwrap_err();
        assert!(bad(QueuePolicy {
            priority_levels: 0,
            ..QueuePolicy::default()
        })
        .contains("priority_levels"));
        assert!(bad(QueuePolicy {
            default_priority: 3,
            priority_levels: 2,
            ..QueuePolicy::default()
        })
        .contains("default_priority"));
        assert!(bad(QueuePolicy {
            aging: Duration::ZERO,
            ..QueuePolicy::default()
        })
        .contains("aging"));
        assert!(bad(QueuePolicy {
            aging: Duration::from_secs(90_000),
            ..QueuePolicy::default()
        })
        .contains("a day"));
        assert!(bad(QueuePolicy {
            preempt: true,
            ..QueuePolicy::default()
        })
        .contains("preempt needs priority_levels"));
    }

    /// What a run started by [`stoppable`] does with a stop.
    #[derive(Clone, Copy, PartialEq)]
    enum OnStop {
        /// Ends at once, answering `Err` (as ONNX Runtime does).
        End,
        /// Goes on until released (an engine that cannot stop).
        Ignore,
    }

    /// Starts a preemptible request asking `ask` whose run records `tag`
    /// each time it starts, then works until `release` is set (answering
    /// `Ok(tag)`) or, as `on_stop` says, its thread's run is stopped.
    fn stoppable(
        q: &Arc<ModelQueue>,
        ask: Ask,
        tag: &'static str,
        order: &Arc<Mutex<Vec<&'static str>>>,
        release: &Arc<std::sync::atomic::AtomicBool>,
        on_stop: OnStop,
    ) -> std::thread::JoinHandle<Result<Result<&'static str, ()>, Refused>> {
        let (q, order, release) = (q.clone(), order.clone(), release.clone());
        std::thread::spawn(move || {
            let run = || {
                order.lock().unwrap().push(tag);
                loop {
                    let stopped = engine::RunStop::this_thread().is_some_and(|s| s.is_stopped());
                    if stopped && on_stop == OnStop::End {
                        return Err(());
                    }
                    if release.load(Ordering::SeqCst) {
                        return Ok(tag);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            };
            q.run_preemptible(ask, None, &mut Timeline::default(), run, |r| r.is_err())
        })
    }

    fn preempting(aging: Duration) -> QueuePolicy {
        QueuePolicy {
            priority_levels: 2,
            default_priority: 2,
            aging,
            preempt: true,
            ..QueuePolicy::default()
        }
    }

    /// A low-priority run in progress, then a high-priority request: the
    /// order the runs started in, and the queue's counters once both ended.
    fn low_then_high(policy: QueuePolicy, low_on_stop: OnStop) -> (Vec<&'static str>, QueueStats) {
        let q = Arc::new(ModelQueue::with_policy(1, policy));
        let order = Arc::new(Mutex::new(Vec::new()));
        let (go_low, go_high) = (Arc::default(), Arc::new(true.into()));
        let low = stoppable(&q, at(2), "low", &order, &go_low, low_on_stop);
        wait_stats(&q, |s| s.running == 1);
        std::thread::sleep(Duration::from_millis(20));
        let high = stoppable(&q, at(1), "high", &order, &go_high, OnStop::End);
        // The high one ends first when it stops the low one; else it waits.
        let t0 = Instant::now();
        while order.lock().unwrap().len() < 2 && t0.elapsed() < Duration::from_millis(300) {
            std::thread::sleep(Duration::from_millis(1));
        }
        go_low.store(true, Ordering::SeqCst);
        assert_eq!(high.join().unwrap(), Ok(Ok("high")));
        assert_eq!(low.join().unwrap(), Ok(Ok("low")));
        let order = order.lock().unwrap().clone();
        (order, q.stats())
    }

    #[test]
    fn a_request_whose_turn_comes_first_stops_the_run_in_progress() {
        let (order, stats) = low_then_high(preempting(Duration::from_secs(3600)), OnStop::End);
        assert_eq!(
            order,
            ["low", "high", "low"],
            "stopped, then run again after"
        );
        assert_eq!((stats.preempted, stats.completed), (1, 2));
        assert_eq!((stats.running, stats.waiting), (0, 0));
    }

    #[test]
    fn without_preempt_or_with_an_earlier_turn_the_run_goes_on() {
        let plain = QueuePolicy {
            preempt: false,
            ..preempting(Duration::from_secs(3600))
        };
        let (order, stats) = low_then_high(plain, OnStop::End);
        assert_eq!((order, stats.preempted), (vec!["low", "high"], 0));
        // Aging 1 ms: 20 ms after it came, the low request's turn is ahead
        // of the newcomer's, so it is not stopped.
        let (order, stats) = low_then_high(preempting(Duration::from_millis(1)), OnStop::End);
        assert_eq!((order, stats.preempted), (vec!["low", "high"], 0));
    }

    #[test]
    fn a_run_that_finishes_although_stopped_keeps_its_result() {
        let (order, stats) = low_then_high(preempting(Duration::from_secs(3600)), OnStop::Ignore);
        assert_eq!(order, ["low", "high"]);
        assert_eq!((stats.preempted, stats.completed), (0, 2));
        // Its thread's flag was cleared: a next run there is not stopped.
        let q = ModelQueue::with_policy(1, preempting(Duration::from_secs(1)));
        let r = q.run_preemptible(
            at(2),
            None,
            &mut Timeline::default(),
            || engine::RunStop::this_thread().map(|s| s.is_stopped()),
            |_| false,
        );
        assert_eq!(r, Ok(Some(false)));
    }
}
