//! Named unit tests for the etcd 3.4 behaviours the store must reproduce.

use super::*;
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::response_op::Response;
use crate::proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest,
    LeaseRevokeRequest, PutRequest, PutResponse, TxnRequest, TxnResponse,
};
use crate::proto::etcdserverpb::{Compare, RequestOp};

pub(super) fn temp_store() -> (tempfile::TempDir, StoreEngine, MvccStore) {
    let dir = tempfile::tempdir().unwrap();
    let db = StoreEngine::open_flushed_only(dir.path()).unwrap();
    let store = MvccStore::open(db.clone()).unwrap();
    (dir, db, store)
}

/// Opens the engine in `dir` once a dropped store's background threads let go of its lock.
pub(super) fn reopen(dir: &std::path::Path) -> StoreEngine {
    for _ in 0..300 {
        if let Ok(db) = StoreEngine::open(dir) {
            return db;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("reopen the engine");
}

fn one(s: &MvccStore, r: WriteRequest) -> Result<WriteResponse, MvccError> {
    s.apply(&[r], &[]).unwrap().pop().unwrap()
}

fn put_req(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        ..Default::default()
    }
}

pub(super) fn put(s: &MvccStore, k: &str, v: &str) -> PutResponse {
    match one(s, WriteRequest::Put(put_req(k, v))).unwrap() {
        WriteResponse::Put(p) => p,
        r => panic!("{r:?}"),
    }
}

pub(super) fn del(s: &MvccStore, k: &str, end: &str) -> DeleteRangeResponse {
    let r = WriteRequest::DeleteRange(DeleteRangeRequest {
        key: k.into(),
        range_end: end.into(),
        prev_kv: true,
    });
    match one(s, r).unwrap() {
        WriteResponse::DeleteRange(d) => d,
        r => panic!("{r:?}"),
    }
}

fn txn(s: &MvccStore, t: TxnRequest) -> Result<TxnResponse, MvccError> {
    one(s, WriteRequest::Txn(t)).map(|r| match r {
        WriteResponse::Txn(t) => t,
        r => panic!("{r:?}"),
    })
}

pub(super) fn compact(s: &MvccStore, rev: i64) -> Result<WriteResponse, MvccError> {
    one(
        s,
        WriteRequest::Compact(CompactionRequest {
            revision: rev,
            physical: false,
        }),
    )
}

fn get(s: &MvccStore, k: &str) -> Option<KeyValue> {
    s.get_at(k.as_bytes(), 0).unwrap()
}

fn range_all(s: &MvccStore) -> RangeRequest {
    let _ = s;
    RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    }
}

fn keys(r: &RangeResponse) -> Vec<String> {
    r.kvs
        .iter()
        .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
        .collect()
}

fn op_put(k: &str, v: &str) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(put_req(k, v))),
    }
}

fn op_del(k: &str, end: &str) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
            key: k.into(),
            range_end: end.into(),
            prev_kv: false,
        })),
    }
}

fn op_get(k: &str) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key: k.into(),
            ..Default::default()
        })),
    }
}

fn cmp_version(k: &str, result: CompareResult, v: i64) -> Compare {
    Compare {
        result: result as i32,
        target: CompareTarget::Version as i32,
        key: k.into(),
        range_end: vec![],
        target_union: Some(TargetUnion::Version(v)),
    }
}

fn hdr_rev<T: std::fmt::Debug>(h: &Option<ResponseHeader>, ctx: T) -> i64 {
    h.as_ref()
        .unwrap_or_else(|| panic!("no header: {ctx:?}"))
        .revision
}

use crate::proto::etcdserverpb::ResponseHeader;

#[test]
fn empty_store_is_at_revision_1() {
    let (_d, _db, s) = temp_store();
    assert_eq!(s.current_revision(), 1);
    assert_eq!(s.compacted_revision(), NEVER_COMPACTED);
    let r = s.range(&range_all(&s)).unwrap();
    assert_eq!((r.count, r.kvs.len(), r.more), (0, 0, false));
}

#[test]
fn first_put_gets_revision_2() {
    let (_d, _db, s) = temp_store();
    let p = put(&s, "a", "1");
    assert_eq!(hdr_rev(&p.header, &p), 2);
    assert_eq!(s.current_revision(), 2);
    let kv = get(&s, "a").unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 2, 1));
}

#[test]
fn delete_of_missing_key_does_not_bump_revision() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1");
    let d = del(&s, "b", "");
    assert_eq!(d.deleted, 0);
    assert_eq!(hdr_rev(&d.header, &d), 2);
    assert_eq!(s.current_revision(), 2);
    let d = del(&s, "a", "");
    assert_eq!((d.deleted, hdr_rev(&d.header, &d)), (1, 3));
    assert_eq!(d.prev_kvs[0].value, b"1");
}

#[test]
fn txn_without_writes_does_not_bump_revision() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1");
    let t = txn(
        &s,
        TxnRequest {
            compare: vec![],
            success: vec![op_get("a"), op_del("zz", "")],
            failure: vec![],
        },
    )
    .unwrap();
    assert_eq!(hdr_rev(&t.header, &t), 2);
    assert_eq!(s.current_revision(), 2);
}

#[test]
fn txn_ops_share_the_main_revision() {
    let (_d, _db, s) = temp_store();
    let t = txn(
        &s,
        TxnRequest {
            compare: vec![],
            success: vec![op_put("a", "1"), op_put("b", "2"), op_get("a")],
            failure: vec![],
        },
    )
    .unwrap();
    assert_eq!(hdr_rev(&t.header, &t), 2);
    assert_eq!(get(&s, "a").unwrap().mod_revision, 2);
    assert_eq!(get(&s, "b").unwrap().mod_revision, 2);
    // The range inside the txn sees the earlier put.
    match &t.responses[2].response {
        Some(Response::ResponseRange(r)) => {
            assert_eq!(r.kvs[0].value, b"1");
            assert_eq!(hdr_rev(&r.header, r), 2);
        }
        r => panic!("{r:?}"),
    }
    let ev = s.events_since(2, b"a", b"c", false, 0).unwrap();
    assert_eq!(ev.events.len(), 2);
    assert_eq!(ev.next_revision, 3);
}

#[test]
fn version_create_and_mod_revisions() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1");
    put(&s, "b", "x");
    put(&s, "a", "2");
    let kv = get(&s, "a").unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 4, 2));
    let old = s.get_at(b"a", 3).unwrap().unwrap();
    assert_eq!((old.value.as_slice(), old.version), (&b"1"[..], 1));
}

#[test]
fn tombstone_resets_version() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1");
    put(&s, "a", "2");
    del(&s, "a", "");
    assert_eq!(get(&s, "a"), None);
    put(&s, "a", "3");
    let kv = get(&s, "a").unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (5, 5, 1));
    let ev = s.events_since(4, b"a", b"", true, 0).unwrap().events;
    assert_eq!(ev[0].r#type, EventType::Delete as i32);
    assert_eq!(ev[0].kv.as_ref().unwrap().mod_revision, 4);
    assert_eq!(ev[0].prev_kv.as_ref().unwrap().value, b"2");
    assert_eq!(ev[1].prev_kv, None);
}

#[test]
fn range_count_is_before_filters_and_limit() {
    let (_d, _db, s) = temp_store();
    for k in ["a", "b", "c", "d"] {
        put(&s, k, k);
    }
    let r = s
        .range(&RangeRequest {
            min_mod_revision: 4,
            ..range_all(&s)
        })
        .unwrap();
    assert_eq!(keys(&r), ["c", "d"]);
    assert_eq!(r.count, 4);
    let r = s
        .range(&RangeRequest {
            limit: 1,
            max_create_revision: 3,
            ..range_all(&s)
        })
        .unwrap();
    assert_eq!(
        (keys(&r), r.count, r.more),
        (vec!["a".to_string()], 4, true)
    );
}

#[test]
fn range_sort() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "3");
    put(&s, "b", "1");
    put(&s, "c", "2");
    put(&s, "b", "1");
    let r = |order: SortOrder, target: SortTarget| {
        keys(
            &s.range(&RangeRequest {
                sort_order: order as i32,
                sort_target: target as i32,
                ..range_all(&s)
            })
            .unwrap(),
        )
    };
    assert_eq!(r(SortOrder::Descend, SortTarget::Key), ["c", "b", "a"]);
    assert_eq!(r(SortOrder::Ascend, SortTarget::Value), ["b", "c", "a"]);
    assert_eq!(r(SortOrder::Descend, SortTarget::Mod), ["b", "c", "a"]);
    assert_eq!(r(SortOrder::Descend, SortTarget::Version), ["b", "a", "c"]);
    // Target other than KEY with order NONE sorts ascending.
    assert_eq!(r(SortOrder::None, SortTarget::Value), ["b", "c", "a"]);
    assert_eq!(r(SortOrder::Ascend, SortTarget::Create), ["a", "b", "c"]);
}

