//! Latency histograms: [`LatencyHist`], an HDR histogram of nanoseconds
//! (1 ns ..= 1 hour, 3 significant digits) with its percentiles, mean and
//! CDF, and [`StageHists`], one such histogram per [`Stage`].
//!
//! # Percentile definition
//!
//! [`LatencyHist::percentile_us`] is the histogram's `value_at_quantile`:
//! **nearest rank** on the recorded counts — the `ceil(q·n)`-th smallest
//! value (at least the 1st) — reported as the *highest* value of the HDR
//! bucket that value fell in (the *lowest* for `q = 0`). With 3 significant
//! digits a bucket is at most 0.1 % wide, so a percentile is the same rank
//! as [`crate::stats`]'s nearest rank, rounded up by at most 0.1 %. It is
//! finally clamped to the exact smallest and largest values recorded, so
//! `q = 0` is the exact minimum, `q = 1` the exact maximum, and a histogram
//! of identical values reports that value exactly.
//!
//! The mean, minimum and maximum are exact (kept beside the histogram), not
//! estimated from buckets.

use crate::caller::{Stage, StageSample};
use crate::results::StageStat;
use hdrhistogram::Histogram;

/// The largest value a [`LatencyHist`] holds: one hour in nanoseconds.
/// Larger values are recorded as this and counted in
/// [`LatencyHist::clamped`].
pub const MAX_NS: u64 = 3_600_000_000_000;

/// Significant decimal digits the histogram keeps (relative error ≤ 0.1 %).
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// The quantiles of a CDF plot ([`LatencyHist::cdf`]): dense in the body
/// and ever finer into the tail, from the minimum (0) to the maximum (1).
pub const CDF_QUANTILES: &[f64] = &[
    0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55,
    0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.96, 0.97, 0.98, 0.99, 0.995, 0.998, 0.999,
    0.9995, 0.9999, 1.0,
];

/// A latency histogram in nanoseconds (HDR: 1 ns ..= [`MAX_NS`],
/// [`SIGNIFICANT_DIGITS`] significant digits; its buckets are allocated as
/// far as the largest value recorded needs). See the module documentation
/// for the percentile definition. All `*_us` figures are microseconds and
/// are `0.0` when nothing was recorded.
#[derive(Clone, Debug)]
pub struct LatencyHist {
    hist: Histogram<u64>,
    /// Exact sum of the recorded (clamped) values.
    sum_ns: u128,
    /// Exact smallest recorded value (`u64::MAX` when empty).
    min_ns: u64,
    /// Exact largest recorded (clamped) value (0 when empty).
    max_ns: u64,
    /// Values above [`MAX_NS`] that were recorded as [`MAX_NS`].
    clamped: u64,
}

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist::new()
    }
}

