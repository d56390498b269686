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

use std::sync::{Condvar, Mutex};
use wire::{Stage, Timeline};

/// FIFO admission to a model, `concurrency` runs at a time.
#[derive(Debug)]
pub struct ModelQueue {
    state: Mutex<State>,
    cv: Condvar,
    concurrency: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Runs in progress.
    running: usize,
    /// Next ticket to hand out.
    next: u64,
    /// Lowest ticket not yet admitted.
    head: u64,
    /// Threads waiting for admission.
    waiting: usize,
    /// Runs completed, for stats.
    completed: u64,
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
    /// A queue admitting `concurrency` (≥ 1) runs at once.
    pub fn new(concurrency: usize) -> ModelQueue {
        ModelQueue {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            concurrency: concurrency.max(1),
        }
    }

    /// Waits for this request's turn, runs `f` on the calling thread, and
    /// stamps `Queued`, `ComputeStart` and `ComputeEnd` on `timeline`.
    pub fn run<R>(&self, timeline: &mut Timeline, f: impl FnOnce() -> R) -> R {
        timeline.stamp(Stage::Queued);
        {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let ticket = s.next;
            s.next += 1;
            if !(s.head == ticket && s.running < self.concurrency) {
                s.waiting += 1;
                while !(s.head == ticket && s.running < self.concurrency) {
                    s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
                }
                s.waiting -= 1;
            }
            s.head += 1;
            s.running += 1;
            if s.waiting > 0 {
                // The next ticket may be admissible too (concurrency > 1).
                self.cv.notify_all();
            }
        }
        // Released on every exit, including a panic inside `f`.
        let _slot = Slot(self);
        timeline.stamp(Stage::ComputeStart);
        let r = f();
        timeline.stamp(Stage::ComputeEnd);
        r
    }

    /// Current counters.
    pub fn stats(&self) -> QueueStats {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        QueueStats {
            running: s.running,
            waiting: s.waiting,
            completed: s.completed,
        }
    }
}

struct Slot<'a>(&'a ModelQueue);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        s.running -= 1;
        s.completed += 1;
        // Waking costs a syscall: only when someone waits.
        if s.waiting > 0 {
            self.0.cv.notify_all();
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
    fn panic_releases_slot() {
        let q = ModelQueue::new(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            q.run(&mut Timeline::default(), || panic!("boom"))
        }));
        assert!(r.is_err());
        assert_eq!(q.run(&mut Timeline::default(), || 1), 1);
    }
}
