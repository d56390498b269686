//! [`Endpoint`]: a parsed transport URI.

use crate::error::TransportError;
use crate::tls::TlsClientParams;
use std::fmt;
use std::path::PathBuf;

/// Where to listen or connect, parsed from a URI.
///
/// # Examples
///
/// ```
/// use transport::Endpoint;
/// let ep: Endpoint = "tcp://127.0.0.1:7070?nodelay=0".parse()?;
/// match &ep {
///     Endpoint::Tcp { addr, nodelay } => assert_eq!((addr.as_str(), *nodelay), ("127.0.0.1:7070", false)),
///     other => panic!("expected tcp, got {other}"),
/// }
/// assert_eq!(ep.to_string(), "tcp://127.0.0.1:7070?nodelay=0");
/// # Ok::<(), transport::TransportError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `inproc://name`: an agent in this process (`inproc://` = name "default").
    Inproc(String),
    /// `unix:///path/to.sock` (or `unix://relative.sock`).
    Unix(PathBuf),
    /// `shm://name`: a shared-memory session, bootstrapped over the control
    /// socket [`crate::shm::control_path`]`(name)`. A client's
    /// `?mover=auto|memcpy|nt|kernel|zero` is checked here and read with
    /// [`mover_param`] (the endpoint itself is the same whatever the mover).
    Shm(String),
    /// `tcp://host:port[?nodelay=0|1]`.
    Tcp {
        /// `host:port` (`[::1]:port` for IPv6).
        addr: String,
        /// Whether `TCP_NODELAY` is set (default true).
        nodelay: bool,
    },
    /// `tls://host:port[?nodelay=0][&ca=PATH&cert=PATH&key=PATH&name=HOST]`:
    /// tcp carrying TLS ([`crate::tls`]). The parameters after `nodelay`
    /// are a client's; an agent's certificate comes from its own settings.
    Tls {
        /// `host:port` (`[::1]:port` for IPv6).
        addr: String,
        /// Whether `TCP_NODELAY` is set (default true).
        nodelay: bool,
        /// The client's trust, certificate and expected server name.
        client: TlsClientParams,
    },
    /// `vsock://CID:PORT`: a stream over `AF_VSOCK`, between a VM and its
    /// host ([`crate::vsock`]). CID `-1` or `any` ([`crate::vsock::CID_ANY`],
    /// listeners only), `host` (2), `local` (1) or a number; port a number
    /// (`-1` or `any`: one the kernel picks, listeners only).
    Vsock {
        /// The context id: which machine.
        cid: u32,
        /// The port on it.
        port: u32,
    },
}

