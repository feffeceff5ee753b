//! The contract kube-apiserver's etcd3 storage relies on, one test per call shape, each against
//! a real three-member cluster: gets at a revision, paginated lists pinned to the first page's
//! revision, optimistic concurrency through transactions, watches from a resource version with
//! bookmarks, compaction coordination, leased keys, Maintenance.Status, and leader kills in the
//! middle of a paginated list and of a watch. Semantics and messages are etcd's.

mod common;

use std::time::{Duration, Instant};

use common::{get, put, Cluster};
use kvd::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use kvd::proto::etcdserverpb::lease_client::LeaseClient;
use kvd::proto::etcdserverpb::request_op::Request as Op;
use kvd::proto::etcdserverpb::response_op::Response as Resp;
use kvd::proto::etcdserverpb::watch_client::WatchClient;
use kvd::proto::etcdserverpb::watch_request::RequestUnion;
use kvd::proto::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest,
    RangeResponse, RequestOp, TxnRequest, TxnResponse, WatchCreateRequest, WatchProgressRequest,
    WatchRequest, WatchResponse,
};
use kvd::proto::mvccpb::{event::EventType, Event, KeyValue};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

// ---- helpers: the request shapes the API server sends ----

fn others(c: &Cluster, than: usize) -> Vec<usize> {
    (0..c.members.len())
        .filter(|i| *i != than && c.members[*i].child.is_some())
        .collect()
}

fn prefix_end(p: &str) -> Vec<u8> {
    let mut e = p.as_bytes().to_vec();
    *e.last_mut().unwrap() += 1;
    e
}

fn s(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn range(c: &Cluster, i: usize, r: RangeRequest) -> Result<RangeResponse, tonic::Status> {
    c.kv(i).await.range(r).await.map(|r| r.into_inner())
}

/// One page of a list: `[key, range_end)` at `revision` (0 = current), at most `limit` keys.
fn page(key: Vec<u8>, prefix: &str, revision: i64, limit: i64) -> RangeRequest {
    RangeRequest {
        key,
        range_end: prefix_end(prefix),
        revision,
        limit,
        ..Default::default()
    }
}

/// The continue key: the last key of the page plus a zero byte.
fn continue_key(r: &RangeResponse) -> Vec<u8> {
    let mut k = r.kvs.last().unwrap().key.clone();
    k.push(0);
    k
}

fn cmp(key: &str, target: CompareTarget, value: TargetUnion) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: key.into(),
        target_union: Some(value),
        range_end: vec![],
    }
}

fn op_put(key: &str, value: &str) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })),
    }
}

fn op_get(key: &str) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestRange(RangeRequest {
            key: key.into(),
            ..Default::default()
        })),
    }
}

/// `Txn If cmp Then then Else Get(key)`: the Else branch returns the current object.
async fn guarded(c: &Cluster, i: usize, key: &str, cmp: Compare, then: RequestOp) -> TxnResponse {
    c.kv(i)
        .await
        .txn(TxnRequest {
            compare: vec![cmp],
            success: vec![then],
            failure: vec![op_get(key)],
        })
        .await
        .unwrap()
        .into_inner()
}

/// The Range response of a failed guarded txn's Else branch.
fn current_object(t: &TxnResponse) -> &RangeResponse {
    assert!(!t.succeeded, "{t:?}");
    match t.responses[0].response.as_ref().unwrap() {
        Resp::ResponseRange(r) => r,
        other => panic!("Else branch answered {other:?}"),
    }
}

fn kv_summary(kvs: &[KeyValue]) -> Vec<(String, String, i64, i64)> {
    kvs.iter()
        .map(|kv| {
            (
                s(&kv.key),
                s(&kv.value),
                kv.create_revision,
                kv.mod_revision,
            )
        })
        .collect()
}

/// One client watch stream.
struct Ws {
    tx: mpsc::Sender<WatchRequest>,
    rx: Streaming<WatchResponse>,
}

