//! TLS for the stream transport (`tls://HOST:PORT`): certificates, keys and
//! trust from PEM files, and [`TlsSock`], the socket a [`crate::StreamConn`]
//! reads and writes plaintext through when its bytes cross a network.
//!
//! It is [rustls] (with *ring*'s cryptography), driven without blocking:
//! the framing above it (`stream.rs`) stays what it is for plain sockets —
//! header, limits check, descriptors, payload into the destination the
//! receiver chose — except that payload bytes are decrypted by rustls and
//! copied once out of its buffer (the kernel cannot read ciphertext into the
//! destination; kernel TLS would, and this machine's kernel has none).
//!
//! One TLS session serves both directions of a connection, so the reader
//! and the writers of a [`crate::StreamConn`] share it behind a mutex. The
//! mutex is only ever held for non-blocking work (decrypt what has arrived,
//! encrypt what is given, push records to the socket with `MSG_DONTWAIT`);
//! every wait (`poll`) happens outside it. So a reader waiting for bytes
//! never holds up a writer, and a writer waiting for the peer to read never
//! stops the reader from draining responses (the deadlock a pipelining
//! client would otherwise meet).
//!
//! The agent's side handshakes lazily, in its first reads: a connection
//! that never completes its handshake is one that never sent a Hello, and
//! the agent's handshake timeout closes it like any other. A client
//! handshakes in [`crate::connect`], so a certificate that is not trusted
//! is an error of the connect, naming why.
//!
//! Client certificates: with a client CA configured ([`ServerTlsFiles`]),
//! the agent asks every client for a certificate signed by it and refuses
//! the handshake without one. The subject alternative DNS names of the
//! verified certificate ([`TlsSock::peer_names`]) are what a tenants file
//! matches (`cert_names`).

use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{recv, send, sendmsg, RecvFlags, SendAncillaryBuffer, SendFlags};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use thiserror::Error;

/// A TLS setting that cannot be used: a file that cannot be read, holds no
/// certificate or key, or a key that does not fit its certificate.
///
/// # Examples
///
/// ```
/// use transport::tls::{server_config, ServerTlsFiles};
/// let files = ServerTlsFiles { cert: "/nonexistent/cert.pem".into(), key: "/nonexistent/key.pem".into(), client_ca: None };
/// let e = server_config(&files).unwrap_err();
/// assert_eq!(e.what, "certificate");
/// assert!(e.to_string().starts_with("TLS certificate /nonexistent/cert.pem: "), "{e}");
/// ```
#[derive(Debug, Error)]
#[error("TLS {what} {path}: {reason}")]
pub struct TlsError {
    /// What the file was for ("certificate", "private key", "CA").
    pub what: &'static str,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// The agent's side of TLS, as files: its certificate chain and key, and
/// optionally the CA that client certificates must be signed by.
///
/// # Examples
///
/// An agent's `tls://` listener from its files (`--tls-cert`, `--tls-key`,
/// `--tls-client-ca`; TOML `[tls]`):
///
/// ```
/// use transport::tls::{server_config, ServerTlsFiles};
/// use transport::{Endpoint, Listener};
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
/// # let (made, _) = pki(dir.path())?;
/// let files = ServerTlsFiles {
///     cert: dir.path().join("server.pem"),
///     key: dir.path().join("server.key"),
///     client_ca: None, // Some(ca): mutual TLS
/// };
/// # assert_eq!((&files.cert, &files.key), (&made.cert, &made.key));
/// let listener = Listener::bind_tls(&Endpoint::parse("tls://127.0.0.1:0")?, server_config(&files)?)?;
/// assert!(listener.endpoint().to_string().starts_with("tls://127.0.0.1:"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// PEM certificate chain, the agent's own certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of that certificate.
    pub key: PathBuf,
    /// PEM CA certificates; when set, every client must present a
    /// certificate signed by one of them (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// A client's side of TLS, from a `tls://` URI's parameters
/// (`?ca=PATH&cert=PATH&key=PATH&name=HOST`).
///
/// # Examples
///
/// ```
/// use transport::tls::TlsClientParams;
/// use transport::Endpoint;
/// let ep = Endpoint::parse("tls://10.0.0.5:9000?ca=/etc/tw/ca.pem&name=agent.internal")?;
/// let Endpoint::Tls { client, .. } = ep else { unreachable!() };
/// assert_eq!(client, TlsClientParams {
///     ca: Some("/etc/tw/ca.pem".into()),
///     name: Some("agent.internal".into()),
///     ..TlsClientParams::default()
/// });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TlsClientParams {
    /// PEM CA certificates to trust for the agent's certificate (`ca=`);
    /// `None`: the system's trust store.
    pub ca: Option<PathBuf>,
    /// The client's own PEM certificate chain, for mutual TLS (`cert=`).
    pub cert: Option<PathBuf>,
    /// The key of `cert` (`key=`).
    pub key: Option<PathBuf>,
    /// The name the agent's certificate must carry (`name=`); `None`: the
    /// URI's host.
    pub name: Option<String>,
}

