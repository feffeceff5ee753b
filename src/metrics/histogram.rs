//! A lock-free histogram with etcd's disk-latency buckets (0.001 * 2^k s, k = 0..13), the same
//! bounds as [`DISK_BUCKETS`](super::DISK_BUCKETS) so both disk histograms line up on dashboards.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::DISK_BUCKETS;

/// Observations are stored per bucket (not cumulative) so `observe` is two atomic adds;
/// [`AtomicHistogram::snapshot`] makes them cumulative for exposition.
pub struct AtomicHistogram {
    count: AtomicU64,
    sum_nanos: AtomicU64,
    buckets: [AtomicU64; 14],
}

/// Cumulative view, in the shape Prometheus exposes: `buckets[k]` counts observations
/// `<= DISK_BUCKETS[k]`; the `+Inf` bucket is `count`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    pub buckets: [u64; 14],
    pub count: u64,
    pub sum_seconds: f64,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl AtomicHistogram {
    pub const fn new() -> Self {
        #[allow(clippy::declare_interior_mutable_const)]
        const Z: AtomicU64 = AtomicU64::new(0);
        AtomicHistogram {
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
            buckets: [Z; 14],
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(k) = DISK_BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[k].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_nanos
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        // Count last: a concurrent scrape may see a bucket ahead of the count, never behind
        // by more than the observations in flight.
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut buckets = [0u64; 14];
        let mut acc = 0;
        for (k, b) in self.buckets.iter().enumerate() {
            acc += b.load(Ordering::Relaxed);
            buckets[k] = acc;
        }
        let count = self.count.load(Ordering::Relaxed).max(acc);
        HistogramSnapshot {
            buckets,
            count,
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_le_inclusive() {
        let h = AtomicHistogram::new();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.buckets[0], 2);
        assert_eq!(s.buckets[1], 2);
        assert_eq!(s.buckets[2], 3);
        assert_eq!(s.buckets[13], 3);
        assert_eq!(s.count, 4);
        assert!((s.sum_seconds - 60.0045).abs() < 1e-6);
    }

    #[test]
    fn disk_buckets_are_etcds() {
        // etcd: prometheus.ExponentialBuckets(0.001, 2, 14).
        assert_eq!(DISK_BUCKETS[0], 0.001);
        assert_eq!(DISK_BUCKETS[1], 0.002);
        assert!((DISK_BUCKETS[13] - 8.192).abs() < 1e-12);
    }
}
