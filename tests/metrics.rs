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

/// etcd's families that its monitoring mixin and dashboard select are served with etcd's
/// labels and move with the work: gRPC calls by type and code (a watch stream stays started
/// and not handled while it is open), MVCC puts, client and peer bytes, peer round trips,
/// health checks, identity, quota and process figures. With `--metrics basic` (the default)
/// the handling-time histogram is not served, as etcd does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_families_are_served_and_move_with_the_work() {
    let (c, ports, leader, follower) = cluster_with_metrics().await;
    let mut kv = c.kv(leader).await;
    for i in 0..20 {
        put(&mut kv, &format!("k{i}"), "value").await.unwrap();
    }
    // A watch stream, open while the metrics are read.
    let watch = common::open_watch(&c, leader).await;
    assert_eq!(http_get(ports[leader], "/health").await.0, 200);
    // The prober measures a round trip per peer every second.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let body = http_get(ports[leader], "/metrics").await.1;
    let body_f = http_get(ports[follower], "/metrics").await.1;
    let put_labels = r#"grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary""#;
    assert!(sample(&body, &format!("grpc_server_started_total{{{put_labels}}}")) >= 20.0);
    assert!(
        sample(
            &body,
            &format!("grpc_server_msg_received_total{{{put_labels}}}")
        ) >= 20.0
    );
    assert!(
        sample(
            &body,
            &format!("grpc_server_msg_sent_total{{{put_labels}}}")
        ) >= 20.0
    );
    let code = |c: &str| format!("grpc_server_handled_total{{grpc_code=\"{c}\",{put_labels}}}");
    assert!(sample(&body, &code("OK")) >= 20.0);
    // Pre-initialised, as etcd's are.
    assert_eq!(sample(&body, &code("Unavailable")), 0.0);
    let w = r#"grpc_method="Watch",grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream""#;
    let started = sample(&body, &format!("grpc_server_started_total{{{w}}}"));
    let handled: f64 = body
        .lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{") && l.contains(w))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(started - handled, 1.0, "one watch stream open");
    assert!(
        sample(&body, &format!("grpc_server_msg_received_total{{{w}}}")) >= 1.0,
        "a bidirectional stream's request messages are counted"
    );
    assert!(sample(&body, &format!("grpc_server_msg_sent_total{{{w}}}")) >= 1.0);
    // Every range read has ended.
    assert_eq!(sample(&body, "etcd_mvcc_db_open_read_transactions"), 0.0);
    assert_eq!(sample(&body, "etcd_server_slow_apply_total"), 0.0);
    assert!(!body.contains("grpc_server_handling_seconds"));
    assert!(
        sample(
            &body,
            r#"etcd_server_client_requests_total{client_api_version="unknown",type="unary"}"#
        ) >= 20.0
    );
    assert!(sample(&body, "etcd_mvcc_put_total") >= 20.0);
    assert!(
        sample(&body_f, "etcd_mvcc_put_total") >= 20.0,
        "counted where applied"
    );
    assert!(sample(&body, "etcd_network_client_grpc_received_bytes_total") > 0.0);
    assert!(sample(&body, "etcd_network_client_grpc_sent_bytes_total") > 0.0);
    assert!(sample(&body, "etcd_server_health_success") >= 1.0);
    assert_eq!(
        sample(&body, "etcd_server_quota_backend_bytes"),
        2147483648.0
    );
    // The live bytes are rescanned at most every 30 s (the cluster's start already asked for
    // them through Status), so only their bound is certain here.
    assert!(
        sample(&body, "etcd_mvcc_db_total_size_in_use_in_bytes")
            <= sample(&body, "etcd_mvcc_db_total_size_in_bytes")
    );
    assert!(sample(&body, "process_resident_memory_bytes") > 0.0);
    assert!(sample(&body, "process_start_time_seconds") > 0.0);
    assert!(sample(&body, "os_fd_used") > 0.0);
    assert!(sample(&body, "os_fd_limit") >= sample(&body, "os_fd_used"));
    assert_eq!(sample(&body, "etcd_server_is_learner"), 0.0);
    assert!(body.contains("etcd_server_version{server_version=\"3.5.17\"} 1\n"));

    // Peer figures are labelled with the other member's id in lowercase hex.
    let id_line = body
        .lines()
        .find(|l| l.starts_with("etcd_server_id{"))
        .unwrap();
    let leader_hex = id_line.split('"').nth(1).unwrap().to_string();
    assert!(u64::from_str_radix(&leader_hex, 16).is_ok(), "{id_line}");
    let from_leader = format!("etcd_network_peer_received_bytes_total{{From=\"{leader_hex}\"}}");
    assert!(sample(&body_f, &from_leader) > 0.0);
    let sent: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("etcd_network_peer_sent_bytes_total{To=\""))
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    let rtt: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with("etcd_network_peer_round_trip_time_seconds_count{To=\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(rtt.len(), 2);
    let active = format!("etcd_network_active_peers{{Local=\"{leader_hex}\",Remote=\"");
    let active: Vec<&str> = body.lines().filter(|l| l.starts_with(&active)).collect();
    assert_eq!(active.len(), 2, "{active:?}");
    assert!(active.iter().all(|l| l.ends_with(" 1")), "{active:?}");
    // This scrape is in flight while it is rendered, and counted as answered after.
    assert_eq!(
        sample(&body, "promhttp_metric_handler_requests_in_flight"),
        1.0
    );
    let again = http_get(ports[leader], "/metrics").await.1;
    assert!(
        sample(
            &again,
            r#"promhttp_metric_handler_requests_total{code="200"}"#
        ) >= 1.0
    );
    assert_eq!(sample(&body, "etcd_disk_defrag_inflight"), 0.0);
    assert!(rtt.iter().all(|n| *n >= 1.0), "{rtt:?}");
    drop(watch);
}
