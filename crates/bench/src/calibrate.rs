//! `tensorwire calibrate`: measures every data mover
//! ([`transport::mover`]) × size × concurrency × cache state on this
//! machine, fits the mover policy (an exact table: the fastest mover per
//! log2 size bucket, concurrency and cache state, nearest case for unseen
//! ones), and evaluates a policy on cases it was not fitted on.
//!
//! One case: `concurrency` threads, each copying its own source into its
//! own destination at the same time (a barrier starts each repetition),
//! timed per copy, the movers taking turns within each repetition (so
//! noise from elsewhere falls on all alike); a mover's time is the median
//! over repetitions of the slowest thread's per-copy time. Small copies are timed in batches (the
//! clock costs ~20 ns). *Hot*: the same source and destination every copy
//! (in cache after the first). *Cold*: every copy at a fresh offset of a
//! source and a destination area twice the last-level cache, 4 KiB apart,
//! so neither is cached (for sizes that do not fit the areas, whole
//! buffers: larger than the cache anyway). The kernel mover is
//! `process_vm_readv` from this process (the kernel path an agent pulling
//! from a client takes).

use std::sync::{Arc, Barrier};
use std::time::Instant;
use transport::mover::{self, Mover, MoverChoice, Policy, PolicyEntry};

/// The movers a policy chooses between (zero copy is not a choice: it is
/// taken whenever the bytes already lie in the arena).
pub const MOVERS: [Mover; 3] = [Mover::Memcpy, Mover::NonTemporal, Mover::Kernel];

/// What to measure.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Copy sizes in bytes.
    pub sizes: Vec<usize>,
    /// Threads copying at once.
    pub concurrency: Vec<usize>,
    /// Cache states (false = hot, true = cold).
    pub cold: Vec<bool>,
    /// Target measuring time per (mover, case), ns.
    pub budget_ns: u64,
    /// Repetitions per case at least / at most.
    pub reps: (usize, usize),
}

impl Plan {
    /// The training plan: powers of 4 from 64 B to `max` bytes,
    /// concurrency 1 and 2, hot and cold.
    pub fn training(max: usize, quick: bool) -> Plan {
        let mut sizes = Vec::new();
        let mut s = 64usize;
        while s <= max {
            sizes.push(s);
            s *= 4;
        }
        Plan {
            sizes,
            concurrency: vec![1, 2],
            cold: vec![false, true],
            budget_ns: if quick { 4_000_000 } else { 40_000_000 },
            reps: if quick { (5, 200) } else { (11, 2000) },
        }
    }

    /// The evaluation plan: sizes 3·4^k from 192 B to `max` (none of them a
    /// training size), concurrency 1, 2 and 3 (3 not trained), hot and cold.
    pub fn evaluation(max: usize, quick: bool) -> Plan {
        let mut p = Plan::training(max, quick);
        p.sizes = p
            .sizes
            .iter()
            .map(|s| s * 3)
            .filter(|&s| s <= max)
            .collect();
        p.concurrency = vec![1, 2, 3];
        p
    }
}

/// One measured case.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Measured {
    /// Bytes per copy.
    pub size: usize,
    /// Threads copying at once.
    pub concurrency: usize,
    /// Cold source and destination.
    pub cold: bool,
    /// Median ns per copy, per mover (in [`MOVERS`] order).
    pub ns: [f64; 3],
}

/// Another mover must beat memcpy by this factor to be chosen over it in
/// a policy: memcpy is the safe default, and a case won by less is within
/// the measurement noise.
pub const MARGIN: f64 = 0.97;

impl Measured {
    /// The fastest mover of the case.
    pub fn best(&self) -> Mover {
        let i = (0..3)
            .min_by(|&a, &b| self.ns[a].total_cmp(&self.ns[b]))
            .unwrap_or(0);
        MOVERS[i]
    }

    /// The mover a policy takes for the case: the fastest, unless it beats
    /// memcpy by less than [`MARGIN`], or it is `nt` below
    /// [`mover::NT_MIN_BYTES`] (a plain copy there: any difference is noise).
    pub fn chosen(&self) -> Mover {
        match self.best() {
            Mover::NonTemporal if self.size < mover::NT_MIN_BYTES => Mover::Memcpy,
            m if m != Mover::Memcpy && self.ns[m.index()] > MARGIN * self.ns[0] => Mover::Memcpy,
            m => m,
        }
    }
    /// GB/s of `m` over all threads.
    pub fn gbps(&self, i: usize) -> f64 {
        (self.size * self.concurrency) as f64 / self.ns[i]
    }
}

