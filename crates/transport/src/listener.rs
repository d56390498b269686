//! [`Listener`]: accepts stream connections on a Unix or TCP endpoint.
//!
//! A Unix listener removes a stale socket file left by a dead agent (after
//! checking nobody answers on it) and removes its own file when dropped.
//! [`ListenerWaker`] lets another thread wake a blocked `accept` for shutdown.

use crate::endpoint::Endpoint;
use crate::error::TransportError;
use crate::stream::StreamConn;
use crate::tls::TlsSock;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

/// A listening socket.
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
}

/// Wakes a thread blocked in [`Listener::accept`] (which then fails), for shutdown.
#[derive(Debug)]
pub struct ListenerWaker {
    fd: std::os::fd::OwnedFd,
}

impl ListenerWaker {
    /// Makes the blocked (and every future) `accept` return an error.
    pub fn wake(&self) {
        // shutdown(2) on a listening socket makes Linux fail accept() with EINVAL.
        let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both);
    }
}

/// Removes a Unix socket file left by a server that is gone, so a new one
/// can bind there; refuses (`AddrInUse`) to take over a socket that still
/// accepts connections. Nothing to do when `path` does not exist.
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
    /// Binds and listens on a Unix or TCP endpoint.
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
    pub fn accept_unix(&self) -> io::Result<UnixStream> {
        match &self.kind {
            Kind::Unix(l, _) => Ok(l.accept()?.0),
            Kind::Tcp(..) | Kind::Tls(..) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a TCP listener has no Unix streams",
            )),
        }
    }

    /// The endpoint actually listened on (a TCP port 0 is resolved).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Waits for the next connection.
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
        }
    }

    /// A handle that can wake a blocked `accept` from another thread.
    pub fn waker(&self) -> io::Result<ListenerWaker> {
        let fd = match &self.kind {
            Kind::Unix(l, _) => std::os::fd::AsFd::as_fd(l).try_clone_to_owned()?,
            Kind::Tcp(l, _) | Kind::Tls(l, ..) => {
                std::os::fd::AsFd::as_fd(l).try_clone_to_owned()?
            }
        };
        Ok(ListenerWaker { fd })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Kind::Unix(_, path) = &self.kind {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Connects to a Unix or TCP endpoint, giving up after `timeout`.
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