#[test]
fn range_limit_and_more() {
    let (_d, _db, s) = temp_store();
    for k in ["a", "b", "c"] {
        put(&s, k, k);
    }
    let lim = |limit| {
        let r = s
            .range(&RangeRequest {
                limit,
                ..range_all(&s)
            })
            .unwrap();
        (keys(&r).len(), r.more, r.count)
    };
    assert_eq!(lim(2), (2, true, 3));
    assert_eq!(lim(3), (3, false, 3));
    assert_eq!(lim(0), (3, false, 3));
    // etcd fetches limit+1 keys when the sort order is NONE, then sorts only those.
    let r = s
        .range(&RangeRequest {
            limit: 1,
            sort_target: SortTarget::Mod as i32,
            ..RangeRequest {
                key: b"a".to_vec(),
                range_end: vec![0],
                ..Default::default()
            }
        })
        .unwrap();
    assert_eq!((keys(&r), r.more), (vec!["a".to_string()], true));
}

#[test]
fn range_keys_only_and_count_only() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1");
    put(&s, "b", "2");
    let r = s
        .range(&RangeRequest {
            keys_only: true,
            ..range_all(&s)
        })
        .unwrap();
    assert_eq!(keys(&r), ["a", "b"]);
    assert!(r
        .kvs
        .iter()
        .all(|kv| kv.value.is_empty() && kv.version == 1));
    let r = s
        .range(&RangeRequest {
            count_only: true,
            limit: 1,
            ..range_all(&s)
        })
        .unwrap();
    assert_eq!((r.kvs.len(), r.count, r.more), (0, 2, false));
}

#[test]
fn range_key_ranges() {
    let (_d, _db, s) = temp_store();
    for k in ["a", "ab", "b", "c"] {
        put(&s, k, k);
    }
    let q = |k: &str, e: &[u8]| {
        keys(
            &s.range(&RangeRequest {
                key: k.into(),
                range_end: e.to_vec(),
                ..Default::default()
            })
            .unwrap(),
        )
    };
    assert_eq!(q("a", b""), ["a"]);
    assert_eq!(q("a", b"b"), ["a", "ab"]);
    assert_eq!(q("ab", b"\0"), ["ab", "b", "c"]);
    assert!(q("c", b"a").is_empty());
}

#[test]
fn read_at_compacted_revision_allowed_below_refused_future_refused() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1"); // 2
    put(&s, "a", "2"); // 3
    put(&s, "a", "3"); // 4
    compact(&s, 3).unwrap();
    assert_eq!(s.compacted_revision(), 3);
    assert_eq!(s.get_at(b"a", 3).unwrap().unwrap().value, b"2");
    assert_eq!(s.get_at(b"a", 2), Err(MvccError::Compacted));
    assert_eq!(s.get_at(b"a", 5), Err(MvccError::FutureRev));
    assert_eq!(
        MvccError::Compacted.to_string(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    assert_eq!(
        MvccError::FutureRev.to_string(),
        "etcdserver: mvcc: required revision is a future revision"
    );
    assert_eq!(compact(&s, 3), Err(MvccError::Compacted));
    assert_eq!(compact(&s, 2), Err(MvccError::Compacted));
    assert_eq!(compact(&s, 5), Err(MvccError::FutureRev));
    assert_eq!(
        s.events_since(2, b"a", b"", false, 0),
        Err(MvccError::Compacted)
    );
}

#[test]
fn compaction_keeps_latest_revision_and_drops_tombstoned_keys() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1"); // 2
    put(&s, "a", "2"); // 3
    put(&s, "b", "1"); // 4
    del(&s, "b", ""); // 5
    put(&s, "a", "3"); // 6
    match &compact(&s, 5).unwrap() {
        WriteResponse::Compact(c) => assert_eq!(hdr_rev(&c.header, c), 6),
        r => panic!("{r:?}"),
    }
    assert_eq!(s.current_revision(), 6);
    assert_eq!(s.get_at(b"a", 5).unwrap().unwrap().value, b"2");
    assert_eq!(s.get_at(b"b", 5).unwrap(), None);
    assert_eq!(get(&s, "a").unwrap().value, b"3");
    // History left, once the garbage collector has run: a@3 and a@6 only.
    s.settle();
    let revs: Vec<_> = s
        .dump()
        .map(Result::unwrap)
        .filter(|(t, _, _)| t == REV_TREE)
        .map(|(_, k, _)| Revision::from_bytes(&k).unwrap().main)
        .collect();
    assert_eq!(revs, [3, 6]);
    assert!(s.inner.idx.get_cloned(b"b").is_none());
}

#[test]
fn ignore_value_on_missing_key_is_an_error() {
    let (_d, _db, s) = temp_store();
    let r = one(
        &s,
        WriteRequest::Put(PutRequest {
            key: b"a".to_vec(),
            ignore_value: true,
            ..Default::default()
        }),
    );
    assert_eq!(r, Err(MvccError::KeyNotFound));
    assert_eq!(
        MvccError::KeyNotFound.to_string(),
        "etcdserver: key not found"
    );
    assert_eq!(s.current_revision(), 1);
    put(&s, "a", "v");
    one(&s, grant(7, 60)).unwrap();
    one(
        &s,
        WriteRequest::Put(PutRequest {
            key: b"a".to_vec(),
            ignore_value: true,
            lease: 7,
            ..Default::default()
        }),
    )
    .unwrap();
    let kv = get(&s, "a").unwrap();
    assert_eq!(
        (kv.value.as_slice(), kv.lease, kv.version),
        (&b"v"[..], 7, 2)
    );
    one(
        &s,
        WriteRequest::Put(PutRequest {
            key: b"a".to_vec(),
            value: b"w".to_vec(),
            ignore_lease: true,
            ..Default::default()
        }),
    )
    .unwrap();
    let kv = get(&s, "a").unwrap();
    assert_eq!((kv.value.as_slice(), kv.lease), (&b"w"[..], 7));
}

#[test]
fn failed_txn_changes_nothing() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1");
    // Passes etcd's pre-check (a exists before the txn) but a is gone when the put runs.
    let t = TxnRequest {
        compare: vec![],
        success: vec![
            op_del("a", ""),
            RequestOp {
                request: Some(Request::RequestPut(PutRequest {
                    key: b"a".to_vec(),
                    ignore_value: true,
                    ..Default::default()
                })),
            },
        ],
        failure: vec![],
    };
    assert_eq!(txn(&s, t), Err(MvccError::KeyNotFound));
    assert_eq!(s.current_revision(), 2);
    assert_eq!(get(&s, "a").unwrap().value, b"1");
}

#[test]
fn nested_txn() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1"); // 2
    let inner = TxnRequest {
        // Evaluated before the outer txn runs: "b" does not exist yet.
        compare: vec![cmp_version("b", CompareResult::Equal, 0)],
        success: vec![op_put("c", "from-inner"), op_get("b")],
        failure: vec![op_put("c", "wrong")],
    };
    let outer = TxnRequest {
        compare: vec![cmp_version("a", CompareResult::Greater, 0)],
        success: vec![
            op_put("b", "x"),
            RequestOp {
                request: Some(Request::RequestTxn(inner)),
            },
        ],
        failure: vec![],
    };
    let t = txn(&s, outer).unwrap();
    assert!(t.succeeded);
    assert_eq!(hdr_rev(&t.header, &t), 3);
    let Some(Response::ResponseTxn(it)) = &t.responses[1].response else {
        panic!("{t:?}")
    };
    assert!(it.succeeded);
    assert_eq!(hdr_rev(&it.header, it), 3);
    let Some(Response::ResponseRange(r)) = &it.responses[1].response else {
        panic!("{it:?}")
    };
    assert_eq!(r.kvs[0].value, b"x");
    assert_eq!(get(&s, "c").unwrap().value, b"from-inner");
    assert_eq!(get(&s, "c").unwrap().mod_revision, 3);
    let ev = s.events_since(3, b"a", b"\0", false, 0).unwrap().events;
    assert_eq!(ev.len(), 2);
}

