//! Corruption checks on a real 3-member cluster: one member's state machine is damaged while
//! it is stopped (one stored value altered in its sled database). Restarted with
//! `--experimental-initial-corrupt-check` it refuses to start with etcd's message; restarted
//! without it, the leader's periodic check (`--experimental-corrupt-check-time`) raises a
//! CORRUPT alarm naming it, which `alarm list` shows and which refuses writes.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::Cluster;
use kvd::mvcc::engine::{Tree, WriteBatch};
use kvd::mvcc::{Engine, StoreEngine};
use kvd::proto::etcdserverpb::{AlarmType, HashKvRequest, PutRequest};
use kvd::proto::mvccpb::KeyValue;
use prost::Message;
use tonic::Code;

const CHECK_EVERY: &str = "--experimental-corrupt-check-time=1s";

/// Member `i`'s HashKV at `rev`; `None` while it has not applied `rev` yet.
async fn hash_kv(c: &Cluster, i: usize, rev: i64) -> Option<(u32, i64)> {
    let r = c
        .maintenance(i)
        .await
        .hash_kv(HashKvRequest { revision: rev })
        .await
        .ok()?
        .into_inner();
    Some((r.hash, r.compact_revision))
}

async fn corrupt_alarms(c: &Cluster, i: usize) -> Vec<u64> {
    c.alarms(i)
        .await
        .into_iter()
        .filter(|(_, a)| *a == AlarmType::Corrupt as i32)
        .map(|(m, _)| m)
        .collect()
}

/// Alters the value of the oldest put in the history of the (closed) database at `db`.
fn damage(db: &std::path::Path) {
    let engine = StoreEngine::open(db).unwrap();
    let (k, v) = engine
        .iter(Tree::Rev)
        .map(|r| r.unwrap())
        .find(|(_, v)| v[0] == 0)
        .expect("a put in the history");
    // kvd's history value: a tombstone flag byte, then the prost `KeyValue`.
    let mut kv = KeyValue::decode(&v[1..]).unwrap();
    kv.value = b"damaged".to_vec();
    let mut bytes = vec![0u8];
    bytes.extend(kv.encode_to_vec());
    let mut batch = WriteBatch::default();
    batch.put(Tree::Rev, k.to_vec(), bytes);
    engine.write(batch).unwrap();
    engine.flush().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_member_is_refused_at_start_and_alarmed_by_the_periodic_check() {
    let mut c = Cluster::start_opts(3, false, &[CHECK_EVERY]).await;
    let mut kv = c.kv(0).await;
    for n in 0..50 {
        kv.put(PutRequest {
            key: format!("k{:02}", n % 20).into_bytes(),
            value: format!("v{n}").into_bytes(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    // A follower to damage.
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let bad = (leader + 1) % 3;
    let bad_id = c.status(bad).await.header.unwrap().member_id;
    // Every member agrees on HashKV, and two check periods raise nothing.
    let rev = c.status(0).await.header.unwrap().revision;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h: Vec<_> = futures_all(&c, rev).await;
        if h[0].is_some() && h.iter().all(|x| *x == h[0]) {
            break;
        }
        assert!(Instant::now() < deadline, "members never agreed: {h:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(corrupt_alarms(&c, 0).await.is_empty());

    c.stop(bad);
    damage(&c.members[bad].data_dir.join("member/sm/db"));

    // With the initial check: refuses to start, with etcd's message.
    c.members[bad]
        .extra_args
        .push("--experimental-initial-corrupt-check".into());
    c.spawn(bad);
    let st = c
        .wait_exit(bad, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("started despite the damage\n{}", c.log_of(bad)));
    assert!(!st.success());
    let want = format!("{bad_id:x} found data inconsistency with peers");
    assert!(c.log_of(bad).contains(&want), "{}", c.log_of(bad));

    // Without it: starts, and the leader's periodic check names it.
    c.members[bad].extra_args.pop();
    c.spawn(bad);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = corrupt_alarms(&c, leader).await;
        if !found.is_empty() {
            assert_eq!(found, vec![bad_id]);
            break;
        }
        assert!(Instant::now() < deadline, "no CORRUPT alarm");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Listed as etcd lists it; writes refused with etcd's error.
    let line = format!("memberID:{bad_id} alarm:CORRUPT \n");
    let out = Command::new(env!("CARGO_BIN_EXE_kvctl"))
        .arg(format!("--endpoints={}", c.members[leader].client_url()))
        .args(["alarm", "list"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), line);
    if let Ok(out) = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", c.members[leader].client_url()))
        .args(["alarm", "list"])
        .output()
    {
        assert_eq!(String::from_utf8_lossy(&out.stdout), line);
    }
    let e = kv
        .put(PutRequest {
            key: b"after".to_vec(),
            value: b"x".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::DataLoss, "etcdserver: corrupt cluster")
    );
    // The finding is logged once, however many check periods pass.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let log = c.log_of(leader);
    assert_eq!(
        log.matches(&format!("raising the CORRUPT alarm for member {bad_id:x}"))
            .count(),
        1,
        "{log}"
    );
}

async fn futures_all(c: &Cluster, rev: i64) -> Vec<Option<(u32, i64)>> {
    let mut out = Vec::new();
    for i in 0..3 {
        out.push(hash_kv(c, i, rev).await);
    }
    out
}
