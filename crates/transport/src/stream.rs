//! [`StreamConn`]: tensorwire framing over a connected Unix, TCP (TLS
//! included) or vsock socket.
//!
//! Sending: one message is one vectored `sendmsg` straight from the caller's
//! buffers — header, descriptor section, then each tensor at its 64-byte
//! aligned payload offset (zero padding between tensors comes from a static
//! block) — so a message never crosses the wire as two writes, and Nagle's
//! algorithm has no partial segment to hold back.
//!
//! Receiving: [`StreamConn::recv_head`] reads into a small staging buffer,
//! decodes the header, checks every length against the session limits, and
//! returns the header and descriptor section; the caller validates the
//! descriptors and then calls [`StreamConn::recv_payload`] with the
//! destination buffer it chose, into which the payload is read in place. The
//! only payload bytes that pass through the staging buffer are those that
//! arrived in the same `read` as the header (at most [`STAGING_LEN`]), which
//! is what lets a small message cost a single `read` syscall.
//! [`StreamStats::staged_payload_bytes`] counts them.
//!
//! Waiting: with a spin budget ([`StreamConn::set_spin`]), a read that finds
//! nothing polls the socket with non-blocking `recv`s for up to that budget
//! before it blocks ([`crate::spin`]), so a message that follows quickly
//! costs the receiver no wake-up; a [`SpinGate`] stops spinning on a
//! connection whose messages keep coming only after the budget, and
//! [`SOCKET_POLLERS`] caps how many threads of the process poll at once.
//! [`StreamStats::spins_caught`] and [`StreamStats::spins_missed`] count how
//! the spins ended.
//!
//! Timeouts: the socket's read timeout bounds how long a read waits. Timing
//! out *between* messages is harmless ([`RecvError::TimedOut`], still in
//! sync); timing out *inside* a message means the peer stalled and the
//! connection is done.

use crate::error::RecvError;
use crate::peer::{Credentials, PeerId};
use crate::spin::{Spin, SpinGate, SpinSlots, SOCKET_POLLERS};
use crate::tls::TlsSock;
use crate::vsock::VsockAddr;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{recv, sendmsg, RecvFlags, SendAncillaryBuffer, SendFlags};
use std::io::{self, IoSlice, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;
use wire::{align_up, Header, Limits, WireError, HEADER_LEN, MAGIC};

/// Size of the staging buffer a header is read into (payload bytes that
/// arrive with the header are moved out of it).
///
/// # Examples
///
/// A header and a descriptor section that fit it are read in one
/// `recv`; a payload that arrives with them is moved out to where the
/// receiver wants it:
///
/// ```
/// use std::os::unix::net::UnixStream;
/// use transport::{StreamConn, STAGING_LEN};
/// use wire::{Header, Kind, Limits, HEADER_LEN};
/// let (a, b) = UnixStream::pair()?;
/// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
/// let small = vec![3u8; STAGING_LEN - HEADER_LEN];
/// let mut h = Header::new(Kind::Request);
/// h.payload_len = small.len() as u64;
/// a.send(&h, &[], &[&small])?;
/// let (got, _) = b.recv_head(&Limits::default())?;
/// let mut dest = vec![0u8; got.payload_len as usize];
/// b.recv_payload(&mut dest)?;
/// assert_eq!(dest, small);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const STAGING_LEN: usize = 8192;

static ZEROS: [u8; 64] = [0; 64];

/// A spinning reader reads the clock and yields every this many empty
/// `recv`s (each is a system call of a few hundred nanoseconds).
const SOCKET_POLLS_PER_CHECK: u32 = 8;

/// Counters a connection keeps about what it received.
///
/// # Examples
///
/// ```
/// use std::os::unix::net::UnixStream;
/// use transport::StreamConn;
/// use wire::{Header, Kind, Limits};
/// let (a, b) = UnixStream::pair()?;
/// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
/// let mut h = Header::new(Kind::Request);
/// h.payload_len = 4;
/// a.send(&h, &[], &[&[1, 2, 3, 4]])?;
/// let (h, _) = b.recv_head(&Limits::default())?;
/// let mut payload = [0u8; 4];
/// b.recv_payload(&mut payload)?;
/// let s = b.stats();
/// assert_eq!(s.messages, 1);
/// // A small payload arrives with its header and is moved once.
/// assert_eq!(s.staged_payload_bytes + s.direct_payload_bytes, h.payload_len);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Messages whose header was received.
    pub messages: u64,
    /// Payload bytes that arrived in the staging buffer together with a
    /// header and were moved into their destination (the only user-space
    /// copy on the receive path).
    pub staged_payload_bytes: u64,
    /// Payload bytes read by the kernel straight into their destination.
    pub direct_payload_bytes: u64,
    /// Reads whose bytes arrived while the reader was spinning.
    pub spins_caught: u64,
    /// Reads that spun for their whole budget and then blocked.
    pub spins_missed: u64,
    /// Reads that blocked without spinning because as many other threads
    /// of this process were polling as [`SOCKET_POLLERS`] allows.
    pub spins_crowded: u64,
}

/// The socket, shared (not `dup`ed) between a [`StreamConn`] and its
/// [`StreamWriter`]s: one file descriptor per connection, which is what
/// bounds how many connections an agent can hold (`RLIMIT_NOFILE`).
#[derive(Debug, Clone)]
enum Sock {
    Unix(Arc<UnixStream>),
    Tcp(Arc<TcpStream>),
    /// TCP carrying TLS: reads and writes are of plaintext ([`crate::tls`]).
    Tls(Arc<TlsSock>),
    /// `AF_VSOCK` ([`crate::vsock`]) and its peer's address (kept: tests
    /// put a socket pair here, whose peer is no vsock address). Read and
    /// written exactly as a Unix stream.
    Vsock(Arc<socket2::Socket>, VsockAddr),
}

