//! Leases against three real `kvd` processes: grant/put/revoke, keep-alive through a follower,
//! expiry by the leader, errors for unknown leases, and expiry across a leader kill.

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use kvd::proto::etcdserverpb::lease_client::LeaseClient;
use kvd::proto::etcdserverpb::watch_client::WatchClient;
use kvd::proto::etcdserverpb::watch_request::RequestUnion;
use kvd::proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseLeasesRequest,
    LeaseRevokeRequest, LeaseTimeToLiveRequest, PutRequest, WatchCreateRequest, WatchRequest,
};
use kvd::proto::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

async fn lease(c: &Cluster, i: usize) -> LeaseClient<Channel> {
    LeaseClient::new(common::channel(&c.members[i].client_url()).await)
}

async fn grant(c: &mut LeaseClient<Channel>, id: i64, ttl: i64) -> i64 {
    let r = c
        .lease_grant(LeaseGrantRequest { id, ttl })
        .await
        .unwrap()
        .into_inner();
    r.id
}

async fn put_lease(c: &Cluster, i: usize, k: &str, lease: i64) -> Result<i64, tonic::Status> {
    let r = c
        .kv(i)
        .await
        .put(PutRequest {
            key: k.into(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().header.unwrap().revision)
}

/// A keep-alive stream: send an id, read its answer.
struct KeepAlive {
    tx: mpsc::Sender<LeaseKeepAliveRequest>,
    rx: Streaming<LeaseKeepAliveResponse>,
}

impl KeepAlive {
    async fn open(c: &mut LeaseClient<Channel>, first: i64) -> (KeepAlive, i64) {
        let (tx, rx) = mpsc::channel(4);
        tx.send(LeaseKeepAliveRequest { id: first }).await.unwrap();
        let mut rx = c
            .lease_keep_alive(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let ttl = rx.message().await.unwrap().unwrap().ttl;
        (KeepAlive { tx, rx }, ttl)
    }

    async fn once(&mut self, id: i64) -> i64 {
        self.tx.send(LeaseKeepAliveRequest { id }).await.unwrap();
        let r = self.rx.message().await.unwrap().unwrap();
        assert_eq!(r.id, id);
        r.ttl
    }
}

async fn exists(c: &Cluster, i: usize, k: &str) -> bool {
    common::get(&mut c.kv(i).await, k).await.unwrap().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lifecycle() {
    let c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = (0..3).find(|&i| i != l).unwrap();
    let mut lf = lease(&c, f).await;

    // Unknown leases, as etcd answers them.
    let e = lf
        .lease_revoke(LeaseRevokeRequest { id: 0x1234 })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );
    let ttl = lf
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: 0x1234,
            keys: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((ttl.id, ttl.ttl, ttl.granted_ttl), (0x1234, -1, 0));
    let (mut ka, t) = KeepAlive::open(&mut lf, 0x1234).await;
    assert_eq!(t, 0);
    let e = put_lease(&c, f, "nolease", 0x1234).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );

    // Server-chosen id, TTL raised to the minimum (1.5 election timeouts = 2s); duplicates.
    let r = lf
        .lease_grant(LeaseGrantRequest { id: 0, ttl: 1 })
        .await
        .unwrap()
        .into_inner();
    assert!(r.id > 0);
    assert_eq!(r.ttl, 2);
    let e = lf
        .lease_grant(LeaseGrantRequest { id: r.id, ttl: 10 })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::FailedPrecondition, "etcdserver: lease already exists")
    );

    // Attach two keys through a follower; time-to-live with keys; list.
    let a = grant(&mut lf, 0xa, 30).await;
    put_lease(&c, f, "la/1", a).await.unwrap();
    put_lease(&c, l, "la/2", a).await.unwrap();
    let ttl = lf
        .lease_time_to_live(LeaseTimeToLiveRequest { id: a, keys: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ttl.granted_ttl, 30);
    assert!((27..=30).contains(&ttl.ttl), "{ttl:?}");
    assert_eq!(ttl.keys, vec![b"la/1".to_vec(), b"la/2".to_vec()]);
    let ids: Vec<i64> = lf
        .lease_leases(LeaseLeasesRequest {})
        .await
        .unwrap()
        .into_inner()
        .leases
        .iter()
        .map(|s| s.id)
        .collect();
    assert!(ids.contains(&a) && ids.contains(&r.id), "{ids:?}");

    // Revoke deletes both keys in one revision.
    let mut kv = c.kv(l).await;
    let range = kv.range(kvd::proto::etcdserverpb::RangeRequest {
        key: b"la/1".to_vec(),
        ..Default::default()
    });
    let before = range.await.unwrap().into_inner().header.unwrap().revision;
    let rev = lf
        .lease_revoke(LeaseRevokeRequest { id: a })
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    assert_eq!(rev, before + 1);
    assert!(!exists(&c, f, "la/1").await && !exists(&c, f, "la/2").await);
    let mut w = WatchClient::new(common::channel(&c.members[f].client_url()).await);
    let (wtx, wrx) = mpsc::channel(1);
    wtx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"la/".to_vec(),
            range_end: b"la0".to_vec(),
            start_revision: rev,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut ws = w
        .watch(ReceiverStream::new(wrx))
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while events.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(5), ws.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        events.extend(m.events);
    }
    assert!(events.iter().all(
        |e| e.r#type == EventType::Delete as i32 && e.kv.as_ref().unwrap().mod_revision == rev
    ));

    // Keep-alives through a follower carry a 2s lease well past its TTL; then it expires.
    let b = grant(&mut lf, 0xb, 2).await;
    put_lease(&c, f, "lb", b).await.unwrap();
    let start = Instant::now();
    // When the last keep-alive was sent: the leader received it later, so the lease cannot
    // expire less than its TTL after this instant.
    let mut last_sent = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        last_sent = Instant::now();
        assert_eq!(ka.once(b).await, 2);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(exists(&c, f, "lb").await, "expired despite keep-alives");
    while exists(&c, f, "lb").await {
        assert!(
            last_sent.elapsed() < Duration::from_secs(10),
            "lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // 2 s TTL; 100 ms slack for the lessor's timer granularity.
    assert!(
        last_sent.elapsed() >= Duration::from_millis(1900),
        "expired {:?} after the last keep-alive was sent",
        last_sent.elapsed()
    );
    assert_eq!(ka.once(b).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expires_after_leader_kill_not_before_its_ttl() {
    let mut c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = (0..3).find(|&i| i != l).unwrap();
    let mut ll = lease(&c, l).await;
    let id = grant(&mut ll, 0, 5).await;
    put_lease(&c, l, "lk", id).await.unwrap();
    common::get(&mut c.kv(f).await, "lk")
        .await
        .unwrap()
        .unwrap();
    let killed = Instant::now();
    c.kill(l);
    let nl = c.wait_for_leader(Duration::from_secs(10)).await;
    assert_ne!(nl, l);
    // The new leader restarts the clock with TTL + election timeout: still there at 4.5s.
    let until = killed + Duration::from_millis(4500);
    while Instant::now() < until {
        assert!(
            exists(&c, nl, "lk").await,
            "expired early: {:?}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while exists(&c, nl, "lk").await {
        assert!(killed.elapsed() < Duration::from_secs(20), "never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        killed.elapsed() >= Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
    let ttl = lease(&c, nl)
        .await
        .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ttl.ttl, -1);
}

/// kvctl's lease commands print what etcdctl 3.4 prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvctl_lease_commands() {
    let c = Cluster::start(1).await;
    c.wait_for_leader(Duration::from_secs(10)).await;
    let ep = format!("--endpoints={}", c.members[0].client_url());
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvctl"))
            .arg(&ep)
            .args(args)
            .env_remove("ETCDCTL_ENDPOINTS")
            .env_remove("ETCDCTL_WRITE_OUT")
            .output()
            .expect("run kvctl");
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
            out.status.code().unwrap(),
        )
    };
    let (out, _, code) = run(&["lease", "grant", "100"]);
    assert_eq!(code, 0);
    let id = out.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(out, format!("lease {id} granted with TTL(100s)\n"));
    assert_eq!(run(&["put", &format!("--lease={id}"), "k1", "v"]).0, "OK\n");
    assert_eq!(run(&["put", &format!("--lease={id}"), "k2", "v"]).0, "OK\n");
    let (out, _, _) = run(&["lease", "timetolive", &id, "--keys"]);
    assert!(
        out.starts_with(&format!("lease {id} granted with TTL(100s), remaining(")),
        "{out}"
    );
    assert!(out.ends_with("s), attached keys([k1 k2])\n"), "{out}");
    assert_eq!(run(&["lease", "list"]).0, format!("found 1 leases\n{id}\n"));
    assert_eq!(
        run(&["lease", "keep-alive", "--once", &id]).0,
        format!("lease {id} keepalived with TTL(100)\n")
    );
    assert_eq!(
        run(&["lease", "revoke", &id]).0,
        format!("lease {id} revoked\n")
    );
    assert_eq!(
        run(&["lease", "timetolive", &id]).0,
        format!("lease {id} already expired\n")
    );
    assert_eq!(
        run(&["lease", "keep-alive", &id]).0,
        format!("lease {id} expired or revoked.\n")
    );
    assert_eq!(
        run(&["lease", "keep-alive", "--once", &id]),
        (
            String::new(),
            "Error: etcdserver: requested lease not found\n".to_string(),
            2
        )
    );
    assert_eq!(
        run(&["lease", "revoke", &id]),
        (
            String::new(),
            "Error: failed to revoke lease (etcdserver: requested lease not found)\n".to_string(),
            1
        )
    );
    assert_eq!(run(&["get", "k1"]).0, "");
}