impl Ws {
    async fn open(c: &Cluster, i: usize) -> Ws {
        let ch = common::channel(&c.members[i].client_url()).await;
        let (tx, req_rx) = mpsc::channel(16);
        let rx = WatchClient::new(ch)
            .watch(ReceiverStream::new(req_rx))
            .await
            .unwrap()
            .into_inner();
        Ws { tx, rx }
    }

    async fn send(&self, r: RequestUnion) {
        self.tx
            .send(WatchRequest {
                request_union: Some(r),
            })
            .await
            .unwrap();
    }

    async fn create(&mut self, c: WatchCreateRequest) -> i64 {
        self.send(RequestUnion::CreateRequest(c)).await;
        let r = self.next().await;
        assert!(r.created && !r.canceled, "{r:?}");
        r.watch_id
    }

    async fn next(&mut self) -> WatchResponse {
        tokio::time::timeout(Duration::from_secs(15), self.rx.message())
            .await
            .expect("watch response within 15s")
            .expect("stream ok")
            .expect("stream open")
    }

    async fn events(&mut self, n: usize) -> Vec<Event> {
        let mut all = Vec::new();
        while all.len() < n {
            let r = self.next().await;
            assert!(!r.canceled, "unexpected cancel: {r:?}");
            all.extend(r.events);
        }
        all
    }
}

fn watch_prefix(p: &str, start_revision: i64, prev_kv: bool) -> WatchCreateRequest {
    WatchCreateRequest {
        key: p.into(),
        range_end: prefix_end(p),
        start_revision,
        prev_kv,
        ..Default::default()
    }
}

fn rev_of(e: &Event) -> i64 {
    e.kv.as_ref().unwrap().mod_revision
}

/// Retries `f` while the cluster has no leader (after a kill), up to 20 s.
async fn retry<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f().await {
            Ok(t) => return t,
            Err(e) if Instant::now() < deadline => {
                assert!(
                    matches!(e.code(), Code::Unavailable | Code::DeadlineExceeded),
                    "{e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no recovery within 20s: {e:?}"),
        }
    }
}

// ---- the contract ----

/// GET at a resource version; a compacted or future revision fails as in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_at_a_revision() {
    let c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = others(&c, l)[0];
    let mut kv = c.kv(l).await;
    let r1 = put(&mut kv, "/registry/pods/a", "v1").await.unwrap();
    let r2 = put(&mut kv, "/registry/pods/a", "v2").await.unwrap();
    put(&mut kv, "/registry/pods/b", "x").await.unwrap();

    let at = |rev| RangeRequest {
        key: "/registry/pods/a".into(),
        revision: rev,
        ..Default::default()
    };
    let old = range(&c, f, at(r1)).await.unwrap();
    assert_eq!(
        kv_summary(&old.kvs),
        vec![("/registry/pods/a".into(), "v1".into(), r1, r1)]
    );
    assert_eq!(old.kvs[0].version, 1);
    // The header carries the store's current revision, not the requested one.
    assert_eq!(old.header.unwrap().revision, r2 + 1);
    let cur = range(&c, f, at(0)).await.unwrap();
    assert_eq!(
        kv_summary(&cur.kvs),
        vec![("/registry/pods/a".into(), "v2".into(), r1, r2)]
    );

    c.kv(f)
        .await
        .compact(CompactionRequest {
            revision: r2,
            physical: true,
        })
        .await
        .unwrap();
    let e = range(&c, f, at(r1)).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    // The compaction revision itself is still readable.
    assert_eq!(range(&c, l, at(r2)).await.unwrap().kvs[0].value, b"v2");
    let e = range(&c, l, at(r2 + 100)).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );
}

