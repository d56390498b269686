//! Latency summaries: what the `tensorwire` command prints about a set of
//! timings.
//!
//! This module owns the one percentile definition the command uses, so every
//! number it reports (tensorwire's own ping, the raw socket floor, inference
//! latencies) is computed the same way: **nearest rank**. The q-quantile of
//! `n` samples is the `ceil(q·n)`-th smallest sample (1-based), clamped to
//! `1..=n`. It is always one of the measured samples, never an interpolation;
//! for 1..=100 the p50 is 50, the p90 is 90 and the p99 is 99. The rank is
//! computed in integers, so no floating-point rounding moves it.

use serde::Serialize;

/// A summary of latency samples, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Smallest sample.
    pub min_us: f64,
    /// Median (nearest rank: the `ceil(0.5·n)`-th smallest sample).
    pub p50_us: f64,
    /// 90th percentile (the `ceil(0.9·n)`-th smallest sample).
    pub p90_us: f64,
    /// 99th percentile (the `ceil(0.99·n)`-th smallest sample).
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Arithmetic mean.
    pub mean_us: f64,
}

/// Summarises `samples_ns` (nanoseconds, in any order) in microseconds, with
/// nearest-rank percentiles (see the module documentation). `None` when there
/// are no samples.
pub fn summarize(samples_ns: &[u64]) -> Option<Summary> {
    let mut sorted = samples_ns.to_vec();
    sorted.sort_unstable();
    let (&first, &last) = (sorted.first()?, sorted.last()?);
    let sum: u128 = sorted.iter().map(|&x| u128::from(x)).sum();
    let us = |ns: u64| ns as f64 / 1000.0;
    Some(Summary {
        count: sorted.len(),
        min_us: us(first),
        p50_us: us(nearest_rank(&sorted, 500)),
        p90_us: us(nearest_rank(&sorted, 900)),
        p99_us: us(nearest_rank(&sorted, 990)),
        max_us: us(last),
        mean_us: sum as f64 / sorted.len() as f64 / 1000.0,
    })
}

/// The `ceil(per_mille/1000 · n)`-th smallest of the sorted, non-empty
/// `sorted`, clamped to the first and last.
fn nearest_rank(sorted: &[u64], per_mille: u128) -> u64 {
    let n = sorted.len() as u128;
    let rank = (per_mille * n).div_ceil(1000).clamp(1, n);
    // rank is in 1..=n, so the index is in bounds; `get` keeps it panic-free.
    let index = usize::try_from(rank - 1).unwrap_or(0);
    sorted.get(index).copied().unwrap_or(0)
}

/// Median, minimum and maximum of `values` (e.g. one p50 per repeat of a
/// benchmark), to report how much repeats spread.
///
/// The median of an even count is the mean of the two middle values. NaNs
/// sort after every number (`f64::total_cmp`). Returns three NaNs when
/// `values` is empty.
pub fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_unstable_by(f64::total_cmp);
    let n = v.len();
    match (v.first(), v.last()) {
        (Some(&min), Some(&max)) => {
            let median = if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            };
            (median, min, max)
        }
        _ => (f64::NAN, f64::NAN, f64::NAN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_none() {
        assert_eq!(summarize(&[]), None);
    }

    #[test]
    fn one_to_hundred() {
        // 1..=100 µs, shuffled.
        let samples: Vec<u64> = (1..=100u64).map(|i| (i * 37 % 101) * 1000).collect();
        assert!(samples.iter().all(|&s| s > 0));
        let s = summarize(&samples).unwrap();
        assert_eq!(s.count, 100);
        assert_eq!(s.min_us, 1.0);
        assert_eq!(s.p50_us, 50.0);
        assert_eq!(s.p90_us, 90.0);
        assert_eq!(s.p99_us, 99.0);
        assert_eq!(s.max_us, 100.0);
        assert_eq!(s.mean_us, 50.5);
    }

    #[test]
    fn small_counts_use_nearest_rank() {
        let s = summarize(&[7_000]).unwrap();
        assert_eq!(
            (s.min_us, s.p50_us, s.p90_us, s.p99_us, s.max_us, s.mean_us),
            (7.0, 7.0, 7.0, 7.0, 7.0, 7.0)
        );
        // n = 4: p50 = 2nd, p90 = ceil(3.6) = 4th, p99 = 4th.
        let s = summarize(&[4_000, 1_000, 3_000, 2_000]).unwrap();
        assert_eq!((s.p50_us, s.p90_us, s.p99_us), (2.0, 4.0, 4.0));
        // n = 10: p50 = 5th, p90 = 9th, p99 = ceil(9.9) = 10th.
        let v: Vec<u64> = (1..=10).collect();
        let s = summarize(&v).unwrap();
        assert_eq!((s.p50_us, s.p90_us, s.p99_us), (0.005, 0.009, 0.010));
        // n = 1000: p99 = 990th.
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(summarize(&v).unwrap().p99_us, 0.99);
        // n = 101: p50 = ceil(50.5) = 51st.
        let v: Vec<u64> = (1..=101).collect();
        assert_eq!(summarize(&v).unwrap().p50_us, 0.051);
    }

    #[test]
    fn huge_values_do_not_overflow() {
        let s = summarize(&[u64::MAX, u64::MAX]).unwrap();
        assert_eq!(s.mean_us, u64::MAX as f64 / 1000.0);
    }

    #[test]
    fn serializes() {
        let s = summarize(&[1_500]).unwrap();
        let j = serde_json::to_value(s).unwrap();
        assert_eq!(j["p50_us"], 1.5);
        assert_eq!(j["count"], 1);
    }

    #[test]
    fn spread_of_repeats() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert_eq!(spread(&[5.0]), (5.0, 5.0, 5.0));
        let (m, lo, hi) = spread(&[]);
        assert!(m.is_nan() && lo.is_nan() && hi.is_nan());
    }
}
