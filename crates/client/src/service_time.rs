//! [`ServiceTimes`]: how long one session's answers take, per kind of
//! request (model and input size), so that a caller waiting for a slow
//! model sleeps through its compute and polls only near the predicted
//! completion. Used by shared-memory and socket sessions alike.
//!
//! Why: a waiting shm client polls (default 200 µs) before it sleeps. For a
//! model that answers within the poll that is the fastest wait there is;
//! for one that computes for milliseconds, the poll lands at the start of
//! the compute and takes a CPU from the model (on 2 cores, with the agent's
//! session thread and ONNX Runtime's pool, one MobileNetV2 client's p99
//! read 10 ms against 5.6 ms over unix), and when it ends before the answer
//! comes, the answer costs a futex wake-up. (Over sockets the poll stops
//! by itself for slow answers, `transport::spin::SpinGate`, and each
//! answer costs a blocking read's wake-up instead: one MobileNetV2 client's
//! p99 read 4–7 ms for a 2 ms run.) So each kind's waits start in
//! the fast mode and stay there, reading no clock, while the poll catches
//! the answers. A poll that misses switches the kind to the timed mode: its
//! requests note when they were sent, and the wait sleeps (futex, or
//! `poll(2)` on a socket: an early answer still wakes it) until [`LEAD`]
//! before the estimated completion, then polls (a sleep shorter than
//! [`MIN_NAP`] is not taken). Socket waits read the clock anyway (their
//! deadline), so they time every request and need no missed poll to start.
//! The estimate follows a low percentile of the recent waits: it drops to a
//! shorter wait at once and rises by an eighth of a longer one, so one slow
//! answer does not make the next wait sleep past its answer. A timed wait
//! that comes back within the poll returns the kind to the fast mode.
//! Beside the estimate each kind keeps the mean deviation of its waits from
//! it: when that is more than half the estimate, there is no completion to
//! predict (many clients queued on one model: each answer's wait depends on
//! its place in the queue), and the wait goes as in the fast mode, polling
//! at once, then sleeping. And a timed kind whose polls (after the sleep,
//! or at once) keep missing stops polling, as sockets' `SpinGate` stops
//! spinning: a sleep then a poll that misses then a sleep cost two
//! wake-ups where one would do (16 MobileNetV2 clients over unix: +9–22 %
//! CPU a request), and a poll at the start of a queued request's wait only
//! takes a core from the model; such waits sleep until the answer wakes
//! them (over shm; a socket's wait blocks in its read). One wait in
//! [`PROBE_EVERY`] still polls, to notice when the answers come on time
//! again.
//!
//! Requests nobody waits for (callbacks, futures) are waited for by the
//! session's completion thread in the same way ([`crate::completion`]): it
//! sleeps while every request it watches is not yet due, polls once for
//! each that is, and teaches the estimates what it sees.
//!
//! A kind is the model and the request's payload size ([`ServiceTimes::key`]):
//! a model's compute often grows with its input (a classifier's sequence
//! length). Kinds share [`SLOTS`] slots by hash (a collision only blends two
//! estimates: waits stay correct, the agent wakes a sleeper early or late).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Slots per session; kinds of request map onto them by hash.
pub(crate) const SLOTS: usize = 64;

/// How long before the estimated completion a sleeping wait wakes to poll
/// (the agent wakes as early before a client's forecast request).
pub(crate) use transport::cadence::LEAD;

/// The shortest sleep worth taking before polling: a shorter one would cost
/// its timer wake-up (a context switch each way) for little CPU handed to
/// the model. (16 LeNet clients on 2 cores, whose answers take ~250 µs,
/// spent 25 % more CPU a request with naps of ~100 µs.)
pub(crate) const MIN_NAP: Duration = Duration::from_micros(300);

/// Missed polls after a sleep (net of catches) after which a kind stops
/// sleeping first (but for probes).
pub(crate) const MISS_LIMIT: u32 = 8;
/// While a kind does not sleep first, one wait in this many still does (a
/// probe costs a wake-up and a poll of up to 200 µs: one in 16 cost 16
/// queued MobileNetV2 clients over unix 5–10 % more CPU a request).
pub(crate) const PROBE_EVERY: u32 = 64;

/// Slot value of a model whose answers come while the caller polls.
const FAST: u64 = 0;
/// Slot value of a model to time whose wait has no estimate yet.
const UNKNOWN: u64 = 1;

