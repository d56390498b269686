//! [`Cadence`]: when a peer's next message is due, learned from the gaps
//! before its earlier ones, so that a receiver whose bounded spin
//! ([`crate::spin`]) ran out sleeps and is polling again when the message
//! comes, instead of being woken by it.
//!
//! Why: a closed-loop client that works between two requests (tokenizes
//! the next line, waits for the next camera frame) sends its request after
//! a gap longer than the agent's spin (50 µs). The agent sleeps, and the
//! request pays a wake-up: 30–50 µs from an idle vCPU on the 2-vCPU VMs we
//! measure on, 1.2–2 % of a 2.5 ms classifier call and more than all else
//! tensorwire adds to it. Such gaps are regular, so the receiver learns
//! them: the estimate is the median of the last [`HISTORY`] gaps, the
//! spread half their interquartile range (more than a quarter of them
//! within the receiver's spin: nothing to forecast). A gap runs from an
//! answer to the message that ends it ([`Cadence::ended`]); one that does
//! not (a `Release` the client flushes before its request) carries its
//! wait's time into the next wait ([`Cadence::carried`]). Then a wait
//! ([`Cadence::forecast`]):
//!
//! - whose gaps the receiver's spin covers needs nothing: the cadence is
//!   *fast* and no clock is read for it;
//! - before a short gap (estimate ≤ [`STRETCH_MAX`]) spins longer, to the
//!   estimate plus the spread plus [`LEAD`];
//! - before a longer one spins as usual, sleeps until [`LEAD`] plus the
//!   spread before the estimate, then polls for a window of twice that,
//!   centred on the estimate (gaps that scatter more than a window of
//!   [`WINDOW_MAX`] covers are not forecast); a message that comes earlier
//!   wakes it as before.
//!
//! A median, not the low percentile a client's answer estimate follows
//! (`client::service_time`): a client that sleeps past its answer pays for
//! it, while a receiver woken by an early message pays only what it paid
//! before; so one early gap (a line that tokenized fast) must not pull the
//! windows ahead of all the later ones. Gaps that scatter by more than half
//! their estimate are not forecast (there is no rhythm to follow), and a
//! cadence whose forecast polls keep missing ([`MISS_LIMIT`], net of
//! catches) polls ahead only once in [`PROBE_EVERY`] waits until one
//! catches again, as a client's waits do. The price is the forecast
//! polling: at most [`WINDOW_MAX`] of one CPU a gap, while the peer itself
//! is busy elsewhere.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Forecast polls of this process that caught their message / missed it.
static CAUGHT: AtomicU64 = AtomicU64::new(0);
static MISSED: AtomicU64 = AtomicU64::new(0);

/// How many forecast polls of this process's cadences caught their message
/// (no wake-up needed) and how many missed it (the peer's message woke the
/// receiver after all), since start: the agent reports them in its stats.
///
/// # Examples
///
/// ```
/// use transport::cadence::{polls_total, Cadence};
/// let (caught, missed) = polls_total();
/// Cadence::default().polled(true);
/// assert!(polls_total().0 > caught && polls_total().1 >= missed);
/// ```
pub fn polls_total() -> (u64, u64) {
    (
        CAUGHT.load(Ordering::Relaxed),
        MISSED.load(Ordering::Relaxed),
    )
}

/// How long before a forecast message a sleeping receiver wakes to poll
/// for it: the kernel's timer slack (50 µs by default) plus a wake-up on a
/// busy machine. Clients wake as early before a forecast answer.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// assert_eq!(transport::cadence::LEAD, Duration::from_micros(150));
/// ```
pub const LEAD: Duration = Duration::from_micros(150);

/// The longest gap a receiver spins through instead of sleeping: longer
/// ones are slept through (a sleep wakes on a timer, a context switch each
/// way; shorter than ~100 µs it saves little CPU for that).
pub const STRETCH_MAX: Duration = Duration::from_micros(250);

/// The longest forecast poll after a sleep.
pub const WINDOW_MAX: Duration = Duration::from_micros(600);

