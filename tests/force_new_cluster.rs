//! `--force-new-cluster` on real `kvd` processes: a 3-member cluster loses two members (kill -9),
//! the survivor restarts forced into a one-member cluster with every acknowledged write at its
//! revision, serves writes, keeps the one-member configuration when restarted without the flag,
//! and grows again through `member add`, the new member catching up.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{get, put, Cluster};
use kvd::proto::etcdserverpb::{
    DeleteRangeRequest, MemberAddRequest, MemberListRequest, MemberPromoteRequest,
};

async fn members(c: &Cluster, i: usize) -> Vec<u64> {
    let mut ids: Vec<u64> = c
        .cluster(i)
        .await
        .member_list(MemberListRequest {
            linearizable: false,
        })
        .await
        .unwrap()
        .into_inner()
        .members
        .into_iter()
        .map(|m| m.id)
        .collect();
    ids.sort();
    ids
}

/// Every acknowledged key with its value and mod revision, read from member `i`.
async fn assert_acked(c: &Cluster, i: usize, acked: &BTreeMap<String, (String, i64)>) {
    for (k, (v, rev)) in acked {
        let got = common::local_get(c, i, k)
            .await
            .unwrap_or_else(|| panic!("{k} missing"));
        assert_eq!(
            (
                String::from_utf8_lossy(&got.value).into_owned(),
                got.mod_revision
            ),
            (v.clone(), *rev),
            "{k}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivor_forced_into_a_new_cluster_keeps_every_acked_write_and_grows_again() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    // A follower survives: it knows of commits only from the leader's messages.
    let survivor = (leader + 1) % 3;
    let mut w = c.kv(leader).await;
    let mut acked = BTreeMap::new();
    for i in 0..60 {
        let (k, v) = (format!("k{}", i % 40), format!("v{i}"));
        let rev = put(&mut w, &k, &v).await.unwrap();
        acked.insert(k, (v, rev));
    }
    w.delete_range(DeleteRangeRequest {
        key: "k0".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    acked.remove("k0");
    let last_rev = put(&mut w, "last", "x").await.unwrap();
    acked.insert("last".into(), ("x".into(), last_rev));
    // The survivor hears the commit index with the next heartbeat.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let survivor_id = c.status(survivor).await.header.unwrap().member_id;

    for i in (0..3).filter(|i| *i != survivor) {
        c.kill(i);
    }
    c.stop(survivor);
    c.members[survivor]
        .extra_args
        .push("--force-new-cluster".into());
    c.spawn(survivor);
    c.wait_for_leader(Duration::from_secs(20)).await;
    assert_eq!(members(&c, survivor).await, [survivor_id]);
    assert_acked(&c, survivor, &acked).await;
    let mut s = c.kv(survivor).await;
    assert_eq!(get(&mut s, "k0").await.unwrap(), None);
    let rev = put(&mut s, "after", "forced").await.unwrap();
    assert_eq!(
        rev,
        last_rev + 1,
        "revisions go on from the last acknowledged one"
    );
    acked.insert("after".into(), ("forced".into(), rev));
    assert!(c
        .log_of(survivor)
        .contains("this member is now the only voter of its cluster"));

    // Restarted without the flag: still alone, still everything.
    c.stop(survivor);
    c.members[survivor].extra_args.clear();
    c.spawn(survivor);
    c.wait_for_leader(Duration::from_secs(20)).await;
    assert_eq!(members(&c, survivor).await, [survivor_id]);
    assert_acked(&c, survivor, &acked).await;

    // Grows again: a new member is added as a learner (the runbook's way, see
    // docs/decisions/0019), started, catches up and is promoted.
    let n = c.new_member("m3");
    let resp = c
        .cluster(survivor)
        .await
        .member_add(MemberAddRequest {
            peer_ur_ls: vec![c.members[n].peer_url()],
            is_learner: true,
        })
        .await
        .unwrap()
        .into_inner();
    c.members[n].join = Some(common::initial_cluster_for(&resp, "m3"));
    c.spawn(n);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut nk = c.kv(n).await;
        if let Ok(Some(v)) = get(&mut nk, "after").await {
            assert_eq!(v, "forced");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "new member never caught up\n{}",
            c.log_of(n)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let new_id = resp.member.unwrap().id;
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = c
        .cluster(survivor)
        .await
        .member_promote(MemberPromoteRequest { id: new_id })
        .await
    {
        assert!(Instant::now() < deadline, "promote: {e:?}\n{}", c.log_of(n));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_acked(&c, n, &acked).await;
    let mut s = c.kv(survivor).await;
    let rev = put(&mut s, "two", "members").await.unwrap();
    acked.insert("two".into(), ("members".into(), rev));
    assert_eq!(members(&c, n).await.len(), 2);
    // The new voter applies what the pair commits.
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&mut c.kv(n).await, "two").await.unwrap().is_none() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_acked(&c, n, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flag_left_set_on_a_one_member_cluster_only_warns() {
    let mut c = Cluster::start(1).await;
    let mut w = c.kv(0).await;
    let rev = put(&mut w, "a", "1").await.unwrap();
    c.stop(0);
    c.members[0].extra_args.push("--force-new-cluster".into());
    c.spawn(0);
    c.wait_for_leader(Duration::from_secs(20)).await;
    let mut w = c.kv(0).await;
    assert_eq!(get(&mut w, "a").await.unwrap().as_deref(), Some("1"));
    assert_eq!(put(&mut w, "b", "2").await.unwrap(), rev + 1);
    assert!(c
        .log_of(0)
        .contains("--force-new-cluster is set but this member is already the only one"));
}
