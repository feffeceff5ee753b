//! Gathers one scrape: WAL stats, Raft progress, the process-wide counters and the gRPC table.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::metrics::{
    grpc_table, HistogramSnapshot, TextWriter, BACKEND_COMMIT, COMPACTION_KEYS, FORWARDED_WRITES,
    FORWARD_CALLS, PROPOSALS_FAILED, PROPOSALS_PENDING,
};
use crate::raft::RaftNode;
use crate::server::version::{COMMIT, LOG_FORMAT, VERSION};
use crate::sync::LockExt;

/// What a scrape reads from; cheap to clone into each HTTP handler.
#[derive(Clone)]
pub struct Scrape {
    pub node: RaftNode,
    /// Leader changes this member has observed since it started (etcd counts the same way:
    /// per process, including the first leader it learns of).
    pub leader_changes: Arc<AtomicU64>,
}

impl Scrape {
    pub fn new(node: RaftNode) -> Self {
        Scrape {
            node,
            leader_changes: Arc::new(AtomicU64::new(0)),
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

/// The `/metrics` body.
pub fn render(s: &Scrape) -> String {
    let mut w = TextWriter::new();
    build(&mut w, s);
    disk(&mut w, s);
    server(&mut w, s);
    db_size(&mut w, s);
    network(&mut w);
    grpc(&mut w);
    w.finish()
}

/// Which build this member runs and whether it can apply the cluster's log format.
fn build(w: &mut TextWriter, s: &Scrape) {
    let log_format = LOG_FORMAT.to_string();
    w.gauge_vec(
        "kvd_build_info",
        "Which kvd build this member runs: release version, commit and newest log format \
         it applies. Always 1.",
        [(
            vec![
                ("version", VERSION),
                ("commit", COMMIT),
                ("log_format", log_format.as_str()),
            ],
            1.0,
        )],
    );
    // During a rolling upgrade: the cluster's format rises to LOG_FORMAT once every member
    // runs a build that applies it; until then, features that need it are refused.
    w.gauge(
        "kvd_cluster_log_format",
        "The log format the cluster's members have agreed on (entries of a newer format are \
         refused until every member applies it).",
        f64::from(s.node.cluster_format()),
    );
    w.gauge(
        "kvd_apply_stopped",
        "1 if this member stopped applying at a committed entry its build cannot apply (it \
         must be restarted on a newer kvd), else 0.",
        if s.node.needs_upgrade().is_some() {
            1.0
        } else {
            0.0
        },
    );
}

/// WAL fsync latency and bytes, backend commit latency and compacted keys.
fn disk(w: &mut TextWriter, s: &Scrape) {
    let wal = s.node.wal_stats();
    w.histogram(
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
        &HistogramSnapshot {
            buckets: wal.fsync_buckets,
            count: wal.fsyncs,
            sum_seconds: wal.fsync_seconds_sum,
        },
    );
    w.counter(
        "etcd_disk_wal_write_bytes_total",
        "Total number of bytes written in WAL.",
        wal.bytes_written as f64,
    );
    w.histogram(
        "etcd_disk_backend_commit_duration_seconds",
        "The latency distributions of commit called by backend.",
        &BACKEND_COMMIT.snapshot(),
    );
    w.counter(
        "etcd_debugging_mvcc_db_compaction_keys_total",
        "Total number of db keys compacted.",
        COMPACTION_KEYS.load(Ordering::Relaxed) as f64,
    );
}

/// Raft progress as etcd's server metrics: proposals, forwarding, leadership and term.
fn server(w: &mut TextWriter, s: &Scrape) {
    let (committed, applied, leader, term) = {
        let st = s.node.status();
        (st.committed, st.applied, st.leader, st.term)
    };
    let has_leader = s.node.has_leader();
    w.counter(
        "etcd_server_proposals_committed_total",
        "The total number of consensus proposals committed.",
        committed as f64,
    );
    w.counter(
        "etcd_server_proposals_applied_total",
        "The total number of consensus proposals applied.",
        applied as f64,
    );
    w.gauge(
        "etcd_server_proposals_pending",
        "The current number of pending proposals to commit.",
        PROPOSALS_PENDING.load(Ordering::Relaxed).max(0) as f64,
    );
    w.counter(
        "etcd_server_proposals_failed_total",
        "The total number of failed proposals seen.",
        PROPOSALS_FAILED.load(Ordering::Relaxed) as f64,
    );
    w.counter(
        "kvd_server_forwarded_writes_total",
        "Writes this member forwarded to the leader.",
        FORWARDED_WRITES.load(Ordering::Relaxed) as f64,
    );
    w.counter(
        "kvd_server_forward_calls_total",
        "Calls to the leader that carried forwarded writes (one batch each).",
        FORWARD_CALLS.load(Ordering::Relaxed) as f64,
    );
    w.gauge(
        "etcd_server_has_leader",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
        has_leader as u8 as f64,
    );
    w.gauge(
        "etcd_server_is_leader",
        "Whether or not this member is a leader. 1 if is, 0 otherwise.",
        (has_leader && leader == Some(s.node.id)) as u8 as f64,
    );
    w.counter(
        "etcd_server_leader_changes_seen_total",
        "The number of leader changes seen.",
        s.leader_changes.load(Ordering::Relaxed) as f64,
    );
    w.gauge(
        "etcd_server_term",
        "The current Raft term of this member (kvd).",
        term as f64,
    );
}

/// The size on disk of the current storage engine generation.
fn db_size(w: &mut TextWriter, s: &Scrape) {
    w.gauge(
        "etcd_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        // The current engine generation (defragmentation moves it).
        crate::server::api::maintenance::dir_size(&s.node.db_dir()) as f64,
    );
}

/// Per-peer send failures and snapshot transfers, and whether a snapshot is being applied.
fn network(w: &mut TextWriter) {
    use crate::metrics::{
        PEER_SENT_FAILURES, SNAPSHOT_RECEIVE_FAILURES, SNAPSHOT_RECEIVE_SUCCESS,
        SNAPSHOT_SEND_FAILURES, SNAPSHOT_SEND_SUCCESS,
    };
    for (name, help, label, counter) in [
        (
            "etcd_network_peer_sent_failures_total",
            "The total number of send failures from peers.",
            "To",
            &PEER_SENT_FAILURES,
        ),
        (
            "etcd_network_snapshot_send_success",
            "Total number of successful snapshot sends",
            "To",
            &SNAPSHOT_SEND_SUCCESS,
        ),
        (
            "etcd_network_snapshot_send_failures",
            "Total number of snapshot send failures",
            "To",
            &SNAPSHOT_SEND_FAILURES,
        ),
        (
            "etcd_network_snapshot_receive_success",
            "Total number of successful snapshot receives",
            "From",
            &SNAPSHOT_RECEIVE_SUCCESS,
        ),
        (
            "etcd_network_snapshot_receive_failures",
            "Total number of snapshot receive failures",
            "From",
            &SNAPSHOT_RECEIVE_FAILURES,
        ),
    ] {
        let peers: Vec<(String, u64)> = counter
            .lock_or_recover()
            .iter()
            .map(|(id, n)| (format!("{id:x}"), *n))
            .collect();
        w.counter_vec(
            name,
            help,
            peers
                .iter()
                .map(|(peer, n)| (vec![(label, peer.as_str())], *n as f64)),
        );
    }
    use crate::metrics::{
        SNAPSHOT_APPLY_IN_PROGRESS, SNAPSHOT_RECEIVE_SECONDS, SNAPSHOT_SEND_SECONDS,
    };
    for (name, help, label, h) in [
        (
            "etcd_network_snapshot_send_total_duration_seconds",
            "Total latency distributions of v3 snapshot sends",
            "To",
            &SNAPSHOT_SEND_SECONDS,
        ),
        (
            "etcd_network_snapshot_receive_total_duration_seconds",
            "Total latency distributions of v3 snapshot receives",
            "From",
            &SNAPSHOT_RECEIVE_SECONDS,
        ),
    ] {
        w.histogram_vec(name, help, label, h.bounds(), &h.snapshot());
    }
    w.gauge(
        "etcd_server_snapshot_apply_in_progress_total",
        "1 if the server is applying the incoming snapshot. 0 if none.",
        SNAPSHOT_APPLY_IN_PROGRESS.load(Ordering::Relaxed) as f64,
    );
}

/// Completed RPCs by service, method and status code.
fn grpc(w: &mut TextWriter) {
    let table = grpc_table();
    w.counter_vec(
        "grpc_server_handled_total",
        "Total number of RPCs completed on the server, regardless of success or failure.",
        table.iter().map(|((svc, method, code), n)| {
            (
                vec![
                    ("grpc_code", *code),
                    ("grpc_method", method.as_str()),
                    ("grpc_service", svc.as_str()),
                ],
                *n as f64,
            )
        }),
    );
}
