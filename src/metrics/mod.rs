//! Metrics primitives on the `prometheus` crate (docs/decisions/0042-prometheus-crate.md):
//! the process-wide registry, the counters and histograms the layers record into, the
//! recent-latency window, and the helpers that turn values read at scrape time into metric
//! families. This module is a leaf: it depends on no other kvd module, so every layer (WAL,
//! MVCC, Raft, server) may record into it. What reads a member's state to export it (the
//! `/metrics` scrape, `/health`) belongs to the server layer (`server::observe`).
//!
//! Metric names, types, help texts, label names and bucket bounds are etcd 3.4's, so etcd's
//! monitoring mixin and Grafana dashboards work unchanged against kvd.
//!
//! Invariants:
//! - Recording never blocks on the write path: counters and histograms are atomics inside the
//!   `prometheus` types, and labelled series that a hot path records into are resolved once
//!   (the gRPC table, [`PeerCounters`]) and kept as handles, never looked up per call.
//! - Everything registered in [`registry`] is process-wide, like Go's default registry: the
//!   `kvd` binary runs one member per process, so they are that member's. In-process test
//!   clusters share them. Values a member owns (WAL, Raft progress) are read at scrape time
//!   and built into families by [`family`].
//! - Every disk-latency histogram uses [`DISK_BUCKETS`], so they line up on dashboards.

mod etcd;
pub mod family;
mod grpc;
mod os;
mod peer;
mod recent;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounter, Registry};

pub use etcd::*;
pub use grpc::{GrpcType, Handled as GrpcHandled, CODE_NAMES};
pub use os::{address_space_limit, fd_limit, fd_used};
pub use peer::{PeerCounters, PeerHistograms};
pub use prometheus::proto::MetricFamily;
pub use recent::{RecentLatency, RecentSummary, WINDOW_SECS};

/// Upper bounds (seconds) of etcd's disk latency histogram buckets
/// (`etcd_disk_wal_fsync_duration_seconds`, `etcd_disk_backend_commit_duration_seconds`):
/// 0.001 * 2^k, k = 0..13.
pub const DISK_BUCKETS: [f64; 14] = exponential_buckets(0.001);

/// Upper bounds (seconds) of etcd's snapshot send and receive duration buckets
/// (`etcd_network_snapshot_{send,receive}_total_duration_seconds`): 0.1 * 2^k, k = 0..9.
pub const SNAPSHOT_BUCKETS: [f64; 10] = exponential_buckets(0.1);

/// `N` upper bounds `start * 2^k`, k = 0..N-1: Prometheus' `ExponentialBuckets(start, 2, N)`,
/// which etcd's histograms use.
pub const fn exponential_buckets<const N: usize>(start: f64) -> [f64; N] {
    let mut b = [0.0; N];
    let mut k = 0;
    while k < N {
        b[k] = start * (1u64 << k) as f64;
        k += 1;
    }
    b
}

/// A histogram of durations in seconds.
pub struct Seconds(Histogram);

impl Seconds {
    fn new(name: &str, help: &str, bounds: &[f64]) -> Self {
        let opts = HistogramOpts::new(name, help).buckets(bounds.to_vec());
        Seconds(Histogram::with_opts(opts).expect("valid histogram options"))
    }

    pub fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64())
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0.get_sample_count()
    }
}

/// Starts timing into `h`: the returned function observes the time since this call and
/// passes its argument through.
pub fn timed<T>(h: &'static Seconds) -> impl FnOnce(T) -> T {
    let started = std::time::Instant::now();
    move |v| {
        h.observe(started.elapsed());
        v
    }
}

/// A counter, by name and help; the statics below are created on first use.
fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid counter options")
}

/// Duration of each sled transaction of the MVCC committer, one per ~100 ms of applied
/// batches (etcd: same buckets as the WAL fsync histogram).
pub static BACKEND_COMMIT: LazyLock<Seconds> = LazyLock::new(|| {
    Seconds::new(
        "etcd_disk_backend_commit_duration_seconds",
        "The latency distributions of commit called by backend.",
        &DISK_BUCKETS,
    )
});

