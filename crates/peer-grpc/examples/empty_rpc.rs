//! Empty-RPC round-trip latency of the gRPC baseline, as a sanity check:
//! an identity server on a Unix socket and on TCP (with and without
//! `TCP_NODELAY`), one client each, N calls with no tensors.
//!
//! `cargo run --release -p tensorwire-peer-grpc --example empty_rpc [N]`

use engine::{Backend, IdentityBackend};
use peer_grpc::{Client, Server};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 2000,
    };
    if n == 0 {
        return Err("N must be at least 1".into());
    }
    let dir = std::env::temp_dir().join(format!("tw-grpc-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let sock = format!("unix://{}", dir.join("grpc.sock").display());
    for (label, listen) in [
        ("unix", sock.as_str()),
        ("tcp", "tcp://127.0.0.1:0"),
        ("tcp nodelay=0", "tcp://127.0.0.1:0?nodelay=0"),
    ] {
        let models: Vec<(String, Arc<dyn Backend>)> =
            vec![("identity".into(), Arc::new(IdentityBackend::new()))];
        let server = Server::start(listen, models)?;
        let mut client = Client::connect(server.uri())?;
        let req = client.prepare("identity", &[]);
        for _ in 0..n / 10 + 10 {
            client.call(&req)?;
        }
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            client.call(&req)?;
            times.push(t.elapsed());
        }
        times.sort_unstable();
        let pct = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
        let mean = times.iter().sum::<Duration>() / u32::try_from(n)?;
        println!(
            "{label:<14} n={n} p50={:>6.1}us p90={:>6.1}us p99={:>6.1}us mean={:>6.1}us",
            us(pct(0.5)),
            us(pct(0.9)),
            us(pct(0.99)),
            us(mean)
        );
        drop(client);
        server.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