impl Sock {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Sock::Unix(s) => s.as_fd(),
            Sock::Tcp(s) => s.as_fd(),
            Sock::Tls(s) => s.tcp().as_fd(),
            Sock::Vsock(s, _) => s.as_fd(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Unix(s) => (&**s).read(buf),
            Sock::Tcp(s) => (&**s).read(buf),
            Sock::Tls(s) => s.read(buf),
            Sock::Vsock(s, _) => (&**s).read(buf),
        }
    }

    /// Reads what is there without waiting (`WouldBlock` if nothing is).
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tls(s) => s.try_read(buf),
            _ => loop {
                match recv(self.fd(), &mut *buf, RecvFlags::DONTWAIT) {
                    Ok((n, _)) => return Ok(n),
                    Err(Errno::INTR) => {}
                    Err(e) => return Err(io::Error::from_raw_os_error(e.raw_os_error())),
                }
            },
        }
    }

    /// True when bytes already received wait in user space (TLS
    /// plaintext decrypted ahead of the reader).
    fn has_pending(&self) -> bool {
        match self {
            Sock::Tls(s) => s.has_pending(),
            _ => false,
        }
    }

    /// Reads what is there, spinning first if `gate` grants a budget (see
    /// the module docs), then blocking as [`Sock::read`] does — or, when
    /// `block` is false, failing with `WouldBlock` instead of blocking.
    fn read_waiting(
        &mut self,
        buf: &mut [u8],
        gate: &mut SpinGate,
        slots: &SpinSlots,
        stats: &mut StreamStats,
        block: bool,
    ) -> io::Result<usize> {
        if (gate.budget().is_zero() || buf.is_empty()) && block {
            return self.read(buf);
        }
        let mut spin: Option<Spin> = None;
        let mut slot = None;
        loop {
            match self.try_read(buf) {
                Ok(n) => {
                    if spin.as_ref().is_some_and(|s| !s.granted().is_zero()) {
                        stats.spins_caught += 1;
                        gate.record(true);
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let s = spin.get_or_insert_with(|| {
                        let mut budget = gate.grant();
                        if !budget.is_zero() {
                            slot = slots.try_take();
                            if slot.is_none() {
                                stats.spins_crowded += 1;
                                budget = Duration::ZERO;
                            }
                        }
                        Spin::new(budget, SOCKET_POLLS_PER_CHECK)
                    });
                    if !s.again() {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        drop(slot);
        if spin.is_some_and(|s| !s.granted().is_zero()) {
            stats.spins_missed += 1;
            gate.record(false);
        }
        if block {
            self.read(buf)
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Sock::Unix(s) => s.shutdown(how),
            Sock::Tcp(s) => s.shutdown(how),
            Sock::Tls(s) => s.shutdown(how),
            Sock::Vsock(s, _) => s.shutdown(how),
        }
    }
}

/// One connected socket speaking tensorwire framing. One thread reads
/// (`recv_*` take `&mut self`); any number may send through
/// [`StreamConn::writer`] handles as long as each message is sent whole
/// by one of them at a time (callers serialise sends).
///
/// # Examples
///
/// ```
/// use std::os::unix::net::UnixStream;
/// use transport::StreamConn;
/// use wire::{Header, Kind, Limits};
/// let (a, b) = UnixStream::pair()?;
/// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
/// // A request of two tensors: header, descriptors, then each tensor at its
/// // 64-byte aligned offset, all in one sendmsg.
/// let (x, y) = ([1u8; 10], [2u8; 3]);
/// let mut h = Header::new(Kind::Request);
/// h.payload_len = 64 + 3;
/// a.send(&h, &[], &[&x, &y])?;
/// let (got, _desc) = b.recv_head(&Limits::default())?; // checked before anything is read
/// let mut payload = vec![0u8; got.payload_len as usize]; // the receiver picks the destination
/// b.recv_payload(&mut payload)?;
/// assert_eq!((&payload[..10], &payload[64..]), (&x[..], &y[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct StreamConn {
    sock: Sock,
    staging: Vec<u8>,
    start: usize,
    end: usize,
    stats: StreamStats,
    gate: SpinGate,
    slots: &'static SpinSlots,
    peer: String,
    parking: bool,
}

/// A send-only handle on a [`StreamConn`]'s socket.
///
/// # Examples
///
/// ```
/// use std::os::unix::net::UnixStream;
/// use transport::StreamConn;
/// use wire::{Header, Kind, Limits};
/// let (a, b) = UnixStream::pair()?;
/// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
/// let writer = a.writer()?; // sends from another thread while `a` reads
/// std::thread::spawn(move || writer.send(&Header::new(Kind::Ping), &[], &[]))
///     .join()
///     .map_err(|_| "panicked")??;
/// assert_eq!(b.recv_head(&Limits::default())?.0.kind, Kind::Ping);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct StreamWriter {
    sock: Sock,
}

impl StreamConn {
    fn new(sock: Sock, peer: String) -> StreamConn {
        StreamConn {
            sock,
            staging: vec![0; STAGING_LEN],
            start: 0,
            end: 0,
            stats: StreamStats::default(),
            gate: SpinGate::new(Duration::ZERO),
            slots: &SOCKET_POLLERS,
            peer,
            parking: false,
        }
    }

    /// Wraps a connected Unix stream.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// let (a, _b) = UnixStream::pair()?;
    /// let conn = StreamConn::from_unix(a, "unix:pair".into());
    /// assert_eq!(conn.peer(), "unix:pair");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_unix(s: UnixStream, peer: String) -> StreamConn {
        StreamConn::new(Sock::Unix(Arc::new(s)), peer)
    }

    /// Wraps a connected TCP stream, setting `TCP_NODELAY` to `nodelay`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::net::{TcpListener, TcpStream};
    /// use transport::{PeerId, StreamConn};
    /// let l = TcpListener::bind("127.0.0.1:0")?;
    /// let s = TcpStream::connect(l.local_addr()?)?;
    /// let conn = StreamConn::from_tcp(s, true)?; // TCP_NODELAY on: no Nagle stall
    /// assert!(matches!(conn.peer_id()?, PeerId::Addr(ip) if ip.is_loopback()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_tcp(s: TcpStream, nodelay: bool) -> io::Result<StreamConn> {
        s.set_nodelay(nodelay)?;
        let peer = s
            .peer_addr()
            .map_or_else(|_| "tcp peer".to_string(), |a| a.to_string());
        Ok(StreamConn::new(Sock::Tcp(Arc::new(s)), peer))
    }

    /// Wraps a TLS session over TCP ([`crate::tls`]), setting `TCP_NODELAY`
    /// to `nodelay` on the socket underneath.
    ///
    /// # Examples
    ///
    /// Messages over a TLS session a program set up itself:
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::tls::{client_config, server_config, server_name, TlsSock};
    /// use transport::StreamConn;
    /// use wire::{Header, Kind, Limits};
    /// # fn pki(dir: &std::path::Path) -> Result<(transport::tls::ServerTlsFiles, transport::tls::TlsClientParams), Box<dyn std::error::Error>> {
    /// #     let ca_key = rcgen::KeyPair::generate()?;
    /// #     let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    /// #     ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    /// #     let ca = ca_params.self_signed(&ca_key)?;
    /// #     let issuer = rcgen::Issuer::new(ca_params, ca_key);
    /// #     let mut leaf = |name: &str, file: &str| -> Result<(std::path::PathBuf, std::path::PathBuf), Box<dyn std::error::Error>> {
    /// #         let key = rcgen::KeyPair::generate()?;
    /// #         let cert = rcgen::CertificateParams::new(vec![name.to_string()])?.signed_by(&key, &issuer)?;
    /// #         let (c, k) = (dir.join(format!("{file}.pem")), dir.join(format!("{file}.key")));
    /// #         std::fs::write(&c, cert.pem())?;
    /// #         std::fs::write(&k, key.serialize_pem())?;
    /// #         Ok((c, k))
    /// #     };
    /// #     let (cert, key) = leaf("localhost", "server")?;
    /// #     let (ccert, ckey) = leaf("client.test", "client")?;
    /// #     let ca_path = dir.join("ca.pem");
    /// #     std::fs::write(&ca_path, ca.pem())?;
    /// #     Ok((transport::tls::ServerTlsFiles { cert, key, client_ca: Some(ca_path.clone()) },
    /// #         transport::tls::TlsClientParams { ca: Some(ca_path), cert: Some(ccert), key: Some(ckey), name: None }))
    /// # }
    /// # let dir = tempfile::tempdir()?;
    /// let (files, params) = pki(dir.path())?;
    /// let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let addr = l.local_addr()?;
    /// let config = server_config(&files)?;
    /// let agent = std::thread::spawn(move || -> Result<Kind, Box<dyn std::error::Error + Send + Sync>> {
    ///     let mut conn = StreamConn::from_tls(TlsSock::server(l.accept()?.0, config)?, true)?;
    ///     Ok(conn.recv_head(&Limits::default())?.0.kind)
    /// });
    /// let tcp = std::net::TcpStream::connect(addr)?;
    /// let sock = TlsSock::client(tcp, client_config(&params)?, server_name("localhost:0", None)?, Duration::from_secs(5))?;
    /// let conn = StreamConn::from_tls(sock, true)?;
    /// conn.send(&Header::new(Kind::Ping), &[], &[])?;
    /// assert_eq!(agent.join().map_err(|_| "agent panicked")?.map_err(|e| e.to_string())?, Kind::Ping);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_tls(s: TlsSock, nodelay: bool) -> io::Result<StreamConn> {
        s.tcp().set_nodelay(nodelay)?;
        let peer = s
            .tcp()
            .peer_addr()
            .map_or_else(|_| "tls peer".to_string(), |a| format!("tls {a}"));
        Ok(StreamConn::new(Sock::Tls(Arc::new(s)), peer))
    }

    /// Wraps a connected vsock socket ([`crate::vsock`]).
    pub(crate) fn from_vsock(s: socket2::Socket) -> io::Result<StreamConn> {
        let peer = crate::vsock::peer_addr(&s)?;
        Ok(StreamConn::from_vsock_at(s, peer))
    }

    /// Wraps a connected stream socket as a vsock connection whose peer is
    /// `peer` (the vsock code path over any stream socket: tests run it on
    /// a socket pair).
    fn from_vsock_at(s: socket2::Socket, peer: VsockAddr) -> StreamConn {
        StreamConn::new(Sock::Vsock(Arc::new(s), peer), format!("vsock {peer}"))
    }

    /// The subject alternative DNS names of a TLS peer's verified client
    /// certificate (once its handshake is done); `None` on other sockets
    /// and for TLS peers that presented none.
    ///
    /// Example: [`Listener::bind_tls`](crate::Listener::bind_tls) (a
    /// client certificate named `client.test`). On other sockets:
    ///
    /// ```
    /// let (a, _b) = std::os::unix::net::UnixStream::pair()?;
    /// let conn = transport::StreamConn::from_unix(a, "pair".into());
    /// assert_eq!(conn.tls_peer_names(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tls_peer_names(&self) -> Option<Vec<String>> {
        match &self.sock {
            Sock::Tls(s) => s.peer_names(),
            _ => None,
        }
    }

    /// Who is on the other end, for per-peer limits ([`PeerId`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::{PeerId, StreamConn};
    /// let (a, _b) = UnixStream::pair()?;
    /// let conn = StreamConn::from_unix(a, "pair".into());
    /// let uid = std::fs::metadata("/proc/self")?;
    /// # use std::os::unix::fs::MetadataExt;
    /// assert_eq!(conn.peer_id()?, PeerId::Uid(uid.uid()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peer_id(&self) -> io::Result<PeerId> {
        match &self.sock {
            Sock::Unix(s) => PeerId::of_unix(s),
            Sock::Tcp(s) => PeerId::of_tcp(s),
            Sock::Tls(s) => PeerId::of_tcp(s.tcp()),
            Sock::Vsock(_, a) => Ok(PeerId::Vsock(a.cid)),
        }
    }

    /// A vsock peer's CID and port; `None` on other sockets.
    ///
    /// # Examples
    ///
    /// (This kernel has no vsock loopback: a unix connection has no vsock
    /// peer.)
    ///
    /// ```
    /// let (a, _b) = std::os::unix::net::UnixStream::pair()?;
    /// let conn = transport::StreamConn::from_unix(a, "pair".into());
    /// assert_eq!(conn.vsock_peer(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn vsock_peer(&self) -> Option<VsockAddr> {
        match &self.sock {
            Sock::Vsock(_, a) => Some(*a),
            _ => None,
        }
    }

    /// The kernel's record of a Unix peer ([`Credentials`]); `None` over
    /// TCP, where the source address is all there is, and over vsock (no
    /// `SO_PEERCRED`: the peer's CID and port, [`Self::vsock_peer`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// let (a, _b) = UnixStream::pair()?;
    /// let conn = StreamConn::from_unix(a, "pair".into());
    /// let who = conn.credentials()?.ok_or("a Unix peer has credentials")?;
    /// assert_eq!(who.pid, std::process::id() as i32);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn credentials(&self) -> io::Result<Option<Credentials>> {
        match &self.sock {
            Sock::Unix(s) => Credentials::of_unix(s).map(Some),
            Sock::Tcp(_) | Sock::Tls(_) | Sock::Vsock(..) => Ok(None),
        }
    }

    /// Parking mode, for a server that keeps waiting connections in an
    /// event set instead of a thread each: [`StreamConn::recv_head`] no
    /// longer blocks for the next message (after its spin, if any) but
    /// returns [`RecvError::WouldBlock`], keeping whatever part of the
    /// header and descriptor section has arrived for the next call. Payload
    /// reads still block (bounded by the read timeout).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::{RecvError, StreamConn};
    /// use wire::{Header, Kind, Limits};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// b.set_parking(true);
    /// assert!(matches!(b.recv_head(&Limits::default()), Err(RecvError::WouldBlock)));
    /// a.send(&Header::new(Kind::Ping), &[], &[])?;
    /// # assert!(b.wait_readable(std::time::Duration::from_secs(5))?);
    /// assert_eq!(b.recv_head(&Limits::default())?.0.kind, Kind::Ping);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_parking(&mut self, on: bool) {
        self.parking = on;
    }

    /// A human-readable name for the peer (for logs and errors).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::{connect, Endpoint, Listener};
    /// let l = Listener::bind(&Endpoint::parse("tcp://127.0.0.1:0")?)?;
    /// let c = connect(l.endpoint(), Duration::from_secs(1))?;
    /// println!("connected to {}", c.peer());
    /// assert!(c.peer().starts_with("127.0.0.1:"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// What this connection has received so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// let (a, _b) = UnixStream::pair()?;
    /// assert_eq!(StreamConn::from_unix(a, "pair".into()).stats().messages, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> StreamStats {
        self.stats
    }

    /// Lets a read that finds nothing spin for up to `budget` before it
    /// blocks (zero, the default, blocks at once). See the module docs.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use std::time::Duration;
    /// use transport::StreamConn;
    /// use wire::{Header, Kind, Limits};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// b.set_spin(Duration::from_micros(50)); // poll before sleeping: no wake-up if it comes soon
    /// a.send(&Header::new(Kind::Ping), &[], &[])?;
    /// assert_eq!(b.recv_head(&Limits::default())?.0.kind, Kind::Ping);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_spin(&mut self, budget: Duration) {
        self.gate = SpinGate::new(budget);
    }

    /// As [`StreamConn::set_spin`], polling in `slots` instead of the
    /// process-wide [`SOCKET_POLLERS`] (tests that must not share them).
    #[cfg(test)]
    fn set_spin_in(&mut self, budget: Duration, slots: &'static SpinSlots) {
        self.gate = SpinGate::new(budget);
        self.slots = slots;
    }

    /// Bounds how long one read may wait (`None` = forever).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use std::time::Duration;
    /// use transport::{RecvError, StreamConn};
    /// use wire::Limits;
    /// let (a, _b) = UnixStream::pair()?;
    /// let mut a = StreamConn::from_unix(a, "a".into());
    /// a.set_read_timeout(Some(Duration::from_millis(10)))?;
    /// assert!(matches!(a.recv_head(&Limits::default()), Err(RecvError::TimedOut)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.sock {
            Sock::Unix(s) => s.set_read_timeout(t),
            Sock::Tcp(s) => s.set_read_timeout(t),
            Sock::Vsock(s, _) => s.set_read_timeout(nonzero(t)?),
            Sock::Tls(s) => {
                s.set_read_timeout(t);
                Ok(())
            }
        }
    }

    /// Bounds how long a blocked send may wait for the peer to read (`None` = forever).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use std::time::Duration;
    /// use transport::StreamConn;
    /// use wire::{Header, Kind};
    /// let (a, _b) = UnixStream::pair()?; // _b never reads
    /// let a = StreamConn::from_unix(a, "a".into());
    /// a.set_write_timeout(Some(Duration::from_millis(20)))?;
    /// let big = vec![0u8; 16 << 20];
    /// let mut h = Header::new(Kind::Request);
    /// h.payload_len = big.len() as u64;
    /// assert!(a.send(&h, &[], &[&big]).is_err()); // the socket filled up
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.sock {
            Sock::Unix(s) => s.set_write_timeout(t),
            Sock::Tcp(s) => s.set_write_timeout(t),
            Sock::Vsock(s, _) => s.set_write_timeout(nonzero(t)?),
            Sock::Tls(s) => {
                s.set_write_timeout(t);
                Ok(())
            }
        }
    }

    /// A send-only handle sharing this socket (the same file descriptor:
    /// the socket closes when the last handle drops).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// use wire::{Header, Kind, Limits};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// let w = a.writer()?;
    /// drop(a); // the writer keeps the socket open
    /// w.send(&Header::new(Kind::Ping), &[], &[])?;
    /// assert_eq!(b.recv_head(&Limits::default())?.0.kind, Kind::Ping);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn writer(&self) -> io::Result<StreamWriter> {
        Ok(StreamWriter {
            sock: self.sock.clone(),
        })
    }

    /// Closes both directions; a thread blocked reading wakes with EOF.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::{RecvError, StreamConn};
    /// use wire::Limits;
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// a.shutdown()?;
    /// assert!(matches!(b.recv_head(&Limits::default()), Err(RecvError::Closed)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(&self) -> io::Result<()> {
        self.sock.shutdown(Shutdown::Both)
    }

    /// Sends one message; see `send_message`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// use wire::{encode_tensor_section, DType, Header, Kind, Limits, TensorDesc};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// let x: Vec<u8> = [0.5f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    /// let t = TensorDesc { dtype: DType::F32, shape: vec![4], offset: 0, len: 16 };
    /// let mut desc = Vec::new();
    /// encode_tensor_section(std::slice::from_ref(&t), None, &mut desc);
    /// let mut h = Header::new(Kind::Request);
    /// (h.tensor_count, h.desc_len, h.payload_len) = (1, desc.len() as u32, 16);
    /// a.send(&h, &desc, &[&x])?; // straight from the caller's memory
    /// let (got, got_desc) = b.recv_head(&Limits::default())?;
    /// assert_eq!((got, got_desc), (h, desc));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn send(&self, header: &Header, desc: &[u8], tensors: &[&[u8]]) -> io::Result<()> {
        send_message(&self.sock, header, desc, tensors, None)
    }

    /// Waits at most `timeout` for something to read (bytes, or the end of
    /// the stream): `true` if there is, `false` if the time ran out. For a
    /// caller whose deadline comes before the socket's read timeout: it
    /// waits here, between messages, instead of in a read that would
    /// outlast its deadline (a read timing out mid-message ends the
    /// connection; one that times out here ends nothing).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use std::time::Duration;
    /// use transport::StreamConn;
    /// use wire::{Header, Kind};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// assert!(!b.wait_readable(Duration::from_millis(5))?); // nothing yet, nothing lost
    /// a.send(&Header::new(Kind::Ping), &[], &[])?;
    /// assert!(b.wait_readable(Duration::from_secs(1))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        if self.has_buffered() {
            return Ok(true);
        }
        let fd = self.sock.fd();
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        match poll(&mut fds, Some(&ts)) {
            Ok(0) => Ok(false),
            Ok(_) => Ok(true),
            // A signal: report "not yet"; the caller checks its deadline.
            Err(Errno::INTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Polls for up to `budget` for something to read, without blocking:
    /// `true` as soon as there is, `false` once the budget is spent. For a
    /// caller that expects its answer about now (a client that slept until
    /// just before its model's usual completion): catching the answer here
    /// saves the wake-up a blocking read would need. It polls in one of
    /// the process's polling slots, as reads that spin do ([`SOCKET_POLLERS`]);
    /// with none free it returns `false` at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use std::time::Duration;
    /// use transport::StreamConn;
    /// use wire::{Header, Kind};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// assert!(!b.poll_readable(Duration::from_micros(50))?);
    /// a.send(&Header::new(Kind::Ping), &[], &[])?;
    /// assert!(b.poll_readable(Duration::from_millis(100))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn poll_readable(&self, budget: Duration) -> io::Result<bool> {
        if self.has_buffered() {
            return Ok(true);
        }
        let Some(_slot) = self.slots.try_take() else {
            return Ok(false);
        };
        let mut spin = Spin::new(budget, SOCKET_POLLS_PER_CHECK);
        loop {
            if self.wait_readable(Duration::ZERO)? {
                return Ok(true);
            }
            if !spin.again() {
                return Ok(false);
            }
        }
    }

    /// True when bytes of a next message are already buffered (no syscall).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// use wire::{Header, Kind, Limits};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// // Two messages written back to back are read into the staging buffer together.
    /// a.send(&Header::new(Kind::Ping), &[], &[])?;
    /// a.send(&Header::new(Kind::Ping), &[], &[])?;
    /// # std::thread::sleep(std::time::Duration::from_millis(10));
    /// b.recv_head(&Limits::default())?;
    /// assert!(b.has_buffered()); // the second one: no syscall needed to see it
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn has_buffered(&self) -> bool {
        self.end > self.start || self.sock.has_pending()
    }

    /// Frees the staging buffer if nothing is buffered in it, so that an
    /// idle connection holds no buffer ([`STAGING_LEN`] bytes each, most of
    /// what an idle session costs); the next read allocates it again.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// let (a, _b) = UnixStream::pair()?;
    /// let mut a = StreamConn::from_unix(a, "a".into());
    /// a.release_staging(); // idle: give its 8 KiB back
    /// assert!(!a.has_buffered());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn release_staging(&mut self) {
        if self.start == self.end {
            self.staging = Vec::new();
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads the next message's header and descriptor section. The header is
    /// decoded and checked against `limits` before the descriptor section is
    /// read; the payload is left unread for [`StreamConn::recv_payload`] or
    /// [`StreamConn::skip_payload`].
    ///
    /// Nothing is consumed until header and descriptor section are both
    /// buffered, so in parking mode a call that returns
    /// [`RecvError::WouldBlock`] halfway through can simply be repeated.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io::Write;
    /// use std::os::unix::net::UnixStream;
    /// use transport::{RecvError, StreamConn};
    /// use wire::{Header, Kind, Limits, Status};
    /// let (mut peer, b) = UnixStream::pair()?;
    /// let mut b = StreamConn::from_unix(b, "b".into());
    /// // A peer announces 1 GiB (and sends nothing of it).
    /// let mut h = Header::new(Kind::Request);
    /// h.payload_len = 1 << 30;
    /// peer.write_all(&h.encode())?;
    /// // Refused on the header alone, before a byte of payload is allocated.
    /// match b.recv_head(&Limits::default()) {
    ///     Err(RecvError::Wire(e)) => assert_eq!(e.status(), Status::LimitExceeded),
    ///     other => panic!("expected a limit error, got {other:?}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_head(&mut self, limits: &Limits) -> Result<(Header, Vec<u8>), RecvError> {
        let park = self.parking;
        if let Err(e) = self.fill(HEADER_LEN, true, park) {
            // A peer speaking another protocol may say less than a header
            // and close (an HTTP server's short 400): its first bytes say
            // more than the early end does.
            let got = &self.staging[self.start..self.end];
            return match got.first_chunk::<4>() {
                Some(m) if *m != MAGIC && !matches!(e, RecvError::WouldBlock) => {
                    Err(WireError::BadMagic(*m).into())
                }
                _ => Err(e),
            };
        }
        let header = Header::decode(&self.staging[self.start..self.start + HEADER_LEN])?;
        header.check_limits(limits)?;
        let dlen = header.desc_len as usize;
        self.fill(HEADER_LEN + dlen, false, park)?;
        self.start += HEADER_LEN;
        self.stats.messages += 1;
        let desc = self.staging[self.start..self.start + dlen].to_vec();
        self.start += dlen;
        Ok((header, desc))
    }

    /// Reads exactly `dest.len()` payload bytes into `dest`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// use wire::{AlignedBuf, Header, Kind, Limits};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// let data = vec![7u8; 100_000];
    /// let mut h = Header::new(Kind::Request);
    /// h.payload_len = data.len() as u64;
    /// let sender = std::thread::spawn(move || a.send(&h, &[], &[&data]));
    /// let (h, _) = b.recv_head(&Limits::default())?;
    /// let mut dest = AlignedBuf::zeroed(h.payload_len as usize)?; // its final home
    /// b.recv_payload(&mut dest)?;
    /// sender.join().map_err(|_| "panicked")??;
    /// assert!(dest.iter().all(|&x| x == 7));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_payload(&mut self, dest: &mut [u8]) -> Result<(), RecvError> {
        let staged = (self.end - self.start).min(dest.len());
        dest[..staged].copy_from_slice(&self.staging[self.start..self.start + staged]);
        self.start += staged;
        self.stats.staged_payload_bytes += staged as u64;
        let mut pos = staged;
        while pos < dest.len() {
            match self.sock.read_waiting(
                &mut dest[pos..],
                &mut self.gate,
                self.slots,
                &mut self.stats,
                true,
            ) {
                Ok(0) => return Err(mid_message(io::ErrorKind::UnexpectedEof)),
                Ok(n) => pos += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(mid_message(io::ErrorKind::TimedOut)),
                Err(e) => return Err(RecvError::Io(e)),
            }
        }
        self.stats.direct_payload_bytes += (dest.len() - staged) as u64;
        Ok(())
    }

    /// Reads and discards `len` payload bytes (after a rejected header), so
    /// the stream stays in sync.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// use wire::{Header, Kind, Limits};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// let mut h = Header::new(Kind::Request);
    /// h.payload_len = 5;
    /// a.send(&h, &[], &[b"hello"])?;
    /// a.send(&Header::new(Kind::Ping), &[], &[])?;
    /// let (refused, _) = b.recv_head(&Limits::default())?;
    /// b.skip_payload(refused.payload_len)?; // answered with an error instead
    /// assert_eq!(b.recv_head(&Limits::default())?.0.kind, Kind::Ping); // still in sync
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn skip_payload(&mut self, mut len: u64) -> Result<(), RecvError> {
        while len > 0 {
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
                self.fill(1, false, false)?;
            }
            let n = ((self.end - self.start) as u64).min(len);
            self.start += n as usize;
            len -= n;
        }
        Ok(())
    }

    /// Ensures `n` bytes are buffered from `start`. `at_boundary` says the
    /// caller is between messages, where EOF and timeouts are benign;
    /// `park` that a read which would block returns
    /// [`RecvError::WouldBlock`] instead (what arrived stays buffered).
    fn fill(&mut self, n: usize, at_boundary: bool, park: bool) -> Result<(), RecvError> {
        if self.end - self.start >= n {
            return Ok(());
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.staging.len() - self.start < n {
            self.staging.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.staging.len() < n.max(STAGING_LEN) {
            // After `release_staging`, or for a descriptor section larger
            // than the staging buffer (its length was checked against the
            // limits already).
            self.staging.resize(n.max(STAGING_LEN), 0);
        }
        while self.end - self.start < n {
            let empty = at_boundary && self.start == self.end;
            match self.sock.read_waiting(
                &mut self.staging[self.end..],
                &mut self.gate,
                self.slots,
                &mut self.stats,
                !park,
            ) {
                Ok(0) if empty => return Err(RecvError::Closed),
                Ok(0) => return Err(mid_message(io::ErrorKind::UnexpectedEof)),
                Ok(k) => self.end += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if park && e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(RecvError::WouldBlock)
                }
                Err(e) if is_timeout(&e) && empty => return Err(RecvError::TimedOut),
                Err(e) if is_timeout(&e) => return Err(mid_message(io::ErrorKind::TimedOut)),
                Err(e) => return Err(RecvError::Io(e)),
            }
        }
        Ok(())
    }
}

