//! The "raw floor": request/response ping-pong over a bare Unix or TCP socket
//! pair, with no tensorwire code in the path.
//!
//! `tensorwire ping --raw unix|tcp` runs this next to tensorwire's own ping in
//! the same run, so the RPC tax of the framework can be read off against what
//! the kernel's socket stack alone costs. This module owns both ends:
//!
//! * [`run_raw_ping`], the client: it starts the echo peer, connects, and
//!   times `warmup + iterations` round trips of `msg_len` bytes each way,
//!   checking every reply is byte-for-byte what it sent.
//! * [`serve_raw_echo`], the peer (behind the hidden `tensorwire raw-echo`
//!   subcommand): listen, accept one connection, and echo fixed-size
//!   messages until end of file.
//!
//! Waiting: by default each end blocks in `read`. With a spin budget both ends
//! first poll with non-blocking `recv`s for up to that long
//! ([`transport::spin::Spin`], the policy tensorwire's own receivers use,
//! minus the per-connection gate), so this floor can be read against
//! tensorwire's sockets whichever way both wait.
//!
//! For a fair comparison with tensorwire, whose agent is another process, the
//! peer normally runs in a **separate process**; without a command it runs on
//! a thread of the calling process (unit tests).
//!
//! The start-up handshake with a child peer: the child binds (Unix: the path it
//! is given; TCP: typically `127.0.0.1:0`, an ephemeral port), then prints the
//! address it is bound to as the first line of its standard output. The
//! parent waits for that line (at most [`IO_TIMEOUT`]) before connecting.
//!
//! Nothing here can hang: every socket has read and write timeouts of
//! [`IO_TIMEOUT`], the peer waits at most that long for its one connection,
//! and a child peer is killed and reaped on every exit path.

use crate::child::{copy_command, describe, ChildPeer};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use transport::spin::Spin;

/// A spinning read checks the clock (and yields) every this many empty
/// `recv`s, as tensorwire's socket reads do.
const SPIN_POLLS_PER_CHECK: u32 = 8;

/// How long any single step may wait: a read or write on the socket, the
/// peer's wait for its connection, the parent's wait for the peer's address
/// line. Hitting it is an error, never a hang.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// With split writes, the first write of each message carries this many
/// bytes (the size of a tensorwire header) and the second the rest.
pub const SPLIT_AT: usize = 64;

/// The largest message accepted, to keep a typo from allocating gigabytes.
pub const MAX_MSG_LEN: usize = 256 << 20;

/// The longest address line accepted from a child peer.
const MAX_ADDR_LINE: u64 = 4096;

/// The socket family to ping over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawKind {
    /// A Unix-domain stream socket (in a fresh private temporary directory).
    Unix,
    /// TCP over the loopback interface (`127.0.0.1`, ephemeral port).
    Tcp,
}

impl std::fmt::Display for RawKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RawKind::Unix => "unix",
            RawKind::Tcp => "tcp",
        })
    }
}

impl std::str::FromStr for RawKind {
    type Err = String;

    /// Parses `unix` or `tcp` (as `tensorwire ping --raw` takes them).
    fn from_str(s: &str) -> Result<RawKind, String> {
        match s {
            "unix" => Ok(RawKind::Unix),
            "tcp" => Ok(RawKind::Tcp),
            other => Err(format!(
                "unknown raw socket kind {other:?} (expected unix or tcp)"
            )),
        }
    }
}

/// What [`run_raw_ping`] measures.
#[derive(Clone, Debug)]
pub struct RawOptions {
    /// Socket family.
    pub kind: RawKind,
    /// Timed round trips (returned).
    pub iterations: usize,
    /// Untimed round trips first (not returned).
    pub warmup: usize,
    /// Bytes in each message, each way (1 to [`MAX_MSG_LEN`]).
    pub msg_len: usize,
    /// Set `TCP_NODELAY` on both ends (TCP only). Off shows Nagle's stall
    /// when combined with `split_writes`.
    pub nodelay: bool,
    /// Write each message as two writes, [`SPLIT_AT`] bytes then the rest, as
    /// a header-then-body protocol would (both directions). With
    /// `msg_len <= SPLIT_AT` the second write would be empty and is skipped,
    /// so the message goes as one write.
    pub split_writes: bool,
    /// How long each end polls before it blocks in `read` (zero = block at
    /// once); the echo peer gets the same budget.
    pub spin: Duration,
}

