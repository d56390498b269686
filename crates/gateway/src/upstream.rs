//! [`Upstream`]: the agent behind the gateway, and how to open a session
//! with it for one downstream client.
//!
//! Every downstream session gets its own upstream session (the client
//! library's [`Client`]), opened at the downstream Hello with the
//! downstream's token and limits: the agent's tenants, quotas and fair
//! queues see each client of the gateway as it would see it directly.
//!
//! When the agent cannot be reached, [`Upstream::connect`] fails with
//! `unavailable` and the gateway backs off: for a while
//! (`Backoff`, doubling from [`BACKOFF_MIN`] to [`BACKOFF_MAX`]) new
//! sessions are refused at once without dialling, then one dial is tried
//! again. A success resets it. So a restarted agent is used again by the
//! next session after at most `BACKOFF_MAX`, and a gateway whose agent is
//! down answers its clients promptly instead of making each wait for a
//! connect timeout.

use client::{Client, ClientError, ClientOptions, Limits};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use wire::Status;

/// First pause after a failed dial.
pub const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Longest pause between dials while the agent stays unreachable.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How dials are spaced while the agent is unreachable.
#[derive(Debug, Default)]
struct Backoff {
    /// No dial before this instant (`None`: dial at once).
    until: Option<Instant>,
    /// The pause the next failure sets.
    next: Duration,
    /// Why the last dial failed.
    why: String,
}

/// The agent the gateway relays to.
#[derive(Debug)]
pub struct Upstream {
    uri: String,
    opts: ClientOptions,
    backoff: Mutex<Backoff>,
}

/// Why a downstream session could not be given an upstream one: the
/// status and message of the Error its Hello is answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Status code of the Error.
    pub status: Status,
    /// Its message.
    pub message: String,
}

impl Upstream {
    /// The agent at `uri` (`shm://`, `unix://`, `tcp://`, `tls://`),
    /// opened with `opts` (their `limits` and `token` are replaced per
    /// session).
    pub fn new(uri: &str, opts: ClientOptions) -> Upstream {
        Upstream {
            uri: uri.to_string(),
            opts,
            backoff: Mutex::new(Backoff::default()),
        }
    }

    /// The agent's URI.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Opens a session for a downstream client that asked for `limits`
    /// (already narrowed to the gateway's own) with `token`.
    pub fn connect(&self, limits: Limits, token: Option<String>) -> Result<Client, Refusal> {
        {
            let b = lock(&self.backoff);
            if let Some(until) = b.until {
                if Instant::now() < until {
                    return Err(Refusal {
                        status: Status::Unavailable,
                        message: format!(
                            "the gateway's agent {} is unreachable ({}); retry later",
                            self.uri, b.why
                        ),
                    });
                }
            }
        }
        // A client without a token is one the gateway cannot identify: the
        // agent must not take it for the gateway's own uid's tenant.
        let opts = ClientOptions {
            limits,
            anonymous: token.is_none(),
            token,
            ..self.opts.clone()
        };
        match Client::connect_with(&self.uri, opts) {
            Ok(c) => {
                let mut b = lock(&self.backoff);
                *b = Backoff::default();
                Ok(c)
            }
            Err(e) => {
                // An agent that does not answer a Hello in time is as
                // unreachable as one that refuses the connection.
                let (status, message) = match &e {
                    ClientError::Timeout(_) => (Status::Unavailable, e.to_string()),
                    _ => status_of(&e),
                };
                if status == Status::Unavailable {
                    let mut b = lock(&self.backoff);
                    let pause = b.next.clamp(BACKOFF_MIN, BACKOFF_MAX);
                    b.until = Some(Instant::now() + pause);
                    b.next = (pause * 2).min(BACKOFF_MAX);
                    b.why = message.clone();
                }
                Err(Refusal {
                    status,
                    message: format!("the gateway's agent {}: {message}", self.uri),
                })
            }
        }
    }
}

