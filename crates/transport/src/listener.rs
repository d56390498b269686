//! [`Listener`]: accepts stream connections on a Unix, TCP or vsock endpoint.
//!
//! A Unix listener removes a stale socket file left by a dead agent (after
//! checking nobody answers on it) and removes its own file when dropped.
//! [`ListenerWaker`] lets another thread wake a blocked `accept` for
//! shutdown: by `shutdown(2)` on Unix and TCP listeners; a vsock listener
//! refuses `shutdown` (`ENOTCONN`, the accept sleeps on), so it waits in
//! `poll` on its socket and an eventfd the waker signals.

use crate::endpoint::Endpoint;
use crate::error::TransportError;
use crate::stream::StreamConn;
use crate::tls::TlsSock;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A listening socket.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use transport::{connect, Endpoint, Listener};
/// use wire::{Header, Kind, Limits};
/// let listener = Listener::bind(&Endpoint::parse("tcp://127.0.0.1:0")?)?;
/// let ep = listener.endpoint().clone(); // the port the kernel chose
/// let server = std::thread::spawn(move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
///     let mut conn = listener.accept()?;
///     let (h, _) = conn.recv_head(&Limits::default())?;
///     assert_eq!(h.kind, Kind::Ping);
///     let mut pong = Header::new(Kind::Pong);
///     pong.request_id = h.request_id;
///     conn.send(&pong, &[], &[])?;
///     Ok(())
/// });
/// let mut c = connect(&ep, Duration::from_secs(5))?;
/// let mut ping = Header::new(Kind::Ping);
/// ping.request_id = 1;
/// c.send(&ping, &[], &[])?;
/// let (h, _) = c.recv_head(&Limits::default())?;
/// assert_eq!((h.kind, h.request_id), (Kind::Pong, 1));
/// server.join().map_err(|_| "server panicked")?.map_err(|e| e.to_string())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Listener {
    kind: Kind,
    endpoint: Endpoint,
}

#[derive(Debug)]
enum Kind {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener, bool),
    /// TLS over TCP: each accepted socket starts a session of this config.
    Tls(TcpListener, bool, std::sync::Arc<rustls::ServerConfig>),
    /// `AF_VSOCK`, non-blocking, and the eventfd that wakes its `accept`.
    Vsock(socket2::Socket, Arc<OwnedFd>),
}

/// Wakes a thread blocked in [`Listener::accept`] (which then fails), for shutdown.
///
/// # Examples
///
/// ```
/// use transport::{Endpoint, Listener};
/// let dir = tempfile::tempdir()?;
/// let ep = Endpoint::Unix(dir.path().join("a.sock"));
/// let listener = Listener::bind(&ep)?;
/// let waker = listener.waker()?;
/// let acceptor = std::thread::spawn(move || listener.accept().map(|_| ()));
/// waker.wake(); // shutting down: the blocked accept fails
/// assert!(acceptor.join().map_err(|_| "panicked")?.is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ListenerWaker {
    wake: Wake,
}

#[derive(Debug)]
enum Wake {
    /// The listening socket (a duplicate): shut down.
    Shutdown(OwnedFd),
    /// A vsock listener's eventfd: signalled.
    Event(Arc<OwnedFd>),
}

impl ListenerWaker {
    /// Makes the blocked (and every future) `accept` return an error
    /// (`EINVAL`).
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::{Endpoint, Listener};
    /// let listener = Listener::bind(&Endpoint::parse("tcp://127.0.0.1:0")?)?;
    /// listener.waker()?.wake();
    /// assert!(listener.accept().is_err()); // and every later accept
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wake(&self) {
        match &self.wake {
            // shutdown(2) on a listening socket makes Linux fail accept() with EINVAL.
            Wake::Shutdown(fd) => {
                let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
            }
            // Never read: it stays readable, so every later accept fails too.
            Wake::Event(fd) => {
                let _ = rustix::io::write(&**fd, &1u64.to_ne_bytes());
            }
        }
    }
}

