//! `tensorwire serve`: run an agent until SIGINT or SIGTERM; SIGHUP reads
//! the tenants file again.

use super::{parse_switch_flag, CmdError};
use server::{Agent, AgentConfig, ModelConfig};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `serve`. Flags add to (or override) the config file.
#[derive(clap::Args)]
pub struct Args {
    /// A model to serve, as NAME=PATH.onnx (repeatable), optionally with
    /// `;KEY=VALUE` settings of a config file's `[[model]]` table, e.g.
    /// 'digits=m.onnx;max_batch=32;max_queue_delay_us=200;instances=2' (or
    /// ';intra_threads=1': this model's ONNX Runtime threads per run).
    #[arg(long = "model", value_name = "NAME=PATH[;KEY=VALUE...]")]
    models: Vec<String>,
    /// An endpoint to listen on: unix:///path, tcp://host:port[?nodelay=0],
    /// shm://name, vsock://-1:PORT (any CID of this VM or host),
    /// grpc://host:port for the KServe v2 gRPC front door, or
    /// http://host:port for the KServe v2 HTTP/REST front door (repeatable;
    /// added to the config file's `listen` list, which takes the same URIs).
    #[arg(long = "listen", value_name = "URI")]
    listen: Vec<String>,
    /// A TOML config file with the same settings.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// ONNX Runtime intra-op threads per run.
    #[arg(long)]
    intra_threads: Option<usize>,
    /// Whether ONNX Runtime's intra-op threads spin after a run before
    /// they sleep: on or off (default: on, ONNX Runtime's own). Off saves
    /// the CPU they burn between requests (a core per extra thread) for a
    /// wake-up when the next run starts. TOML: intra_spinning = true|false.
    #[arg(long, value_name = "on|off", value_parser = parse_switch_flag)]
    intra_spinning: Option<bool>,
    /// ONNX Runtime inter-op threads.
    #[arg(long)]
    inter_threads: Option<usize>,
    /// Most connections open at once, agent-wide (default 8192).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Most connections one peer may hold: per uid over unix and shm, per
    /// source address over tcp (default 1024).
    #[arg(long)]
    max_connections_per_peer: Option<usize>,
    /// Milliseconds a new connection has to complete its Hello before it is
    /// closed (default 3000).
    #[arg(long)]
    handshake_timeout_ms: Option<u64>,
    /// Milliseconds a session may sit idle before it is closed (0 = never,
    /// the default).
    #[arg(long)]
    idle_timeout_ms: Option<u64>,
    /// Largest request payload in bytes.
    #[arg(long)]
    max_payload: Option<u64>,
    /// Most request payload bytes held by requests in flight, agent-wide.
    #[arg(long)]
    max_total_payload: Option<u64>,
    /// Unix and TCP sessions: microseconds a session polls its socket
    /// for the next request before it parks (0 = park at once).
    #[arg(long)]
    socket_spin_us: Option<u64>,
    /// Shared-memory sessions: microseconds an idle session spins
    /// before it sleeps on its futex (0 = sleep at once).
    #[arg(long)]
    shm_spin_us: Option<u64>,
    /// Serve Prometheus metrics (GET /metrics) on their own listener,
    /// http://HOST:PORT (as Triton does on port 8002; every HTTP front door
    /// serves /metrics too). Prints `metrics on http://HOST:PORT`.
    #[arg(long, value_name = "URI")]
    metrics_listen: Option<String>,
    #[command(flatten)]
    mover: super::MoverArg,
    /// Do not time every request's stages for the statistics and metrics
    /// (saves four clock reads a request; counts still move, durations stay
    /// 0). TOML: [stats] request_timing = false.
    #[arg(long)]
    no_request_timing: bool,
    /// A Triton-layout model repository to serve: DIR/<model>/<version>/model.onnx,
    /// with an optional DIR/<model>/config.pbtxt.
    #[arg(long, value_name = "DIR")]
    model_repository: Option<PathBuf>,
    /// How repository models are loaded: none (all at start, no changes),
    /// explicit (those named by --load-model at start; clients load and
    /// unload), poll (all at start; the directory is rescanned).
    #[arg(long, value_name = "MODE", default_value = "none")]
    model_control_mode: frontend::ControlMode,
    /// Poll mode: seconds between rescans of the repository.
    #[arg(long, value_name = "SECS", default_value_t = 15)]
    repository_poll_secs: u64,
    /// Explicit mode: a repository model to load at start (repeatable; `*`
    /// loads all).
    #[arg(long = "load-model", value_name = "NAME")]
    load_models: Vec<String>,
    /// Seconds in-flight requests get to finish on shutdown.
    #[arg(long, default_value_t = 30)]
    grace: u64,
    /// A tenants file (TOML): which identities (tokens, uids, gids) may see
    /// and call which models, with what quotas. Read again on SIGHUP
    /// (sessions stay; a bad file leaves the old one in force). Without
    /// one, every client may use every model.
    #[arg(long, value_name = "FILE")]
    tenants: Option<PathBuf>,
    /// Permission bits of unix:// sockets and shm:// control sockets
    /// (octal; default 0600: only the agent's user may connect).
    #[arg(long, value_name = "MODE")]
    socket_mode: Option<String>,
    /// Group of those sockets (a name or gid), e.g. with --socket-mode 0660.
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Allow tcp://, grpc:// and http:// listeners on addresses other than
    /// loopback: tokens and tensors cross the network in clear text. TLS
    /// listeners (tls://, grpcs://, https://) need no leave, nor vsock://
    /// (between a VM and its host: it crosses no network).
    #[arg(long)]
    insecure: bool,
    /// Let shm clients have their inputs pulled out of their own memory
    /// (`?mover=kernel`: process_vm_readv with the agent's rights). Off by
    /// default (TOML `[shm] allow_kernel_pull`).
    #[arg(long)]
    allow_kernel_pull: bool,
    /// The agent's TLS certificate chain (PEM), for tls://, grpcs:// and
    /// https:// listeners.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// A CA (PEM): TLS clients must show a certificate it signed (mutual
    /// TLS); a tenants file's `cert_names` match that certificate's names.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
}

