//! Three real `kvd` processes on loopback: replication, failover, restart, graceful stop.

mod common;

use std::time::Duration;

use common::{get, put, serializable_get, Cluster};
use kvd::proto::etcdserverpb::RangeRequest;

fn other(than: &[usize]) -> usize {
    (0..3).find(|i| !than.contains(i)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_follower_read_through_another_member() {
    let c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f1 = other(&[leader]);
    let f2 = other(&[leader, f1]);

    let mut w = c.kv(f1).await;
    let rev = put(&mut w, "foo", "bar").await.unwrap();
    assert!(rev >= 2, "first write gets revision 2 or more, got {rev}");

    // Linearizable read on another follower sees the write at once.
    let mut r = c.kv(f2).await;
    assert_eq!(get(&mut r, "foo").await.unwrap().as_deref(), Some("bar"));
    // And a serializable read on the member written through sees it too (read-your-writes).
    let kv = serializable_get(&mut w, "foo").await.unwrap();
    assert_eq!(kv.value, b"bar");

    // Headers agree on the cluster id and each names its own member.
    let mut ids = std::collections::BTreeSet::new();
    let mut cluster_ids = std::collections::BTreeSet::new();
    for i in 0..3 {
        let h = c.status(i).await.header.unwrap();
        ids.insert(h.member_id);
        cluster_ids.insert(h.cluster_id);
        assert!(h.raft_term >= 1);
    }
    assert_eq!(ids.len(), 3);
    assert_eq!(cluster_ids.len(), 1);
}

/// A write with none after it reaches the followers' state machines promptly: the leader
/// holds a commit index that has no entries to ride on for at most 2 ms (decision 0032), not
/// until the next heartbeat. Serializable reads on a follower see what it applied.
///
/// Heartbeats here are 300 ms apart, so commits carried only by them would put the median lag
/// near 150 ms; a prompt commit measures a few ms alone, and up to about 50 ms while the other
/// tests of this file load the two CPUs (each poll is a call to a debug build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_write_reaches_the_followers_without_waiting_for_a_heartbeat() {
    let c = Cluster::start_opts(
        3,
        false,
        &["--heartbeat-interval=300", "--election-timeout=3000"],
    )
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let f1 = other(&[leader]);
    let f2 = other(&[leader, f1]);
    let mut w = c.kv(leader).await;
    let mut followers = [c.kv(f1).await, c.kv(f2).await];
    let mut lags = Vec::new();
    for i in 0..15 {
        let value = format!("v{i}");
        put(&mut w, "lone", &value).await.unwrap();
        let acked = std::time::Instant::now();
        for f in &mut followers {
            loop {
                let kv = serializable_get(f, "lone").await;
                if kv.is_some_and(|kv| kv.value == value.as_bytes()) {
                    break;
                }
                assert!(
                    acked.elapsed() < Duration::from_secs(5),
                    "follower never applied"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        lags.push(acked.elapsed());
        // Past the hold and any write's trailing commit, so the next write is alone again.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    lags.sort();
    assert!(
        lags[lags.len() / 2] < Duration::from_millis(75),
        "followers applied a lone write after {lags:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_new_leader_takes_writes_and_restarted_member_catches_up() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let mut w = c.kv(other(&[leader])).await;
    for i in 0..20 {
        put(&mut w, &format!("before/{i}"), "v").await.unwrap();
    }

    c.kill(leader);
    let new_leader = c.wait_for_leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    let mut w = c.kv(new_leader).await;
    for i in 0..20 {
        put(&mut w, &format!("after/{i}"), "v").await.unwrap();
    }

    c.spawn(leader);
    c.wait_for_leader(Duration::from_secs(20)).await;
    let mut r = c.kv(leader).await;
    // Linearizable reads on the restarted member see writes from before and after its death.
    for i in 0..20 {
        assert_eq!(
            get(&mut r, &format!("before/{i}"))
                .await
                .unwrap()
                .as_deref(),
            Some("v")
        );
        assert_eq!(
            get(&mut r, &format!("after/{i}")).await.unwrap().as_deref(),
            Some("v")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_configured_by_etcd_environment_variables() {
    let c = Cluster::start_with(3, true).await;
    let mut kv = c.kv(0).await;
    put(&mut kv, "env", "ok").await.unwrap();
    let mut kv2 = c.kv(2).await;
    assert_eq!(get(&mut kv2, "env").await.unwrap().as_deref(), Some("ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_of_leader_hands_leadership_over() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let old_id = c.status(leader).await.leader;
    let t0 = std::time::Instant::now();
    let st = c.stop(leader);
    assert!(st.success(), "graceful stop exits 0: {st:?}");
    // Leadership moved before the leader exited: a survivor names a new leader right away,
    // without waiting for an election timeout.
    let survivor = other(&[leader]);
    let st = c.status(survivor).await;
    assert_ne!(
        st.leader, 0,
        "survivor has a leader immediately after the old leader stopped"
    );
    assert_ne!(st.leader, old_id);
    assert!(t0.elapsed() < Duration::from_secs(10));
    let log = c.log_of(leader);
    assert!(log.contains("transferring leadership"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_of_whole_cluster_keeps_data() {
    let mut c = Cluster::start(3).await;
    let mut kv = c.kv(0).await;
    for i in 0..50 {
        put(&mut kv, &format!("k{i}"), &format!("v{i}"))
            .await
            .unwrap();
    }
    c.kill_all_and_restart();
    c.wait_for_leader(Duration::from_secs(20)).await;
    let mut kv = c.kv(1).await;
    for i in 0..50 {
        assert_eq!(
            get(&mut kv, &format!("k{i}")).await.unwrap(),
            Some(format!("v{i}"))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_leader_requests_fail_fast_without_quorum() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let survivor = other(&[leader]);
    for i in 0..3 {
        if i != survivor {
            c.kill(i);
        }
    }
    // Without quorum a plain write fails within the request timeout, never hangs.
    let mut kv = c.kv(survivor).await;
    let t0 = std::time::Instant::now();
    let e = put(&mut kv, "x", "y").await.unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_secs(12),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        e.message() == "etcdserver: request timed out" || e.message() == "etcdserver: no leader",
        "{e:?}"
    );
    // Once the survivor has noticed it has no leader, hasleader=true fails at once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut req = tonic::Request::new(RangeRequest {
        key: "x".into(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("hasleader", "true".parse().unwrap());
    let t0 = std::time::Instant::now();
    let e = kv.range(req).await.unwrap_err();
    assert_eq!(e.message(), "etcdserver: no leader");
    assert!(t0.elapsed() < Duration::from_secs(1));
    // Serializable reads are still answered locally.
    let r = kv
        .range(RangeRequest {
            key: "x".into(),
            serializable: true,
            ..Default::default()
        })
        .await;
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_member_catches_up_by_snapshot_after_log_purge() {
    // A tiny snapshot count makes the leader purge its log while one member is down, so the
    // member can only catch up by installing a snapshot.
    let mut c = Cluster::start_opts(
        3,
        false,
        &[
            "--snapshot-count=50",
            "--experimental-snapshot-catchup-entries=20",
        ],
    )
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let down = other(&[leader]);
    c.kill(down);
    let mut writers = Vec::new();
    for t in 0..4 {
        let mut w = c.kv(leader).await;
        writers.push(tokio::spawn(async move {
            for i in (t..300).step_by(4) {
                put(&mut w, &format!("s{i:04}"), &format!("v{i}"))
                    .await
                    .unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    c.spawn(down);
    let mut r = c.kv(down).await;
    for i in [0, 1, 150, 299] {
        assert_eq!(
            get(&mut r, &format!("s{i:04}")).await.unwrap(),
            Some(format!("v{i}")),
            "key s{i:04}"
        );
    }
    assert!(
        c.log_of(down).contains("installed snapshot"),
        "the restarted member did not install a snapshot"
    );
    // Once loaded, the received file is gone: no member keeps a copy of its store.
    let files: Vec<_> = std::fs::read_dir(c.members[down].data_dir.join("member/sm/snap"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(files.is_empty(), "{files:?}");
}

/// The foundation's acceptance check: concurrent clients write unique keys through every
/// member while the leader is killed and restarted; every acknowledged write is readable on the
/// restarted member and on another member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_writes_survive_leader_kill_under_concurrent_load() {
    use std::sync::{Arc, Mutex};
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in 0..24 {
        let url = c.members[client % 3].client_url();
        let acked = acked.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut kv =
                kvd::proto::etcdserverpb::kv_client::KvClient::new(common::channel(&url).await);
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("c{client}/{n}");
                n += 1;
                let fut = put(&mut kv, &key, "v");
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(6), fut).await {
                    acked.lock().unwrap().push(key);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.kill(leader);
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.spawn(leader);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 100,
        "load made progress: {} acked",
        acked.len()
    );
    c.wait_for_leader(Duration::from_secs(20)).await;
    for m in [leader, other(&[leader])] {
        let mut kv = c.kv(m).await;
        let resp = kv
            .range(RangeRequest {
                key: b"c".to_vec(),
                range_end: b"d".to_vec(),
                keys_only: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let have: std::collections::HashSet<Vec<u8>> =
            resp.kvs.into_iter().map(|kv| kv.key).collect();
        let missing: Vec<&String> = acked
            .iter()
            .filter(|k| !have.contains(k.as_bytes()))
            .collect();
        assert!(
            missing.is_empty(),
            "member {m} lost {} acked writes, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_loss_fails_writes_then_recovers_with_nothing_lost() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let mut kv = c.kv(leader).await;
    for i in 0..20 {
        put(&mut kv, &format!("q{i}"), "before").await.unwrap();
    }
    let survivor = other(&[leader]);
    let dead = other(&[leader, survivor]);
    c.kill(leader);
    c.kill(dead);

    // No quorum: a write and a linearizable read fail within the request timeout with etcd's
    // errors; a serializable read is still answered from local state.
    let mut kv = c.kv(survivor).await;
    let t0 = std::time::Instant::now();
    let e = put(&mut kv, "q-lost", "x").await.unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(12));
    assert!(e.message().starts_with("etcdserver: "), "{e:?}");
    let e = get(&mut kv, "q0").await.unwrap_err();
    assert!(e.message().starts_with("etcdserver: "), "{e:?}");
    let r = kv
        .range(RangeRequest {
            key: b"q0".to_vec(),
            serializable: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.kvs[0].value, b"before");

    // One member back: quorum again, writes resume and nothing acknowledged was lost.
    c.spawn(dead);
    c.wait_for_leader(Duration::from_secs(30)).await;
    put(&mut kv, "q-after", "ok").await.unwrap();
    for i in 0..20 {
        assert_eq!(
            get(&mut kv, &format!("q{i}")).await.unwrap().as_deref(),
            Some("before")
        );
    }
    assert_eq!(
        get(&mut kv, "q-after").await.unwrap().as_deref(),
        Some("ok")
    );
}

/// A leader killed and restarted at once must not resume leadership in its old term: its
/// WAL may lack entries it had already replicated (it sends before its own fsync), and
/// writing new entries at those (term, index) slots makes members diverge
/// (docs/decisions/0005-no-leader-restore.md). Whoever leads afterwards leads in a newer term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_leader_does_not_resume_its_old_term() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let term = |st: kvd::proto::etcdserverpb::StatusResponse| st.raft_term;
    let old_term = term(c.status(leader).await);
    c.kill(leader);
    c.spawn(leader);
    let now_leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let new_term = term(c.status(now_leader).await);
    assert!(
        new_term > old_term,
        "leader m{now_leader} leads in term {new_term}, the killed leader's term was {old_term}"
    );
    // And the cluster works: a write through the restarted member is readable everywhere.
    let mut w = c.kv(leader).await;
    put(&mut w, "after-restart", "v").await.unwrap();
    for i in 0..3 {
        let mut r = c.kv(i).await;
        assert_eq!(
            get(&mut r, "after-restart").await.unwrap().as_deref(),
            Some("v")
        );
    }
}

/// Requests above --max-request-bytes get etcd's errors at both limits (the handler's check,
/// and the transport's at max-request-bytes + 512 KiB), and neither writes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_get_etcds_errors_and_write_nothing() {
    use kvd::proto::etcdserverpb::PutRequest;
    let c = Cluster::start(1).await;
    c.wait_for_leader(Duration::from_secs(10)).await;
    // etcd's clients cap what they send; this one sends anything, as a misbehaving one would.
    let mut kv = c.kv(0).await.max_encoding_message_size(usize::MAX);
    let big_put = |n: usize| PutRequest {
        key: "big".into(),
        value: vec![b'v'; n],
        ..Default::default()
    };
    // Above the default 1.5 MiB --max-request-bytes, below the 2 MiB transport limit.
    let e = kv.put(big_put(1_700_000)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(e.message(), "etcdserver: request is too large");
    // Above the transport limit: grpc-go's status, as etcd's clients expect it.
    let e = kv.put(big_put(3_000_000)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(
        e.message(),
        "grpc: received message larger than max (3000010 vs. 2097152)"
    );
    // Nothing was written and the member still serves.
    assert_eq!(get(&mut kv, "big").await.unwrap(), None);
    put(&mut kv, "small", "ok").await.unwrap();
    assert_eq!(get(&mut kv, "small").await.unwrap().as_deref(), Some("ok"));
}

/// A range's header revision is the revision its data was read at. Writers create a new key
/// per revision, so a listing at revision R holds exactly R - R0 keys; a header taken after
/// the read (an apply in between) claims a revision whose keys the listing lacks
/// (docs/testing.md, "Whole-node power loss").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_header_revision_is_the_revision_read_at() {
    let c = Cluster::start(1).await;
    c.wait_for_leader(Duration::from_secs(10)).await;
    let mut r = c.kv(0).await;
    let list = |serializable| RangeRequest {
        key: "hdr/".into(),
        range_end: "hdr0".into(),
        serializable,
        ..Default::default()
    };
    let r0 = r.range(list(false)).await.unwrap().into_inner();
    let base = r0.header.unwrap().revision;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (mut kv, stop) = (c.kv(0).await, stop.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                put(&mut kv, &format!("hdr/{w}/{n:06}"), "v").await.unwrap();
                n += 1;
            }
        }));
    }
    let mut checked = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < deadline {
        let resp = r.range(list(checked % 2 == 1)).await.unwrap().into_inner();
        let rev = resp.header.unwrap().revision;
        let newest = resp
            .kvs
            .iter()
            .map(|kv| kv.mod_revision)
            .max()
            .unwrap_or(base);
        assert_eq!(
            resp.kvs.len() as i64,
            rev - base,
            "listing at header revision {rev} (newest key at {newest}) after {checked} reads"
        );
        checked += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    assert!(checked > 20, "only {checked} reads in 4 s");
}

/// The keys under `c/` at `revision` (0: latest), read from that member's own store.
async fn listing_at(
    kv: &mut kvd::proto::etcdserverpb::kv_client::KvClient<tonic::transport::Channel>,
    revision: i64,
) -> Result<Vec<(String, String, i64)>, tonic::Status> {
    let r = kv
        .range(RangeRequest {
            key: "c/".into(),
            range_end: "c0".into(),
            revision,
            serializable: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.kvs
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                String::from_utf8_lossy(&kv.value).into_owned(),
                kv.mod_revision,
            )
        })
        .collect())
}

/// A compaction deletes the old history in the background after it is acknowledged. Killing
/// every member right after it (kill -9, so the deletion, or even the commit that records the
/// compaction in sled, is cut short) must leave each member, once restarted, serving the same
/// answers at every revision from the compacted one on, and refusing older revisions as
/// compacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_cut_short_by_killing_every_member_keeps_the_history_above_it() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    // 2,000 puts over 100 keys: about 1,900 revisions become garbage at the compaction.
    let mut tasks = Vec::new();
    for t in 0..8 {
        let mut kv = c.kv(leader).await;
        tasks.push(tokio::spawn(async move {
            for i in 0..250 {
                let n = t * 250 + i;
                put(&mut kv, &format!("c/{:03}", n % 100), &format!("v{n}"))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut kv = c.kv(leader).await;
    let compact_at = put(&mut kv, "c/marker", "at").await.unwrap();
    let mut later = 0;
    for n in 0..50 {
        later = put(&mut kv, &format!("c/{:03}", n * 2), &format!("w{n}"))
            .await
            .unwrap();
    }
    let revs = [compact_at, compact_at + 25, later];
    let mut expected = Vec::new();
    for &r in &revs {
        expected.push(listing_at(&mut kv, r).await.unwrap());
    }
    assert_eq!(expected[0].len(), 101);

    kv.compact(kvd::proto::etcdserverpb::CompactionRequest {
        revision: compact_at,
        physical: false,
    })
    .await
    .unwrap();
    c.kill_all_and_restart();
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    // Logged after the compaction: a member that has applied it has applied the compaction.
    let mut kv = c.kv(leader).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let fin = loop {
        match put(&mut kv, "c/after", "x").await {
            Ok(r) => break r,
            Err(e) if std::time::Instant::now() > deadline => panic!("put after restart: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };

    for i in 0..3 {
        let mut kv = c.kv(i).await;
        // A restarted member re-applies its log after it answers; wait until it has caught up.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !listing_at(&mut kv, 0)
            .await
            .is_ok_and(|l| l.iter().any(|(k, _, r)| k == "c/after" && *r == fin))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "member {i} did not catch up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (r, want) in revs.iter().zip(&expected) {
            assert_eq!(
                &listing_at(&mut kv, *r).await.unwrap(),
                want,
                "member {i} at revision {r}"
            );
        }
        let e = listing_at(&mut kv, compact_at - 1).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "member {i}: {e:?}");
        assert_eq!(
            e.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
    }
}