/// Forecast polls that missed (net of catches) after which a cadence stops
/// polling ahead but for probes.
pub const MISS_LIMIT: u32 = 8;

/// While a cadence does not poll ahead, one wait in this many still does.
pub const PROBE_EVERY: u32 = 64;

/// Gaps a cadence remembers.
pub const HISTORY: usize = 8;

/// How a receiver's next wait should go ([`Cadence::forecast`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forecast {
    /// Spin this long from the wait's start, then sleep until woken.
    Spin(Duration),
    /// Spin as usual, sleep until `wake` after the wait's start, poll for
    /// `window`, then sleep until woken.
    Wake {
        /// When to wake and poll, from the wait's start.
        wake: Duration,
        /// How long to poll then.
        window: Duration,
    },
}

/// The rhythm of one peer's messages: see the module docs.
///
/// # Examples
///
/// A client that sends every 2 ms: after two gaps the receiver sleeps
/// until 150 µs before the next message is due and polls from there:
///
/// ```
/// use std::time::Duration;
/// use transport::cadence::{Cadence, Forecast, LEAD};
/// let spin = Duration::from_micros(50);
/// let mut c = Cadence::default();
/// assert_eq!(c.forecast(spin), Forecast::Spin(spin)); // nothing known yet
/// c.arrived(Some(Duration::from_millis(2)), spin);
/// c.arrived(Some(Duration::from_millis(2)), spin);
/// assert_eq!(
///     c.forecast(spin),
///     Forecast::Wake { wake: Duration::from_millis(2) - LEAD, window: 2 * LEAD }
/// );
/// // Messages the spin catches make the cadence fast again.
/// for _ in 0..3 {
///     c.arrived(None, spin);
/// }
/// assert_eq!(c.forecast(spin), Forecast::Spin(spin));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Cadence {
    /// The last gaps, ns, oldest overwritten first; 0: a message within
    /// the receiver's spin.
    gaps: [u64; HISTORY],
    /// Gaps recorded (at most [`HISTORY`]), and where the next one goes.
    len: usize,
    next: usize,
    /// How many of them are 0: a fast cadence is told so without sorting
    /// (the wait after every answer asks).
    fast: usize,
    /// The last wait's time, ns, until the receiver says whether its
    /// message ended the gap; and what earlier waits of this gap carried.
    last: u64,
    open: u64,
    /// Forecast polls that missed, net of catches, plus the waits that did
    /// not poll ahead since the count reached [`MISS_LIMIT`].
    misses: u32,
    /// Forecast polls that caught their message, and that missed it.
    caught: u64,
    missed: u64,
}

impl Cadence {
    /// How the next wait should go, for a receiver whose own spin is
    /// `spin`: see the module docs. A receiver that does not spin (`spin`
    /// zero: it asked for the least CPU) is never told to poll ahead.
    ///
    /// # Examples
    ///
    /// Short gaps are spun through; gaps that scatter are not forecast:
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::cadence::{Cadence, Forecast, LEAD};
    /// let (spin, us) = (Duration::from_micros(50), Duration::from_micros);
    /// let mut short = Cadence::default();
    /// short.arrived(Some(us(120)), spin);
    /// short.arrived(Some(us(120)), spin);
    /// assert_eq!(short.forecast(spin), Forecast::Spin(us(120) + LEAD));
    /// assert_eq!(short.forecast(Duration::ZERO), Forecast::Spin(Duration::ZERO));
    ///
    /// let mut scattered = Cadence::default();
    /// for gap in [1_000, 9_000, 1_000, 12_000, 1_000, 15_000] {
    ///     scattered.arrived(Some(us(gap)), spin);
    /// }
    /// assert_eq!(scattered.forecast(spin), Forecast::Spin(spin));
    /// ```
    pub fn forecast(&mut self, spin: Duration) -> Forecast {
        let plain = Forecast::Spin(spin);
        let n = self.len;
        // More than a quarter of the gaps within the spin: nothing to
        // forecast (the sorted first quartile below would be 0).
        if spin.is_zero() || n < 2 || self.fast > n / 4 {
            return plain;
        }
        let mut sorted = self.gaps;
        let sorted = &mut sorted[..n];
        sorted.sort_unstable();
        let (q1, est, q3) = (sorted[n / 4], sorted[n / 2], sorted[(3 * n - 1) / 4]);
        let spread = (q3 - q1) / 2;
        // Gaps that scatter: no rhythm to follow.
        if spread > est / 2 {
            return plain;
        }
        if self.misses >= MISS_LIMIT {
            let k = self.misses - MISS_LIMIT;
            self.misses = MISS_LIMIT + (k + 1) % PROBE_EVERY;
            if k != 0 {
                return plain;
            }
        }
        // Part of the gap may have passed in an earlier wait (`carried`).
        let est = Duration::from_nanos(est.saturating_sub(self.open));
        let spread = Duration::from_nanos(spread);
        if est + spread <= spin {
            // Gaps this spin covers (learned with a shorter one: a session
            // without a polling slot polls only 3 µs), or a gap nearly
            // over.
            return plain;
        }
        if est <= STRETCH_MAX {
            return Forecast::Spin((est + spread + LEAD).max(spin));
        }
        // A window centred on the estimate, covering the spread: gaps
        // that scatter more than a window covers are not forecast.
        let half = LEAD + spread;
        if 2 * half > WINDOW_MAX {
            return plain;
        }
        Forecast::Wake {
            wake: est.saturating_sub(half).max(spin),
            window: 2 * half,
        }
    }