impl TlsClientParams {
    /// True when no parameter is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::tls::TlsClientParams;
    /// assert!(TlsClientParams::default().is_empty()); // the system's trust store, the URI's host
    /// assert!(!TlsClientParams { name: Some("a".into()), ..Default::default() }.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        *self == TlsClientParams::default()
    }
}

/// *ring*'s provider with AES-128-GCM first: as strong as a network
/// needs, and faster than AES-256 on a tensor's megabytes. The agent
/// follows the client's order, so both sides list it first.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError {
        what,
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("holds no PEM certificate".into()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError {
        what: "private key",
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for c in read_certs("CA", path)? {
        store.add(c).map_err(|e| TlsError {
            what: "CA",
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(Arc::new(store))
}

/// Builds the agent's TLS configuration from its files (TLS 1.2 and 1.3).
///
/// # Examples
///
/// A key that is not the certificate's is refused here, not at the first
/// handshake:
///
/// ```
/// use transport::tls::{server_config, ServerTlsFiles};
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
/// let (files, client) = pki(dir.path())?;
/// assert!(server_config(&files).is_ok());
/// let wrong = ServerTlsFiles { key: client.key.ok_or("made")?, ..files };
/// let e = server_config(&wrong).unwrap_err();
/// assert!(e.reason.starts_with("does not fit the certificate"), "{e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn server_config(files: &ServerTlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = read_certs("certificate", &files.cert)?;
    let key = read_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError {
            what: "certificate",
            path: files.cert.clone(),
            reason: e.to_string(),
        })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                    .build()
                    .map_err(|e| TlsError {
                        what: "CA",
                        path: ca.clone(),
                        reason: e.to_string(),
                    })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let cfg = builder.with_single_cert(certs, key).map_err(|e| TlsError {
        what: "private key",
        path: files.key.clone(),
        reason: format!("does not fit the certificate {}: {e}", files.cert.display()),
    })?;
    Ok(Arc::new(cfg))
}

/// Builds a client's TLS configuration from a URI's parameters.
///
/// # Examples
///
/// ```
/// use transport::tls::{client_config, TlsClientParams};
/// assert!(client_config(&TlsClientParams::default()).is_ok()); // the system's trust store
/// let half = TlsClientParams { cert: Some("client.pem".into()), ..Default::default() };
/// let e = client_config(&half).unwrap_err();
/// assert_eq!(e.reason, "a client certificate needs both cert= and key=");
/// ```
pub fn client_config(p: &TlsClientParams) -> Result<Arc<ClientConfig>, TlsError> {
    let store = match &p.ca {
        Some(ca) => roots(ca)?,
        None => {
            let mut store = RootCertStore::empty();
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = store.add(c);
            }
            Arc::new(store)
        }
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError {
            what: "CA",
            path: p.ca.clone().unwrap_or_default(),
            reason: e.to_string(),
        })?
        .with_root_certificates(store);
    let cfg = match (&p.cert, &p.key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(read_certs("certificate", cert)?, read_key(key)?)
            .map_err(|e| TlsError {
                what: "private key",
                path: key.clone(),
                reason: format!("does not fit the certificate {}: {e}", cert.display()),
            })?,
        (Some(path), None) | (None, Some(path)) => {
            return Err(TlsError {
                what: "certificate",
                path: path.clone(),
                reason: "a client certificate needs both cert= and key=".into(),
            })
        }
    };
    Ok(Arc::new(cfg))
}

/// The name a client checks the agent's certificate against: `name`, or
/// the host of `host:port` (brackets of an IPv6 address removed).
///
/// # Examples
///
/// ```
/// use transport::tls::server_name;
/// assert_eq!(server_name("agent.internal:9000", None)?.to_str(), "agent.internal");
/// assert_eq!(server_name("[::1]:9000", None)?.to_str(), "::1");
/// assert_eq!(server_name("10.0.0.5:9000", Some("agent.internal"))?.to_str(), "agent.internal");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn server_name(addr: &str, name: Option<&str>) -> io::Result<ServerName<'static>> {
    let host = match name {
        Some(n) => n,
        None => {
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            host.trim_start_matches('[').trim_end_matches(']')
        }
    };
    ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{host}' is not a name a certificate can carry: {e}"),
        )
    })
}

