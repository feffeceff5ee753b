//! Gathers one scrape: the families read from this member at scrape time (WAL stats, Raft
//! progress, sizes), merged with the process-wide registry in [`crate::metrics`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::metrics::family::{counter, gauge, gauge_with, histogram};
use crate::metrics::{MetricFamily, DISK_BUCKETS, PROPOSALS_FAILED, PROPOSALS_PENDING};
use crate::raft::RaftNode;
use crate::server::version::{COMMIT, ETCD_VERSION, LOG_FORMAT, VERSION};

/// What a scrape reads from; cheap to clone into each HTTP handler.
#[derive(Clone)]
pub struct Scrape {
    pub node: RaftNode,
    /// Leader changes this member has observed since it started (etcd counts the same way:
    /// per process, including the first leader it learns of).
    pub leader_changes: Arc<AtomicU64>,
    /// The backend quota (`--quota-backend-bytes`, resolved); `None`: no quota.
    pub quota_backend_bytes: Option<u64>,
}

impl Scrape {
    pub fn new(node: RaftNode, quota_backend_bytes: Option<u64>) -> Self {
        Scrape {
            node,
            leader_changes: Arc::new(AtomicU64::new(0)),
            quota_backend_bytes,
        }
    }

    /// Counts leader changes until the Raft metrics channel closes (the node shut down).
    /// openraft's metrics are a watch, so changes between two wake-ups collapse into one;
    /// etcd's counter has the same granularity at its raft Ready loop.
    pub async fn watch_leader(self) {
        // The server metrics change with the vote, role, leader and membership only; the full
        // metrics would wake this task on every append and apply.
        let mut rx = self.node.watch_leadership();
        let mut last = None;
        loop {
            let leader = rx.leader();
            if leader.is_some() && leader != last {
                self.leader_changes.fetch_add(1, Ordering::Relaxed);
            }
            if leader.is_some() {
                last = leader;
            }
            if !rx.changed().await {
                return;
            }
        }
    }
}

/// The `/metrics` body; `in_use` is the live records' bytes, when known.
pub fn render(s: &Scrape, in_use: Option<u64>) -> String {
    let mut f = Vec::new();
    build(&mut f, s);
    identity(&mut f, s);
    disk(&mut f, s);
    server(&mut f, s);
    db_size(&mut f, s, in_use);
    os(&mut f);
    // etcd serves the handling-time histogram with `--metrics extensive` only.
    let hide: &[&str] = if crate::metrics::extensive() {
        &[]
    } else {
        &["grpc_server_handling_seconds"]
    };
    crate::metrics::encode(f, hide)
}

/// Which build this member runs and whether it can apply the cluster's log format.
fn build(f: &mut Vec<MetricFamily>, s: &Scrape) {
    let log_format = LOG_FORMAT.to_string();
    f.push(gauge_with(
        "kvd_build_info",
        "Which kvd build this member runs: release version, commit and newest log format \
         it applies. Always 1.",
        &[
            ("version", VERSION),
            ("commit", COMMIT),
            ("log_format", log_format.as_str()),
        ],
        1.0,
    ));
    // During a rolling upgrade: the cluster's format rises to LOG_FORMAT once every member
    // runs a build that applies it; until then, features that need it are refused.
    f.push(gauge(
        "kvd_cluster_log_format",
        "The log format the cluster's members have agreed on (entries of a newer format are \
         refused until every member applies it).",
        f64::from(s.node.cluster_format()),
    ));
    f.push(gauge(
        "kvd_apply_stopped",
        "1 if this member stopped applying at a committed entry its build cannot apply (it \
         must be restarted on a newer kvd), else 0.",
        if s.node.needs_upgrade().is_some() {
            1.0
        } else {
            0.0
        },
    ));
}

/// WAL fsync latency and bytes.
fn disk(f: &mut Vec<MetricFamily>, s: &Scrape) {
    let wal = s.node.wal_stats();
    f.push(histogram(
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
        &DISK_BUCKETS,
        &wal.fsync_buckets,
        wal.fsyncs,
        wal.fsync_seconds_sum,
    ));
    // A gauge in etcd 3.4, though named as a counter.
    f.push(gauge(
        "etcd_disk_wal_write_bytes_total",
        "Total number of bytes written in WAL.",
        wal.bytes_written as f64,
    ));
}

