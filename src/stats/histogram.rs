//! A lock-free, allocation-free latency histogram.
//!
//! [`AtomicHistogram::record`] touches only atomics in a fixed-size array, so
//! it may run inside a signal handler (the SIGBUS fault path records into
//! these).
//!
//! # Bucket layout
//!
//! Log-linear: values `0..16` each get an exact bucket (group 0). Every value
//! `v >= 16` with most significant bit `m` (`4 <= m <= 63`) falls in group
//! `m - 3`, which splits `[2^m, 2^(m+1))` into [`SUB_BUCKETS`] equal linear
//! sub-buckets of width `2^(m-4)`. A bucket's width is therefore at most
//! 1/16 of its lower bound: the relative error of reporting any bucket value
//! is at most 6.25%, and at most ~3.1% when the bucket midpoint is reported.
//! Values below 32 are exact.

use std::sync::atomic::{AtomicU64, Ordering};

/// log2 of the number of linear sub-buckets per power-of-two group.
const SUB_BITS: u32 = 4;
/// Linear sub-buckets per power-of-two group.
pub const SUB_BUCKETS: usize = 1 << SUB_BITS;
/// Power-of-two groups: group 0 (values below 16) plus one per bit position
/// 4..=63.
const GROUPS: usize = 64 - SUB_BITS as usize + 1;
/// Total number of buckets.
pub const NUM_BUCKETS: usize = GROUPS * SUB_BUCKETS;

/// The bucket holding `v`.
#[inline]
const fn bucket_index(v: u64) -> usize {
    if v < SUB_BUCKETS as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros(); // >= SUB_BITS
    let group = (msb - SUB_BITS + 1) as usize;
    let sub = ((v >> (msb - SUB_BITS)) as usize) & (SUB_BUCKETS - 1);
    group * SUB_BUCKETS + sub
}

/// Inclusive bounds `(low, high)` of bucket `i`.
#[inline]
const fn bucket_bounds(i: usize) -> (u64, u64) {
    let group = i / SUB_BUCKETS;
    let sub = (i % SUB_BUCKETS) as u64;
    if group == 0 {
        return (sub, sub);
    }
    let shift = (group - 1) as u32;
    let low = (SUB_BUCKETS as u64 + sub) << shift;
    let width = 1u64 << shift;
    // `low + width - 1` cannot overflow: the top bucket ends at u64::MAX.
    (low, low + (width - 1))
}

/// The value reported for bucket `i`: the middle of its range.
#[inline]
const fn bucket_mid(i: usize) -> u64 {
    let (low, high) = bucket_bounds(i);
    low + (high - low) / 2
}

/// Summary of a histogram's contents, in nanoseconds: a [`Stats`](crate::Stats)
/// field (`fault_latency`; see [`Counter`](crate::Counter) for an example).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Percentiles {
    /// Number of recorded values.
    pub count: u64,
    /// Exact mean (from the running sum).
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Exact maximum.
    pub max_ns: u64,
}

/// A latency histogram in nanoseconds, safe to record into from any thread
/// and from signal handlers.
///
/// Readers ([`count`](Self::count), [`percentiles`](Self::percentiles), ...)
/// see a value-by-value snapshot: concurrent records may be partly visible,
/// which is harmless for reporting. [`reset`](Self::reset) is likewise not
/// atomic with respect to concurrent records.
pub struct AtomicHistogram {
    buckets: [AtomicU64; NUM_BUCKETS],
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
    min: AtomicU64,
}

impl AtomicHistogram {
    /// An empty histogram. Usable in `static`s.
    pub const fn new() -> Self {
        AtomicHistogram {
            buckets: [const { AtomicU64::new(0) }; NUM_BUCKETS],
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
            min: AtomicU64::new(u64::MAX),
        }
    }

