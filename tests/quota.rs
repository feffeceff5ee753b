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
