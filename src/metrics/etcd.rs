//! etcd 3.4's server, MVCC, disk and network families that layers record into (names, help
//! texts, labels and buckets as etcd's `etcdserver/metrics.go`, `mvcc/metrics.go`,
//! `mvcc/backend/metrics.go` and `etcdserver/api/rafthttp/metrics.go` declare them).

use std::sync::LazyLock;

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use super::{counter, exponential_buckets, PeerCounters, PeerHistograms, Seconds};

/// Round trips of the peer prober's calls, by peer (etcd measures its own prober's the same
/// way): `ExponentialBuckets(0.0001, 2, 14)`.
pub static PEER_ROUND_TRIP: LazyLock<PeerHistograms> = LazyLock::new(|| {
    PeerHistograms::new(
        "etcd_network_peer_round_trip_time_seconds",
        "Round-Trip-Time histogram between peers",
        "To",
        &exponential_buckets::<14>(0.0001),
    )
});

/// Bytes of the Raft messages sent to each peer (appends, votes, snapshots' chunks).
pub static PEER_SENT_BYTES: LazyLock<PeerCounters> = LazyLock::new(|| {
    PeerCounters::new(
        "etcd_network_peer_sent_bytes_total",
        "The total number of bytes sent to peers.",
        "To",
    )
});

/// Bytes of the Raft messages received from each peer.
pub static PEER_RECEIVED_BYTES: LazyLock<PeerCounters> = LazyLock::new(|| {
    PeerCounters::new(
        "etcd_network_peer_received_bytes_total",
        "The total number of bytes received from peers.",
        "From",
    )
});

/// gRPC message bytes to and from clients on the client port.
pub static CLIENT_GRPC_SENT_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_network_client_grpc_sent_bytes_total",
        "The total number of bytes sent to grpc clients.",
    )
});
pub static CLIENT_GRPC_RECEIVED_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_network_client_grpc_received_bytes_total",
        "The total number of bytes received from grpc clients.",
    )
});

/// `/health` answers, by outcome.
pub static HEALTH_SUCCESS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_server_health_success",
        "The total number of successful health checks",
    )
});
pub static HEALTH_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_server_health_failures",
        "The total number of failed health checks",
    )
});

/// Requests served by this member's MVCC store, by kind.
pub static MVCC_RANGE: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_mvcc_range_total",
        "Total number of ranges seen by this member.",
    )
});
pub static MVCC_PUT: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_mvcc_put_total",
        "Total number of puts seen by this member.",
    )
});
pub static MVCC_DELETE: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_mvcc_delete_total",
        "Total number of deletes seen by this member.",
    )
});
pub static MVCC_TXN: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_mvcc_txn_total",
        "Total number of txns seen by this member.",
    )
});

/// Applies slower than etcd's 100 ms warning threshold.
pub static SLOW_APPLY: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_server_slow_apply_total",
        "The total number of slow apply requests (likely overloaded from slow disk).",
    )
});

/// The leader's appends (its heartbeats) that failed to reach a follower.
pub static HEARTBEAT_SEND_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_server_heartbeat_send_failures_total",
        "The total number of leader heartbeat send failures (likely overloaded from slow disk).",
    )
});

/// Read barriers (read index requests) that failed.
pub static READ_INDEXES_FAILED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_server_read_indexes_failed_total",
        "The total number of failed read indexes seen.",
    )
});

/// Learners this member promoted while leader.
pub static LEARNER_PROMOTE_SUCCESSES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_server_learner_promote_successes",
        "The total number of successful learner promotions while this member is leader.",
    )
});

/// Defragmentations of this member's engine: `ExponentialBuckets(.1, 2, 13)`.
pub static DEFRAG_SECONDS: LazyLock<Seconds> = LazyLock::new(|| {
    Seconds::new(
        "etcd_disk_backend_defrag_duration_seconds",
        "The latency distribution of backend defragmentation.",
        &exponential_buckets::<13>(0.1),
    )
});

/// Backend snapshots (a snapshot read out of the engine, to a peer or a client):
/// `ExponentialBuckets(.01, 2, 17)`.
pub static BACKEND_SNAPSHOT_SECONDS: LazyLock<Seconds> = LazyLock::new(|| {
    Seconds::new(
        "etcd_disk_backend_snapshot_duration_seconds",
        "The latency distribution of backend snapshots.",
        &exponential_buckets::<17>(0.01),
    )
});

/// Hash and HashKV computations: `ExponentialBuckets(.01, 2, 15)`.
pub static HASH_SECONDS: LazyLock<Seconds> = LazyLock::new(|| {
    Seconds::new(
        "etcd_mvcc_hash_duration_seconds",
        "The latency distribution of storage hash operation.",
        &exponential_buckets::<15>(0.01),
    )
});
pub static HASH_REV_SECONDS: LazyLock<Seconds> = LazyLock::new(|| {
    Seconds::new(
        "etcd_mvcc_hash_rev_duration_seconds",
        "The latency distribution of storage hash by revision operation.",
        &exponential_buckets::<15>(0.01),
    )
});

/// The engine flush at a snapshot point, which lets the log be purged below it (etcd's fsync
/// of its `.snap` file at the same point): `ExponentialBuckets(.001, 2, 14)`.
pub static SNAP_FSYNC_SECONDS: LazyLock<Seconds> = LazyLock::new(|| {
    Seconds::new(
        "etcd_snap_fsync_duration_seconds",
        "The latency distributions of fsync called by snap.",
        &super::DISK_BUCKETS,
    )
});

/// The final fdatasync of a snapshot received from the leader (etcd's `.snap.db` file).
pub static SNAP_DB_FSYNC_SECONDS: LazyLock<Seconds> = LazyLock::new(|| {
    Seconds::new(
        "etcd_snap_db_fsync_duration_seconds",
        "The latency distributions of fsyncing .snap.db file",
        &super::DISK_BUCKETS,
    )
});

