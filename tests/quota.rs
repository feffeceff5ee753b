//! The backend quota and alarms (etcd's NOSPACE and CORRUPT semantics), on real processes:
//! filling a member past `--quota-backend-bytes` raises NOSPACE and refuses writes with etcd's
//! error; reads, deletes and compaction still work; the alarm survives a restart and is listed
//! by etcdctl and kvctl as etcd lists it; disarming clears it. Alarms raised through the API
//! refuse writes at apply time on every member.

mod common;

use std::process::Command;
use std::time::Duration;

use common::Cluster;
use kvd::proto::etcdserverpb::alarm_request::AlarmAction;
use kvd::proto::etcdserverpb::lease_client::LeaseClient;
use kvd::proto::etcdserverpb::request_op::Request as Op;
use kvd::proto::etcdserverpb::{
    AlarmRequest, AlarmType, CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest,
};
use kvd::proto::v3electionpb::election_client::ElectionClient;
use kvd::proto::v3electionpb::{CampaignRequest, ProclaimRequest};
use kvd::proto::v3lockpb::lock_client::LockClient;
use kvd::proto::v3lockpb::LockRequest;
use tonic::Code;

const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";
const CORRUPT: &str = "etcdserver: corrupt cluster";
/// An empty member's database is about 9 KB; 128 KiB values reach this in a few puts.
const QUOTA: &str = "--quota-backend-bytes=1048576";

fn put_req(k: &str, len: usize) -> PutRequest {
    PutRequest {
        key: k.as_bytes().to_vec(),
        value: vec![b'v'; len],
        ..Default::default()
    }
}

async fn set_alarm(c: &Cluster, i: usize, action: AlarmAction, kind: AlarmType, member: u64) {
    c.maintenance(i)
        .await
        .alarm(AlarmRequest {
            action: action as i32,
            member_id: member,
            alarm: kind as i32,
        })
        .await
        .unwrap();
}

/// Puts 128 KiB values through member `i` until one is refused; returns the refusal.
async fn fill(c: &Cluster, i: usize) -> tonic::Status {
    let mut kv = c.kv(i).await;
    for n in 0..400 {
        match kv.put(put_req(&format!("fill/{n:04}"), 128 * 1024)).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(s) => return s,
        }
    }
    panic!("a 1 MiB quota never refused a put after 50 MiB");
}

