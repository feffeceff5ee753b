//! `Maintenance.Defragment` on real `kvd` processes: the engine shrinks after a compaction and
//! keeps every record (also across a restart), the response is etcd 3.4's empty one, a
//! defragmenting follower does not hold up the cluster's writes, and a kill -9 at any moment of
//! a defragmentation leaves the member whole (the old engine or the new one).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{put, Cluster};
use kvd::proto::etcdserverpb::{CompactionRequest, DefragmentRequest, RangeRequest};
use tonic::Code;

/// The engine generations in a member's `sm/` directory.
fn generations(data_dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(data_dir.join("member/sm"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n == "db" || (n.starts_with("db.") && n != "db.current"))
        .collect();
    v.sort();
    v
}

async fn assert_reads(c: &Cluster, i: usize, want: &BTreeMap<String, (Vec<u8>, i64)>) {
    for (k, (v, rev)) in want {
        let got = common::local_get(c, i, k)
            .await
            .unwrap_or_else(|| panic!("{k} missing"));
        assert_eq!((&got.value, got.mod_revision), (v, *rev), "{k}");
    }
}

/// `n` puts of 1 KiB values over `keys` keys; returns each key's last value and revision.
async fn fill(c: &Cluster, i: usize, n: usize, keys: usize) -> BTreeMap<String, (Vec<u8>, i64)> {
    let mut kv = c.kv(i).await;
    let mut out = BTreeMap::new();
    for j in 0..n {
        let k = format!("key{:04}", j % keys);
        let v = format!("{j:08}").repeat(128);
        let rev = put(&mut kv, &k, &v).await.unwrap();
        out.insert(k, (v.into_bytes(), rev));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_after_a_compaction_shrinks_the_engine_and_keeps_every_record() {
    let mut c = Cluster::start(1).await;
    let want = fill(&c, 0, 2000, 20).await;
    let head = want.values().map(|(_, r)| *r).max().unwrap();
    let mut kv = c.kv(0).await;
    kv.compact(CompactionRequest {
        revision: head,
        physical: true,
    })
    .await
    .unwrap();
    let before = c.status(0).await;

    let resp = c
        .maintenance(0)
        .await
        .defragment(DefragmentRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.header, None,
        "etcd 3.4 answers a defragment with an empty response"
    );

    let after = c.status(0).await;
    assert!(
        after.db_size * 4 < before.db_size,
        "dbSize {} -> {}",
        before.db_size,
        after.db_size
    );
    // In use: the 20 live records' keys and values (and a little metadata).
    assert!(
        (20 * 1024..64 * 1024).contains(&after.db_size_in_use),
        "dbSizeInUse {}",
        after.db_size_in_use
    );
    assert!(after.db_size_in_use <= after.db_size);
    assert_reads(&c, 0, &want).await;
    let err = kv
        .range(RangeRequest {
            key: "key0001".into(),
            revision: head - 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange);
    let deadline = Instant::now() + Duration::from_secs(10);
    while generations(&c.members[0].data_dir) != ["db.1"] {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            generations(&c.members[0].data_dir)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Writes go on, on the new engine, and everything survives a kill -9.
    let rev = put(&mut kv, "after", "defrag").await.unwrap();
    c.kill(0);
    c.spawn(0);
    c.wait_for_leader(Duration::from_secs(20)).await;
    assert_reads(&c, 0, &want).await;
    let mut want2 = BTreeMap::new();
    want2.insert("after".to_string(), (b"defrag".to_vec(), rev));
    assert_reads(&c, 0, &want2).await;
    assert_eq!(generations(&c.members[0].data_dir), ["db.1"]);
    let again = c.status(0).await;
    assert!(again.db_size < before.db_size / 2, "{}", again.db_size);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_defragmenting_follower_does_not_hold_up_the_cluster() {
    let c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let follower = (leader + 1) % 3;
    let mut want = fill(&c, leader, 1000, 1000).await;

    // Writes through the leader while the follower defragments, several times over.
    let writer = {
        let mut kv = c.kv(leader).await;
        tokio::spawn(async move {
            let mut done = BTreeMap::new();
            let mut slowest = Duration::ZERO;
            for j in 0..300 {
                let t = Instant::now();
                let k = format!("during{j}");
                let rev = put(&mut kv, &k, "x").await.unwrap();
                slowest = slowest.max(t.elapsed());
                done.insert(k, (b"x".to_vec(), rev));
            }
            (done, slowest)
        })
    };
    let mut m = c.maintenance(follower).await;
    for _ in 0..3 {
        m.defragment(DefragmentRequest {}).await.unwrap();
    }
    let (done, slowest) = writer.await.unwrap();
    assert!(slowest < Duration::from_secs(2), "a write took {slowest:?}");
    want.extend(done);
    // The follower catches up after each pause.
    let last = want.get("during299").unwrap().1;
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.status(follower).await.header.unwrap().revision < last {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_reads(&c, follower, &want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_any_moment_of_a_defrag_leaves_the_member_whole() {
    let mut c = Cluster::start(1).await;
    let mut want = fill(&c, 0, 1500, 1500).await;
    let rounds: u64 = std::env::var("KVD_DEFRAG_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let mut seen_new = 0;
    for round in 0..rounds {
        let mut kv = c.kv(0).await;
        let rev = put(&mut kv, "round", &round.to_string()).await.unwrap();
        want.insert("round".into(), (round.to_string().into_bytes(), rev));
        let before = generations(&c.members[0].data_dir);
        let mut m = c.maintenance(0).await;
        let call = tokio::spawn(async move { m.defragment(DefragmentRequest {}).await });
        // Spread the kills over the copy, the switch and the old engine's removal.
        tokio::time::sleep(Duration::from_millis(5 + 25 * round)).await;
        c.kill(0);
        let _ = call.await;
        c.spawn(0);
        c.wait_for_leader(Duration::from_secs(20)).await;
        assert_reads(&c, 0, &want).await;
        let after = generations(&c.members[0].data_dir);
        assert_eq!(
            after.len(),
            1,
            "one generation after the restart: {after:?}"
        );
        if after != before {
            seen_new += 1;
        }
    }
    eprintln!("{seen_new} of {rounds} kills came after the switch");
}
