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
//! is its arrival time plus `(level - 1) × aging` (level 1 is the highest),
//! and the waiter with the earliest turn goes first (between equal turns,
//! the one that came first). So a higher level is served first, and no
//! request starves: a request of level `p` is ahead of every request that
//! arrives more than `(p - 1) × aging` after it. The turn is fixed when the
//! request arrives, so the order of two waiters never changes while they
//! wait (an order that moved with the clock could leave two waiters each
//! deferring to the other with the model free). A request may wait at most
//! its timeout (its own, capped by the policy's default when there is one);
//! then it leaves the queue answered [`Refused::Timeout`], never computed.
//! With `max_queue` requests already waiting, one more is refused at once
//! ([`Refused::Overloaded`]).
//!
//! Dynamic batching uses the same line (see [`crate::batcher`]): a
//! request that may share a run waits as a [`Member`]; when its turn comes
//! it *leads*: holding the run, it takes the compatible members waiting
//! behind it (in turn order, up to the batch's limit, waiting up to the
//! model's queue delay for more) along into one run. A member taken along
//! leaves the line at once; its leader answers it.

use crate::batcher::{BatchPolicy, Member};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use wire::{Stage, Timeline};

/// One run in progress, in [`ModelQueue::word`].
const RUNNING_ONE: u64 = 1;
/// One request waiting, in [`ModelQueue::word`].
const WAITING_ONE: u64 = 1 << 32;
const RUNNING_MASK: u64 = WAITING_ONE - 1;

/// How a model's queue orders and bounds the requests that wait.
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
}

impl Default for QueuePolicy {
    /// No queue limit, one priority level, aging 1 s, no timeout.
    fn default() -> Self {
        QueuePolicy {
            max_queue: 0,
            priority_levels: 1,
            default_priority: 1,
            aging: Duration::from_secs(1),
            default_timeout: None,
            timeout_override: true,
        }
    }
}

impl QueuePolicy {
    /// Checks the settings: 1 ≤ levels, default level within them, a
    /// non-zero aging. The message names the bad setting.
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// 1 = highest; 0 = the model's default level.
    pub priority: u8,
    /// The longest wait; `None` = the model's default.
    pub timeout: Option<Duration>,
}

impl Ask {
    /// The request header's fields: `priority`, and `timeout_us` (0 = none).
    pub fn from_header(priority: u8, timeout_us: u32) -> Ask {
        Ask {
            priority,
            timeout: (timeout_us != 0).then(|| Duration::from_micros(timeout_us.into())),
        }
    }
}

/// Why the queue did not run a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
        }
    }
}

/// Admission to a model, `concurrency` runs at a time, in the order of a
/// [`QueuePolicy`].
///
/// A request that finds the model free and nobody waiting is admitted by
/// one compare-and-swap on [`word`](Self::word), without the lock: the
/// common case of an idle or lightly used model costs two atomic
/// operations, not two lock round trips. As soon as one request has to
/// wait, every later one goes through the lock and the policy's order; the
/// fast path opens again when nobody waits.
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
}

impl ModelQueue {
    /// A queue admitting `concurrency` (≥ 1, at most 2^31) runs at once,
    /// waiters in arrival order (the default policy).
    pub fn new(concurrency: usize) -> ModelQueue {
        ModelQueue::with_policy(concurrency, QueuePolicy::default())
    }

