//! Metrics primitives: process-wide counters, atomic histograms, the recent-latency window
//! and the Prometheus text writer. This module is a leaf: it depends on no other kvd module,
//! so every layer (WAL, MVCC, Raft, server) may record into it. What reads a member's state to
//! export it (the `/metrics` scrape, `/health`) belongs to the server layer
//! (`server::observe`).
//!
//! Metric names, types and bucket bounds are etcd's, so etcd's Grafana dashboards and alerts
//! work unchanged against kvd.
//!
//! Invariants:
//! - Recording never blocks: counters are relaxed atomics, histograms are arrays of atomics.
//!   A scrape may therefore mix values from slightly different instants; every counter is
//!   still monotonic on its own.
//! - The counters in this module ([`BACKEND_COMMIT`], [`PROPOSALS_FAILED`],
//!   [`PROPOSALS_PENDING`], [`COMPACTION_KEYS`], the gRPC table) are process-wide, like Go's
//!   default Prometheus registry: the `kvd` binary runs one member per process, so they are
//!   that member's. In-process test clusters share them.
//! - Every disk-latency histogram uses [`DISK_BUCKETS`], so they line up on dashboards.

mod grpc;
mod histogram;
mod peer_histogram;
mod recent;
mod text;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Mutex;

use crate::sync::LockExt;

pub use grpc::{snapshot as grpc_table, Handled as GrpcHandled, Table as GrpcTable};
pub use histogram::{AtomicHistogram, HistogramSnapshot};
pub use peer_histogram::{PeerHistograms, PeerSeries, SNAPSHOT_BUCKETS};
pub use recent::{RecentLatency, RecentSummary, WINDOW_SECS};
pub use text::TextWriter;

/// Upper bounds (seconds) of etcd's disk latency histogram buckets
/// (`etcd_disk_wal_fsync_duration_seconds`, `etcd_disk_backend_commit_duration_seconds`):
/// 0.001 * 2^k, k = 0..13.
pub const DISK_BUCKETS: [f64; 14] = exponential_buckets(0.001);

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

/// Duration of each sled transaction of the MVCC committer, one per ~100 ms of applied
/// batches (etcd:
/// `etcd_disk_backend_commit_duration_seconds`, same buckets as the WAL fsync histogram).
pub static BACKEND_COMMIT: AtomicHistogram = AtomicHistogram::new();

/// Proposals that returned an error to the caller (timeouts, no leader, stopped).
pub static PROPOSALS_FAILED: AtomicU64 = AtomicU64::new(0);

/// Proposals this member is waiting on: submitted and not yet applied locally.
pub static PROPOSALS_PENDING: AtomicI64 = AtomicI64::new(0);

/// Writes this member forwarded to the leader, and the calls that carried them (kvd's own:
/// their ratio is the mean batch, `raft::net::forward_batch`).
pub static FORWARDED_WRITES: AtomicU64 = AtomicU64::new(0);
pub static FORWARD_CALLS: AtomicU64 = AtomicU64::new(0);

/// Failed RPCs to each peer, by member id (etcd: `etcd_network_peer_sent_failures_total`, per
/// `To`). Every attempt counts, so its rate shows how hard this member retries a down peer.
pub static PEER_SENT_FAILURES: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

/// Snapshots sent to each peer and found whole by it, by member id (etcd:
/// `etcd_network_snapshot_send_success`, per `To`).
pub static SNAPSHOT_SEND_SUCCESS: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

/// Snapshot sends to each peer that failed (a broken stream, a read error, a refusal), by
/// member id (etcd: `etcd_network_snapshot_send_failures`, per `To`).
pub static SNAPSHOT_SEND_FAILURES: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

/// Snapshots received from each leader and installed, by member id (etcd:
/// `etcd_network_snapshot_receive_success`, per `From`).
pub static SNAPSHOT_RECEIVE_SUCCESS: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

/// Snapshots from each leader that were not installed (a broken stream, a file that does not
/// check), by member id (etcd: `etcd_network_snapshot_receive_failures`, per `From`).
pub static SNAPSHOT_RECEIVE_FAILURES: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

/// Duration of each snapshot sent whole to a peer, from the first chunk to the peer's answer
/// (its install included), by member id (etcd: `etcd_network_snapshot_send_total_duration_seconds`,
/// per `To`).
pub static SNAPSHOT_SEND_SECONDS: PeerHistograms = PeerHistograms::new(&SNAPSHOT_BUCKETS);

/// Duration of each snapshot received and installed, from its first chunk to the end of its
/// install, by leader id (etcd: `etcd_network_snapshot_receive_total_duration_seconds`, per
/// `From`).
pub static SNAPSHOT_RECEIVE_SECONDS: PeerHistograms = PeerHistograms::new(&SNAPSHOT_BUCKETS);

/// 1 while this member loads a received snapshot into its store, else 0 (etcd:
/// `etcd_server_snapshot_apply_in_progress_total`).
pub static SNAPSHOT_APPLY_IN_PROGRESS: AtomicI64 = AtomicI64::new(0);

/// Adds one to `peer`'s count in a per-peer counter.
pub fn count_peer(counter: &Mutex<BTreeMap<u64, u64>>, peer: u64) {
    *counter.lock_or_recover().entry(peer).or_default() += 1;
}

/// History records deleted by compactions (etcd: `etcd_debugging_mvcc_db_compaction_keys_total`).
pub static COMPACTION_KEYS: AtomicU64 = AtomicU64::new(0);