/// LIST in pages: the first page's header revision pins every later page, the continue key is
/// the last key + "\x00" with range_end kept, `count` is the number of keys left in the range
/// at that revision, and writes between pages do not show up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_in_pages_at_the_first_pages_revision() {
    let c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = others(&c, l);
    let mut kv = c.kv(l).await;
    let p = "/registry/pods/";
    for i in 0..25 {
        put(&mut kv, &format!("{p}ns/p{i:02}"), &format!("v{i}"))
            .await
            .unwrap();
    }
    // Neighbours outside the prefix must never appear.
    put(&mut kv, "/registry/pods", "x").await.unwrap();
    put(&mut kv, "/registry/pods0", "x").await.unwrap();
    let before = range(&c, f[0], page(p.into(), p, 0, 0)).await.unwrap();
    assert_eq!(before.kvs.len(), 25);
    assert_eq!(before.count, 25);
    assert!(!before.more);

    let first = range(&c, l, page(p.into(), p, 0, 10)).await.unwrap();
    let rv = first.header.as_ref().unwrap().revision;
    assert_eq!((first.kvs.len(), first.count, first.more), (10, 25, true));

    // Writes between pages: a new key, a delete and an update inside the prefix.
    put(&mut kv, &format!("{p}ns/p99"), "new").await.unwrap();
    put(&mut kv, &format!("{p}ns/p20"), "changed")
        .await
        .unwrap();
    c.kv(l)
        .await
        .delete_range(DeleteRangeRequest {
            key: format!("{p}ns/p15").into(),
            ..Default::default()
        })
        .await
        .unwrap();

    let mut all = first.kvs.clone();
    let mut last = first;
    for (n, (via, left)) in [(f[0], 15), (f[1], 5)].into_iter().enumerate() {
        let r = range(&c, via, page(continue_key(&last), p, rv, 10))
            .await
            .unwrap();
        assert_eq!(r.count, left, "page {}: count", n + 2);
        assert_eq!(r.kvs.len() as i64, left.min(10));
        assert_eq!(r.more, left > 10, "page {}: more", n + 2);
        all.extend(r.kvs.clone());
        last = r;
    }
    assert_eq!(kv_summary(&all), kv_summary(&before.kvs));

    // keys-only and count-only (at the current revision: the writes above show).
    let keys = range(
        &c,
        f[1],
        RangeRequest {
            keys_only: true,
            ..page(p.into(), p, 0, 0)
        },
    )
    .await
    .unwrap();
    assert_eq!(keys.count, 25);
    assert!(keys.kvs.iter().all(|kv| kv.value.is_empty()));
    let names: Vec<String> = keys.kvs.iter().map(|kv| s(&kv.key)).collect();
    assert!(names.contains(&format!("{p}ns/p99")) && !names.contains(&format!("{p}ns/p15")));
    let n = range(
        &c,
        f[0],
        RangeRequest {
            count_only: true,
            ..page(p.into(), p, 0, 0)
        },
    )
    .await
    .unwrap();
    assert_eq!((n.count, n.kvs.len(), n.more), (25, 0, false));
    let n_then = range(
        &c,
        f[0],
        RangeRequest {
            count_only: true,
            ..page(p.into(), p, rv, 0)
        },
    )
    .await
    .unwrap();
    assert_eq!(n_then.count, 25);
}

