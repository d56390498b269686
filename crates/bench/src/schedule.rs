//! Open-loop arrival schedules: when each request of an open-loop load is
//! due, as offsets in nanoseconds from the start of the timed phase.
//!
//! - [`arrivals`] makes a constant-rate or Poisson schedule. The Poisson
//!   one draws from a small self-contained PRNG (splitmix64), so a seed
//!   gives the same schedule on every machine and build.
//! - [`read_trace`] reads a schedule from a trace file (`--trace FILE`).
//!
//! Every schedule is non-decreasing and holds at most [`MAX_ENTRIES`]
//! requests.

use crate::caller::BenchError;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

/// The most requests a schedule may hold (50 million: 400 MB of offsets).
pub const MAX_ENTRIES: u64 = 50_000_000;

/// The longest line a trace file may have, in bytes (comments included).
pub const MAX_TRACE_LINE: usize = 4096;

/// How the requests of an open-loop load arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A Poisson process: independent, exponentially distributed gaps with
    /// mean `1/rate`.
    Poisson,
    /// Evenly spaced: request `k` at `k/rate`.
    Constant,
}

impl Arrival {
    /// The name used on the command line and in results.
    pub const fn name(self) -> &'static str {
        match self {
            Arrival::Poisson => "poisson",
            Arrival::Constant => "constant",
        }
    }
}

impl fmt::Display for Arrival {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Arrival {
    type Err = BenchError;

    /// `poisson` or `constant` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Arrival, BenchError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "poisson" => Ok(Arrival::Poisson),
            "constant" => Ok(Arrival::Constant),
            _ => Err(BenchError::new(format!(
                "unknown arrival process `{s}`: expected `poisson` or `constant`"
            ))),
        }
    }
}

/// splitmix64 (Steele, Lea, Flood 2014): a tiny, fast, well-mixed PRNG.
/// Used for reproducible schedules, not for anything secret.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]` (53 random bits), so `ln` of it is finite.
    fn next_open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// Converts seconds to whole nanoseconds (rounded; saturating at the ends
/// of `u64`).
fn secs_to_ns(s: f64) -> u64 {
    // `as` saturates for out-of-range floats.
    (s * 1e9).round() as u64
}

/// The arrival offsets (ns from the start, non-decreasing) of `arrival` at
/// `rate_rps` requests per second: every arrival strictly before
/// `duration`, and at most `max_requests` of them.
///
/// - Constant: request `k` at `k/rate` (rounded to the nanosecond), the
///   first at 0.
/// - Poisson: cumulative sums of exponential gaps `-ln(U)/rate`, `U`
///   uniform in `(0, 1]` from splitmix64 seeded with `seed`; the first
///   request comes after the first gap. The same seed gives the same
///   schedule everywhere.
///
/// Errors: a rate that is not a positive finite number, a schedule of more
/// than [`MAX_ENTRIES`] requests, or an empty schedule (duration too short
/// or `max_requests` of 0).
pub fn arrivals(
    arrival: Arrival,
    rate_rps: f64,
    duration: Duration,
    max_requests: Option<u64>,
    seed: u64,
) -> Result<Vec<u64>, BenchError> {
    if !(rate_rps.is_finite() && rate_rps > 0.0) {
        return Err(BenchError::new(format!(
            "arrival rate must be a positive number of requests per second, not {rate_rps}"
        )));
    }
    let duration_s = duration.as_secs_f64();
    let duration_ns = duration.as_nanos();
    // The expected count; a Poisson schedule may run a little over it, and
    // is checked again as it grows.
    let expected = duration_s * rate_rps;
    let limit = max_requests.unwrap_or(u64::MAX);
    if expected.min(limit as f64) > MAX_ENTRIES as f64 {
        return Err(BenchError::new(format!(
            "a {arrival} schedule at {rate_rps} requests/s for {duration_s} s would have \
             {:.0} requests, more than the {MAX_ENTRIES} allowed: lower the rate, the \
             duration or the request count",
            expected.min(limit as f64)
        )));
    }
    let capacity = expected.min(limit as f64).min(MAX_ENTRIES as f64) as usize;
    let mut out: Vec<u64> = Vec::with_capacity(capacity.saturating_add(16));
    let too_many = || {
        BenchError::new(format!(
            "a {arrival} schedule at {rate_rps} requests/s for {duration_s} s has more than \
             the {MAX_ENTRIES} requests allowed"
        ))
    };
    match arrival {
        Arrival::Constant => {
            let mut k: u64 = 0;
            // Bounded: k grows by one per turn up to `limit` and MAX_ENTRIES.
            while k < limit {
                let t = secs_to_ns(k as f64 / rate_rps);
                if u128::from(t) >= duration_ns {
                    break;
                }
                if k >= MAX_ENTRIES {
                    return Err(too_many());
                }
                out.push(t);
                k += 1;
            }
        }
        Arrival::Poisson => {
            let mut rng = SplitMix64(seed);
            let mut t = 0.0f64;
            // Bounded: one entry per turn, up to `limit` and MAX_ENTRIES.
            while (out.len() as u64) < limit {
                t += -rng.next_open01().ln() / rate_rps;
                let ns = secs_to_ns(t);
                if u128::from(ns) >= duration_ns {
                    break;
                }
                if out.len() as u64 >= MAX_ENTRIES {
                    return Err(too_many());
                }
                out.push(ns);
            }
        }
    }
    if out.is_empty() {
        return Err(BenchError::new(format!(
            "the {arrival} schedule at {rate_rps} requests/s for {duration_s} s is empty: \
             give a longer duration or more requests"
        )));
    }
    Ok(out)
}

