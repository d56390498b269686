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

impl BenchError {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> BenchError {
        BenchError(msg.into())
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

/// Sends one request and waits for its answer.
pub trait Caller: Send {
    /// One round trip. Returns the request's stage split when the target
    /// reports one (tensorwire does; the peers and the in-process baseline
    /// do not).
    fn call(&mut self) -> Result<Option<StageSample>, BenchError>;
}

/// Makes a new [`Caller`] (a new connection): one per client thread.
pub type CallerFactory = dyn Fn() -> Result<Box<dyn Caller>, BenchError> + Send + Sync;
