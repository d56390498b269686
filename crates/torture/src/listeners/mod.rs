//! The listeners under attack and how an attacker talks on each: a
//! [`Door`] (unix, tcp, tls, vsock speak the native protocol; http and
//! grpc are the KServe v2 front doors), a [`Target`] (where it is and how
//! to connect: TLS client configuration, vsock address), the [`Sock`] an
//! attacker holds, and per door the hostile messages ([`Shot`]s) that mean
//! something for its protocol: the native corruptions of [`crate::hostile`]
//! (over TLS too, after a completed handshake), broken TLS handshakes
//! ([`tls`]), broken HTTP/1.1 requests and KServe JSON/binary bodies
//! ([`http`]), broken HTTP/2 frames and gRPC messages ([`grpc`]).
//!
//! The scenarios (`hostile bytes`, `slowloris`, `idle connections`,
//! `connect churn`) are the same functions for every door
//! ([`crate::scenarios`]); what differs per door is only what is sent and
//! what a well-behaved opening of a connection is ([`Door::open_session`]).

pub mod grpc;
pub mod http;
pub mod tls;

use crate::agent::AgentUnderTest;
use crate::hostile::{self, Attack};
use crate::{scenarios, Config, ScenarioResult, TortureError};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport::tls::TlsSock;
use transport::Endpoint;
use wire::{encode_hello, Header, Kind, Limits, HEADER_LEN};

/// How long an attacked connection may stay open after its bytes and
/// EOF were sent before it counts as hung.
pub const HANG_LIMIT: Duration = Duration::from_secs(5);

/// A listener of the agent under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    /// `unix://`, the native protocol.
    Unix,
    /// `tcp://`, the native protocol.
    Tcp,
    /// `tls://`, the native protocol over rustls.
    Tls,
    /// `vsock://`, the native protocol over `AF_VSOCK`.
    Vsock,
    /// `http://`, the KServe v2 HTTP/REST front door.
    Http,
    /// `grpc://`, the KServe v2 gRPC front door.
    Grpc,
}

impl Door {
    /// The door named `transport` (`unix`, `tcp`, `tls`, `vsock`, `http`,
    /// `grpc`); `None` for others (`shm` has attacks of its own).
    pub fn parse(transport: &str) -> Option<Door> {
        Some(match transport {
            "unix" => Door::Unix,
            "tcp" => Door::Tcp,
            "tls" => Door::Tls,
            "vsock" => Door::Vsock,
            "http" => Door::Http,
            "grpc" => Door::Grpc,
            _ => return None,
        })
    }

    /// Whether it speaks tensorwire's own protocol.
    pub fn native(self) -> bool {
        !matches!(self, Door::Http | Door::Grpc)
    }