/// Per-kind wait estimates of one session (see the module docs).
pub(crate) struct ServiceTimes {
    slots: [Slot; SLOTS],
}

/// What one slot knows about its kinds' waits.
#[derive(Default)]
struct Slot {
    /// Estimated wait in ns, or [`FAST`] (0) / [`UNKNOWN`].
    estimate: AtomicU64,
    /// Mean deviation of the timed waits from the estimate, ns.
    spread: AtomicU64,
    /// Polls after a sleep that missed, net of catches, plus the waits
    /// that did not sleep first since the count reached [`MISS_LIMIT`].
    misses: AtomicU32,
}

/// How a request's wait should go: what [`ServiceTimes::expect`] says when
/// it is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Poll at once, read no clock (the answer is expected within the poll).
    Fast,
    /// Time the wait; if the waits are predictable, sleep until [`LEAD`]
    /// before `after` has passed since the request was sent (zero: poll at
    /// once, only measure), then poll.
    Timed {
        /// The estimated wait.
        after: Duration,
        /// The waits' mean deviation from the estimate.
        spread: Duration,
    },
}

impl Default for ServiceTimes {
    fn default() -> ServiceTimes {
        ServiceTimes {
            slots: std::array::from_fn(|_| Slot::default()),
        }
    }
}

impl ServiceTimes {
    /// The kind of a request to `model` carrying `payload_len` bytes.
    pub(crate) fn key(model: u32, payload_len: u64) -> u32 {
        // Fibonacci hashing of both: neighbouring sizes land apart. A
        // product's bits depend on the factor's bits below them only, so
        // the key is taken from above the model's bits.
        let h = (u64::from(model) << 40 ^ payload_len).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 40) as u32
    }

    fn slot(&self, key: u32) -> &Slot {
        &self.slots[key as usize % SLOTS]
    }

    /// How the next wait for a request of kind `key` should go.
    pub(crate) fn expect(&self, key: u32) -> Expect {
        let slot = self.slot(key);
        let after = match slot.estimate.load(Ordering::Relaxed) {
            FAST => return Expect::Fast,
            UNKNOWN => 0,
            ns => ns,
        };
        Expect::Timed {
            after: Duration::from_nanos(after),
            spread: Duration::from_nanos(slot.spread.load(Ordering::Relaxed)),
        }
    }

    /// Whether a timed wait of kind `key` may poll for its answer (after
    /// its sleep, or at once when it does not sleep first): while its polls
    /// catch the answers, and one wait in [`PROBE_EVERY`] once
    /// [`MISS_LIMIT`] of them in a row missed. A wait that may not sleeps
    /// until the answer wakes it.
    pub(crate) fn may_poll(&self, key: u32) -> bool {
        let misses = &self.slot(key).misses;
        if misses.load(Ordering::Relaxed) < MISS_LIMIT {
            return true;
        }
        let n = misses
            .fetch_add(1, Ordering::Relaxed)
            .saturating_sub(MISS_LIMIT);
        n.is_multiple_of(PROBE_EVERY)
    }

    /// How a timed wait's poll of kind `key` ended (after a sleep, or at
    /// once): `true` if it caught the answer.
    ///
    /// A catch takes one miss back, so the sleeps go on while more than half
    /// the polls catch (a reset on each catch kept 16 queued clients, whose
    /// polls catch now and then by chance, sleeping and missing: +10 % CPU
    /// a request over unix); a probe that catches reopens a closed kind.
    pub(crate) fn polled(&self, key: u32, caught: bool) {
        let misses = &self.slot(key).misses;
        if caught {
            let _ = misses.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                Some(if m >= MISS_LIMIT {
                    MISS_LIMIT / 2
                } else {
                    m.saturating_sub(1)
                })
            });
        } else {
            misses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A fast-mode wait for a request of kind `key` outlasted its poll:
    /// time the next ones.
    pub(crate) fn missed(&self, key: u32) {
        // Only from FAST: a timed kind keeps its estimate.
        let _ = self.slot(key).estimate.compare_exchange(
            FAST,
            UNKNOWN,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// A timed wait for a request of kind `key` took `took` from send to
    /// answer; `poll` is the caller's polling budget (an answer within it
    /// returns the kind to the fast mode).
    pub(crate) fn record(&self, key: u32, took: Duration, poll: Duration) {
        let slot = self.slot(key);
        let took_ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let next = if took <= poll {
            FAST
        } else {
            match slot.estimate.load(Ordering::Relaxed) {
                // FAST: another thread's fast answer came in between.
                FAST | UNKNOWN => took_ns,
                est => {
                    let dev = slot.spread.load(Ordering::Relaxed);
                    let off = took_ns.abs_diff(est);
                    slot.spread
                        .store(dev - dev / 8 + off / 8, Ordering::Relaxed);
                    if took_ns <= est {
                        took_ns
                    } else {
                        est + (took_ns - est) / 8
                    }
                }
            }
        };
        // Never store the markers as an estimate.
        slot.estimate
            .store(if next == UNKNOWN { 2 } else { next }, Ordering::Relaxed);
    }
}

/// What a request's wait needs to know: its kind, how its wait should go,
/// and (timed mode only: the fast mode reads no clock) when it was sent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WaitPlan {
    /// The request's kind ([`ServiceTimes::key`]).
    pub(crate) key: u32,
    /// How the wait should go.
    pub(crate) expect: Expect,
    /// When the request was sent; `Some` in the timed mode.
    pub(crate) sent_at: Option<Instant>,
    /// Whether the wait sleeps until the estimate, then polls (see
    /// [`WaitPlan::sleep_until`]).
    sleeps: bool,
    /// Whether the wait polls at all ([`WaitPlan::polls`]).
    polls: bool,
}

impl WaitPlan {
    /// The plan for a request of kind `key` sent now; `always_time`: note
    /// the send time in the fast mode too (a wait that reads the clock
    /// anyway learns from every answer instead of from missed polls).
    pub(crate) fn now(times: &ServiceTimes, key: u32, always_time: bool) -> WaitPlan {
        let expect = times.expect(key);
        let sent_at = (always_time || matches!(expect, Expect::Timed { .. })).then(Instant::now);
        let nap = expect.nap(Duration::ZERO);
        // A timed kind whose polls keep missing (queued requests: the
        // answer comes when the queue has drained) neither sleeps first
        // nor polls, but for probes.
        let polls = match expect {
            Expect::Fast => true,
            Expect::Timed { .. } => times.may_poll(key),
        };
        let sleeps = polls && sent_at.is_some() && nap >= MIN_NAP && expect.predictable();
        WaitPlan {
            key,
            expect,
            sent_at,
            sleeps,
            polls,
        }
    }

    /// Whether the wait polls for the answer at all (else it sleeps until
    /// the answer wakes it): `false` for a timed kind whose polls keep
    /// missing ([`ServiceTimes::may_poll`]). Over shm only: a socket's
    /// reads keep their own [`transport::spin::SpinGate`].
    pub(crate) fn polls(&self) -> bool {
        self.polls
    }

    /// The answer came: a timed plan updates the estimate of its kind.
    /// `poll`: the caller's polling budget.
    pub(crate) fn answered(&self, times: &ServiceTimes, poll: Duration) {
        if let Some(at) = self.sent_at {
            times.record(self.key, at.elapsed(), poll);
        }
    }

    /// Until when the wait should sleep before it polls (`None`: poll at
    /// once: the sleep would be shorter than [`MIN_NAP`], the waits scatter
    /// too widely to predict, or the polls after such sleeps keep missing).
    pub(crate) fn sleep_until(&self) -> Option<Instant> {
        let nap = self.expect.nap(Duration::ZERO);
        self.sent_at.filter(|_| self.sleeps).map(|at| at + nap)
    }
}

impl Expect {
    /// Whether the waits come near enough to their estimate (within half
    /// of it on average) for a sleep until the estimate to be worth it.
    pub(crate) fn predictable(&self) -> bool {
        matches!(self, Expect::Timed { after, spread } if *spread <= *after / 2)
    }

    /// How long a wait that has lasted `waited` should still sleep before
    /// it polls (zero: poll now).
    pub(crate) fn nap(&self, waited: Duration) -> Duration {
        match self {
            Expect::Fast => Duration::ZERO,
            Expect::Timed { after, .. } => after.saturating_sub(LEAD).saturating_sub(waited),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLL: Duration = Duration::from_micros(200);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The estimate of a timed model (`None`: fast).
    fn after(e: Expect) -> Option<Duration> {
        match e {
            Expect::Fast => None,
            Expect::Timed { after, .. } => Some(after),
        }
    }

    #[test]
    fn a_model_starts_fast_and_a_missed_poll_times_it() {
        let t = ServiceTimes::default();
        assert_eq!(t.expect(3), Expect::Fast);
        t.missed(3);
        assert_eq!(after(t.expect(3)), Some(Duration::ZERO));
        assert_eq!(t.expect(4), Expect::Fast, "other models keep their mode");
        t.record(3, ms(2), POLL);
        assert_eq!(after(t.expect(3)), Some(ms(2)));
        t.missed(3);
        assert_eq!(
            after(t.expect(3)),
            Some(ms(2)),
            "a timed model keeps its estimate"
        );
    }

    #[test]
    fn the_estimate_drops_at_once_and_rises_by_an_eighth() {
        let t = ServiceTimes::default();
        t.missed(0);
        t.record(0, ms(4), POLL);
        t.record(0, ms(2), POLL);
        assert_eq!(after(t.expect(0)), Some(ms(2)));
        t.record(0, ms(10), POLL);
        assert_eq!(after(t.expect(0)), Some(ms(3)));
    }

    #[test]
    fn an_answer_within_the_poll_returns_the_model_to_the_fast_mode() {
        let t = ServiceTimes::default();
        t.missed(1);
        t.record(1, ms(3), POLL);
        t.record(1, Duration::from_micros(20), POLL);
        assert_eq!(t.expect(1), Expect::Fast);
    }

    #[test]
    fn a_timed_wait_sleeps_until_the_lead_before_the_estimate() {
        let e = Expect::Timed {
            after: ms(2),
            spread: Duration::ZERO,
        };
        assert_eq!(e.nap(Duration::ZERO), ms(2) - LEAD);
        assert_eq!(e.nap(ms(1)), ms(1) - LEAD);
        assert_eq!(e.nap(ms(5)), Duration::ZERO);
        assert_eq!(Expect::Fast.nap(Duration::ZERO), Duration::ZERO);
        let unknown = Expect::Timed {
            after: Duration::ZERO,
            spread: Duration::ZERO,
        };
        assert_eq!(unknown.nap(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn waits_that_scatter_wider_than_half_their_estimate_do_not_sleep_first() {
        let t = ServiceTimes::default();
        t.missed(7);
        // One client on a 2 ms model: answers within ~0.1 ms of each other,
        // and a tail now and then.
        for took in [2000, 2100, 1950, 9000, 2000, 2080, 1990, 2020] {
            t.record(7, Duration::from_micros(took), POLL);
        }
        assert!(t.expect(7).predictable());
        assert!(WaitPlan::now(&t, 7, false).sleep_until().is_some());
        // Then queued behind others: each wait depends on its place.
        for took in [2000, 9000, 4000, 12000, 3000, 8000, 2500, 15000] {
            t.record(7, Duration::from_micros(took), POLL);
        }
        assert!(!t.expect(7).predictable(), "{:?}", t.expect(7));
        assert!(WaitPlan::now(&t, 7, false).sleep_until().is_none());
    }

    #[test]
    fn only_a_timed_plan_reads_the_clock_and_sleeps() {
        let t = ServiceTimes::default();
        let fast = WaitPlan::now(&t, 2, false);
        assert!(fast.sent_at.is_none() && fast.sleep_until().is_none());
        t.missed(2);
        let measuring = WaitPlan::now(&t, 2, false);
        assert!(measuring.sent_at.is_some() && measuring.sleep_until().is_none());
        t.record(2, ms(3), POLL);
        let timed = WaitPlan::now(&t, 2, false);
        let (sent, until) = (timed.sent_at.unwrap(), timed.sleep_until().unwrap());
        assert_eq!(until - sent, ms(3) - LEAD);
        t.record(2, LEAD + MIN_NAP - Duration::from_micros(1), POLL);
        let short = WaitPlan::now(&t, 2, false);
        assert!(short.sent_at.is_some(), "still timed");
        assert!(
            short.sleep_until().is_none(),
            "a nap under MIN_NAP is not taken"
        );
    }

    /// A real agent over shared memory (embedded in this process: the
    /// waits, the arena and the futex hand-offs are the real ones), serving
    /// identity and MobileNetV2 (~2 ms a run).
    fn shm_agent() -> (server::Agent, crate::Client) {
        use std::sync::atomic::AtomicU32;
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "client-waits-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        agent_at(&format!("shm://{name}"))
    }

    /// The same over a Unix socket (in a directory of its own).
    fn unix_agent() -> (server::Agent, crate::Client, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let uri = format!("unix://{}", dir.path().join("agent.sock").display());
        let (agent, c) = agent_at(&uri);
        (agent, c, dir)
    }

    fn agent_at(uri: &str) -> (server::Agent, crate::Client) {
        let mut cfg = server::AgentConfig::default();
        cfg.add_listen(uri).expect("listen");
        cfg.models.push(server::ModelConfig::new(
            "mobilenetv2",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../models/build/mobilenetv2.onnx"
            ),
        ));
        let agent = server::Agent::start(cfg).expect("agent starts");
        let c = crate::Client::connect(uri).expect("connect");
        (agent, c)
    }

    fn times(c: &crate::Client) -> &ServiceTimes {
        c.inner.service_times()
    }

    /// Runs `check` against a fresh agent over shm, then over unix.
    fn on_shm_and_unix(check: fn(&crate::Client)) {
        let (_agent, c) = shm_agent();
        check(&c);
        let (_agent, c, _dir) = unix_agent();
        check(&c);
    }

    /// Makes `kind`'s waits expect `took`, as if its answers took that long.
    fn pretend(c: &crate::Client, kind: u32, took: Duration) {
        times(c).missed(kind);
        times(c).record(kind, took, POLL);
    }

    /// Asserts that `c`'s waits for `net` (MobileNetV2, ~2 ms a run) with
    /// `bytes` of input are timed, with an estimate above 500 µs; `if_fast`
    /// says what a fast mode would mean.
    fn assert_timed(c: &crate::Client, net: &crate::Model, bytes: usize, if_fast: &str) {
        match times(c).expect(ServiceTimes::key(net.id(), bytes as u64)) {
            Expect::Timed { after, .. } => assert!(
                after > Duration::from_micros(500),
                "MobileNetV2 answers in {after:?}?"
            ),
            Expect::Fast => panic!("MobileNetV2's waits are not timed: {if_fast}"),
        }
    }

    #[test]
    fn a_model_that_computes_for_milliseconds_is_timed_and_identity_stays_fast() {
        on_shm_and_unix(milliseconds_are_timed_and_microseconds_polled);
    }

    fn milliseconds_are_timed_and_microseconds_polled(c: &crate::Client) {
        let net = c.model("mobilenetv2").expect("served");
        let image = vec![0.5f32; 3 * 224 * 224];
        for _ in 0..4 {
            let input = crate::TensorRef::from_slice(&[1, 3, 224, 224], &image).expect("input");
            net.infer(&[input]).expect("a run");
        }
        assert_timed(
            c,
            &net,
            image.len() * 4,
            "its answers came within a 200 µs poll?",
        );
        // Identity answers within the poll: a slow call (a busy machine)
        // may time it for a while, an answer within the poll ends that.
        let identity = c.model("identity").expect("served");
        let x = [1u8; 64];
        let fast = (0..1000).any(|_| {
            identity
                .infer(&[crate::TensorRef::from_slice(&[64], &x).expect("input")])
                .expect("echo");
            times(c).expect(ServiceTimes::key(identity.id(), 64)) == Expect::Fast
        });
        assert!(fast, "identity's waits never went back to polling at once");
    }

    #[test]
    fn a_client_that_never_polls_never_sleeps_first() {
        on_shm_and_unix(never_polls_never_times);
    }

    /// A second session on `c`'s agent, with `spin` zero: its waits for a
    /// 2 ms model stay in the fast mode (sleep at once, as asked).
    fn never_polls_never_times(c: &crate::Client) {
        let uri = c.inner.uri.clone();
        let opts = crate::ClientOptions {
            spin: Duration::ZERO,
            ..Default::default()
        };
        let c = crate::Client::connect_with(&uri, opts).expect("connect");
        let net = c.model("mobilenetv2").expect("served");
        let image = vec![0.5f32; 3 * 224 * 224];
        for _ in 0..3 {
            let input = crate::TensorRef::from_slice(&[1, 3, 224, 224], &image).expect("input");
            net.infer(&[input]).expect("a run");
        }
        let kind = ServiceTimes::key(net.id(), (image.len() * 4) as u64);
        assert_eq!(times(&c).expect(kind), Expect::Fast);
    }

    #[test]
    fn an_answer_that_comes_while_the_waiter_sleeps_wakes_it() {
        on_shm_and_unix(an_early_answer_wakes);
    }

    /// `c`'s identity model, its 64-byte requests' waits expecting 3 s
    /// (they would sleep for ~3 s), and that kind.
    fn identity_as_if_slow(c: &crate::Client) -> (crate::Model, u32) {
        let identity = c.model("identity").expect("served");
        let kind = ServiceTimes::key(identity.id(), 64);
        pretend(c, kind, Duration::from_secs(3));
        (identity, kind)
    }

    fn an_early_answer_wakes(c: &crate::Client) {
        let (identity, kind) = identity_as_if_slow(c);
        let x: Vec<u32> = (0..16).collect();
        let t0 = Instant::now();
        let r = identity
            .infer(&[crate::TensorRef::from_slice(&[16], &x).expect("input")])
            .expect("echo");
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "the agent's answer did not wake the sleeping waiter ({:?})",
            t0.elapsed()
        );
        assert_eq!(r.outputs[0].to_vec::<u32>().expect("u32"), x);
        match times(c).expect(kind) {
            Expect::Timed { after, .. } => assert!(after < Duration::from_secs(1), "{after:?}"),
            Expect::Fast => {} // it came within the poll
        }
    }

    #[test]
    fn callbacks_alone_time_a_slow_model_and_identity_stays_fast() {
        on_shm_and_unix(callbacks_time_milliseconds);
    }

    /// Requests completed on the completion thread (callbacks) teach the
    /// session as waited ones do: MobileNetV2 gets timed, identity not.
    fn callbacks_time_milliseconds(c: &crate::Client) {
        let call = |model: &crate::Model, shape: &[u64], x: &[f32]| {
            let (tx, rx) = std::sync::mpsc::channel();
            model
                .submit(&[crate::TensorRef::from_slice(shape, x).expect("input")])
                .expect("submit")
                .on_complete(move |r| drop(tx.send(r.map(|r| r.outputs.len()))));
            let outputs = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("called back");
            assert_eq!(outputs.expect("an answer"), 1);
        };
        let net = c.model("mobilenetv2").expect("served");
        let image = vec![0.5f32; 3 * 224 * 224];
        for _ in 0..4 {
            call(&net, &[1, 3, 224, 224], &image);
        }
        assert_timed(
            c,
            &net,
            image.len() * 4,
            "callbacks taught the session nothing",
        );
        let identity = c.model("identity").expect("served");
        let x = [1f32; 16];
        let fast = (0..1000).any(|_| {
            call(&identity, &[16], &x);
            times(c).expect(ServiceTimes::key(identity.id(), 64)) == Expect::Fast
        });
        assert!(
            fast,
            "identity's callbacks never went back to polling at once"
        );
    }

    /// Polls `f` on this thread, parking between polls.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
        let mut cx = std::task::Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    #[test]
    fn an_answer_that_comes_while_the_completion_thread_sleeps_is_delivered() {
        on_shm_and_unix(an_early_answer_completes);
    }

    /// As [`an_early_answer_wakes`], for a future and a callback: the
    /// completion thread sleeps until 3 s, yet delivers the echo at once.
    fn an_early_answer_completes(c: &crate::Client) {
        let (identity, kind) = identity_as_if_slow(c);
        let x: Vec<u32> = (0..16).collect();
        let t0 = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        identity
            .submit(&[crate::TensorRef::from_slice(&[16], &x).expect("input")])
            .expect("submit")
            .on_complete(move |r| drop(tx.send(r.map(|r| r.outputs[0].to_vec::<u32>()))));
        let echoed = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("called back");
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "the answer waited for the completion thread's sleep ({:?})",
            t0.elapsed()
        );
        assert_eq!(echoed.expect("an answer").expect("u32"), x);
        pretend(c, kind, Duration::from_secs(3));
        let t0 = Instant::now();
        let ticket = identity
            .submit(&[crate::TensorRef::from_slice(&[16], &x).expect("input")])
            .expect("submit");
        let r = block_on(std::future::IntoFuture::into_future(ticket)).expect("an answer");
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert_eq!(r.outputs[0].to_vec::<u32>().expect("u32"), x);
    }

    #[test]
    fn sleeping_waits_keep_pipelined_answers_apart() {
        on_shm_and_unix(pipelined_answers_stay_apart);
    }

    fn pipelined_answers_stay_apart(c: &crate::Client) {
        let identity = c.model("identity").expect("served");
        let kind = ServiceTimes::key(identity.id(), 32);
        pretend(c, kind, Duration::from_secs(2));
        let inputs: Vec<[u32; 8]> = (0..8).map(|i| [i; 8]).collect();
        let t0 = Instant::now();
        let tickets: Vec<_> = inputs
            .iter()
            .map(|x| {
                identity
                    .submit(&[crate::TensorRef::from_slice(&[8], x).expect("input")])
                    .expect("submit")
            })
            .collect();
        for (t, x) in tickets.into_iter().zip(&inputs).rev() {
            assert_eq!(
                t.wait().expect("answer").outputs[0]
                    .to_vec::<u32>()
                    .expect("u32"),
                x
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    #[test]
    fn sleeps_whose_polls_keep_missing_stop_but_for_probes() {
        let t = ServiceTimes::default();
        for _ in 0..MISS_LIMIT {
            assert!(t.may_poll(3));
            t.polled(3, false);
        }
        let tries = (0..2 * PROBE_EVERY).filter(|_| t.may_poll(3)).count();
        assert_eq!(tries, 2, "one probe in {PROBE_EVERY}");
        assert!(t.may_poll(4), "other kinds keep sleeping first");
        t.polled(3, true); // a probe caught its answer
        assert!(t.may_poll(3));
        // Three polls in four catching keep it sleeping first; one in three
        // mostly does not (catches drawn at random: a fixed pattern would line the
        // probes up with its catches).
        let sleeps = |key: u32, catch_in: u64, of: u64| {
            let mut rng = 0x2545_F491_4F6C_DD1D_u64;
            let steps = 40 * PROBE_EVERY as usize;
            let mut polls = 0;
            for _ in 0..steps {
                if t.may_poll(key) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    t.polled(key, rng % of < catch_in);
                    polls += 1;
                }
            }
            polls as f64 / steps as f64
        };
        assert!(sleeps(10, 3, 4) > 0.9, "{}", sleeps(12, 3, 4));
        assert!(sleeps(11, 1, 3) < 0.4, "{}", sleeps(13, 1, 3));
        t.polled(3, true);
        // A timed plan of a kind that misses does not sleep.
        t.missed(3);
        t.record(3, ms(3), POLL);
        assert!(WaitPlan::now(&t, 3, false).sleep_until().is_some());
        for _ in 0..MISS_LIMIT {
            t.polled(3, false);
        }
        let sleeping = (0..PROBE_EVERY)
            .filter(|_| WaitPlan::now(&t, 3, false).sleep_until().is_some())
            .count();
        assert_eq!(sleeping, 1);
    }

    #[test]
    fn a_timed_kind_whose_polls_keep_missing_does_not_poll_but_for_probes() {
        let t = ServiceTimes::default();
        // Queued waits: 2 ms to 30 ms, no completion to predict.
        t.missed(7);
        for took in [2, 30, 4, 26, 8, 22, 2, 30] {
            t.record(7, ms(took), POLL);
        }
        let plan = WaitPlan::now(&t, 7, false);
        assert!(!plan.expect.predictable() && plan.sleep_until().is_none());
        assert!(plan.polls(), "polls at once while its polls may catch");
        for _ in 0..MISS_LIMIT {
            t.polled(7, false);
        }
        let polling = (0..2 * PROBE_EVERY)
            .filter(|_| WaitPlan::now(&t, 7, false).polls())
            .count();
        assert_eq!(polling, 2, "one probe in {PROBE_EVERY}");
        // A fast kind always polls: its misses are how it gets timed.
        assert!(WaitPlan::now(&t, 8, false).polls());
        // A probe that catches reopens the kind.
        t.polled(7, true);
        assert!(WaitPlan::now(&t, 7, false).polls());
    }

    #[test]
    fn kinds_share_slots_modulo_their_count() {
        let t = ServiceTimes::default();
        t.missed(5);
        assert_eq!(after(t.expect(5 + SLOTS as u32)), Some(Duration::ZERO));
    }

    #[test]
    fn a_model_s_input_sizes_are_kinds_of_their_own() {
        let slot = |model, len| ServiceTimes::key(model, len) as usize % SLOTS;
        // A classifier's sequence lengths (int64 ids, 3 inputs): 8..64 tokens.
        let mut slots: Vec<usize> = (8..=64u64).map(|n| slot(1, 3 * 8 * n)).collect();
        slots.sort_unstable();
        slots.dedup();
        assert!(slots.len() >= 30, "57 sizes in {} slots", slots.len());
        assert_ne!(slot(1, 4096), slot(2, 4096));
    }
}
