//! Measures one request in flight at a time to an image model (input
//! `[1, 3, 224, 224]` f32), sent as a blocking call (`sync`) or completed by
//! a callback (`callback`), against an agent already running: round-trip
//! p50/p99, requests/s and this process's CPU per request. The
//! "Waiting for a slow model" figures in `docs/BENCHMARKS.md` come from it:
//!
//! ```text
//! tensorwire serve --listen shm://cw --model mobilenetv2=models/build/mobilenetv2.onnx &
//! cargo run --release -p tensorwire-client --example callback_wait -- shm://cw mobilenetv2 callback 4
//! ```

use std::error::Error;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// User + system CPU seconds of this process so far (`/proc/self/stat`).
fn cpu_seconds() -> Result<f64, Box<dyn Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_name = stat.rsplit(')').next().ok_or("no ')' in /proc/self/stat")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64, Box<dyn Error>> {
        Ok(fields
            .get(i)
            .ok_or("short /proc/self/stat")?
            .parse::<f64>()?)
    };
    // utime and stime, in clock ticks (100 a second on Linux).
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, uri, model, mode, secs] = args.as_slice() else {
        return Err("usage: callback_wait URI MODEL sync|callback SECONDS".into());
    };
    if mode != "sync" && mode != "callback" {
        return Err(format!("mode must be sync or callback, not {mode:?}").into());
    }
    let secs: f64 = secs.parse().map_err(|e| format!("SECONDS {secs:?}: {e}"))?;
    let duration = Duration::try_from_secs_f64(secs).map_err(|e| format!("SECONDS: {e}"))?;
    let c = client::Client::connect(uri)?;
    let m = c.model(model)?;
    let image = vec![0.5f32; 3 * 224 * 224];
    let input = || client::TensorRef::from_slice(&[1, 3, 224, 224], &image);
    for _ in 0..20 {
        m.infer(&[input()?])?; // warm-up
    }
    let mut took = Vec::new();
    let (cpu0, t0) = (cpu_seconds()?, Instant::now());
    while t0.elapsed() < duration {
        let start = Instant::now();
        if mode == "sync" {
            m.infer(&[input()?])?;
        } else {
            let (tx, rx) = mpsc::channel();
            m.submit(&[input()?])?
                .on_complete(move |r| drop(tx.send(r.map(drop))));
            rx.recv()??;
        }
        took.push(start.elapsed().as_secs_f64() * 1e6);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds()? - cpu0;
    let n = took.len();
    if n == 0 {
        return Err("no request finished in time".into());
    }
    took.sort_by(f64::total_cmp);
    println!(
        "{mode}: n {n} rps {:.0} p50 {:.0} p99 {:.0} client_cpu_us/req {:.1}",
        n as f64 / elapsed,
        took[n / 2],
        took[(n * 99 / 100).min(n - 1)],
        cpu * 1e6 / n as f64
    );
    Ok(())
}
