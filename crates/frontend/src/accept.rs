//! [`DoorIncoming`]: how every KServe front door (http, https, grpc,
//! grpcs) accepts its connections, under the same rules as the agent's own
//! listeners.
//!
//! Each accepted TCP connection is admitted to the agent's connection
//! table ([`AgentCore::conns`]) before anything else: it counts against
//! `[connections] max` and `max_per_peer` (a peer is a source address, as
//! on `tcp://`) for as long as it is open, and past either limit it is
//! closed at once, counted and logged once per peer per burst by the table
//! (`server::conns`). It then has the agent's handshake deadline
//! (`handshake_timeout_ms`, 3 s by default) to send its first byte and, on
//! a TLS door, to finish the TLS handshake; a connection that has not is
//! closed (and counted as a handshake timeout). Only then is it handed to
//! the door's server (`serve_http` or tonic). A gRPC door's connection also
//! carries a head deadline: an HTTP/2 request head that has begun must be
//! whole within the agent's `stall_timeout`, or reading it fails and tonic
//! drops the connection ([`crate::h2_heads`]; hyper gives the HTTP door's
//! heads the same deadline itself). The waiting happens in a task per
//! connection, never in the accept loop, so a client that connects and
//! says nothing holds up nobody but itself.
//!
//! The table entry holds a second handle on the connection's socket
//! ([`Conn::Tcp`], as a shared-memory session's entry does), so the
//! agent's reaper and its shutdown close a door's connection the way they
//! close a native one: the socket is shut down and the door's server sees
//! it end. A door's connection therefore costs two file descriptors.

use crate::h2_heads::HeadWatch;
use crate::tls::{open_tls, PlainText};
use server::conns::{Conn, Phase, Slot};
use server::dispatch::AgentCore;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpConnectInfo};
use transport::PeerId;

/// A door's listener: connections admitted and past their first byte (and
/// TLS handshake) come out of it, one by one ([`DoorIncoming::next`], for
/// [`serve_http`](crate::serve_http)) or as tonic's incoming stream
/// (module docs).
///
/// Dropping it stops the accepting (and closes the socket) once the accept
/// task notices, and drops every connection that gets ready afterwards.
pub(crate) struct DoorIncoming {
    rx: mpsc::Receiver<(DoorConn, SocketAddr)>,
}

impl DoorIncoming {
    /// Starts accepting on `listener` for `core`'s agent, in clear text or
    /// over TLS with `tls` (and what to do with a client that does not
    /// start with a TLS handshake). Must be called on a tokio runtime (it
    /// spawns the accept task).
    /// `h2_heads`: an HTTP/2 door's (gRPC), whose request heads get the
    /// agent's `stall_timeout` here ([`crate::h2_heads`]; hyper gives an
    /// HTTP/1.1 door's its own).
    pub(crate) fn start(
        listener: TcpListener,
        core: &AgentCore,
        tls: Option<(Arc<ServerConfig>, PlainText)>,
        h2_heads: bool,
    ) -> DoorIncoming {
        let (tx, rx) = mpsc::channel(64);
        let rules = Rules {
            conns: core.conns().clone(),
            deadline: core.handshake_timeout(),
            tls: tls.map(|(config, plain)| (TlsAcceptor::from(config), plain)),
            head_limit: h2_heads.then(|| core.stall_timeout()),
        };
        tokio::spawn(accept_loop(listener, rules, tx));
        DoorIncoming { rx }
    }

    /// The ready connections as a stream, for tonic's
    /// `serve_with_incoming`.
    pub(crate) fn into_stream(self) -> impl Stream<Item = Result<DoorConn, Infallible>> {
        ReceiverStream::new(self.rx).map(|(conn, _)| Ok(conn))
    }
}

impl DoorIncoming {
    /// The next connection ready for the door's server, and its peer.
    pub(crate) async fn next(&mut self) -> (DoorConn, SocketAddr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept task is gone (it only ends when this is dropped).
            None => std::future::pending().await,
        }
    }
}

/// What the accept loop applies to each connection.
struct Rules {
    conns: Arc<server::conns::ConnTable>,
    deadline: Duration,
    tls: Option<(TlsAcceptor, PlainText)>,
    /// How long an HTTP/2 request head may take (gRPC doors only).
    head_limit: Option<Duration>,
}