/// Bytes of the last-level cache (sysfs; 32 MiB if unknown).
pub fn llc_bytes() -> usize {
    for idx in (0..6).rev() {
        let p = format!("/sys/devices/system/cpu/cpu0/cache/index{idx}/size");
        if let Ok(s) = std::fs::read_to_string(&p) {
            let s = s.trim();
            let (n, mul) = match s.strip_suffix('K') {
                Some(n) => (n, 1024),
                None => match s.strip_suffix('M') {
                    Some(n) => (n, 1 << 20),
                    None => (s, 1),
                },
            };
            if let Ok(n) = n.parse::<usize>() {
                return n * mul;
            }
        }
    }
    32 << 20
}

/// Buffers of one copying thread.
struct Bufs {
    src: Vec<u8>,
    dst: Vec<u8>,
}

/// How a timed repetition picks its copies.
#[derive(Clone, Copy)]
enum How {
    /// One fixed mover.
    Fixed(Mover),
    /// The policy's choice per copy (decision included in the time).
    Auto,
}

/// One thread's part of a repetition: `batch` copies of `size`, ns per copy.
fn rep(b: &mut Bufs, how: How, size: usize, batch: usize, cold: bool, at: &mut usize) -> f64 {
    let stride = size.div_ceil(4096) * 4096 + 4096;
    let area = b.src.len();
    let t = Instant::now();
    for _ in 0..batch {
        let off = if cold {
            if *at + size > area {
                *at = 0;
            }
            let o = *at;
            *at += stride;
            o
        } else {
            0
        };
        let (src, dst) = (&b.src[off..off + size], &mut b.dst[off..off + size]);
        let m = match how {
            How::Fixed(m) => m,
            How::Auto => {
                let d = MoverChoice::Auto.decide(size);
                let _ = mover::copy(d.mover, dst, src);
                continue;
            }
        };
        let _ = mover::copy(m, dst, src);
    }
    t.elapsed().as_nanos() as f64 / batch as f64
}

/// Measures one (size, concurrency, cache state) for each of `hows`. The
/// `hows` take turns within each repetition (in an order rotated every
/// repetition), so a burst of noise from elsewhere on the machine falls on
/// all of them alike.
fn measure_case(
    plan: &Plan,
    size: usize,
    conc: usize,
    cold: bool,
    hows: &[How],
    llc: usize,
) -> Vec<f64> {
    let area = if cold { (2 * llc).max(size) } else { size };
    // Copies per timed batch: at least ~20 µs of work (a guess at 10 GB/s).
    let batch = (200_000 / size.max(1)).clamp(1, 4096);
    // How long one round of every `how` takes, from one probe batch each.
    let mut probe = Bufs {
        src: vec![1; size],
        dst: vec![0; size],
    };
    let round: f64 = hows
        .iter()
        .map(|&how| rep(&mut probe, how, size, batch, false, &mut 0).max(1.0) * batch as f64)
        .sum();
    drop(probe);
    let reps = ((plan.budget_ns as f64 * hows.len() as f64 / round) as usize)
        .clamp(plan.reps.0, plan.reps.1);
    let barrier = Arc::new(Barrier::new(conc));
    let handles: Vec<_> = (0..conc)
        .map(|_| {
            let barrier = barrier.clone();
            let hows = hows.to_vec();
            std::thread::spawn(move || {
                let mut b = Bufs {
                    src: vec![0x5a; area],
                    dst: vec![0xa5; area],
                };
                let mut at = 0usize;
                // [how][rep]
                let mut v = vec![Vec::with_capacity(reps); hows.len()];
                for r in 0..reps {
                    for k in 0..hows.len() {
                        let h = (r + k) % hows.len();
                        barrier.wait();
                        v[h].push(rep(&mut b, hows[h], size, batch, cold, &mut at));
                    }
                }
                v
            })
        })
        .collect();
    let per: Vec<Vec<Vec<f64>>> = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_default())
        .collect();
    (0..hows.len())
        .map(|h| {
            let mut slowest: Vec<f64> = (0..reps)
                .map(|r| {
                    per.iter()
                        .filter_map(|t| t.get(h).and_then(|v| v.get(r)))
                        .fold(0.0, |a: f64, &b| a.max(b))
                })
                .collect();
            slowest.sort_by(f64::total_cmp);
            slowest.get(slowest.len() / 2).copied().unwrap_or(f64::NAN)
        })
        .collect()
}