impl LatencyHist {
    /// An empty histogram.
    pub fn new() -> LatencyHist {
        // Start small and grow to the largest value recorded (at most
        // MAX_NS, as values are clamped first): ~16 KiB for sub-2 µs values,
        // ~270 KiB once an hour-long value is in. A load keeps one per thread
        // and per stage, so a fixed 1-hour range would cost 2 MiB a thread.
        let mut hist = Histogram::new_with_bounds(1, 2, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        hist.auto(true);
        LatencyHist {
            hist,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            clamped: 0,
        }
    }

    /// Records one latency of `ns` nanoseconds. A value above [`MAX_NS`] is
    /// recorded as [`MAX_NS`] and counted in [`LatencyHist::clamped`].
    pub fn record(&mut self, ns: u64) {
        let v = if ns > MAX_NS {
            self.clamped += 1;
            MAX_NS
        } else {
            ns
        };
        if self.hist.record(v).is_err() {
            // Only a failed resize (impossible with u64 counts on 64-bit)
            // gets here: keep the value, clamped to the current range.
            self.hist.saturating_record(v);
        }
        self.sum_ns += u128::from(v);
        self.min_ns = self.min_ns.min(v);
        self.max_ns = self.max_ns.max(v);
    }

    /// Adds every value of `other` to this histogram.
    pub fn merge(&mut self, other: &LatencyHist) {
        if other.count() == 0 {
            return;
        }
        if self.hist.add(&other.hist).is_err() {
            // `add` resizes as needed, so it cannot fail; should it ever,
            // copy bucket by bucket (saturating).
            for v in other.hist.iter_recorded() {
                self.hist
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
        self.sum_ns += other.sum_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        self.clamped += other.clamped;
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Values that were above [`MAX_NS`] and recorded as [`MAX_NS`].
    pub fn clamped(&self) -> u64 {
        self.clamped
    }

    /// The `q`-quantile (`q` in `0..=1`, clamped into it; NaN counts as 0)
    /// in microseconds: nearest rank, as defined in the module
    /// documentation. `0.0` when empty.
    pub fn percentile_us(&self, q: f64) -> f64 {
        self.percentile_ns(q) as f64 / 1e3
    }

    /// [`LatencyHist::percentile_us`] in nanoseconds.
    pub fn percentile_ns(&self, q: f64) -> u64 {
        if self.count() == 0 {
            return 0;
        }
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        self.hist
            .value_at_quantile(q)
            .clamp(self.min_ns, self.max_ns)
    }

    /// Exact arithmetic mean in microseconds (`0.0` when empty).
    pub fn mean_us(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum_ns as f64 / n as f64 / 1e3,
        }
    }

    /// Exact smallest value in microseconds (`0.0` when empty).
    pub fn min_us(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            _ => self.min_ns as f64 / 1e3,
        }
    }

    /// Exact largest value in microseconds (`0.0` when empty).
    pub fn max_us(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            _ => self.max_ns as f64 / 1e3,
        }
    }

    /// `[quantile, µs]` at each of `quantiles` (e.g. [`CDF_QUANTILES`]):
    /// the points of a CDF plot. Empty when nothing was recorded.
    pub fn cdf(&self, quantiles: &[f64]) -> Vec<[f64; 2]> {
        if self.count() == 0 {
            return Vec::new();
        }
        quantiles
            .iter()
            .map(|&q| [q, self.percentile_us(q)])
            .collect()
    }
}

/// One [`LatencyHist`] per [`Stage`]: the stage split of many requests.
///
/// The histograms are only allocated when the first sample is recorded, so
/// an empty `StageHists` (targets that report no stages) costs nothing.
#[derive(Clone, Debug, Default)]
pub struct StageHists {
    /// Empty, or one histogram per stage in [`Stage::ALL`] order.
    hists: Vec<LatencyHist>,
}

impl StageHists {
    /// No samples.
    pub fn new() -> StageHists {
        StageHists { hists: Vec::new() }
    }

    fn ensure(&mut self) {
        if self.hists.is_empty() {
            self.hists = (0..Stage::COUNT).map(|_| LatencyHist::new()).collect();
        }
    }

    /// Records one request's stage durations.
    pub fn record(&mut self, sample: &StageSample) {
        self.ensure();
        for (h, &ns) in self.hists.iter_mut().zip(sample.0.iter()) {
            h.record(ns);
        }
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &StageHists) {
        if other.count() == 0 {
            return;
        }
        self.ensure();
        for (h, o) in self.hists.iter_mut().zip(other.hists.iter()) {
            h.merge(o);
        }
    }

    /// Requests recorded.
    pub fn count(&self) -> u64 {
        self.hists.first().map_or(0, LatencyHist::count)
    }

    /// The histogram of one stage (`None` when nothing was recorded).
    pub fn get(&self, stage: Stage) -> Option<&LatencyHist> {
        self.hists.get(stage.index())
    }

