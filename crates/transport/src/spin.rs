//! Bounded busy-waiting before a blocking wait: the one policy every
//! receiver in tensorwire uses.
//!
//! A thread waiting for a message from another core can block — the kernel
//! parks it, and the sender then pays for a wake-up: an inter-processor
//! interrupt and, on a virtual machine, an exit to the hypervisor and back
//! (tens of microseconds a hop on the 2-vCPU machines we measure on, more
//! than everything else in an empty RPC). Or it can poll. Polling for a short
//! bounded time catches the messages that follow quickly — a closed-loop
//! client's next request, the answer to a small request — without any
//! wake-up, and costs the polling core's time. Then the receiver blocks as
//! before, so an idle connection costs nothing.
//!
//! [`Spin`] is one such wait: poll, and every `check_every` polls read the
//! clock and yield the CPU (so a peer that shares this core can run and send
//! what we are waiting for), until the budget is spent. The shared-memory
//! channel polls a ring (nanoseconds a poll, so it checks every 64); the
//! socket transports poll with a non-blocking `recv` (a system call, so
//! they check every 8).
//!
//! [`SpinSlots`] caps how many threads of a process poll at once: half the
//! CPUs, at least one (the Go runtime caps its spinning threads the same
//! way). Polling pays when a few connections are busy and CPUs are idle;
//! with more pollers than that, they only take CPU time from the threads
//! that would answer them. A waiter that gets no slot blocks at once, as if
//! it had no budget. The socket transports take their slots from
//! [`SOCKET_POLLERS`].
//!
//! [`SpinGate`] decides, per connection, whether spinning is paying off:
//! after [`SpinGate::MISS_LIMIT`] waits in a row in which the message came
//! only after blocking, it spins only on every
//! [`SpinGate::PROBE_EVERY`]th wait, until a spin catches a message again.
//! That keeps a connection with sparse traffic (a request every few
//! milliseconds, a model that runs for milliseconds) from burning the whole
//! budget on every message.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The slots socket readers of this process poll in (half the CPUs).
///
/// # Examples
///
/// ```
/// use transport::spin::{SHM_POLLERS, SOCKET_POLLERS};
/// let cpus = std::thread::available_parallelism()?.get();
/// assert_eq!(SOCKET_POLLERS.cap(), (cpus / 2).max(1));
/// assert_eq!(SHM_POLLERS.cap(), cpus);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub static SOCKET_POLLERS: SpinSlots = SpinSlots::new();

/// The slots the agent's shared-memory sessions poll in: one per CPU. A
/// ring poll costs nanoseconds, not a system call, and a session that may
/// not poll pays a futex wake-up (~5 µs each way) on every request, so
/// these are as many as the CPUs, not half: beyond that, pollers only take
/// turns on a CPU. Example: [`SOCKET_POLLERS`].
pub static SHM_POLLERS: SpinSlots = SpinSlots::one_per_cpu();

/// A process-wide cap on threads polling at once (see the module docs).
///
/// # Examples
///
/// A waiter polls only while it holds a slot; without one it blocks at
/// once:
///
/// ```
/// use transport::spin::SpinSlots;
/// let slots = SpinSlots::with_cap(1);
/// let first = slots.try_take();
/// assert!(first.is_some());
/// assert!(slots.try_take().is_none()); // one poller already
/// assert_eq!(slots.busy(), 1);
/// drop(first);
/// assert_eq!((slots.busy(), slots.cap()), (0, 1));
/// ```
#[derive(Debug)]
pub struct SpinSlots {
    busy: AtomicUsize,
    cap: OnceLock<usize>,
    /// The cap is the CPUs divided by this (at least one).
    cpus_per_slot: usize,
}

/// One taken slot of a [`SpinSlots`]; given back when dropped.
/// Example: [`SpinSlots`].
#[derive(Debug)]
pub struct SpinSlot<'a>(&'a SpinSlots);

impl SpinSlots {
    /// A cap of half the CPUs this process may run on, at least one (read
    /// on first use).
    ///
    /// # Examples
    ///
    /// ```
    /// static MY_POLLERS: transport::spin::SpinSlots = transport::spin::SpinSlots::new();
    /// assert!(MY_POLLERS.cap() >= 1);
    /// ```
    pub const fn new() -> SpinSlots {
        SpinSlots {
            busy: AtomicUsize::new(0),
            cap: OnceLock::new(),
            cpus_per_slot: 2,
        }
    }

    /// A cap of as many slots as this process has CPUs (read on first use).
    /// Example: [`SOCKET_POLLERS`] ([`SHM_POLLERS`] is one).
    pub const fn one_per_cpu() -> SpinSlots {
        SpinSlots {
            busy: AtomicUsize::new(0),
            cap: OnceLock::new(),
            cpus_per_slot: 1,
        }
    }

    /// A cap of exactly `cap` slots. Example: [`SpinSlots`].
    pub fn with_cap(cap: usize) -> SpinSlots {
        let s = SpinSlots::new();
        let _ = s.cap.set(cap);
        s
    }