/// Removes a Unix socket file left by a server that is gone, so a new one
/// can bind there; refuses (`AddrInUse`) to take over a socket that still
/// accepts connections. Nothing to do when `path` does not exist.
///
/// # Examples
///
/// ```
/// use std::os::unix::net::UnixListener;
/// use transport::{remove_stale_unix_socket, Endpoint, Listener};
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("agent.sock");
/// drop(UnixListener::bind(&path)?); // what a crashed server leaves behind
/// remove_stale_unix_socket(&path)?;
/// assert!(!path.exists());
/// // A socket someone still accepts on is not taken over.
/// let _live = Listener::bind(&Endpoint::Unix(path.clone()))?;
/// assert!(remove_stale_unix_socket(&path).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn remove_stale_unix_socket(path: &std::path::Path) -> io::Result<()> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "another process is listening on this socket",
            ));
        }
        std::fs::remove_file(path)?;
    }
    Ok(())
}

impl Listener {
    /// Binds and listens on a Unix, TCP or vsock endpoint (`shm://` too:
    /// its control socket). A port in use, a CID that is not this
    /// machine's and the like are errors naming the endpoint and saying why.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::{Endpoint, Listener};
    /// let dir = tempfile::tempdir()?;
    /// let ep = Endpoint::Unix(dir.path().join("agent.sock"));
    /// let l = Listener::bind(&ep)?;
    /// assert_eq!(l.endpoint(), &ep);
    /// // The same address twice: an error naming it.
    /// let e = Listener::bind(&ep).unwrap_err();
    /// assert!(e.to_string().contains("agent.sock"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind(ep: &Endpoint) -> Result<Listener, TransportError> {
        let err = |source: io::Error| TransportError::Io {
            what: "listen on",
            endpoint: ep.to_string(),
            source,
        };
        match ep {
            Endpoint::Unix(path) => {
                remove_stale_unix_socket(path).map_err(err)?;
                // Created owner-only (umask 0177 for the bind) and opened up
                // by `set_access`: no moment when the umask's bits let
                // others connect. The umask is the process's: a file another
                // thread creates meanwhile comes out owner-only too, which
                // errs on the safe side.
                let umask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
                let bound = UnixListener::bind(path);
                rustix::process::umask(umask);
                let l = bound.map_err(err)?;
                Ok(Listener {
                    kind: Kind::Unix(l, path.clone()),
                    endpoint: ep.clone(),
                })
            }
            Endpoint::Tcp { addr, nodelay } => {
                let l = TcpListener::bind(addr.as_str()).map_err(err)?;
                let local = l.local_addr().map_err(err)?;
                Ok(Listener {
                    kind: Kind::Tcp(l, *nodelay),
                    endpoint: Endpoint::Tcp {
                        addr: local.to_string(),
                        nodelay: *nodelay,
                    },
                })
            }
            Endpoint::Tls { .. } => Err(TransportError::BadUri {
                uri: ep.to_string(),
                reason: "a tls:// listener needs the agent's certificate and key \
                         (serve --tls-cert FILE --tls-key FILE, TOML [tls])"
                    .into(),
            }),
            Endpoint::Inproc(_) => Err(TransportError::BadUri {
                uri: ep.to_string(),
                reason: "in-process endpoints are registered, not bound".into(),
            }),
            Endpoint::Vsock { cid, port } => {
                let (l, bound) = crate::vsock::listen(crate::vsock::VsockAddr {
                    cid: *cid,
                    port: *port,
                })
                .map_err(err)?;
                l.set_nonblocking(true).map_err(err)?;
                let wake = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
                    .map_err(|e| err(e.into()))?;
                Ok(Listener {
                    kind: Kind::Vsock(l, Arc::new(wake)),
                    endpoint: Endpoint::Vsock {
                        cid: bound.cid,
                        port: bound.port,
                    },
                })
            }
            Endpoint::Shm(name) => {
                // The shm control socket: a Unix listener at its private path.
                let path = crate::shm::control_path(name).map_err(err)?;
                let mut l = Listener::bind(&Endpoint::Unix(path))?;
                l.endpoint = ep.clone();
                Ok(l)
            }
        }
    }

    /// Binds and listens on a `tls://` endpoint, serving `config` (see
    /// [`crate::tls::server_config`]). The URI's client parameters (`ca=`,
    /// `cert=`, `key=`, `name=`) are refused: they are a client's.
    ///
    /// # Examples
    ///
    /// An agent's `tls://` listener and a client that trusts its CA; the
    /// handshake runs in the accepted connection's first read:
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::tls::server_config;
    /// use transport::{connect, Endpoint, Listener};
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
    /// let (files, client) = pki(dir.path())?; // a CA, a "localhost" and a "client.test" certificate
    /// let listener = Listener::bind_tls(&Endpoint::parse("tls://127.0.0.1:0")?, server_config(&files)?)?;
    /// let uri = format!(
    ///     "{}?ca={}&cert={}&key={}&name=localhost",
    ///     listener.endpoint(),
    ///     client.ca.as_ref().ok_or("made")?.display(),
    ///     client.cert.as_ref().ok_or("made")?.display(),
    ///     client.key.as_ref().ok_or("made")?.display(),
    /// );
    /// let agent = std::thread::spawn(move || -> Result<_, Box<dyn std::error::Error + Send + Sync>> {
    ///     let mut conn = listener.accept()?;
    ///     let (h, _) = conn.recv_head(&Limits::default())?;
    ///     Ok((h.kind, conn.tls_peer_names()))
    /// });
    /// let c = connect(&Endpoint::parse(&uri)?, Duration::from_secs(5))?;
    /// c.send(&Header::new(Kind::Ping), &[], &[])?;
    /// let (kind, names) = agent.join().map_err(|_| "agent panicked")?.map_err(|e| e.to_string())?;
    /// assert_eq!((kind, names), (Kind::Ping, Some(vec!["client.test".to_string()])));
    ///
    /// // A client's parameters on the listening side are refused:
    /// let e = Listener::bind_tls(&Endpoint::parse("tls://127.0.0.1:0?ca=/x.pem")?, server_config(&files)?);
    /// assert!(e.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind_tls(
        ep: &Endpoint,
        config: std::sync::Arc<rustls::ServerConfig>,
    ) -> Result<Listener, TransportError> {
        let Endpoint::Tls {
            addr,
            nodelay,
            client,
        } = ep
        else {
            return Listener::bind(ep);
        };
        if !client.is_empty() {
            return Err(TransportError::BadUri {
                uri: ep.to_string(),
                reason: "ca=, cert=, key= and name= are client settings; the agent's certificate \
                         comes from --tls-cert/--tls-key (TOML [tls])"
                    .into(),
            });
        }
        let err = |source: io::Error| TransportError::Io {
            what: "listen on",
            endpoint: ep.to_string(),
            source,
        };
        let l = TcpListener::bind(addr.as_str()).map_err(err)?;
        let local = l.local_addr().map_err(err)?;
        Ok(Listener {
            kind: Kind::Tls(l, *nodelay, config),
            endpoint: Endpoint::Tls {
                addr: local.to_string(),
                nodelay: *nodelay,
                client: Default::default(),
            },
        })
    }

    /// Sets who may connect to a Unix (or shm control) listener: its
    /// socket file's permission bits and, when given, its group. Called
    /// right after [`bind`](Self::bind), before the agent accepts anything.
    /// A TCP listener has no file: nothing to do.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::fs::PermissionsExt;
    /// use transport::{Endpoint, Listener};
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("agent.sock");
    /// let l = Listener::bind(&Endpoint::Unix(path.clone()))?;
    /// l.set_access(0o660, None)?; // the owner and its group may connect
    /// assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o777, 0o660);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_access(&self, mode: u32, group: Option<u32>) -> io::Result<()> {
        let Kind::Unix(_, path) = &self.kind else {
            return Ok(());
        };
        if let Some(g) = group {
            rustix::fs::chown(path, None, Some(rustix::fs::Gid::from_raw(g)))?;
        }
        rustix::fs::chmod(path, rustix::fs::Mode::from_raw_mode(mode))?;
        Ok(())
    }

    /// Waits for the next connection on a Unix (or shm control) listener
    /// and returns the bare socket (shm sessions bootstrap over it).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::os::unix::net::UnixStream;
    /// use transport::{Credentials, Endpoint, Listener};
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("control.sock");
    /// let l = Listener::bind(&Endpoint::Unix(path.clone()))?;
    /// let _client = UnixStream::connect(&path)?;
    /// let sock = l.accept_unix()?; // the bare socket, e.g. to pass an arena over
    /// assert_eq!(Credentials::of_unix(&sock)?.pid, std::process::id() as i32);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn accept_unix(&self) -> io::Result<UnixStream> {
        match &self.kind {
            Kind::Unix(l, _) => Ok(l.accept()?.0),
            Kind::Tcp(..) | Kind::Tls(..) | Kind::Vsock(..) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a TCP or vsock listener has no Unix streams",
            )),
        }
    }

    /// The endpoint actually listened on (a TCP port 0 or a vsock port -1
    /// is resolved).
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::{Endpoint, Listener};
    /// let l = Listener::bind(&Endpoint::parse("tcp://127.0.0.1:0")?)?;
    /// assert!(!l.endpoint().to_string().ends_with(":0"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Waits for the next connection.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::{connect, Endpoint, Listener, PeerId};
    /// let dir = tempfile::tempdir()?;
    /// let ep = Endpoint::Unix(dir.path().join("agent.sock"));
    /// let l = Listener::bind(&ep)?;
    /// let _c = connect(&ep, Duration::from_secs(1))?;
    /// let conn = l.accept()?;
    /// assert!(matches!(conn.peer_id()?, PeerId::Uid(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn accept(&self) -> io::Result<StreamConn> {
        match &self.kind {
            Kind::Unix(l, path) => {
                let (s, _) = l.accept()?;
                Ok(StreamConn::from_unix(s, format!("unix:{}", path.display())))
            }
            Kind::Tcp(l, nodelay) => {
                let (s, _) = l.accept()?;
                StreamConn::from_tcp(s, *nodelay)
            }
            Kind::Tls(l, nodelay, config) => {
                let (s, _) = l.accept()?;
                StreamConn::from_tls(TlsSock::server(s, config.clone())?, *nodelay)
            }
            Kind::Vsock(l, wake) => StreamConn::from_vsock(accept_vsock(l, wake)?),
        }
    }

    /// A handle that can wake a blocked `accept` from another thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::{Endpoint, Listener};
    /// let l = Listener::bind(&Endpoint::parse("tcp://127.0.0.1:0")?)?;
    /// let waker = l.waker()?; // Send: give it to whoever stops the server
    /// std::thread::spawn(move || waker.wake()).join().map_err(|_| "panicked")?;
    /// assert!(l.accept().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn waker(&self) -> io::Result<ListenerWaker> {
        let fd = match &self.kind {
            Kind::Unix(l, _) => l.as_fd().try_clone_to_owned()?,
            Kind::Tcp(l, _) | Kind::Tls(l, ..) => l.as_fd().try_clone_to_owned()?,
            Kind::Vsock(_, wake) => {
                return Ok(ListenerWaker {
                    wake: Wake::Event(wake.clone()),
                })
            }
        };
        Ok(ListenerWaker {
            wake: Wake::Shutdown(fd),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Kind::Unix(_, path) = &self.kind {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Waits for a connection on the (non-blocking) vsock listener `l` or for
/// `wake` to be signalled (then fails with `EINVAL`, as a shut-down Unix or
/// TCP listener does). The accepted socket is blocking.
fn accept_vsock(l: &socket2::Socket, wake: &OwnedFd) -> io::Result<socket2::Socket> {
    use rustix::event::{poll, PollFd, PollFlags};
    loop {
        let mut fds = [
            PollFd::new(l, PollFlags::IN),
            PollFd::new(wake, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if !fds[1].revents().is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if fds[0].revents().is_empty() {
            continue;
        }
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            // Another thread took it, or it went away before we got to it.
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.raw_os_error() == Some(libc::ECONNABORTED) =>
            {
                continue
            }
            Err(e) => return Err(e),
        }
    }
}

/// Connects to a Unix, TCP (TLS) or vsock endpoint, giving up after `timeout`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use transport::{connect, Endpoint, Listener, TransportError};
/// let l = Listener::bind(&Endpoint::parse("tcp://127.0.0.1:0")?)?;
/// let conn = connect(l.endpoint(), Duration::from_secs(1))?;
/// assert!(conn.peer().contains("127.0.0.1"));
/// // Nobody listening: an error naming the endpoint.
/// let dir = tempfile::tempdir()?;
/// let none = Endpoint::Unix(dir.path().join("nobody.sock"));
/// assert!(matches!(connect(&none, Duration::from_secs(1)), Err(TransportError::Io { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn connect(ep: &Endpoint, timeout: Duration) -> Result<StreamConn, TransportError> {
    let err = |source: io::Error| TransportError::Io {
        what: "connect to",
        endpoint: ep.to_string(),
        source,
    };
    match ep {
        Endpoint::Unix(path) => {
            let s = UnixStream::connect(path).map_err(err)?;
            Ok(StreamConn::from_unix(s, ep.to_string()))
        }
        Endpoint::Tcp { addr, nodelay } => {
            StreamConn::from_tcp(connect_tcp(addr, timeout).map_err(err)?, *nodelay).map_err(err)
        }
        Endpoint::Tls {
            addr,
            nodelay,
            client,
        } => {
            let config = crate::tls::client_config(client).map_err(|e| err(io::Error::other(e)))?;
            let name = crate::tls::server_name(addr, client.name.as_deref()).map_err(err)?;
            let tcp = connect_tcp(addr, timeout).map_err(err)?;
            let tls = TlsSock::client(tcp, config, name, timeout).map_err(err)?;
            StreamConn::from_tls(tls, *nodelay).map_err(err)
        }
        Endpoint::Vsock { cid, port } => {
            let addr = crate::vsock::VsockAddr {
                cid: *cid,
                port: *port,
            };
            let s = crate::vsock::connect(addr, timeout).map_err(err)?;
            StreamConn::from_vsock(s).map_err(err)
        }
        Endpoint::Inproc(_) => Err(TransportError::BadUri {
            uri: ep.to_string(),
            reason: "in-process endpoints are looked up with transport::inproc".into(),
        }),
        Endpoint::Shm(_) => Err(TransportError::BadUri {
            uri: ep.to_string(),
            reason: "shm sessions are opened with transport::shm::ShmChannel::connect".into(),
        }),
    }
}

/// Connects to the first address of `addr` that answers within `timeout`.
fn connect_tcp(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "host resolved to no address");
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vsock::CID_ANY;
    use std::time::Instant;

    /// A vsock listener on a port the kernel picks; `None` (the test skips)
    /// where the kernel has no vsock at all.
    fn vsock_listener() -> Option<Listener> {
        match Listener::bind(&Endpoint::Vsock {
            cid: CID_ANY,
            port: crate::vsock::PORT_ANY,
        }) {
            Ok(l) => Some(l),
            Err(e) if e.to_string().contains("no vsock support") => {
                eprintln!("skipped: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_vsock_listener_binds_refuses_a_second_and_wakes_for_shutdown() {
        let Some(l) = vsock_listener() else { return };
        let Endpoint::Vsock { cid, port } = *l.endpoint() else {
            panic!("{:?}", l.endpoint())
        };
        assert_eq!(cid, CID_ANY);
        assert_ne!(port, crate::vsock::PORT_ANY, "the port is resolved");
        assert_eq!(l.endpoint().to_string(), format!("vsock://-1:{port}"));
        // A second listener on the port is refused, naming it.
        let ep = Endpoint::Vsock { cid: CID_ANY, port };
        let e = Listener::bind(&ep).unwrap_err().to_string();
        assert!(
            e.contains(&format!("listen on vsock://-1:{port}"))
                && e.contains(&format!("vsock port {port} is in use")),
            "{e}"
        );
        // A CID that is not this machine's.
        let e = Listener::bind(&Endpoint::Vsock {
            cid: 77,
            port: 5000,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("CID 77 is not this machine's"), "{e}");
        // accept sleeps until the waker: then it, and every later one, fails EINVAL.
        let waker = l.waker().unwrap();
        let t = std::thread::spawn(move || {
            let e = l.accept().map(|_| ()).unwrap_err();
            let again = l.accept().map(|_| ()).unwrap_err();
            (e.raw_os_error(), again.raw_os_error())
        });
        std::thread::sleep(Duration::from_millis(50));
        waker.wake();
        assert_eq!(t.join().unwrap(), (Some(22), Some(22)));
    }

    #[test]
    fn vsock_clients_get_clear_and_prompt_errors() {
        if vsock_listener().is_none() {
            return;
        }
        // Whatever this machine routes, a client names one CID and port;
        // CIDs that do not answer fail within the time-out given.
        let timeout = Duration::from_millis(300);
        for ep in ["vsock://-1:5000", "vsock://2:-1"] {
            let e = connect(&Endpoint::parse(ep).unwrap(), timeout)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("for listeners"), "{e}");
        }
        for cid in [1u32, 2, 4_000_000] {
            let ep = Endpoint::Vsock { cid, port: 1 };
            let t0 = Instant::now();
            let Err(e) = connect(&ep, timeout) else {
                eprintln!("vsock://{cid}:1 answered: nothing to check");
                continue;
            };
            let took = t0.elapsed();
            let e = e.to_string();
            assert!(took < Duration::from_secs(1), "{e} after {took:?}");
            assert!(
                e.starts_with(&format!("connect to vsock://{cid}:1: ")) && e.contains("CID"),
                "{e}"
            );
            eprintln!("vsock://{cid}:1 → {e} ({took:?})");
        }
    }
}