impl Endpoint {
    /// Parses a URI. Unknown schemes, empty paths, missing ports and unknown
    /// query parameters are errors that say what is wrong.
    ///
    /// # Examples
    ///
    /// ```
    /// use transport::{Endpoint, TransportError};
    /// assert_eq!(Endpoint::parse("unix:///run/tw.sock")?, Endpoint::Unix("/run/tw.sock".into()));
    /// assert_eq!(Endpoint::parse("shm://agent")?, Endpoint::Shm("agent".into()));
    /// assert_eq!(Endpoint::parse("inproc://local")?, Endpoint::Inproc("local".into()));
    /// // Errors say what is wrong.
    /// match Endpoint::parse("tcp://127.0.0.1") {
    ///     Err(e @ TransportError::BadUri { .. }) => println!("{e}"),
    ///     other => panic!("expected a bad URI, got {other:?}"),
    /// }
    /// assert!(Endpoint::parse("rdma://x").is_err());
    /// assert!(Endpoint::parse("unix:///tmp/a.sock?colour=red").is_err());
    /// # Ok::<(), TransportError>(())
    /// ```
    pub fn parse(uri: &str) -> Result<Endpoint, TransportError> {
        let bad = |reason: &str| TransportError::BadUri {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = uri.split_once("://").ok_or_else(|| {
            bad("expected SCHEME://..., e.g. unix:///tmp/tw.sock or tcp://127.0.0.1:7070")
        })?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let params = parse_query(query).map_err(|r| bad(&r))?;
        let no_params = |params: &[(String, String)]| {
            if let Some((k, _)) = params.first() {
                Err(bad(&format!("unknown parameter '{k}' for {scheme}://")))
            } else {
                Ok(())
            }
        };
        match scheme {
            "inproc" => {
                no_params(&params)?;
                if rest.contains('/') {
                    return Err(bad("in-process names cannot contain '/'"));
                }
                Ok(Endpoint::Inproc(if rest.is_empty() {
                    "default".into()
                } else {
                    rest.into()
                }))
            }
            "unix" => {
                no_params(&params)?;
                if rest.is_empty() {
                    return Err(bad("missing socket path, e.g. unix:///tmp/tensorwire.sock"));
                }
                if rest.len() > 107 {
                    return Err(bad(
                        "socket path longer than 107 bytes (the sun_path limit)",
                    ));
                }
                Ok(Endpoint::Unix(PathBuf::from(rest)))
            }
            "tcp" | "tls" => {
                let mut nodelay = true;
                let mut client = TlsClientParams::default();
                for (k, v) in &params {
                    match (scheme, k.as_str(), v.as_str()) {
                        (_, "nodelay", "1" | "true") => nodelay = true,
                        (_, "nodelay", "0" | "false") => nodelay = false,
                        (_, "nodelay", v) => {
                            return Err(bad(&format!("nodelay must be 0 or 1, not '{v}'")))
                        }
                        ("tls", "ca", v) => client.ca = Some(PathBuf::from(v)),
                        ("tls", "cert", v) => client.cert = Some(PathBuf::from(v)),
                        ("tls", "key", v) => client.key = Some(PathBuf::from(v)),
                        ("tls", "name", v) => client.name = Some(v.to_string()),
                        (_, k, _) => {
                            return Err(bad(&format!("unknown parameter '{k}' for {scheme}://")))
                        }
                    }
                }
                if params.iter().any(|(_, v)| v.is_empty()) {
                    return Err(bad("a parameter has an empty value"));
                }
                if client.cert.is_some() != client.key.is_some() {
                    return Err(bad("a client certificate needs both cert= and key="));
                }
                let (host, port) = rest
                    .rsplit_once(':')
                    .ok_or_else(|| bad(&format!("missing port, e.g. {scheme}://127.0.0.1:7070")))?;
                if host.is_empty() {
                    return Err(bad(&format!(
                        "missing host, e.g. {scheme}://127.0.0.1:7070"
                    )));
                }
                port.parse::<u16>()
                    .map_err(|_| bad(&format!("port '{port}' is not a number from 0 to 65535")))?;
                let addr = rest.to_string();
                Ok(if scheme == "tls" {
                    Endpoint::Tls {
                        addr,
                        nodelay,
                        client,
                    }
                } else {
                    Endpoint::Tcp { addr, nodelay }
                })
            }
            "shm" => {
                for (k, v) in &params {
                    if k != "mover" {
                        return Err(bad(&format!("unknown parameter '{k}' for shm://")));
                    }
                    v.parse::<crate::mover::MoverChoice>()
                        .map_err(|e| bad(&e))?;
                }
                if rest.is_empty()
                    || rest.len() > 64
                    || !rest
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                {
                    return Err(bad(
                        "shm names are 1..=64 characters of [A-Za-z0-9._-], e.g. shm://agent",
                    ));
                }
                Ok(Endpoint::Shm(rest.to_string()))
            }
            "vsock" => {
                no_params(&params)?;
                let (cid, port) = rest.rsplit_once(':').ok_or_else(|| {
                    bad("missing port, e.g. vsock://2:5000 (CID 2 = the host) or \
                         vsock://-1:5000 to listen on any CID")
                })?;
                let number = |what: &str, s: &str| -> Result<u32, TransportError> {
                    match s {
                        "-1" | "any" => Ok(u32::MAX),
                        "" => Err(bad(&format!("missing {what}, e.g. vsock://2:5000"))),
                        n => n.parse::<u32>().map_err(|_| {
                            bad(&format!(
                                "{what} '{n}' is not a number from 0 to 4294967295 (or -1/any{})",
                                if what == "CID" { ", host, local" } else { "" }
                            ))
                        }),
                    }
                };
                let cid = match cid {
                    "host" => crate::vsock::CID_HOST,
                    "local" => crate::vsock::CID_LOCAL,
                    c => number("CID", c)?,
                };
                let port = number("port", port)?;
                Ok(Endpoint::Vsock { cid, port })
            }
            other => Err(bad(&format!(
                "unknown scheme '{other}' (known: inproc, unix, tcp, tls, shm, vsock)"
            ))),
        }
    }
}

/// The `mover=` parameter of a `shm://` URI (`shm://name?mover=nt`):
/// which data mover the client uses to put tensors into the arena
/// ([`crate::mover`]); `auto` when absent. Call after [`Endpoint::parse`]
/// accepted the URI (an invalid value here is also taken as `auto`).
///
/// # Examples
///
/// ```
/// use transport::mover::MoverChoice;
/// use transport::{mover_param, Endpoint};
/// let uri = "shm://agent?mover=memcpy";
/// Endpoint::parse(uri)?; // checked first
/// assert_eq!(mover_param(uri), "memcpy".parse::<MoverChoice>()?);
/// assert_eq!(mover_param("shm://agent"), MoverChoice::Auto);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn mover_param(uri: &str) -> crate::mover::MoverChoice {
    uri.split_once('?')
        .and_then(|(_, q)| {
            q.rsplit('&')
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| *k == "mover")
                .and_then(|(_, v)| v.parse().ok())
        })
        .unwrap_or_default()
}