    /// The cap. Examples: [`SpinSlots`], [`SOCKET_POLLERS`].
    pub fn cap(&self) -> usize {
        *self.cap.get_or_init(|| {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cpus / self.cpus_per_slot).max(1)
        })
    }

    /// Slots taken now. Example: [`SpinSlots`].
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::Relaxed)
    }

    /// A slot, or `None` when `cap` threads already poll. Example:
    /// [`SpinSlots`].
    pub fn try_take(&self) -> Option<SpinSlot<'_>> {
        let cap = self.cap();
        if self.busy.load(Ordering::Relaxed) >= cap {
            return None;
        }
        if self.busy.fetch_add(1, Ordering::Acquire) < cap {
            Some(SpinSlot(self))
        } else {
            self.busy.fetch_sub(1, Ordering::Release);
            None
        }
    }
}

impl Default for SpinSlots {
    fn default() -> Self {
        SpinSlots::new()
    }
}

impl Drop for SpinSlot<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Release);
    }
}

/// One bounded busy-wait. Create it when a wait starts; call
/// [`Spin::again`] after each poll that found nothing.
///
/// # Examples
///
/// Waiting for a flag another thread sets: poll for up to 2 ms, then
/// block.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use transport::spin::Spin;
/// let flag = Arc::new(AtomicBool::new(false));
/// let setter = { let f = flag.clone(); std::thread::spawn(move || f.store(true, Ordering::Release)) };
/// let mut spin = Spin::new(Duration::from_millis(2), 64);
/// assert_eq!(spin.granted(), Duration::from_millis(2));
/// let caught_spinning = loop {
///     if flag.load(Ordering::Acquire) {
///         break true;
///     }
///     if !spin.again() {
///         break false; // the budget is spent: block instead (a futex, a blocking read)
///     }
/// };
/// setter.join().unwrap(); // (here the blocking wait is a join)
/// assert!(flag.load(Ordering::Acquire));
/// println!("caught while spinning: {caught_spinning}");
/// ```
#[derive(Debug)]
pub struct Spin {
    budget: Duration,
    check_every: u32,
    polls: u32,
    start: Option<Instant>,
    spent: bool,
}

impl Spin {
    /// A wait that spins for at most `budget`, reading the clock (and
    /// yielding) every `check_every` polls (at least 1).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut no_spin = transport::spin::Spin::new(Duration::ZERO, 64);
    /// assert!(!no_spin.again()); // a zero budget blocks at once
    /// ```
    pub fn new(budget: Duration, check_every: u32) -> Spin {
        Spin {
            budget,
            check_every: check_every.max(1),
            polls: 0,
            start: None,
            spent: budget.is_zero(),
        }
    }

    /// After an empty poll: true to poll again, false once the budget is
    /// spent (and from then on), when the caller should block.
    ///
    /// The clock is first read at the first check, so a message that comes
    /// within `check_every` polls costs no clock read; the budget counts
    /// from that first read.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut spin = transport::spin::Spin::new(Duration::from_micros(200), 8);
    /// let mut polls = 0u32;
    /// while spin.again() && polls < 100_000_000 { polls += 1; } // nothing ever arrives
    /// assert!(spin.elapsed() >= Duration::from_micros(200));
    /// assert!(!spin.again()); // spent, from then on
    /// ```
    pub fn again(&mut self) -> bool {
        if self.spent {
            return false;
        }
        self.polls = self.polls.wrapping_add(1);
        if !self.polls.is_multiple_of(self.check_every) {
            std::hint::spin_loop();
            return true;
        }
        if self.elapsed() < self.budget {
            // Let the peer run if it shares this CPU: spinning on a core
            // the sender needs only delays the message.
            std::thread::yield_now();
            return true;
        }
        self.spent = true;
        false
    }

    /// True right after an [`Spin::again`] that read the clock (every
    /// `check_every` polls): when a caller checks anything slower than a
    /// poll.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut spin = transport::spin::Spin::new(Duration::from_secs(1), 4);
    /// let checks: Vec<bool> = (0..8).map(|_| { spin.again(); spin.at_check() }).collect();
    /// assert_eq!(checks, [false, false, false, true, false, false, false, true]);
    /// ```
    pub fn at_check(&self) -> bool {
        self.polls.is_multiple_of(self.check_every) && self.polls != 0
    }

    /// Ends the spin now: the next [`Spin::again`] says block.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut spin = transport::spin::Spin::new(Duration::from_secs(1), 64);
    /// assert!(spin.again());
    /// spin.stop(); // e.g. the peer is known to be asleep
    /// assert!(!spin.again());
    /// ```
    pub fn stop(&mut self) {
        self.spent = true;
    }

    /// The budget this wait was given. Example: [`Spin`].
    pub fn granted(&self) -> Duration {
        self.budget
    }

    /// When the wait first read the clock (`None`: not yet, the wait is
    /// younger than `check_every` polls).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut spin = transport::spin::Spin::new(Duration::from_secs(1), 64);
    /// assert!(spin.started().is_none());
    /// let waited = spin.elapsed(); // reads the clock
    /// assert!(spin.started().is_some() && waited.is_zero());
    /// ```
    pub fn started(&self) -> Option<Instant> {
        self.start
    }