/// What one [`TlsSock::pump`] found on the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrived {
    /// Nothing yet.
    Nothing,
    /// Some bytes (records, or part of one).
    Bytes,
    /// The end of the stream.
    End,
}

/// `u64::MAX`: no timeout.
const NO_TIMEOUT: u64 = u64::MAX;

fn to_ns(t: Option<Duration>) -> u64 {
    t.map_or(NO_TIMEOUT, |d| {
        d.as_nanos().min(u128::from(NO_TIMEOUT - 1)) as u64
    })
}

fn from_ns(ns: u64) -> Option<Duration> {
    (ns != NO_TIMEOUT).then(|| Duration::from_nanos(ns))
}

/// A TCP socket carrying one TLS session; see the module docs.
///
/// # Examples
///
/// Both ends of a mutual-TLS session over loopback, by hand (a
/// [`Listener`](crate::Listener) and [`connect`](crate::connect) do this
/// for `tls://` URIs):
///
/// ```
/// use std::io::IoSlice;
/// use std::time::Duration;
/// use transport::tls::{client_config, server_config, server_name, TlsSock};
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
/// let (server_files, client_params) = pki(dir.path())?; // a CA, "localhost", "client.test"
/// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
/// let addr = listener.local_addr()?;
/// let config = server_config(&server_files)?;
/// let agent = std::thread::spawn(move || -> std::io::Result<(Vec<u8>, Option<Vec<String>>)> {
///     let sock = TlsSock::server(listener.accept()?.0, config)?;
///     sock.set_read_timeout(Some(Duration::from_secs(5)));
///     let mut buf = [0u8; 5];
///     let n = sock.read(&mut buf)?; // the handshake runs in the first reads
///     Ok((buf[..n].to_vec(), sock.peer_names()))
/// });
///
/// let tcp = std::net::TcpStream::connect(addr)?;
/// let name = server_name("localhost:0", None)?;
/// let client = TlsSock::client(tcp, client_config(&client_params)?, name, Duration::from_secs(5))?;
/// assert!(client.tcp().peer_addr()?.ip().is_loopback());
/// client.send(&mut [IoSlice::new(b"hello")], None)?;
/// let (got, names) = agent.join().map_err(|_| "agent panicked")??;
/// assert_eq!(got, b"hello");
/// assert_eq!(names, Some(vec!["client.test".to_string()]));
/// assert_eq!(client.peer_names(), Some(vec!["localhost".to_string()]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TlsSock {
    tcp: TcpStream,
    tls: Mutex<Connection>,
    read_timeout_ns: AtomicU64,
    write_timeout_ns: AtomicU64,
}

/// The socket without blocking, for rustls to read records from and write
/// records to.
struct NonBlocking<'a>(&'a TcpStream);

fn io_err(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

impl Read for NonBlocking<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match recv(self.0, &mut *buf, RecvFlags::DONTWAIT) {
                Ok((n, _)) => return Ok(n),
                Err(Errno::INTR) => {}
                Err(e) => return Err(io_err(e)),
            }
        }
    }
}

impl Write for NonBlocking<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match send(self.0, buf, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                Ok(n) => return Ok(n),
                Err(Errno::INTR) => {}
                Err(e) => return Err(io_err(e)),
            }
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        loop {
            match sendmsg(
                self.0,
                bufs,
                &mut SendAncillaryBuffer::default(),
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            ) {
                Ok(n) => return Ok(n),
                Err(Errno::INTR) => {}
                Err(e) => return Err(io_err(e)),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// A send that cannot make progress: the peer is not reading.
fn send_timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "peer stopped reading (send timed out)",
    )
}

