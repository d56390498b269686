//! A client with a rhythm: one request at a time to the tweet classifier
//! (`classifier`: three int64 inputs `[1, 14]`), with a fixed *think time*
//! between an answer and the next request (busy, or `sleep`), as a client
//! that tokenizes a line or waits for a camera frame between two calls.
//! For each think time it prints the median and p90 of the request's legs
//! from its timeline: *request* (client start → the agent took it), the
//! *response* (engine done → the client has it), and the round trip
//! minus the engine's compute. The "A client with a rhythm" figures in
//! `docs/BENCHMARKS.md` come from it:
//!
//! ```text
//! tensorwire serve --listen shm://tg --model classifier=models/build/tweet_classifier.onnx --intra-spinning off &
//! cargo run --release -p tensorwire-client --example think_gap -- shm://tg 300 0,100,500,3000,12000
//! ```

use std::error::Error;
use std::time::{Duration, Instant};
use wire::Stage;

/// The `p`-quantile of `v` (sorted here).
fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1));
    v.get(i).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (uri, n, thinks, sleeping) = match args.as_slice() {
        [_, uri, n, thinks] => (uri, n, thinks, false),
        [_, uri, n, thinks, how] if how == "sleep" => (uri, n, thinks, true),
        _ => return Err("usage: think_gap URI REQUESTS THINK_US[,THINK_US...] [sleep]".into()),
    };
    let n: usize = n.parse().map_err(|e| format!("REQUESTS {n:?}: {e}"))?;
    if n == 0 {
        return Err("REQUESTS must be at least 1".into());
    }
    let thinks = thinks
        .split(',')
        .map(|t| t.parse::<u64>().map_err(|e| format!("THINK_US {t:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let c = client::Client::connect(uri)?;
    let m = c.model("classifier")?;
    let ids: Vec<i64> = (1000..1014).collect();
    let (ones, zeros) = (vec![1i64; 14], vec![0i64; 14]);
    let call = || -> Result<client::Response, Box<dyn Error>> {
        Ok(m.infer_timed(&[
            client::TensorRef::from_slice(&[1, 14], &ids)?,
            client::TensorRef::from_slice(&[1, 14], &ones)?,
            client::TensorRef::from_slice(&[1, 14], &zeros)?,
        ])?)
    };
    for _ in 0..20 {
        call()?; // warm-up
    }
    let us = |ns: u64| ns as f64 / 1e3;
    for &think in &thinks {
        let think = Duration::from_micros(think);
        let (mut request, mut response, mut tax, mut compute) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let t0 = Instant::now();
            if sleeping {
                std::thread::sleep(think);
            } else {
                while t0.elapsed() < think {
                    std::hint::spin_loop();
                }
            }
            let r = call()?;
            let tl = r.timeline.ok_or("the agent sent no timeline")?;
            let run = tl
                .get(Stage::ComputeEnd)
                .saturating_sub(tl.get(Stage::ComputeStart));
            request.push(us(tl
                .get(Stage::Received)
                .saturating_sub(r.client_start_ns)));
            response.push(us(r
                .client_done_ns
                .saturating_sub(tl.get(Stage::ComputeEnd))));
            tax.push(us(r
                .client_done_ns
                .saturating_sub(r.client_start_ns)
                .saturating_sub(run)));
            compute.push(us(run));
        }
        println!(
            "think {:>6} µs ({}): request p50 {:.1} p90 {:.1} | response p50 {:.1} p90 {:.1} | \
             round trip - compute p50 {:.1} p90 {:.1} | compute p50 {:.0} µs",
            think.as_micros(),
            if sleeping { "sleep" } else { "busy" },
            quantile(&mut request, 0.5),
            quantile(&mut request, 0.9),
            quantile(&mut response, 0.5),
            quantile(&mut response, 0.9),
            quantile(&mut tax, 0.5),
            quantile(&mut tax, 0.9),
            quantile(&mut compute, 0.5),
        );
    }
    Ok(())
}
