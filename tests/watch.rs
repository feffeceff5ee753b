//! The Watch service against three real `kvd` processes: ordering, completeness, resumption,
//! prev_kv, compaction, txn atomicity, failover, progress requests and slow clients.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{put, Cluster};
use kvd::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use kvd::proto::etcdserverpb::request_op::Request as Op;
use kvd::proto::etcdserverpb::watch_client::WatchClient;
use kvd::proto::etcdserverpb::watch_request::RequestUnion;
use kvd::proto::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest,
    WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
};
use kvd::proto::mvccpb::{event::EventType, Event};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

fn other(than: &[usize]) -> usize {
    (0..3).find(|i| !than.contains(i)).unwrap()
}

fn prefix_end(p: &str) -> Vec<u8> {
    let mut e = p.as_bytes().to_vec();
    *e.last_mut().unwrap() += 1;
    e
}

fn prefix(p: &str, start_revision: i64) -> WatchCreateRequest {
    WatchCreateRequest {
        key: p.into(),
        range_end: prefix_end(p),
        start_revision,
        ..Default::default()
    }
}

fn rev_of(e: &Event) -> i64 {
    e.kv.as_ref().unwrap().mod_revision
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
        // etcd's clientv3 accepts responses up to 2 GiB; a catch-up response can be large.
        let rx = WatchClient::new(ch)
            .max_decoding_message_size(i32::MAX as usize)
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

    /// Creates a watcher and returns its id from the created response.
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

    /// Reads responses until `done` holds for the events received so far.
    async fn events_until(&mut self, mut done: impl FnMut(&[Event]) -> bool) -> Vec<Event> {
        let mut all = Vec::new();
        while !done(&all) {
            let r = self.next().await;
            assert!(!r.canceled, "unexpected cancel: {r:?}");
            all.extend(r.events);
        }
        all
    }
}

