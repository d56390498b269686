//! Sanity latency of the ttrpc baseline: empty `identity` RPCs (and 1 KiB
//! ones) over unix, tcp and tcp with Nagle on, server and client in this
//! process. `cargo run --release -p tensorwire-peer-ttrpc --example empty_rpc [CALLS]`.
//! The real comparison is `tensorwire bench`; this is a quick check.

use engine::{Backend, DType, IdentityBackend, TensorView};
use peer_ttrpc::{Client, PeerError, Server};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn transport_label(uri: &str) -> &'static str {
    if uri.starts_with("unix://") {
        "unix"
    } else if uri.ends_with("nodelay=0") {
        "tcp nodelay=0"
    } else {
        "tcp"
    }
}

fn main() -> Result<(), PeerError> {
    let calls: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let dir = std::env::temp_dir().join(format!("peer-ttrpc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| PeerError::Io {
        what: "create",
        uri: dir.display().to_string(),
        source,
    })?;
    let listen = [
        format!("unix://{}", dir.join("s.sock").display()),
        "tcp://127.0.0.1:0".to_string(),
        "tcp://127.0.0.1:0?nodelay=0".to_string(),
    ];
    let kib = vec![7u8; 1024];
    for uri in &listen {
        let identity: Arc<dyn Backend> = Arc::new(IdentityBackend::new());
        let server = Server::start(uri, vec![("identity".into(), identity)])?;
        let mut client = Client::connect(server.uri())?;
        for (label, req) in [
            ("empty", client.prepare("identity", &[])),
            (
                "1 KiB",
                client.prepare("identity", &[TensorView::new(DType::U8, &[1024], &kib)]),
            ),
        ] {
            for _ in 0..calls / 10 {
                client.call(&req)?;
            }
            let mut times = Vec::with_capacity(calls);
            for _ in 0..calls {
                let t = Instant::now();
                client.call(&req)?;
                times.push(t.elapsed());
            }
            times.sort_unstable();
            println!(
                "{:<14} {label:>6}: p50 {:>7.1} us  p99 {:>7.1} us  ({calls} calls)",
                transport_label(server.uri()),
                percentile(&times, 0.5).as_secs_f64() * 1e6,
                percentile(&times, 0.99).as_secs_f64() * 1e6,
            );
        }
        drop(client);
        server.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
