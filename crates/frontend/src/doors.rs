//! [`FrontDoors`]: every standard front door of one agent, started and
//! stopped as one thing.
//!
//! It owns what an agent's KServe v2 side is made of: the model repository
//! and its poller (when the agent serves one), the one [`FrontDoor`] every
//! listener shares, the gRPC ([`GrpcFrontend`]) and HTTP
//! ([`HttpFrontend`]) listeners, and the metrics-only listener
//! ([`MetricsListener`]). It does not own the agent: it runs over the
//! agent's [`AgentCore`], and whoever started the agent stops it, in the
//! order [`FrontDoors::shutdown_with`] keeps (doors not-ready, repository
//! polling stopped, agent drained, then the doors closed).
//!
//! [`split_listen`] sorts a `listen` list (command-line flags, the TOML
//! file's `listen`, the Python `Agent(listen=...)`) into the agent's own
//! endpoints and the front doors, checking every URI before anything
//! starts. `tensorwire serve` and the Python `Agent` both go through these
//! two, so the doors behave the same wherever they are asked for.

use crate::door::FrontDoor;
use crate::http::{parse_http_uri, HttpFrontend, HTTP_SCHEME};
use crate::metrics::{parse_metrics_uri, MetricsListener};
use crate::repository::{Poller, Repository, RepositoryOptions};
use crate::server::{parse_grpc_uri, FrontendError, GrpcFrontend};
use crate::tls::{needs_files, DoorTls, GRPCS_SCHEME, HTTPS_SCHEME};
use crate::GRPC_SCHEME;
use server::config::{is_tls_front_door, parse_listen, Listen};
use server::dispatch::AgentCore;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use transport::tls::ServerTlsFiles;
use transport::Endpoint;

/// A `listen` list sorted by scheme ([`split_listen`]); every URI checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitListen {
    /// The agent's own endpoints (`unix://`, `tcp://`, `shm://`,
    /// `inproc://`), for `AgentConfig::listen`.
    pub endpoints: Vec<Endpoint>,
    /// The gRPC front doors (`grpc://HOST:PORT`, and `grpcs://HOST:PORT`
    /// over TLS), as given.
    pub grpc: Vec<String>,
    /// The HTTP/REST front doors (`http://HOST:PORT`, and
    /// `https://HOST:PORT` over TLS), as given.
    pub http: Vec<String>,
}

/// Sorts `listen` URIs into the agent's own endpoints and the KServe front
/// doors, by scheme, in order. Each front door is checked
/// ([`parse_grpc_uri`], [`parse_http_uri`]) and each endpoint parsed; the
/// first bad URI is the error, and names it.
pub fn split_listen<I, S>(listen: I) -> Result<SplitListen, FrontendError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out = SplitListen::default();
    for uri in listen {
        match parse_listen(uri.as_ref())? {
            Listen::Endpoint(ep) => out.endpoints.push(ep),
            Listen::FrontDoor(uri)
                if uri.starts_with(GRPC_SCHEME) || uri.starts_with(GRPCS_SCHEME) =>
            {
                parse_grpc_uri(&uri)?;
                out.grpc.push(uri);
            }
            Listen::FrontDoor(uri)
                if uri.starts_with(HTTP_SCHEME) || uri.starts_with(HTTPS_SCHEME) =>
            {
                parse_http_uri(&uri)?;
                out.http.push(uri);
            }
            Listen::FrontDoor(uri) => {
                return Err(FrontendError::BadAddress {
                    reason: "no front door of this build serves that scheme \
                             (grpc://HOST:PORT, grpcs://HOST:PORT, http://HOST:PORT, \
                             https://HOST:PORT)"
                        .into(),
                    uri,
                })
            }
        }
    }
    Ok(out)
}