    /// Median and mean of every stage, in [`Stage::ALL`] order; empty when
    /// nothing was recorded.
    pub fn stats(&self) -> Vec<StageStat> {
        if self.count() == 0 {
            return Vec::new();
        }
        Stage::ALL
            .iter()
            .zip(self.hists.iter())
            .map(|(s, h)| StageStat {
                stage: s.name().to_string(),
                p50_us: h.percentile_us(0.5),
                mean_us: h.mean_us(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    fn uniform_1_to_1000_us() -> LatencyHist {
        let mut h = LatencyHist::new();
        // 1..=1000 µs in a scrambled order.
        for i in 1..=1000u64 {
            h.record((i * 617 % 1001) * 1000);
        }
        h
    }

    #[test]
    fn uniform_percentiles_and_mean() {
        let h = uniform_1_to_1000_us();
        assert_eq!(h.count(), 1000);
        // Nearest rank: p50 = 500th, p90 = 900th, p99 = 990th smallest,
        // rounded up to the bucket's top (≤ 0.1 %).
        for (q, want) in [(0.5, 500.0), (0.9, 900.0), (0.99, 990.0), (0.999, 999.0)] {
            let got = h.percentile_us(q);
            assert!(got >= want && close(got, want, 0.001), "q={q}: {got}");
        }
        assert_eq!(h.mean_us(), 500.5);
        assert_eq!(h.min_us(), 1.0);
        assert_eq!(h.max_us(), 1000.0);
        assert_eq!(h.percentile_us(0.0), 1.0);
        assert_eq!(h.percentile_us(1.0), 1000.0);
        // Out-of-range quantiles clamp.
        assert_eq!(h.percentile_us(-1.0), 1.0);
        assert_eq!(h.percentile_us(7.0), 1000.0);
        assert_eq!(h.percentile_us(f64::NAN), 1.0);
    }

    #[test]
    fn identical_values_are_exact() {
        let mut h = LatencyHist::new();
        for _ in 0..10 {
            h.record(12_345);
        }
        assert_eq!(h.percentile_us(0.5), 12.345);
        assert_eq!(h.percentile_us(0.99), 12.345);
        assert_eq!(h.mean_us(), 12.345);
    }

    #[test]
    fn empty_is_zero() {
        let h = LatencyHist::new();
        assert_eq!(h.count(), 0);
        assert_eq!(h.percentile_us(0.5), 0.0);
        assert_eq!(h.mean_us(), 0.0);
        assert_eq!(h.min_us(), 0.0);
        assert_eq!(h.max_us(), 0.0);
        assert!(h.cdf(CDF_QUANTILES).is_empty());
    }

    #[test]
    fn huge_and_zero_values() {
        let mut h = LatencyHist::new();
        h.record(0);
        h.record(u64::MAX);
        h.record(MAX_NS + 1);
        assert_eq!(h.count(), 3);
        assert_eq!(h.clamped(), 2);
        assert_eq!(h.min_us(), 0.0);
        assert_eq!(h.max_us(), MAX_NS as f64 / 1e3);
        assert_eq!(h.percentile_us(1.0), MAX_NS as f64 / 1e3);
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = uniform_1_to_1000_us();
        let mut b = LatencyHist::new();
        for _ in 0..1000 {
            b.record(2_000_000); // 2 ms
        }
        a.merge(&b);
        assert_eq!(a.count(), 2000);
        assert_eq!(a.max_us(), 2000.0);
        assert_eq!(a.mean_us(), (500.5 + 2000.0) / 2.0);
        // The 1000th smallest is 1000 µs; above it, only 2 ms.
        assert!(close(a.percentile_us(0.5), 1000.0, 0.001));
        assert_eq!(a.percentile_us(0.51), 2000.0);
        // Merging an empty histogram changes nothing.
        a.merge(&LatencyHist::new());
        assert_eq!(a.count(), 2000);
        assert_eq!(a.min_us(), 1.0);
    }

    #[test]
    fn cdf_is_monotone_and_spans_min_to_max() {
        assert!(CDF_QUANTILES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(CDF_QUANTILES.first(), Some(&0.0));
        assert_eq!(CDF_QUANTILES.last(), Some(&1.0));
        let h = uniform_1_to_1000_us();
        let cdf = h.cdf(CDF_QUANTILES);
        assert_eq!(cdf.len(), CDF_QUANTILES.len());
        assert!(cdf.windows(2).all(|w| w[0][1] <= w[1][1]));
        assert_eq!(cdf[0], [0.0, 1.0]);
        assert_eq!(cdf[cdf.len() - 1], [1.0, 1000.0]);
    }

    #[test]
    fn stage_hists() {
        let mut s = StageHists::new();
        assert_eq!(s.count(), 0);
        assert!(s.stats().is_empty());
        assert!(s.get(Stage::Compute).is_none());
        for i in 1..=100u64 {
            let mut v = [0u64; Stage::COUNT];
            for (k, x) in v.iter_mut().enumerate() {
                *x = i * 1000 * (k as u64 + 1);
            }
            s.record(&StageSample(v));
        }
        let stats = s.stats();
        assert_eq!(stats.len(), Stage::COUNT);
        for (k, st) in stats.iter().enumerate() {
            assert_eq!(st.stage, Stage::ALL[k].name());
            let scale = (k + 1) as f64;
            assert!(close(st.p50_us, 50.0 * scale, 0.001), "{st:?}");
            assert!(close(st.mean_us, 50.5 * scale, 1e-9), "{st:?}");
        }
        let mut t = StageHists::new();
        t.merge(&StageHists::new());
        assert_eq!(t.count(), 0);
        t.merge(&s);
        t.merge(&s);
        assert_eq!(t.count(), 200);
        assert_eq!(t.get(Stage::ClientSend).map(LatencyHist::count), Some(200));
    }
}
