//! [`Observer`]: the well-behaved client every scenario runs beside the
//! attack. It calls the agent at a steady pace (one request every
//! [`PACE`]) and checks every answer: `identity` must echo a fresh random
//! tensor byte for byte, `digits` must give the logits it gave first. Its
//! latencies and errors are kept per [`Phase`] (before, during and after
//! the attack), which is what the claim "others kept being served" is
//! measured on.
//!
//! Beside an attack on a KServe front door (http, grpc) it is served over
//! native tcp and, every fourth call, also calls identity the KServe way
//! (`kserve_call`: an HTTP/1.1 binary-data infer on a kept-alive
//! connection), checking the bytes come back.

use crate::agent::AgentUnderTest;
use crate::listeners::Door;
use client::{Client, ClientOptions, DType, Model, TensorRef};
use std::io::{Read, Write};
use std::net::TcpStream;
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
        Observer::start_with(uri, None)
    }

    /// The observer beside an attack on `transport`: over it when it is a
    /// native transport; over tcp plus KServe HTTP calls when it is a
    /// front door.
    pub fn beside(agent: &AgentUnderTest, transport: &str) -> Observer {
        match Door::parse(transport) {
            Some(door) if !door.native() => Observer::start_with(
                agent.uri(door.native_transport()),
                Some(agent.http.trim_start_matches("http://").to_string()),
            ),
            _ => Observer::start(agent.uri(transport)),
        }
    }

    /// Starts calling the agent at `uri` and, with `kserve` (an HTTP front
    /// door's `HOST:PORT`), every fourth call through that door instead.
    pub fn start_with(uri: &str, kserve: Option<String>) -> Observer {
        let stop = Arc::new(AtomicBool::new(false));
        let phase = Arc::new(AtomicU8::new(Phase::Before as u8));
        let uri = uri.to_string();
        let (s, p) = (stop.clone(), phase.clone());
        let handle = std::thread::Builder::new()
            .name("tw-observer".into())
            .spawn(move || observe(&uri, kserve.as_deref(), &s, &p))
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

fn observe(
    uri: &str,
    kserve: Option<&str>,
    stop: &AtomicBool,
    phase: &AtomicU8,
) -> [PhaseStats; 3] {
    let mut stats: [PhaseStats; 3] = Default::default();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut client: Option<Session> = None;
    let mut kserve_conn: Option<TcpStream> = None;
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
        if let Some(addr) = kserve.filter(|_| n % 4 == 3) {
            n += 1;
            let t0 = Instant::now();
            match kserve_call(addr, &mut kserve_conn, &mut rng) {
                Ok(()) => stats[ph].latencies_ns.push(t0.elapsed().as_nanos() as u64),
                Err((msg, wrong)) => {
                    kserve_conn = None;
                    if wrong {
                        stats[ph].wrong += 1;
                    }
                    stats[ph].error(msg);
                }
            }
            continue;
        }
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

/// One KServe v2 HTTP infer of a fresh random UINT8 tensor to identity
/// (binary data both ways) on `conn` (opened to `addr` when `None`, kept
/// alive for the next call); the answer must carry the same bytes.
fn kserve_call(
    addr: &str,
    conn: &mut Option<TcpStream>,
    rng: &mut fastrand::Rng,
) -> Result<(), CallError> {
    let err = |what: &str, e: &dyn std::fmt::Display| (format!("kserve {what}: {e}"), false);
    if conn.is_none() {
        let s = TcpStream::connect(addr).map_err(|e| err("connect", &e))?;
        s.set_nodelay(true).map_err(|e| err("connect", &e))?;
        s.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| err("connect", &e))?;
        *conn = Some(s);
    }
    let Some(s) = conn.as_mut() else {
        return Err(("kserve: no connection".into(), false));
    };
    let len = rng.usize(1..=256);
    let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
    let json = format!(
        r#"{{"inputs":[{{"name":"t","shape":[{len}],"datatype":"UINT8","parameters":{{"binary_data_size":{len}}}}}],"outputs":[{{"name":"t","parameters":{{"binary_data":true}}}}]}}"#
    );
    let mut req = format!(
        "POST /v2/models/identity/infer HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\
         Inference-Header-Content-Length: {}\r\n\r\n{json}",
        json.len() + len,
        json.len()
    )
    .into_bytes();
    req.extend_from_slice(&data);
    s.write_all(&req).map_err(|e| err("send", &e))?;
    // The head, then exactly Content-Length bytes of body.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if got.len() > 64 << 10 {
            return Err(("kserve: no end of the answer's head".into(), true));
        }
        match s.read(&mut buf).map_err(|e| err("receive", &e))? {
            0 => return Err(("kserve: closed before answering".into(), false)),
            n => got.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    let body_len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .ok_or_else(|| (format!("kserve: no Content-Length in {head:?}"), true))?;
    if !head.starts_with("http/1.1 200") {
        let mut body = got[head_end..].to_vec();
        body.truncate(200);
        return Err((
            format!(
                "kserve answered {:?}: {}",
                head.lines().next().unwrap_or(""),
                String::from_utf8_lossy(&body)
            ),
            false,
        ));
    }
    while got.len() < head_end + body_len {
        match s.read(&mut buf).map_err(|e| err("receive", &e))? {
            0 => return Err(("kserve: closed inside the answer".into(), false)),
            n => got.extend_from_slice(&buf[..n]),
        }
    }
    if got.len() == head_end + body_len && got.ends_with(&data) {
        Ok(())
    } else {
        Err(("kserve: identity answered with other bytes".into(), true))
    }
}