/// Saving a snapshot received from the leader, from its first chunk until it is on disk and
/// checked: `ExponentialBuckets(.1, 2, 10)`.
pub static SNAP_DB_SAVE_SECONDS: LazyLock<Seconds> = LazyLock::new(|| {
    Seconds::new(
        "etcd_snap_db_save_total_duration_seconds",
        "The total latency distributions of v3 snapshot save",
        &super::SNAPSHOT_BUCKETS,
    )
});

/// Range reads being served (etcd counts its open bbolt read transactions; a kvd range read
/// is the same unit of work: one consistent view, held until the response is built).
pub static OPEN_READ_TXNS: LazyLock<IntGauge> = LazyLock::new(|| {
    IntGauge::new(
        "etcd_mvcc_db_open_read_transactions",
        "The number of currently open read transactions",
    )
    .expect("valid options")
});

/// Counts a read as open in [`OPEN_READ_TXNS`] while it lives.
pub struct OpenRead(());

impl OpenRead {
    pub fn start() -> OpenRead {
        OPEN_READ_TXNS.inc();
        OpenRead(())
    }
}

impl Drop for OpenRead {
    fn drop(&mut self) {
        OPEN_READ_TXNS.dec();
    }
}

/// Peers with a working link (a run of successful RPCs), and links lost, by local and remote
/// member id.
static ACTIVE_PEERS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    IntGaugeVec::new(
        Opts::new(
            "etcd_network_active_peers",
            "The current number of active peer connections.",
        ),
        &["Local", "Remote"],
    )
    .expect("valid options")
});
static DISCONNECTED_PEERS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "etcd_network_disconnected_peers_total",
            "The total number of disconnected peers.",
        ),
        &["Local", "Remote"],
    )
    .expect("valid options")
});

/// Records that the link from `local` to `remote` came up or went down (rare: a lookup by
/// label is fine).
pub fn peer_active(local: u64, remote: u64, up: bool) {
    let l = [format!("{local:x}"), format!("{remote:x}")];
    ACTIVE_PEERS.with_label_values(&l).set(up as i64);
    if !up {
        DISCONNECTED_PEERS.with_label_values(&l).inc();
    }
}

/// Read indexes that timed out or were not in sync with the leader's.
pub static SLOW_READ_INDEXES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "etcd_server_slow_read_indexes_total",
        "The total number of pending read indexes not in sync with leader's or timed out read index requests.",
    )
});

/// Scrapes of `/metrics`, as Go's promhttp handler counts them (codes pre-initialised).
static SCRAPES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "promhttp_metric_handler_requests_total",
            "Total number of scrapes by HTTP status code.",
        ),
        &["code"],
    )
    .expect("valid options")
});
static SCRAPES_IN_FLIGHT: LazyLock<IntGauge> = LazyLock::new(|| {
    IntGauge::new(
        "promhttp_metric_handler_requests_in_flight",
        "Current number of scrapes being served.",
    )
    .expect("valid options")
});

/// One scrape being served: counted in flight until dropped, then as answered 200.
pub struct Scrape(());

impl Scrape {
    pub fn start() -> Scrape {
        SCRAPES_IN_FLIGHT.inc();
        Scrape(())
    }
}

impl Drop for Scrape {
    fn drop(&mut self) {
        SCRAPES_IN_FLIGHT.dec();
        SCRAPES.with_label_values(&["200"]).inc();
    }
}

/// 1 while this member defragments its engine.
pub static DEFRAG_INFLIGHT: LazyLock<IntGauge> = LazyLock::new(|| {
    IntGauge::new(
        "etcd_disk_defrag_inflight",
        "Whether or not defrag is active on the member. 1 means active, 0 means not.",
    )
    .expect("valid options")
});

/// Every family above, for the registry.
pub(super) fn register(reg: &dyn Fn(Box<dyn prometheus::core::Collector>)) {
    reg(Box::new(PEER_ROUND_TRIP.vec().clone()));
    reg(Box::new(ACTIVE_PEERS.clone()));
    reg(Box::new(DISCONNECTED_PEERS.clone()));
    reg(Box::new(DEFRAG_INFLIGHT.clone()));
    reg(Box::new(OPEN_READ_TXNS.clone()));
    for code in ["200", "500", "503"] {
        SCRAPES.with_label_values(&[code]);
    }
    reg(Box::new(SCRAPES.clone()));
    reg(Box::new(SCRAPES_IN_FLIGHT.clone()));
    for c in [&PEER_SENT_BYTES, &PEER_RECEIVED_BYTES] {
        reg(Box::new(c.vec().clone()));
    }
    for c in [
        &CLIENT_GRPC_SENT_BYTES,
        &CLIENT_GRPC_RECEIVED_BYTES,
        &HEALTH_SUCCESS,
        &HEALTH_FAILURES,
        &MVCC_RANGE,
        &MVCC_PUT,
        &MVCC_DELETE,
        &MVCC_TXN,
        &SLOW_APPLY,
        &SLOW_READ_INDEXES,
        &HEARTBEAT_SEND_FAILURES,
        &READ_INDEXES_FAILED,
        &LEARNER_PROMOTE_SUCCESSES,
    ] {
        reg(Box::new((*c).clone()));
    }
    for h in [
        &DEFRAG_SECONDS,
        &BACKEND_SNAPSHOT_SECONDS,
        &HASH_SECONDS,
        &HASH_REV_SECONDS,
        &SNAP_FSYNC_SECONDS,
        &SNAP_DB_FSYNC_SECONDS,
        &SNAP_DB_SAVE_SECONDS,
    ] {
        reg(Box::new(h.0.clone()));
    }
}
