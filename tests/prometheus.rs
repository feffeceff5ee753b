//! A real Prometheus (Debian's `prometheus` package; CI installs it) scrapes a 3-member
//! cluster every second, and the queries of etcd's published monitoring mixin (its alerts and
//! its Grafana dashboard, written from the mixin's expressions with `job=~".*etcd.*"` and
//! `job="etcd"` for the dashboard's `$cluster`) run through Prometheus' HTTP API:
//! - each returns series for kvd (an alert's expression is run without its threshold, which
//!   a healthy cluster does not cross: what matters is that every series it selects exists
//!   with the labels it filters and aggregates on);
//! - under load the RPC-rate, fsync, client-traffic and peer-traffic panels move;
//! - with one member killed, the members-down alert and its peer-failure branch fire.
//!
//! Without a `prometheus` binary on the PATH the test prints why and passes.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, put, Cluster};

struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(targets: &[u16]) -> Option<Prometheus> {
        let bin = std::env::var("PROMETHEUS_BIN").unwrap_or_else(|_| "prometheus".into());
        if Command::new(&bin).arg("--version").output().is_err() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: etcd\n    scrape_timeout: 900ms\n    \
             static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Some(Prometheus {
            child,
            port,
            _dir: dir,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The series an instant query returns, as (labels, value); panics on an error answer.
    async fn query(&self, q: &str) -> Vec<(serde_json::Value, f64)> {
        let enc: String = url::form_urlencoded::byte_serialize(q.as_bytes()).collect();
        let (code, body) = common::http_get(self.port, &format!("/api/v1/query?query={enc}")).await;
        assert_eq!(code, 200, "{q}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{q}: {body}");
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let value = s["value"][1].as_str().unwrap().parse().unwrap_or(f64::NAN);
                (s["metric"].clone(), value)
            })
            .collect()
    }

    /// Waits until `q` returns a series whose value passes `ok`; the last answer otherwise.
    async fn wait_for(
        &self,
        q: &str,
        within: Duration,
        ok: impl Fn(f64) -> bool,
    ) -> Result<(), Vec<(serde_json::Value, f64)>> {
        let deadline = Instant::now() + within;
        loop {
            let r = self.query(q).await;
            if r.iter().any(|(_, v)| ok(*v)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(r);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

const FAILED_CODES: &str =
    "Unknown|FailedPrecondition|ResourceExhausted|Internal|Unavailable|DataLoss|DeadlineExceeded";

/// The mixin's alert expressions, without their thresholds.
fn alert_queries() -> Vec<(&'static str, String)> {
    let j = r#"job=~".*etcd.*""#;
    vec![
        ("etcdMembersDown (up)", format!("sum without (instance) (up{{{j}}} == bool 0)")),
        (
            "etcdInsufficientMembers",
            format!("sum(up{{{j}}} == bool 1) without (instance) - ((count(up{{{j}}}) without (instance) + 1) / 2)"),
        ),
        ("etcdNoLeader", format!("etcd_server_has_leader{{{j}}}")),
        (
            "etcdHighNumberOfLeaderChanges",
            format!("increase((max without (instance) (etcd_server_leader_changes_seen_total{{{j}}}) or 0*absent(etcd_server_leader_changes_seen_total{{{j}}}))[15m:1m])"),
        ),
        (
            "etcdHighNumberOfFailedGRPCRequests",
            format!("100 * sum(rate(grpc_server_handled_total{{{j}, grpc_code=~\"{FAILED_CODES}\"}}[5m])) without (grpc_type, grpc_code) / sum(rate(grpc_server_handled_total{{{j}}}[5m])) without (grpc_type, grpc_code)"),
        ),
        (
            "etcdGRPCRequestsSlow",
            format!("histogram_quantile(0.99, sum(rate(grpc_server_handling_seconds_bucket{{{j}, grpc_method!=\"Defragment\", grpc_type=\"unary\"}}[5m])) without(grpc_type))"),
        ),
        (
            "etcdMemberCommunicationSlow",
            format!("histogram_quantile(0.99, rate(etcd_network_peer_round_trip_time_seconds_bucket{{{j}}}[5m]))"),
        ),
        ("etcdHighNumberOfFailedProposals", format!("rate(etcd_server_proposals_failed_total{{{j}}}[15m])")),
        (
            "etcdHighFsyncDurations",
            format!("histogram_quantile(0.99, rate(etcd_disk_wal_fsync_duration_seconds_bucket{{{j}}}[5m]))"),
        ),
        (
            "etcdHighCommitDurations",
            format!("histogram_quantile(0.99, rate(etcd_disk_backend_commit_duration_seconds_bucket{{{j}}}[5m]))"),
        ),
        (
            "etcdDatabaseQuotaLowSpace",
            format!("(last_over_time(etcd_mvcc_db_total_size_in_bytes{{{j}}}[5m]) / last_over_time(etcd_server_quota_backend_bytes{{{j}}}[5m]))*100"),
        ),
        (
            "etcdExcessiveDatabaseGrowth",
            format!("predict_linear(etcd_mvcc_db_total_size_in_bytes{{{j}}}[4h], 4*60*60) - etcd_server_quota_backend_bytes{{{j}}}"),
        ),
        (
            "etcdDatabaseHighFragmentationRatio",
            format!("(last_over_time(etcd_mvcc_db_total_size_in_use_in_bytes{{{j}}}[5m]) / last_over_time(etcd_mvcc_db_total_size_in_bytes{{{j}}}[5m]))"),
        ),
    ]
}

/// The dashboard's panels (etcd's Grafana dashboard, `$cluster` = etcd).
fn dashboard_queries() -> Vec<(&'static str, String)> {
    let j = r#"job="etcd""#;
    let r = "[30s]";
    vec![
        ("Up", format!("sum(etcd_server_has_leader{{{j}}})")),
        ("RPC rate", format!("sum(rate(grpc_server_started_total{{{j},grpc_type=\"unary\"}}{r}))")),
        (
            "RPC failed rate",
            format!("sum(rate(grpc_server_handled_total{{{j},grpc_type=\"unary\",grpc_code=~\"{FAILED_CODES}\"}}{r}))"),
        ),
        (
            "Active watch streams",
            format!("sum(grpc_server_started_total{{{j},grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"}}) - sum(grpc_server_handled_total{{{j},grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"}})"),
        ),
        (
            "Active lease streams",
            format!("sum(grpc_server_started_total{{{j},grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"}}) - sum(grpc_server_handled_total{{{j},grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"}})"),
        ),
        ("DB size", format!("etcd_mvcc_db_total_size_in_bytes{{{j}}}")),
        (
            "WAL fsync p99",
            format!("histogram_quantile(0.99, sum(rate(etcd_disk_wal_fsync_duration_seconds_bucket{{{j}}}{r})) by (instance, le))"),
        ),
        (
            "Backend commit p99",
            format!("histogram_quantile(0.99, sum(rate(etcd_disk_backend_commit_duration_seconds_bucket{{{j}}}{r})) by (instance, le))"),
        ),
        ("Memory", format!("process_resident_memory_bytes{{{j}}}")),
        ("Client traffic in", format!("rate(etcd_network_client_grpc_received_bytes_total{{{j}}}{r})")),
        ("Client traffic out", format!("rate(etcd_network_client_grpc_sent_bytes_total{{{j}}}{r})")),
        ("Peer traffic in", format!("sum(rate(etcd_network_peer_received_bytes_total{{{j}}}{r})) by (instance)")),
        ("Peer traffic out", format!("sum(rate(etcd_network_peer_sent_bytes_total{{{j}}}{r})) by (instance)")),
        ("Proposals committed", format!("sum(rate(etcd_server_proposals_committed_total{{{j}}}{r}))")),
        ("Proposals applied", format!("sum(rate(etcd_server_proposals_applied_total{{{j}}}{r}))")),
        ("Proposals failed", format!("sum(rate(etcd_server_proposals_failed_total{{{j}}}{r}))")),
        ("Proposals pending", format!("sum(etcd_server_proposals_pending{{{j}}})")),
        ("Leader elections per day", format!("changes(etcd_server_leader_changes_seen_total{{{j}}}[1d])")),
        (
            "Peer round trip time p99",
            format!("histogram_quantile(0.99, sum by (instance, le) (rate(etcd_network_peer_round_trip_time_seconds_bucket{{{j}}}{r})))"),
        ),
    ]
}

/// etcdMembersDown as the mixin writes it, with a 30 s rate window (its 120 s would need
/// two minutes of scrapes after the kill).
const MEMBERS_DOWN: &str = r#"max without (endpoint) (
  sum without (instance) (up{job=~".*etcd.*"} == bool 0)
or
  count without (To) (
    sum without (instance) (rate(etcd_network_peer_sent_failures_total{job=~".*etcd.*"}[30s])) > 0.01
  )
)
> 0"#;

const PEER_FAILURES: &str = r#"count without (To) (
  sum without (instance) (rate(etcd_network_peer_sent_failures_total{job=~".*etcd.*"}[30s])) > 0.01
)"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_mixin_queries_light_up_against_kvd() {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let Some(prom) = Prometheus::start(&ports) else {
        println!(
            "SKIPPED etcds_mixin_queries_light_up_against_kvd: no `prometheus` binary on the \
             PATH (apt-get install prometheus; .ci/run installs it)"
        );
        return;
    };
    let mut c = Cluster::start_custom(3, false, |i| {
        vec![
            format!("--listen-metrics-urls=http://127.0.0.1:{}", ports[i]),
            "--metrics=extensive".into(),
        ]
    })
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (0..3).find(|i| *i != leader).unwrap();

    // Work for every panel: writes through the leader and a follower, a watch stream, and
    // one refused request (a range at a future revision).
    let mut watch_tx = Some(common::open_watch(&c, leader).await);
    let load_until = Instant::now() + Duration::from_secs(8);
    let mut kv_l = c.kv(leader).await;
    let mut kv_f = c.kv(follower).await;
    let mut i = 0;
    while Instant::now() < load_until {
        put(&mut kv_l, &format!("k{i}"), "value").await.unwrap();
        put(&mut kv_f, &format!("f{i}"), "value").await.unwrap();
        i += 1;
    }
    let refused = kv_l
        .range(kvd::proto::etcdserverpb::RangeRequest {
            key: b"k".to_vec(),
            revision: 1 << 40,
            ..Default::default()
        })
        .await;
    assert!(refused.is_err());
    // Prometheus must have scraped all three targets at least twice for the rates.
    prom.wait_for(
        "count(up{job=\"etcd\"} == 1)",
        Duration::from_secs(20),
        |v| v == 3.0,
    )
    .await
    .unwrap_or_else(|r| panic!("targets not up: {r:?}\n{}", prom.log()));
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut missing = Vec::new();
    for (name, q) in alert_queries().into_iter().chain(dashboard_queries()) {
        if prom.query(&q).await.is_empty() {
            missing.push(format!("{name}: {q}"));
        }
    }
    assert!(
        missing.is_empty(),
        "queries without series:\n{}",
        missing.join("\n")
    );

    // Under load the panels move.
    for (name, q) in [
        (
            "RPC rate",
            "sum(rate(grpc_server_started_total{job=\"etcd\",grpc_type=\"unary\"}[30s]))",
        ),
        (
            "fsyncs",
            "sum(rate(etcd_disk_wal_fsync_duration_seconds_count{job=\"etcd\"}[30s]))",
        ),
        (
            "client traffic in",
            "sum(rate(etcd_network_client_grpc_received_bytes_total{job=\"etcd\"}[30s]))",
        ),
        (
            "peer traffic out",
            "sum(rate(etcd_network_peer_sent_bytes_total{job=\"etcd\"}[30s]))",
        ),
        (
            "peer round trips",
            "sum(rate(etcd_network_peer_round_trip_time_seconds_count{job=\"etcd\"}[30s]))",
        ),
        (
            "mvcc puts",
            "sum(rate(etcd_mvcc_put_total{job=\"etcd\"}[30s]))",
        ),
    ] {
        let r = prom.query(q).await;
        assert!(
            r.iter().any(|(_, v)| *v > 0.0),
            "{name} did not move: {q} -> {r:?}"
        );
    }
    let streams = prom
        .query(
            &dashboard_queries()
                .iter()
                .find(|(n, _)| *n == "Active watch streams")
                .unwrap()
                .1,
        )
        .await;
    assert_eq!(streams.first().map(|s| s.1), Some(1.0), "{streams:?}");
    let refused = prom
        .query("sum(grpc_server_handled_total{job=\"etcd\",grpc_method=\"Range\",grpc_code=\"OutOfRange\"})")
        .await;
    assert_eq!(refused.first().map(|s| s.1), Some(1.0), "{refused:?}");
    // Healthy: the members-down alert does not fire.
    assert!(prom.query(MEMBERS_DOWN).await.is_empty());

    // One member killed: both branches of etcdMembersDown fire.
    watch_tx.take();
    let victim = follower;
    c.kill(victim);
    prom.wait_for(MEMBERS_DOWN, Duration::from_secs(30), |v| v > 0.0)
        .await
        .unwrap_or_else(|r| panic!("members-down did not fire: {r:?}"));
    prom.wait_for(PEER_FAILURES, Duration::from_secs(30), |v| v > 0.0)
        .await
        .unwrap_or_else(|r| panic!("peer failures did not show: {r:?}"));
    let down = prom.query("up{job=\"etcd\"} == 0").await;
    assert_eq!(down.len(), 1, "{down:?}");
    assert_eq!(
        down[0].0["instance"],
        format!("127.0.0.1:{}", ports[victim]).as_str()
    );
}
