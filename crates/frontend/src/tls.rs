//! TLS for the front doors: `grpcs://HOST:PORT` and `https://HOST:PORT`
//! are the `grpc://` and `http://` doors with their bytes encrypted. Same
//! door, same core, same service: only the listener differs.
//!
//! The rustls configuration is the agent's own
//! ([`transport::tls::server_config`], from `--tls-cert`, `--tls-key` and
//! `--tls-client-ca`), so every listener of an agent has the same TLS
//! settings; each door only adds its ALPN protocol (`h2` for gRPC, which
//! gRPC clients insist on, `http/1.1` for the REST door). With a client
//! CA, a client without a certificate signed by it fails the handshake.
//!
//! Handshakes never run in the accept loop: the doors' listener
//! (`accept::DoorIncoming`) admits each TCP connection and runs its
//! handshake ([`open_tls`]) in a task of its own, within the agent's
//! handshake deadline, then hands the finished stream to the door's server
//! (tonic or axum). A client that connects and never handshakes holds up
//! nobody but itself, and is closed when its time is up. A plain-text HTTP
//! request sent to an `https://` door gets a 400 saying so (in the KServe
//! error JSON), rather than a bare reset.

use crate::server::FrontendError;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use transport::tls::ServerTlsFiles;

/// The URI scheme of the gRPC front door over TLS.
pub const GRPCS_SCHEME: &str = "grpcs://";

/// The URI scheme of the HTTP/REST front door over TLS.
pub const HTTPS_SCHEME: &str = "https://";

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What a plain-text HTTP client is told on an `https://` door.
const PLAIN_HTTP_ERROR: &str = "this door speaks HTTPS: the agent expects a TLS handshake on \
                                this port (https://; tritonclient.http: ssl=True)";

/// The error for a TLS door (`uri`) of an agent given no certificate.
pub(crate) fn needs_files(uri: &str) -> FrontendError {
    FrontendError::BadAddress {
        uri: uri.to_string(),
        reason: "a TLS front door needs the agent's certificate and key: give --tls-cert FILE \
                 --tls-key FILE (TOML [tls] cert, key)"
            .into(),
    }
}

/// The rustls configurations of one agent's TLS doors, read once from its
/// files: the same settings, with each protocol's ALPN.
#[derive(Clone, Debug)]
pub(crate) struct DoorTls {
    grpc: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
}

impl DoorTls {
    /// Reads `files` ([`transport::tls::server_config`]); an error names
    /// `uri` (the door that needed them) and the file at fault.
    pub(crate) fn new(uri: &str, files: &ServerTlsFiles) -> Result<DoorTls, FrontendError> {
        let base = transport::tls::server_config(files).map_err(|source| FrontendError::Tls {
            uri: uri.to_string(),
            source,
        })?;
        let with_alpn = |proto: &[u8]| {
            let mut cfg = ServerConfig::clone(&base);
            cfg.alpn_protocols = vec![proto.to_vec()];
            Arc::new(cfg)
        };
        Ok(DoorTls {
            grpc: with_alpn(b"h2"),
            http: with_alpn(b"http/1.1"),
        })
    }

    /// For a gRPC door: ALPN `h2`.
    pub(crate) fn grpc(&self) -> Arc<ServerConfig> {
        self.grpc.clone()
    }

    /// For an HTTP/1.1 door: ALPN `http/1.1`.
    pub(crate) fn http(&self) -> Arc<ServerConfig> {
        self.http.clone()
    }

    /// The TLS files of a door that `listen`s on `tls_scheme`, read; `None`
    /// for a clear-text door (or no files: [`DoorTls::pick`] says so).
    pub(crate) fn read_for(
        listen: &str,
        tls_scheme: &str,
        files: Option<&ServerTlsFiles>,
    ) -> Result<Option<DoorTls>, FrontendError> {
        match files {
            Some(files) if listen.starts_with(tls_scheme) => DoorTls::new(listen, files).map(Some),
            _ => Ok(None),
        }
    }

    /// The rustls configuration a door on `listen` serves with: `None` in
    /// clear text, `choose`'s for a TLS door, an error naming the missing
    /// files when a TLS door has none.
    pub(crate) fn pick(
        listen: &str,
        is_tls: bool,
        tls: Option<&DoorTls>,
        choose: fn(&DoorTls) -> Arc<ServerConfig>,
    ) -> Result<Option<Arc<ServerConfig>>, FrontendError> {
        match (is_tls, tls) {
            (false, _) => Ok(None),
            (true, Some(tls)) => Ok(Some(choose(tls))),
            (true, None) => Err(needs_files(listen)),
        }
    }
}

/// What a door does with a client that does not start with a TLS
/// handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlainText {
    /// Closes the connection.
    Close,
    /// Answers `400 Bad Request` with a KServe error body, then closes.
    HttpError,
}

