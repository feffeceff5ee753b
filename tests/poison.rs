//! Requests that must not stop a member: a deeply nested txn that decodes at the client port
//! must also decode on apply, on every member and every restart
//! (docs/decisions/0010-prost-without-recursion-limit.md). Each request here gets etcd 3.4's
//! answer, and the cluster keeps serving, before and after a restart of every member; so does
//! a range with a sort option that names no value.

mod common;

use std::time::Duration;

use common::{get, put, Cluster};
use kvd::proto::etcdserverpb::request_op::Request;
use kvd::proto::etcdserverpb::{Compare, PutRequest, RangeRequest, RequestOp, TxnRequest};
use tonic::Code;

/// A txn `levels` deep: each level compares `{prefix}/c` (never written, so the compare holds)
/// and nests the next in its success branch; the innermost puts `{prefix}`.
fn nested_txn(prefix: &str, levels: usize) -> TxnRequest {
    let mut op = RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: prefix.into(),
            value: format!("{levels}").into_bytes(),
            ..Default::default()
        })),
    };
    let level = |op: RequestOp| TxnRequest {
        compare: vec![Compare {
            key: format!("{prefix}/c").into_bytes(),
            ..Default::default()
        }],
        success: vec![op],
        failure: vec![],
    };
    if levels == 0 {
        return TxnRequest::default();
    }
    for _ in 1..levels {
        op = RequestOp {
            request: Some(Request::RequestTxn(level(op))),
        };
    }
    level(op)
}

/// Builds and sends `nested_txn(prefix, levels)` from a thread with a large stack: building,
/// encoding and dropping a txn thousands of levels deep recurses that deep in the client.
fn send_deep(url: String, prefix: &str, levels: usize) -> Result<bool, tonic::Status> {
    let prefix = prefix.to_string();
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let txn = nested_txn(&prefix, levels);
            rt.block_on(async move {
                let mut kv =
                    kvd::proto::etcdserverpb::kv_client::KvClient::new(common::channel(&url).await);
                let r = kv.txn(txn).await.map(|r| r.into_inner().succeeded);
                drop(kv);
                r
            })
        })
        .unwrap()
        .join()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_txns_get_etcds_answers_and_the_cluster_keeps_serving() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;

    // Accepted by etcd 3.4 (up to --max-txn-ops levels): accepted here, through the leader and
    // through a follower (which forwards it over the peer protocol).
    for (i, levels) in [(leader, 50), (follower, 50), (leader, 100), (follower, 128)] {
        let prefix = format!("nest/{i}/{levels}");
        let r = send_deep(c.members[i].client_url(), &prefix, levels);
        assert_eq!(r.ok(), Some(true), "{levels} levels through member {i}");
        let mut kv = c.kv(i).await;
        assert_eq!(
            get(&mut kv, &prefix).await.unwrap(),
            Some(levels.to_string())
        );
    }

    // Beyond the operation budget, and far beyond it (where the decoder never runs): etcd's
    // InvalidArgument, nothing proposed.
    for (i, levels) in [
        (leader, 129),
        (follower, 129),
        (leader, 300),
        (follower, 5_000),
    ] {
        let prefix = format!("deep/{i}/{levels}");
        let err = send_deep(c.members[i].client_url(), &prefix, levels).expect_err("refused");
        assert_eq!(
            (err.code(), err.message()),
            (
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request"
            ),
            "{levels} levels through member {i}"
        );
    }

    // A sort order or target that names no enum value: etcd 3.5's checkRangeRequest refuses
    // it with InvalidArgument (etcd 3.4 does not check, and an unknown target with no order
    // reaches a nil sorter), alone and inside a txn, through either member.
    for i in [leader, follower] {
        let mut kv = c.kv(i).await;
        for (order, target) in [(7, 0), (0, 9), (1, -1)] {
            let range = RangeRequest {
                key: b"a".to_vec(),
                range_end: b"z".to_vec(),
                sort_order: order,
                sort_target: target,
                ..Default::default()
            };
            let txn = TxnRequest {
                success: vec![RequestOp {
                    request: Some(Request::RequestRange(range.clone())),
                }],
                ..Default::default()
            };
            for err in [
                kv.range(range).await.expect_err("range refused"),
                kv.txn(txn).await.expect_err("txn refused"),
            ] {
                assert_eq!(
                    (err.code(), err.message()),
                    (Code::InvalidArgument, "etcdserver: invalid sort option"),
                    "order {order} target {target} through member {i}"
                );
            }
        }
    }

    // Every member still serves, and has the same data.
    let mut kv = c.kv(follower).await;
    put(&mut kv, "after", "1").await.unwrap();
    for i in 0..3 {
        let mut kv = c.kv(i).await;
        assert_eq!(get(&mut kv, "after").await.unwrap().as_deref(), Some("1"));
        assert_eq!(
            get(&mut kv, "nest/0/50").await.unwrap().is_some(),
            leader == 0 || follower == 0,
        );
    }

    // And every member comes back on its data dir, replaying those entries.
    c.kill_all_and_restart();
    c.wait_for_leader(Duration::from_secs(20)).await;
    for i in 0..3 {
        let mut kv = c.kv(i).await;
        let prefix = format!("nest/{follower}/128");
        assert_eq!(
            get(&mut kv, &prefix).await.unwrap().as_deref(),
            Some("128"),
            "member {i} after restart\n{}",
            c.log_of(i)
        );
    }
}

/// The same answers from a real etcd (`KVD_ETCD_URL=http://127.0.0.1:2379 cargo test --test
/// poison -- --ignored`), to check the expectations above against etcd itself.
#[test]
#[ignore]
fn etcd_gives_the_same_answers() {
    let url = std::env::var("KVD_ETCD_URL").expect("KVD_ETCD_URL");
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    for levels in [50, 100, 128] {
        let r = send_deep(url.clone(), &format!("nest/{stamp}/{levels}"), levels);
        assert_eq!(r.ok(), Some(true), "{levels} levels");
    }
    for levels in [129, 300, 5_000] {
        let err =
            send_deep(url.clone(), &format!("deep/{stamp}/{levels}"), levels).expect_err("refused");
        assert_eq!(
            (err.code(), err.message()),
            (
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request"
            ),
            "{levels} levels"
        );
    }
}