/// Optimistic create, update and delete; the conflict path returns the current object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_create_update_delete() {
    let c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = others(&c, l);
    let k = "/registry/configmaps/ns/cm";
    let create = || cmp(k, CompareTarget::Create, TargetUnion::CreateRevision(0));

    let t = guarded(&c, f[0], k, create(), op_put(k, "v1")).await;
    assert!(t.succeeded);
    assert!(matches!(
        t.responses[0].response,
        Some(Resp::ResponsePut(_))
    ));
    let r1 = t.header.unwrap().revision;
    // Creating it again conflicts: the Else branch has the object.
    let t = guarded(&c, f[1], k, create(), op_put(k, "other")).await;
    assert_eq!(
        kv_summary(&current_object(&t).kvs),
        vec![(k.into(), "v1".into(), r1, r1)]
    );
    assert_eq!(
        t.header.unwrap().revision,
        r1,
        "a failed txn writes nothing"
    );

    let by_mod = |n| cmp(k, CompareTarget::Mod, TargetUnion::ModRevision(n));
    let t = guarded(&c, l, k, by_mod(r1), op_put(k, "v2")).await;
    assert!(t.succeeded);
    let r2 = t.header.unwrap().revision;
    assert_eq!(r2, r1 + 1);
    // A stale update (resource version r1) conflicts and sees v2.
    let t = guarded(&c, f[0], k, by_mod(r1), op_put(k, "stale")).await;
    let cur = current_object(&t);
    assert_eq!(kv_summary(&cur.kvs), vec![(k.into(), "v2".into(), r1, r2)]);
    assert_eq!(cur.kvs[0].version, 2);

    let delete = RequestOp {
        request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
            key: k.into(),
            prev_kv: true,
            ..Default::default()
        })),
    };
    let t = guarded(&c, f[1], k, by_mod(r1), delete.clone()).await;
    assert_eq!(current_object(&t).kvs[0].mod_revision, r2);
    let t = guarded(&c, f[1], k, by_mod(r2), delete.clone()).await;
    assert!(t.succeeded);
    match t.responses[0].response.as_ref().unwrap() {
        Resp::ResponseDeleteRange(d) => {
            assert_eq!(d.deleted, 1);
            assert_eq!(
                kv_summary(&d.prev_kvs),
                vec![(k.into(), "v2".into(), r1, r2)]
            );
        }
        other => panic!("{other:?}"),
    }
    // Deleting again conflicts (mod_revision of a missing key is 0) and finds nothing.
    let t = guarded(&c, l, k, by_mod(r2), delete).await;
    assert!(current_object(&t).kvs.is_empty());
    // And it can be created anew.
    assert!(guarded(&c, l, k, create(), op_put(k, "v3")).await.succeeded);
}

/// WATCH from a resource version + 1 with prev_kv: exactly the changes after it, with the
/// previous values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_resource_version_with_prev_kv() {
    let c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = others(&c, l)[0];
    let mut kv = c.kv(l).await;
    let p = "/registry/secrets/";
    let rv = put(&mut kv, &format!("{p}a"), "1").await.unwrap();
    let r2 = put(&mut kv, &format!("{p}a"), "2").await.unwrap();
    let r3 = put(&mut kv, &format!("{p}b"), "1").await.unwrap();
    put(&mut kv, "/registry/secretsX", "outside").await.unwrap();
    let r4 = c
        .kv(l)
        .await
        .delete_range(DeleteRangeRequest {
            key: format!("{p}a").into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;

    let mut ws = Ws::open(&c, f).await;
    ws.create(watch_prefix(p, rv + 1, true)).await;
    let ev = ws.events(3).await;
    let got: Vec<(i32, String, i64, Option<String>)> = ev
        .iter()
        .map(|e| {
            let kv = e.kv.as_ref().unwrap();
            (
                e.r#type,
                s(&kv.key),
                kv.mod_revision,
                e.prev_kv.as_ref().map(|p| s(&p.value)),
            )
        })
        .collect();
    let put_t = EventType::Put as i32;
    assert_eq!(
        got,
        vec![
            (put_t, format!("{p}a"), r2, Some("1".into())),
            (put_t, format!("{p}b"), r3, None),
            (
                EventType::Delete as i32,
                format!("{p}a"),
                r4,
                Some("2".into())
            ),
        ]
    );
    // A live event follows the history.
    let r5 = put(&mut kv, &format!("{p}c"), "1").await.unwrap();
    assert_eq!(rev_of(&ws.events(1).await[0]), r5);
}

/// Bookmarks: periodic progress notifications and progress requests are empty responses at
/// the current revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notifications_and_requests_are_bookmarks() {
    let c = Cluster::start_opts(
        3,
        false,
        &["--experimental-watch-progress-notify-interval=1s"],
    )
    .await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = others(&c, l)[0];
    let mut kv = c.kv(l).await;
    put(&mut kv, "/registry/nodes/n1", "x").await.unwrap();
    // A linearizable read on the follower waits until it has applied that put, so the watch
    // below (from its current revision) starts after it and sees no event.
    get(&mut c.kv(f).await, "/registry/nodes/n1").await.unwrap();
    let mut ws = Ws::open(&c, f).await;
    let id = ws
        .create(WatchCreateRequest {
            progress_notify: true,
            ..watch_prefix("/registry/nodes/", 0, false)
        })
        .await;

    // A write elsewhere moves the revision; the next notification reports it.
    let rev = put(&mut kv, "/registry/events/e1", "x").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = ws.next().await;
        assert!(r.events.is_empty(), "no event matches the watch: {r:?}");
        assert_eq!(r.watch_id, id);
        if r.header.unwrap().revision == rev {
            break;
        }
        assert!(Instant::now() < deadline, "no notification at {rev}");
    }

    // A progress request is answered at once (before the next tick would be due) with watch
    // id -1 (all watchers are synced) at the current revision.
    let rev = put(&mut kv, "/registry/events/e2", "x").await.unwrap();
    let asked = Instant::now();
    ws.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await;
    loop {
        let r = ws.next().await;
        assert!(r.events.is_empty(), "{r:?}");
        if r.watch_id == -1 {
            assert_eq!(r.header.unwrap().revision, rev);
            break;
        }
        // A periodic notification may come first; it too must not be behind an acked write
        // for longer than one interval.
        assert_eq!(r.watch_id, id);
        assert!(asked.elapsed() < Duration::from_secs(3), "{r:?}");
    }
    // A change on the watched prefix is delivered as an event, after the bookmarks.
    let r3 = put(&mut kv, "/registry/nodes/n2", "x").await.unwrap();
    assert_eq!(rev_of(&ws.events(1).await[0]), r3);
}