/// Measures every mover over `plan` (progress on stderr).
pub fn measure(plan: &Plan) -> Vec<Measured> {
    let llc = llc_bytes();
    let hows: Vec<How> = MOVERS.iter().map(|&m| How::Fixed(m)).collect();
    let mut rows = Vec::new();
    for &cold in &plan.cold {
        for &conc in &plan.concurrency {
            for &size in &plan.sizes {
                let ns = measure_case(plan, size, conc, cold, &hows, llc);
                eprint!(".");
                rows.push(Measured {
                    size,
                    concurrency: conc,
                    cold,
                    ns: [ns[0], ns[1], ns[2]],
                });
            }
        }
    }
    eprintln!();
    rows
}

/// Fits the policy: the fastest measured mover per case ([`Measured::chosen`]),
/// as a table.
pub fn fit(rows: &[Measured]) -> Result<Policy, String> {
    let entries = rows
        .iter()
        .map(|r| PolicyEntry {
            log2_size: r.size.max(1).ilog2(),
            concurrency: r.concurrency as u32,
            cold: r.cold,
            mover: r.chosen(),
        })
        .collect();
    let machine = format!(
        "{} ({} CPUs, LLC {} MiB)",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        llc_bytes() >> 20
    );
    Policy::new(machine, (llc_bytes() / 2) as u64, entries)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The mover table: GB/s per mover × size × concurrency × cache state.
pub fn table(rows: &[Measured]) -> String {
    let mut s = String::from(
        "| cache | threads | size | memcpy GB/s | nt GB/s | kernel GB/s | policy |\n|---|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {} |\n",
            if r.cold { "cold" } else { "hot" },
            r.concurrency,
            human(r.size),
            r.gbps(0),
            r.gbps(1),
            r.gbps(2),
            r.chosen()
        );
    }
    s
}

/// `64 B`, `3 KiB`, `12 MiB`.
pub fn human(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// One evaluated case: each fixed mover's time, `auto`'s, the oracle's.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Evaluated {
    /// The case, with the fixed movers' times.
    pub case: Measured,
    /// `auto` (the policy's choice per copy, decision included), ns per copy.
    pub auto_ns: f64,
    /// The mover the policy picks for it.
    pub picked: Mover,
}

/// Times every fixed mover and `auto` (the process policy, which the
/// caller set with [`mover::set_policy_file`]) on `plan`.
pub fn evaluate(plan: &Plan) -> Vec<Evaluated> {
    let llc = llc_bytes();
    let mut hows: Vec<How> = MOVERS.iter().map(|&m| How::Fixed(m)).collect();
    hows.push(How::Auto);
    let mut out = Vec::new();
    for &cold in &plan.cold {
        for &conc in &plan.concurrency {
            for &size in &plan.sizes {
                let ns = measure_case(plan, size, conc, cold, &hows, llc);
                eprint!(".");
                out.push(Evaluated {
                    case: Measured {
                        size,
                        concurrency: conc,
                        cold,
                        ns: [ns[0], ns[1], ns[2]],
                    },
                    auto_ns: ns[3],
                    picked: mover::process_policy().choose(size, conc, None),
                });
            }
        }
    }
    eprintln!();
    out
}