    /// Records one value. Async-signal-safe: a handful of relaxed atomic
    /// read-modify-writes, no allocation, no locks.
    #[inline]
    pub fn record(&self, ns: u64) {
        self.buckets[bucket_index(ns)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ns, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
        self.min.fetch_min(ns, Ordering::Relaxed);
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Sum of recorded values (wrapping on overflow, after ~584 years of
    /// accumulated latency).
    pub fn sum_ns(&self) -> u64 {
        self.sum.load(Ordering::Relaxed)
    }

    /// Largest recorded value; 0 when empty.
    pub fn max_ns(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// Smallest recorded value; 0 when empty.
    pub fn min_ns(&self) -> u64 {
        match self.min.load(Ordering::Relaxed) {
            u64::MAX if self.count() == 0 => 0,
            v => v,
        }
    }

    #[cfg(test)]
    /// Exact mean; 0 when empty.
    pub fn mean_ns(&self) -> f64 {
        let n = self.count();
        if n == 0 {
            0.0
        } else {
            self.sum_ns() as f64 / n as f64
        }
    }

    /// Empties the histogram.
    pub fn reset(&self) {
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
        self.sum.store(0, Ordering::Relaxed);
        self.max.store(0, Ordering::Relaxed);
        self.min.store(u64::MAX, Ordering::Relaxed);
    }

    /// Adds everything recorded in `other` into `self` (for merging per-CPU
    /// histograms into one for a report).
    pub fn absorb(&self, other: &AtomicHistogram) {
        for (a, b) in self.buckets.iter().zip(&other.buckets) {
            a.fetch_add(b.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.count
            .fetch_add(other.count.load(Ordering::Relaxed), Ordering::Relaxed);
        self.sum
            .fetch_add(other.sum.load(Ordering::Relaxed), Ordering::Relaxed);
        self.max
            .fetch_max(other.max.load(Ordering::Relaxed), Ordering::Relaxed);
        self.min
            .fetch_min(other.min.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Copies the bucket counts out (one relaxed load each).
    fn snapshot(&self) -> ([u64; NUM_BUCKETS], u64) {
        let mut counts = [0u64; NUM_BUCKETS];
        let mut total = 0u64;
        for (c, b) in counts.iter_mut().zip(&self.buckets) {
            *c = b.load(Ordering::Relaxed);
            total = total.saturating_add(*c);
        }
        (counts, total)
    }

    /// The value at quantile `q` (0..=1) of a bucket snapshot holding `total`
    /// values: the midpoint of the bucket holding the `ceil(q * total)`-th
    /// smallest value.
    fn quantile(counts: &[u64; NUM_BUCKETS], total: u64, q: f64) -> u64 {
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0u64;
        for (i, &c) in counts.iter().enumerate() {
            seen = seen.saturating_add(c);
            if seen >= rank {
                return bucket_mid(i);
            }
        }
        bucket_mid(NUM_BUCKETS - 1)
    }

    /// Count, mean and the usual percentiles. Percentiles are bucket
    /// midpoints (within ~3% of the true value), clamped to the exact
    /// observed minimum and maximum.
    pub fn percentiles(&self) -> Percentiles {
        let (counts, total) = self.snapshot();
        if total == 0 {
            return Percentiles::default();
        }
        let max = self.max_ns();
        let min = self.min_ns().min(max);
        let at = |q: f64| Self::quantile(&counts, total, q).clamp(min, max);
        Percentiles {
            count: total,
            mean_ns: self.sum_ns() as f64 / total as f64,
            p50_ns: at(0.50),
            p90_ns: at(0.90),
            p99_ns: at(0.99),
            p999_ns: at(0.999),
            max_ns: max,
        }
    }

    #[cfg(test)]
    /// Builds an [`hdrhistogram::Histogram`] holding each bucket's midpoint
    /// with that bucket's count. Values beyond what hdrhistogram can track
    /// (above `u64::MAX / 2`) are saturated. Allocates: not for signal
    /// handlers.
    pub fn to_hdr(&self) -> hdrhistogram::Histogram<u64> {
        let (counts, _) = self.snapshot();
        let mut h = hdrhistogram::Histogram::<u64>::new(3)
            .expect("3 significant figures is a valid hdrhistogram precision");
        for (i, &c) in counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let v = bucket_mid(i).min(u64::MAX / 2);
            if h.record_n(v, c).is_err() {
                h.saturating_record_n(v, c);
            }
        }
        h
    }
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for AtomicHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtomicHistogram")
            .field("percentiles", &self.percentiles())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_range_contiguously() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(u64::MAX), NUM_BUCKETS - 1);
        assert_eq!(bucket_bounds(0), (0, 0));
        assert_eq!(bucket_bounds(NUM_BUCKETS - 1).1, u64::MAX);
        for i in 1..NUM_BUCKETS {
            let (prev_lo, prev_hi) = bucket_bounds(i - 1);
            let (lo, hi) = bucket_bounds(i);
            assert!(prev_lo <= prev_hi && lo <= hi, "bucket {i}");
            assert_eq!(prev_hi + 1, lo, "gap or overlap before bucket {i}");
            assert_eq!(bucket_index(lo), i);
            assert_eq!(bucket_index(hi), i);
        }
    }

    #[test]
    fn relative_error_is_bounded() {
        let mut v = 1u64;
        while v < u64::MAX / 3 {
            for x in [v, v + v / 3, v * 2 - 1] {
                let mid = bucket_mid(bucket_index(x));
                let err = (mid as f64 - x as f64).abs() / x as f64;
                assert!(err <= 1.0 / 16.0, "value {x}: mid {mid}, error {err}");
            }
            v *= 2;
        }
        for x in 0..32 {
            assert_eq!(bucket_mid(bucket_index(x)), x, "small values are exact");
        }
    }

    #[test]
    fn empty_histogram() {
        let h = AtomicHistogram::new();
        assert_eq!(h.count(), 0);
        assert_eq!(h.sum_ns(), 0);
        assert_eq!(h.max_ns(), 0);
        assert_eq!(h.min_ns(), 0);
        assert_eq!(h.percentiles(), Percentiles::default());
        assert_eq!(h.to_hdr().len(), 0);
    }

    #[test]
    fn percentiles_of_known_inputs() {
        let h = AtomicHistogram::default();
        // 1..=1000 µs, one each.
        for us in 1..=1000u64 {
            h.record(us * 1000);
        }
        let p = h.percentiles();
        assert_eq!(p.count, 1000);
        assert_eq!(h.sum_ns(), 500_500_000);
        assert!((p.mean_ns - 500_500.0).abs() < 1e-6);
        assert_eq!(p.max_ns, 1_000_000);
        assert_eq!(h.min_ns(), 1000);
        let close = |got: u64, want: u64| {
            let err = (got as f64 - want as f64).abs() / want as f64;
            assert!(err <= 0.0625, "got {got}, want {want} (error {err})");
        };
        close(p.p50_ns, 500_000);
        close(p.p90_ns, 900_000);
        close(p.p99_ns, 990_000);
        close(p.p999_ns, 999_000);
        assert!(p.p50_ns <= p.p90_ns && p.p90_ns <= p.p99_ns && p.p99_ns <= p.p999_ns);
        assert!(p.p999_ns <= p.max_ns);
    }

    #[test]
    fn exact_small_values() {
        let h = AtomicHistogram::new();
        for _ in 0..90 {
            h.record(5);
        }
        for _ in 0..10 {
            h.record(20);
        }
        let p = h.percentiles();
        assert_eq!(p.p50_ns, 5);
        assert_eq!(p.p90_ns, 5);
        assert_eq!(p.p99_ns, 20);
        assert_eq!(p.max_ns, 20);
        assert!((p.mean_ns - 6.5).abs() < 1e-9);
    }

    #[test]
    fn single_value_percentiles_are_exact() {
        let h = AtomicHistogram::new();
        h.record(123_457);
        let p = h.percentiles();
        // Clamped to the exact min/max, so a single value is reported exactly.
        assert_eq!(p.p50_ns, 123_457);
        assert_eq!(p.p999_ns, 123_457);
        assert_eq!(p.max_ns, 123_457);
    }

    #[test]
    fn extreme_values() {
        let h = AtomicHistogram::new();
        h.record(0);
        h.record(u64::MAX);
        assert_eq!(h.count(), 2);
        assert_eq!(h.max_ns(), u64::MAX);
        let p = h.percentiles();
        assert_eq!(p.p50_ns, 0);
        assert_eq!(p.p999_ns, u64::MAX - (1u64 << 59) / 2);
        assert_eq!(h.to_hdr().len(), 2);
    }

    #[test]
    fn reset_empties() {
        let h = AtomicHistogram::new();
        h.record(10);
        h.record(1_000_000);
        h.reset();
        assert_eq!(h.count(), 0);
        assert_eq!(h.max_ns(), 0);
        assert_eq!(h.min_ns(), 0);
        assert_eq!(h.percentiles(), Percentiles::default());
        h.record(7);
        assert_eq!(h.percentiles().p50_ns, 7);
        assert_eq!(h.min_ns(), 7);
    }

    #[test]
    fn to_hdr_agrees() {
        let h = AtomicHistogram::new();
        for us in 1..=1000u64 {
            h.record(us * 1000);
        }
        let hdr = h.to_hdr();
        assert_eq!(hdr.len(), 1000);
        let p = h.percentiles();
        for (q, ours) in [(0.5, p.p50_ns), (0.9, p.p90_ns), (0.99, p.p99_ns)] {
            let theirs = hdr.value_at_quantile(q);
            let err = (theirs as f64 - ours as f64).abs() / ours as f64;
            assert!(err < 0.01, "q {q}: hdr {theirs}, ours {ours}");
        }
        assert!((hdr.mean() - p.mean_ns).abs() / p.mean_ns < 0.02);
    }

    #[test]
    fn concurrent_records_are_all_counted() {
        static H: AtomicHistogram = AtomicHistogram::new();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        H.record(t * 1_000_000 + i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(H.count(), 40_000);
        assert_eq!(H.percentiles().count, 40_000);
        assert_eq!(H.max_ns(), 3_000_000 + 9_999);
    }
}