/// Asserts revisions strictly increase (ordered, no duplicates) and equal `acked`.
fn assert_exactly(events: &[Event], acked: &BTreeSet<i64>) {
    let revs: Vec<i64> = events.iter().map(rev_of).collect();
    assert!(
        revs.windows(2).all(|w| w[0] < w[1]),
        "revisions not strictly increasing: {revs:?}"
    );
    let got: BTreeSet<i64> = revs.into_iter().collect();
    assert_eq!(&got, acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_ordered_unique_and_gapless() {
    let c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let mut ws = Ws::open(&c, other(&[leader])).await;
    ws.create(prefix("o/", 0)).await;

    let mut writers = Vec::new();
    for m in 0..3 {
        let mut kv = c.kv(m).await;
        writers.push(tokio::spawn(async move {
            let mut revs = Vec::new();
            for i in 0..60 {
                revs.push(put(&mut kv, &format!("o/{m}/{i}"), "v").await.unwrap());
            }
            revs
        }));
    }
    let mut acked = BTreeSet::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    assert_eq!(acked.len(), 180);
    let events = ws.events_until(|e| e.len() >= acked.len()).await;
    assert_exactly(&events, &acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_from_last_revision_continues_without_loss() {
    let c = Cluster::start(3).await;
    let mut kv = c.kv(0).await;
    let mut acked = BTreeSet::new();
    for i in 0..40 {
        acked.insert(put(&mut kv, &format!("r/{i}"), "v").await.unwrap());
    }
    let first = *acked.first().unwrap();

    let mut ws = Ws::open(&c, 1).await;
    ws.create(prefix("r/", first)).await;
    let mut seen = ws.events_until(|e| e.len() >= 15).await;
    drop(ws);

    for i in 40..80 {
        acked.insert(put(&mut kv, &format!("r/{i}"), "v").await.unwrap());
    }
    // Resume on another member from the revision after the last one seen.
    let mut ws = Ws::open(&c, 2).await;
    ws.create(prefix("r/", rev_of(seen.last().unwrap()) + 1))
        .await;
    let want = acked.len();
    let rest = ws.events_until(|e| seen.len() + e.len() >= want).await;
    seen.extend(rest);
    assert_exactly(&seen, &acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prev_kv_is_the_value_before_each_event() {
    let c = Cluster::start(3).await;
    let mut kv = c.kv(0).await;
    let r1 = put(&mut kv, "pk", "a").await.unwrap();
    put(&mut kv, "pk", "b").await.unwrap();
    kv.delete_range(DeleteRangeRequest {
        key: "pk".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    put(&mut kv, "pk", "c").await.unwrap();

    let mut ws = Ws::open(&c, 1).await;
    ws.create(WatchCreateRequest {
        key: "pk".into(),
        start_revision: r1,
        prev_kv: true,
        ..Default::default()
    })
    .await;
    let events = ws.events_until(|e| e.len() >= 4).await;
    let got: Vec<(i32, Option<Vec<u8>>, Vec<u8>)> = events
        .iter()
        .map(|e| {
            (
                e.r#type,
                e.prev_kv.as_ref().map(|p| p.value.clone()),
                e.kv.as_ref().unwrap().value.clone(),
            )
        })
        .collect();
    let (put_t, del_t) = (EventType::Put as i32, EventType::Delete as i32);
    assert_eq!(
        got,
        vec![
            (put_t, None, b"a".to_vec()),
            (put_t, Some(b"a".to_vec()), b"b".to_vec()),
            (del_t, Some(b"b".to_vec()), vec![]),
            (put_t, None, b"c".to_vec()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_below_compaction_is_canceled_with_compact_revision() {
    let c = Cluster::start(3).await;
    let mut kv = c.kv(0).await;
    let mut last = 0;
    for i in 0..10 {
        last = put(&mut kv, "ck", &i.to_string()).await.unwrap();
    }
    let compact_at = last - 3;
    kv.compact(CompactionRequest {
        revision: compact_at,
        physical: true,
    })
    .await
    .unwrap();

    let mut ws = Ws::open(&c, 1).await;
    let id = ws.create(prefix("ck", 1)).await;
    let r = ws.next().await;
    assert!(r.canceled, "{r:?}");
    assert_eq!((r.watch_id, r.compact_revision), (id, compact_at));
    // As etcd 3.4's sendLoop: compact_revision says why, cancel_reason stays empty.
    assert_eq!(r.cancel_reason, "");
    assert!(r.events.is_empty());

    // At the compacted revision itself the history is still complete.
    ws.create(prefix("ck", compact_at)).await;
    let events = ws.events_until(|e| e.len() >= 4).await;
    assert_exactly(&events, &(compact_at..=last).collect());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_events_share_one_response_and_revision() {
    let c = Cluster::start(3).await;
    let mut kv = c.kv(0).await;
    put(&mut kv, "t/gone", "x").await.unwrap();
    let txn = |n: usize| TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Greater as i32,
            target: CompareTarget::Version as i32,
            key: "t/never".into(),
            target_union: Some(TargetUnion::Version(-1)),
            ..Default::default()
        }],
        success: (0..4)
            .map(|j| RequestOp {
                request: Some(Op::RequestPut(PutRequest {
                    key: format!("t/{n}/{j}").into(),
                    value: "v".into(),
                    ..Default::default()
                })),
            })
            .chain(std::iter::once(RequestOp {
                request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                    key: "t/gone".into(),
                    ..Default::default()
                })),
            }))
            .collect(),
        failure: vec![],
    };
    // Enough txns that a watcher replaying them hits the per-read event limit, which must
    // not split a revision.
    let mut first = 0;
    let mut revs = BTreeSet::new();
    for n in 0..260 {
        let r = kv.txn(txn(n)).await.unwrap().into_inner();
        assert!(r.succeeded);
        let rev = r.header.unwrap().revision;
        if first == 0 {
            first = rev;
        }
        revs.insert(rev);
    }
    let mut ws = Ws::open(&c, 2).await;
    ws.create(prefix("t/", first)).await;
    let mut seen = 0;
    let mut per_rev = std::collections::BTreeMap::<i64, usize>::new();
    while seen < revs.len() * 4 + 1 {
        let r = ws.next().await;
        let mut in_resp: BTreeSet<i64> = BTreeSet::new();
        for e in &r.events {
            *per_rev.entry(rev_of(e)).or_default() += 1;
            in_resp.insert(rev_of(e));
        }
        seen += r.events.len();
        // Every revision in this response is complete within it.
        for rv in in_resp {
            let want = if rv == first { 5 } else { 4 };
            assert_eq!(per_rev[&rv], want, "revision {rv} split across responses");
        }
    }
    // The first txn deleted t/gone; later ones delete nothing, so 4 events each.
    assert_eq!(per_rev.keys().copied().collect::<BTreeSet<_>>(), revs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_watch_survives_leader_kill_and_restart() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = other(&[leader]);
    let mut ws = Ws::open(&c, f).await;
    ws.create(prefix("f/", 0)).await;

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let mut kv = c.kv(f).await;
    let writer = tokio::spawn(async move {
        let mut acked = BTreeSet::new();
        let mut n = 0;
        while !*stop_rx.borrow_and_update() {
            n += 1;
            let key = format!("f/{n}");
            if let Ok(Ok(rev)) =
                tokio::time::timeout(Duration::from_secs(2), put(&mut kv, &key, "v")).await
            {
                acked.insert(rev);
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        (acked, n)
    });

    // Read concurrently so the watcher is live (synced) while the leader dies.
    let reader = tokio::spawn(async move {
        let mut events = Vec::new();
        loop {
            tokio::select! {
                r = ws.rx.message() => events.extend(r.unwrap().unwrap().events),
                _ = tokio::time::sleep(Duration::from_secs(3)) => return (ws, events),
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.kill(leader);
    c.wait_for_leader(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.spawn(leader);
    c.wait_for_leader(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_tx.send(true).unwrap();
    let (acked, attempts) = writer.await.unwrap();
    assert!(
        acked.len() > 10,
        "only {} of {attempts} puts acked",
        acked.len()
    );
    let (mut ws, mut events) = reader.await.unwrap();
    let last = *acked.last().unwrap();
    let rest = ws
        .events_until(|e| e.last().map(rev_of).max(events.last().map(rev_of)) >= Some(last))
        .await;
    events.extend(rest);
    let revs: Vec<i64> = events.iter().map(rev_of).collect();
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");
    let got: BTreeSet<i64> = revs.into_iter().collect();
    // Unacked puts may or may not have committed; every acked one appears exactly once.
    assert!(
        acked.is_subset(&got),
        "missing {:?}",
        acked.difference(&got).collect::<Vec<_>>()
    );
}

/// A progress request on a follower is linearizable: its revision is never older than a write
/// the leader acknowledged before the request, although the follower may not have applied
/// that write yet when the request arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_request_on_a_follower_is_not_behind_an_acked_write() {
    let c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let mut kv = c.kv(leader).await;
    let mut ws = Ws::open(&c, follower).await;
    ws.create(prefix("p/", 0)).await;
    for i in 0..40 {
        let rev = put(&mut kv, &format!("elsewhere/{i}"), "v").await.unwrap();
        ws.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await;
        let r = ws.next().await;
        assert_eq!(r.watch_id, -1);
        let got = r.header.unwrap().revision;
        assert!(
            got >= rev,
            "round {i}: progress at {got}, write acked at {rev}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_request_gets_watch_id_minus_one_and_current_revision() {
    let c = Cluster::start(3).await;
    let mut kv = c.kv(0).await;
    let mut ws = Ws::open(&c, 1).await;
    ws.create(prefix("p/", 0)).await;
    let rev = put(&mut kv, "elsewhere", "v").await.unwrap();
    // Wait until member 1 applied it: a serializable read there returns its revision.
    loop {
        let r = c
            .kv(1)
            .await
            .range(kvd::proto::etcdserverpb::RangeRequest {
                key: "elsewhere".into(),
                serializable: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if r.header.unwrap().revision >= rev {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ws.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await;
    let r = ws.next().await;
    assert_eq!(r.watch_id, -1);
    assert!(r.events.is_empty() && !r.created && !r.canceled);
    assert_eq!(r.header.unwrap().revision, rev);

    // A progress request while a watcher is replaying history is answered only after it has
    // caught up: no event at or below the progress revision may follow it.
    // More events than one read returns, so the replay takes several passes.
    for t in 0..12 {
        let ops = (0..100)
            .map(|i| RequestOp {
                request: Some(Op::RequestPut(PutRequest {
                    key: format!("q/{t}/{i}").into(),
                    value: "v".into(),
                    ..Default::default()
                })),
            })
            .collect();
        kv.txn(TxnRequest {
            success: ops,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let last = put(&mut kv, "q/last", "v").await.unwrap();
    let mut ws = Ws::open(&c, 0).await;
    ws.send(RequestUnion::CreateRequest(prefix("q/", 1))).await;
    ws.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await;
    assert!(ws.next().await.created);
    let mut max_seen = 0;
    loop {
        let r = ws.next().await;
        if r.watch_id == -1 {
            let prog = r.header.unwrap().revision;
            assert!(prog >= last && max_seen >= last, "{prog} {max_seen}");
            break;
        }
        max_seen = max_seen.max(r.events.iter().map(rev_of).max().unwrap_or(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_watcher_does_not_block_writes_or_other_streams() {
    let c = Cluster::start(3).await;
    let mut stalled = Ws::open(&c, 1).await;
    stalled.create(prefix("s/", 0)).await;
    let mut live = Ws::open(&c, 1).await;
    live.create(prefix("s/", 0)).await;

    // Far more than the HTTP/2 windows and the stream buffer hold.
    let value = "x".repeat(32 * 1024);
    let mut kv = c.kv(0).await;
    let start = std::time::Instant::now();
    let mut acked = BTreeSet::new();
    let reader = tokio::spawn(async move {
        let events = live.events_until(|e| e.len() >= 200).await;
        (live, events)
    });
    for i in 0..200 {
        let r = kv
            .put(PutRequest {
                key: format!("s/{i}").into(),
                value: value.clone().into(),
                ..Default::default()
            })
            .await
            .unwrap();
        acked.insert(r.into_inner().header.unwrap().revision);
    }
    assert!(start.elapsed() < Duration::from_secs(20));
    let (_live, events) = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("live watcher keeps up")
        .unwrap();
    assert_exactly(&events, &acked);

    // The stalled watcher lost nothing while it was not read.
    let events = stalled.events_until(|e| e.len() >= 200).await;
    assert_exactly(&events, &acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_creates_and_cancels_follow_etcd() {
    let c = Cluster::start(3).await;
    let mut ws = Ws::open(&c, 0).await;
    // Client-chosen ids; auto ids then start at 0 and skip taken ones.
    let mut explicit = prefix("x/", 0);
    explicit.watch_id = 1;
    assert_eq!(ws.create(explicit.clone()).await, 1);
    assert_eq!(ws.create(prefix("x/", 0)).await, 0);
    assert_eq!(ws.create(prefix("x/", 0)).await, 2);

    ws.send(RequestUnion::CreateRequest(explicit)).await;
    let r = ws.next().await;
    assert!(r.created && r.canceled, "{r:?}");
    assert_eq!(r.watch_id, -1);
    assert_eq!(
        r.cancel_reason,
        "mvcc: duplicate watch ID provided on the WatchStream"
    );

    ws.send(RequestUnion::CreateRequest(WatchCreateRequest {
        key: "b".into(),
        range_end: "a".into(),
        ..Default::default()
    }))
    .await;
    let r = ws.next().await;
    assert!(r.created && r.canceled, "{r:?}");
    assert_eq!(r.cancel_reason, "mvcc: watcher range is empty");

    ws.send(RequestUnion::CancelRequest(
        kvd::proto::etcdserverpb::WatchCancelRequest { watch_id: 0 },
    ))
    .await;
    let r = ws.next().await;
    assert!(r.canceled && !r.created && r.watch_id == 0, "{r:?}");

    // The canceled watcher gets nothing more; the others still do.
    let rev = put(&mut c.kv(0).await, "x/1", "v").await.unwrap();
    let mut ids = BTreeSet::new();
    while ids.len() < 2 {
        let r = ws.next().await;
        assert_eq!(rev_of(&r.events[0]), rev);
        ids.insert(r.watch_id);
    }
    assert_eq!(ids, BTreeSet::from([1, 2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_leader_stream_ends_with_no_leader() {
    let mut c = Cluster::start(3).await;
    let ch = common::channel(&c.members[0].client_url()).await;
    let (tx, req_rx) = mpsc::channel(16);
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(prefix("n/", 0))),
    })
    .await
    .unwrap();
    let mut req = tonic::Request::new(ReceiverStream::new(req_rx));
    req.metadata_mut()
        .insert("hasleader", "true".parse().unwrap());
    let mut rx = WatchClient::new(ch).watch(req).await.unwrap().into_inner();
    assert!(rx.message().await.unwrap().unwrap().created);

    c.kill(1);
    c.kill(2);
    let err = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match rx.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("stream ended without an error"),
                Err(e) => return e,
            }
        }
    })
    .await
    .expect("stream canceled within 20s");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(err.message(), "etcdserver: no leader");
    drop(tx);
}

/// Reads `ws` until every watcher in `want` has that many events; returns events by watch id.
async fn events_by_id(ws: &mut Ws, want: &BTreeMap<i64, usize>) -> BTreeMap<i64, Vec<Event>> {
    let mut got: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
    while want
        .iter()
        .any(|(id, n)| got.get(id).map_or(0, Vec::len) < *n)
    {
        let r = ws.next().await;
        assert!(!r.canceled, "unexpected cancel: {r:?}");
        got.entry(r.watch_id).or_default().extend(r.events);
    }
    got
}

/// Single-key watchers on one stream, a prefix watcher with prev_kv on a stream whose client
/// stops reading, and more revisions than the member's watch hub keeps: writes keep their
/// pace, every live watcher gets exactly its key's events, and the stalled stream, once read,
/// catches up from the store with nothing lost, repeated or reordered and prev_kv right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_stream_beyond_the_hub_buffer_blocks_no_one_and_catches_up() {
    let c = Cluster::start(3).await;
    let mut stalled = Ws::open(&c, 1).await;
    let mut all = prefix("h/", 0);
    all.prev_kv = true;
    stalled.create(all).await;

    const KEYS: usize = 50;
    // More than HUB_BUFFER (256) batches: sequential puts apply one revision at a time.
    const PUTS: usize = 600;
    let mut live = Ws::open(&c, 1).await;
    let mut key_of = BTreeMap::new();
    for k in 0..KEYS {
        let id = live
            .create(WatchCreateRequest {
                key: format!("h/{k}").into(),
                ..Default::default()
            })
            .await;
        key_of.insert(id, k);
    }
    let want: BTreeMap<i64, usize> = key_of.keys().map(|id| (*id, PUTS / KEYS)).collect();
    let reader = tokio::spawn(async move {
        let got = events_by_id(&mut live, &want).await;
        (live, got)
    });

    // 600 x 16 KiB: far more than the HTTP/2 windows and the stream buffer hold.
    let value = "x".repeat(16 * 1024);
    // The stalled client can hold only a small part of these events, so the writes (and the
    // live watchers below) finishing at all, before it reads, shows they never wait for it;
    // the timeout is generous because this debug build shares the machine with other tests.
    let mut kv = c.kv(0).await;
    let writes = async {
        let mut revs = Vec::new();
        for i in 0..PUTS {
            let key = format!("h/{}", i % KEYS);
            revs.push(put(&mut kv, &key, &value).await.unwrap());
        }
        revs
    };
    let revs = tokio::time::timeout(Duration::from_secs(120), writes)
        .await
        .expect("writes finish while a watcher is stalled");

    let (_live, got) = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("live watchers keep up")
        .unwrap();
    for (id, k) in &key_of {
        let acked: BTreeSet<i64> = revs.iter().skip(*k).step_by(KEYS).copied().collect();
        assert_exactly(&got[id], &acked);
    }

    let events = stalled.events_until(|e| e.len() >= PUTS).await;
    assert_exactly(&events, &revs.iter().copied().collect());
    for (i, e) in events.iter().enumerate() {
        let prev = e.prev_kv.as_ref().map(|p| p.mod_revision);
        let expected = (i >= KEYS).then(|| revs[i - KEYS]);
        assert_eq!(prev, expected, "prev_kv of event {i}");
    }
}

/// Watchers created while writes stream in, each from a revision in the past, read the
/// history and then join the live feed: each sees every acknowledged revision from its start
/// exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_from_past_revisions_join_live_writes_without_gaps() {
    let c = Cluster::start(3).await;
    let mut kv = c.kv(0).await;
    let first = put(&mut kv, "j/0", "v").await.unwrap();
    const PUTS: usize = 300;
    let writer = tokio::spawn(async move {
        let mut revs = vec![first];
        for i in 1..PUTS {
            revs.push(put(&mut kv, &format!("j/{i}"), "v").await.unwrap());
        }
        revs
    });
    let mut streams = Vec::new();
    for n in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut ws = Ws::open(&c, 2).await;
        // Starts spread over the history written so far.
        let from = first + n * 20;
        ws.create(prefix("j/", from)).await;
        streams.push((from, ws));
    }
    let revs = writer.await.unwrap();
    for (from, mut ws) in streams {
        let acked: BTreeSet<i64> = revs.iter().copied().filter(|r| *r >= from).collect();
        let events = ws.events_until(|e| e.len() >= acked.len()).await;
        assert_exactly(&events, &acked);
    }
}
