//! `kvctl make-mirror` between real clusters: the first copy (more than one page, written in
//! several txns), then the changes that follow it (a txn, deletes, a delete of more keys in one
//! revision than one destination txn may hold), with the source member the watch was reading
//! from killed in the middle: the mirror carries on through another member, and the
//! destination ends with exactly the source's keys and values under the new prefix.

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Cluster;
use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::request_op::Request;
use kvd::proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use tonic::transport::Channel;

fn put_op(k: &str, v: &str) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: k.into(),
            value: v.into(),
            ..Default::default()
        })),
    }
}

async fn txn(kv: &mut KvClient<Channel>, ops: Vec<RequestOp>) {
    kv.txn(TxnRequest {
        success: ops,
        ..Default::default()
    })
    .await
    .unwrap();
}

/// Every key under `prefix`, with `prefix` cut off, and its value.
async fn dump(kv: &mut KvClient<Channel>, prefix: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let r = kv
        .range(RangeRequest {
            key: prefix.into(),
            range_end: end,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    r.kvs
        .into_iter()
        .map(|kv| (kv.key[prefix.len()..].to_vec(), kv.value))
        .collect()
}

struct Mirror(Child);

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until the destination holds exactly the source's keys (or fails with both).
async fn converge(src: &mut KvClient<Channel>, dst: &mut KvClient<Channel>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (s, d) = (dump(src, "/registry/").await, dump(dst, "/copy/").await);
        if s == d {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: destination never matched the source: {} source keys, {} destination keys",
            s.len(),
            d.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_copies_then_follows_through_a_source_member_failure() {
    let mut src = Cluster::start(3).await;
    let dst = Cluster::start(1).await;
    let mut w = src.kv(1).await;
    // 1,500 keys: two pages of the first copy and many destination txns.
    for chunk in 0..15 {
        let ops = (0..100)
            .map(|i| {
                let n = chunk * 100 + i;
                put_op(&format!("/registry/k{n:04}"), &format!("v{n}"))
            })
            .collect();
        txn(&mut w, ops).await;
    }
    txn(&mut w, vec![put_op("/elsewhere", "not mirrored")]).await;

    let endpoints = src
        .members
        .iter()
        .map(|m| m.client_url())
        .collect::<Vec<_>>()
        .join(",");
    let _mirror = Mirror(
        Command::new(env!("CARGO_BIN_EXE_kvctl"))
            .env_remove("ETCDCTL_ENDPOINTS")
            .args([
                "--endpoints",
                &endpoints,
                "make-mirror",
                "--prefix",
                "/registry/",
                "--dest-prefix",
                "/copy/",
                &dst.members[0].client_url(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut d = dst.kv(0).await;
    converge(&mut w, &mut d, "first copy").await;

    // Changes after the copy: a txn of puts and a delete, single deletes, and 300 deletes in
    // one revision (more than the 128 operations of one destination txn).
    txn(
        &mut w,
        vec![
            put_op("/registry/t1", "a"),
            put_op("/registry/k0001", "changed"),
            RequestOp {
                request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                    key: "/registry/k0002".into(),
                    ..Default::default()
                })),
            },
        ],
    )
    .await;
    w.delete_range(DeleteRangeRequest {
        key: "/registry/k0100".into(),
        range_end: "/registry/k0400".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    converge(&mut w, &mut d, "changes").await;
    assert!(!dump(&mut d, "/copy/").await.contains_key(&b"k0150"[..]));

    // The mirror reads from the first endpoint; kill that member and keep writing.
    src.kill(0);
    for i in 0..50 {
        txn(&mut w, vec![put_op(&format!("/registry/after{i}"), "x")]).await;
    }
    converge(&mut w, &mut d, "after the source member failed").await;
    let copied = dump(&mut d, "/copy/").await;
    assert_eq!(
        copied.get(&b"k0001"[..]).map(Vec::as_slice),
        Some(&b"changed"[..])
    );
    assert!(copied.contains_key(&b"after49"[..]));
    assert!(dump(&mut d, "/elsewhere").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_split_the_first_copy_and_a_compacted_start_ends_the_mirror() {
    let src = Cluster::start(1).await;
    let dst = Cluster::start(1).await;
    let mut w = src.kv(0).await;
    // 3.9 MiB of values in a single page: more than one destination txn may hold (1 MiB, and
    // etcd's 1.5 MiB request limit), and a value of 1.4 MiB that must go alone.
    for (i, kib) in [600, 300, 1400, 900, 700].into_iter().enumerate() {
        let v = "v".repeat(kib << 10);
        txn(&mut w, vec![put_op(&format!("/registry/big{i}"), &v)]).await;
    }
    let mirror = |args: &[&str]| {
        let mut a = vec!["--endpoints".to_string(), src.members[0].client_url()];
        a.push("make-mirror".into());
        a.extend(args.iter().map(|s| s.to_string()));
        a.push(dst.members[0].client_url());
        Command::new(env!("CARGO_BIN_EXE_kvctl"))
            .env_remove("ETCDCTL_ENDPOINTS")
            .args(a)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let _m = Mirror(mirror(&[
        "--prefix",
        "/registry/",
        "--dest-prefix",
        "/copy/",
    ]));
    let mut d = dst.kv(0).await;
    converge(&mut w, &mut d, "large values").await;
    drop(_m);

    // Watching from a compacted revision: etcd's error, exit code 1.
    let rev = w
        .compact(kvd::proto::etcdserverpb::CompactionRequest {
            revision: 4,
            physical: true,
        })
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    assert!(rev >= 4);
    let out = mirror(&["--rev", "2", "--prefix", "/registry/"])
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("etcdserver: mvcc: required revision has been compacted"),
        "{err}"
    );
}