#[test]
fn txn_compares() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1");
    put(&s, "b", "2");
    let run = |c: Compare| {
        txn(
            &s,
            TxnRequest {
                compare: vec![c],
                success: vec![],
                failure: vec![],
            },
        )
        .unwrap()
        .succeeded
    };
    let value = |k: &str, end: &str, r: CompareResult, v: &str| Compare {
        result: r as i32,
        target: CompareTarget::Value as i32,
        key: k.into(),
        range_end: end.into(),
        target_union: Some(TargetUnion::Value(v.into())),
    };
    assert!(run(value("a", "", CompareResult::Equal, "1")));
    assert!(!run(value("zz", "", CompareResult::NotEqual, "1")));
    assert!(run(value("a", "c", CompareResult::Less, "3")));
    assert!(!run(value("a", "c", CompareResult::Greater, "1")));
    assert!(run(cmp_version("zz", CompareResult::Equal, 0)));
    assert!(run(Compare {
        result: CompareResult::Less as i32,
        target: CompareTarget::Mod as i32,
        key: b"a".to_vec(),
        range_end: vec![0],
        target_union: Some(TargetUnion::ModRevision(4)),
    }));
    assert!(run(Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Lease as i32,
        key: b"a".to_vec(),
        range_end: vec![],
        target_union: Some(TargetUnion::Lease(0)),
    }));
}

#[test]
fn check_txn_limits_and_duplicate_keys() {
    let many = |n: usize| (0..n).map(|i| op_get(&format!("k{i}"))).collect::<Vec<_>>();
    let t = |success: Vec<RequestOp>| TxnRequest {
        compare: vec![],
        success,
        failure: vec![],
    };
    assert_eq!(check_txn(&t(many(128)), 128), Ok(()));
    assert_eq!(check_txn(&t(many(129)), 128), Err(MvccError::TooManyOps));
    assert_eq!(
        MvccError::TooManyOps.to_string(),
        "etcdserver: too many operations in txn request"
    );
    // Nested txns get what the parent level leaves.
    let mut outer = many(100);
    outer.push(RequestOp {
        request: Some(Request::RequestTxn(t(many(28)))),
    });
    assert_eq!(
        check_txn(&t(outer.clone()), 128),
        Err(MvccError::TooManyOps)
    );
    outer.pop();
    outer.pop();
    outer.push(RequestOp {
        request: Some(Request::RequestTxn(t(many(28)))),
    });
    assert_eq!(check_txn(&t(outer), 128), Ok(()));

    let dup = Err(MvccError::DuplicateKey);
    assert_eq!(
        check_txn(&t(vec![op_put("a", "1"), op_put("a", "2")]), 128),
        dup
    );
    assert_eq!(
        check_txn(&t(vec![op_del("a", "c"), op_put("b", "2")]), 128),
        dup
    );
    assert_eq!(
        check_txn(&t(vec![op_put("b", "2"), op_del("b", "")]), 128),
        dup
    );
    assert_eq!(
        check_txn(&t(vec![op_del("a", "c"), op_put("c", "2")]), 128),
        Ok(())
    );
    assert_eq!(
        check_txn(&t(vec![op_del("a", "c"), op_del("b", "")]), 128),
        Ok(())
    );
    // etcd's interval tree takes a "\0" range end literally: no conflict.
    assert_eq!(
        check_txn(&t(vec![op_del("a", "\0"), op_put("b", "2")]), 128),
        Ok(())
    );
    let nested = |success, failure| RequestOp {
        request: Some(Request::RequestTxn(TxnRequest {
            compare: vec![],
            success,
            failure,
        })),
    };
    // then/else of one nested txn may put the same key; sibling levels may not.
    assert_eq!(
        check_txn(
            &t(vec![nested(vec![op_put("a", "1")], vec![op_put("a", "2")])]),
            128
        ),
        Ok(())
    );
    assert_eq!(
        check_txn(
            &t(vec![
                op_put("a", "0"),
                nested(vec![op_put("a", "1")], vec![])
            ]),
            128
        ),
        dup
    );
    assert_eq!(
        check_txn(
            &t(vec![
                op_del("a", ""),
                nested(vec![], vec![op_put("a", "1")])
            ]),
            128
        ),
        dup
    );
    assert_eq!(
        check_txn(
            &t(vec![
                nested(vec![op_del("a", "")], vec![]),
                op_put("a", "1")
            ]),
            128
        ),
        dup
    );
    assert_eq!(
        check_txn(&t(vec![op_put("", "1")]), 128),
        Err(MvccError::EmptyKey)
    );
    assert_eq!(
        check_txn(&t(vec![RequestOp { request: None }]), 128),
        Err(MvccError::KeyNotFound)
    );
    assert_eq!(check_put(&put_req("", "x")), Err(MvccError::EmptyKey));
    assert_eq!(
        check_put(&PutRequest {
            key: b"a".to_vec(),
            value: b"x".to_vec(),
            ignore_value: true,
            ..Default::default()
        }),
        Err(MvccError::ValueProvided)
    );
    assert_eq!(
        MvccError::EmptyKey.to_string(),
        "etcdserver: key is not provided"
    );
    assert_eq!(
        MvccError::DuplicateKey.to_string(),
        "etcdserver: duplicate key given in txn request"
    );
}

#[test]
fn atomic_apply_with_meta() {
    let (_d, _db, s) = temp_store();
    let reqs = vec![
        WriteRequest::Put(put_req("a", "1")),
        WriteRequest::Put(PutRequest {
            key: b"zz".to_vec(),
            ignore_value: true,
            ..Default::default()
        }),
        WriteRequest::Put(put_req("b", "2")),
    ];
    let out = s
        .apply(&reqs, &[(b"raft/applied".to_vec(), Some(b"7".to_vec()))])
        .unwrap();
    assert!(matches!(&out[0], Ok(WriteResponse::Put(p)) if hdr_rev(&p.header, p) == 2));
    assert_eq!(out[1], Err(MvccError::KeyNotFound));
    assert!(matches!(&out[2], Ok(WriteResponse::Put(p)) if hdr_rev(&p.header, p) == 3));
    assert_eq!(s.current_revision(), 3);
    assert_eq!(s.get_meta(b"raft/applied").unwrap(), Some(b"7".to_vec()));
    s.apply(&[], &[(b"raft/applied".to_vec(), None)]).unwrap();
    assert_eq!(s.get_meta(b"raft/applied").unwrap(), None);
    assert!(matches!(
        s.apply(&reqs, &[(b"mvcc/x".to_vec(), None)]),
        Err(MvccError::ReservedMetaKey(_))
    ));
    assert_eq!(s.current_revision(), 3);
}

#[test]
fn reopen_and_snapshot_roundtrip() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = MvccStore::open(StoreEngine::open(dir.path()).unwrap()).unwrap();
        put(&s, "a", "1");
        put(&s, "a", "2");
        compact(&s, 2).unwrap();
        s.flush().unwrap();
    }
    let s = MvccStore::open(reopen(dir.path())).unwrap();
    assert_eq!((s.current_revision(), s.compacted_revision()), (3, 2));
    let dump: Vec<_> = s.dump().map(Result::unwrap).collect();

    let (_d2, _db2, s2) = temp_store();
    put(&s2, "junk", "x");
    s2.load(dump, &[]).unwrap();
    assert_eq!((s2.current_revision(), s2.compacted_revision()), (3, 2));
    assert_eq!(get(&s2, "junk"), None);
    assert_eq!(get(&s2, "a").unwrap().version, 2);
    assert_eq!(put(&s2, "a", "3").header.unwrap().revision, 4);
}

/// A snapshot image is the store as it was when taken, although applies go on while it is
/// copied. A compaction applies at once, but the deletion of the history it removed, which
/// the copy still needs, waits for the copy.
#[test]
fn image_is_the_state_when_taken_and_holds_off_compacted_deletes() {
    let (_d, _db, s) = temp_store();
    for i in 0..20 {
        put(&s, &format!("k{}", i % 5), &i.to_string());
    }
    let before: Vec<_> = s.dump().map(Result::unwrap).collect();
    let image = s.image().unwrap();
    for i in 0..10 {
        put(&s, &format!("k{i}"), "later");
    }
    compact(&s, 25).unwrap();
    s.persist_pending().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        s.inner.pending.garbage.has_work(),
        "compacted history was deleted during the copy"
    );
    let copied: Vec<_> = image.entries().map(Result::unwrap).collect();
    assert_eq!(copied, before);
    s.settle();

    let (_d2, _db2, s2) = temp_store();
    s2.load(copied, &[]).unwrap();
    assert_eq!((s2.current_revision(), s2.compacted_revision()), (21, -1));
    assert_eq!(s2.get_at(b"k0", 6).unwrap().unwrap().value, b"0");
    assert_eq!(get(&s2, "k5"), None);
    // The store itself moved on and compacted.
    assert_eq!(s.current_revision(), 31);
    assert_eq!(s.get_at(b"k0", 6).unwrap_err(), MvccError::Compacted);
}