    /// The native transport the observer (and the identity lookup) uses
    /// beside an attack on this door: the door itself when it is native,
    /// else tcp (a front door's calls meet the same core).
    pub fn native_transport(self) -> &'static str {
        match self {
            Door::Unix => "unix",
            Door::Tcp | Door::Http | Door::Grpc => "tcp",
            Door::Tls => "tls",
            Door::Vsock => "vsock",
        }
    }

    /// Every fixed hostile message for this door, categories interleaved
    /// (so that a run that stops early still tried each kind); requests
    /// go to model `identity` (it takes any tensors, so they reach every
    /// check).
    pub fn fixed_shots(self, identity: u32) -> Vec<Shot> {
        let native = || {
            let mut v: Vec<Shot> = hostile::corruptions(7, identity)
                .into_iter()
                .map(|a| Shot::new(a, Opening::Hello))
                .collect();
            v.extend(
                hostile::truncations(7, identity)
                    .into_iter()
                    .map(|a| Shot::new(a, Opening::Hello)),
            );
            v
        };
        match self {
            Door::Unix | Door::Tcp | Door::Vsock => native(),
            Door::Tls => {
                let mut groups = tls::handshake_shots();
                groups.push(native());
                interleave(groups)
            }
            Door::Http => interleave(http::shots()),
            Door::Grpc => interleave(grpc::shots()),
        }
    }

    /// One random hostile message (deterministic given `rng`).
    pub fn random_shot(self, rng: &mut fastrand::Rng, identity: u32) -> Shot {
        match self {
            Door::Tls if rng.u8(..) < 64 => tls::random_shot(rng),
            Door::Unix | Door::Tcp | Door::Vsock | Door::Tls => {
                let a = hostile::random_message(rng, identity);
                let opening = if rng.u8(..) >= 32 {
                    Opening::Hello
                } else {
                    Opening::Secured
                };
                Shot::new(a, opening)
            }
            Door::Http => http::random_shot(rng),
            Door::Grpc => grpc::random_shot(rng),
        }
    }

    /// A valid request a slowloris sender trickles, and how it opens its
    /// connection first.
    pub fn slow_request(self, identity: u32) -> (Vec<u8>, Opening) {
        match self {
            Door::Http => (http::valid_request(), Opening::Secured),
            Door::Grpc => (grpc::valid_request(), Opening::Secured),
            _ => (hostile::valid_request(9, identity).0, Opening::Hello),
        }
    }

    /// Opens a session on `s` as a well-behaved client would and waits for
    /// the agent's first answer: a native Hello; an HTTP readiness probe;
    /// the HTTP/2 preface and SETTINGS, answered by the agent's SETTINGS.
    pub fn open_session(self, s: &mut Sock) -> std::io::Result<()> {
        match self {
            Door::Http => http::probe(s),
            Door::Grpc => grpc::probe(s),
            _ => s.hello(),
        }
    }
}

/// The socket scenarios (hostile bytes, slowloris, idle connections,
/// connect churn) on each listener of `cfg.listeners`, each row handed to
/// `out` as it completes; a listener this machine cannot reach (vsock
/// without `vsock_loopback`) gets one row saying `skipped: <why>`.
pub fn attack(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    out: &mut dyn FnMut(ScenarioResult),
) -> Result<(), TortureError> {
    for name in &cfg.listeners {
        if Door::parse(name).is_none() {
            return Err(TortureError(format!("{name}: not a socket listener")));
        }
        if name == "vsock" {
            if let Err(why) = vsock_reachable(agent) {
                out(skipped(name, &why));
                continue;
            }
        }
        out(scenarios::hostile_bytes(
            agent,
            cfg,
            name,
            cfg.listener_messages,
        )?);
        out(scenarios::slowloris(agent, cfg, name)?);
        out(scenarios::idle(agent, cfg, name)?);
        out(scenarios::churn(agent, cfg, name)?);
    }
    Ok(())
}

/// Whether a client here can reach the agent's vsock listener (`Err`:
/// why not, e.g. no `vsock_loopback`).
fn vsock_reachable(agent: &AgentUnderTest) -> Result<(), String> {
    let uri = agent.vsock.as_ref().map_err(Clone::clone)?;
    let opts = client::ClientOptions {
        connect_timeout: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        ..client::ClientOptions::default()
    };
    client::Client::connect_with(uri, opts)
        .map(drop)
        .map_err(|e| format!("cannot connect to {uri}: {e}"))
}

/// The row of a listener that could not be attacked here.
fn skipped(transport: &str, why: &str) -> ScenarioResult {
    ScenarioResult::unobserved(
        "listener attacks",
        transport,
        0,
        0,
        0.0,
        format!("skipped: {why}"),
    )
}

/// `(name, bytes)` pairs as shots on bare connections.
fn raw_shots(v: Vec<(String, Vec<u8>)>) -> Vec<Shot> {
    v.into_iter().map(|(n, b)| Shot::raw(n, b)).collect()
}

/// A `(name, bytes)` pair.
fn named(name: &str, bytes: Vec<u8>) -> (String, Vec<u8>) {
    (name.to_string(), bytes)
}

/// Noise: for each of `sizes`, that many seeded random bytes after
/// `prefix`, named `"{n} {what}"`.
fn noise(seed: u64, prefix: &[u8], sizes: &[usize], what: &str) -> Vec<(String, Vec<u8>)> {
    let mut rng = fastrand::Rng::with_seed(seed);
    sizes
        .iter()
        .map(|&n| {
            let mut b = prefix.to_vec();
            b.extend((0..n).map(|_| rng.u8(..)));
            (format!("{n} {what}"), b)
        })
        .collect()
}