impl AsFd for StreamConn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.fd()
    }
}

/// The connection's socket (the same open file as its [`StreamConn`]'s).
impl AsFd for StreamWriter {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.fd()
    }
}

impl StreamWriter {
    /// Sends one message; see `send_message`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::StreamConn;
    /// use wire::{Header, Kind, Limits};
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// let mut h = Header::new(Kind::Response);
    /// h.payload_len = 3;
    /// a.writer()?.send(&h, &[], &[b"abc"])?;
    /// let (got, _) = b.recv_head(&Limits::default())?;
    /// let mut payload = [0u8; 3];
    /// b.recv_payload(&mut payload)?;
    /// assert_eq!((got.kind, &payload), (Kind::Response, b"abc"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn send(&self, header: &Header, desc: &[u8], tensors: &[&[u8]]) -> io::Result<()> {
        send_message(&self.sock, header, desc, tensors, None)
    }

    /// Sends one message; while the socket is full, calls `on_readable`
    /// whenever the peer has sent something, so a peer that writes before it
    /// reads cannot deadlock us (see `send_message`).
    ///
    /// # Examples
    ///
    /// Two ends that each send 4 MiB before reading: with plain sends both
    /// would wait forever on full sockets; draining what the peer sends
    /// meanwhile lets both finish.
    ///
    /// ```
    /// use rustix::net::{recv, RecvFlags};
    /// use std::io::Read;
    /// use std::os::unix::net::UnixStream;
    /// use std::time::Duration;
    /// use transport::StreamConn;
    /// use wire::{Header, Kind, Limits, HEADER_LEN};
    /// const LEN: usize = 4 << 20;
    /// let (a, b) = UnixStream::pair()?;
    /// let mut raw = a.try_clone()?; // where the draining reads from
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// let peer = std::thread::spawn(move || -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    ///     let mut h = Header::new(Kind::Request);
    ///     h.payload_len = LEN as u64;
    ///     b.writer()?.send(&h, &[], &[&vec![7u8; LEN]])?; // writes first...
    ///     let (got, _) = b.recv_head(&Limits::default())?; // ...then reads
    ///     let mut payload = vec![0u8; got.payload_len as usize];
    ///     b.recv_payload(&mut payload)?;
    ///     Ok(got.payload_len)
    /// });
    ///
    /// let mut h = Header::new(Kind::Response);
    /// h.payload_len = LEN as u64;
    /// let mut drained = Vec::new();
    /// let mut chunk = vec![0u8; 1 << 16];
    /// let mut on_readable = || -> std::io::Result<()> {
    ///     // Take what has arrived, without waiting for more.
    ///     while let Ok((n, _)) = recv(&raw, &mut chunk[..], RecvFlags::DONTWAIT) {
    ///         if n == 0 { break; }
    ///         drained.extend_from_slice(&chunk[..n]);
    ///     }
    ///     Ok(())
    /// };
    /// let w = a.writer()?;
    /// w.send_draining(&h, &[], &[&vec![1u8; LEN]], &mut on_readable, Some(Duration::from_secs(30)))?;
    /// assert_eq!(peer.join().map_err(|_| "peer panicked")?.map_err(|e| e.to_string())?, LEN as u64);
    /// let mut rest = vec![0u8; HEADER_LEN + LEN - drained.len()];
    /// raw.read_exact(&mut rest)?; // whatever the draining had not taken yet
    /// drained.extend_from_slice(&rest);
    /// assert!(drained[HEADER_LEN..].iter().all(|&x| x == 7));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn send_draining(
        &self,
        header: &Header,
        desc: &[u8],
        tensors: &[&[u8]],
        on_readable: &mut dyn FnMut() -> io::Result<()>,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        send_message(
            &self.sock,
            header,
            desc,
            tensors,
            Some((on_readable, timeout)),
        )
    }

    /// Closes both directions of the socket.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::{RecvError, StreamConn};
    /// use wire::Limits;
    /// let (a, b) = UnixStream::pair()?;
    /// let (a, mut b) = (StreamConn::from_unix(a, "a".into()), StreamConn::from_unix(b, "b".into()));
    /// a.writer()?.shutdown()?; // closes the socket all handles share
    /// assert!(matches!(b.recv_head(&Limits::default()), Err(RecvError::Closed)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(&self) -> io::Result<()> {
        self.sock.shutdown(Shutdown::Both)
    }
}