fn ctl(bin: &str, ep: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={ep}"))
        .args(args)
        .output()
        .expect("run ctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn have_etcdctl() -> bool {
    Command::new("etcdctl").arg("version").output().is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_member_fills_its_quota_and_recovers_by_disarm() {
    let mut c = Cluster::start_opts(1, false, &[QUOTA]).await;
    let id = c.status(0).await.header.unwrap().member_id;
    let refused = fill(&c, 0).await;
    assert_eq!(
        (refused.code(), refused.message()),
        (Code::ResourceExhausted, NO_SPACE)
    );
    assert_eq!(c.alarms(0).await, vec![(id, AlarmType::Nospace as i32)]);
    let status = c.status(0).await;
    assert_eq!(status.errors, vec![format!("memberID:{id} alarm:NOSPACE ")]);
    // etcd 3.6's field; 3.4 and 3.5 leave it empty (the gateway diff compares it).
    assert_eq!(status.db_size_quota, 0);

    // Writes that add data are refused; reads, deletes, compaction and read-only txns work.
    let mut kv = c.kv(0).await;
    let small = kv.put(put_req("small", 1)).await.unwrap_err();
    assert_eq!(
        (small.code(), small.message()),
        (Code::ResourceExhausted, NO_SPACE)
    );
    let txn_put = TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestPut(put_req("t", 1))),
        }],
        ..Default::default()
    };
    assert_eq!(
        kv.txn(txn_put).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    let txn_read = TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestRange(RangeRequest {
                key: b"fill/0000".to_vec(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    kv.txn(txn_read).await.unwrap();
    let mut lease = LeaseClient::new(common::channel(&c.members[0].client_url()).await);
    let g = lease
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await
        .unwrap_err();
    assert_eq!((g.code(), g.message()), (Code::ResourceExhausted, NO_SPACE));
    let got = kv
        .range(RangeRequest {
            key: b"fill/".to_vec(),
            range_end: b"fill0".to_vec(),
            count_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.count > 3, "{got:?}");
    let del = kv
        .delete_range(DeleteRangeRequest {
            key: b"fill/".to_vec(),
            range_end: b"fill0".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(del.deleted, got.count);
    let rev = del.header.unwrap().revision;
    kv.compact(CompactionRequest {
        revision: rev,
        physical: false,
    })
    .await
    .unwrap();

    // The alarm is replicated state: it survives a restart.
    c.stop(0);
    c.spawn(0);
    c.wait_for_leader(Duration::from_secs(20)).await;
    assert_eq!(c.alarms(0).await, vec![(id, AlarmType::Nospace as i32)]);

    // etcdctl and kvctl list it as etcd does, and disarm it.
    let ep = c.members[0].client_url();
    let line = format!("memberID:{id} alarm:NOSPACE \n");
    let kvctl = env!("CARGO_BIN_EXE_kvctl");
    assert_eq!(ctl(kvctl, &ep, &["alarm", "list"]).1, line);
    if have_etcdctl() {
        assert_eq!(ctl("etcdctl", &ep, &["alarm", "list"]).1, line);
        let (ok, _, err) = ctl("etcdctl", &ep, &["put", "k", "v"]);
        assert!(
            !ok && err.ends_with(&format!("Error: {NO_SPACE}\n")),
            "{err}"
        );
    }
    let (ok, out, _) = ctl(kvctl, &ep, &["alarm", "disarm"]);
    assert!(ok);
    assert_eq!(out, line);
    assert!(c.alarms(0).await.is_empty());
    assert!(c.status(0).await.errors.is_empty());
    // Data was deleted and compacted, but the database has not shrunk (that takes a
    // defragmentation): a write bigger than the quota is refused again, and raises the alarm again.
    let again = kv.put(put_req("big", 1100 * 1024)).await.unwrap_err();
    assert_eq!(again.code(), Code::ResourceExhausted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_refuse_writes_while_nospace_is_active() {
    let c = Cluster::start_opts(3, false, &[QUOTA]).await;
    let refused = fill(&c, 0).await;
    assert_eq!(refused.message(), NO_SPACE);
    let id0 = c.status(0).await.header.unwrap().member_id;
    for i in 0..3 {
        assert_eq!(c.alarms(i).await, vec![(id0, AlarmType::Nospace as i32)]);
        let mut kv = c.kv(i).await;
        let e = kv.put(put_req("x", 1)).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::ResourceExhausted, NO_SPACE),
            "member {i}"
        );
        kv.delete_range(DeleteRangeRequest {
            key: b"fill/0000".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    set_alarm(&c, 2, AlarmAction::Deactivate, AlarmType::Nospace, id0).await;
    for i in 0..3 {
        assert!(c.alarms(i).await.is_empty());
    }
}

/// Lock and Election write through the same quota as the KV and Lease services (etcd's run
/// through its own client, so through its quota layer): with the database over the quota,
/// their writes are refused with etcd's text (code `Unknown`, as the recipe services answer
/// their client's errors) and raise NOSPACE, even while no alarm is active; a recipe that
/// only deletes still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_writes_respect_the_quota() {
    let mut c = Cluster::start(1).await;
    let id = c.status(0).await.header.unwrap().member_id;
    let lease = LeaseClient::new(common::channel(&c.members[0].client_url()).await);
    let grant = || {
        let mut lease = lease.clone();
        async move {
            lease
                .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
                .await
                .unwrap()
                .into_inner()
                .id
        }
    };
    let (l1, l2, l3) = (grant().await, grant().await, grant().await);
    let ch = common::channel(&c.members[0].client_url()).await;
    let held = LockClient::new(ch.clone())
        .lock(LockRequest {
            name: b"held".to_vec(),
            lease: l1,
        })
        .await
        .unwrap()
        .into_inner()
        .key;
    let leader = ElectionClient::new(ch)
        .campaign(CampaignRequest {
            name: b"el".to_vec(),
            lease: l2,
            value: b"a".to_vec(),
        })
        .await
        .unwrap()
        .into_inner()
        .leader
        .unwrap();

    // Restarted with a quota below what an empty database takes: over the quota, and no
    // alarm active, so only the check before proposing can refuse a write.
    c.stop(0);
    c.members[0]
        .extra_args
        .push("--quota-backend-bytes=4096".into());
    c.spawn(0);
    c.wait_for_leader(Duration::from_secs(20)).await;
    assert!(c.alarms(0).await.is_empty());
    let ch = common::channel(&c.members[0].client_url()).await;
    let mut locks = LockClient::new(ch.clone());
    let mut elections = ElectionClient::new(ch);

    let refused = |r: Result<(), tonic::Status>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!((e.code(), e.message()), (Code::Unknown, NO_SPACE), "{what}");
    };
    let disarm = || set_alarm(&c, 0, AlarmAction::Deactivate, AlarmType::Nospace, id);
    let r = locks
        .lock(LockRequest {
            name: b"l".to_vec(),
            lease: l3,
        })
        .await;
    refused(r.map(drop), "a lock on a granted lease");
    assert_eq!(c.alarms(0).await, vec![(id, AlarmType::Nospace as i32)]);
    disarm().await;
    let r = locks
        .lock(LockRequest {
            name: b"l".to_vec(),
            lease: 0,
        })
        .await;
    refused(r.map(drop), "a lock with a session of its own");
    disarm().await;
    let r = elections
        .campaign(CampaignRequest {
            name: b"el2".to_vec(),
            lease: l3,
            value: b"b".to_vec(),
        })
        .await;
    refused(r.map(drop), "a campaign");
    disarm().await;
    let r = elections
        .proclaim(ProclaimRequest {
            leader: Some(leader),
            value: b"b".to_vec(),
        })
        .await;
    refused(r.map(drop), "a proclamation");
    assert_eq!(c.alarms(0).await, vec![(id, AlarmType::Nospace as i32)]);

    // Unlocking deletes: it works over the quota and with the alarm active.
    locks
        .unlock(kvd::proto::v3lockpb::UnlockRequest { key: held })
        .await
        .unwrap();
}

/// An alarm raised through the API (no quota involved) refuses writes at apply time on every
/// member, as etcd's capped and corrupt appliers do; clearing it lets them through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_refuse_writes_on_every_member_until_cleared() {
    let c = Cluster::start(3).await;
    set_alarm(&c, 1, AlarmAction::Activate, AlarmType::Nospace, 42).await;
    for i in 0..3 {
        let e = c.kv(i).await.put(put_req("k", 1)).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::ResourceExhausted, NO_SPACE));
    }
    set_alarm(&c, 0, AlarmAction::Activate, AlarmType::Corrupt, 0).await;
    let mut kv = c.kv(2).await;
    let e = kv.put(put_req("k", 1)).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::DataLoss, CORRUPT));
    let e = kv
        .delete_range(DeleteRangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::DataLoss, CORRUPT));
    let e = kv
        .compact(CompactionRequest {
            revision: 1,
            physical: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DataLoss);
    // Reads are served.
    kv.range(RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        c.status(1).await.errors,
        vec![
            "memberID:42 alarm:NOSPACE ".to_string(),
            "alarm:CORRUPT ".to_string()
        ]
    );
    // etcd 3.4 answers an unknown action by crashing; kvd refuses it before proposing.
    let e = c
        .maintenance(0)
        .await
        .alarm(AlarmRequest {
            action: 7,
            member_id: 1,
            alarm: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    set_alarm(&c, 1, AlarmAction::Deactivate, AlarmType::Corrupt, 0).await;
    set_alarm(&c, 2, AlarmAction::Deactivate, AlarmType::Nospace, 42).await;
    for i in 0..3 {
        c.kv(i).await.put(put_req("k", 1)).await.unwrap();
    }
}