/// Waits until `fd` is ready for `flags` or `timeout` passes (`Ok(None)`);
/// returns what is ready.
fn wait(
    tcp: &TcpStream,
    flags: PollFlags,
    timeout: Option<Duration>,
) -> io::Result<Option<PollFlags>> {
    let fd = tcp.as_fd();
    let mut fds = [PollFd::new(&fd, flags)];
    let ts = timeout.map(|t| rustix::time::Timespec {
        tv_sec: t.as_secs() as i64,
        tv_nsec: t.subsec_nanos() as i64,
    });
    match poll(&mut fds, ts.as_ref()) {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some(fds[0].revents())),
        Err(Errno::INTR) => Ok(Some(PollFlags::empty())),
        Err(e) => Err(io_err(e)),
    }
}

/// How long is left until `deadline` (`None`: no deadline), or `Err` if it passed.
fn remaining(deadline: Option<Instant>) -> Result<Option<Duration>, ()> {
    match deadline {
        None => Ok(None),
        Some(d) => d.checked_duration_since(Instant::now()).map(Some).ok_or(()),
    }
}

impl TlsSock {
    /// The agent's side of an accepted connection; the handshake runs in
    /// the first reads. Example: [`TlsSock`].
    pub fn server(tcp: TcpStream, config: Arc<ServerConfig>) -> io::Result<TlsSock> {
        let conn = rustls::ServerConnection::new(config).map_err(tls_err)?;
        Ok(TlsSock::new(tcp, Connection::Server(conn)))
    }