/// Proposals that returned an error to the caller (timeouts, no leader, stopped). A plain
/// atomic read at scrape time: the Raft node records it on every proposal.
pub static PROPOSALS_FAILED: AtomicU64 = AtomicU64::new(0);

/// Proposals this member is waiting on: submitted and not yet applied locally.
pub static PROPOSALS_PENDING: AtomicI64 = AtomicI64::new(0);

/// 1 while this member loads a received snapshot into its store, else 0 (etcd:
/// `etcd_server_snapshot_apply_in_progress_total`).
pub static SNAPSHOT_APPLY_IN_PROGRESS: AtomicI64 = AtomicI64::new(0);

/// Writes this member forwarded to the leader, and the calls that carried them (kvd's own:
/// their ratio is the mean batch, `raft::net::forward_batch`).
pub static FORWARDED_WRITES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "kvd_server_forwarded_writes_total",
        "Writes this member forwarded to the leader.",
    )
});
pub static FORWARD_CALLS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "kvd_server_forward_calls_total",
        "Calls to the leader that carried forwarded writes (one batch each).",
    )
});

/// History records deleted by compactions.
pub static COMPACTION_KEYS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_debugging_mvcc_db_compaction_keys_total",
        "Total number of db keys compacted.",
    )
});

/// Failed RPCs to each peer, by member id. Every attempt counts, so its rate shows how hard
/// this member retries a down peer.
pub static PEER_SENT_FAILURES: LazyLock<PeerCounters> = LazyLock::new(|| {
    PeerCounters::new(
        "etcd_network_peer_sent_failures_total",
        "The total number of send failures from peers.",
        "To",
    )
});

/// Snapshots sent to each peer and found whole by it, by member id.
pub static SNAPSHOT_SEND_SUCCESS: LazyLock<PeerCounters> = LazyLock::new(|| {
    PeerCounters::new(
        "etcd_network_snapshot_send_success",
        "Total number of successful snapshot sends",
        "To",
    )
});

/// Snapshot sends to each peer that failed (a broken stream, a read error, a refusal).
pub static SNAPSHOT_SEND_FAILURES: LazyLock<PeerCounters> = LazyLock::new(|| {
    PeerCounters::new(
        "etcd_network_snapshot_send_failures",
        "Total number of snapshot send failures",
        "To",
    )
});

/// Snapshots received from each leader and installed, by member id.
pub static SNAPSHOT_RECEIVE_SUCCESS: LazyLock<PeerCounters> = LazyLock::new(|| {
    PeerCounters::new(
        "etcd_network_snapshot_receive_success",
        "Total number of successful snapshot receives",
        "From",
    )
});

/// Snapshots from each leader that were not installed (a broken stream, a file that does not
/// check), by member id.
pub static SNAPSHOT_RECEIVE_FAILURES: LazyLock<PeerCounters> = LazyLock::new(|| {
    PeerCounters::new(
        "etcd_network_snapshot_receive_failures",
        "Total number of snapshot receive failures",
        "From",
    )
});

/// Duration of each snapshot sent whole to a peer, from the first chunk to the peer's answer
/// (its install included), by member id.
pub static SNAPSHOT_SEND_SECONDS: LazyLock<PeerHistograms> = LazyLock::new(|| {
    PeerHistograms::new(
        "etcd_network_snapshot_send_total_duration_seconds",
        "Total latency distributions of v3 snapshot sends",
        "To",
        &SNAPSHOT_BUCKETS,
    )
});

/// Duration of each snapshot received and installed, from its first chunk to the end of its
/// install, by leader id.
pub static SNAPSHOT_RECEIVE_SECONDS: LazyLock<PeerHistograms> = LazyLock::new(|| {
    PeerHistograms::new(
        "etcd_network_snapshot_receive_total_duration_seconds",
        "Total latency distributions of v3 snapshot receives",
        "From",
        &SNAPSHOT_BUCKETS,
    )
});

/// Adds one to `peer`'s count in a per-peer counter.
pub fn count_peer(counter: &PeerCounters, peer: u64) {
    counter.inc(peer)
}

