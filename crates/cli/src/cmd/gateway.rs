//! `tensorwire gateway`: relay native sessions accepted on tcp/tls/unix
//! listeners, and KServe v2 requests on http/grpc (and https/grpcs)
//! listeners, to an agent over shm or unix, until SIGINT or SIGTERM. The
//! relaying itself is the `gateway` crate's.

use super::CmdError;
use gateway::{Gateway, GatewayOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use transport::{Endpoint, Listener};

/// Arguments of `gateway`.
#[derive(clap::Args)]
pub struct Args {
    /// An endpoint to accept clients on: tcp://host:port[?nodelay=0],
    /// tls://host:port (with --tls-cert/--tls-key) or unix:///path for
    /// native clients; http://, grpc://, https://, grpcs://host:port for
    /// KServe v2 clients (repeatable).
    #[arg(long = "listen", value_name = "URI", required = true)]
    listen: Vec<String>,
    /// The agent to relay to: shm://name, unix:///path (or tcp://, tls://).
    #[arg(long, value_name = "URI")]
    upstream: String,
    /// Allow tcp listeners on addresses other than loopback: tokens and
    /// tensors then cross the network in clear text.
    #[arg(long)]
    insecure: bool,
    /// PEM certificate chain of tls:// listeners.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<std::path::PathBuf>,
    /// PEM CA that tls:// clients' certificates must be signed by (mutual
    /// TLS). The gateway checks them; the agent sees the client's token,
    /// not its certificate.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<std::path::PathBuf>,
    /// Largest request payload offered to clients, in bytes (default: the
    /// agent's).
    #[arg(long)]
    max_payload: Option<u64>,
    /// Most requests in flight per client session (default: the agent's).
    #[arg(long)]
    max_in_flight: Option<u32>,
    /// Client sessions served at once (default 1024).
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Microseconds a waiting read of a client's socket polls before it
    /// blocks (default 50; 0 blocks at once).
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Microseconds a wait for the agent's answer polls before it sleeps
    /// (default: the client library's).
    #[arg(long)]
    upstream_spin_us: Option<u64>,
    /// Milliseconds a request may wait for the agent's answer before the
    /// client gets `unavailable` (default 60000).
    #[arg(long, default_value_t = 60_000)]
    upstream_timeout_ms: u64,
    /// The token the KServe doors' session presents to the agent (the
    /// native sessions carry their own clients' tokens).
    #[arg(
        long,
        env = "TENSORWIRE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
}

/// Runs the gateway until SIGINT or SIGTERM.
pub fn run(a: Args) -> Result<(), CmdError> {
    let split = frontend::split_listen(&a.listen)?;
    let listen = split.endpoints;
    for ep in &listen {
        match ep {
            Endpoint::Tcp { addr, .. } => {
                if !a.insecure && !server::config::is_loopback(addr) {
                    return Err(format!(
                        "{ep} listens beyond this machine in clear text: tokens and tensors \
                         would cross the network unencrypted. Listen on 127.0.0.1, or give \
                         --insecure on a network you trust"
                    )
                    .into());
                }
            }
            Endpoint::Unix(_) | Endpoint::Tls { .. } => {}
            other => {
                return Err(format!(
                    "the gateway listens on tcp://, tls://, unix://, http(s):// and grpc(s):// \
                     endpoints, not {other}"
                )
                .into())
            }
        }
    }
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(transport::tls::server_config(
            &transport::tls::ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: a.tls_client_ca.clone(),
            },
        )?),
        (None, None) if a.tls_client_ca.is_none() => None,
        _ => {
            return Err("--tls-cert and --tls-key go together (--tls-client-ca needs them)".into())
        }
    };
    let mut listeners = Vec::with_capacity(listen.len());
    for ep in &listen {
        listeners.push(match (ep, &tls) {
            (Endpoint::Tls { .. }, Some(config)) => Listener::bind_tls(ep, config.clone())?,
            (Endpoint::Tls { .. }, None) => {
                return Err(format!("{ep} needs --tls-cert FILE --tls-key FILE").into())
            }
            _ => Listener::bind(ep)?,
        });
    }
    let up = Endpoint::parse(&a.upstream)?;
    if matches!(up, Endpoint::Inproc(_)) {
        return Err("the gateway's upstream is an agent process: shm://, unix:// or tcp://".into());
    }
    let mut opts = GatewayOptions {
        max_connections: a.max_connections,
        spin: Duration::from_micros(a.spin_us),
        upstream_timeout: Duration::from_millis(a.upstream_timeout_ms),
        ..GatewayOptions::default()
    };
    if let Some(us) = a.upstream_spin_us {
        opts.upstream_spin = Duration::from_micros(us);
    }
    opts.limits.max_payload = a.max_payload.unwrap_or(0);
    opts.limits.max_in_flight = a.max_in_flight.unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let upstream_timeout = opts.upstream_timeout;
    let gw = if listeners.is_empty() {
        None
    } else {
        Some(Gateway::start_on(listeners, &up.to_string(), opts)?)
    };
    let kserve = if split.grpc.is_empty() && split.http.is_empty() {
        None
    } else {
        let doors = frontend::DoorsConfig {
            grpc: split.grpc,
            http: split.http,
            insecure: a.insecure,
            tls: match (&a.tls_cert, &a.tls_key) {
                (Some(cert), Some(key)) => Some(transport::tls::ServerTlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: a.tls_client_ca.clone(),
                }),
                _ => None,
            },
            ..frontend::DoorsConfig::default()
        };
        let client_opts = client::ClientOptions {
            timeout: upstream_timeout,
            token: a.token.clone().filter(|t| !t.is_empty()),
            ..client::ClientOptions::default()
        };
        Some(gateway::kserve::KserveDoors::start(
            &up.to_string(),
            client_opts,
            doors,
        )?)
    };
    for ep in gw.iter().flat_map(|g| g.endpoints()) {
        // One line per endpoint on stdout, so scripts can wait for readiness.
        println!("listening on {ep}");
    }
    for uri in kserve.iter().flat_map(|k| k.uris()) {
        println!("listening on {uri}");
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    eprintln!("tensorwire gateway: relaying to {up}");
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("tensorwire gateway: shutting down");
    if let Some(k) = kserve {
        k.shutdown();
    }
    if let Some(g) = gw {
        g.shutdown();
    }
    Ok(())
}