/// How [`serve_raw_echo`] listens and echoes.
#[derive(Clone, Debug)]
pub struct EchoOptions {
    /// Socket family.
    pub kind: RawKind,
    /// Where to listen: a socket path for [`RawKind::Unix`] (which must not
    /// exist yet), `host:port` for [`RawKind::Tcp`] (port 0 picks a free one).
    pub addr: String,
    /// Bytes in each message (1 to [`MAX_MSG_LEN`]).
    pub len: usize,
    /// Set `TCP_NODELAY` on the accepted connection (TCP only).
    pub nodelay: bool,
    /// Write each reply as two writes ([`SPLIT_AT`] bytes, then the rest).
    pub split_writes: bool,
    /// How long a read polls before it blocks (zero = block at once).
    pub spin: Duration,
}

/// The arguments that follow `tensorwire raw-echo` to start a peer for `opts`
/// listening on `addr`:
/// `--unix PATH | --tcp ADDR`, `--len N`, then `--nodelay=0` (TCP with
/// `nodelay` off only), `--split-writes` and `--spin-us N` when set.
///
/// [`run_raw_ping`] appends these to the command it is given, so that command
/// should be the program and the subcommand name only, e.g.
/// `Command::new(std::env::current_exe()?).arg("raw-echo")`.
pub fn echo_args(opts: &RawOptions, addr: &str) -> Vec<String> {
    let mut args = vec![
        match opts.kind {
            RawKind::Unix => "--unix".to_string(),
            RawKind::Tcp => "--tcp".to_string(),
        },
        addr.to_string(),
        "--len".to_string(),
        opts.msg_len.to_string(),
    ];
    if opts.kind == RawKind::Tcp && !opts.nodelay {
        args.push("--nodelay=0".to_string());
    }
    if opts.split_writes {
        args.push("--split-writes".to_string());
    }
    if !opts.spin.is_zero() {
        args.push("--spin-us".to_string());
        args.push(opts.spin.as_micros().to_string());
    }
    args
}

/// Runs the echo peer: binds `opts.addr`, prints the bound address as the
/// first line of standard output (the handshake [`run_raw_ping`] waits for;
/// print nothing to stdout before calling this), accepts **one** connection
/// (waiting at most [`IO_TIMEOUT`]), then repeatedly reads exactly
/// `opts.len` bytes and writes them back, until the client closes the
/// connection. Returns `Ok(())` on a clean end of file between messages; an
/// error on end of file inside a message, on a timeout of [`IO_TIMEOUT`]
/// waiting for the next message, or on any socket error. A Unix socket file
/// it created is removed on return.
pub fn serve_raw_echo(opts: &EchoOptions) -> io::Result<()> {
    check_len(opts.len)?;
    let (listener, bound) = bind(opts.kind, &opts.addr)?;
    let _cleanup = match &listener {
        Listener::Unix(_) => Some(RemoveOnDrop(PathBuf::from(&opts.addr))),
        Listener::Tcp(_) => None,
    };
    let mut out = io::stdout().lock();
    writeln!(out, "{bound}")?;
    out.flush()?;
    drop(out);
    echo_on(
        listener,
        EchoLoop {
            len: opts.len,
            nodelay: opts.nodelay,
            split: opts.split_writes,
            spin: opts.spin,
        },
        IO_TIMEOUT,
    )
}