/// Whether `grpc_server_handling_seconds` is recorded and served (etcd's `--metrics
/// extensive`); set once at start.
static EXTENSIVE: AtomicBool = AtomicBool::new(false);

pub fn set_extensive(on: bool) {
    EXTENSIVE.store(on, Ordering::Relaxed)
}

pub fn extensive() -> bool {
    EXTENSIVE.load(Ordering::Relaxed)
}

/// The process-wide registry: every static metric above, the gRPC server metrics and the
/// process collector (Linux), registered on first use.
pub fn registry() -> &'static Registry {
    static R: LazyLock<Registry> = LazyLock::new(|| {
        let r = Registry::new();
        let reg = |c: Box<dyn prometheus::core::Collector>| {
            r.register(c).expect("metric names are unique");
        };
        reg(Box::new(BACKEND_COMMIT.0.clone()));
        reg(Box::new(FORWARDED_WRITES.clone()));
        reg(Box::new(FORWARD_CALLS.clone()));
        reg(Box::new(COMPACTION_KEYS.clone()));
        for c in [
            &PEER_SENT_FAILURES,
            &SNAPSHOT_SEND_SUCCESS,
            &SNAPSHOT_SEND_FAILURES,
            &SNAPSHOT_RECEIVE_SUCCESS,
            &SNAPSHOT_RECEIVE_FAILURES,
        ] {
            reg(Box::new(c.vec().clone()));
        }
        for h in [&SNAPSHOT_SEND_SECONDS, &SNAPSHOT_RECEIVE_SECONDS] {
            reg(Box::new(h.vec().clone()));
        }
        grpc::register(&reg);
        etcd::register(&reg);
        #[cfg(target_os = "linux")]
        reg(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        r
    });
    &R
}

/// The registry's families, with `extra` (read at scrape time) merged in, sorted by name and
/// encoded in Prometheus' text format 0.0.4, as etcd's Go client serves it. Families named
/// in `hide` are left out.
pub fn encode(extra: Vec<MetricFamily>, hide: &[&str]) -> String {
    let mut all = registry().gather();
    all.extend(extra);
    all.retain(|f| !hide.contains(&f.name()));
    all.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = String::new();
    // Encoding fails only on a family without metrics or with a mismatched type, which the
    // builders in `family` never produce; a scrape then shows what was written before.
    let _ = prometheus::TextEncoder::new().encode_utf8(&all, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use crate::metrics::*;

    #[test]
    fn disk_buckets_are_etcds() {
        // etcd: prometheus.ExponentialBuckets(0.001, 2, 14).
        assert_eq!(DISK_BUCKETS[0], 0.001);
        assert_eq!(DISK_BUCKETS[1], 0.002);
        assert!((DISK_BUCKETS[13] - 8.192).abs() < 1e-12);
    }

    #[test]
    fn a_histogram_is_exposed_with_cumulative_le_inclusive_buckets() {
        BACKEND_COMMIT.observe(Duration::from_micros(500));
        BACKEND_COMMIT.observe(Duration::from_millis(1));
        let s = encode(vec![], &[]);
        let line = s
            .lines()
            .find(|l| {
                l.starts_with("etcd_disk_backend_commit_duration_seconds_bucket{le=\"0.001\"}")
            })
            .expect("bucket line");
        let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= 2, "{line}");
        assert!(s.contains("# TYPE etcd_disk_backend_commit_duration_seconds histogram\n"));
        assert!(s.contains("etcd_disk_backend_commit_duration_seconds_bucket{le=\"8.192\"}"));
    }

    #[test]
    fn hidden_families_are_left_out_and_the_rest_sorted() {
        let s = encode(
            vec![
                family::gauge("aaa_first", "h", 1.0),
                family::gauge("zzz_hidden", "h", 1.0),
            ],
            &["zzz_hidden"],
        );
        assert!(s.starts_with("# HELP aaa_first h\n# TYPE aaa_first gauge\naaa_first 1\n"));
        assert!(!s.contains("zzz_hidden"));
    }
}