    /// A queue admitting `concurrency` runs at once, ordered and bounded by
    /// `policy` (checked by the caller: [`QueuePolicy::validate`]).
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
        }
    }

    /// How many runs it admits at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// Its policy.
    pub fn policy(&self) -> &QueuePolicy {
        &self.policy
    }

    /// Whether a request arriving now would run without waiting: a run is
    /// free and nobody waits. A hint only (it may change at once); callers
    /// use it to choose where to run a request, never for correctness.
    pub fn has_free_run(&self) -> bool {
        self.word.load(Ordering::Relaxed) < self.concurrency as u64
    }

    /// Waits for this request's turn (as `ask` and the policy say), runs
    /// `f` on the calling thread, and stamps `Queued`, `ComputeStart` and
    /// `ComputeEnd` on `timeline`. A request admitted at once (one
    /// compare-and-swap) gets its `Queued` time as `ComputeStart` too,
    /// rather than a second clock read (~30 ns) for a wait of a few ns.
    /// A request refused (full queue, timeout, unknown priority) never runs
    /// `f`.
    pub fn run<R>(
        &self,
        ask: Ask,
        timeline: &mut Timeline,
        f: impl FnOnce() -> R,
    ) -> Result<R, Refused> {
        let levels = self.policy.priority_levels;
        if ask.priority > levels {
            return Err(Refused::BadPriority {
                asked: ask.priority,
                levels,
            });
        }
        timeline.stamp(Stage::Queued);
        let waited = !self.try_admit_at_once();
        if waited {
            self.admit_in_turn(ask, None)?;
        }
        // Released on every exit, including a panic inside `f`.
        let _slot = RunSlot(self);
        if waited {
            timeline.stamp(Stage::ComputeStart);
        } else {
            timeline.set(Stage::ComputeStart, timeline.get(Stage::Queued));
        }
        let r = f();
        timeline.stamp(Stage::ComputeEnd);
        Ok(r)
    }

    /// Waits in line as a request that may share a run (`member`): returns
    /// [`Turn::Lead`] when admitted (it then takes followers:
    /// [`take_followers`](Self::take_followers)) or [`Turn::Taken`] once a
    /// leader took it along (its outcome then arrives in the member). A
    /// request that finds the model free and nobody waiting leads at once.
    /// The caller stamped `Queued`.
    pub(crate) fn wait_as_member(
        &self,
        ask: Ask,
        member: &Arc<Member>,
    ) -> Result<Turn<'_>, Refused> {
        let levels = self.policy.priority_levels;
        if ask.priority > levels {
            return Err(Refused::BadPriority {
                asked: ask.priority,
                levels,
            });
        }
        if self.try_admit_at_once() || self.admit_in_turn(ask, Some(member))? {
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
        s.waiters.retain(|w| {
            let take = chosen.iter().any(|&(seq, _)| seq == w.seq);
            if take {
                if let Some(m) = &w.member {
                    // Not woken now: it sleeps on until its outcome is
                    // ready ([`wake_members`](Self::wake_members)), one
                    // wake-up in all.
                    m.mark_taken();
                    taken.push(m.clone());
                }
            }
            !take
        });
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
    /// wait: a priority the model lacks, or a full queue (counted). A
    /// snapshot: a request that passes may still be refused when it joins
    /// the line. Callers use it to refuse before they spend work on a
    /// request (the batcher's staging copy).
    pub(crate) fn check_admissible(&self, ask: Ask) -> Result<(), Refused> {
        let levels = self.policy.priority_levels;
        if ask.priority > levels {
            return Err(Refused::BadPriority {
                asked: ask.priority,
                levels,
            });
        }
        let max = self.policy.max_queue;
        if max != 0 && (self.word.load(Ordering::Relaxed) >> 32) as usize >= max {
            self.overloaded.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Overloaded { max_queue: max });
        }
        Ok(())
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
    /// run is free, then takes the run (`Ok(true)`); or, for a `member`,
    /// until a leader takes it along (`Ok(false)`); or leaves the line
    /// refused.
    fn admit_in_turn(&self, ask: Ask, member: Option<&Arc<Member>>) -> Result<bool, Refused> {
        let p = &self.policy;
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if p.max_queue != 0 && s.waiters.len() >= p.max_queue {
            self.overloaded.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Overloaded {
                max_queue: p.max_queue,
            });
        }
        // From here the fast path is closed (the waiting count is not 0).
        self.word.fetch_add(WAITING_ONE, Ordering::Relaxed);
        let arrived = Instant::now();
        let level = if ask.priority == 0 {
            p.default_priority
        } else {
            ask.priority
        };
        // At most 254 days (levels ≤ 255, aging ≤ a day): no overflow.
        let behind = p.aging.saturating_mul(u32::from(level.saturating_sub(1)));
        let timeout = match (
            ask.timeout.filter(|_| p.timeout_override),
            p.default_timeout,
        ) {
            (Some(own), Some(cap)) => Some(own.min(cap)),
            (own, default) => own.or(default),
        };
        let wake = Arc::new(Condvar::new());
        if let Some(m) = member {
            m.set_wake(&wake);
        }
        let me = Waiter {
            seq: s.next_seq,
            turn: arrived.checked_add(behind).unwrap_or(arrived),
            deadline: timeout.and_then(|t| arrived.checked_add(t)),
            member: member.cloned(),
            wake: wake.clone(),
        };
        let (seq, deadline) = (me.seq, me.deadline);
        s.next_seq += 1;
        s.waiters.push(me);
        if member.is_some() && s.gathering > 0 {
            // A leader waiting for members may take this one.
            self.gather.notify_all();
        }
        let mut told_pool = false;
        loop {
            if member.is_some_and(|m| m.is_taken()) {
                // Its leader removed it from the line and the count. A
                // wake meant for it (a run freed) passes on.
                self.wake_best(&s);
                return Ok(false);
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
                    break;
                }
                if (self.word.load(Ordering::Relaxed) & RUNNING_MASK) < self.concurrency as u64 {
                    continue; // the word changed under us: try again
                }
            }
            if deadline.is_some_and(|d| now >= d) {
                s.waiters.retain(|w| w.seq != seq);
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
        }
        s.waiters.retain(|w| w.seq != seq);
        // The next waiter may be admissible too (concurrency > 1).
        self.wake_best(&s);
        Ok(true)
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

    /// Current counters.
    pub fn stats(&self) -> QueueStats {
        let w = self.word.load(Ordering::Relaxed);
        QueueStats {
            running: (w & RUNNING_MASK) as usize,
            waiting: (w >> 32) as usize,
            completed: self.completed.load(Ordering::Relaxed),
            overloaded: self.overloaded.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
        }
    }
}

/// A run held from admission until dropped (also on a panic).
pub(crate) struct RunSlot<'a>(&'a ModelQueue);

impl Drop for RunSlot<'_> {
    fn drop(&mut self) {
        let q = self.0;
        q.completed.fetch_add(1, Ordering::Relaxed);
        let before = q.word.fetch_sub(RUNNING_ONE, Ordering::Release);
        // Waking costs a syscall: only when someone waits. The lock orders
        // this wake after a waiter's check (see `admit_in_turn`).
        if before >= WAITING_ONE {
            let s = q.state.lock().unwrap_or_else(|p| p.into_inner());
            q.wake_best(&s);
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
    }
}