/// Accepts connections until the receiving side is dropped; admits each
/// and waits for it to get ready in a task of its own.
async fn accept_loop(
    listener: TcpListener,
    rules: Rules,
    tx: mpsc::Sender<(DoorConn, SocketAddr)>,
) {
    let rules = Arc::new(rules);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            () = tx.closed() => return,
        };
        let (tcp, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // As axum and hyper do: a connection that went away is
                // nothing; anything else (out of file descriptors) waits.
                if !matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                ) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        // The table's handle on the socket, to shut it down.
        let Ok(handle) = tcp.as_fd().try_clone_to_owned() else {
            continue;
        };
        // Past a limit the connection is closed here, before it costs a
        // task; the table counts and logs the refusal.
        let Ok(slot) = rules.conns.admit(
            Conn::Tcp(Arc::new(std::net::TcpStream::from(handle))),
            PeerId::Addr(peer.ip()),
        ) else {
            continue;
        };
        let rules = rules.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let Some(conn) = get_ready(tcp, slot, &rules).await else {
                return;
            };
            // Fails only when the door is closing: the connection drops.
            let _ = tx.send((conn, peer)).await;
        });
    }
}

/// Waits, within the handshake deadline, for `tcp`'s first byte and, on a
/// TLS door, its TLS handshake; `None` when it does not come (the
/// connection is closed as it drops, and `slot` given back).
async fn get_ready(tcp: TcpStream, slot: Slot, rules: &Rules) -> Option<DoorConn> {
    let ready = std::pin::pin!(async {
        let mut first = [0u8; 1];
        if tcp.peek(&mut first).await.ok()? == 0 {
            return None;
        }
        match &rules.tls {
            None => Some(DoorIo::Plain(tcp)),
            Some((acceptor, plain)) => open_tls(tcp, first[0], acceptor, *plain)
                .await
                .map(|s| DoorIo::Tls(Box::new(s))),
        }
    });
    // By reference, so that on a timeout the connection is still open
    // while it is counted (and closed just after).
    match tokio::time::timeout(rules.deadline, ready).await {
        Ok(Some(io)) => {
            // From now on the door's server owns its time; the reaper
            // leaves it alone.
            slot.set(Phase::Busy);
            Some(DoorConn {
                io,
                heads: rules.head_limit.map(|limit| HeadDeadline {
                    watch: HeadWatch::default(),
                    limit,
                    timer: None,
                }),
                _slot: slot,
            })
        }
        Ok(None) => None,
        Err(_) => {
            // The table's reaper closes it at the same deadline; whichever
            // sees it first counts it.
            slot.handshake_timed_out();
            None
        }
    }
}

/// A ready connection of a door, and its place in the agent's connection
/// table (given back when it drops).
pub(crate) struct DoorConn {
    io: DoorIo,
    /// On an HTTP/2 door: the deadline of the request head being read.
    heads: Option<HeadDeadline>,
    _slot: Slot,
}

/// An HTTP/2 connection's head deadline: a head that has begun
/// ([`HeadWatch::head_pending`]) must be whole within `limit`, or reading
/// fails and the door's server drops the connection.
struct HeadDeadline {
    watch: HeadWatch,
    limit: Duration,
    /// Running while a head is pending.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// A door's connection in clear text or over TLS.
enum DoorIo {
    /// A `grpc://` or `http://` door's.
    Plain(TcpStream),
    /// A `grpcs://` or `https://` door's, handshake done.
    Tls(Box<TlsStream<TcpStream>>),
}

impl DoorIo {
    fn tcp(&self) -> &TcpStream {
        match self {
            DoorIo::Plain(s) => s,
            DoorIo::Tls(s) => s.get_ref().0,
        }
    }
}

/// Forwards a poll to whichever stream the connection is.
macro_rules! either {
    ($self:ident, $s:ident => $e:expr) => {
        match &mut $self.get_mut().io {
            DoorIo::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            DoorIo::Tls($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl AsyncRead for DoorConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(t) = this.heads.as_mut().and_then(|h| h.timer.as_mut()) {
            if t.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "an HTTP/2 request head took longer than the agent's stall_timeout",
                )));
            }
        }
        let before = buf.filled().len();
        let read = match &mut this.io {
            DoorIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            DoorIo::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        };
        if let (Poll::Ready(Ok(())), Some(h)) = (&read, this.heads.as_mut()) {
            h.watch.feed(&buf.filled()[before..]);
            match (h.watch.head_pending(), h.timer.is_some()) {
                (true, false) => {
                    let mut t = Box::pin(tokio::time::sleep(h.limit));
                    // Registers this task's waker: the next read polls it again.
                    let _ = t.as_mut().poll(cx);
                    h.timer = Some(t);
                }
                (false, true) => h.timer = None,
                _ => {}
            }
        }
        read
    }
}