#[test]
fn events_since_limit_does_not_split_a_revision() {
    let (_d, _db, s) = temp_store();
    txn(
        &s,
        TxnRequest {
            compare: vec![],
            success: vec![op_put("a", "1"), op_put("b", "1")],
            failure: vec![],
        },
    )
    .unwrap(); // 2
    put(&s, "c", "1"); // 3
    let ev = s.events_since(0, b"a", b"\0", false, 1).unwrap();
    assert_eq!(ev.events.len(), 2);
    assert_eq!(ev.next_revision, 3);
    let ev = s.events_since(3, b"a", b"\0", false, 1).unwrap();
    assert_eq!((ev.events.len(), ev.next_revision), (1, 4));
}

#[test]
fn concurrent_reads_are_consistent_with_their_revision() {
    let (_d, _db, s) = temp_store();
    // Every put of "k" stores its own revision as value; "j" is deleted and re-put so
    // compaction has tombstones to drop.
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            for i in 0..300i64 {
                let rev = s.current_revision() + 1;
                s.apply(&[WriteRequest::Put(put_req("k", &rev.to_string()))], &[])
                    .unwrap();
                if i % 3 == 0 {
                    put(&s, "j", "x");
                    del(&s, "j", "");
                }
                if i % 25 == 24 {
                    compact(&s, s.current_revision() - 2).unwrap();
                }
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                // Every checked read counts, compacted ones too: once the writer is done, the
                // last compaction leaves some of these offsets compacted for good, and a loop
                // that counted only found values never ended.
                let mut reads = 0;
                while reads < 2000 {
                    let cur = s.current_revision();
                    // Below 6, `cur - 4` could be 0 or less, which a range reads as "current".
                    if cur < 6 {
                        continue;
                    }
                    let at = cur - (reads % 5);
                    match s.get_at(b"k", at) {
                        Ok(Some(kv)) => {
                            assert!(kv.mod_revision <= at);
                            assert_eq!(kv.value, kv.mod_revision.to_string().into_bytes());
                        }
                        Ok(None) => assert!(at < 2),
                        Err(MvccError::Compacted) => assert!(at < s.compacted_revision()),
                        Err(e) => panic!("{e}"),
                    }
                    reads += 1;
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
}

/// Persists move applied writes from the pending buffer to the engine while readers run: no
/// read may miss a write in between (the buffer drops a layer only after the engine has it).
/// Each put creates a new key, so a listing at revision R holds R - 1 keys and the history from 2
/// holds R - 1 events.
#[test]
fn reads_see_every_write_while_persists_move_it_to_the_engine() {
    let (_d, _db, s) = temp_store();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            for n in 0..1500 {
                put(&s, &format!("c/{n:05}"), "v");
            }
        })
    };
    let committer = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                s.persist_pending().unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut reads = 0;
                loop {
                    let finished = s.current_revision() == 1501;
                    let r = s
                        .range(&RangeRequest {
                            key: b"c/".to_vec(),
                            range_end: b"c0".to_vec(),
                            ..Default::default()
                        })
                        .unwrap();
                    let rev = r.header.unwrap().revision;
                    assert_eq!(r.kvs.len() as i64, rev - 1, "listing after {reads} reads");
                    let ev = s.events_since(2, b"c/", b"c0", false, 0).unwrap();
                    assert_eq!(ev.events.len() as i64, ev.next_revision - 2, "history");
                    reads += 1;
                    if finished {
                        return reads;
                    }
                }
            })
        })
        .collect();
    writer.join().unwrap();
    let reads: i32 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    committer.join().unwrap();
    assert!(reads >= 4, "{reads} reads");
    // Everything reached the engine and survives a reopen.
    s.flush().unwrap();
    assert_eq!(
        s.dump()
            .filter(|i| i.as_ref().unwrap().0 == REV_TREE)
            .count(),
        1500
    );
}

/// Applies that outrun the engine do not grow the pending buffer without bound: the apply
/// that fills it persists it.
#[test]
fn pending_buffer_is_bounded_when_applies_outrun_persists() {
    let (_d, _db, s) = temp_store();
    let batch = 150;
    for b in 0..100 {
        let reqs: Vec<_> = (0..batch)
            .map(|k| WriteRequest::Put(put_req(&format!("b/{b:03}/{k:03}"), "v")))
            .collect();
        s.apply(&reqs, &[]).unwrap();
        let held = s.inner.pending.len();
        assert!(
            held < pending::MAX_PENDING + batch + 8,
            "{held} writes pending"
        );
    }
    assert_eq!(s.current_revision(), 1 + 100 * batch as i64);
}

/// While the engine fails, applied writes stay readable and the committer keeps retrying; a
/// full buffer fails the apply rather than growing, and a persist after the engine recovers
/// writes all.
#[test]
fn failing_persists_keep_writes_readable_and_a_full_buffer_fails_the_apply() {
    let (_d, db, s) = temp_store();
    let fail = |on: bool| {
        s.inner
            .pending
            .fail_persists
            .store(on, std::sync::atomic::Ordering::SeqCst)
    };
    fail(true);
    put(&s, "a", "1");
    assert!(s.persist_pending().is_err());
    assert_eq!(get(&s, "a").unwrap().value, b"1");
    let batch = 150;
    let mut failed = None;
    for b in 0..200 {
        let reqs: Vec<_> = (0..batch)
            .map(|k| WriteRequest::Put(put_req(&format!("b/{b:03}/{k:03}"), "v")))
            .collect();
        if let Err(e) = s.apply(&reqs, &[]) {
            failed = Some(e);
            break;
        }
    }
    match failed {
        Some(MvccError::Storage(m)) => {
            let cause = std::error::Error::source(&m).expect("the persist failure is the cause");
            let cause = cause.downcast_ref::<MvccError>().expect("an MvccError");
            assert_eq!(cause, &MvccError::corrupt("injected persist failure"));
        }
        other => panic!("a full buffer with failing persists must fail the apply: {other:?}"),
    }
    assert!(s.inner.pending.len() < pending::MAX_PENDING + batch + 8);
    assert_eq!(get(&s, "a").unwrap().value, b"1");

    fail(false);
    s.persist_pending().unwrap();
    assert_eq!(s.inner.pending.len(), 0);
    let stored = db.iter(engine::Tree::Rev).count();
    assert_eq!(stored as i64, s.current_revision() - 1);
}

fn grant(id: i64, ttl: i64) -> WriteRequest {
    WriteRequest::LeaseGrant(LeaseGrantRequest { id, ttl })
}

fn revoke(id: i64) -> WriteRequest {
    WriteRequest::LeaseRevoke(LeaseRevokeRequest { id })
}

fn put_lease(k: &str, lease: i64) -> WriteRequest {
    WriteRequest::Put(PutRequest {
        key: k.into(),
        value: b"v".to_vec(),
        lease,
        ..Default::default()
    })
}

/// A revoke visits the keys of its lease, not every live key: with many keys in the store,
/// revoking leases in a loop must not stall the applier.
#[test]
fn a_revoke_visits_only_the_keys_of_its_lease() {
    let (_d, _db, s) = temp_store();
    let reqs: Vec<_> = (0..5000)
        .map(|i| WriteRequest::Put(put_req(&format!("k{i:05}"), "v")))
        .collect();
    s.apply(&reqs, &[]).unwrap();
    one(&s, grant(9, 10)).unwrap();
    one(&s, grant(8, 10)).unwrap();
    one(&s, put_lease("k00007", 9)).unwrap();
    one(&s, put_lease("z", 9)).unwrap();
    let visited = || super::index::mem::tests::VISITED.with(|v| v.get());
    let before = visited();
    one(&s, revoke(8)).unwrap();
    one(&s, revoke(9)).unwrap();
    assert_eq!(s.lease_keys(9), Vec::<Vec<u8>>::new());
    assert_eq!(get(&s, "z"), None);
    let n = visited() - before;
    assert!(n <= 8, "two revokes visited {n} keys of the index");
}