/// Measures `opts.warmup + opts.iterations` round trips over a fresh socket
/// pair and returns the round-trip time of each of the last
/// `opts.iterations`, in nanoseconds, in order.
///
/// The echo peer is `echo_cmd` with [`echo_args`] appended (its program,
/// arguments, explicitly set environment and working directory are copied;
/// its stdin is null, its stderr inherited, its stdout read for the address
/// line), or, with `None`, a thread of this process. A Unix socket lives in a
/// fresh private temporary directory, removed afterwards; TCP uses
/// `127.0.0.1` and an ephemeral port the peer reports.
///
/// Each round trip writes `msg_len` bytes (one write, or [`SPLIT_AT`] + rest
/// with `split_writes`) and reads `msg_len` bytes back; the reply must equal
/// what was sent (the first 8 bytes carry the iteration number, so a stale
/// reply is caught) or the run fails with `InvalidData`. Any step waiting
/// longer than [`IO_TIMEOUT`] fails with `TimedOut`. A child peer is killed
/// and reaped on every path; on success it must have exited cleanly.
pub fn run_raw_ping(opts: &RawOptions, echo_cmd: Option<&Command>) -> io::Result<Vec<u64>> {
    run_with_timeout(opts, echo_cmd, IO_TIMEOUT)
}

fn run_with_timeout(
    opts: &RawOptions,
    echo_cmd: Option<&Command>,
    timeout: Duration,
) -> io::Result<Vec<u64>> {
    check_len(opts.msg_len)?;
    let total = opts
        .warmup
        .checked_add(opts.iterations)
        .ok_or_else(|| invalid_input("warmup + iterations overflows"))?;
    let mut samples = Vec::new();
    samples
        .try_reserve_exact(opts.iterations)
        .map_err(|_| invalid_input(format!("cannot hold {} samples", opts.iterations)))?;

    // Declared before the peer so it is removed after the peer is gone.
    let dir = match opts.kind {
        RawKind::Unix => Some(
            tempfile::Builder::new()
                .prefix("tensorwire-raw-")
                .tempdir()?,
        ),
        RawKind::Tcp => None,
    };
    let listen_addr = match &dir {
        Some(d) => path_str(&d.path().join("echo.sock"))?,
        None => "127.0.0.1:0".to_string(),
    };

    match echo_cmd {
        Some(base) => {
            let mut cmd = copy_command(base);
            cmd.args(echo_args(opts, &listen_addr))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut peer = ChildPeer::spawn(cmd, "raw ping")?;
            let line = peer.address_line(timeout)?;
            let conn_addr = check_reported(opts.kind, &listen_addr, &line)?;
            let result = connect_and_ping(opts, &conn_addr, total, samples, timeout);
            // The connection is closed by now; the peer sees end of file.
            match result {
                Ok(samples) => {
                    peer.finish()?;
                    Ok(samples)
                }
                Err(e) => Err(e), // `peer` is killed and reaped on drop.
            }
        }
        None => {
            let (listener, bound) = bind(opts.kind, &listen_addr)?;
            let how = EchoLoop {
                len: opts.msg_len,
                nodelay: opts.nodelay,
                split: opts.split_writes,
                spin: opts.spin,
            };
            let echo = thread::Builder::new()
                .name("raw-echo".into())
                .spawn(move || echo_on(listener, how, timeout))?;
            // On an error the thread is left to end by itself: it sees end of
            // file once our socket is dropped, or gives up waiting for a
            // connection after `timeout`.
            let samples = connect_and_ping(opts, &bound, total, samples, timeout)?;
            match echo.join() {
                Ok(r) => r.map_err(|e| context(e, "echo thread"))?,
                Err(_) => return Err(io::Error::other("raw ping: the echo thread panicked")),
            }
            Ok(samples)
        }
    }
}

fn check_len(len: usize) -> io::Result<()> {
    if len == 0 || len > MAX_MSG_LEN {
        return Err(invalid_input(format!(
            "message length {len} is outside 1..={MAX_MSG_LEN}"
        )));
    }
    Ok(())
}

fn invalid_input(msg: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("raw ping: {}", msg.into()),
    )
}

/// `e` with `what` in front, keeping its kind; timeouts (which sockets report
/// as `WouldBlock`) become `TimedOut`.
fn context(e: io::Error, what: &str) -> io::Error {
    let kind = match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            return io::Error::new(
                io::ErrorKind::TimedOut,
                format!("raw ping: {what}: timed out"),
            )
        }
        k => k,
    };
    io::Error::new(kind, format!("raw ping: {what}: {e}"))
}

fn path_str(p: &Path) -> io::Result<String> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| invalid_input(format!("temporary path {} is not UTF-8", p.display())))
}

