//! `tensorwire peer-serve` (internal): serve the same engine tensorwire's
//! agent runs, over a baseline RPC framework (`grpc`: tonic with KServe v2
//! `ModelInfer`; `ttrpc`), so `tensorwire bench` can measure it as a peer
//! process. Prints `listening on URI` once ready, then serves until SIGINT
//! or SIGTERM.

use super::{parse_models, CmdError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `peer-serve`.
#[derive(clap::Args)]
pub struct Args {
    /// grpc or ttrpc.
    #[arg(long)]
    peer: String,
    /// unix:///path, tcp://127.0.0.1:PORT[?nodelay=0].
    #[arg(long)]
    listen: String,
    /// A model to serve as NAME=PATH.onnx (repeatable); `identity` is
    /// always served.
    #[arg(long = "model", value_name = "NAME=PATH")]
    models: Vec<String>,
    /// ONNX Runtime intra-op threads.
    #[arg(long, default_value_t = 2)]
    intra_threads: usize,
}

enum PeerServer {
    Grpc(peer_grpc::Server),
    Ttrpc(peer_ttrpc::Server),
}

/// Runs the peer server in the foreground.
pub fn run(a: Args) -> Result<(), CmdError> {
    let mut models: Vec<(String, Arc<dyn engine::Backend>)> = vec![(
        engine::IdentityBackend::NAME.to_string(),
        Arc::new(engine::IdentityBackend::new()),
    )];
    let opts = engine::OrtOptions {
        intra_threads: a.intra_threads,
        ..engine::OrtOptions::default()
    };
    for m in parse_models(&a.models)? {
        let b = engine::OrtBackend::load(&m.name, &m.path, &opts)?;
        models.push((m.name, Arc::new(b)));
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let server = match a.peer.as_str() {
        "grpc" => PeerServer::Grpc(peer_grpc::Server::start(&a.listen, models)?),
        "ttrpc" => PeerServer::Ttrpc(peer_ttrpc::Server::start(&a.listen, models)?),
        other => return Err(format!("--peer takes grpc or ttrpc, not '{other}'").into()),
    };
    let uri = match &server {
        PeerServer::Grpc(s) => s.uri().to_string(),
        PeerServer::Ttrpc(s) => s.uri().to_string(),
    };
    println!("listening on {uri}");
    use std::io::Write;
    std::io::stdout().flush()?;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    match server {
        PeerServer::Grpc(s) => s.shutdown(),
        PeerServer::Ttrpc(s) => s.shutdown(),
    }
    Ok(())
}
