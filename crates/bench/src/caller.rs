//! One request, as the load generators see it: a [`Caller`] sends a request
//! and waits for its answer, and may report how the round trip split into
//! [`Stage`]s (from the client's stamps joined with the agent's timeline).
//!
//! A caller is one connection (or one in-process engine handle) used by one
//! thread at a time; the load generators make one per client thread with a
//! [`CallerFactory`].

use std::fmt;

/// Any error of the harness: a target that cannot start, a request that
/// failed, a file that cannot be written. The message says what and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchError(pub String);

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

/// How the message of a refusal ([`BenchError::refusal`]) begins.
const REFUSAL: &str = "refused at once: ";

impl BenchError {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> BenchError {
        BenchError(msg.into())
    }

    /// A request the target refused at once without running it (the
    /// agent's `Overloaded` or `TooManyInFlight`): the load generators
    /// count these apart from other failures
    /// ([`crate::load::LoadResult::refused`]).
    pub fn refusal(msg: impl std::fmt::Display) -> BenchError {
        BenchError(format!("{REFUSAL}{msg}"))
    }

    /// Whether this is a [`BenchError::refusal`].
    pub fn is_refusal(&self) -> bool {
        self.0.starts_with(REFUSAL)
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> BenchError {
        BenchError(e.to_string())
    }
}

/// The stages a request's round trip splits into, in order. Their durations
/// add up to the whole round trip seen by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Client: from the call until the request is handed to the transport.
    ClientSend,
    /// Transport to the agent: until the agent has read the request header.
    ToAgent,
    /// Agent: payload into place and checks until queued.
    AgentPrepare,
    /// Agent: waiting in the model's queue.
    Queue,
    /// Agent: the model runs.
    Compute,
    /// Agent: building and sending the response.
    AgentRespond,
    /// Transport back: until the client has the response header.
    ToClient,
    /// Client: reading and decoding the response.
    ClientReceive,
}

impl Stage {
    /// How many stages there are.
    pub const COUNT: usize = 8;
    /// Every stage, in order.
    pub const ALL: [Stage; Stage::COUNT] = [
        Stage::ClientSend,
        Stage::ToAgent,
        Stage::AgentPrepare,
        Stage::Queue,
        Stage::Compute,
        Stage::AgentRespond,
        Stage::ToClient,
        Stage::ClientReceive,
    ];

    /// The stage's name in results (`snake_case`).
    pub const fn name(self) -> &'static str {
        match self {
            Stage::ClientSend => "client_send",
            Stage::ToAgent => "to_agent",
            Stage::AgentPrepare => "agent_prepare",
            Stage::Queue => "queue",
            Stage::Compute => "compute",
            Stage::AgentRespond => "agent_respond",
            Stage::ToClient => "to_client",
            Stage::ClientReceive => "client_receive",
        }
    }

    /// The stage's position in [`Stage::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// One request's stage durations in nanoseconds, indexed by
/// [`Stage::index`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageSample(pub [u64; Stage::COUNT]);

impl StageSample {
    /// The duration of `stage`.
    pub fn get(&self, stage: Stage) -> u64 {
        self.0[stage.index()]
    }
}

/// Decides which requests of one caller carry a timeline.
///
/// A timed request costs about ten clock reads more than an untimed one
/// (four client stamps, five or six agent stamps; [`StageSampler::STAMPS_NS`],
/// measured here), a third of an empty shared-memory round trip. Timing
/// every request would measure the instrument, so the sampler times one
/// request in `every`, choosing `every` from the last timed round trip so
/// the stamps add at most [`StageSampler::MAX_SHARE`] to the mean: every
/// request of a millisecond model, about one in 40 of a sub-microsecond
/// empty RPC. The stage figures are then the timed requests' (thousands per
/// measurement even at the sparsest rate), and the latency figures are
/// every request's.
#[derive(Clone, Copy, Debug)]
pub struct StageSampler {
    every: u64,
    countdown: u64,
}

impl StageSampler {
    /// What the stamps of one timed request cost (ten `CLOCK_MONOTONIC`
    /// reads at ~30 ns on the VMs we measure on).
    pub const STAMPS_NS: u64 = 300;
    /// The most the stamps may add to the mean round trip.
    pub const MAX_SHARE: f64 = 0.01;
    /// Sparsest sampling: one request in this many.
    pub const MAX_EVERY: u64 = 1024;

    /// A sampler that times the first request.
    pub fn new() -> StageSampler {
        StageSampler {
            every: 1,
            countdown: 0,
        }
    }

    /// Whether the next request should be timed.
    pub fn time_next(&mut self) -> bool {
        if self.countdown == 0 {
            self.countdown = self.every - 1;
            true
        } else {
            self.countdown -= 1;
            false
        }
    }

    /// Learns from a timed request's round trip (client stamps, ns).
    pub fn observed(&mut self, round_trip_ns: u64) {
        let rt = round_trip_ns.max(1) as f64;
        let every = (Self::STAMPS_NS as f64 / (Self::MAX_SHARE * rt)).ceil() as u64;
        self.every = every.clamp(1, Self::MAX_EVERY);
        self.countdown = self.countdown.min(self.every - 1);
    }

    /// One request in how many is timed now.
    pub fn every(&self) -> u64 {
        self.every
    }
}

impl Default for StageSampler {
    fn default() -> Self {
        StageSampler::new()
    }
}

/// Sends one request and waits for its answer.
pub trait Caller: Send {
    /// One round trip. Returns the request's stage split when the target
    /// reports one (tensorwire does, for the requests its
    /// [`StageSampler`] times; the peers and the in-process baseline do
    /// not).
    fn call(&mut self) -> Result<Option<StageSample>, BenchError>;
}

/// Makes a new [`Caller`] (a new connection): one per client thread.
pub type CallerFactory = dyn Fn() -> Result<Box<dyn Caller>, BenchError> + Send + Sync;

#[cfg(test)]
mod tests {
    use super::*;

    fn timed_of(s: &mut StageSampler, n: usize) -> usize {
        (0..n).filter(|_| s.time_next()).count()
    }

    #[test]
    fn sampler_times_slow_requests_all_and_fast_ones_sparsely() {
        let mut s = StageSampler::new();
        assert!(s.time_next(), "the first request is timed");
        // A 10 ms model: the stamps are far below 1 %, so time them all.
        s.observed(10_000_000);
        assert_eq!(s.every(), 1);
        assert_eq!(timed_of(&mut s, 100), 100);
        // A 0.75 µs round trip: 300 ns of stamps / (1 % of 750 ns) = 40.
        s.observed(750);
        assert_eq!(s.every(), 40);
        assert_eq!(timed_of(&mut s, 4000), 100);
        // 30 µs: 300 / 300 = 1; 20 µs: 2 (one in two).
        s.observed(30_000);
        assert_eq!(s.every(), 1);
        s.observed(20_000);
        assert_eq!(s.every(), 2);
        assert_eq!(timed_of(&mut s, 100), 50);
        // Nothing measured (0 ns) is clamped, not a division by zero.
        s.observed(0);
        assert_eq!(s.every(), StageSampler::MAX_EVERY);
    }

    #[test]
    fn sampler_shortens_a_long_countdown_at_once() {
        let mut s = StageSampler::new();
        assert!(s.time_next());
        s.observed(10);
        assert_eq!(s.every(), StageSampler::MAX_EVERY);
        // The countdown set by the first request (every = 1) runs out first.
        assert!(s.time_next());
        assert_eq!(timed_of(&mut s, 500), 0);
        // The model became slow: the next request is timed, not 1000 later.
        s.observed(50_000_000);
        assert!(s.time_next());
    }
}