/// `valid` with each byte from `from` on set to 0x00 and to 0xFF (where
/// that changes it).
fn every_byte(valid: &[u8], from: usize) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for i in from..valid.len() {
        for v in [0u8, 0xff] {
            if valid[i] != v {
                let mut b = valid.to_vec();
                b[i] = v;
                out.push((format!("byte {i}={v:#04x}"), b));
            }
        }
    }
    out
}

/// `valid` with 1 to 8 random bytes from `from` on changed.
fn scrambled(rng: &mut fastrand::Rng, valid: &[u8], from: usize) -> Vec<u8> {
    let mut b = valid.to_vec();
    for _ in 0..rng.usize(1..=8) {
        let i = rng.usize(from..b.len());
        b[i] = rng.u8(..);
    }
    b
}

/// 1 to `max` random bytes.
fn random_bytes(rng: &mut fastrand::Rng, max: usize) -> Vec<u8> {
    (0..rng.usize(1..=max)).map(|_| rng.u8(..)).collect()
}

/// Round-robin over `groups`: the first of each, then the second of
/// each, …
fn interleave(groups: Vec<Vec<Shot>>) -> Vec<Shot> {
    let mut iters: Vec<_> = groups.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::new();
    loop {
        let before = out.len();
        out.extend(iters.iter_mut().filter_map(Iterator::next));
        if out.len() == before {
            return out;
        }
    }
}

/// How a [`Shot`]'s connection is opened before its bytes go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    /// A bare stream: on a TLS door, no handshake at all.
    Raw,
    /// The TLS handshake completed on a TLS door; as `Raw` elsewhere.
    Secured,
    /// `Secured`, then a native Hello answered.
    Hello,
}

/// One hostile message and how its connection is opened.
#[derive(Clone, Debug)]
pub struct Shot {
    /// What it is (for reports).
    pub name: String,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// The opening before them.
    pub opening: Opening,
}

impl Shot {
    /// `attack` sent after `opening`.
    pub fn new(attack: Attack, opening: Opening) -> Shot {
        Shot {
            name: attack.name,
            bytes: attack.bytes,
            opening,
        }
    }

    /// `bytes` named `name`, on a bare connection.
    pub fn raw(name: impl Into<String>, bytes: Vec<u8>) -> Shot {
        Shot {
            name: name.into(),
            bytes,
            opening: Opening::Raw,
        }
    }
}

enum Addr {
    Unix(PathBuf),
    Tcp(String),
    Vsock { cid: u32, port: u32 },
}

/// A listener's address and what connecting to it takes (a TLS client
/// configuration is built once, not per connection).
pub struct Target {
    addr: Addr,
    tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
}

impl Target {
    /// The target of `uri`: a native endpoint (`unix://`, `tcp://`,
    /// `tls://…?ca=…`, `vsock://`) or a front door (`http://HOST:PORT`,
    /// `grpc://HOST:PORT`).
    pub fn new(uri: &str) -> std::io::Result<Target> {
        for door in ["http://", "grpc://"] {
            if let Some(addr) = uri.strip_prefix(door) {
                return Ok(Target {
                    addr: Addr::Tcp(addr.to_string()),
                    tls: None,
                });
            }
        }
        let bad = |e: &dyn std::fmt::Display| std::io::Error::other(format!("{uri}: {e}"));
        Ok(match Endpoint::parse(uri).map_err(|e| bad(&e))? {
            Endpoint::Unix(p) => Target {
                addr: Addr::Unix(p),
                tls: None,
            },
            Endpoint::Tcp { addr, .. } => Target {
                addr: Addr::Tcp(addr),
                tls: None,
            },
            Endpoint::Tls { addr, client, .. } => {
                let config = transport::tls::client_config(&client).map_err(|e| bad(&e))?;
                let name = transport::tls::server_name(&addr, client.name.as_deref())?;
                Target {
                    addr: Addr::Tcp(addr),
                    tls: Some((config, name)),
                }
            }
            Endpoint::Vsock { cid, port } => Target {
                addr: Addr::Vsock { cid, port },
                tls: None,
            },
            other => return Err(bad(&format!("{other}: attacks need a socket endpoint"))),
        })
    }