/// What [`FrontDoors::start`] opens.
#[derive(Clone, Debug, Default)]
pub struct DoorsConfig {
    /// gRPC front doors, `grpc://HOST:PORT`, or `grpcs://HOST:PORT` over
    /// TLS (port 0 picks a free one).
    pub grpc: Vec<String>,
    /// HTTP/REST front doors, `http://HOST:PORT`, or `https://HOST:PORT`
    /// over TLS.
    pub http: Vec<String>,
    /// A metrics-only listener, `http://HOST:PORT` (`GET /metrics`; every
    /// HTTP front door serves it too).
    pub metrics: Option<String>,
    /// A model repository to serve (opened over the agent's registry; its
    /// models load before any door opens).
    pub repository: Option<RepositoryOptions>,
    /// Allows clear-text gRPC and HTTP doors (`grpc://`, `http://`) on
    /// addresses other than loopback. Off, such a door is refused at
    /// start, since its tokens and tensors would cross the network in
    /// clear text (`AgentConfig::insecure`). TLS doors need no `insecure`
    /// to listen anywhere; nor does the metrics listener, which carries
    /// neither.
    pub insecure: bool,
    /// The agent's certificate, key and optional client CA, for the
    /// `grpcs://` and `https://` doors (`AgentConfig::tls`, the same
    /// settings as the agent's `tls://` endpoints). A TLS door without it
    /// is refused at start; the clear-text doors do not use it.
    pub tls: Option<ServerTlsFiles>,
}

/// The running front doors of one agent (module docs).
///
/// Dropping it without [`shutdown`](FrontDoors::shutdown) stops everything
/// it started the same way. Either must happen outside any tokio runtime.
#[derive(Debug)]
pub struct FrontDoors {
    // Fields drop in this order: polling stops before the doors close.
    poller: Mutex<Option<Poller>>,
    grpc: Vec<GrpcFrontend>,
    http: Vec<HttpFrontend>,
    metrics: Option<MetricsListener>,
    door: Arc<FrontDoor>,
}

impl FrontDoors {
    /// Opens `cfg.repository` over `core` (loading the models it serves at
    /// start), then starts every gRPC door, every HTTP door and the
    /// metrics listener. Every URI is checked before anything starts; on
    /// any failure whatever was started is stopped again (models a
    /// repository loaded stay in the registry: the caller stops the agent)
    /// and the error names the URI or model at fault.
    pub fn start(core: Arc<AgentCore>, cfg: DoorsConfig) -> Result<FrontDoors, FrontendError> {
        for uri in &cfg.grpc {
            parse_grpc_uri(uri)?;
        }
        for uri in &cfg.http {
            parse_http_uri(uri)?;
        }
        if !cfg.insecure {
            for uri in cfg
                .grpc
                .iter()
                .chain(&cfg.http)
                .filter(|u| !is_tls_front_door(u))
            {
                let hostport = uri.split_once("://").map_or("", |(_, r)| r);
                if !server::config::is_loopback(hostport.split('/').next().unwrap_or("")) {
                    return Err(FrontendError::BadAddress {
                        uri: uri.clone(),
                        reason: "it listens beyond this machine in clear text: tokens and \
                                 tensors would cross the network unencrypted. Use grpcs:// or \
                                 https:// with --tls-cert FILE --tls-key FILE, listen on \
                                 127.0.0.1 (behind a TLS proxy), or give --insecure (TOML \
                                 [access] insecure = true) on a network you trust"
                            .into(),
                    });
                }
            }
        }
        // Every TLS door has the agent's files, read once (before anything
        // starts: a file that cannot be used names itself and the door).
        let mut tls = None;
        for uri in cfg.grpc.iter().chain(&cfg.http) {
            if is_tls_front_door(uri) && tls.is_none() {
                let files = cfg.tls.as_ref().ok_or_else(|| needs_files(uri))?;
                tls = Some(DoorTls::new(uri, files)?);
            }
        }
        if let Some(uri) = &cfg.metrics {
            parse_metrics_uri(uri)?;
        }
        let repository = match cfg.repository {
            None => None,
            Some(opts) => Some(Repository::open(opts, core.clone())?),
        };
        let poller = repository.as_ref().and_then(|r| r.start_polling());
        // One front-door state for every KServe listener, as Triton has
        // one server behind its HTTP and gRPC endpoints.
        let mut doors = FrontDoors {
            poller: Mutex::new(poller),
            grpc: Vec::with_capacity(cfg.grpc.len()),
            http: Vec::with_capacity(cfg.http.len()),
            metrics: None,
            door: FrontDoor::with_repository(core.clone(), repository),
        };
        // On an error `doors` drops, which stops what is in it.
        for uri in &cfg.grpc {
            doors.grpc.push(GrpcFrontend::start_door(
                uri,
                doors.door.clone(),
                tls.as_ref(),
            )?);
        }
        for uri in &cfg.http {
            doors.http.push(HttpFrontend::start_door(
                uri,
                doors.door.clone(),
                tls.as_ref(),
            )?);
        }
        if let Some(uri) = &cfg.metrics {
            doors.metrics = Some(MetricsListener::start(uri, core)?);
        }
        Ok(doors)
    }