/// Parses one trace timestamp in seconds into nanoseconds. Plain decimals
/// (`12`, `0.0015`, `-3.25`) are parsed exactly, so large epoch timestamps
/// keep nanosecond precision (digits past the 9th decimal are truncated);
/// other float syntax (`1e-3`) goes through `f64`. Rejects NaN and
/// infinities.
fn parse_seconds(s: &str) -> Result<i128, String> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let plain = !(int.is_empty() && frac.is_empty())
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
        && int.len() <= 20;
    if plain {
        let secs: i128 = if int.is_empty() {
            0
        } else {
            int.parse::<i128>()
                .map_err(|e| format!("bad timestamp `{s}`: {e}"))?
        };
        let mut ns: i128 = 0;
        for (i, b) in frac.bytes().take(9).enumerate() {
            ns += i128::from(b - b'0') * 10i128.pow(8 - i as u32);
        }
        let v = secs * 1_000_000_000 + ns;
        return Ok(if neg { -v } else { v });
    }
    let x: f64 = s
        .parse()
        .map_err(|_| format!("bad timestamp `{s}`: expected seconds, e.g. `0.0015`"))?;
    if !x.is_finite() {
        return Err(format!("timestamp `{s}` is not a finite number"));
    }
    // ±1.7e38 ns fits i128; beyond, `as` saturates and the span check fails.
    Ok((x * 1e9).round() as i128)
}

/// Reads a trace file: one timestamp per line, in seconds (decimal, e.g.
/// `0.0015`); blank lines and `#` comments (whole-line or trailing) are
/// ignored. Returns the offsets in nanoseconds relative to the first
/// timestamp.
///
/// Errors name the file and line: an unreadable file, a line longer than
/// [`MAX_TRACE_LINE`] bytes or not UTF-8, a value that is not a finite
/// number, a timestamp earlier than the one before it, an offset beyond
/// `u64` nanoseconds (584 years), more than [`MAX_ENTRIES`] timestamps, or
/// none at all.
pub fn read_trace(path: &Path) -> Result<Vec<u64>, BenchError> {
    let file = std::fs::File::open(path)
        .map_err(|e| BenchError::new(format!("{}: {e}", path.display())))?;
    parse_trace(BufReader::new(file), &path.display().to_string())
}