/// The TLS handshake of a door's connection whose `first` byte arrived;
/// `None` when it fails (the connection is closed as it drops). A client
/// that does not start with a TLS handshake record is closed, or told why
/// in HTTP first (`plain`).
pub(crate) async fn open_tls(
    stream: TcpStream,
    first: u8,
    acceptor: &TlsAcceptor,
    plain: PlainText,
) -> Option<TlsStream<TcpStream>> {
    if first != TLS_HANDSHAKE_RECORD {
        if plain == PlainText::HttpError {
            refuse_plain_http(stream).await;
        }
        return None;
    }
    acceptor.accept(stream).await.ok()
}

/// Answers a plain-text HTTP request with 400 and the reason, then closes.
async fn refuse_plain_http(mut tcp: TcpStream) {
    let body = serde_json::json!({ "error": PLAIN_HTTP_ERROR }).to_string();
    let reply = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut buf = vec![0u8; 16 << 10];
    // The request's head first, so that closing does not reset the reply
    // away before the client reads it.
    let _ = tcp.read(&mut buf).await;
    if tcp.write_all(reply.as_bytes()).await.is_err() {
        return;
    }
    let _ = tcp.shutdown().await;
    // Then whatever body follows, for a moment and up to 1 MiB.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut left = 1usize << 20;
        while left > 0 {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use crate::test_support::identity_core as core;
    use crate::{DoorsConfig, FrontDoors, GrpcFrontend, HttpFrontend};
    use std::io::{self, Read, Write};
    use std::net::TcpStream;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use tokio_rustls::rustls::{ClientConfig, ClientConnection, StreamOwned};
    use transport::tls::{client_config, server_name, ServerTlsFiles, TlsClientParams};

    /// A CA's files: the agent's certificate (localhost, 127.0.0.1) and
    /// key, and a client's.
    struct Pki {
        ca: PathBuf,
        server: ServerTlsFiles,
        client_cert: PathBuf,
        client_key: PathBuf,
    }

    fn make_pki(dir: &Path) -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("test CA {}", dir.display()),
        );
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).expect("CA");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("write");
            p
        };
        let leaf = |names: &[&str], file: &str| {
            let key = rcgen::KeyPair::generate().expect("key");
            let cert = rcgen::CertificateParams::new(
                names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            )
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("sign");
            (
                write(&format!("{file}.pem"), &cert.pem()),
                write(&format!("{file}.key"), &key.serialize_pem()),
            )
        };
        let (cert, key) = leaf(&["localhost", "127.0.0.1"], "server");
        let (client_cert, client_key) = leaf(&["client.test"], "client");
        Pki {
            ca: write("ca.pem", &ca.pem()),
            server: ServerTlsFiles {
                cert,
                key,
                client_ca: None,
            },
            client_cert,
            client_key,
        }
    }

    /// A client trusting `ca`, with a certificate when given, offering
    /// `alpn`.
    fn client(ca: &Path, cert: Option<(&Path, &Path)>, alpn: &[u8]) -> Arc<ClientConfig> {
        let cfg = client_config(&TlsClientParams {
            ca: Some(ca.to_path_buf()),
            cert: cert.map(|(c, _)| c.to_path_buf()),
            key: cert.map(|(_, k)| k.to_path_buf()),
            name: None,
        })
        .expect("client config");
        let mut cfg = ClientConfig::clone(&cfg);
        cfg.alpn_protocols = vec![alpn.to_vec()];
        Arc::new(cfg)
    }

    fn addr(uri: &str) -> &str {
        uri.split_once("://").map_or(uri, |(_, a)| a)
    }

    type TlsClient = StreamOwned<ClientConnection, TcpStream>;

    /// A TLS connection to `uri`, handshake done; the protocol ALPN chose.
    fn connect(uri: &str, cfg: Arc<ClientConfig>) -> io::Result<(TlsClient, Option<Vec<u8>>)> {
        let addr = addr(uri);
        let mut tcp = TcpStream::connect(addr)?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut conn = ClientConnection::new(cfg, server_name(addr, Some("localhost"))?)
            .map_err(io::Error::other)?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp)?;
        }
        let alpn = conn.alpn_protocol().map(<[u8]>::to_vec);
        Ok((StreamOwned::new(conn, tcp), alpn))
    }

    /// The status line and body of `GET path` on a stream.
    fn get_on(s: &mut impl ReadWrite, path: &str) -> io::Result<(u16, String)> {
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )?;
        s.flush()?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => reply.extend_from_slice(&buf[..n]),
                // No close_notify after the reply is not our concern.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !reply.is_empty() => break,
                Err(e) => return Err(e),
            }
        }
        let reply = String::from_utf8_lossy(&reply).into_owned();
        let status = reply
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no status in {reply:?}")))?;
        let body = reply
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        Ok((status, body))
    }

    trait ReadWrite: Read + Write {}
    impl<T: Read + Write> ReadWrite for T {}

    /// `GET path` on an `https://` door.
    fn https_get(uri: &str, cfg: Arc<ClientConfig>, path: &str) -> io::Result<u16> {
        let (mut s, _) = connect(uri, cfg)?;
        get_on(&mut s, path).map(|(status, _)| status)
    }

    fn start(files: Option<ServerTlsFiles>, grpc: &[&str], http: &[&str]) -> FrontDoors {
        FrontDoors::start(
            core(),
            DoorsConfig {
                grpc: grpc.iter().map(|u| u.to_string()).collect(),
                http: http.iter().map(|u| u.to_string()).collect(),
                tls: files,
                ..DoorsConfig::default()
            },
        )
        .expect("start")
    }

    #[test]
    fn tls_doors_without_files_or_with_bad_ones_are_named() {
        for (grpc, http) in [
            (vec!["grpcs://127.0.0.1:0"], vec![]),
            (vec!["grpc://127.0.0.1:0"], vec!["https://127.0.0.1:0"]),
        ] {
            let uri = grpc
                .iter()
                .chain(&http)
                .find(|u| u.contains("s://"))
                .expect("tls");
            let e = FrontDoors::start(
                core(),
                DoorsConfig {
                    grpc: grpc.iter().map(|u| u.to_string()).collect(),
                    http: http.iter().map(|u| u.to_string()).collect(),
                    ..DoorsConfig::default()
                },
            )
            .expect_err("no TLS files")
            .to_string();
            assert!(e.contains(uri), "{e}");
            assert!(e.contains("--tls-cert FILE --tls-key FILE"), "{e}");
        }
        let e = GrpcFrontend::start("grpcs://127.0.0.1:0", crate::FrontDoor::new(core()))
            .expect_err("no TLS files")
            .to_string();
        assert!(e.contains("--tls-cert"), "{e}");
        let e = HttpFrontend::start("https://127.0.0.1:0", crate::FrontDoor::new(core()))
            .expect_err("no TLS files")
            .to_string();
        assert!(e.contains("--tls-cert"), "{e}");

        let dir = tempfile::tempdir().expect("tempdir");
        let pki = make_pki(dir.path());
        let missing = dir.path().join("missing.pem");
        for files in [
            ServerTlsFiles {
                cert: missing.clone(),
                ..pki.server.clone()
            },
            ServerTlsFiles {
                key: missing.clone(),
                ..pki.server.clone()
            },
            ServerTlsFiles {
                client_ca: Some(missing.clone()),
                ..pki.server.clone()
            },
        ] {
            let e = FrontDoors::start(
                core(),
                DoorsConfig {
                    http: vec!["https://127.0.0.1:0".into()],
                    tls: Some(files),
                    ..DoorsConfig::default()
                },
            )
            .expect_err("a missing file")
            .to_string();
            assert!(e.contains("https://127.0.0.1:0"), "{e}");
            assert!(e.contains(&missing.display().to_string()), "{e}");
        }
        // A key of another certificate.
        let e = HttpFrontend::start_with(
            "https://127.0.0.1:0",
            crate::FrontDoor::new(core()),
            Some(&ServerTlsFiles {
                key: pki.client_key.clone(),
                ..pki.server.clone()
            }),
        )
        .expect_err("a key that does not fit")
        .to_string();
        assert!(e.contains("does not fit"), "{e}");
        // Clear-text doors do not read the files at all.
        let plain = start(
            Some(ServerTlsFiles {
                cert: missing,
                ..pki.server
            }),
            &["grpc://127.0.0.1:0"],
            &["http://127.0.0.1:0"],
        );
        plain.shutdown();
    }

    #[test]
    fn tls_doors_may_listen_beyond_loopback_without_insecure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = make_pki(dir.path());
        let doors = start(
            Some(pki.server.clone()),
            &["grpcs://0.0.0.0:0"],
            &["https://0.0.0.0:0"],
        );
        let uris = doors.uris();
        assert!(uris[0].starts_with("grpcs://0.0.0.0:"), "{uris:?}");
        assert!(uris[1].starts_with("https://0.0.0.0:"), "{uris:?}");
        doors.shutdown();
        // A clear-text door beside them still needs insecure.
        let e = FrontDoors::start(
            core(),
            DoorsConfig {
                grpc: vec!["grpcs://0.0.0.0:0".into()],
                http: vec!["http://0.0.0.0:0".into()],
                tls: Some(pki.server),
                ..DoorsConfig::default()
            },
        )
        .expect_err("clear text beyond loopback")
        .to_string();
        assert!(
            e.contains("http://0.0.0.0:0") && e.contains("--insecure"),
            "{e}"
        );
    }

    #[test]
    fn doors_serve_over_tls_and_refuse_strangers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = make_pki(dir.path());
        let other_dir = tempfile::tempdir().expect("tempdir");
        let other = pki_ca(other_dir.path());
        let doors = start(
            Some(pki.server.clone()),
            &["grpcs://127.0.0.1:0"],
            &["https://127.0.0.1:0"],
        );
        let (grpcs, https) = (doors.uris()[0].to_string(), doors.uris()[1].to_string());
        assert!(grpcs.starts_with("grpcs://127.0.0.1:") && https.starts_with("https://127.0.0.1:"));
        // HTTP/1.1 over TLS, ALPN http/1.1.
        let (mut s, alpn) = connect(&https, client(&pki.ca, None, b"http/1.1")).expect("connect");
        assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
        assert_eq!(get_on(&mut s, "/v2/health/ready").expect("get").0, 200);
        // gRPC's door speaks h2 (ALPN), as gRPC clients require.
        let (_, alpn) = connect(&grpcs, client(&pki.ca, None, b"h2")).expect("connect");
        assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
        // A client trusting another CA refuses the agent.
        for (uri, alpn) in [(&grpcs, &b"h2"[..]), (&https, &b"http/1.1"[..])] {
            let e = connect(uri, client(&other, None, alpn)).expect_err("untrusted");
            assert!(e.to_string().contains("UnknownIssuer"), "{e}");
        }
        // Plain-text HTTP to the https door: a 400 saying why.
        let mut plain = TcpStream::connect(addr(&https)).expect("connect");
        plain
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let (status, body) = get_on(&mut plain, "/v2/health/ready").expect("reply");
        assert_eq!(status, 400);
        assert!(body.contains("this door speaks HTTPS"), "{body}");
        // Plain-text bytes to the grpcs door: closed.
        let mut plain = TcpStream::connect(addr(&grpcs)).expect("connect");
        plain
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        plain
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .expect("write");
        let mut b = [0u8; 16];
        assert!(matches!(plain.read(&mut b), Ok(0) | Err(_)));
        // Still serving.
        assert_eq!(
            https_get(
                &https,
                client(&pki.ca, None, b"http/1.1"),
                "/v2/health/live"
            )
            .expect("get"),
            200
        );
        doors.shutdown();
        for uri in [&grpcs, &https] {
            assert!(TcpStream::connect(addr(uri)).is_err(), "{uri} still open");
        }
    }

    /// Another CA's certificate file (a stranger to the agent's).
    fn pki_ca(dir: &Path) -> PathBuf {
        make_pki(dir).ca
    }

    #[test]
    fn a_client_that_never_handshakes_holds_up_nobody() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = make_pki(dir.path());
        let doors = start(Some(pki.server.clone()), &[], &["https://127.0.0.1:0"]);
        let https = doors.uris()[0].to_string();
        // One says nothing, one starts a record and stops.
        let silent = TcpStream::connect(addr(&https)).expect("connect");
        let mut stalled = TcpStream::connect(addr(&https)).expect("connect");
        stalled.write_all(&[0x16, 0x03, 0x01]).expect("write");
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(
                https_get(
                    &https,
                    client(&pki.ca, None, b"http/1.1"),
                    "/v2/health/ready"
                )
                .expect("get"),
                200
            );
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        drop((silent, stalled));
        doors.shutdown();
    }

    #[test]
    fn a_client_ca_makes_client_certificates_required() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = make_pki(dir.path());
        let other_dir = tempfile::tempdir().expect("tempdir");
        let stranger = make_pki(other_dir.path());
        let files = ServerTlsFiles {
            client_ca: Some(pki.ca.clone()),
            ..pki.server.clone()
        };
        let doors = start(
            Some(files),
            &["grpcs://127.0.0.1:0"],
            &["https://127.0.0.1:0"],
        );
        let https = doors.uris()[1].to_string();
        let with_cert = client(
            &pki.ca,
            Some((&pki.client_cert, &pki.client_key)),
            b"http/1.1",
        );
        assert_eq!(
            https_get(&https, with_cert, "/v2/health/ready").expect("get"),
            200
        );
        // No certificate, or one of another CA: the handshake fails (with
        // TLS 1.3 the client learns it after its own side is done).
        for cfg in [
            client(&pki.ca, None, b"http/1.1"),
            client(
                &pki.ca,
                Some((&stranger.client_cert, &stranger.client_key)),
                b"http/1.1",
            ),
        ] {
            // The alert, or a closed socket if it came first.
            https_get(&https, cfg, "/v2/health/ready").expect_err("refused");
        }
        let grpcs = doors.uris()[0].to_string();
        let (_, alpn) = connect(
            &grpcs,
            client(&pki.ca, Some((&pki.client_cert, &pki.client_key)), b"h2"),
        )
        .expect("connect");
        assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
        doors.shutdown();
    }
}