    /// Time since the wait's first clock read (starting the clock now if it
    /// has not been read yet). Example: [`Spin::again`].
    pub fn elapsed(&mut self) -> Duration {
        let now = Instant::now();
        now - *self.start.get_or_insert(now)
    }
}

/// Whether a connection's next wait should spin, learned from how its
/// previous waits ended (see the module docs).
///
/// # Examples
///
/// A connection whose answers keep coming only after the spin gave up
/// stops spinning, probing now and then:
///
/// ```
/// use std::time::Duration;
/// use transport::spin::SpinGate;
/// let mut gate = SpinGate::new(Duration::from_micros(50));
/// for _ in 0..SpinGate::MISS_LIMIT {
///     assert_eq!(gate.grant(), Duration::from_micros(50));
///     gate.record(false); // had to block
/// }
/// assert!(!gate.is_open());
/// let grants: Vec<Duration> = (0..SpinGate::PROBE_EVERY).map(|_| gate.grant()).collect();
/// assert_eq!(grants.iter().filter(|g| !g.is_zero()).count(), 1); // one probe
/// gate.record(true); // the probe caught its message: traffic is dense again
/// assert!(gate.is_open());
/// assert_eq!(gate.budget(), Duration::from_micros(50));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SpinGate {
    budget: Duration,
    misses: u32,
    skipped: u32,
}

impl SpinGate {
    /// Consecutive missed spins after which the gate mostly stops spinning.
    /// Example: [`SpinGate`].
    pub const MISS_LIMIT: u32 = 8;
    /// While closed, one wait in this many still spins, to notice when
    /// traffic becomes dense again. Example: [`SpinGate`].
    pub const PROBE_EVERY: u32 = 16;

    /// A gate that grants `budget` (zero = never spin).
    ///
    /// # Examples
    ///
    /// ```
    /// let mut gate = transport::spin::SpinGate::new(std::time::Duration::ZERO);
    /// assert!(gate.grant().is_zero());
    /// ```
    pub fn new(budget: Duration) -> SpinGate {
        SpinGate {
            budget,
            misses: 0,
            skipped: 0,
        }
    }

    /// The configured budget. Example: [`SpinGate`].
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// The budget for the next wait: the configured one, or zero while the
    /// gate is closed and this is not a probe. Example: [`SpinGate`].
    pub fn grant(&mut self) -> Duration {
        if self.misses < Self::MISS_LIMIT {
            return self.budget;
        }
        self.skipped = self.skipped.wrapping_add(1);
        if self.skipped.is_multiple_of(Self::PROBE_EVERY) {
            self.budget
        } else {
            Duration::ZERO
        }
    }

    /// Records how a wait that was granted a non-zero budget ended: `true`
    /// if the spin caught the message, `false` if the wait had to block.
    /// Example: [`SpinGate`].
    pub fn record(&mut self, caught: bool) {
        if caught {
            self.misses = 0;
            self.skipped = 0;
        } else {
            self.misses = self.misses.saturating_add(1);
        }
    }

    /// True while the gate grants the full budget on every wait.
    /// Example: [`SpinGate`].
    pub fn is_open(&self) -> bool {
        self.misses < Self::MISS_LIMIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_budget_never_spins() {
        let mut s = Spin::new(Duration::ZERO, 8);
        assert!(!s.again());
        assert!(!s.again());
    }

    #[test]
    fn spin_ends_after_its_budget_and_stays_ended() {
        let budget = Duration::from_millis(2);
        let mut s = Spin::new(budget, 4);
        let t0 = Instant::now();
        let mut polls = 0u64;
        while s.again() {
            polls += 1;
            assert!(t0.elapsed() < Duration::from_secs(5), "spin never ended");
        }
        assert!(t0.elapsed() >= budget);
        assert!(polls > 4);
        assert!(!s.again(), "a spent spin must not restart");
    }

    #[test]
    fn gate_closes_after_misses_probes_and_reopens_on_a_catch() {
        let b = Duration::from_micros(50);
        let mut g = SpinGate::new(b);
        for _ in 0..SpinGate::MISS_LIMIT {
            assert_eq!(g.grant(), b);
            g.record(false);
        }
        assert!(!g.is_open());
        let granted: Vec<Duration> = (0..2 * SpinGate::PROBE_EVERY).map(|_| g.grant()).collect();
        let probes = granted.iter().filter(|d| !d.is_zero()).count();
        assert_eq!(probes, 2, "one probe per PROBE_EVERY waits");
        g.record(true);
        assert!(g.is_open());
        assert_eq!(g.grant(), b);
    }

    #[test]
    fn slots_are_capped_and_given_back() {
        let slots = SpinSlots::with_cap(2);
        let a = slots.try_take();
        let b = slots.try_take();
        assert!(a.is_some() && b.is_some());
        assert!(slots.try_take().is_none());
        drop(a);
        assert!(slots.try_take().is_some());
        assert!(SpinSlots::new().cap() >= 1);
    }

    #[test]
    fn gate_with_zero_budget_grants_nothing() {
        let mut g = SpinGate::new(Duration::ZERO);
        assert!(g.grant().is_zero());
    }
}