/// kube-apiserver's compactor: `Txn If version(compact_rev_key) == T Then Put(compact_rev_key,
/// rev) Else Get`, then Compact(rev). A second coordinator with a stale T loses and learns T.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_coordination() {
    let c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = others(&c, l);
    let key = "compact_rev_key";
    let mut kv = c.kv(l).await;
    for i in 0..5 {
        put(&mut kv, "/registry/leases/x", &i.to_string())
            .await
            .unwrap();
    }
    // Returns Ok(new T) when this coordinator won, Err(current T, its value) when it lost.
    let coordinate = |via: usize, t: i64, rev: i64| {
        let c = &c;
        async move {
            let r = guarded(
                c,
                via,
                key,
                cmp(key, CompareTarget::Version, TargetUnion::Version(t)),
                op_put(key, &rev.to_string()),
            )
            .await;
            if r.succeeded {
                Ok(t + 1)
            } else {
                let kv = &current_object(&r).kvs[0];
                Err((kv.version, s(&kv.value)))
            }
        }
    };

    let cur = range(&c, f[0], page("/".into(), "/", 0, 1)).await.unwrap();
    let rev = cur.header.unwrap().revision - 1;
    let t = coordinate(f[0], 0, rev)
        .await
        .expect("first coordinator wins");
    assert_eq!(t, 1);
    c.kv(f[0])
        .await
        .compact(CompactionRequest {
            revision: rev,
            physical: false,
        })
        .await
        .unwrap();
    // The second coordinator still believes T = 0: it loses and sees who compacted to what.
    assert_eq!(
        coordinate(f[1], 0, rev + 1).await,
        Err((1, rev.to_string()))
    );
    let e = range(
        &c,
        f[1],
        RangeRequest {
            key: "/registry/leases/x".into(),
            revision: rev - 1,
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    // Next interval: the loser, now knowing T = 1, wins the next round.
    let rev2 = put(&mut kv, "/registry/leases/x", "later").await.unwrap();
    assert_eq!(coordinate(f[1], 1, rev2).await, Ok(2));
    c.kv(f[1])
        .await
        .compact(CompactionRequest {
            revision: rev2,
            physical: true,
        })
        .await
        .unwrap();
    // Compacting to an old revision again fails as etcd's.
    let e = c
        .kv(l)
        .await
        .compact(CompactionRequest {
            revision: rev,
            physical: false,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
}

/// Keys attached to a lease (events, endpoints leases) expire, all in one revision, and a
/// watcher sees the DELETE events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_keys_expire_with_delete_events() {
    let c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = others(&c, l);
    let lease = LeaseClient::new(common::channel(&c.members[f[0]].client_url()).await)
        .lease_grant(LeaseGrantRequest { ttl: 2, id: 0 })
        .await
        .unwrap()
        .into_inner()
        .id;
    let p = "/registry/events/";
    let mut kv = c.kv(f[1]).await;
    let mut revs = vec![];
    for k in ["a", "b"] {
        let r = kv
            .put(PutRequest {
                key: format!("{p}{k}").into(),
                value: "e".into(),
                lease,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        revs.push(r.header.unwrap().revision);
    }
    let mut ws = Ws::open(&c, f[0]).await;
    ws.create(watch_prefix(p, revs[0], true)).await;
    let granted = Instant::now();
    let ev = ws.events(4).await;
    assert!(granted.elapsed() < Duration::from_secs(12));
    assert_eq!(ev[..2].iter().map(rev_of).collect::<Vec<_>>(), revs);
    let dels = &ev[2..];
    assert!(dels.iter().all(|e| e.r#type == EventType::Delete as i32));
    assert_eq!(
        dels[0].kv.as_ref().unwrap().mod_revision,
        dels[1].kv.as_ref().unwrap().mod_revision
    );
    let mut keys: Vec<String> = dels
        .iter()
        .map(|e| s(&e.kv.as_ref().unwrap().key))
        .collect();
    keys.sort();
    assert_eq!(keys, vec![format!("{p}a"), format!("{p}b")]);
    assert!(dels
        .iter()
        .all(|e| e.prev_kv.as_ref().unwrap().lease == lease));
    assert!(range(&c, l, page(p.into(), p, 0, 0))
        .await
        .unwrap()
        .kvs
        .is_empty());
}

/// Maintenance.Status as version-gated clients read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_status() {
    let c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let mut kv = c.kv(l).await;
    put(&mut kv, "/registry/x", "y").await.unwrap();
    let mut leader_ids = vec![];
    for i in 0..3 {
        let st = c.status(i).await;
        let v: Vec<u64> = st
            .version
            .split('.')
            .map(|p| {
                p.parse()
                    .unwrap_or_else(|_| panic!("version {:?}", st.version))
            })
            .collect();
        assert_eq!(v.len(), 3, "{:?}", st.version);
        assert!((v[0], v[1], v[2]) >= (3, 5, 13), "{:?}", st.version);
        assert!(st.db_size > 0);
        assert!(st.raft_term >= 1);
        assert!(st.raft_index > 0);
        assert!(st.raft_applied_index > 0 && st.raft_applied_index <= st.raft_index);
        assert!(!st.is_learner);
        if i == l {
            assert_eq!(st.leader, st.header.as_ref().unwrap().member_id);
        }
        leader_ids.push(st.leader);
    }
    assert!(leader_ids.iter().all(|x| *x == leader_ids[0] && *x != 0));
}

/// A leader kill -9 between pages: the list continues through another member at the same
/// revision and equals a list taken before the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_in_the_middle_of_a_paginated_list() {
    let mut c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = others(&c, l);
    let mut kv = c.kv(f[0]).await;
    let p = "/registry/deployments/";
    for i in 0..30 {
        put(&mut kv, &format!("{p}d{i:02}"), &format!("v{i}"))
            .await
            .unwrap();
    }
    let first = range(&c, l, page(p.into(), p, 0, 10)).await.unwrap();
    let rv = first.header.as_ref().unwrap().revision;
    let whole = range(&c, f[1], page(p.into(), p, rv, 0)).await.unwrap();
    assert_eq!(whole.kvs.len(), 30);

    c.kill(l);
    let mut all = first.kvs.clone();
    let mut last = first;
    for via in [f[1], f[0]] {
        let req = page(continue_key(&last), p, rv, 10);
        let r = retry(|| range(&c, via, req.clone())).await;
        assert_eq!(r.count, 30 - all.len() as i64);
        all.extend(r.kvs.clone());
        last = r;
    }
    assert!(!last.more);
    assert_eq!(kv_summary(&all), kv_summary(&whole.kvs));
    // Writes resume on the new leader and do not disturb the pinned revision.
    retry(|| {
        let mut kv = kv.clone();
        async move { put(&mut kv, &format!("{p}d00"), "after").await }
    })
    .await;
    let again = range(&c, f[1], page(p.into(), p, rv, 0)).await.unwrap();
    assert_eq!(kv_summary(&again.kvs), kv_summary(&whole.kvs));
}

/// A leader kill -9 during a watch: a watch on a follower keeps flowing with no gap and no
/// duplicate, and resuming from the last seen revision + 1 on another member continues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_in_the_middle_of_a_watch() {
    let mut c = Cluster::start(3).await;
    let l = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = others(&c, l);
    let (watched, writer) = (f[0], f[1]);
    let p = "/registry/services/";
    let mut kv = c.kv(writer).await;
    let start = put(&mut kv, &format!("{p}start"), "0").await.unwrap();
    let mut ws = Ws::open(&c, watched).await;
    ws.create(watch_prefix(p, start + 1, true)).await;

    let mut acked = vec![];
    for i in 0..40 {
        acked.push(put(&mut kv, &format!("{p}s{i:02}"), "a").await.unwrap());
    }
    c.kill(l);
    for i in 40..80 {
        let k = format!("{p}s{i:02}");
        acked.push(
            retry(|| {
                let (mut kv, k) = (kv.clone(), k.clone());
                async move { put(&mut kv, &k, "b").await }
            })
            .await,
        );
    }
    let last_acked = *acked.last().unwrap();
    // Only this test writes: every revision after `start` is one of ours (a write that failed
    // on the kill may still have committed), so the revisions must be exactly contiguous.
    let mut ev = Vec::new();
    while ev.last().is_none_or(|e| rev_of(e) < last_acked) {
        ev.extend(ws.events(1).await);
    }
    ev.retain(|e| rev_of(e) <= last_acked);
    let revs: Vec<i64> = ev.iter().map(rev_of).collect();
    assert_eq!(
        revs,
        (start + 1..=last_acked).collect::<Vec<_>>(),
        "gap or duplicate"
    );
    assert!(acked.iter().all(|r| revs.contains(r)));

    // Resume from the middle on the other survivor: the same events follow.
    let mid = rev_of(&ev[30]);
    let mut ws2 = Ws::open(&c, writer).await;
    ws2.create(watch_prefix(p, mid + 1, true)).await;
    let mut tail = ws2.events(ev.len() - 31).await;
    tail.retain(|e| rev_of(e) <= last_acked);
    assert_eq!(
        tail.iter()
            .map(|e| (rev_of(e), e.kv.clone(), e.prev_kv.clone()))
            .collect::<Vec<_>>(),
        ev[31..]
            .iter()
            .map(|e| (rev_of(e), e.kv.clone(), e.prev_kv.clone()))
            .collect::<Vec<_>>()
    );
    // Both streams keep flowing, in order.
    let next = put(&mut kv, &format!("{p}end"), "z").await.unwrap();
    for w in [&mut ws, &mut ws2] {
        let mut seen = last_acked;
        while seen < next {
            for e in w.events(1).await {
                assert!(rev_of(&e) > seen, "out of order after {seen}: {e:?}");
                seen = rev_of(&e);
            }
        }
        assert_eq!(seen, next);
    }
}