    /// A client's side: handshakes with the agent before returning, within
    /// `timeout`, so an untrusted certificate fails here.
    ///
    /// # Examples
    ///
    /// An agent whose certificate no trusted CA signed:
    ///
    /// ```
    /// use std::time::Duration;
    /// use transport::tls::{client_config, server_config, server_name, TlsClientParams, TlsSock};
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
    /// # let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    /// let (server_files, _) = pki(a.path())?;
    /// let (_, other_ca) = pki(b.path())?; // a stranger's CA
    /// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let addr = listener.local_addr()?;
    /// let config = server_config(&server_files)?;
    /// let agent = std::thread::spawn(move || -> std::io::Result<()> {
    ///     let sock = TlsSock::server(listener.accept()?.0, config)?;
    ///     sock.set_read_timeout(Some(Duration::from_secs(5)));
    ///     let _ = sock.read(&mut [0u8; 1]); // fails: the client gives up
    ///     Ok(())
    /// });
    /// let trust = TlsClientParams { ca: other_ca.ca, ..Default::default() };
    /// let tcp = std::net::TcpStream::connect(addr)?;
    /// let r = TlsSock::client(tcp, client_config(&trust)?, server_name("localhost:0", None)?, Duration::from_secs(5));
    /// let e = r.unwrap_err();
    /// assert!(e.to_string().contains("certificate"), "{e}");
    /// agent.join().map_err(|_| "agent panicked")??;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn client(
        tcp: TcpStream,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
        timeout: Duration,
    ) -> io::Result<TlsSock> {
        let conn = ClientConnection::new(config, name).map_err(tls_err)?;
        let sock = TlsSock::new(tcp, Connection::Client(conn));
        let deadline = Instant::now() + timeout;
        loop {
            let writing = {
                let mut c = sock.lock();
                let arrived = sock.pump(&mut c)?;
                if !c.is_handshaking() && !c.wants_write() {
                    break;
                }
                if arrived == Arrived::End {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the agent closed the connection during the TLS handshake (is it a \
                         tls:// listener? at its connection limit?)",
                    ));
                }
                c.wants_write()
            };
            let left = remaining(Some(deadline))
                .map_err(|()| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?;
            let flags = if writing {
                PollFlags::IN | PollFlags::OUT
            } else {
                PollFlags::IN
            };
            if wait(&sock.tcp, flags, left)?.is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "TLS handshake timed out",
                ));
            }
        }
        Ok(sock)
    }

    fn new(tcp: TcpStream, mut tls: Connection) -> TlsSock {
        // Bounds what a peer that does not read can make us hold: at most
        // this much encrypted output waits in user space (the rest waits
        // in `send`, for room).
        tls.set_buffer_limit(Some(256 << 10));
        TlsSock {
            tcp,
            tls: Mutex::new(tls),
            read_timeout_ns: AtomicU64::new(NO_TIMEOUT),
            write_timeout_ns: AtomicU64::new(NO_TIMEOUT),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding it left a TLS session in an unknown
        // state; the next operation fails on its own (rustls errors are
        // sticky), so the poison itself carries no extra information.
        self.tls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The TCP socket underneath. Example: [`TlsSock`].
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Sends what rustls has ready without blocking; `Ok(false)` if the
    /// socket is full and some remains.
    fn flush(&self, c: &mut Connection) -> io::Result<bool> {
        while c.wants_write() {
            match c.write_tls(&mut NonBlocking(&self.tcp)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// One round of non-blocking work: records that arrived are read and
    /// processed (handshake messages answered), what is ready to go is
    /// sent. Returns what arrived: nothing, bytes, or the end of the
    /// stream.
    fn pump(&self, c: &mut Connection) -> io::Result<Arrived> {
        let mut arrived = Arrived::Nothing;
        loop {
            match c.read_tls(&mut NonBlocking(&self.tcp)) {
                Ok(n) => {
                    arrived = if n == 0 { Arrived::End } else { Arrived::Bytes };
                    if let Err(e) = c.process_new_packets() {
                        // Tell the peer why (the alert rustls queued).
                        let _ = self.flush(c);
                        return Err(tls_err(e));
                    }
                    if n == 0 || !c.wants_read() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        self.flush(c)?;
        Ok(arrived)
    }

    /// Reads decrypted bytes without waiting: `WouldBlock` when none have
    /// arrived, `Ok(0)` at the end of the stream.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io::IoSlice;
    /// use std::time::Duration;
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
    /// # fn tls_pair(server_files: &transport::tls::ServerTlsFiles, client: &transport::tls::TlsClientParams) -> Result<(transport::tls::TlsSock, transport::tls::TlsSock), Box<dyn std::error::Error>> {
    /// #     use transport::tls::{client_config, server_config, server_name, TlsSock};
    /// #     let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// #     let addr = l.local_addr()?;
    /// #     let config = server_config(server_files)?;
    /// #     let accept = std::thread::spawn(move || -> std::io::Result<TlsSock> {
    /// #         let s = TlsSock::server(l.accept()?.0, config)?;
    /// #         s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    /// #         s.read(&mut [0u8; 1])?; // drives the handshake
    /// #         s.set_read_timeout(None);
    /// #         Ok(s)
    /// #     });
    /// #     let tcp = std::net::TcpStream::connect(addr)?;
    /// #     let c = TlsSock::client(tcp, client_config(client)?, server_name("localhost:1", None)?, std::time::Duration::from_secs(5))?;
    /// #     c.send(&mut [std::io::IoSlice::new(b"!")], None)?;
    /// #     Ok((accept.join().map_err(|_| "accept panicked")??, c))
    /// # }
    /// # let dir = tempfile::tempdir()?;
    /// # let (files, params) = pki(dir.path())?;
    /// let (server, client) = tls_pair(&files, &params)?; // a TlsSock each side, handshake done
    /// let mut buf = [0u8; 16];
    /// assert_eq!(server.try_read(&mut buf).map_err(|e| e.kind()), Err(std::io::ErrorKind::WouldBlock));
    /// client.send(&mut [IoSlice::new(b"ping")], None)?;
    /// server.set_read_timeout(Some(Duration::from_secs(5)));
    /// let n = server.read(&mut buf[..2])?; // one record arrives; two bytes taken
    /// assert_eq!(&buf[..n], b"pi");
    /// assert!(server.has_pending()); // the rest is decrypted already
    /// assert_eq!(server.try_read(&mut buf)?, 2);
    /// assert_eq!(&buf[..2], b"ng");
    /// client.shutdown(std::net::Shutdown::Both)?;
    /// assert_eq!(server.read(&mut buf)?, 0); // the end of the stream
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut c = self.lock();
        loop {
            match c.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Closed without close_notify: our framing has its own
                // lengths, so a cut is seen (mid-message) all the same.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if self.pump(&mut c)? == Arrived::Nothing {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    /// Reads decrypted bytes, waiting up to the read timeout for some
    /// (`WouldBlock` when it passes, as a socket's `SO_RCVTIMEO` would).
    /// Example: [`TlsSock::try_read`].
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let deadline =
            from_ns(self.read_timeout_ns.load(Ordering::Relaxed)).map(|t| Instant::now() + t);
        loop {
            match self.try_read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return r,
            }
            let Ok(left) = remaining(deadline) else {
                return Err(io::ErrorKind::WouldBlock.into());
            };
            let flags = if self.lock().wants_write() {
                PollFlags::IN | PollFlags::OUT
            } else {
                PollFlags::IN
            };
            if wait(&self.tcp, flags, left)?.is_none() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    /// True when decrypted bytes wait to be read (no socket call).
    /// Example: [`TlsSock::try_read`].
    pub fn has_pending(&self) -> bool {
        self.lock()
            .process_new_packets()
            .is_ok_and(|s| s.plaintext_bytes_to_read() > 0)
    }

    /// Encrypts and sends all of `bufs`. Waits for room outside the lock,
    /// up to the write timeout; with `drain`, also runs its callback each
    /// time the peer has sent something while we wait (see
    /// `stream::send_message`), bounded by its own timeout. Example:
    /// [`TlsSock`].
    pub fn send(
        &self,
        mut bufs: &mut [IoSlice<'_>],
        mut drain: Option<crate::stream::Drain<'_>>,
    ) -> io::Result<()> {
        loop {
            {
                let mut c = self.lock();
                if c.is_handshaking() {
                    // Nothing may go before the handshake: a message sent
                    // now would wait in rustls and vanish with the socket
                    // (the agent refusing a connection before its
                    // handshake just closes it).
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "TLS handshake not complete: nothing can be sent yet",
                    ));
                }
                while !bufs.is_empty() {
                    let n = c.writer().write_vectored(bufs)?;
                    if n == 0 {
                        break;
                    }
                    IoSlice::advance_slices(&mut bufs, n);
                }
                let sent = self.flush(&mut c)?;
                if bufs.is_empty() && sent {
                    return Ok(());
                }
            }
            let timeout = match &drain {
                Some((_, t)) => *t,
                None => from_ns(self.write_timeout_ns.load(Ordering::Relaxed)),
            };
            let flags = if drain.is_some() {
                PollFlags::OUT | PollFlags::IN
            } else {
                PollFlags::OUT
            };
            match wait(&self.tcp, flags, timeout)? {
                None => return Err(send_timed_out()),
                Some(ready) => {
                    if let Some((on_readable, _)) = drain.as_mut() {
                        if ready.contains(PollFlags::IN) && !ready.contains(PollFlags::OUT) {
                            on_readable()?;
                        }
                    }
                }
            }
        }
    }

    /// Bounds how long [`TlsSock::read`] waits (`None` = forever).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
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
    /// # fn tls_pair(server_files: &transport::tls::ServerTlsFiles, client: &transport::tls::TlsClientParams) -> Result<(transport::tls::TlsSock, transport::tls::TlsSock), Box<dyn std::error::Error>> {
    /// #     use transport::tls::{client_config, server_config, server_name, TlsSock};
    /// #     let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// #     let addr = l.local_addr()?;
    /// #     let config = server_config(server_files)?;
    /// #     let accept = std::thread::spawn(move || -> std::io::Result<TlsSock> {
    /// #         let s = TlsSock::server(l.accept()?.0, config)?;
    /// #         s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    /// #         s.read(&mut [0u8; 1])?; // drives the handshake
    /// #         s.set_read_timeout(None);
    /// #         Ok(s)
    /// #     });
    /// #     let tcp = std::net::TcpStream::connect(addr)?;
    /// #     let c = TlsSock::client(tcp, client_config(client)?, server_name("localhost:1", None)?, std::time::Duration::from_secs(5))?;
    /// #     c.send(&mut [std::io::IoSlice::new(b"!")], None)?;
    /// #     Ok((accept.join().map_err(|_| "accept panicked")??, c))
    /// # }
    /// # let dir = tempfile::tempdir()?;
    /// # let (files, params) = pki(dir.path())?;
    /// let (server, _client) = tls_pair(&files, &params)?;
    /// server.set_read_timeout(Some(Duration::from_millis(20)));
    /// let e = server.read(&mut [0u8; 4]).unwrap_err(); // nothing sent
    /// assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        self.read_timeout_ns.store(to_ns(t), Ordering::Relaxed);
    }

    /// Bounds how long [`TlsSock::send`] waits for room (`None` = forever).
    ///
    /// # Examples
    ///
    /// A peer that never reads: the send gives up once the socket is full.
    ///
    /// ```
    /// use std::io::IoSlice;
    /// use std::time::Duration;
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
    /// # fn tls_pair(server_files: &transport::tls::ServerTlsFiles, client: &transport::tls::TlsClientParams) -> Result<(transport::tls::TlsSock, transport::tls::TlsSock), Box<dyn std::error::Error>> {
    /// #     use transport::tls::{client_config, server_config, server_name, TlsSock};
    /// #     let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// #     let addr = l.local_addr()?;
    /// #     let config = server_config(server_files)?;
    /// #     let accept = std::thread::spawn(move || -> std::io::Result<TlsSock> {
    /// #         let s = TlsSock::server(l.accept()?.0, config)?;
    /// #         s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    /// #         s.read(&mut [0u8; 1])?; // drives the handshake
    /// #         s.set_read_timeout(None);
    /// #         Ok(s)
    /// #     });
    /// #     let tcp = std::net::TcpStream::connect(addr)?;
    /// #     let c = TlsSock::client(tcp, client_config(client)?, server_name("localhost:1", None)?, std::time::Duration::from_secs(5))?;
    /// #     c.send(&mut [std::io::IoSlice::new(b"!")], None)?;
    /// #     Ok((accept.join().map_err(|_| "accept panicked")??, c))
    /// # }
    /// # let dir = tempfile::tempdir()?;
    /// # let (files, params) = pki(dir.path())?;
    /// let (_server, client) = tls_pair(&files, &params)?;
    /// client.set_write_timeout(Some(Duration::from_millis(50)));
    /// let big = vec![0u8; 64 << 20];
    /// let e = client.send(&mut [IoSlice::new(&big)], None).unwrap_err();
    /// assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_write_timeout(&self, t: Option<Duration>) {
        self.write_timeout_ns.store(to_ns(t), Ordering::Relaxed);
    }

    /// Closes the socket (no close_notify: this also wakes a reader
    /// blocked in `poll`, which a TLS alert could not). Example:
    /// [`TlsSock::try_read`].
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.tcp.shutdown(how)
    }

    /// The subject alternative DNS names of the peer's verified
    /// certificate; `None` before the handshake, or when the peer sent none.
    /// Example: [`TlsSock`].
    pub fn peer_names(&self) -> Option<Vec<String>> {
        let c = self.lock();
        let der = c.peer_certificates()?.first()?;
        let cert = webpki::EndEntityCert::try_from(der).ok()?;
        Some(cert.valid_dns_names().map(str::to_string).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A CA, a server certificate for `localhost` and a client certificate
    /// named `client.test`, written to `dir`.
    fn pki(dir: &Path) -> (ServerTlsFiles, TlsClientParams) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        // A CA of its own name: two test CAs are strangers, not look-alikes.
        ca_params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("test CA {}", dir.display()),
        );
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf = |name: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec![name.to_string()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let ca_path = write("ca.pem", &ca.pem());
        let (s_cert, s_key) = leaf("localhost");
        let (c_cert, c_key) = leaf("client.test");
        (
            ServerTlsFiles {
                cert: write("server.pem", &s_cert),
                key: write("server.key", &s_key),
                client_ca: Some(ca_path.clone()),
            },
            TlsClientParams {
                ca: Some(ca_path),
                cert: Some(write("client.pem", &c_cert)),
                key: Some(write("client.key", &c_key)),
                name: None,
            },
        )
    }

    /// A server and a client over loopback; the client sends "hello" and
    /// the server reads it, which drives the server's handshake.
    fn pair(
        server: Arc<ServerConfig>,
        client: &TlsClientParams,
    ) -> (TlsSock, io::Result<usize>, io::Result<TlsSock>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let accept = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let sock = TlsSock::server(s, server).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(5)));
            let mut b = [0u8; 5];
            let got = sock.read(&mut b);
            if let Ok(n) = got {
                assert_eq!(&b[..n], &b"hello"[..n]);
            }
            (sock, got)
        });
        let tcp = TcpStream::connect(addr).unwrap();
        let name = server_name("localhost:1", client.name.as_deref()).unwrap();
        let client = client_config(client)
            .map_err(|e| io::Error::other(e.to_string()))
            .and_then(|cfg| {
                let sock = TlsSock::client(tcp, cfg, name, Duration::from_secs(5))?;
                sock.send(&mut [IoSlice::new(b"hello")], None)?;
                Ok(sock)
            });
        let (server, got) = accept.join().unwrap();
        (server, got, client)
    }

    #[test]
    fn mutual_tls_round_trip_names_the_client() {
        let dir = tempfile::tempdir().unwrap();
        let (sfiles, cparams) = pki(dir.path());
        let (server, got, client) = pair(server_config(&sfiles).unwrap(), &cparams);
        assert_eq!(got.unwrap(), 5);
        let client = client.unwrap();
        assert_eq!(server.peer_names(), Some(vec!["client.test".to_string()]));
        // A message larger than the buffer limit, both ways at once.
        let big = vec![7u8; 3 << 20];
        let sender = {
            let big = big.clone();
            std::thread::spawn(move || {
                server.send(&mut [IoSlice::new(&big)], None).unwrap();
                server
            })
        };
        let mut got = vec![0u8; big.len()];
        let mut at = 0;
        client.set_read_timeout(Some(Duration::from_secs(5)));
        while at < got.len() {
            let n = client.read(&mut got[at..]).unwrap();
            assert!(n > 0);
            at += n;
        }
        assert!(got == big);
        let server = sender.join().unwrap();
        assert!(!client.has_pending());
        drop(client);
        let mut b = [0u8; 1];
        assert_eq!(server.read(&mut b).unwrap(), 0, "closed");
    }

    #[test]
    fn untrusted_certificates_fail_the_handshake_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (sfiles, cparams) = pki(dir.path());
        let other = tempfile::tempdir().unwrap();
        let (_, stranger) = pki(other.path());
        // The client trusts another CA: the agent's certificate is refused.
        let trusts_other = TlsClientParams {
            ca: stranger.ca.clone(),
            ..cparams.clone()
        };
        let (_, got, c) = pair(server_config(&sfiles).unwrap(), &trusts_other);
        assert!(got.is_err());
        let e = c.expect_err("refused").to_string();
        assert!(e.contains("UnknownIssuer"), "{e}");
        // A client certificate from another CA: refused by the agent.
        let foreign_cert = TlsClientParams {
            cert: stranger.cert.clone(),
            key: stranger.key.clone(),
            ..cparams.clone()
        };
        let (s, got, _) = pair(server_config(&sfiles).unwrap(), &foreign_cert);
        let e = got.expect_err("refused").to_string();
        assert!(e.contains("UnknownIssuer"), "{e}");
        assert!(s.peer_names().is_none());
        // No client certificate at all, where one is required.
        let anonymous = TlsClientParams {
            cert: None,
            key: None,
            ..cparams.clone()
        };
        let (s, got, _) = pair(server_config(&sfiles).unwrap(), &anonymous);
        let e = got.expect_err("refused").to_string();
        assert!(e.contains("no certificates"), "{e}");
        assert!(s.peer_names().is_none());
        // The wrong name.
        let misnamed = TlsClientParams {
            name: Some("elsewhere".into()),
            ..cparams
        };
        let (_, _, c) = pair(server_config(&sfiles).unwrap(), &misnamed);
        let e = c.expect_err("refused").to_string();
        assert!(e.contains("not valid for name \"elsewhere\""), "{e}");
    }

    #[test]
    fn a_peer_that_closes_during_the_handshake_is_an_error_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (_, cparams) = pki(dir.path());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // It reads the ClientHello (so its close is a clean end of the
        // stream, not a reset), then closes.
        let closer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut hello = [0u8; 16 << 10];
            let _ = s.read(&mut hello);
        });
        let t0 = Instant::now();
        let e = TlsSock::client(
            TcpStream::connect(addr).unwrap(),
            client_config(&cparams).unwrap(),
            server_name("localhost:1", None).unwrap(),
            Duration::from_secs(20),
        )
        .expect_err("closed");
        closer.join().unwrap();
        assert!(e.to_string().contains("during the TLS handshake"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{e}");
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let (sfiles, cparams) = pki(dir.path());
        let e = server_config(&ServerTlsFiles {
            key: dir.path().join("missing.key"),
            ..sfiles.clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("missing.key"), "{e}");
        let e = server_config(&ServerTlsFiles {
            key: cparams.key.clone().unwrap(),
            ..sfiles.clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        let e = server_config(&ServerTlsFiles {
            cert: sfiles.key.clone(),
            ..sfiles.clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let e = client_config(&TlsClientParams {
            key: None,
            ..cparams
        })
        .unwrap_err();
        assert!(e.to_string().contains("both cert= and key="), "{e}");
    }
}