    /// The URIs the doors listen on, gRPC ones first, each with the port
    /// it was given for port 0.
    pub fn uris(&self) -> Vec<&str> {
        let grpc = self.grpc.iter().map(GrpcFrontend::uri);
        grpc.chain(self.http.iter().map(HttpFrontend::uri))
            .collect()
    }

    /// The metrics listener's URI (the real port for port 0), if one runs.
    pub fn metrics_uri(&self) -> Option<&str> {
        self.metrics.as_ref().map(MetricsListener::uri)
    }

    /// The state the doors share (core, shared-memory regions, repository).
    pub fn door(&self) -> &Arc<FrontDoor> {
        &self.door
    }

    /// Shutdown has begun: every door answers not-ready from now on
    /// (`ServerReady` false, `/v2/health/ready` 503; liveness stays), and
    /// the repository is no longer polled. Call it before the agent
    /// drains, so an orchestrator stops sending work first.
    pub fn set_not_ready(&self) {
        for d in &self.grpc {
            d.set_not_ready();
        }
        for d in &self.http {
            d.set_not_ready();
        }
        let poller = self.poller.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(poller);
    }

    /// Closes every door (calls in flight get up to 5 s to finish), then
    /// the metrics listener. Call it after the agent drained.
    pub fn shutdown(self) {
        self.set_not_ready();
        let FrontDoors {
            grpc,
            http,
            metrics,
            ..
        } = self;
        for d in grpc {
            d.shutdown();
        }
        for d in http {
            d.shutdown();
        }
        if let Some(m) = metrics {
            m.shutdown();
        }
    }

