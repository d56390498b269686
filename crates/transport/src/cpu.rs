//! Which CPU a thread runs on, and stepping off one: what a waiter does
//! when it finds the peer it waits for on its own CPU.
//!
//! Two threads that poll for each other only make progress on different
//! CPUs. On one CPU each spins until its slice ends or it yields, and a
//! round trip costs two context switches (~8 µs here, against ~0.5 µs
//! across cores). The scheduler puts them together easily — a woken thread
//! tends to run where its waker ran — and does not separate them while both
//! keep yielding. So a waiter that sees its peer on its CPU acts:
//! [`CpuStep::step_off`] moves it to another CPU of its own mask, at most
//! once per [`CpuStep::MOVE_EVERY`], and puts the mask back as it was (the
//! scheduler stays free to place the thread later, and a user's pinning is
//! never overridden: a thread whose mask holds one CPU never moves; a mask
//! another process changes during the microseconds of a move is put back
//! as it was before).
//! A waiter pinned there sleeps instead of spinning (its caller's
//! decision), which hands the CPU to the peer; one that moved a moment ago
//! polls on, yielding, as it would have without this module.
//!
//! How a waiter knows its peer is on its CPU: the shared-memory sides
//! publish the CPU they poll on in the arena (`shm::channel`). Sockets have
//! no such place and do not move: a reader that polls is capped at half
//! the CPUs per process (`spin::SOCKET_POLLERS`), and a guess from its own
//! context switches (a yield that switched means another thread wants the
//! CPU) moved sessions ~100 times a second with two clients on two CPUs
//! and made their p99 worse (docs/BENCHMARKS.md, "Placement").

use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Moves made by every [`CpuStep`] of this process.
static MOVES: AtomicU64 = AtomicU64::new(0);

/// How many times threads of this process moved off a CPU they found
/// shared with their peer (the agent reports it in its stats).
///
/// # Examples
///
/// ```
/// use transport::cpu::{current, moves_total, CpuStep, Step};
/// let before = moves_total();
/// let mut step = CpuStep::new();
/// let moved = step.step_off(current()) == Step::Moved;
/// assert_eq!(moves_total(), before + u64::from(moved));
/// ```
pub fn moves_total() -> u64 {
    MOVES.load(Ordering::Relaxed)
}

/// The CPU this thread runs on now (the vDSO's `getcpu`: nanoseconds).
///
/// # Examples
///
/// ```
/// let cpu = transport::cpu::current();
/// let online = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
/// let last: usize = online.trim().rsplit(['-', ',']).next().ok_or("a CPU list")?.parse()?;
/// assert!(cpu <= last);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn current() -> usize {
    sched_getcpu()
}

/// True if this thread's mask lets it run on a CPU other than `cpu`.
///
/// # Examples
///
/// A thread pinned to one CPU may not leave it:
///
/// ```
/// use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
/// use transport::cpu::{current, may_leave};
/// let pinned = std::thread::spawn(|| -> std::io::Result<bool> {
///     let cpu = current();
///     let mut only = CpuSet::new();
///     only.set(cpu);
///     sched_setaffinity(None, &only)?;
///     Ok(may_leave(cpu))
/// });
/// assert!(!pinned.join().unwrap()?);
/// let cpus = sched_getaffinity(None)?.count();
/// assert_eq!(may_leave(current()), cpus > 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn may_leave(cpu: usize) -> bool {
    sched_getaffinity(None).is_ok_and(|m| m.count() > 1 || !m.is_set(cpu))
}

/// What [`CpuStep::step_off`] did. Example: [`CpuStep`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The thread now runs on another CPU.
    Moved,
    /// It was not on that CPU (any more): nothing to do.
    NotThere,
    /// It moved less than [`CpuStep::MOVE_EVERY`] ago: it stays for now.
    TooSoon,
    /// Its mask holds it on that CPU: it never moves from there.
    Pinned,
}

/// One waiter's moves off its peer's CPU (see the module docs).
///
/// # Examples
///
/// A waiter that finds its peer on its own CPU steps off it, at most
/// once per [`CpuStep::MOVE_EVERY`]:
///
/// ```
/// use rustix::thread::sched_getaffinity;
/// use transport::cpu::{current, CpuStep, Step};
/// let mut step = CpuStep::new();
/// let peer_cpu = current(); // as the peer published it
/// let first = step.step_off(peer_cpu);
/// if sched_getaffinity(None)?.count() > 1 {
///     assert_eq!(first, Step::Moved);
///     assert_ne!(current(), peer_cpu);
///     assert_eq!(step.moves(), 1);
///     // Back on the peer's CPU within the millisecond, it stays:
///     assert!(matches!(step.step_off(current()), Step::TooSoon | Step::NotThere));
/// } else {
///     assert_eq!(first, Step::Pinned);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct CpuStep {
    last: Option<Instant>,
    moves: u64,
}