    /// Connects and opens the connection as `opening` says. A handshake or
    /// Hello the agent neither completes nor refuses within
    /// [`HANG_LIMIT`] is a `TimedOut`/`WouldBlock` error.
    pub fn open(&self, opening: Opening) -> std::io::Result<Sock> {
        let mut s = match &self.addr {
            Addr::Unix(p) => Sock::Unix(UnixStream::connect(p)?),
            Addr::Tcp(addr) => {
                let t = TcpStream::connect(addr)?;
                t.set_nodelay(true)?;
                match (&self.tls, opening) {
                    (Some((config, name)), Opening::Secured | Opening::Hello) => {
                        Sock::Tls(Box::new(TlsSock::client(
                            t,
                            config.clone(),
                            name.clone(),
                            HANG_LIMIT,
                        )?))
                    }
                    _ => Sock::Tcp(t),
                }
            }
            Addr::Vsock { cid, port } => {
                use socket2::{Domain, SockAddr, Socket, Type};
                let s = Socket::new(Domain::VSOCK, Type::STREAM, None)?;
                s.connect_timeout(&SockAddr::vsock(*cid, *port), HANG_LIMIT)?;
                Sock::Vsock(s)
            }
        };
        s.set_timeout(Some(HANG_LIMIT))?;
        if opening == Opening::Hello {
            s.hello()?;
        }
        Ok(s)
    }
}

/// An attacker's connection to the agent.
pub enum Sock {
    /// Over `unix://`.
    Unix(UnixStream),
    /// Over tcp: `tcp://`, a front door, or a TLS door before (or
    /// without) its handshake.
    Tcp(TcpStream),
    /// Over TLS, handshake done (boxed: a TLS session is large).
    Tls(Box<TlsSock>),
    /// Over `AF_VSOCK`.
    Vsock(socket2::Socket),
}

impl Sock {
    /// Connects to `uri` (for a `tls://` one, with the handshake done).
    pub fn connect(uri: &str) -> std::io::Result<Sock> {
        Target::new(uri)?.open(Opening::Secured)
    }