/// [`read_trace`] on any reader; `name` is used in errors.
pub fn parse_trace<R: BufRead>(mut reader: R, name: &str) -> Result<Vec<u64>, BenchError> {
    let err = |line: u64, msg: String| BenchError::new(format!("{name}:{line}: {msg}"));
    let mut out: Vec<u64> = Vec::new();
    let mut first: Option<i128> = None;
    let mut prev: i128 = i128::MIN;
    let mut buf: Vec<u8> = Vec::with_capacity(128);
    let mut line_no: u64 = 0;
    // Bounded: every turn consumes at least one byte of the file, or ends.
    loop {
        buf.clear();
        let n = reader
            .by_ref()
            .take(MAX_TRACE_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| err(line_no + 1, e.to_string()))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if buf.last() == Some(&b'\n') {
            buf.pop();
        }
        // Without its newline a line of at most MAX_TRACE_LINE bytes fits;
        // a longer one was cut at MAX_TRACE_LINE + 1 bytes by `take`.
        if buf.len() > MAX_TRACE_LINE {
            return Err(err(
                line_no,
                format!("line longer than {MAX_TRACE_LINE} bytes"),
            ));
        }
        let text = std::str::from_utf8(&buf).map_err(|_| err(line_no, "not UTF-8".into()))?;
        let text = text.split_once('#').map_or(text, |(a, _)| a).trim();
        if text.is_empty() {
            continue;
        }
        let t = parse_seconds(text).map_err(|m| err(line_no, m))?;
        if t < prev {
            return Err(err(
                line_no,
                format!("timestamp `{text}` is earlier than the one before it"),
            ));
        }
        prev = t;
        let first = *first.get_or_insert(t);
        let offset = u64::try_from(t - first).map_err(|_| {
            err(
                line_no,
                format!("timestamp `{text}` is too far after the first one"),
            )
        })?;
        if out.len() as u64 >= MAX_ENTRIES {
            return Err(err(line_no, format!("more than {MAX_ENTRIES} timestamps")));
        }
        out.push(offset);
    }
    if out.is_empty() {
        return Err(BenchError::new(format!(
            "{name}: no timestamps in the trace"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_from_str() {
        assert_eq!("poisson".parse::<Arrival>(), Ok(Arrival::Poisson));
        assert_eq!("Constant".parse::<Arrival>(), Ok(Arrival::Constant));
        let e = "uniform".parse::<Arrival>().unwrap_err();
        assert!(e.0.contains("uniform") && e.0.contains("poisson"), "{e}");
        assert_eq!(Arrival::Poisson.to_string(), "poisson");
    }

    #[test]
    fn constant_is_exact() {
        let a = arrivals(
            Arrival::Constant,
            1000.0,
            Duration::from_millis(10),
            None,
            1,
        )
        .unwrap();
        let want: Vec<u64> = (0..10).map(|k| k * 1_000_000).collect();
        assert_eq!(a, want);
        // A request budget cuts it short.
        let a = arrivals(Arrival::Constant, 4.0, Duration::from_secs(100), Some(3), 1).unwrap();
        assert_eq!(a, vec![0, 250_000_000, 500_000_000]);
        // Rounding to the nanosecond: 1/3 s.
        let a = arrivals(Arrival::Constant, 3.0, Duration::from_secs(1), None, 1).unwrap();
        assert_eq!(a, vec![0, 333_333_333, 666_666_667]);
    }

    #[test]
    fn poisson_statistics() {
        let rate = 10_000.0;
        let n = 100_000u64;
        let a = arrivals(
            Arrival::Poisson,
            rate,
            Duration::from_secs(3600),
            Some(n),
            42,
        )
        .unwrap();
        assert_eq!(a.len() as u64, n);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        let gaps: Vec<f64> = std::iter::once(a[0])
            .chain(a.windows(2).map(|w| w[1] - w[0]))
            .map(|g| g as f64)
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        let want = 1e9 / rate;
        assert!((mean - want).abs() < 0.02 * want, "mean gap {mean} ns");
        assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
        // Same seed, same schedule; another seed, another.
        let b = arrivals(
            Arrival::Poisson,
            rate,
            Duration::from_secs(3600),
            Some(n),
            42,
        )
        .unwrap();
        assert_eq!(a, b);
        let c = arrivals(
            Arrival::Poisson,
            rate,
            Duration::from_secs(3600),
            Some(n),
            43,
        )
        .unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn poisson_duration_bound() {
        let a = arrivals(Arrival::Poisson, 1000.0, Duration::from_secs(2), None, 7).unwrap();
        assert!(a.iter().all(|&t| t < 2_000_000_000));
        // ~2000 expected; 5 standard deviations is ~220.
        assert!((1700..2300).contains(&a.len()), "{}", a.len());
    }

    #[test]
    fn prng_is_fixed() {
        // splitmix64 seeded with 0: its published first output.
        let mut r = SplitMix64(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn bad_schedules() {
        let d = Duration::from_secs(1);
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = arrivals(Arrival::Constant, rate, d, None, 0).unwrap_err();
            assert!(e.0.contains("rate"), "{e}");
        }
        let e = arrivals(Arrival::Poisson, 1e9, Duration::from_secs(3600), None, 0).unwrap_err();
        assert!(e.0.contains("more than"), "{e}");
        // Within the cap thanks to the request budget.
        let a = arrivals(
            Arrival::Constant,
            1e9,
            Duration::from_secs(3600),
            Some(5),
            0,
        )
        .unwrap();
        assert_eq!(a, vec![0, 1, 2, 3, 4]);
        assert!(arrivals(Arrival::Constant, 10.0, Duration::ZERO, None, 0).is_err());
        assert!(arrivals(Arrival::Constant, 10.0, d, Some(0), 0).is_err());
    }

    fn trace(text: &str) -> Result<Vec<u64>, BenchError> {
        parse_trace(text.as_bytes(), "t.txt")
    }

    #[test]
    fn trace_parsing() {
        let text = "# a trace\n\n100.5\n100.5015  # trailing comment\r\n  100.6\n101\n1.015e2\n";
        assert_eq!(
            trace(text).unwrap(),
            vec![0, 1_500_000, 100_000_000, 500_000_000, 1_000_000_000]
        );
        // Epoch timestamps keep nanosecond precision.
        let t = trace("1700000000.000000001\n1700000000.123456789\n").unwrap();
        assert_eq!(t, vec![0, 123_456_788]);
        // No final newline; negative and `+` timestamps.
        assert_eq!(trace("-1\n+0.5").unwrap(), vec![0, 1_500_000_000]);
        assert_eq!(trace(".25\n1.").unwrap(), vec![0, 750_000_000]);
    }

    #[test]
    fn trace_errors_name_file_and_line() {
        let e = trace("0.1\n0.2\nabc\n").unwrap_err();
        assert!(e.0.starts_with("t.txt:3:") && e.0.contains("abc"), "{e}");
        let e = trace("0.2\n\n0.1\n").unwrap_err();
        assert!(
            e.0.starts_with("t.txt:3:") && e.0.contains("earlier"),
            "{e}"
        );
        for bad in ["nan", "inf", "-", ".", "1.2.3", "1e999"] {
            let e = trace(&format!("0\n{bad}\n")).unwrap_err();
            assert!(e.0.starts_with("t.txt:2:"), "{bad}: {e}");
        }
        let e = trace("# nothing\n\n").unwrap_err();
        assert!(e.0.contains("no timestamps"), "{e}");
        let long = format!("0\n{}\n", "1".repeat(MAX_TRACE_LINE + 10));
        let e = trace(&long).unwrap_err();
        assert!(e.0.starts_with("t.txt:2:") && e.0.contains("longer"), "{e}");
        let e = trace("0\n\u{0}\u{1}\n").unwrap_err();
        assert!(e.0.starts_with("t.txt:2:"), "{e}");
        let e = parse_trace(&[b'0', b'\n', 0xff, b'\n'][..], "t.txt").unwrap_err();
        assert!(e.0.contains("UTF-8"), "{e}");
        let e = trace("0\n1e12\n").unwrap_err();
        assert!(e.0.contains("too far"), "{e}");
    }

    #[test]
    fn read_trace_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trace.txt");
        std::fs::write(&p, "0\n0.001\n0.002\n").unwrap();
        assert_eq!(read_trace(&p).unwrap(), vec![0, 1_000_000, 2_000_000]);
        let e = read_trace(&dir.path().join("missing.txt")).unwrap_err();
        assert!(e.0.contains("missing.txt"), "{e}");
    }
}
