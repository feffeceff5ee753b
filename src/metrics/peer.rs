//! Per-peer counters and histograms, labelled `To` or `From` with the member id in etcd's
//! lowercase hex form.
//!
//! A peer's series exists from its first record on and is never removed (as a Go
//! `CounterVec` child). Each record looks the series up under the vector's read lock: these
//! record failures and snapshot transfers, not the write path. A path that records per
//! message keeps the handle from [`PeerCounters::peer`] instead.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts};

pub struct PeerCounters(IntCounterVec);

impl PeerCounters {
    pub fn new(name: &str, help: &str, label: &str) -> Self {
        PeerCounters(IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid options"))
    }

    /// The series of `peer`, to keep where it is recorded often.
    pub fn peer(&self, peer: u64) -> IntCounter {
        self.0.with_label_values(&[format!("{peer:x}")])
    }

    pub fn inc(&self, peer: u64) {
        self.peer(peer).inc()
    }

    pub(super) fn vec(&self) -> &IntCounterVec {
        &self.0
    }
}

pub struct PeerHistograms(HistogramVec);

impl PeerHistograms {
    pub fn new(name: &str, help: &str, label: &str, bounds: &[f64]) -> Self {
        let opts = HistogramOpts::new(name, help).buckets(bounds.to_vec());
        PeerHistograms(HistogramVec::new(opts, &[label]).expect("valid options"))
    }

    /// The series of `peer`, to keep where it is recorded often.
    pub fn peer(&self, peer: u64) -> prometheus::Histogram {
        self.0.with_label_values(&[format!("{peer:x}")])
    }

    pub fn observe(&self, peer: u64, d: Duration) {
        self.peer(peer).observe(d.as_secs_f64())
    }

    pub(super) fn vec(&self) -> &HistogramVec {
        &self.0
    }
}
