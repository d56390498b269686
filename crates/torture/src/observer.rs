//! [`Observer`]: the well-behaved client every scenario runs beside the
//! attack. It calls the agent at a steady pace (one request every
//! [`PACE`]) and checks every answer: `identity` must echo a fresh random
//! tensor byte for byte, `digits` must give the logits it gave first. Its
//! latencies and errors are kept per [`Phase`] (before, during and after
//! the attack), which is what the claim "others kept being served" is
//! measured on.

use client::{Client, ClientOptions, DType, Model, TensorRef};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Time between the starts of two requests (a light, steady client).
pub const PACE: Duration = Duration::from_micros(1000);

/// How long one request may take before it counts as an error.
const TIMEOUT: Duration = Duration::from_secs(5);

/// A part of a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Before the attack starts.
    Before = 0,
    /// While it runs.
    During = 1,
    /// After it stopped.
    After = 2,
}

/// What the observer saw in one phase.
#[derive(Clone, Debug, Default)]
pub struct PhaseStats {
    /// Latencies of the requests that succeeded, ns.
    pub latencies_ns: Vec<u64>,
    /// Requests that failed, timed out or came back wrong.
    pub errors: u64,
    /// Of those, answers that came back with wrong bytes.
    pub wrong: u64,
    /// The first few error messages.
    pub first_errors: Vec<String>,
}

impl PhaseStats {
    /// The `q` quantile of the latencies, µs (0 when there are none).
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.latencies_ns.is_empty() {
            return 0.0;
        }
        let mut v = self.latencies_ns.clone();
        v.sort_unstable();
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        v[i.min(v.len() - 1)] as f64 / 1e3
    }

    fn error(&mut self, msg: String) {
        self.errors += 1;
        if self.first_errors.len() < 5 {
            self.first_errors.push(msg);
        }
    }
}

/// A running observer.
pub struct Observer {
    stop: Arc<AtomicBool>,
    phase: Arc<AtomicU8>,
    handle: JoinHandle<[PhaseStats; 3]>,
}

impl Observer {
    /// Starts calling the agent at `uri` (phase [`Phase::Before`]).
    pub fn start(uri: &str) -> Observer {
        let stop = Arc::new(AtomicBool::new(false));
        let phase = Arc::new(AtomicU8::new(Phase::Before as u8));
        let uri = uri.to_string();
        let (s, p) = (stop.clone(), phase.clone());
        let handle = std::thread::Builder::new()
            .name("tw-observer".into())
            .spawn(move || observe(&uri, &s, &p))
            .expect("spawn the observer thread");
        Observer {
            stop,
            phase,
            handle,
        }
    }

    /// Moves to `phase`: the requests that start from now count there.
    pub fn mark(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    /// Stops and returns what each phase saw.
    pub fn finish(self) -> [PhaseStats; 3] {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_else(|_| {
            let mut s: [PhaseStats; 3] = Default::default();
            s[2].error("the observer thread panicked".into());
            s
        })
    }
}

/// A session and its two models, looked up once.
struct Session {
    _client: Client,
    identity: Model,
    digits: Model,
}

fn connect(uri: &str) -> Result<Session, String> {
    let opts = ClientOptions {
        timeout: TIMEOUT,
        connect_timeout: TIMEOUT,
        ..ClientOptions::default()
    };
    let c = Client::connect_with(uri, opts).map_err(|e| format!("connect: {e}"))?;
    Ok(Session {
        identity: c.model("identity").map_err(|e| format!("identity: {e}"))?,
        digits: c.model("digits").map_err(|e| format!("digits: {e}"))?,
        _client: c,
    })
}

fn observe(uri: &str, stop: &AtomicBool, phase: &AtomicU8) -> [PhaseStats; 3] {
    let mut stats: [PhaseStats; 3] = Default::default();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut client: Option<Session> = None;
    let mut reference: Option<Vec<u8>> = None;
    let digits_in: Vec<u8> = (0..64)
        .flat_map(|i| (i as f32 / 64.0).to_le_bytes())
        .collect();
    let mut n: u64 = 0;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
        }
        next += PACE;
        let ph = phase.load(Ordering::Relaxed).min(2) as usize;
        let c = match client.take() {
            Some(c) => c,
            None => match connect(uri) {
                Ok(c) => c,
                Err(e) => {
                    stats[ph].error(e);
                    continue;
                }
            },
        };
        n += 1;
        let t0 = Instant::now();
        let r = if n.is_multiple_of(16) {
            digits_call(&c.digits, &digits_in, &mut reference)
        } else {
            identity_call(&c.identity, &mut rng)
        };
        match r {
            Ok(()) => {
                stats[ph].latencies_ns.push(t0.elapsed().as_nanos() as u64);
                client = Some(c);
            }
            Err((msg, wrong)) => {
                if wrong {
                    stats[ph].wrong += 1;
                }
                stats[ph].error(msg);
                // A fresh session next time: this one may be broken.
            }
        }
    }
    stats
}

type CallError = (String, bool);

fn identity_call(m: &Model, rng: &mut fastrand::Rng) -> Result<(), CallError> {
    let len = rng.usize(1..=512);
    let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
    let shape = [len as u64];
    let t = TensorRef::new(DType::U8, &shape, &data).map_err(|e| (e.to_string(), false))?;
    let r = m
        .infer(&[t])
        .map_err(|e| (format!("identity: {e}"), false))?;
    match r.outputs.first() {
        Some(o) if o.bytes() == data.as_slice() && o.shape == shape => Ok(()),
        _ => Err(("identity answered with other bytes".into(), true)),
    }
}

fn digits_call(m: &Model, x: &[u8], reference: &mut Option<Vec<u8>>) -> Result<(), CallError> {
    let t = TensorRef::new(DType::F32, &[1, 64], x).map_err(|e| (e.to_string(), false))?;
    let r = m.infer(&[t]).map_err(|e| (format!("digits: {e}"), false))?;
    let got = r
        .outputs
        .first()
        .map(|o| o.bytes().to_vec())
        .ok_or_else(|| ("digits answered no output".to_string(), true))?;
    match reference {
        None => {
            *reference = Some(got);
            Ok(())
        }
        Some(want) if *want == got => Ok(()),
        Some(_) => Err(("digits answered other logits than before".into(), true)),
    }
}