impl CpuStep {
    /// The least time between two moves of one waiter: if the collision
    /// comes back sooner (more spinning threads than CPUs, or a peer that
    /// follows), moving again at once would only bounce threads around;
    /// the waiter polls on, yielding, until it may move again.
    /// Example: [`CpuStep`].
    pub const MOVE_EVERY: Duration = Duration::from_millis(1);

    /// A waiter that has not moved yet.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(transport::cpu::CpuStep::new().moves(), 0);
    /// ```
    pub fn new() -> CpuStep {
        CpuStep::default()
    }

    /// Moves this thread off `cpu` to another CPU its mask allows, unless
    /// it is not on `cpu` (any more), it moved less than
    /// [`CpuStep::MOVE_EVERY`] ago, or its mask allows no other CPU. The
    /// mask is left as it was.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::cpu::{current, CpuStep, Step};
    /// let mut step = CpuStep::new();
    /// let cpus = rustix::thread::sched_getaffinity(None)?;
    /// let elsewhere = (0..rustix::thread::CpuSet::MAX_CPU).find(|&c| c != current());
    /// if let Some(other) = elsewhere.filter(|&c| cpus.is_set(c)) {
    ///     if current() != other { // (the scheduler may have moved us meanwhile)
    ///         assert_eq!(step.step_off(other), Step::NotThere); // the peer is elsewhere
    ///     }
    /// }
    /// let mask_before = rustix::thread::sched_getaffinity(None)?;
    /// step.step_off(current());
    /// assert_eq!(rustix::thread::sched_getaffinity(None)?, mask_before); // the mask is put back
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn step_off(&mut self, cpu: usize) -> Step {
        if current() != cpu {
            return Step::NotThere;
        }
        // Before the mask is read: a collision that lasts is looked at
        // every few hundred nanoseconds, and this keeps that to a clock
        // read.
        if self.last.is_some_and(|t| t.elapsed() < Self::MOVE_EVERY) {
            return Step::TooSoon;
        }
        let Ok(allowed) = sched_getaffinity(None) else {
            return Step::Pinned;
        };
        if allowed.count() < 2 || !allowed.is_set(cpu) {
            return Step::Pinned;
        }
        let mut elsewhere = allowed;
        elsewhere.unset(cpu);
        // Setting the narrower mask migrates this thread now; restoring the
        // old one does not move it back.
        let moved = sched_setaffinity(None, &elsewhere).is_ok();
        let _ = sched_setaffinity(None, &allowed);
        self.last = Some(Instant::now());
        if moved {
            self.moves += 1;
            MOVES.fetch_add(1, Ordering::Relaxed);
            Step::Moved
        } else {
            Step::Pinned
        }
    }

    /// How many times this waiter moved. Example: [`CpuStep`].
    pub fn moves(&self) -> u64 {
        self.moves
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::thread::CpuSet;

    fn cpus() -> u32 {
        sched_getaffinity(None).map_or(1, |m| m.count())
    }

    #[test]
    fn a_thread_moves_off_its_cpu_once_per_interval_and_keeps_its_mask() {
        if cpus() < 2 {
            eprintln!("skipped: this process may use one CPU only");
            return;
        }
        std::thread::spawn(|| {
            let mask = sched_getaffinity(None).unwrap();
            let mut step = CpuStep::new();
            let here = current();
            assert!(may_leave(here));
            assert_eq!(step.step_off(here), Step::Moved, "two CPUs: it moves");
            assert_ne!(current(), here, "it moved off cpu {here}");
            assert_eq!(sched_getaffinity(None).unwrap(), mask, "mask restored");
            // Right after a move, the next collision is not a move.
            let now = current();
            assert_eq!(step.step_off(now), Step::TooSoon);
            assert_eq!(step.moves(), 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_pinned_to_one_cpu_never_moves() {
        std::thread::spawn(|| {
            let mut one = CpuSet::new();
            one.set(current());
            sched_setaffinity(None, &one).unwrap();
            let here = current();
            assert!(!may_leave(here));
            assert_eq!(CpuStep::new().step_off(here), Step::Pinned);
            assert_eq!(sched_getaffinity(None).unwrap(), one);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_not_on_the_cpu_stays() {
        // No CPU has this number: the thread is not on it, whatever the
        // scheduler does meanwhile.
        let mut step = CpuStep::new();
        assert_eq!(step.step_off(usize::MAX / 2), Step::NotThere);
        assert_eq!(step.moves(), 0);
    }
}