    /// Stops `agent` and these doors in order: the doors say not-ready
    /// and repository polling stops; the agent refuses new requests (gRPC
    /// callers get UNAVAILABLE, HTTP ones 503) and gives those in flight,
    /// front-door ones included, up to `grace`; then the doors send their
    /// last responses and close. Returns the requests left unfinished.
    pub fn shutdown_with(self, agent: server::Agent, grace: Duration) -> usize {
        self.set_not_ready();
        let unfinished = agent.shutdown(grace);
        self.shutdown();
        unfinished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{http_status as get, identity_core as core};
    use std::net::TcpStream;

    fn refuses(uri: &str) -> bool {
        let addr = uri.split_once("://").map_or(uri, |(_, a)| a);
        TcpStream::connect(addr).is_err()
    }

    #[test]
    fn listen_lists_split_by_scheme() {
        let s = split_listen([
            "unix:///tmp/x.sock",
            "grpc://127.0.0.1:0",
            "shm://a",
            "http://[::1]:8000",
            "http://localhost:0",
        ])
        .expect("all good");
        assert_eq!(
            s.endpoints,
            vec![
                Endpoint::Unix("/tmp/x.sock".into()),
                Endpoint::Shm("a".into())
            ]
        );
        assert_eq!(s.grpc, ["grpc://127.0.0.1:0"]);
        assert_eq!(s.http, ["http://[::1]:8000", "http://localhost:0"]);
        assert_eq!(
            split_listen(Vec::<String>::new()).expect("empty"),
            SplitListen::default()
        );
    }

    #[test]
    fn bad_listen_uris_are_named() {
        for (bad, needle) in [
            ("grpc://nohost", "port"),
            ("http://h:1/v2", "path"),
            ("grpc://:1", "port"),
            ("https://h:1/v2", "path"),
            ("grpcs://h", "port"),
            ("ftp://h:1", "unknown scheme"),
            ("tcp://h", "port"),
            ("nothing", "SCHEME://"),
        ] {
            let e = split_listen(["shm://fine", bad])
                .expect_err(bad)
                .to_string();
            assert!(e.contains(bad), "{bad}: {e}");
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn doors_start_answer_and_stop_in_order() {
        let core = core();
        let doors = FrontDoors::start(
            core.clone(),
            DoorsConfig {
                grpc: vec!["grpc://127.0.0.1:0".into()],
                http: vec!["http://127.0.0.1:0".into(), "http://127.0.0.1:0".into()],
                metrics: Some("http://127.0.0.1:0".into()),
                repository: None,
                insecure: false,
                tls: None,
            },
        )
        .expect("start");
        let uris: Vec<String> = doors.uris().iter().map(|u| u.to_string()).collect();
        assert_eq!(uris.len(), 3);
        assert!(uris[0].starts_with("grpc://127.0.0.1:"), "{uris:?}");
        assert!(uris[1..].iter().all(|u| u.starts_with("http://127.0.0.1:")));
        assert!(uris.iter().all(|u| !u.ends_with(":0")), "{uris:?}");
        let metrics = doors.metrics_uri().expect("metrics").to_string();
        assert!(!metrics.ends_with(":0"));
        assert!(Arc::ptr_eq(doors.door().core(), &core));
        for u in &uris[1..] {
            assert_eq!(get(u, "/v2/health/ready"), 200);
        }
        assert_eq!(get(&metrics, "/metrics"), 200);
        doors.set_not_ready();
        for u in &uris[1..] {
            assert_eq!(get(u, "/v2/health/ready"), 503);
            assert_eq!(get(u, "/v2/health/live"), 200);
        }
        doors.shutdown();
        for u in uris.iter().chain([&metrics]) {
            assert!(refuses(u), "{u} still accepts connections");
        }
    }

    #[test]
    fn doors_beyond_loopback_need_insecure() {
        for uri in ["grpc://0.0.0.0:0", "http://[::]:0", "http://10.1.2.3:0"] {
            let (grpc, http) = if uri.starts_with("grpc") {
                (vec![uri.to_string()], vec![])
            } else {
                (vec![], vec![uri.to_string()])
            };
            let e = FrontDoors::start(
                core(),
                DoorsConfig {
                    grpc,
                    http,
                    ..DoorsConfig::default()
                },
            )
            .expect_err("refused without insecure");
            assert!(e.to_string().contains("--insecure"), "{e}");
        }
        let open = FrontDoors::start(
            core(),
            DoorsConfig {
                http: vec!["http://0.0.0.0:0".into()],
                insecure: true,
                ..DoorsConfig::default()
            },
        )
        .expect("insecure allows it");
        open.shutdown();
    }

    #[test]
    fn a_failed_start_stops_what_it_started() {
        // A port that is taken: the second HTTP door cannot bind it.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let busy = format!("http://{}", taken.local_addr().expect("addr"));
        // Find the ports the first doors would get by starting them alone.
        let first = FrontDoors::start(
            core(),
            DoorsConfig {
                grpc: vec!["grpc://127.0.0.1:0".into()],
                ..DoorsConfig::default()
            },
        )
        .expect("start");
        let grpc = first.uris()[0].to_string();
        first.shutdown();
        assert!(refuses(&grpc));
        // Now the same port again, then one that is busy.
        let e = FrontDoors::start(
            core(),
            DoorsConfig {
                grpc: vec![grpc.clone()],
                http: vec![busy.clone()],
                ..DoorsConfig::default()
            },
        )
        .expect_err("the busy port");
        assert!(e.to_string().contains(&busy), "{e}");
        assert!(refuses(&grpc), "the gRPC door it started is stopped again");
        // A bad URI anywhere: nothing starts at all.
        let e = FrontDoors::start(
            core(),
            DoorsConfig {
                grpc: vec![grpc.clone()],
                metrics: Some("http://nohost".into()),
                ..DoorsConfig::default()
            },
        )
        .expect_err("bad metrics URI");
        assert!(e.to_string().contains("http://nohost"), "{e}");
        assert!(refuses(&grpc));
    }
}