#[test]
fn lease_grant_put_and_revoke_in_one_revision() {
    let (_d, _db, s) = temp_store();
    one(&s, grant(5, 10)).unwrap();
    assert_eq!(one(&s, grant(5, 20)), Err(MvccError::LeaseExists));
    assert_eq!(s.lease_ttl(5).unwrap(), Some(10));
    one(&s, put_lease("a", 5)).unwrap();
    one(&s, put_lease("b", 5)).unwrap();
    put(&s, "c", "x");
    assert_eq!(s.lease_keys(5), vec![b"a".to_vec(), b"b".to_vec()]);
    let before = s.current_revision();
    match one(&s, revoke(5)).unwrap() {
        WriteResponse::LeaseRevoke(r) => assert_eq!(r.header.unwrap().revision, before + 1),
        r => panic!("{r:?}"),
    }
    let ev = s.events_since(before + 1, b"\0", b"\0", false, 0).unwrap();
    assert_eq!(ev.events.len(), 2);
    assert!(ev
        .events
        .iter()
        .all(|e| e.kv.as_ref().unwrap().mod_revision == before + 1));
    assert_eq!(s.lease_ttl(5).unwrap(), None);
    assert!(s.get_at(b"a", 0).unwrap().is_none());
    assert!(s.get_at(b"c", 0).unwrap().is_some());
    assert_eq!(one(&s, revoke(5)), Err(MvccError::LeaseNotFound));
}

#[test]
fn revoking_a_lease_without_keys_keeps_the_revision() {
    let (_d, _db, s) = temp_store();
    one(&s, grant(1, 10)).unwrap();
    let rev = s.current_revision();
    one(&s, revoke(1)).unwrap();
    assert_eq!(s.current_revision(), rev);
    assert!(s.leases().unwrap().is_empty());
}

