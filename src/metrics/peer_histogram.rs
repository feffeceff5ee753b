//! Histograms with one series per peer, over bounds given at construction (etcd's
//! `HistogramVec`s labelled `To` or `From`, such as its snapshot send and receive durations).
//!
//! Invariants:
//! - A peer's series exists from its first observation on and is never removed (as a Go
//!   `HistogramVec` child), so its counts only grow.
//! - Buckets are stored per bucket and made cumulative by [`PeerHistograms::snapshot`]; an
//!   observation above the last bound counts only in `count` (the `+Inf` bucket).
//! - Observations are rare (one per snapshot send or receive), so a mutex is cheap enough.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::sync::LockExt;

/// Upper bounds (seconds) of etcd's snapshot send and receive duration buckets
/// (`etcd_network_snapshot_{send,receive}_total_duration_seconds`): 0.1 * 2^k, k = 0..9.
pub const SNAPSHOT_BUCKETS: [f64; 10] = super::exponential_buckets(0.1);

/// One histogram per peer (member id), all over the same bounds.
pub struct PeerHistograms {
    bounds: &'static [f64],
    by_peer: Mutex<BTreeMap<u64, Series>>,
}

/// A peer's observations, per bucket (not cumulative).
#[derive(Default)]
struct Series {
    buckets: Vec<u64>,
    count: u64,
    sum_seconds: f64,
}

/// One peer's series in the shape Prometheus exposes: `buckets[k]` counts observations
/// `<= bounds[k]`; the `+Inf` bucket is `count`.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerSeries {
    pub peer: u64,
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl PeerHistograms {
    pub const fn new(bounds: &'static [f64]) -> Self {
        PeerHistograms {
            bounds,
            by_peer: Mutex::new(BTreeMap::new()),
        }
    }

    /// The buckets' upper bounds, in seconds.
    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    pub fn observe(&self, peer: u64, d: Duration) {
        let secs = d.as_secs_f64();
        let mut by_peer = self.by_peer.lock_or_recover();
        let s = by_peer.entry(peer).or_default();
        if s.buckets.is_empty() {
            s.buckets = vec![0; self.bounds.len()];
        }
        if let Some(k) = self.bounds.iter().position(|b| secs <= *b) {
            s.buckets[k] += 1;
        }
        s.count += 1;
        s.sum_seconds += secs;
    }

    /// Every peer's series, by peer id.
    pub fn snapshot(&self) -> Vec<PeerSeries> {
        let by_peer = self.by_peer.lock_or_recover();
        by_peer
            .iter()
            .map(|(peer, s)| PeerSeries {
                peer: *peer,
                buckets: s
                    .buckets
                    .iter()
                    .scan(0, |acc, n| {
                        *acc += n;
                        Some(*acc)
                    })
                    .collect(),
                count: s.count,
                sum_seconds: s.sum_seconds,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_per_peer_and_cumulative() {
        let h = PeerHistograms::new(&SNAPSHOT_BUCKETS);
        h.observe(7, Duration::from_millis(50));
        h.observe(7, Duration::from_millis(300));
        h.observe(7, Duration::from_secs(100));
        h.observe(3, Duration::from_millis(100));
        let s = h.snapshot();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].peer, s[0].count), (3, 1));
        assert_eq!(s[0].buckets[0], 1, "a bound is inclusive");
        let p7 = &s[1];
        assert_eq!(p7.peer, 7);
        assert_eq!(&p7.buckets[..3], &[1, 1, 2]);
        assert_eq!(p7.buckets[9], 2, "above the last bound: only in the count");
        assert_eq!(p7.count, 3);
        assert!((p7.sum_seconds - 100.35).abs() < 1e-9);
        assert!((SNAPSHOT_BUCKETS[9] - 51.2).abs() < 1e-9);
    }
}