/// Checks the address line a child peer printed and returns where to
/// connect: the same path for Unix, a loopback address with a real port for
/// TCP.
fn check_reported(kind: RawKind, asked: &str, line: &str) -> io::Result<String> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("raw ping: the echo peer reported address {line:?}: {why}"),
        )
    };
    match kind {
        RawKind::Unix if line == asked => Ok(line.to_string()),
        RawKind::Unix => Err(bad(&format!("expected {asked:?}"))),
        RawKind::Tcp => {
            let a: SocketAddr = line.parse().map_err(|_| bad("not an ip:port"))?;
            if !a.ip().is_loopback() || a.port() == 0 {
                return Err(bad("expected a loopback address with a port"));
            }
            Ok(a.to_string())
        }
    }
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// Binds `addr`; returns the listener and the address it is bound to.
fn bind(kind: RawKind, addr: &str) -> io::Result<(Listener, String)> {
    let what = format!("bind {kind} {addr}");
    match kind {
        RawKind::Unix => {
            let l = UnixListener::bind(addr).map_err(|e| context(e, &what))?;
            Ok((Listener::Unix(l), addr.to_string()))
        }
        RawKind::Tcp => {
            let l = TcpListener::bind(addr).map_err(|e| context(e, &what))?;
            let bound = l.local_addr()?.to_string();
            Ok((Listener::Tcp(l), bound))
        }
    }
}

/// Removes a file when dropped (the echo peer's Unix socket).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Accepts one connection (polling, so the wait is bounded by `timeout`).
fn accept_within<S>(
    timeout: Duration,
    mut try_accept: impl FnMut() -> io::Result<S>,
) -> io::Result<S> {
    let deadline = Instant::now() + timeout;
    loop {
        match try_accept() {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("raw echo: no connection within {}s", timeout.as_secs_f64()),
                    ));
                }
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(context(e, "accept")),
        }
    }
}

/// How the echo side of one connection behaves.
#[derive(Clone, Copy, Debug)]
struct EchoLoop {
    len: usize,
    nodelay: bool,
    split: bool,
    spin: Duration,
}

/// Accepts one connection on `listener` and echoes `how.len`-byte messages
/// on it until end of file.
fn echo_on(listener: Listener, how: EchoLoop, timeout: Duration) -> io::Result<()> {
    match listener {
        Listener::Unix(l) => {
            l.set_nonblocking(true)?;
            let mut s = accept_within(timeout, || l.accept().map(|(s, _)| s))?;
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            echo_loop(&mut s, how)
        }
        Listener::Tcp(l) => {
            l.set_nonblocking(true)?;
            let mut s = accept_within(timeout, || l.accept().map(|(s, _)| s))?;
            s.set_nonblocking(false)?;
            s.set_nodelay(how.nodelay)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            echo_loop(&mut s, how)
        }
    }
}

/// Reads a message and writes it back, until end of file between messages.
/// Each pass waits for the client (bounded by the socket's read timeout), so
/// the loop runs as many times as the client sends messages.
fn echo_loop<S: Read + Write + AsFd>(s: &mut S, how: EchoLoop) -> io::Result<()> {
    let mut buf = vec![0u8; how.len];
    while read_message(s, &mut buf, how.spin).map_err(|e| context(e, "echo read"))? {
        send(s, &buf, how.split).map_err(|e| context(e, "echo write"))?;
    }
    Ok(())
}

/// Fills `buf` from `s`. `Ok(false)` on end of file before the first byte;
/// `UnexpectedEof` on end of file inside the message.
fn read_message<S: Read + AsFd>(s: &mut S, buf: &mut [u8], spin: Duration) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match read_some(s, &mut buf[got..], spin) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed {got} bytes into a {}-byte message",
                        buf.len()
                    ),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// One read: polls with non-blocking `recv`s for up to `spin` first, then