fn parse_query(q: Option<&str>) -> Result<Vec<(String, String)>, String> {
    let Some(q) = q else { return Ok(Vec::new()) };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| format!("parameter '{p}' has no value (use key=value)"))
        })
        .collect()
}

impl std::str::FromStr for Endpoint {
    type Err = TransportError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Endpoint::parse(s)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Inproc(n) => write!(f, "inproc://{n}"),
            Endpoint::Unix(p) => write!(f, "unix://{}", p.display()),
            Endpoint::Shm(n) => write!(f, "shm://{n}"),
            Endpoint::Vsock { cid, port } => write!(
                f,
                "vsock://{}",
                crate::vsock::VsockAddr {
                    cid: *cid,
                    port: *port
                }
            ),
            Endpoint::Tcp {
                addr,
                nodelay: true,
            } => write!(f, "tcp://{addr}"),
            Endpoint::Tcp {
                addr,
                nodelay: false,
            } => write!(f, "tcp://{addr}?nodelay=0"),
            Endpoint::Tls {
                addr,
                nodelay,
                client,
            } => {
                write!(f, "tls://{addr}")?;
                let mut sep = '?';
                let mut param = |f: &mut fmt::Formatter<'_>, k: &str, v: &dyn fmt::Display| {
                    let r = write!(f, "{sep}{k}={v}");
                    sep = '&';
                    r
                };
                if !nodelay {
                    param(f, "nodelay", &0)?;
                }
                for (k, v) in [
                    ("ca", &client.ca),
                    ("cert", &client.cert),
                    ("key", &client.key),
                ] {
                    if let Some(v) = v {
                        param(f, k, &v.display())?;
                    }
                }
                if let Some(n) = &client.name {
                    param(f, "name", n)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_schemes() {
        assert_eq!(
            Endpoint::parse("inproc://").unwrap(),
            Endpoint::Inproc("default".into())
        );
        assert_eq!(
            Endpoint::parse("inproc://a").unwrap(),
            Endpoint::Inproc("a".into())
        );
        assert_eq!(
            Endpoint::parse("unix:///tmp/x.sock").unwrap(),
            Endpoint::Unix("/tmp/x.sock".into())
        );
        assert_eq!(
            Endpoint::parse("tcp://127.0.0.1:7070").unwrap(),
            Endpoint::Tcp {
                addr: "127.0.0.1:7070".into(),
                nodelay: true
            }
        );
        assert_eq!(
            Endpoint::parse("tcp://[::1]:1?nodelay=0").unwrap(),
            Endpoint::Tcp {
                addr: "[::1]:1".into(),
                nodelay: false
            }
        );
        assert_eq!(
            Endpoint::parse("shm://agent-1").unwrap(),
            Endpoint::Shm("agent-1".into())
        );
        assert!(Endpoint::parse("shm://a/b").is_err());
        assert_eq!(
            Endpoint::parse("shm://a?mover=nt").unwrap(),
            Endpoint::Shm("a".into())
        );
        assert_eq!(mover_param("shm://a?mover=nt").to_string(), "nt");
        assert_eq!(mover_param("shm://a").to_string(), "auto");
        assert!(Endpoint::parse("shm://").is_err());
        for s in [
            "shm://x",
            "inproc://a",
            "unix:///tmp/x.sock",
            "tcp://h:1",
            "tcp://h:1?nodelay=0",
            "tls://h:1",
            "tls://h:1?nodelay=0&ca=/a/ca.pem&cert=c.pem&key=c.key&name=agent.local",
        ] {
            assert_eq!(Endpoint::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn parses_vsock() {
        let v = |cid, port| Endpoint::Vsock { cid, port };
        for (uri, want, shown) in [
            ("vsock://2:5000", v(2, 5000), "vsock://2:5000"),
            ("vsock://host:5000", v(2, 5000), "vsock://2:5000"),
            ("vsock://local:7", v(1, 7), "vsock://1:7"),
            ("vsock://-1:5000", v(u32::MAX, 5000), "vsock://-1:5000"),
            ("vsock://any:5000", v(u32::MAX, 5000), "vsock://-1:5000"),
            (
                "vsock://4294967295:5000",
                v(u32::MAX, 5000),
                "vsock://-1:5000",
            ),
            ("vsock://-1:any", v(u32::MAX, u32::MAX), "vsock://-1:-1"),
            ("vsock://3:0", v(3, 0), "vsock://3:0"),
        ] {
            let ep = Endpoint::parse(uri).unwrap();
            assert_eq!(ep, want, "{uri}");
            assert_eq!(ep.to_string(), shown, "{uri}");
            assert_eq!(Endpoint::parse(shown).unwrap(), want, "{shown}");
        }
    }

    #[test]
    fn rejects_bad_uris_clearly() {
        for (uri, needle) in [
            ("127.0.0.1:80", "SCHEME://"),
            ("http://x:1", "unknown scheme 'http'"),
            ("unix://", "missing socket path"),
            ("tcp://localhost", "missing port"),
            ("tcp://:80", "missing host"),
            ("tcp://h:99999", "port"),
            ("tcp://h:1?nodelay=2", "nodelay must be"),
            ("tcp://h:1?speed=9", "unknown parameter 'speed'"),
            ("unix:///a?x=1", "unknown parameter 'x'"),
            ("shm://a?mover=fast", "unknown mover 'fast'"),
            ("shm://a?speed=1", "unknown parameter 'speed' for shm://"),
            ("unix:///a?mover=nt", "unknown parameter 'mover'"),
            ("tcp://h:1?nodelay", "has no value"),
            ("tcp://h:1?ca=x", "unknown parameter 'ca' for tcp://"),
            ("tls://h:1?cert=c.pem", "both cert= and key="),
            ("tls://h:1?ca=", "empty value"),
            ("tls://h", "missing port, e.g. tls://"),
            ("vsock://2", "missing port, e.g. vsock://2:5000"),
            ("vsock://:5000", "missing CID"),
            ("vsock://2:", "missing port"),
            ("vsock://two:5000", "CID 'two' is not a number"),
            ("vsock://-2:5000", "CID '-2' is not a number"),
            ("vsock://2:4294967296", "port '4294967296' is not a number"),
            ("vsock://2:50x", "port '50x'"),
            (
                "vsock://2:5000?nodelay=0",
                "unknown parameter 'nodelay' for vsock://",
            ),
        ] {
            let e = Endpoint::parse(uri).unwrap_err().to_string();
            assert!(e.contains(needle), "{uri}: {e}");
        }
    }
}