/// Runs the agent in the foreground.
pub fn run(a: Args) -> Result<(), CmdError> {
    let mut cfg = match &a.config {
        Some(p) => AgentConfig::from_file(p)?,
        None => AgentConfig::default(),
    };
    // The KServe front doors (from the file's `listen` list, then the
    // flags) run beside the agent over its core; the agent's own listeners
    // speak the tensorwire protocol. Every URI is checked before anything
    // starts.
    let listen =
        frontend::split_listen(std::mem::take(&mut cfg.front_doors).iter().chain(&a.listen))
            .map_err(|e| e.to_string())?;
    cfg.listen.extend(listen.endpoints);
    if let Some(l) = &a.metrics_listen {
        frontend::parse_metrics_uri(l).map_err(|e| format!("--metrics-listen: {e}"))?;
    }
    if a.no_request_timing {
        cfg.request_timing = false;
    }
    if let Some(p) = &a.mover.mover_policy {
        transport::mover::set_policy_file(p);
    }
    if let Some(m) = a.mover.mover {
        cfg.mover = m;
    }
    for m in &a.models {
        cfg.models.push(ModelConfig::parse_flag(m)?);
    }
    if let Some(n) = a.intra_threads {
        cfg.intra_threads = n;
    }
    if let Some(on) = a.intra_spinning {
        cfg.intra_spinning = on;
    }
    if let Some(n) = a.inter_threads {
        cfg.inter_threads = n;
    }
    if let Some(n) = a.max_connections {
        cfg.max_connections = n;
    }
    if let Some(n) = a.max_connections_per_peer {
        cfg.max_connections_per_peer = n;
    }
    if let Some(ms) = a.handshake_timeout_ms {
        cfg.handshake_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = a.idle_timeout_ms {
        cfg.idle_timeout = (ms > 0).then(|| Duration::from_millis(ms));
    }
    if let Some(n) = a.max_payload {
        cfg.limits.max_payload = n;
    }
    if let Some(n) = a.max_total_payload {
        cfg.max_total_payload = n;
    }
    if let Some(n) = a.socket_spin_us {
        cfg.socket_spin_us = n;
    }
    if let Some(n) = a.shm_spin_us {
        cfg.shm_spin_us = n;
    }
    if let Some(t) = &a.tenants {
        cfg.tenants = Some(t.clone());
    }
    if let Some(m) = &a.socket_mode {
        cfg.socket_mode = server::config::parse_mode(m)?;
    }
    if let Some(g) = &a.socket_group {
        cfg.socket_group = Some(g.clone());
    }
    cfg.insecure |= a.insecure;
    cfg.allow_kernel_pull |= a.allow_kernel_pull;
    if a.tls_cert.is_some() || a.tls_key.is_some() || a.tls_client_ca.is_some() {
        let file = cfg.tls.take().unwrap_or_default();
        cfg.tls = server::config::tls_files(
            a.tls_cert.clone().or(Some(file.cert)),
            a.tls_key.clone().or(Some(file.key)),
            a.tls_client_ca.clone().or(file.client_ca),
        )?;
    }
    if cfg.listen.is_empty() && listen.grpc.is_empty() && listen.http.is_empty() {
        return Err(
            "nothing to listen on: give --listen URI (e.g. unix:///tmp/tensorwire.sock)".into(),
        );
    }
    let repository = match &a.model_repository {
        None if !a.load_models.is_empty()
            || a.model_control_mode != frontend::ControlMode::None
            || a.repository_poll_secs != 15 =>
        {
            return Err(
                "--load-model, --model-control-mode and --repository-poll-secs need \
                 --model-repository DIR"
                    .into(),
            );
        }
        None => None,
        Some(dir) => Some(frontend::RepositoryOptions {
            root: dir.clone(),
            mode: a.model_control_mode,
            poll_interval: Duration::from_secs(a.repository_poll_secs),
            load_at_start: a.load_models.clone(),
            intra_threads: cfg.intra_threads,
            intra_spinning: cfg.intra_spinning,
            inter_threads: cfg.inter_threads,
        }),
    };
    let doors_cfg = frontend::DoorsConfig {
        grpc: listen.grpc,
        http: listen.http,
        metrics: a.metrics_listen.clone(),
        repository,
        insecure: cfg.insecure,
        tls: cfg.tls.clone(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let hangup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hangup.clone())?;
    let agent = Agent::start(cfg)?;
    for m in agent.core().registry.models() {
        let s = m.signature();
        eprintln!(
            "tensorwire agent: model {} (id {}) {}",
            s.name,
            m.id,
            describe(s)
        );
    }
    // The repository (its models load first), then the doors and the
    // metrics listener; on failure what started is stopped again.
    let doors = match frontend::FrontDoors::start(agent.core().clone(), doors_cfg) {
        Ok(d) => d,
        Err(e) => {
            agent.shutdown(Duration::ZERO);
            return Err(e.to_string().into());
        }
    };
    for ep in agent.endpoints() {
        // One line per endpoint on stdout, so scripts can wait for readiness.
        println!("listening on {ep}");
    }
    for uri in doors.uris() {
        println!("listening on {uri}");
    }
    if let Some(uri) = doors.metrics_uri() {
        println!("metrics on {uri}");
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    if let Some(t) = agent.core().tenants() {
        let names: Vec<String> = t.snapshot().into_iter().map(|s| s.name).collect();
        eprintln!(
            "tensorwire agent: tenants from {}: {}",
            t.path().map_or("?".into(), |p| p.display().to_string()),
            names.join(", ")
        );
    }
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        if hangup.swap(false, Ordering::Relaxed) {
            reload_tenants(&agent);
        }
    }
    eprintln!(
        "tensorwire agent: shutting down (in-flight requests get {}s to finish)",
        a.grace
    );
    let st = agent.stats();
    // The front doors say not-ready first; the agent then refuses new
    // requests (gRPC callers get UNAVAILABLE) and drains those in flight,
    // front-door ones included; the front doors then send their last
    // responses and close.
    let unfinished = doors.shutdown_with(agent, Duration::from_secs(a.grace));
    if unfinished > 0 {
        eprintln!("tensorwire agent: {unfinished} requests did not finish in time");
    }
    eprintln!(
        "tensorwire agent: stopped ({} responses, {} errors; workers moved off a client's CPU {} times; \
         polls ahead of a forecast request: {} caught, {} missed; tensors moved: {})",
        st.responses,
        st.errors,
        st.cpu_moves,
        st.shm_forecast_caught,
        st.shm_forecast_missed,
        st.movers
    );
    Ok(())
}

/// SIGHUP: reads the tenants file again. A bad file is logged and the one
/// in force stays; sessions are never dropped.
fn reload_tenants(agent: &Agent) {
    let Some(t) = agent.core().tenants() else {
        eprintln!("tensorwire agent: SIGHUP: no tenants file to reload (serve --tenants FILE)");
        return;
    };
    match t.reload() {
        Ok(r) => eprintln!(
            "tensorwire agent: tenants reloaded: {} tenants (generation {})",
            r.tenants, r.generation
        ),
        Err(e) => eprintln!("tensorwire agent: tenants NOT reloaded, the old ones stay: {e}"),
    }
}

/// `(x: float32[?, 64]) -> (logits: float32[?, 10])`.
pub fn describe(s: &wire::ModelSignature) -> String {
    if s.inputs.is_empty() && s.outputs.is_empty() {
        return "(any tensors) -> (the same tensors)".into();
    }
    let list = |v: &[wire::TensorSpec]| {
        v.iter()
            .map(|t| format!("{}: {}", t.name, t.describe()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("({}) -> ({})", list(&s.inputs), list(&s.outputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("serve").chain(flags.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn intra_spinning_flag() {
        assert_eq!(parse(&[]).unwrap().intra_spinning, None);
        assert_eq!(
            parse(&["--intra-spinning", "off"]).unwrap().intra_spinning,
            Some(false)
        );
        assert_eq!(
            parse(&["--intra-spinning", "on"]).unwrap().intra_spinning,
            Some(true)
        );
        let e = parse(&["--intra-spinning", "sometimes"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("--intra-spinning") && e.contains("'sometimes'") && e.contains("on or off"),
            "{e}"
        );
    }
}