    /// Bounds every read and write (`None`: forever).
    pub fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Sock::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Sock::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Sock::Tls(s) => {
                s.set_read_timeout(t);
                s.set_write_timeout(t);
                Ok(())
            }
            Sock::Vsock(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    /// Writes all of `b`.
    pub fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Sock::Unix(s) => s.write_all(b),
            Sock::Tcp(s) => s.write_all(b),
            Sock::Tls(s) => s.send(&mut [IoSlice::new(b)], None),
            Sock::Vsock(s) => s.write_all(b),
        }
    }

    /// Reads what has arrived (waiting up to the timeout).
    pub fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Unix(s) => s.read(b),
            Sock::Tcp(s) => s.read(b),
            Sock::Tls(s) => s.read(b),
            Sock::Vsock(s) => s.read(b),
        }
    }

    /// Reads exactly `b.len()` bytes.
    pub fn read_exact(&mut self, mut b: &mut [u8]) -> std::io::Result<()> {
        while !b.is_empty() {
            match self.read(b) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => b = &mut b[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Shuts the write side (the agent reads EOF; on TLS, without a
    /// close_notify, as a cut connection would).
    pub fn shutdown_write(&self) {
        let _ = match self {
            Sock::Unix(s) => s.shutdown(Shutdown::Write),
            Sock::Tcp(s) => s.shutdown(Shutdown::Write),
            Sock::Tls(s) => s.shutdown(Shutdown::Write),
            Sock::Vsock(s) => s.shutdown(Shutdown::Write),
        };
    }

    /// Sends a native Hello and reads the HelloAck.
    pub fn hello(&mut self) -> std::io::Result<()> {
        let body = encode_hello(&Limits {
            max_tensors: 0,
            max_in_flight: 0,
            max_payload: 0,
            max_desc_len: 0,
        });
        let mut h = Header::new(Kind::Hello);
        h.request_id = 1;
        h.desc_len = body.len() as u32;
        let mut b = h.encode().to_vec();
        b.extend_from_slice(&body);
        self.write_all(&b)?;
        let mut head = [0u8; HEADER_LEN];
        self.read_exact(&mut head)?;
        let ack = Header::decode(&head).map_err(std::io::Error::other)?;
        if ack.kind != Kind::HelloAck {
            return Err(std::io::Error::other(format!(
                "Hello answered with {:?}",
                ack.kind
            )));
        }
        let mut body = vec![0u8; ack.desc_len.min(1 << 16) as usize];
        self.read_exact(&mut body)
    }

    /// Whether the agent closed (or reset) this connection: what it sent
    /// first (an HTTP/2 SETTINGS, a TLS alert) is read past, then EOF must
    /// be there now.
    pub fn closed_by_peer(&mut self) -> bool {
        if self.set_timeout(Some(Duration::from_millis(1))).is_err() {
            return true;
        }
        let mut b = [0u8; 4096];
        for _ in 0..64 {
            match self.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if is_timeout(&e) => return false,
                Err(_) => return true,
            }
        }
        false
    }

    /// Reads until `needle` has arrived (at most `limit` bytes); what was
    /// read.
    pub fn read_until(&mut self, needle: &[u8], limit: usize) -> std::io::Result<Vec<u8>> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(needle.len()).any(|w| w == needle) {
            if got.len() >= limit {
                return Err(std::io::Error::other("no end of the answer's head"));
            }
            match self.read(&mut buf)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        Ok(got)
    }
}

/// Whether `e` is a read or write that ran out of time.
pub fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// How the agent took one hostile message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It answered (an error, or a response to a corruption that is still a
    /// valid request) and closed at our EOF.
    Answered = 0,
    /// It closed without a word.
    Closed = 1,
    /// It refused the connection (a limit) before the bytes went out.
    Refused = 2,
    /// Neither within [`HANG_LIMIT`]: a defect.
    Hung = 3,
}

/// Sends `shot` on a fresh connection to `target` (opened as the shot
/// says), shuts the write side and reads until the agent closes.
pub fn attack_once(target: &Target, shot: &Shot) -> Outcome {
    let mut s = match target.open(shot.opening) {
        Ok(s) => s,
        // A handshake or Hello the agent neither answers nor refuses in time.
        Err(e) if is_timeout(&e) => return Outcome::Hung,
        Err(_) => return Outcome::Refused,
    };
    // The agent may close before it has read everything: that is fine.
    let _ = s.write_all(&shot.bytes);
    s.shutdown_write();
    let mut got = 0usize;
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + HANG_LIMIT;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Outcome::Hung,
            // Reset: closed with unread data, also an answer of sorts.
            Err(_) => break,
        }
        if Instant::now() >= deadline {
            return Outcome::Hung;
        }
    }
    if got > 0 {
        Outcome::Answered
    } else {
        Outcome::Closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_takes_one_of_each_in_turn() {
        let g = |n: &str, k: usize| -> Vec<Shot> {
            (0..k)
                .map(|i| Shot::raw(format!("{n}{i}"), vec![]))
                .collect()
        };
        let names: Vec<String> = interleave(vec![g("a", 3), g("b", 1), g("c", 2)])
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["a0", "b0", "c0", "a1", "c1", "a2"]);
    }

    #[test]
    fn every_door_has_fixed_and_random_shots() {
        for door in [Door::Tcp, Door::Tls, Door::Http, Door::Grpc] {
            let fixed = door.fixed_shots(0);
            assert!(fixed.len() > 100, "{door:?}: {}", fixed.len());
            let mut rng = fastrand::Rng::with_seed(1);
            let a = door.random_shot(&mut rng, 0);
            let b = door.random_shot(&mut fastrand::Rng::with_seed(1), 0);
            assert_eq!(a.bytes, b.bytes, "{door:?}: deterministic per seed");
        }
    }
}