/// Raft progress as etcd's server metrics: proposals, leadership and term.
fn server(f: &mut Vec<MetricFamily>, s: &Scrape) {
    let (committed, applied, leader, term) = {
        let st = s.node.status();
        (st.committed, st.applied, st.leader, st.term)
    };
    let has_leader = s.node.has_leader();
    // Gauges in etcd 3.4, though named as counters.
    f.push(gauge(
        "etcd_server_proposals_committed_total",
        "The total number of consensus proposals committed.",
        committed as f64,
    ));
    f.push(gauge(
        "etcd_server_proposals_applied_total",
        "The total number of consensus proposals applied.",
        applied as f64,
    ));
    f.push(gauge(
        "etcd_server_proposals_pending",
        "The current number of pending proposals to commit.",
        PROPOSALS_PENDING.load(Ordering::Relaxed).max(0) as f64,
    ));
    f.push(counter(
        "etcd_server_proposals_failed_total",
        "The total number of failed proposals seen.",
        PROPOSALS_FAILED.load(Ordering::Relaxed) as f64,
    ));
    f.push(gauge(
        "etcd_server_has_leader",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
        has_leader as u8 as f64,
    ));
    f.push(gauge(
        "etcd_server_is_leader",
        "Whether or not this member is a leader. 1 if is, 0 otherwise.",
        (has_leader && leader == Some(s.node.id)) as u8 as f64,
    ));
    f.push(counter(
        "etcd_server_leader_changes_seen_total",
        "The number of leader changes seen.",
        s.leader_changes.load(Ordering::Relaxed) as f64,
    ));
    f.push(gauge(
        "etcd_server_term",
        "The current Raft term of this member (kvd).",
        term as f64,
    ));
    f.push(gauge(
        "etcd_server_snapshot_apply_in_progress_total",
        "1 if the server is applying the incoming snapshot. 0 if none.",
        crate::metrics::SNAPSHOT_APPLY_IN_PROGRESS.load(Ordering::Relaxed) as f64,
    ));
}

/// The size on disk of the current storage engine generation, the part of it in use, and
/// the quota it is held to.
fn db_size(f: &mut Vec<MetricFamily>, s: &Scrape, in_use: Option<u64>) {
    // The current engine generation (defragmentation moves it).
    let total = crate::server::api::maintenance::dir_size(&s.node.db_dir());
    f.push(gauge(
        "etcd_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        total as f64,
    ));
    // Before the first scan of the live records, the size on disk: an upper bound, as
    // Maintenance.Status answers.
    f.push(gauge(
        "etcd_mvcc_db_total_size_in_use_in_bytes",
        "Total size of the underlying database logically in use in bytes.",
        in_use.unwrap_or(total).min(total) as f64,
    ));
    // etcd sets 0 when the quota is off (a negative --quota-backend-bytes).
    f.push(gauge(
        "etcd_server_quota_backend_bytes",
        "Current backend storage quota size in bytes.",
        s.quota_backend_bytes.unwrap_or(0) as f64,
    ));
}

/// Which member and version this is, as etcd's info gauges say it.
fn identity(f: &mut Vec<MetricFamily>, s: &Scrape) {
    let id = format!("{:x}", s.node.id);
    f.push(gauge_with(
        "etcd_server_id",
        "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
        &[("server_id", id.as_str())],
        1.0,
    ));
    f.push(gauge_with(
        "etcd_server_version",
        "Which version is running. 1 for 'server_version' label with current version.",
        &[("server_version", ETCD_VERSION)],
        1.0,
    ));
    // etcd's cluster version is major.minor.
    let cluster: String = ETCD_VERSION
        .splitn(3, '.')
        .take(2)
        .collect::<Vec<_>>()
        .join(".");
    f.push(gauge_with(
        "etcd_cluster_version",
        "Which version is running. 1 for 'cluster_version' label with current cluster version",
        &[("cluster_version", cluster.as_str())],
        1.0,
    ));
    f.push(gauge(
        "etcd_server_is_learner",
        "Whether or not this member is a learner. 1 if is, 0 otherwise.",
        s.node.is_learner() as u8 as f64,
    ));
}

/// File descriptors, as etcd's `os_fd_*` gauges, and the address-space limit (Go's process
/// collector has it; the crate's does not).
fn os(f: &mut Vec<MetricFamily>) {
    f.push(gauge(
        "os_fd_used",
        "The number of used file descriptors.",
        crate::metrics::fd_used() as f64,
    ));
    f.push(gauge(
        "process_virtual_memory_max_bytes",
        "Maximum amount of virtual memory available in bytes.",
        crate::metrics::address_space_limit() as f64,
    ));
    f.push(gauge(
        "os_fd_limit",
        "The file descriptor limit.",
        crate::metrics::fd_limit() as f64,
    ));
}