/// The evaluation as a table with totals: per case each mover's time over
/// the oracle's (the best fixed mover); then the sum of times per mover.
pub fn evaluation_report(ev: &[Evaluated]) -> String {
    let mut s = String::from(
        "| cache | threads | size | memcpy | nt | kernel | auto (pick) | auto / oracle |\n|---|---:|---:|---:|---:|---:|---|---:|\n",
    );
    let mut tot = [0f64; 4];
    let mut worst: f64 = 0.0;
    let mut within = 0;
    for e in ev {
        let c = &e.case;
        let oracle = c.ns.iter().copied().fold(f64::INFINITY, f64::min);
        let ratio = e.auto_ns / oracle;
        worst = worst.max(ratio);
        if ratio <= 1.05 {
            within += 1;
        }
        for (t, ns) in tot.iter_mut().zip(c.ns) {
            *t += ns;
        }
        tot[3] += e.auto_ns;
        s += &format!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} ({}) | {:.3} |\n",
            if c.cold { "cold" } else { "hot" },
            c.concurrency,
            human(c.size),
            c.ns[0] / oracle,
            c.ns[1] / oracle,
            c.ns[2] / oracle,
            ratio,
            e.picked,
            ratio
        );
    }
    s += &format!(
        "\ntotals over {} cases (sum of ns per copy): memcpy {:.0}, nt {:.0}, kernel {:.0}, auto {:.0}\n",
        ev.len(),
        tot[0],
        tot[1],
        tot[2],
        tot[3]
    );
    s += &format!(
        "auto within 5 % of the oracle in {within} of {} cases (worst {:.3}x); auto beats every fixed mover over the set: {}\n",
        ev.len(),
        worst,
        tot[3] < tot[0] && tot[3] < tot[1] && tot[3] < tot[2]
    );
    // Normalised totals: each case weighs the same (sum of ratios).
    let mut norm = [0f64; 4];
    for e in ev {
        let oracle = e.case.ns.iter().copied().fold(f64::INFINITY, f64::min);
        for (t, ns) in norm.iter_mut().zip(e.case.ns) {
            *t += ns / oracle;
        }
        norm[3] += e.auto_ns / oracle;
    }
    let n = ev.len().max(1) as f64;
    s += &format!(
        "mean time / oracle: memcpy {:.3}, nt {:.3}, kernel {:.3}, auto {:.3}\n",
        norm[0] / n,
        norm[1] / n,
        norm[2] / n,
        norm[3] / n
    );
    // The choices alone, judged on the fixed movers' own times in the same
    // rounds: no second measurement of the same copy, so none of its noise
    // (auto is the picked mover plus a ~10 ns decision).
    let (mut pick_within, mut pick_worst, mut pick_total) = (0, 0f64, 0f64);
    for e in ev {
        let oracle = e.case.ns.iter().copied().fold(f64::INFINITY, f64::min);
        let picked = MOVERS
            .iter()
            .position(|&m| m == e.picked)
            .map_or(f64::NAN, |i| e.case.ns[i]);
        let r = picked / oracle;
        pick_worst = pick_worst.max(r);
        pick_total += picked;
        if r <= 1.05 {
            pick_within += 1;
        }
    }
    s += &format!(
        "the picks on the fixed movers' times: within 5 % of the oracle in {pick_within} of {} cases (worst {pick_worst:.3}x); total {pick_total:.0} ns against memcpy {:.0}, nt {:.0}, kernel {:.0}\n",
        ev.len(),
        tot[0],
        tot[1],
        tot[2]
    );
    s
}

/// Decision cost of `auto` ([`MoverChoice::decide`]: one comparison below
/// the policy's `memcpy_below`, else the in-flight count and the table
/// lookup), ns: (p50, p99) over `batches` batches of 100 decisions each
/// (one clock read costs more than a decision, so one decision is a
/// batch's time / 100). Sizes are `64 << (r % 23)` (64 B .. 256 MiB)
/// when `large` is false, else `1 MiB << (r % 8)` (the table lookup path
/// whenever the policy has a non-memcpy case at 1 MiB or below).
pub fn decision_cost(batches: usize, large: bool) -> (f64, f64) {
    let mut v = Vec::with_capacity(batches);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut sink = 0usize;
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..100 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let size = if large {
                (1usize << 20) << (x % 8)
            } else {
                64usize << (x % 23)
            };
            let d = MoverChoice::Auto.decide(size);
            sink = sink.wrapping_add(d.mover.index());
        }
        v.push(t.elapsed().as_nanos() as f64 / 100.0);
    }
    std::hint::black_box(sink);
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}
