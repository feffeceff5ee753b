//! Named unit tests for the etcd 3.4 behaviours the store must reproduce.

use super::*;
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::response_op::Response;
use crate::proto::etcdserverpb::{Compare, RequestOp};

pub(super) fn temp_store() -> (tempfile::TempDir, sled::Db, MvccStore) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::Config::new()
        .path(dir.path())
        .flush_every_ms(None)
        .open()
        .unwrap();
    let store = MvccStore::open(&db).unwrap();
    (dir, db, store)
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

fn put(s: &MvccStore, k: &str, v: &str) -> PutResponse {
    match one(s, WriteRequest::Put(put_req(k, v))).unwrap() {
        WriteResponse::Put(p) => p,
        r => panic!("{r:?}"),
    }
}

fn del(s: &MvccStore, k: &str, end: &str) -> DeleteRangeResponse {
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

fn compact(s: &MvccStore, rev: i64) -> Result<WriteResponse, MvccError> {
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
    // History left: a@3 and a@6 only.
    let revs: Vec<_> = s
        .dump()
        .map(Result::unwrap)
        .filter(|(t, _, _)| t == REV_TREE)
        .map(|(_, k, _)| Revision::from_bytes(&k).unwrap().main)
        .collect();
    assert_eq!(revs, [3, 6]);
    assert!(s.inner.idx.get(b"b").unwrap().is_none());
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
        let db = sled::open(dir.path()).unwrap();
        let s = MvccStore::open(&db).unwrap();
        put(&s, "a", "1");
        put(&s, "a", "2");
        compact(&s, 2).unwrap();
        s.flush().unwrap();
    }
    let db = sled::open(dir.path()).unwrap();
    let s = MvccStore::open(&db).unwrap();
    assert_eq!((s.current_revision(), s.compacted_revision()), (3, 2));
    let dump: Vec<_> = s.dump().map(Result::unwrap).collect();

    let (_d2, _db2, s2) = temp_store();
    put(&s2, "junk", "x");
    s2.load(dump).unwrap();
    assert_eq!((s2.current_revision(), s2.compacted_revision()), (3, 2));
    assert_eq!(get(&s2, "junk"), None);
    assert_eq!(get(&s2, "a").unwrap().version, 2);
    assert_eq!(put(&s2, "a", "3").header.unwrap().revision, 4);
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
                let mut ok = 0;
                while ok < 2000 {
                    let cur = s.current_revision();
                    if cur < 2 {
                        continue;
                    }
                    let at = cur - (ok % 5);
                    match s.get_at(b"k", at) {
                        Ok(Some(kv)) => {
                            assert!(kv.mod_revision <= at);
                            assert_eq!(kv.value, kv.mod_revision.to_string().into_bytes());
                            ok += 1;
                        }
                        Ok(None) => assert!(at < 2),
                        Err(MvccError::Compacted) => assert!(at < s.compacted_revision()),
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
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

#[test]
fn lease_grant_put_and_revoke_in_one_revision() {
    let (_d, _db, s) = temp_store();
    one(&s, grant(5, 10)).unwrap();
    assert_eq!(one(&s, grant(5, 20)), Err(MvccError::LeaseExists));
    assert_eq!(s.lease_ttl(5).unwrap(), Some(10));
    one(&s, put_lease("a", 5)).unwrap();
    one(&s, put_lease("b", 5)).unwrap();
    put(&s, "c", "x");
    assert_eq!(s.lease_keys(5).unwrap(), vec![b"a".to_vec(), b"b".to_vec()]);
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
    assert_eq!(s.lease_keys(1).unwrap(), vec![b"c".to_vec()]);
    del(&s, "c", "");
    assert!(s.lease_keys(1).unwrap().is_empty());
    one(&s, revoke(1)).unwrap();
    assert!(s.get_at(b"b", 0).unwrap().is_some());
    assert_eq!(s.lease_keys(2).unwrap(), vec![b"a".to_vec()]);
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
    s2.load(dump).unwrap();
    assert_eq!(s2.leases().unwrap(), vec![(4, 7)]);
}