impl AsyncWrite for DoorConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        either!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        either!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            DoorIo::Plain(s) => s.is_write_vectored(),
            DoorIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        either!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        either!(self, s => s.poll_shutdown(cx))
    }
}

impl Connected for DoorConn {
    // tonic's own TCP incoming's: a call sees the peer address either way.
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        let tcp = self.io.tcp();
        TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: tcp.peer_addr().ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
    use crate::proto::ServerLiveRequest;
    use crate::test_support::http_status;
    use crate::{DoorsConfig, FrontDoors};
    use server::{Agent, AgentConfig, ModelRegistry};
    use std::io::{ErrorKind, Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    /// An agent serving identity with these connection settings, and its
    /// gRPC and HTTP doors on loopback.
    fn agent(handshake: Duration, per_peer: usize) -> (Agent, FrontDoors) {
        let cfg = AgentConfig {
            handshake_timeout: handshake,
            max_connections_per_peer: per_peer,
            ..AgentConfig::default()
        };
        let doors = DoorsConfig {
            grpc: vec!["grpc://127.0.0.1:0".into()],
            http: vec!["http://127.0.0.1:0".into()],
            ..DoorsConfig::default()
        };
        agent_with(cfg, doors)
    }

    /// An agent serving identity with `cfg`, and `doors` over it.
    fn agent_with(cfg: AgentConfig, doors: DoorsConfig) -> (Agent, FrontDoors) {
        let agent = Agent::with_registry(cfg, ModelRegistry::with_identity()).expect("agent");
        let doors = FrontDoors::start(agent.core().clone(), doors).expect("doors");
        (agent, doors)
    }

    /// An agent serving identity whose `stall_timeout` is `stall`, and
    /// `doors` over it.
    fn stalling_agent(stall: Duration, doors: DoorsConfig) -> (Agent, FrontDoors) {
        let cfg = AgentConfig {
            stall_timeout: stall,
            ..AgentConfig::default()
        };
        agent_with(cfg, doors)
    }

    fn addr(uri: &str) -> &str {
        uri.split_once("://").map_or(uri, |(_, a)| a)
    }

    /// Waits up to `limit` for the agent to close `s`: true if it did.
    fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
        s.set_read_timeout(Some(limit)).expect("timeout");
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(n) => panic!("the door answered a silent client with {n} bytes"),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
            Err(_) => true, // reset
        }
    }

    /// `ServerLive` over a fresh gRPC connection to `uri`.
    fn grpc_live(uri: &str) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut c = GrpcInferenceServiceClient::connect(format!("http://{}", addr(uri)))
                .await
                .expect("connect");
            c.server_live(ServerLiveRequest {})
                .await
                .expect("ServerLive")
                .into_inner()
                .live
        })
    }

    /// A connection from `source` (another loopback address: another
    /// peer) to `uri`.
    fn connect_from(source: &str, uri: &str) -> TcpStream {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let s = tokio::net::TcpSocket::new_v4().expect("socket");
            s.bind(format!("{source}:0").parse().expect("addr"))
                .expect("bind");
            let c = s
                .connect(addr(uri).parse().expect("addr"))
                .await
                .expect("connect");
            let c = c.into_std().expect("std");
            // tokio's streams are non-blocking; the tests read blocking.
            c.set_nonblocking(false).expect("blocking");
            c
        })
    }

    #[test]
    fn a_silent_connection_is_closed_at_the_handshake_deadline() {
        let deadline = Duration::from_millis(300);
        let (agent, doors) = agent(deadline, 1024);
        for uri in doors.uris() {
            let mut silent = TcpStream::connect(addr(uri)).expect("connect");
            let t = Instant::now();
            assert!(
                closed_within(&mut silent, Duration::from_secs(5)),
                "{uri} kept a silent connection open"
            );
            let took = t.elapsed();
            assert!(
                took >= deadline - Duration::from_millis(50) && took < Duration::from_secs(2),
                "{uri}: closed after {took:?}"
            );
        }
        assert!(agent.stats().handshake_timeouts >= 2, "{:?}", agent.stats());
        doors.shutdown_with(agent, Duration::from_secs(1));
    }

    /// A client that starts a request and trickles its head byte by byte
    /// is closed once the head has taken `stall_timeout`; an idle
    /// keep-alive connection too; others are served meanwhile.
    #[test]
    fn a_trickled_request_head_is_cut_at_the_stall_timeout() {
        let stall = Duration::from_millis(600);
        let (agent, doors) = stalling_agent(
            stall,
            DoorsConfig {
                http: vec!["http://127.0.0.1:0".into()],
                metrics: Some("http://127.0.0.1:0".into()),
                ..DoorsConfig::default()
            },
        );
        let metrics = doors.metrics_uri().expect("the metrics listener");
        for uri in doors.uris().into_iter().chain([metrics]) {
            let mut slow = TcpStream::connect(addr(uri)).expect("connect");
            slow.set_read_timeout(Some(Duration::from_millis(100)))
                .expect("timeout");
            let t = Instant::now();
            let head = format!("GET /metrics HTTP/1.1\r\nHost: {}\r\nX-Slow: ", addr(uri));
            let mut sent = 0;
            let mut b = [0u8; 512];
            // One byte every 100 ms, for at most 5 s: an unbounded door
            // would keep the connection all that time.
            let cut = loop {
                if t.elapsed() > Duration::from_secs(5) {
                    break None;
                }
                let byte = head.as_bytes().get(sent).copied().unwrap_or(b'x');
                if slow.write_all(&[byte]).is_err() {
                    break Some(t.elapsed());
                }
                sent += 1;
                match slow.read(&mut b) {
                    Ok(0) => break Some(t.elapsed()),
                    Ok(n) => {
                        // hyper may say 408 before it closes.
                        let said = String::from_utf8_lossy(&b[..n]).to_string();
                        assert!(said.starts_with("HTTP/1.1 408"), "{uri}: {said}");
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => break Some(t.elapsed()),
                }
            };
            let cut = cut.unwrap_or_else(|| panic!("{uri} kept a trickled head for 5 s"));
            assert!(
                cut >= stall - Duration::from_millis(100) && cut < Duration::from_secs(3),
                "{uri}: cut after {cut:?}"
            );
            // A well-behaved request on a fresh connection is served, and
            // that connection, left idle, is closed after the same time.
            let mut ok = TcpStream::connect(addr(uri)).expect("connect");
            ok.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            write!(ok, "GET /metrics HTTP/1.1\r\nHost: {}\r\n\r\n", addr(uri)).expect("write");
            let n = ok.read(&mut b).expect("read");
            let said = String::from_utf8_lossy(&b[..n]).to_string();
            assert!(said.starts_with("HTTP/1.1 "), "{uri}: {said}");
            let mut rest = Vec::new();
            let idle = Instant::now();
            let _ = ok.read_to_end(&mut rest);
            assert!(
                idle.elapsed() < Duration::from_secs(4),
                "{uri}: an idle keep-alive connection stayed open {:?}",
                idle.elapsed()
            );
        }
        doors.shutdown_with(agent, Duration::from_secs(1));
    }

    /// Over the gRPC door (HTTP/2): a client that announces a HEADERS
    /// frame and trickles its bytes is closed once the head has taken
    /// `stall_timeout` (h2 itself bounds the number of CONTINUATION
    /// frames, not the time one frame takes); a client whose head is
    /// whole, then idle, keeps its connection; others are served.
    #[test]
    fn a_trickled_http2_head_is_cut_at_the_stall_timeout() {
        let stall = Duration::from_millis(600);
        let (agent, doors) = stalling_agent(
            stall,
            DoorsConfig {
                grpc: vec!["grpc://127.0.0.1:0".into()],
                ..DoorsConfig::default()
            },
        );
        let uri = doors.uris()[0].to_string();
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let settings = [0u8, 0, 0, 0x4, 0, 0, 0, 0, 0];
        // HEADERS on stream 1, one byte of block (":method GET"), no flags.
        let headers = [0u8, 0, 1, 0x1, 0, 0, 0, 0, 1, 0x82];
        // A HEADERS frame on stream 3 announcing 1000 bytes of block.
        let announced = [0u8, 0x3, 0xe8, 0x1, 0x4, 0, 0, 0, 3];

        let mut slow = TcpStream::connect(addr(&uri)).expect("connect");
        slow.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        slow.write_all(preface).expect("preface");
        slow.write_all(&settings).expect("settings");
        slow.write_all(&announced).expect("headers");
        let t = Instant::now();
        let mut b = [0u8; 512];
        let mut sent = 0;
        // One byte every 100 ms, for at most 5 s.
        let cut = loop {
            if t.elapsed() > Duration::from_secs(5) {
                break None;
            }
            // ":method GET", again and again: never the whole block.
            if slow.write_all(&[0x82]).is_err() {
                break Some(t.elapsed());
            }
            sent += 1;
            match slow.read(&mut b) {
                Ok(0) => break Some(t.elapsed()),
                Ok(_) => {} // the server's SETTINGS, its ACK, a GOAWAY
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break Some(t.elapsed()),
            }
            if sent == 3 {
                assert!(grpc_live(&uri), "others are served meanwhile");
            }
        };
        let cut = cut.unwrap_or_else(|| panic!("{uri} kept a trickled HTTP/2 head for 5 s"));
        assert!(
            cut >= stall - Duration::from_millis(100) && cut < Duration::from_secs(3),
            "{uri}: cut after {cut:?}"
        );

        // A whole head, then silence: the connection stays (gRPC clients
        // keep theirs open between calls).
        let mut idle = TcpStream::connect(addr(&uri)).expect("connect");
        idle.write_all(preface).expect("preface");
        idle.write_all(&settings).expect("settings");
        let mut whole = headers;
        whole[4] = 0x4; // END_HEADERS
        idle.write_all(&whole).expect("headers");
        idle.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let t = Instant::now();
        while t.elapsed() < stall * 2 {
            match idle.read(&mut b) {
                Ok(0) => panic!("{uri}: closed a connection whose head was whole"),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("{uri}: {e}"),
            }
        }
        doors.shutdown_with(agent, Duration::from_secs(1));
    }

    #[test]
    fn a_busy_keep_alive_connection_outlives_the_deadline() {
        let (agent, doors) = agent(Duration::from_millis(200), 1024);
        let http = doors.uris()[1].to_string();
        let mut s = TcpStream::connect(addr(&http)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        for _ in 0..2 {
            write!(
                s,
                "GET /v2/health/live HTTP/1.1\r\nHost: {}\r\n\r\n",
                addr(&http)
            )
            .expect("write");
            let mut b = [0u8; 512];
            let n = s.read(&mut b).expect("read");
            let head = String::from_utf8_lossy(&b[..n]);
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            // Past the handshake deadline: the connection is no longer in
            // its handshake.
            std::thread::sleep(Duration::from_millis(500));
        }
        doors.shutdown_with(agent, Duration::from_secs(1));
    }

    #[test]
    fn connections_past_the_per_peer_limit_are_closed_while_others_get_in() {
        let per_peer = 3;
        let (agent, doors) = agent(Duration::from_secs(30), per_peer);
        let (grpc, http) = (doors.uris()[0].to_string(), doors.uris()[1].to_string());
        // A flood of silent connections from 127.0.0.2, to both doors.
        let mut held = Vec::new();
        let mut refused = 0;
        for i in 0..2 * per_peer {
            let uri = if i % 2 == 0 { &grpc } else { &http };
            let mut s = connect_from("127.0.0.2", uri);
            if closed_within(&mut s, Duration::from_millis(300)) {
                refused += 1;
            } else {
                held.push(s);
            }
        }
        assert_eq!(held.len(), per_peer, "admitted up to the limit");
        assert_eq!(refused, per_peer, "closed past it");
        assert_eq!(agent.stats().refused_per_peer, per_peer as u64);
        assert_eq!(agent.stats().connections, per_peer);
        // Another peer (127.0.0.1) is served on both doors meanwhile.
        assert_eq!(http_status(&http, "/v2/health/ready"), 200);
        assert!(grpc_live(&grpc));
        // The flood's connections are given back as they close.
        drop(held);
        let t = Instant::now();
        while agent.stats().connections > 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(agent.stats().connections, 0, "{:?}", agent.stats());
        let mut again = connect_from("127.0.0.2", &http);
        again
            .write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut reply = String::new();
        let _ = again.read_to_string(&mut reply);
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        doors.shutdown_with(agent, Duration::from_secs(1));
    }
}