/// A send's way of draining the peer while the socket is full: called
/// each time something arrives, within the timeout of each wait.
pub(crate) type Drain<'a> = (&'a mut dyn FnMut() -> io::Result<()>, Option<Duration>);

/// Sends header + `desc` + `tensors` as one message with vectored writes.
///
/// `tensors` are laid out back to back at 64-byte aligned offsets, exactly
/// as [`wire::layout_payload`] computes them; `header.desc_len` and
/// `header.payload_len` must match. With `drain`, the socket is written
/// without blocking, and while it is full the callback runs each time the
/// socket becomes readable (a client reads responses there, so that a
/// pipelined sender and an agent that answers in order never wait on each
/// other); its timeout bounds each wait for writability.
fn send_message(
    sock: &Sock,
    header: &Header,
    desc: &[u8],
    tensors: &[&[u8]],
    mut drain: Option<Drain<'_>>,
) -> io::Result<()> {
    if header.desc_len as usize != desc.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "header desc_len does not match the descriptor section",
        ));
    }
    let head = header.encode();
    let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(2 + 2 * tensors.len());
    iov.push(IoSlice::new(&head));
    iov.push(IoSlice::new(desc));
    let mut cursor = 0u64;
    for t in tensors {
        let off = align_up(cursor).unwrap_or(u64::MAX);
        let pad = (off - cursor) as usize;
        if pad > 0 {
            iov.push(IoSlice::new(&ZEROS[..pad]));
        }
        iov.push(IoSlice::new(t));
        cursor = off.saturating_add(t.len() as u64);
    }
    if cursor != header.payload_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "tensors lay out to {cursor} payload bytes, header says {}",
                header.payload_len
            ),
        ));
    }
    let mut slices: &mut [IoSlice<'_>] = &mut iov;
    if let Sock::Tls(tls) = sock {
        return tls.send(slices, drain);
    }
    let fd = sock.fd();
    let flags = if drain.is_some() {
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT
    } else {
        SendFlags::NOSIGNAL
    };
    while !slices.is_empty() {
        match sendmsg(fd, slices, &mut SendAncillaryBuffer::default(), flags) {
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => match drain.as_mut() {
                // Blocking socket: SO_SNDTIMEO expired, the peer is not reading.
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "peer stopped reading (send timed out)",
                    ))
                }
                Some((on_readable, timeout)) => {
                    let mut fds = [PollFd::new(&fd, PollFlags::OUT | PollFlags::IN)];
                    let ts = timeout.map(|t| rustix::time::Timespec {
                        tv_sec: t.as_secs() as i64,
                        tv_nsec: t.subsec_nanos() as i64,
                    });
                    match poll(&mut fds, ts.as_ref()) {
                        Ok(0) => {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "peer stopped reading (send timed out)",
                            ))
                        }
                        Ok(_) => {
                            let ready = fds[0].revents();
                            if ready.contains(PollFlags::IN) && !ready.contains(PollFlags::OUT) {
                                on_readable()?;
                            }
                        }
                        Err(Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            },
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A socket time-out as std's sockets take it: zero is refused (to the
/// kernel a zero `SO_RCVTIMEO` means no time-out at all; `socket2` passes
/// it through).
fn nonzero(t: Option<Duration>) -> io::Result<Option<Duration>> {
    if t == Some(Duration::ZERO) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot set a 0 duration timeout",
        ));
    }
    Ok(t)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn mid_message(kind: io::ErrorKind) -> RecvError {
    let what = match kind {
        io::ErrorKind::UnexpectedEof => "peer closed the connection in the middle of a message",
        _ => "peer stalled in the middle of a message",
    };
    RecvError::Io(io::Error::new(kind, what))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::{encode_tensor_section, layout_payload, DType, Kind, TensorDesc};

    fn pair() -> (StreamConn, StreamConn) {
        let (a, b) = UnixStream::pair().unwrap();
        (
            StreamConn::from_unix(a, "a".into()),
            StreamConn::from_unix(b, "b".into()),
        )
    }

    fn request(tensors: &[&[u8]]) -> (Header, Vec<u8>) {
        let (offs, plen) = layout_payload(tensors.iter().map(|t| t.len() as u64)).unwrap();
        let descs: Vec<TensorDesc> = tensors
            .iter()
            .zip(offs)
            .map(|(t, offset)| TensorDesc {
                dtype: DType::U8,
                shape: vec![t.len() as u64],
                offset,
                len: t.len() as u64,
            })
            .collect();
        let mut desc = Vec::new();
        encode_tensor_section(&descs, None, &mut desc);
        let mut h = Header::new(Kind::Request);
        h.tensor_count = descs.len() as u32;
        h.desc_len = desc.len() as u32;
        h.payload_len = plen;
        (h, desc)
    }

    #[test]
    fn message_round_trip_with_alignment_padding() {
        let (a, mut b) = pair();
        let t0 = vec![1u8; 3];
        let t1: Vec<u8> = (0..100u8).collect();
        let (h, desc) = request(&[&t0, &t1]);
        a.send(&h, &desc, &[&t0, &t1]).unwrap();
        let (got, gdesc) = b.recv_head(&Limits::default()).unwrap();
        assert_eq!(got, h);
        assert_eq!(gdesc, desc);
        let mut payload = vec![0u8; h.payload_len as usize];
        b.recv_payload(&mut payload).unwrap();
        assert_eq!(&payload[..3], &t0[..]);
        assert!(payload[3..64].iter().all(|&x| x == 0));
        assert_eq!(&payload[64..164], &t1[..]);
    }

    #[test]
    fn large_payload_goes_mostly_direct() {
        let (a, mut b) = pair();
        let big = vec![7u8; 1 << 20];
        let (h, desc) = request(&[&big]);
        let t = std::thread::spawn(move || {
            a.send(&h, &desc, &[&big]).unwrap();
            a
        });
        let (h, _) = b.recv_head(&Limits::default()).unwrap();
        let mut dest = vec![0u8; h.payload_len as usize];
        b.recv_payload(&mut dest).unwrap();
        t.join().unwrap();
        assert!(dest.iter().all(|&x| x == 7));
        let s = b.stats();
        assert!(s.staged_payload_bytes <= STAGING_LEN as u64);
        assert_eq!(s.staged_payload_bytes + s.direct_payload_bytes, 1 << 20);
    }

    #[test]
    fn limits_checked_before_reading_body() {
        let (a, mut b) = pair();
        let mut h = Header::new(Kind::Request);
        h.payload_len = u64::MAX;
        a.send(&Header::new(Kind::Ping), &[], &[]).unwrap();
        // Write a header claiming a huge payload, and nothing else.
        rustix::io::write(a.sock.fd(), &h.encode()).unwrap();
        assert!(b.recv_head(&Limits::default()).is_ok());
        match b.recv_head(&Limits::default()) {
            Err(RecvError::Wire(e)) => assert!(e.to_string().contains("payload length")),
            other => panic!("expected limit error, got {other:?}"),
        }
    }

    #[test]
    fn eof_between_and_inside_messages() {
        let (a, mut b) = pair();
        drop(a);
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::Closed)
        ));
        let (a, mut b) = pair();
        rustix::io::write(a.sock.fd(), &Header::new(Kind::Ping).encode()[..10]).unwrap();
        drop(a);
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::Io(_))
        ));
    }

    #[test]
    fn timeout_between_messages_is_benign() {
        let (a, mut b) = pair();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::TimedOut)
        ));
        a.send(&Header::new(Kind::Ping), &[], &[]).unwrap();
        assert_eq!(b.recv_head(&Limits::default()).unwrap().0.kind, Kind::Ping);
    }

    /// A pair whose reader `b` may spin for `budget` in slots of its own.
    fn spinning_pair(budget: Duration) -> (StreamConn, StreamConn, &'static SpinSlots) {
        let slots: &'static SpinSlots = Box::leak(Box::new(SpinSlots::with_cap(1)));
        let (a, mut b) = pair();
        b.set_spin_in(budget, slots);
        (a, b, slots)
    }

    /// `b` reads a Ping that `a` sends after 2 ms; returns `b`'s stats.
    fn ping_after_2ms(a: StreamConn, b: &mut StreamConn) -> StreamStats {
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            a.send(&Header::new(Kind::Ping), &[], &[]).unwrap();
            a
        });
        assert_eq!(b.recv_head(&Limits::default()).unwrap().0.kind, Kind::Ping);
        t.join().unwrap();
        b.stats()
    }

    #[test]
    fn a_spinning_read_catches_a_quick_message() {
        let (a, mut b, _) = spinning_pair(Duration::from_millis(500));
        let s = ping_after_2ms(a, &mut b);
        assert_eq!((s.spins_caught, s.spins_missed), (1, 0), "{s:?}");
    }

    #[test]
    fn a_reader_finding_every_slot_taken_blocks_without_spinning() {
        let (a, mut b, slots) = spinning_pair(Duration::from_millis(500));
        let held = slots.try_take();
        assert!(held.is_some());
        let s = ping_after_2ms(a, &mut b);
        assert_eq!((s.spins_caught, s.spins_missed, s.spins_crowded), (0, 0, 1));
    }

    #[test]
    fn slow_traffic_closes_the_spin_gate() {
        use crate::spin::SpinGate;
        let (a, mut b, _) = spinning_pair(Duration::from_micros(50));
        let (ack, acked) = std::sync::mpsc::channel::<()>();
        let n = 20;
        let t = std::thread::spawn(move || {
            for _ in 0..n {
                // Each message comes well after the reader's spin budget.
                std::thread::sleep(Duration::from_millis(10));
                a.send(&Header::new(Kind::Ping), &[], &[]).unwrap();
                acked.recv().unwrap();
            }
        });
        for _ in 0..n {
            assert_eq!(b.recv_head(&Limits::default()).unwrap().0.kind, Kind::Ping);
            ack.send(()).unwrap();
        }
        t.join().unwrap();
        let s = b.stats();
        // Without the gate every one of the 20 reads would spin and miss.
        // A reader descheduled for the whole gap mid-spin (a loaded test
        // machine) catches its message and reopens the gate once: allowed.
        let limit = u64::from(SpinGate::MISS_LIMIT) + 1;
        let spun = s.spins_missed + s.spins_caught;
        assert!(
            s.spins_missed >= 1 && spun <= limit * (1 + s.spins_caught),
            "{s:?}"
        );
        assert!(spun < n, "{s:?}");
    }

    #[test]
    fn skip_payload_keeps_sync() {
        let (a, mut b) = pair();
        let big = vec![9u8; 100_000];
        let (h, desc) = request(&[&big]);
        let t = std::thread::spawn(move || {
            a.send(&h, &desc, &[&big]).unwrap();
            a.send(&Header::new(Kind::Ping), &[], &[]).unwrap();
            a
        });
        let (h, _) = b.recv_head(&Limits::default()).unwrap();
        b.skip_payload(h.payload_len).unwrap();
        assert_eq!(b.recv_head(&Limits::default()).unwrap().0.kind, Kind::Ping);
        t.join().unwrap();
    }

    #[test]
    fn a_released_staging_buffer_comes_back_on_the_next_read() {
        let (a, mut b) = pair();
        a.send(&Header::new(Kind::Ping), &[], &[]).unwrap();
        assert_eq!(b.recv_head(&Limits::default()).unwrap().0.kind, Kind::Ping);
        b.release_staging();
        assert_eq!(b.staging.capacity(), 0);
        let big = vec![3u8; 100];
        let (h, desc) = request(&[&big]);
        a.send(&h, &desc, &[&big]).unwrap();
        let (got, _) = b.recv_head(&Limits::default()).unwrap();
        // Something buffered (the payload came with the header): kept.
        b.release_staging();
        assert!(b.has_buffered() && b.staging.len() == STAGING_LEN);
        let mut p = vec![0u8; got.payload_len as usize];
        b.recv_payload(&mut p).unwrap();
        assert_eq!(&p[..100], &big[..]);
    }

    #[test]
    fn parking_mode_keeps_a_partial_head_for_the_next_call() {
        let (a, mut b) = pair();
        b.set_parking(true);
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::WouldBlock)
        ));
        let big = vec![5u8; 10];
        let (h, desc) = request(&[&big]);
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(&desc);
        // Half the header, then the rest and the descriptors, then the payload.
        rustix::io::write(a.sock.fd(), &bytes[..20]).unwrap();
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::WouldBlock)
        ));
        rustix::io::write(a.sock.fd(), &bytes[20..HEADER_LEN + 4]).unwrap();
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::WouldBlock)
        ));
        rustix::io::write(a.sock.fd(), &bytes[HEADER_LEN + 4..]).unwrap();
        let (got, gdesc) = b.recv_head(&Limits::default()).unwrap();
        assert_eq!((got, gdesc), (h, desc));
        rustix::io::write(a.sock.fd(), &big).unwrap();
        let mut p = vec![0u8; got.payload_len as usize];
        b.recv_payload(&mut p).unwrap();
        assert_eq!(&p[..10], &big[..]);
        assert_eq!(b.stats().messages, 1);
    }

    #[test]
    fn mismatched_lengths_are_refused_before_sending() {
        let (a, _b) = pair();
        let mut h = Header::new(Kind::Request);
        h.payload_len = 5;
        assert!(a.send(&h, &[], &[b"abc"]).is_err());
        h.desc_len = 3;
        assert!(a.send(&h, &[], &[]).is_err());
    }

    /// A connected pair on the vsock code path (`Sock::Vsock`: socket2's
    /// socket, its reads, timeouts and shutdown) over a Unix socket pair:
    /// this machine has no vsock loopback. `a`'s peer is CID 3 port 1024.
    fn vsock_pair() -> (StreamConn, StreamConn) {
        let (a, b) = UnixStream::pair().unwrap();
        let sock = |s: UnixStream| socket2::Socket::from(std::os::fd::OwnedFd::from(s));
        (
            StreamConn::from_vsock_at(sock(a), VsockAddr { cid: 3, port: 1024 }),
            StreamConn::from_vsock_at(sock(b), VsockAddr { cid: 2, port: 5000 }),
        )
    }

    #[test]
    fn vsock_sockets_carry_the_same_framing() {
        let (a, mut b) = vsock_pair();
        assert!(matches!(a.sock, Sock::Vsock(..)));
        assert_eq!(a.peer(), "vsock 3:1024");
        assert_eq!(a.peer_id().unwrap(), PeerId::Vsock(3));
        assert_eq!(PeerId::Vsock(3).to_string(), "vsock CID 3");
        assert_eq!(a.vsock_peer(), Some(VsockAddr { cid: 3, port: 1024 }));
        assert!(a.credentials().unwrap().is_none(), "no SO_PEERCRED");
        // A message with padding, then a large one read mostly in place,
        // through the writer handle (the socket shared, not dup'ed).
        let t0 = vec![1u8; 3];
        let t1: Vec<u8> = (0..100u8).collect();
        let (h, desc) = request(&[&t0, &t1]);
        a.send(&h, &desc, &[&t0, &t1]).unwrap();
        let (got, gdesc) = b.recv_head(&Limits::default()).unwrap();
        assert_eq!((got, gdesc), (h, desc));
        let mut payload = vec![0u8; h.payload_len as usize];
        b.recv_payload(&mut payload).unwrap();
        assert_eq!(&payload[64..164], &t1[..]);
        let big = vec![7u8; 1 << 20];
        let w = a.writer().unwrap();
        let t = std::thread::spawn(move || {
            let (h, desc) = request(&[&big]);
            w.send(&h, &desc, &[&big]).unwrap();
        });
        let (h, _) = b.recv_head(&Limits::default()).unwrap();
        let mut dest = vec![0u8; h.payload_len as usize];
        b.recv_payload(&mut dest).unwrap();
        t.join().unwrap();
        assert!(dest.iter().all(|&x| x == 7));
        let s = b.stats();
        assert_eq!(
            s.staged_payload_bytes + s.direct_payload_bytes,
            1 << 20 | 164
        );
        // Answers the other way.
        b.send(&Header::new(Kind::Ping), &[], &[]).unwrap();
        let mut a = a;
        assert_eq!(a.recv_head(&Limits::default()).unwrap().0.kind, Kind::Ping);
    }

    #[test]
    fn vsock_sockets_poll_time_out_and_see_a_vanished_peer() {
        // A polling read catches a quick message.
        let slots: &'static SpinSlots = Box::leak(Box::new(SpinSlots::with_cap(1)));
        let (a, mut b) = vsock_pair();
        b.set_spin_in(Duration::from_millis(500), slots);
        let s = ping_after_2ms(a, &mut b);
        assert_eq!((s.spins_caught, s.spins_missed), (1, 0), "{s:?}");
        // A time-out between messages is benign; a zero one is refused
        // (the kernel would take it as none).
        let (a, mut b) = vsock_pair();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::TimedOut)
        ));
        assert!(b.set_read_timeout(Some(Duration::ZERO)).is_err());
        assert!(b.set_write_timeout(Some(Duration::ZERO)).is_err());
        // Parking: nothing there is WouldBlock, not a wait.
        b.set_parking(true);
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::WouldBlock)
        ));
        b.set_parking(false);
        // The peer vanishing mid-message is an error that says so; between
        // messages, a clean close.
        rustix::io::write(a.sock.fd(), &Header::new(Kind::Ping).encode()[..10]).unwrap();
        drop(a);
        let e = b.recv_head(&Limits::default()).unwrap_err().to_string();
        assert!(e.contains("closed the connection in the middle"), "{e}");
        let (a, mut b) = vsock_pair();
        drop(a);
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::Closed)
        ));
        // Shutdown wakes the other side with EOF; a send to a vanished
        // peer fails (EPIPE, no SIGPIPE).
        let (a, mut b) = vsock_pair();
        a.shutdown().unwrap();
        assert!(matches!(
            b.recv_head(&Limits::default()),
            Err(RecvError::Closed)
        ));
        drop(a);
        assert!(b.send(&Header::new(Kind::Ping), &[], &[]).is_err());
    }
}
