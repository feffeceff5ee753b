//! Prometheus metrics and the etcd-style `/health` probe, served over plain HTTP on
//! `--listen-metrics-urls`.
//!
//! Metric names, types and bucket bounds are etcd's, so etcd's Grafana dashboards and alerts
//! work unchanged against kvd.
//!
//! Invariants:
//! - Scraping never blocks the write path: WAL figures are an atomic snapshot
//!   ([`crate::wal::Wal::stats`]), Raft figures come from openraft's metrics watch, and the
//!   counters below are relaxed atomics. A scrape may therefore mix values from slightly
//!   different instants; every counter is still monotonic on its own.
//! - The counters in this module ([`BACKEND_COMMIT`], [`PROPOSALS_FAILED`],
//!   [`PROPOSALS_PENDING`], [`COMPACTION_KEYS`], the gRPC table) are process-wide, like Go's default Prometheus
//!   registry: the `kvd` binary runs one member per process, so they are that member's.
//!   In-process test clusters share them.
//! - `/health` is healthy exactly when [`crate::raft::RaftNode::has_leader`] is true, the same
//!   check that makes `hasleader` requests fail with "no leader".

mod collect;
mod endpoint;
mod grpc;
mod histogram;
mod recent;
mod text;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Mutex;

pub use collect::{render, Scrape};
pub use endpoint::{healthy, router, serve};
pub use grpc::GrpcMetricsLayer;
pub use histogram::AtomicHistogram;
pub use recent::{RecentLatency, RecentSummary, WINDOW_SECS};

/// Duration of each sled transaction of the MVCC committer, one per ~100 ms of applied
/// batches (etcd:
/// `etcd_disk_backend_commit_duration_seconds`, same buckets as the WAL fsync histogram).
pub static BACKEND_COMMIT: AtomicHistogram = AtomicHistogram::new();

/// Proposals that returned an error to the caller (timeouts, no leader, stopped).
pub static PROPOSALS_FAILED: AtomicU64 = AtomicU64::new(0);

/// Proposals this member is waiting on: submitted and not yet applied locally.
pub static PROPOSALS_PENDING: AtomicI64 = AtomicI64::new(0);

/// Failed RPCs to each peer, by member id (etcd: `etcd_network_peer_sent_failures_total`, per
/// `To`). Every attempt counts, so its rate shows how hard this member retries a down peer.
pub static PEER_SENT_FAILURES: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

/// History records deleted by compactions (etcd: `etcd_debugging_mvcc_db_compaction_keys_total`).
pub static COMPACTION_KEYS: AtomicU64 = AtomicU64::new(0);