/// The wire status (and message) a downstream client gets for a failed
/// upstream call: the agent's own answer when it gave one; `unavailable`
/// when the agent could not be reached or went away (which ends the
/// session); `timeout` for one request the agent did not answer within
/// the gateway's upstream timeout (the agent is there: the session goes
/// on, and the late answer is dropped).
pub fn status_of(e: &ClientError) -> (Status, String) {
    use ClientError as E;
    let (status, msg) = match e {
        E::Connect(_) | E::AgentGone(_) => (Status::Unavailable, e.to_string()),
        E::Timeout(_) => (Status::Timeout, e.to_string()),
        E::UnknownModel(m) => (Status::UnknownModel, m.clone()),
        E::InvalidInput(m) => (Status::InvalidInput, m.clone()),
        E::LimitExceeded(m) => (Status::LimitExceeded, m.clone()),
        E::TooManyInFlight(_) => (Status::TooManyInFlight, e.to_string()),
        E::ShuttingDown(m) => (Status::ShuttingDown, m.clone()),
        E::Engine(m) => (Status::EngineError, m.clone()),
        E::Overloaded(m) => (Status::Overloaded, m.clone()),
        E::QueueTimeout(m) => (Status::Timeout, m.clone()),
        E::PermissionDenied(m) => (Status::PermissionDenied, m.clone()),
        E::Remote { status, message } => (*status, message.clone()),
        E::Protocol(_) => (Status::Unavailable, e.to_string()),
    };
    (status, msg)
}

/// The limits a downstream client is offered: its proposal narrowed to the
/// gateway's own `cap`, field by field (0 = no preference on either side;
/// the agent narrows the result again, PROTOCOL.md §11).
pub fn narrow(asked: &Limits, cap: &Limits) -> Limits {
    fn f<T: Ord + Default + Copy>(a: T, c: T) -> T {
        if a == T::default() {
            c
        } else if c == T::default() {
            a
        } else {
            a.min(c)
        }
    }
    Limits {
        max_tensors: f(asked.max_tensors, cap.max_tensors),
        max_in_flight: f(asked.max_in_flight, cap.max_in_flight),
        max_payload: f(asked.max_payload, cap.max_payload),
        max_desc_len: f(asked.max_desc_len, cap.max_desc_len),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zero() -> Limits {
        Limits {
            max_tensors: 0,
            max_in_flight: 0,
            max_payload: 0,
            max_desc_len: 0,
        }
    }

    #[test]
    fn narrowing_keeps_the_smaller_and_zero_means_no_preference() {
        let cap = Limits {
            max_payload: 1 << 20,
            ..zero()
        };
        let asked = Limits {
            max_tensors: 4,
            max_payload: 1 << 30,
            ..zero()
        };
        let n = narrow(&asked, &cap);
        assert_eq!(
            (n.max_tensors, n.max_payload, n.max_in_flight),
            (4, 1 << 20, 0)
        );
        assert_eq!(narrow(&zero(), &zero()), zero());
    }

    #[test]
    fn an_unreachable_agent_is_not_dialled_again_at_once() {
        let dir = std::env::temp_dir().join(format!("tw-gw-up-{}", std::process::id()));
        let uri = format!("unix://{}", dir.join("none.sock").display());
        let up = Upstream::new(
            &uri,
            ClientOptions {
                connect_timeout: Duration::from_millis(200),
                ..ClientOptions::default()
            },
        );
        let first = up.connect(zero(), None).unwrap_err();
        assert_eq!(first.status, Status::Unavailable, "{first:?}");
        // Within the back-off: refused without a dial, saying why.
        let second = up.connect(zero(), None).unwrap_err();
        assert_eq!(second.status, Status::Unavailable);
        assert!(second.message.contains("unreachable"), "{second:?}");
        std::thread::sleep(BACKOFF_MIN * 2);
        // After it: dialled again (and failing again, differently worded).
        let third = up.connect(zero(), None).unwrap_err();
        assert!(!third.message.contains("unreachable"), "{third:?}");
    }

    #[test]
    fn agent_answers_keep_their_status_and_lost_agents_are_unavailable() {
        let gone = ClientError::AgentGone("x".into());
        assert_eq!(status_of(&gone).0, Status::Unavailable);
        let busy = ClientError::Overloaded("queue full".into());
        assert_eq!(status_of(&busy), (Status::Overloaded, "queue full".into()));
        let other = ClientError::Remote {
            status: Status::Internal,
            message: "m".into(),
        };
        assert_eq!(status_of(&other), (Status::Internal, "m".into()));
    }
}