#[test]
fn put_with_missing_lease_fails_also_in_txn() {
    let (_d, _db, s) = temp_store();
    assert_eq!(one(&s, put_lease("a", 9)), Err(MvccError::LeaseNotFound));
    let t = TxnRequest {
        success: vec![RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: b"a".to_vec(),
                lease: 9,
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    assert_eq!(txn(&s, t), Err(MvccError::LeaseNotFound));
    assert_eq!(s.current_revision(), 1);
}

#[test]
fn lease_attachment_follows_the_key() {
    let (_d, _db, s) = temp_store();
    one(&s, grant(1, 10)).unwrap();
    one(&s, grant(2, 10)).unwrap();
    one(&s, put_lease("a", 1)).unwrap();
    one(&s, put_lease("b", 1)).unwrap();
    one(&s, put_lease("c", 1)).unwrap();
    // Moved to another lease, detached by a plain put, kept by ignore_lease, deleted.
    one(&s, put_lease("a", 2)).unwrap();
    put(&s, "b", "plain");
    one(
        &s,
        WriteRequest::Put(PutRequest {
            key: b"c".to_vec(),
            value: b"new".to_vec(),
            ignore_lease: true,
            ..Default::default()
        }),
    )
    .unwrap();
    assert_eq!(s.get_at(b"c", 0).unwrap().unwrap().lease, 1);
    assert_eq!(s.lease_keys(1), vec![b"c".to_vec()]);
    del(&s, "c", "");
    assert!(s.lease_keys(1).is_empty());
    one(&s, revoke(1)).unwrap();
    assert!(s.get_at(b"b", 0).unwrap().is_some());
    assert_eq!(s.lease_keys(2), vec![b"a".to_vec()]);
}

#[test]
fn a_batch_sees_its_own_grants_and_revokes() {
    let (_d, _db, s) = temp_store();
    let out = s
        .apply(
            &[
                grant(3, 5),
                put_lease("k", 3),
                revoke(3),
                put_lease("k2", 3),
            ],
            &[],
        )
        .unwrap();
    assert!(out[..3].iter().all(|r| r.is_ok()), "{out:?}");
    assert_eq!(out[3], Err(MvccError::LeaseNotFound));
    assert!(s.get_at(b"k", 0).unwrap().is_none());
    assert!(s.leases().unwrap().is_empty());
    // Leases are part of the snapshot dump.
    one(&s, grant(4, 7)).unwrap();
    let dump: Vec<_> = s.dump().collect::<Result<_, _>>().unwrap();
    let (_d2, _db2, s2) = temp_store();
    s2.load(dump, &[]).unwrap();
    assert_eq!(s2.leases().unwrap(), vec![(4, 7)]);
}

/// The writes replayed by `range_sort_ties_match_etcd`; each inner list is one txn of puts
/// (so several keys can share a create or mod revision). Prefixes a/ (10 keys), b/ (30),
/// c/ (120) and d/ (60) get the same pattern: creates in a scrambled order three per txn,
/// values v0..v4 with many duplicates, then 0..3 updates per key (versions 1..4 tie a
/// lot) four per txn. d/ then gets one put per key (two per txn for some) in nearly key
/// order, then one more txn updating every 7th key.
fn etcd_tie_writes() -> Vec<Vec<(String, String)>> {
    let mut out: Vec<Vec<(String, String)>> = Vec::new();
    for (prefix, n) in [("a/", 10usize), ("b/", 30), ("c/", 120), ("d/", 60)] {
        let key = |i: usize| format!("{prefix}{i:03}");
        let order: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % n).collect();
        for c in order.chunks(3) {
            out.push(
                c.iter()
                    .map(|&i| (key(i), format!("v{}", (i * i) % 5)))
                    .collect(),
            );
        }
        for r in 1..4 {
            let ks: Vec<usize> = (0..n).rev().filter(|i| i % 4 >= r).collect();
            for c in ks.chunks(4) {
                out.push(
                    c.iter()
                        .map(|&i| (key(i), format!("v{}", (i * 3 + r) % 5)))
                        .collect(),
                );
            }
        }
    }
    let key = |i: usize| format!("d/{i:03}");
    let mut order: Vec<usize> = (0..60).collect();
    for p in [10, 30, 45] {
        order.swap(p, p + 1);
    }
    order.retain(|&i| i != 50);
    order.push(50);
    let mut c = 0;
    while c < order.len() {
        let n = if order[c] % 9 == 4 { 2 } else { 1 };
        let end = (c + n).min(order.len());
        out.push(
            order[c..end]
                .iter()
                .map(|&i| (key(i), format!("v{}", i % 3)))
                .collect(),
        );
        c = end;
    }
    out.push(
        (0..60)
            .step_by(7)
            .map(|i| (key(i), format!("v{}", i % 2)))
            .collect(),
    );
    out
}

/// Key orders (key suffix numbers) returned by a real etcd 3.4.23 (Debian etcd-server,
/// built with go1.19.8) after the writes of `etcd_tie_writes`, captured with
/// `ETCDCTL_API=3 etcdctl get --prefix <prefix> --sort-by=<TARGET> --order=<ORDER> -w json`.
/// Ties come out in the order of Go's unstable pdqsort (`sort.Sort`).
#[rustfmt::skip]
const ETCD_TIE_ORDERS: &[(&str, SortTarget, SortOrder, &[u16])] = &[
    (
        "a/",
        SortTarget::Version,
        SortOrder::Ascend,
        &[0, 4, 8, 1, 5, 9, 2, 6, 3, 7],
    ),
    (
        "a/",
        SortTarget::Version,
        SortOrder::Descend,
        &[3, 7, 2, 6, 1, 5, 9, 0, 4, 8],
    ),
    (
        "a/",
        SortTarget::Create,
        SortOrder::Ascend,
        &[0, 3, 7, 1, 4, 8, 2, 5, 9, 6],
    ),
    (
        "a/",
        SortTarget::Create,
        SortOrder::Descend,
        &[6, 2, 5, 9, 1, 4, 8, 0, 3, 7],
    ),
    (
        "a/",
        SortTarget::Mod,
        SortOrder::Ascend,
        &[0, 4, 8, 5, 9, 1, 2, 6, 3, 7],
    ),
    (
        "a/",
        SortTarget::Mod,
        SortOrder::Descend,
        &[3, 7, 2, 6, 1, 5, 9, 4, 8, 0],
    ),
    (
        "a/",
        SortTarget::Value,
        SortOrder::Ascend,
        &[0, 6, 4, 5, 3, 2, 9, 1, 7, 8],
    ),
    (
        "a/",
        SortTarget::Value,
        SortOrder::Descend,
        &[1, 7, 8, 2, 9, 3, 4, 5, 0, 6],
    ),
    (
        "b/",
        SortTarget::Version,
        SortOrder::Ascend,
        &[8, 4, 0, 28, 16, 12, 20, 24, 25, 9, 21, 1, 5, 13, 29, 17, 14, 6, 18, 2, 26, 10, 22, 11, 7, 23, 15, 27, 3, 19],
    ),
    (
        "b/",
        SortTarget::Version,
        SortOrder::Descend,
        &[7, 27, 23, 3, 19, 15, 11, 14, 2, 26, 10, 6, 22, 18, 9, 13, 29, 17, 1, 25, 5, 21, 20, 8, 24, 4, 0, 12, 28, 16],
    ),
    (
        "b/",
        SortTarget::Create,
        SortOrder::Ascend,
        &[17, 3, 10, 8, 1, 24, 29, 22, 15, 13, 6, 20, 11, 27, 4, 25, 2, 18, 9, 16, 23, 14, 0, 7, 21, 28, 5, 19, 12, 26],
    ),
    (
        "b/",
        SortTarget::Create,
        SortOrder::Descend,
        &[12, 26, 19, 28, 21, 5, 7, 14, 0, 23, 9, 16, 2, 25, 18, 11, 27, 4, 13, 6, 20, 22, 15, 29, 24, 8, 1, 3, 17, 10],
    ),
    (
        "b/",
        SortTarget::Mod,
        SortOrder::Ascend,
        &[24, 8, 20, 4, 16, 0, 28, 12, 25, 29, 21, 17, 13, 9, 5, 1, 22, 26, 14, 18, 10, 6, 2, 19, 15, 23, 27, 11, 7, 3],
    ),
    (
        "b/",
        SortTarget::Mod,
        SortOrder::Descend,
        &[3, 7, 11, 27, 23, 19, 15, 2, 10, 6, 14, 18, 26, 22, 1, 5, 9, 13, 17, 21, 25, 29, 12, 28, 0, 16, 4, 20, 24, 8],
    ),
    (
        "b/",
        SortTarget::Value,
        SortOrder::Ascend,
        &[6, 20, 19, 13, 0, 26, 18, 5, 25, 16, 4, 11, 24, 10, 17, 3, 23, 22, 15, 9, 2, 29, 14, 21, 12, 8, 7, 27, 28, 1],
    ),
    (
        "b/",
        SortTarget::Value,
        SortOrder::Descend,
        &[14, 8, 28, 27, 21, 1, 12, 7, 2, 15, 9, 29, 22, 17, 10, 3, 23, 24, 18, 4, 16, 5, 25, 11, 19, 20, 13, 26, 6, 0],
    ),
    (
        "c/",
        SortTarget::Version,
        SortOrder::Ascend,
        &[76, 0, 64, 116, 28, 56, 68, 112, 8, 52, 72, 108, 12, 48, 60, 104, 16, 44, 80, 100, 20, 40, 84, 96, 24, 36, 88, 92, 32, 4, 61, 57, 1, 33, 93, 85, 25, 37, 97, 81, 21, 41, 101, 89, 17, 77, 105, 73, 13, 49, 109, 69, 9, 53, 113, 65, 5, 29, 117, 45, 30, 90, 62, 118, 58, 2, 66, 114, 54, 6, 70, 110, 50, 10, 74, 106, 46, 14, 78, 102, 42, 18, 82, 98, 38, 22, 86, 94, 34, 26, 59, 91, 27, 31, 87, 95, 23, 35, 83, 99, 19, 39, 79, 103, 15, 43, 75, 107, 11, 47, 71, 111, 7, 51, 67, 115, 3, 55, 63, 119],
    ),
    (
        "c/",
        SortTarget::Version,
        SortOrder::Descend,
        &[31, 119, 115, 3, 111, 107, 103, 7, 99, 95, 91, 11, 87, 83, 79, 15, 75, 71, 67, 19, 63, 59, 55, 23, 51, 47, 43, 27, 39, 35, 90, 62, 118, 2, 34, 114, 110, 106, 38, 6, 102, 98, 42, 26, 30, 94, 46, 10, 86, 82, 50, 14, 78, 74, 54, 22, 70, 18, 58, 66, 97, 25, 1, 117, 33, 65, 21, 57, 29, 69, 113, 17, 109, 73, 53, 5, 37, 77, 105, 101, 41, 81, 49, 13, 9, 85, 45, 93, 61, 89, 88, 52, 92, 12, 48, 84, 96, 44, 80, 8, 100, 24, 40, 28, 104, 0, 76, 16, 108, 72, 36, 4, 112, 56, 68, 64, 116, 20, 32, 60],
    ),
    (
        "c/",
        SortTarget::Create,
        SortOrder::Ascend,
        &[10, 3, 17, 24, 31, 38, 52, 59, 45, 66, 73, 80, 94, 101, 87, 115, 108, 2, 9, 23, 16, 37, 30, 44, 58, 51, 65, 79, 72, 86, 100, 107, 93, 1, 114, 8, 29, 15, 22, 36, 43, 50, 64, 57, 71, 78, 92, 85, 99, 113, 106, 0, 14, 7, 35, 28, 21, 56, 42, 49, 77, 63, 70, 91, 98, 84, 119, 105, 112, 20, 6, 13, 41, 27, 34, 62, 48, 55, 76, 83, 69, 90, 104, 97, 118, 5, 111, 19, 26, 12, 33, 40, 47, 68, 54, 61, 82, 89, 75, 96, 103, 110, 11, 117, 4, 32, 25, 18, 39, 46, 53, 60, 67, 74, 95, 88, 81, 109, 102, 116],
    ),
    (
        "c/",
        SortTarget::Create,
        SortOrder::Descend,
        &[116, 109, 102, 81, 88, 95, 67, 74, 60, 46, 53, 39, 25, 18, 32, 11, 4, 117, 103, 96, 110, 82, 75, 89, 61, 68, 54, 47, 33, 40, 12, 26, 19, 111, 5, 118, 90, 104, 97, 69, 76, 83, 48, 62, 55, 41, 27, 34, 20, 13, 6, 105, 112, 119, 91, 84, 98, 77, 63, 70, 49, 42, 56, 35, 28, 21, 7, 0, 14, 113, 99, 106, 78, 92, 85, 71, 64, 57, 36, 50, 43, 15, 22, 29, 8, 1, 114, 107, 100, 93, 72, 79, 86, 58, 65, 51, 30, 37, 44, 16, 9, 23, 108, 2, 115, 94, 87, 101, 66, 80, 73, 59, 45, 52, 31, 24, 38, 10, 3, 17],
    ),
    (
        "c/",
        SortTarget::Mod,
        SortOrder::Ascend,
        &[24, 52, 80, 108, 16, 44, 72, 100, 8, 36, 64, 92, 0, 28, 56, 84, 112, 20, 48, 76, 104, 12, 40, 68, 96, 4, 32, 60, 88, 116, 117, 113, 109, 105, 101, 97, 89, 93, 85, 81, 73, 77, 69, 65, 57, 61, 53, 49, 45, 41, 37, 33, 29, 25, 21, 17, 9, 13, 5, 1, 114, 118, 110, 106, 98, 102, 90, 94, 86, 82, 74, 78, 66, 70, 62, 58, 54, 50, 42, 46, 38, 34, 26, 30, 22, 18, 14, 10, 6, 2, 107, 115, 119, 111, 99, 91, 95, 103, 87, 75, 83, 79, 71, 63, 59, 67, 51, 47, 55, 43, 31, 27, 35, 39, 15, 11, 19, 23, 7, 3],
    ),
    (
        "c/",
        SortTarget::Mod,
        SortOrder::Descend,
        &[7, 3, 15, 11, 19, 23, 39, 31, 27, 35, 43, 47, 55, 51, 59, 71, 67, 63, 75, 87, 79, 83, 95, 91, 99, 103, 115, 111, 107, 119, 6, 2, 10, 14, 18, 22, 30, 26, 38, 34, 46, 42, 50, 54, 58, 62, 66, 70, 78, 74, 86, 82, 90, 94, 102, 98, 110, 106, 114, 118, 1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 61, 57, 65, 69, 73, 77, 81, 85, 89, 93, 97, 101, 105, 109, 113, 117, 116, 88, 60, 32, 4, 96, 68, 40, 12, 104, 76, 48, 20, 112, 84, 56, 28, 0, 92, 64, 36, 8, 100, 72, 44, 16, 108, 80, 52, 24],
    ),
    (
        "c/",
        SortTarget::Value,
        SortOrder::Ascend,
        &[86, 40, 26, 53, 59, 46, 6, 113, 66, 106, 73, 119, 39, 13, 100, 99, 79, 33, 80, 19, 20, 0, 93, 60, 116, 118, 24, 91, 44, 84, 96, 31, 18, 98, 16, 78, 36, 25, 38, 76, 11, 105, 71, 111, 85, 45, 5, 65, 64, 56, 4, 51, 58, 104, 30, 37, 117, 57, 3, 50, 110, 10, 103, 63, 17, 97, 43, 23, 90, 83, 70, 77, 102, 95, 2, 75, 115, 42, 35, 49, 109, 9, 82, 69, 29, 62, 55, 15, 22, 89, 12, 92, 61, 88, 94, 41, 21, 47, 48, 87, 14, 101, 27, 28, 1, 67, 81, 107, 108, 32, 34, 8, 112, 7, 114, 72, 52, 54, 74, 68],
    ),
    (
        "c/",
        SortTarget::Value,
        SortOrder::Descend,
        &[87, 34, 47, 52, 114, 112, 54, 7, 8, 88, 108, 107, 12, 41, 61, 67, 101, 68, 94, 92, 1, 21, 14, 72, 32, 48, 81, 27, 28, 74, 2, 82, 22, 62, 89, 35, 69, 29, 15, 95, 42, 102, 9, 55, 109, 115, 49, 75, 90, 37, 50, 117, 3, 110, 10, 43, 103, 57, 97, 17, 23, 83, 77, 63, 30, 70, 25, 5, 118, 36, 65, 71, 51, 116, 31, 64, 76, 45, 78, 4, 38, 96, 111, 44, 84, 85, 11, 24, 105, 104, 56, 91, 16, 98, 18, 58, 80, 59, 93, 99, 100, 19, 13, 0, 20, 60, 106, 86, 40, 6, 53, 46, 26, 113, 79, 39, 73, 33, 66, 119],
    ),
    (
        "d/",
        SortTarget::Version,
        SortOrder::Ascend,
        &[44, 40, 12, 24, 4, 32, 36, 52, 8, 20, 48, 16, 25, 37, 29, 41, 45, 17, 28, 1, 9, 53, 33, 5, 56, 13, 0, 57, 30, 50, 26, 58, 2, 22, 34, 54, 21, 6, 38, 49, 18, 10, 46, 51, 47, 43, 42, 59, 15, 39, 19, 11, 14, 27, 31, 55, 3, 23, 35, 7],
    ),
    (
        "d/",
        SortTarget::Version,
        SortOrder::Descend,
        &[7, 35, 42, 39, 51, 47, 43, 55, 19, 3, 59, 11, 31, 27, 14, 15, 23, 30, 34, 58, 2, 21, 22, 54, 50, 49, 26, 46, 18, 6, 38, 10, 28, 45, 1, 17, 57, 37, 0, 9, 56, 41, 53, 29, 25, 33, 13, 5, 48, 44, 24, 4, 52, 8, 16, 20, 40, 36, 12, 32],
    ),
    (
        "d/",
        SortTarget::Create,
        SortOrder::Ascend,
        &[3, 17, 10, 31, 38, 24, 45, 59, 52, 20, 6, 13, 27, 41, 34, 2, 48, 55, 16, 23, 9, 44, 37, 30, 5, 58, 51, 26, 19, 12, 47, 33, 40, 54, 1, 8, 15, 29, 22, 43, 36, 50, 4, 57, 11, 32, 18, 25, 46, 39, 53, 0, 7, 14, 28, 35, 21, 49, 56, 42],
    ),
    (
        "d/",
        SortTarget::Create,
        SortOrder::Descend,
        &[42, 56, 49, 35, 28, 21, 14, 0, 7, 39, 46, 53, 18, 25, 32, 57, 4, 11, 36, 50, 43, 22, 15, 29, 1, 54, 8, 40, 33, 47, 26, 19, 12, 5, 51, 58, 30, 44, 37, 9, 16, 23, 48, 2, 55, 34, 41, 27, 20, 13, 6, 45, 52, 59, 24, 31, 38, 17, 10, 3],
    ),
    (
        "d/",
        SortTarget::Mod,
        SortOrder::Ascend,
        &[1, 2, 3, 4, 5, 6, 8, 9, 11, 10, 12, 13, 15, 16, 17, 18, 19, 20, 22, 23, 24, 25, 26, 27, 29, 30, 31, 32, 33, 34, 36, 37, 38, 39, 41, 40, 43, 44, 46, 45, 47, 48, 51, 52, 53, 54, 55, 57, 59, 58, 50, 21, 49, 42, 35, 0, 56, 7, 28, 14],
    ),
    (
        "d/",
        SortTarget::Mod,
        SortOrder::Descend,
        &[49, 42, 0, 28, 14, 35, 7, 21, 56, 50, 58, 59, 57, 55, 54, 53, 52, 51, 48, 47, 45, 46, 44, 43, 41, 40, 39, 38, 37, 36, 34, 33, 32, 31, 30, 29, 27, 26, 25, 24, 23, 22, 20, 19, 18, 17, 16, 15, 13, 12, 10, 11, 9, 8, 6, 5, 4, 3, 2, 1],
    ),
    (
        "d/",
        SortTarget::Value,
        SortOrder::Ascend,
        &[24, 57, 56, 3, 54, 51, 6, 48, 45, 9, 42, 39, 12, 36, 14, 15, 33, 0, 18, 30, 28, 27, 31, 16, 22, 25, 58, 21, 1, 55, 19, 4, 52, 43, 34, 35, 13, 37, 49, 7, 40, 46, 10, 41, 44, 8, 23, 47, 11, 38, 50, 5, 32, 53, 17, 29, 2, 20, 26, 59],
    ),
    (
        "d/",
        SortTarget::Value,
        SortOrder::Descend,
        &[17, 59, 2, 53, 50, 5, 47, 44, 8, 41, 38, 11, 32, 29, 26, 23, 20, 46, 10, 19, 16, 21, 22, 1, 58, 25, 55, 52, 4, 13, 49, 31, 7, 43, 34, 35, 40, 37, 28, 30, 36, 9, 42, 33, 12, 45, 0, 6, 48, 39, 18, 51, 27, 3, 54, 14, 56, 57, 24, 15],
    ),
];

#[test]
fn range_sort_ties_match_etcd() {
    let (_d, _db, s) = temp_store();
    for group in etcd_tie_writes() {
        let success = group.iter().map(|(k, v)| op_put(k, v)).collect();
        txn(
            &s,
            TxnRequest {
                compare: vec![],
                success,
                failure: vec![],
            },
        )
        .unwrap();
    }
    let get = |prefix: &str, target: SortTarget, order: SortOrder| -> Vec<u16> {
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        let r = s
            .range(&RangeRequest {
                key: prefix.into(),
                range_end: end,
                sort_target: target as i32,
                sort_order: order as i32,
                ..Default::default()
            })
            .unwrap();
        keys(&r).iter().map(|k| k[2..].parse().unwrap()).collect()
    };
    for (prefix, n) in [("a/", 10u16), ("b/", 30), ("c/", 120), ("d/", 60)] {
        let asc: Vec<u16> = (0..n).collect();
        assert_eq!(get(prefix, SortTarget::Key, SortOrder::Ascend), asc);
        let desc: Vec<u16> = (0..n).rev().collect();
        assert_eq!(get(prefix, SortTarget::Key, SortOrder::Descend), desc);
    }
    for &(prefix, target, order, want) in ETCD_TIE_ORDERS {
        assert_eq!(
            get(prefix, target, order),
            want,
            "{prefix} {target:?} {order:?}"
        );
    }
}

/// The key index lives in memory: a reopened store must rebuild the same generations
/// (deleted-and-recreated keys, compacted history) from the history tree.
#[test]
fn reopen_rebuilds_the_key_index() {
    let dir = tempfile::tempdir().unwrap();
    let read_all = |s: &MvccStore| -> Vec<Option<KeyValue>> {
        let mut out = Vec::new();
        for rev in 4..=s.current_revision() {
            for k in ["a", "b", "c"] {
                out.push(s.get_at(k.as_bytes(), rev).unwrap());
            }
        }
        out
    };
    let before = {
        let s = MvccStore::open(StoreEngine::open(dir.path()).unwrap()).unwrap();
        put(&s, "a", "1"); // 2
        put(&s, "b", "1"); // 3
        del(&s, "a", ""); // 4
        put(&s, "a", "2"); // 5
        put(&s, "c", "1"); // 6
        del(&s, "b", ""); // 7
        put(&s, "a", "3"); // 8
        compact(&s, 4).unwrap();
        s.flush().unwrap();
        read_all(&s)
    };
    let s = MvccStore::open(reopen(dir.path())).unwrap();
    assert_eq!(read_all(&s), before);
    let a = get(&s, "a").unwrap();
    assert_eq!((a.create_revision, a.version), (5, 2));
    // The compacted tombstone of b's life is gone; b's next life starts a new generation.
    assert_eq!(put(&s, "b", "2").header.unwrap().revision, 9);
    let b = get(&s, "b").unwrap();
    assert_eq!((b.create_revision, b.version), (9, 1));
}

/// A key written many times costs the same per write as a fresh one: the index is not
/// rewritten on each put (it used to be, making a hot key O(history) per write).
#[test]
fn hot_key_history_stays_readable() {
    let (_d, _db, s) = temp_store();
    for i in 0..5000 {
        put(&s, "hot", &i.to_string());
    }
    assert_eq!(get(&s, "hot").unwrap().version, 5000);
    assert_eq!(s.get_at(b"hot", 2).unwrap().unwrap().value, b"0");
    assert_eq!(s.get_at(b"hot", 2501).unwrap().unwrap().value, b"2499");
}

/// A persist between the two reads of `leases()` must not hide the persisted batch, as it
/// would if the engine were read before the pending buffer (the batch leaves the buffer after
/// the engine was read). A revoke persisted in between must not resurrect the lease either.
#[test]
fn leases_sees_a_batch_persisted_between_its_reads() {
    let (_d, _db, s) = temp_store();
    one(&s, grant(1, 10)).unwrap();
    s.persist_pending().unwrap();
    let grants: Vec<_> = (2..=100).map(|id| grant(id, 10)).collect();
    s.apply(&grants, &[]).unwrap();
    one(&s, revoke(1)).unwrap();
    let listed = s.leases_between(|| s.persist_pending().unwrap()).unwrap();
    let want: Vec<_> = (2..=100).map(|id| (id, 10)).collect();
    assert_eq!(listed, want);
    assert_eq!(s.leases().unwrap(), want);
}

/// A batched revoke leaves the same store as the single revokes of its live leases in list
/// order: same revisions, same events; unknown and repeated ids change nothing.
#[test]
fn revoke_many_equals_single_revokes_in_order() {
    let setup = |s: &MvccStore| {
        for id in 1..=4 {
            one(s, grant(id, 10)).unwrap();
        }
        for (k, id) in [("a", 3), ("b", 1), ("c", 3), ("d", 4)] {
            one(s, put_lease(k, id)).unwrap();
        }
        put(s, "e", "x");
    };
    let (_d1, _db1, many) = temp_store();
    let (_d2, _db2, single) = temp_store();
    setup(&many);
    setup(&single);
    let from = many.current_revision() + 1;
    let resp = one(&many, WriteRequest::LeaseRevokeMany(vec![3, 9, 2, 1, 3])).unwrap();
    for id in [3, 2, 1] {
        one(&single, revoke(id)).unwrap();
    }
    assert_eq!(
        many.current_revision(),
        from + 1,
        "a revision each for leases 3 and 1"
    );
    assert_eq!(many.current_revision(), single.current_revision());
    match resp {
        WriteResponse::LeaseRevoke(r) => assert_eq!(r.header.unwrap().revision, from + 1),
        r => panic!("{r:?}"),
    }
    let events = |s: &MvccStore| s.events_since(from, b"\0", b"\0", false, 0).unwrap().events;
    assert_eq!(events(&many), events(&single));
    assert_eq!(events(&many).len(), 3);
    assert_eq!(many.leases().unwrap(), vec![(4, 10)]);
    assert_eq!(single.leases().unwrap(), vec![(4, 10)]);
    assert!(get(&many, "d").is_some() && get(&many, "e").is_some());
    assert!(get(&many, "a").is_none() && get(&many, "b").is_none());
}

/// A listing in pages (each page from the key after the last one read, at the first page's
/// revision, as an API server lists) gets on every page the count a full count of the rest
/// of the range finds, with writes and deletes landing between the pages, pages started
/// anywhere, and after a compaction.
#[test]
fn the_pages_of_a_listing_count_what_a_full_count_finds() {
    let (_d, _e, s) = temp_store();
    for i in 0..500 {
        put(&s, &format!("p/{i:04}"), "v");
    }
    for i in (0..500).step_by(7) {
        del(&s, &format!("p/{i:04}"), "");
    }
    let full = |key: &[u8], rev: i64| {
        s.range(&RangeRequest {
            key: key.to_vec(),
            range_end: b"p0".to_vec(),
            revision: rev,
            ..Default::default()
        })
        .unwrap()
        .count
    };
    let page = |key: &[u8], rev: i64, limit: i64| {
        s.range(&RangeRequest {
            key: key.to_vec(),
            range_end: b"p0".to_vec(),
            revision: rev,
            limit,
            ..Default::default()
        })
        .unwrap()
    };
    for round in 0..3 {
        let first = page(b"p/", 0, 40);
        let rev = hdr_rev(&first.header, "first page");
        assert_eq!(first.count, full(b"p/", rev));
        let mut next = first.kvs.last().unwrap().key.clone();
        next.push(0);
        let mut pages = 1;
        loop {
            // Writes between the pages: new keys, deletes, overwrites, inside the range.
            put(&s, &format!("p/{:04}x{round}", pages * 13), "new");
            del(&s, &format!("p/{:04}", pages * 11 % 500), "");
            put(&s, &format!("p/{:04}", pages * 17 % 500), "again");
            let r = page(&next, rev, 40);
            assert_eq!(r.count, full(&next, rev), "page {pages} of round {round}");
            pages += 1;
            if !r.more {
                break;
            }
            next = r.kvs.last().unwrap().key.clone();
            next.push(0);
        }
        assert!(pages > 10);
        // A page started before the last one, and one far ahead: counted right too.
        assert_eq!(page(b"p/0100", rev, 5).count, full(b"p/0100", rev));
        assert_eq!(page(b"p/0450", rev, 5).count, full(b"p/0450", rev));
        assert_eq!(page(b"p/0200", rev, 5).count, full(b"p/0200", rev));
        if round == 1 {
            let cur = s.current_revision();
            compact(&s, cur - 5).unwrap();
        }
    }
}

/// A load derives the key and lease indexes as the history goes in; entries that are not in
/// revision order (no dump writes them so) leave that to a pass over the engine after the
/// load. Both answer every revision as the source does.
#[test]
fn a_load_indexes_in_one_pass_and_out_of_order_history_falls_back() {
    let (_d, _db, s) = temp_store();
    one(&s, grant(5, 60)).unwrap();
    for i in 0..30 {
        put(&s, &format!("k{}", i % 7), &i.to_string());
        if i % 4 == 0 {
            one(&s, put_lease(&format!("l{}", i % 3), 5)).unwrap();
        }
        if i % 9 == 0 {
            del(&s, &format!("k{}", i % 7), "");
        }
    }
    compact(&s, 6).unwrap();
    s.settle();
    let dump: Vec<_> = s.dump().map(Result::unwrap).collect();
    let mut shuffled = dump.clone();
    shuffled.reverse();
    let all = |s: &MvccStore, rev: i64| {
        s.range(&RangeRequest {
            key: vec![0],
            range_end: vec![0],
            revision: rev,
            ..Default::default()
        })
        .map(|r| (r.kvs, r.count))
    };
    for (what, entries) in [("in order", dump), ("reversed", shuffled)] {
        let (_d2, _db2, s2) = temp_store();
        put(&s2, "junk", "x");
        s2.load(entries, &[]).unwrap();
        for rev in 1..=s.current_revision() {
            assert_eq!(all(&s2, rev), all(&s, rev), "{what}: at {rev}");
        }
        assert_eq!(s2.lease_keys(5), s.lease_keys(5), "{what}");
        assert_eq!(s2.lease_keys(5).len(), 3, "{what}");
    }
}