    /// A message came `gap` after the wait began (`None`: within the
    /// receiver's spin, before it read the clock), and ended the gap;
    /// `spin` is the receiver's own spin: [`Cadence::waited`] then
    /// [`Cadence::ended`]. Example: [`Cadence`].
    pub fn arrived(&mut self, gap: Option<Duration>, spin: Duration) {
        self.waited(gap);
        self.ended(spin);
    }

    /// The wait this cadence followed ended with a message after `took`
    /// (`None`: within its first polls, before it read the clock). The
    /// receiver then says whether that message ended the gap
    /// ([`Cadence::ended`]) or not ([`Cadence::carried`]).
    pub fn waited(&mut self, took: Option<Duration>) {
        self.last = took.map_or(0, |t| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX));
    }

    /// The message that ended the last wait ended the gap (the peer's next
    /// request after an answer): the gap, with what earlier waits of it
    /// carried, is learned. `spin` is the receiver's own spin: a gap
    /// within it counts as none.
    pub fn ended(&mut self, spin: Duration) {
        let total = self.open.saturating_add(std::mem::take(&mut self.last));
        self.open = 0;
        let spin_ns = u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX);
        let ns = if total > spin_ns { total } else { 0 };
        if self.len == HISTORY && self.gaps[self.next] == 0 {
            self.fast -= 1;
        }
        if ns == 0 {
            self.fast += 1;
        }
        self.gaps[self.next] = ns;
        self.next = (self.next + 1) % HISTORY;
        self.len = (self.len + 1).min(HISTORY);
    }

    /// The message that ended the last wait did not end the gap (a
    /// `Release` the client flushed before its request): its wait's time
    /// carries into the next wait, which the cadence goes on following.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::cadence::Cadence;
    /// let (spin, ms) = (Duration::from_micros(50), Duration::from_millis);
    /// let mut c = Cadence::default();
    /// for _ in 0..3 {
    ///     c.waited(Some(ms(2))); // a Release 2 ms after the answer,
    ///     c.carried();
    ///     c.waited(Some(ms(1))); // the request 1 ms later
    ///     c.ended(spin);
    /// }
    /// let mut whole = Cadence::default();
    /// for _ in 0..3 {
    ///     whole.arrived(Some(ms(3)), spin);
    /// }
    /// assert_eq!(c.forecast(spin), whole.forecast(spin));
    /// ```
    pub fn carried(&mut self) {
        self.open = self.open.saturating_add(std::mem::take(&mut self.last));
    }

    /// The last wait was not followed (the receiver's first after a pause):
    /// whatever it carried is dropped, nothing is learned.
    pub fn forgot(&mut self) {
        (self.open, self.last) = (0, 0);
    }

    /// How a forecast poll (a stretched spin past the receiver's own, or
    /// a window after a sleep) ended: `true` if it caught the message.
    /// A catch takes one miss back (a probe that catches reopens a closed
    /// cadence half way), a miss adds one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::cadence::{Cadence, Forecast, MISS_LIMIT, PROBE_EVERY};
    /// let (spin, ms) = (Duration::from_micros(50), Duration::from_millis(1));
    /// let mut c = Cadence::default();
    /// c.arrived(Some(ms), spin);
    /// c.arrived(Some(ms), spin);
    /// for _ in 0..MISS_LIMIT {
    ///     assert!(matches!(c.forecast(spin), Forecast::Wake { .. }));
    ///     c.polled(false); // the message came after the window
    /// }
    /// let ahead = (0..PROBE_EVERY).filter(|_| c.forecast(spin) != Forecast::Spin(spin)).count();
    /// assert_eq!(ahead, 1); // one probe
    /// c.polled(true);
    /// assert!(matches!(c.forecast(spin), Forecast::Wake { .. }));
    /// ```
    pub fn polled(&mut self, caught: bool) {
        let (count, mine) = if caught {
            (&CAUGHT, &mut self.caught)
        } else {
            (&MISSED, &mut self.missed)
        };
        count.fetch_add(1, Ordering::Relaxed);
        *mine += 1;
        self.misses = if !caught && self.misses >= MISS_LIMIT {
            // Closed: a missed probe; the count stays within the probe
            // cycle, so it never saturates and stops probing.
            MISS_LIMIT + (self.misses - MISS_LIMIT + 1) % PROBE_EVERY
        } else if !caught {
            self.misses + 1
        } else if self.misses >= MISS_LIMIT {
            MISS_LIMIT / 2
        } else {
            self.misses.saturating_sub(1)
        };
    }

    /// This cadence's forecast polls so far: `(caught, missed)`
    /// ([`polls_total`] counts the whole process's).
    ///
    /// # Examples
    ///
    /// ```
    /// let mut c = transport::cadence::Cadence::default();
    /// c.polled(false);
    /// assert_eq!(c.polls(), (0, 1));
    /// ```
    pub fn polls(&self) -> (u64, u64) {
        (self.caught, self.missed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    const SPIN: Duration = Duration::from_micros(50);

    fn taught(gaps: &[u64]) -> Cadence {
        let mut c = Cadence::default();
        for &g in gaps {
            c.arrived(Some(us(g)), SPIN);
        }
        c
    }

    #[test]
    fn a_regular_gap_is_forecast_and_one_early_message_does_not_move_it() {
        let mut c = taught(&[3_000; 4]);
        let on_time = Forecast::Wake {
            wake: us(2_850),
            window: us(300),
        };
        assert_eq!(c.forecast(SPIN), on_time);
        // One line that tokenized fast: the median holds.
        c.arrived(Some(us(1_900)), SPIN);
        assert_eq!(c.forecast(SPIN), on_time);
        // A rhythm that changes: while the gaps scatter more than a
        // window covers, nothing is forecast; then the new one is.
        for _ in 0..HISTORY / 2 {
            c.arrived(Some(us(6_000)), SPIN);
        }
        assert_eq!(c.forecast(SPIN), Forecast::Spin(SPIN));
        for _ in 0..HISTORY {
            c.arrived(Some(us(6_000)), SPIN);
        }
        assert_eq!(
            c.forecast(SPIN),
            Forecast::Wake {
                wake: us(5_850),
                window: us(300)
            }
        );
    }

    #[test]
    fn the_window_is_centred_on_the_estimate_and_covers_the_spread() {
        // Gaps of 4.9–5.1 ms: interquartile range 200 µs, spread 100.
        let mut c = taught(&[4_900, 5_000, 5_100, 4_900, 5_000, 5_100, 4_900, 5_100]);
        match c.forecast(SPIN) {
            Forecast::Wake { wake, window } => {
                assert_eq!(wake + window / 2, us(5_000), "{wake:?} {window:?}");
                assert_eq!(window, 2 * (LEAD + us(100)));
            }
            f => panic!("{f:?}"),
        }
        // Part of the gap already passed (a Release came 3 ms in).
        c.waited(Some(us(3_000)));
        c.carried();
        match c.forecast(SPIN) {
            Forecast::Wake { wake, .. } => assert_eq!(wake, us(2_000) - LEAD - us(100)),
            f => panic!("{f:?}"),
        }
        c.waited(Some(us(2_000)));
        c.ended(SPIN);
        assert_eq!(c.gaps[(c.next + HISTORY - 1) % HISTORY], 5_000_000);
        // A wait that was not followed drops what was carried.
        c.waited(Some(us(4_000)));
        c.carried();
        c.forgot();
        assert_eq!((c.open, c.last), (0, 0));
    }

    #[test]
    fn gaps_within_the_spin_need_no_forecast() {
        let mut c = taught(&[500, 500]);
        assert_ne!(c.forecast(SPIN), Forecast::Spin(SPIN));
        for _ in 0..HISTORY / 2 + 1 {
            c.arrived(Some(us(40)), SPIN);
        }
        assert_eq!(c.forecast(SPIN), Forecast::Spin(SPIN));
        // Half fast, half slow: no rhythm.
        let mut mixed = taught(&[2_000, 2_000, 2_000, 2_000]);
        for _ in 0..4 {
            mixed.arrived(None, SPIN);
        }
        assert_eq!(mixed.forecast(SPIN), Forecast::Spin(SPIN));
    }

    #[test]
    fn a_forecast_never_spins_less_than_the_receivers_own_spin() {
        let long_spin = us(400);
        let mut c = Cadence::default();
        for _ in 0..2 {
            c.arrived(Some(us(300)), long_spin); // within its spin: fast
        }
        assert_eq!(c.forecast(long_spin), Forecast::Spin(long_spin));
        for _ in 0..HISTORY {
            c.arrived(Some(us(1_000)), long_spin);
        }
        match c.forecast(long_spin) {
            Forecast::Wake { wake, .. } => assert_eq!(wake, us(850)),
            f => panic!("{f:?}"),
        }
        let mut short = taught(&[60, 60]);
        assert_eq!(short.forecast(SPIN), Forecast::Spin(us(210)));
        // Learned while polling 3 µs, waited for with 50.
        let mut c = Cadence::default();
        for _ in 0..4 {
            c.arrived(Some(us(20)), us(3));
        }
        assert_eq!(c.forecast(SPIN), Forecast::Spin(SPIN));
    }

    #[test]
    fn the_history_keeps_its_length_over_many_gaps() {
        let mut c = Cadence::default();
        for i in 0..10_000u64 {
            let gap = if i % 5 == 0 {
                us(10)
            } else {
                us(1_000 + i % 3)
            };
            c.arrived(Some(gap), SPIN);
            assert_eq!(c.len, HISTORY.min(i as usize + 1));
            assert_eq!(c.fast, c.gaps[..c.len].iter().filter(|&&g| g == 0).count());
        }
        assert!(matches!(c.forecast(SPIN), Forecast::Wake { .. }));
    }

    #[test]
    fn misses_close_the_forecast_and_a_caught_probe_reopens_it() {
        let mut c = taught(&[5_000, 5_000]);
        for _ in 0..MISS_LIMIT - 1 {
            c.polled(true);
            c.polled(false);
            c.polled(false);
        }
        let closed_after = (0..4 * MISS_LIMIT)
            .position(|_| {
                let f = c.forecast(SPIN);
                c.polled(false);
                f == Forecast::Spin(SPIN)
            })
            .expect("closes");
        assert!(closed_after <= MISS_LIMIT as usize);
        c.polled(true);
        assert!(c.misses < MISS_LIMIT);
        assert!(matches!(c.forecast(SPIN), Forecast::Wake { .. }));
        assert_eq!(
            c.polls(),
            (
                MISS_LIMIT as u64,
                2 * (MISS_LIMIT as u64 - 1) + closed_after as u64 + 1
            )
        );
    }
}
