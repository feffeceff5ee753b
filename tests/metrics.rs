//! The metrics endpoint on a real 3-member cluster: one put costs one WAL fsync on the leader
//! and one on each follower (group commit may only make it fewer under concurrency, never
//! more; with sequential puts it is exactly one each), and `/health` reports the leader.

mod common;

use std::time::Duration;

use common::{free_port, http_get, put, Cluster};

/// Plain HTTP/1.0 GET (no client crate needed): returns (status code, body).
fn sample(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_puts_cost_one_fsync_per_member_and_health_is_served() {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let c = Cluster::start_custom(3, false, |i| {
        vec![format!(
            "--listen-metrics-urls=http://127.0.0.1:{}",
            ports[i]
        )]
    })
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (0..3).find(|i| *i != leader).unwrap();

    // Let the startup writes (publish, membership) settle before taking the baseline.
    let mut kv = c.kv(leader).await;
    put(&mut kv, "warmup", "v").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fsyncs = "etcd_disk_wal_fsync_duration_seconds_count";
    let before_l = sample(&http_get(ports[leader], "/metrics").await.1, fsyncs);
    let before_f = sample(&http_get(ports[follower], "/metrics").await.1, fsyncs);

    for i in 0..300 {
        put(&mut kv, &format!("k{i}"), "value").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (code, body_l) = http_get(ports[leader], "/metrics").await;
    assert_eq!(code, 200);
    let body_f = http_get(ports[follower], "/metrics").await.1;
    let dl = sample(&body_l, fsyncs) - before_l;
    let df = sample(&body_f, fsyncs) - before_f;
    // About one fsync per put on each member, neither an extra one (the commit index rides
    // with the next append) nor batching. Not exactly one: a put commits once any two members
    // have it durable, so the third (the leader too) may still be syncing when the next put
    // arrives, and then covers both with one fsync. Under load that happens a few times in 300.
    for (who, d) in [("leader", dl), ("follower", df)] {
        assert!(
            (270.0..=330.0).contains(&d),
            "{who} fsyncs grew by {d} for 300 sequential puts"
        );
    }

    assert_eq!(sample(&body_l, "etcd_server_is_leader"), 1.0);
    assert_eq!(sample(&body_f, "etcd_server_is_leader"), 0.0);
    assert_eq!(sample(&body_f, "etcd_server_has_leader"), 1.0);
    assert!(sample(&body_l, "etcd_server_proposals_applied_total") >= 301.0);
    assert!(sample(&body_l, "etcd_server_leader_changes_seen_total") >= 1.0);
    // One commit per ~100 ms of applies (etcd: per batch interval), not one per put.
    let commits = sample(&body_l, "etcd_disk_backend_commit_duration_seconds_count");
    assert!((1.0..300.0).contains(&commits), "{commits} backend commits");
    assert!(sample(&body_l, "etcd_mvcc_db_total_size_in_bytes") > 0.0);
    assert!(sample(&body_l, "etcd_disk_wal_write_bytes_total") > 0.0);
    assert!(
        body_l.contains(
            r#"grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV"}"#
        ),
        "{body_l}"
    );

    for p in &ports {
        let (code, body) = http_get(*p, "/health").await;
        assert_eq!(code, 200);
        assert_eq!(body, r#"{"health":"true"}"#);
    }
}
