//! [`ModelQueue`]: the per-model queue between sessions and the engine.
//!
//! Admission is FIFO by ticket, with at most `concurrency` runs of the model
//! at once. Whoever is admitted runs the model *on its own thread*: there
//! are no engine worker threads to hand requests to, because waking a
//! sleeping thread on the other core costs ~5 µs each way on these
//! machines, more than the whole socket round trip. When the model is busy,
//! requests wait here, in order, and the time they wait is the timeline's
//! queue stage. Dynamic batching fits the same shape: the admitted holder
//! may take the requests queued behind it along into one run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use wire::{Stage, Timeline};

/// One run in progress, in [`ModelQueue::word`].
const RUNNING_ONE: u64 = 1;
/// One request waiting (or taking a ticket), in [`ModelQueue::word`].
const WAITING_ONE: u64 = 1 << 32;
const RUNNING_MASK: u64 = WAITING_ONE - 1;

/// FIFO admission to a model, `concurrency` runs at a time.
///
/// A request that finds the model free and nobody waiting is admitted by
/// one compare-and-swap on [`word`](Self::word), without the lock: the
/// common case of an idle or lightly used model costs two atomic
/// operations, not two lock round trips. As soon as one request has to
/// wait, every later one takes a ticket under the lock, so the order stays
/// first come, first served; the fast path opens again when nobody waits.
#[derive(Debug)]
pub struct ModelQueue {
    /// Runs in progress (low 32 bits) and requests in the ticket line (high
    /// 32 bits). A run is counted here from its admission to its end.
    word: AtomicU64,
    state: Mutex<State>,
    cv: Condvar,
    concurrency: usize,
    /// Runs completed, for stats.
    completed: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Next ticket to hand out.
    next: u64,
    /// Lowest ticket not yet admitted.
    head: u64,
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
}

impl ModelQueue {
    /// A queue admitting `concurrency` (≥ 1, at most 2^31) runs at once.
    pub fn new(concurrency: usize) -> ModelQueue {
        ModelQueue {
            word: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            concurrency: concurrency.clamp(1, 1 << 31),
            completed: AtomicU64::new(0),
        }
    }

    /// How many runs it admits at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// Whether a request arriving now would run without waiting: a run is
    /// free and nobody waits. A hint only (it may change at once); callers
    /// use it to choose where to run a request, never for correctness.
    pub fn has_free_run(&self) -> bool {
        self.word.load(Ordering::Relaxed) < self.concurrency as u64
    }

    /// Waits for this request's turn, runs `f` on the calling thread, and
    /// stamps `Queued`, `ComputeStart` and `ComputeEnd` on `timeline`. A
    /// request admitted at once (one compare-and-swap) gets its `Queued`
    /// time as `ComputeStart` too, rather than a second clock read
    /// (~30 ns) for a wait of a few ns.
    pub fn run<R>(&self, timeline: &mut Timeline, f: impl FnOnce() -> R) -> R {
        timeline.stamp(Stage::Queued);
        let waited = !self.try_admit_at_once();
        if waited {
            self.admit_in_turn();
        }
        // Released on every exit, including a panic inside `f`.
        let _slot = Slot(self);
        if waited {
            timeline.stamp(Stage::ComputeStart);
        } else {
            timeline.set(Stage::ComputeStart, timeline.get(Stage::Queued));
        }
        let r = f();
        timeline.stamp(Stage::ComputeEnd);
        r
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

    /// The ticket line: waits until this ticket is the first and a run is
    /// free, then takes the run.
    fn admit_in_turn(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // From here the fast path is closed (the waiting count is not 0).
        self.word.fetch_add(WAITING_ONE, Ordering::Relaxed);
        let ticket = s.next;
        s.next += 1;
        loop {
            if s.head == ticket {
                // A run ending does not take the lock to decrement, so
                // take a free run by compare-and-swap, as the fast path does.
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
            // Woken by a run ending (it locks before notifying, so the wake
            // cannot fall between the check above and this wait) or by the
            // ticket ahead being admitted.
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.head += 1;
        // The next ticket may be admissible too (concurrency > 1).
        if self.word.load(Ordering::Relaxed) >= WAITING_ONE {
            self.cv.notify_all();
        }
    }

    /// Current counters.
    pub fn stats(&self) -> QueueStats {
        let w = self.word.load(Ordering::Relaxed);
        QueueStats {
            running: (w & RUNNING_MASK) as usize,
            waiting: (w >> 32) as usize,
            completed: self.completed.load(Ordering::Relaxed),
        }
    }
}

struct Slot<'a>(&'a ModelQueue);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let q = self.0;
        q.completed.fetch_add(1, Ordering::Relaxed);
        let before = q.word.fetch_sub(RUNNING_ONE, Ordering::Release);
        // Waking costs a syscall: only when someone waits. The lock orders
        // this wake after a waiter's check (see `admit_in_turn`).
        if before >= WAITING_ONE {
            let _g = q.state.lock().unwrap_or_else(|p| p.into_inner());
            q.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn stamps_in_order() {
        let q = ModelQueue::new(1);
        let mut tl = Timeline::default();
        let v = q.run(&mut tl, || 5);
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
                            q.run(&mut Timeline::default(), || {
                                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(n, Ordering::SeqCst);
                                std::thread::yield_now();
                                now.fetch_sub(1, Ordering::SeqCst);
                            });
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
                q.run(&mut Timeline::default(), || hold_rx.recv().unwrap());
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
                q.run(&mut Timeline::default(), || order.lock().unwrap().push(i));
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
                completed: 5
            }
        );
        // Nobody waits: the fast path is open again.
        assert!(q.try_admit_at_once());
    }

    #[test]
    fn panic_releases_slot() {
        let q = ModelQueue::new(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            q.run(&mut Timeline::default(), || panic!("boom"))
        }));
        assert!(r.is_err());
        assert_eq!(q.run(&mut Timeline::default(), || 1), 1);
    }
}