/// blocks in `read` (bounded by the socket's read timeout).
fn read_some<S: Read + AsFd>(s: &mut S, buf: &mut [u8], spin: Duration) -> io::Result<usize> {
    let mut wait = Spin::new(spin, SPIN_POLLS_PER_CHECK);
    if !spin.is_zero() {
        loop {
            match rustix::net::recv(s.as_fd(), &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
                Ok((n, _)) => return Ok(n),
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => {
                    if !wait.again() {
                        break;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    s.read(buf)
}

/// Writes `msg` as one write, or as [`SPLIT_AT`] bytes then the rest.
fn send<S: Write>(s: &mut S, msg: &[u8], split: bool) -> io::Result<()> {
    if split && msg.len() > SPLIT_AT {
        let (head, body) = msg.split_at(SPLIT_AT);
        s.write_all(head)?;
        s.write_all(body)
    } else {
        s.write_all(msg)
    }
}

fn connect_and_ping(
    opts: &RawOptions,
    addr: &str,
    total: usize,
    samples: Vec<u64>,
    timeout: Duration,
) -> io::Result<Vec<u64>> {
    let what = format!("connect {} {addr}", opts.kind);
    match opts.kind {
        RawKind::Unix => {
            let mut s = UnixStream::connect(addr).map_err(|e| context(e, &what))?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            ping_loop(&mut s, opts, total, samples)
        }
        RawKind::Tcp => {
            let sa: SocketAddr = addr
                .parse()
                .map_err(|_| invalid_input(format!("bad TCP address {addr:?}")))?;
            let mut s = TcpStream::connect_timeout(&sa, timeout).map_err(|e| context(e, &what))?;
            s.set_nodelay(opts.nodelay)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            ping_loop(&mut s, opts, total, samples)
        }
    }
}

/// `total` timed round trips; keeps the times of those after the warm-up.
fn ping_loop<S: Read + Write + AsFd>(
    s: &mut S,
    opts: &RawOptions,
    total: usize,
    mut samples: Vec<u64>,
) -> io::Result<Vec<u64>> {
    let mut out: Vec<u8> = (0..opts.msg_len).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; opts.msg_len];
    for i in 0..total {
        // Stamp the iteration number so a stale or duplicated reply is caught.
        let stamp = (i as u64).to_le_bytes();
        let n = stamp.len().min(out.len());
        out[..n].copy_from_slice(&stamp[..n]);

        let t0 = Instant::now();
        send(s, &out, opts.split_writes).map_err(|e| context(e, "write"))?;
        match read_message(s, &mut back, opts.spin) {
            Ok(true) => {}
            Ok(false) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("raw ping: the echo peer closed the connection at round trip {i}"),
                ))
            }
            Err(e) => return Err(context(e, "read reply")),
        }
        let dt = t0.elapsed();

        if back != out {
            let at = back.iter().zip(&out).position(|(a, b)| a != b).unwrap_or(0);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("raw ping: reply {i} differs from the request at byte {at}"),
            ));
        }
        if i >= opts.warmup {
            samples.push(u64::try_from(dt.as_nanos()).unwrap_or(u64::MAX));
        }
    }
    Ok(samples)
}

