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

/// Three members, each with a metrics URL: the cluster, the metrics ports, the leader and a
/// follower.
async fn cluster_with_metrics() -> (Cluster, Vec<u16>, usize, usize) {
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
    (c, ports, leader, follower)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_puts_cost_one_fsync_per_member_and_health_is_served() {
    let (c, ports, leader, follower) = cluster_with_metrics().await;

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
            r#"grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#
        ),
        "{body_l}"
    );

    for p in &ports {
        let (code, body) = http_get(*p, "/health").await;
        assert_eq!(code, 200);
        assert_eq!(body, r#"{"health":"true"}"#);
    }
}

/// Writes through a follower under concurrency go to the leader in batches (fewer calls than
/// writes), and each client still gets its own write's answer: every put asks for its key's
/// previous value, and each answer names the value that same client wrote before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_through_a_follower_are_batched_and_answered_each_their_own() {
    use kvd::proto::etcdserverpb::PutRequest;
    let (c, ports, _, follower) = cluster_with_metrics().await;
    let url = c.members[follower].client_url();
    let mut tasks = Vec::new();
    for client in 0..32 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut kv =
                kvd::proto::etcdserverpb::kv_client::KvClient::new(common::channel(&url).await);
            let key = format!("c{client}");
            let mut last_rev = 0;
            for n in 0..40 {
                let r = kv
                    .put(PutRequest {
                        key: key.clone().into_bytes(),
                        value: format!("{client}/{n}").into_bytes(),
                        prev_kv: true,
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                let rev = r.header.unwrap().revision;
                assert!(rev > last_rev, "revisions of one client's writes increase");
                last_rev = rev;
                match (n, r.prev_kv) {
                    (0, None) => {}
                    (n, Some(p)) => {
                        assert_eq!(p.key, key.as_bytes());
                        assert_eq!(p.value, format!("{client}/{}", n - 1).into_bytes());
                        assert!(p.mod_revision < rev);
                    }
                    (n, p) => panic!("client {client} write {n}: prev_kv {p:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let body = http_get(ports[follower], "/metrics").await.1;
    let writes = sample(&body, "kvd_server_forwarded_writes_total");
    let calls = sample(&body, "kvd_server_forward_calls_total");
    assert!(writes >= 32.0 * 40.0, "{writes} writes forwarded");
    assert!(
        calls < writes / 2.0,
        "{calls} calls carried {writes} forwarded writes: not batched"
    );
}