impl ChildPeer {
    /// Waits (at most `timeout`) for the first line of the child's stdout.
    fn address_line(&mut self, timeout: Duration) -> io::Result<String> {
        let stdout = self
            .child
            .as_mut()
            .and_then(|c| c.stdout.take())
            .ok_or_else(|| io::Error::other("raw ping: the echo peer has no stdout pipe"))?;
        let (tx, rx) = mpsc::channel();
        // The reader ends when the line arrives, or when the child dies
        // (killing it closes the pipe), so it never outlives the peer.
        thread::Builder::new()
            .name("raw-echo-addr".into())
            .spawn(move || {
                let mut line = String::new();
                let r = BufReader::new(stdout.take(MAX_ADDR_LINE)).read_line(&mut line);
                let _ = tx.send(r.map(|_| line));
            })?;
        match rx.recv_timeout(timeout) {
            Ok(Ok(line)) if line.ends_with('\n') => Ok(line.trim_end().to_string()),
            Ok(Ok(_)) => {
                let status = self.exit_status_soon();
                Err(io::Error::other(format!(
                    "raw ping: the echo peer closed its stdout without reporting an address \
                     ({status})"
                )))
            }
            Ok(Err(e)) => Err(context(e, "read the echo peer's address")),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "raw ping: the echo peer reported no address within {}s",
                    timeout.as_secs_f64()
                ),
            )),
        }
    }

    /// A description of how the child ended, waiting briefly for it.
    fn exit_status_soon(&mut self) -> String {
        match self.wait_within(Duration::from_millis(500)) {
            Ok(Some(s)) => describe(s),
            _ => "still running".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(kind: RawKind) -> RawOptions {
        RawOptions {
            kind,
            iterations: 50,
            warmup: 5,
            msg_len: 96,
            nodelay: true,
            split_writes: false,
            spin: Duration::ZERO,
        }
    }

    fn echo(len: usize, split: bool) -> EchoLoop {
        EchoLoop {
            len,
            nodelay: true,
            split,
            spin: Duration::ZERO,
        }
    }

    #[test]
    fn unix_in_thread() {
        let s = run_raw_ping(&opts(RawKind::Unix), None).unwrap();
        assert_eq!(s.len(), 50);
        assert!(s.iter().all(|&ns| ns > 0));
    }

    #[test]
    fn spinning_ends_both_ways_in_thread() {
        for kind in [RawKind::Unix, RawKind::Tcp] {
            for msg_len in [8, 300_000] {
                let o = RawOptions {
                    msg_len,
                    spin: Duration::from_micros(200),
                    ..opts(kind)
                };
                let s = run_raw_ping(&o, None).unwrap();
                assert_eq!(s.len(), 50, "{kind} {msg_len}");
            }
        }
    }

    #[test]
    fn tcp_in_thread() {
        let s = run_raw_ping(&opts(RawKind::Tcp), None).unwrap();
        assert_eq!(s.len(), 50);
        assert!(s.iter().all(|&ns| ns > 0));
    }

    #[test]
    fn sizes_and_split_writes() {
        for kind in [RawKind::Unix, RawKind::Tcp] {
            for msg_len in [1, 7, 8, 64, 65, 4096, 300_000] {
                for split_writes in [false, true] {
                    let o = RawOptions {
                        iterations: 3,
                        warmup: 1,
                        msg_len,
                        split_writes,
                        ..opts(kind)
                    };
                    let s = run_raw_ping(&o, None).unwrap();
                    assert_eq!(s.len(), 3, "{kind} {msg_len} {split_writes}");
                }
            }
        }
    }

    /// Nagle on, header and body written separately: it still works (it is
    /// only slow). No timing is asserted; the machine decides that.
    #[test]
    fn tcp_without_nodelay_split() {
        let o = RawOptions {
            iterations: 3,
            warmup: 0,
            nodelay: false,
            split_writes: true,
            ..opts(RawKind::Tcp)
        };
        assert_eq!(run_raw_ping(&o, None).unwrap().len(), 3);
    }

    #[test]
    fn zero_iterations_and_bad_lengths() {
        let o = RawOptions {
            iterations: 0,
            warmup: 2,
            ..opts(RawKind::Unix)
        };
        assert!(run_raw_ping(&o, None).unwrap().is_empty());
        for msg_len in [0, MAX_MSG_LEN + 1] {
            let o = RawOptions {
                msg_len,
                ..opts(RawKind::Tcp)
            };
            let e = run_raw_ping(&o, None).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        }
        let o = RawOptions {
            warmup: usize::MAX,
            ..opts(RawKind::Tcp)
        };
        assert_eq!(
            run_raw_ping(&o, None).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    /// The echo side, driven by hand: each reply is exactly the request, split
    /// writes included, and end of file between messages is a clean exit.
    #[test]
    fn echo_returns_what_was_sent() {
        for split in [false, true] {
            let (l, addr) = bind(RawKind::Tcp, "127.0.0.1:0").unwrap();
            let echo = thread::spawn(move || echo_on(l, echo(100, split), IO_TIMEOUT));
            let mut s = TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
            for round in 0..5u8 {
                let msg: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(round + 3)).collect();
                s.write_all(&msg).unwrap();
                let mut back = [0u8; 100];
                s.read_exact(&mut back).unwrap();
                assert_eq!(&back[..], &msg[..]);
            }
            drop(s);
            echo.join().unwrap().unwrap();
        }
    }

    #[test]
    fn echo_reports_eof_inside_a_message() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_str(&dir.path().join("e.sock")).unwrap();
        let (l, _) = bind(RawKind::Unix, &path).unwrap();
        let echo = thread::spawn(move || echo_on(l, echo(10, false), IO_TIMEOUT));
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(&[1, 2, 3]).unwrap();
        drop(s);
        let e = echo.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }

    #[test]
    fn echo_gives_up_without_a_client() {
        let (l, _) = bind(RawKind::Tcp, "127.0.0.1:0").unwrap();
        let t0 = Instant::now();
        let e = echo_on(l, echo(10, false), Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn kinds_parse_and_print() {
        for k in [RawKind::Unix, RawKind::Tcp] {
            assert_eq!(k.to_string().parse::<RawKind>(), Ok(k));
        }
        assert!("udp".parse::<RawKind>().is_err());
    }

    #[test]
    fn args_for_the_echo_subcommand() {
        let o = RawOptions {
            nodelay: false,
            split_writes: true,
            spin: Duration::from_micros(50),
            ..opts(RawKind::Tcp)
        };
        assert_eq!(
            echo_args(&o, "127.0.0.1:0"),
            [
                "--tcp",
                "127.0.0.1:0",
                "--len",
                "96",
                "--nodelay=0",
                "--split-writes",
                "--spin-us",
                "50"
            ]
        );
        assert_eq!(
            echo_args(&opts(RawKind::Unix), "/tmp/x/echo.sock"),
            ["--unix", "/tmp/x/echo.sock", "--len", "96"]
        );
    }

    #[test]
    fn reported_addresses_are_checked() {
        assert!(check_reported(RawKind::Tcp, "127.0.0.1:0", "127.0.0.1:4000").is_ok());
        assert!(check_reported(RawKind::Tcp, "127.0.0.1:0", "127.0.0.1:0").is_err());
        assert!(check_reported(RawKind::Tcp, "127.0.0.1:0", "10.1.2.3:4000").is_err());
        assert!(check_reported(RawKind::Tcp, "127.0.0.1:0", "hello").is_err());
        assert!(check_reported(RawKind::Unix, "/a/b", "/a/b").is_ok());
        assert!(check_reported(RawKind::Unix, "/a/b", "/a/c").is_err());
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        // The echo arguments appended after the script become $0, $1, ...
        c.arg("-c").arg(script);
        c
    }

    /// Misbehaving child peers: every case is an error, promptly, and leaves
    /// no child behind.
    #[test]
    fn child_peer_failures_are_errors_not_hangs() {
        let quick = Duration::from_millis(300);
        let cases = [
            // Never reports an address.
            ("exec sleep 30", io::ErrorKind::TimedOut),
            // Exits without reporting.
            ("exit 3", io::ErrorKind::Other),
            // Reports an address nobody listens on (port 9 is discard; if
            // something does listen there, the reply check fails instead).
            (
                "echo 127.0.0.1:9; exec sleep 30",
                io::ErrorKind::ConnectionRefused,
            ),
            // Reports garbage.
            (
                "echo not-an-address; exec sleep 30",
                io::ErrorKind::InvalidData,
            ),
        ];
        for (script, kind) in cases {
            let t0 = Instant::now();
            let e = run_with_timeout(&opts(RawKind::Tcp), Some(&sh(script)), quick).unwrap_err();
            assert!(t0.elapsed() < Duration::from_secs(5), "{script}: too slow");
            if kind != io::ErrorKind::ConnectionRefused {
                assert_eq!(e.kind(), kind, "{script}: {e}");
            }
        }
        // A program that does not exist.
        let e = run_raw_ping(
            &opts(RawKind::Unix),
            Some(&Command::new("/nonexistent/tensorwire")),
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn command_is_copied_with_env_and_dir() {
        let mut base = Command::new("prog");
        base.arg("raw-echo")
            .env("A", "1")
            .env_remove("B")
            .current_dir("/");
        let c = copy_command(&base);
        assert_eq!(c.get_program(), "prog");
        assert_eq!(c.get_args().collect::<Vec<_>>(), ["raw-echo"]);
        assert_eq!(c.get_envs().count(), 2);
        assert_eq!(c.get_current_dir(), Some(Path::new("/")));
    }
}
