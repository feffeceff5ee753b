//! Model-based test: random request streams (batched applies, txns with compares and
//! nested txns, compactions, reads at random revisions, reopening the engine, snapshot
//! round trips) checked against a naive model keeping the full key space per revision.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::key_range::KeyRange;
use super::*;
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::response_op::Response;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, TxnRequest, TxnResponse,
};
use crate::proto::etcdserverpb::{Compare, RequestOp, ResponseHeader, ResponseOp};

type Kvs = BTreeMap<Vec<u8>, KeyValue>;

struct LogEntry {
    main: i64,
    kv: KeyValue,
    delete: bool,
    prev: Option<KeyValue>,
}

/// The whole live key space at every revision; `states[r]` is the state at revision r.
struct Model {
    states: Vec<Kvs>,
    compacted: i64,
    log: Vec<LogEntry>,
}

/// State of one write request being executed by the model.
struct Exec {
    w: Kvs,
    base: i64,
    changes: i64,
    log: Vec<LogEntry>,
}

impl Exec {
    fn view_rev(&self) -> i64 {
        self.base + i64::from(self.changes > 0)
    }
}

fn hdr(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

fn select(m: &Kvs, key: &[u8], end: &[u8]) -> Vec<KeyValue> {
    let kr = KeyRange::new(key, end);
    m.values()
        .filter(|kv| kr.contains(&kv.key))
        .cloned()
        .collect()
}

fn model_range(m: &Kvs, req: &RangeRequest) -> RangeResponse {
    let mut kvs = select(m, &req.key, &req.range_end);
    let count = kvs.len() as i64;
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    if req.sort_order == 0 && !filtered && req.limit > 0 {
        kvs.truncate(req.limit as usize + 1);
    }
    if req.count_only {
        kvs.clear();
    }
    kvs.retain(|kv| {
        (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
            && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
    });
    let target = SortTarget::try_from(req.sort_target).unwrap();
    let mut order = SortOrder::try_from(req.sort_order).unwrap();
    if order == SortOrder::None && target != SortTarget::Key {
        order = SortOrder::Ascend;
    }
    let sort_key = |kv: &KeyValue| -> (i64, Vec<u8>) {
        match target {
            SortTarget::Key => (0, kv.key.clone()),
            SortTarget::Version => (kv.version, vec![]),
            SortTarget::Create => (kv.create_revision, vec![]),
            SortTarget::Mod => (kv.mod_revision, vec![]),
            SortTarget::Value => (0, kv.value.clone()),
        }
    };
    // Go's sort.Sort is not stable; the tie order is whatever its pdqsort produces.
    let less = |a: &KeyValue, b: &KeyValue| sort_key(a) < sort_key(b);
    match order {
        SortOrder::Ascend => super::etcd::gosort::sort_by(&mut kvs, less),
        SortOrder::Descend => super::etcd::gosort::sort_by_reverse(&mut kvs, less),
        SortOrder::None => {}
    }
    let more = req.limit > 0 && kvs.len() as i64 > req.limit;
    if more {
        kvs.truncate(req.limit as usize);
    }
    if req.keys_only {
        kvs.iter_mut().for_each(|kv| kv.value.clear());
    }
    RangeResponse {
        header: None,
        kvs,
        more,
        count,
    }
}

fn model_compare(m: &Kvs, c: &Compare) -> bool {
    let kvs = select(m, &c.key, &c.range_end);
    let target = CompareTarget::try_from(c.target).unwrap();
    let check = |kv: &KeyValue| {
        let ord = match (&c.target_union, target) {
            (Some(TargetUnion::Value(v)), CompareTarget::Value) => kv.value.cmp(v),
            (Some(TargetUnion::Version(v)), CompareTarget::Version) => kv.version.cmp(v),
            (Some(TargetUnion::CreateRevision(v)), CompareTarget::Create) => {
                kv.create_revision.cmp(v)
            }
            (Some(TargetUnion::ModRevision(v)), CompareTarget::Mod) => kv.mod_revision.cmp(v),
            (Some(TargetUnion::Lease(v)), CompareTarget::Lease) => kv.lease.cmp(v),
            _ => unreachable!("generator pairs target and union"),
        };
        match CompareResult::try_from(c.result).unwrap() {
            CompareResult::Equal => ord.is_eq(),
            CompareResult::NotEqual => ord.is_ne(),
            CompareResult::Greater => ord.is_gt(),
            CompareResult::Less => ord.is_lt(),
        }
    };
    if kvs.is_empty() {
        return target != CompareTarget::Value && check(&KeyValue::default());
    }
    kvs.iter().all(check)
}

impl Model {
    fn new() -> Self {
        Model {
            states: vec![Kvs::new(), Kvs::new()],
            compacted: NEVER_COMPACTED,
            log: Vec::new(),
        }
    }

    fn cur(&self) -> i64 {
        self.states.len() as i64 - 1
    }

    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        if req.revision > self.cur() {
            return Err(MvccError::FutureRev);
        }
        let rev = if req.revision <= 0 {
            self.cur()
        } else {
            req.revision
        };
        if rev < self.compacted {
            return Err(MvccError::Compacted);
        }
        Ok(RangeResponse {
            header: hdr(self.cur()),
            ..model_range(&self.states[rev as usize], req)
        })
    }

    fn apply(&mut self, req: &WriteRequest) -> Result<WriteResponse, MvccError> {
        let mut ex = Exec {
            w: self.states.last().unwrap().clone(),
            base: self.cur(),
            changes: 0,
            log: Vec::new(),
        };
        let resp = match req {
            WriteRequest::Put(p) => WriteResponse::Put(self.put(&mut ex, p)?),
            WriteRequest::DeleteRange(d) => {
                let mut r = self.delete(&mut ex, d);
                r.header = hdr(ex.view_rev());
                WriteResponse::DeleteRange(r)
            }
            WriteRequest::Txn(t) => {
                let pre = ex.w.clone();
                let mut path = Vec::new();
                self.path(&pre, t, &mut path);
                self.check(&pre, t, &path, &mut 0, true)?;
                self.check(&pre, t, &path, &mut 0, false)?;
                let mut r = self.exec(&mut ex, t, &path, &mut 0)?;
                r.header = hdr(ex.view_rev());
                WriteResponse::Txn(r)
            }
            WriteRequest::Compact(c) => {
                if c.revision <= self.compacted {
                    return Err(MvccError::Compacted);
                }
                if c.revision > self.cur() {
                    return Err(MvccError::FutureRev);
                }
                self.compacted = c.revision;
                WriteResponse::Compact(CompactionResponse {
                    header: hdr(self.cur()),
                })
            }
            WriteRequest::LeaseGrant(_)
            | WriteRequest::LeaseRevoke(_)
            | WriteRequest::LeaseRevokeMany(_) => {
                unreachable!("the generator makes no lease requests")
            }
        };
        if ex.changes > 0 {
            self.states.push(ex.w);
            self.log.extend(ex.log);
        }
        Ok(resp)
    }

    fn put(&self, ex: &mut Exec, p: &PutRequest) -> Result<PutResponse, MvccError> {
        let prev = ex.w.get(&p.key).cloned();
        if (p.ignore_value || p.ignore_lease) && prev.is_none() {
            return Err(MvccError::KeyNotFound);
        }
        let main = ex.base + 1;
        ex.changes += 1;
        let kv = KeyValue {
            key: p.key.clone(),
            create_revision: prev.as_ref().map_or(main, |k| k.create_revision),
            mod_revision: main,
            version: prev.as_ref().map_or(0, |k| k.version) + 1,
            value: if p.ignore_value {
                prev.as_ref().unwrap().value.clone()
            } else {
                p.value.clone()
            },
            lease: if p.ignore_lease {
                prev.as_ref().unwrap().lease
            } else {
                p.lease
            },
        };
        ex.w.insert(p.key.clone(), kv.clone());
        ex.log.push(LogEntry {
            main,
            kv,
            delete: false,
            prev: prev.clone(),
        });
        Ok(PutResponse {
            header: hdr(main),
            prev_kv: if p.prev_kv { prev } else { None },
        })
    }

    fn delete(&self, ex: &mut Exec, d: &DeleteRangeRequest) -> DeleteRangeResponse {
        let victims = select(&ex.w, &d.key, &d.range_end);
        for v in &victims {
            ex.w.remove(&v.key);
            ex.log.push(LogEntry {
                main: ex.base + 1,
                kv: KeyValue {
                    key: v.key.clone(),
                    mod_revision: ex.base + 1,
                    ..Default::default()
                },
                delete: true,
                prev: Some(v.clone()),
            });
            ex.changes += 1;
        }
        DeleteRangeResponse {
            header: hdr(ex.view_rev()),
            deleted: victims.len() as i64,
            prev_kvs: if d.prev_kv { victims } else { vec![] },
        }
    }

    fn path(&self, pre: &Kvs, t: &TxnRequest, path: &mut Vec<bool>) {
        let ok = t.compare.iter().all(|c| model_compare(pre, c));
        path.push(ok);
        for op in if ok { &t.success } else { &t.failure } {
            if let Some(Request::RequestTxn(n)) = &op.request {
                self.path(pre, n, path);
            }
        }
    }

    fn check(
        &self,
        pre: &Kvs,
        t: &TxnRequest,
        path: &[bool],
        pos: &mut usize,
        puts: bool,
    ) -> Result<(), MvccError> {
        let ok = path[*pos];
        *pos += 1;
        for op in if ok { &t.success } else { &t.failure } {
            match &op.request {
                Some(Request::RequestTxn(n)) => self.check(pre, n, path, pos, puts)?,
                Some(Request::RequestPut(p))
                    if puts && (p.ignore_value || p.ignore_lease) && !pre.contains_key(&p.key) =>
                {
                    return Err(MvccError::KeyNotFound)
                }
                Some(Request::RequestRange(r)) if !puts && r.revision != 0 => {
                    if r.revision > self.cur() {
                        return Err(MvccError::FutureRev);
                    }
                    if r.revision < self.compacted {
                        return Err(MvccError::Compacted);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn exec(
        &self,
        ex: &mut Exec,
        t: &TxnRequest,
        path: &[bool],
        pos: &mut usize,
    ) -> Result<TxnResponse, MvccError> {
        let ok = path[*pos];
        *pos += 1;
        let mut responses = Vec::new();
        for op in if ok { &t.success } else { &t.failure } {
            let r = match &op.request {
                Some(Request::RequestRange(r)) => {
                    let mut resp = if r.revision == 0 {
                        model_range(&ex.w, r)
                    } else {
                        model_range(&self.states[r.revision as usize], r)
                    };
                    resp.header = hdr(ex.view_rev());
                    Response::ResponseRange(resp)
                }
                Some(Request::RequestPut(p)) => Response::ResponsePut(self.put(ex, p)?),
                Some(Request::RequestDeleteRange(d)) => {
                    Response::ResponseDeleteRange(self.delete(ex, d))
                }
                Some(Request::RequestTxn(n)) => {
                    let mut r = self.exec(ex, n, path, pos)?;
                    r.header = hdr(ex.view_rev());
                    Response::ResponseTxn(r)
                }
                None => unreachable!(),
            };
            responses.push(ResponseOp { response: Some(r) });
        }
        Ok(TxnResponse {
            header: None,
            succeeded: ok,
            responses,
        })
    }
}

const KEYS: &[&str] = &["a", "ab", "b", "c", "d", "e"];

fn key(rng: &mut StdRng) -> Vec<u8> {
    KEYS[rng.gen_range(0..KEYS.len())].as_bytes().to_vec()
}

fn range_end(rng: &mut StdRng) -> Vec<u8> {
    match rng.gen_range(0..10) {
        0..=4 => vec![],
        5 | 6 => vec![0],
        _ => key(rng),
    }
}

fn gen_put(rng: &mut StdRng) -> PutRequest {
    let ignore_value = rng.gen_bool(0.1);
    let ignore_lease = rng.gen_bool(0.1);
    PutRequest {
        key: key(rng),
        value: if ignore_value {
            vec![]
        } else {
            ["", "x", "y", "zz"][rng.gen_range(0..4)].into()
        },
        lease: if ignore_lease { 0 } else { rng.gen_range(0..3) },
        prev_kv: rng.gen_bool(0.5),
        ignore_value,
        ignore_lease,
    }
}

fn gen_delete(rng: &mut StdRng) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: key(rng),
        range_end: range_end(rng),
        prev_kv: rng.gen_bool(0.5),
    }
}

fn gen_range(rng: &mut StdRng, m: &Model, in_txn: bool) -> RangeRequest {
    let revision = if rng.gen_bool(0.5) {
        0
    } else if in_txn {
        // Valid revisions only: etcd's pre-check would reject the whole txn otherwise,
        // which the model covers less interestingly.
        rng.gen_range(m.compacted.max(1)..=m.cur())
    } else {
        rng.gen_range(0..=m.cur() + 1)
    };
    let filter = |rng: &mut StdRng| {
        if rng.gen_bool(0.15) {
            rng.gen_range(1..=m.cur() + 1)
        } else {
            0
        }
    };
    RangeRequest {
        key: key(rng),
        range_end: range_end(rng),
        limit: if rng.gen_bool(0.4) {
            rng.gen_range(1..4)
        } else {
            0
        },
        revision,
        sort_order: rng.gen_range(0..3),
        sort_target: if rng.gen_bool(0.5) {
            0
        } else {
            rng.gen_range(0..5)
        },
        serializable: false,
        keys_only: rng.gen_bool(0.1),
        count_only: rng.gen_bool(0.1),
        min_mod_revision: filter(rng),
        max_mod_revision: filter(rng),
        min_create_revision: filter(rng),
        max_create_revision: filter(rng),
    }
}

fn gen_compare(rng: &mut StdRng, m: &Model) -> Compare {
    let target = rng.gen_range(0..5);
    let n = rng.gen_range(0..=m.cur() + 1);
    let target_union = Some(match target {
        0 => TargetUnion::Version(rng.gen_range(0..3)),
        1 => TargetUnion::CreateRevision(n),
        2 => TargetUnion::ModRevision(n),
        3 => TargetUnion::Value(["", "x", "y"][rng.gen_range(0..3)].into()),
        _ => TargetUnion::Lease(rng.gen_range(0..3)),
    });
    Compare {
        result: rng.gen_range(0..4),
        target,
        key: key(rng),
        range_end: if rng.gen_bool(0.7) {
            vec![]
        } else {
            range_end(rng)
        },
        target_union,
    }
}

fn gen_ops(rng: &mut StdRng, m: &Model, depth: u32) -> Vec<RequestOp> {
    (0..rng.gen_range(0..4))
        .map(|_| {
            let request = match rng.gen_range(0..10) {
                0..=3 => Request::RequestPut(gen_put(rng)),
                4 | 5 => Request::RequestDeleteRange(gen_delete(rng)),
                6..=8 => Request::RequestRange(gen_range(rng, m, true)),
                _ if depth < 2 => Request::RequestTxn(gen_txn(rng, m, depth + 1)),
                _ => Request::RequestPut(gen_put(rng)),
            };
            RequestOp {
                request: Some(request),
            }
        })
        .collect()
}

fn gen_txn(rng: &mut StdRng, m: &Model, depth: u32) -> TxnRequest {
    TxnRequest {
        compare: (0..rng.gen_range(0..3))
            .map(|_| gen_compare(rng, m))
            .collect(),
        success: gen_ops(rng, m, depth),
        failure: gen_ops(rng, m, depth),
    }
}

fn gen_write(rng: &mut StdRng, m: &Model) -> WriteRequest {
    match rng.gen_range(0..20) {
        0..=7 => WriteRequest::Put(gen_put(rng)),
        8..=11 => WriteRequest::DeleteRange(gen_delete(rng)),
        12..=18 => WriteRequest::Txn(gen_txn(rng, m, 0)),
        _ => WriteRequest::Compact(CompactionRequest {
            revision: rng.gen_range(m.compacted.max(0)..=m.cur() + 1),
            physical: false,
        }),
    }
}

fn open(dir: &std::path::Path) -> (StoreEngine, MvccStore) {
    // The engine's background threads may hold the previous instance's file lock for a moment.
    let mut tries = 0;
    let db = loop {
        match StoreEngine::open_flushed_only(dir) {
            Ok(db) => break db,
            Err(e) if tries < 200 => {
                tries += 1;
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("reopen: {e}"),
        }
    };
    let s = MvccStore::open(db.clone()).unwrap();
    // The generated puts name leases 1 and 2, which the model takes to exist; granting
    // changes no revision, so the model needs no other notion of leases.
    for id in [1, 2] {
        if s.lease_ttl(id).unwrap().is_none() {
            let g = WriteRequest::LeaseGrant(crate::proto::etcdserverpb::LeaseGrantRequest {
                id,
                ttl: 60,
            });
            s.apply(&[g], &[]).unwrap().pop().unwrap().unwrap();
        }
    }
    (db, s)
}

fn check_events(s: &MvccStore, m: &Model, rng: &mut StdRng, ctx: &str) {
    let start = rng.gen_range(m.compacted.max(0) + 1..=m.cur() + 1);
    let (k, e) = (key(rng), range_end(rng));
    let kr = KeyRange::new(&k, &e);
    let got = s.events_since(start, &k, &e, true, 0).unwrap();
    let want: Vec<Event> = m
        .log
        .iter()
        .filter(|l| l.main >= start && kr.contains(&l.kv.key))
        .map(|l| Event {
            r#type: if l.delete {
                EventType::Delete
            } else {
                EventType::Put
            } as i32,
            kv: Some(l.kv.clone()),
            prev_kv: l.prev.clone(),
        })
        .collect();
    assert_eq!(got.events, want, "{ctx}: events since {start}");
    assert_eq!(got.next_revision, m.cur() + 1, "{ctx}");
}

fn check_all_revisions(s: &MvccStore, m: &Model, ctx: &str) {
    for rev in m.compacted.max(1)..=m.cur() {
        let req = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            revision: rev,
            ..Default::default()
        };
        assert_eq!(s.range(&req), m.range(&req), "{ctx}: full range at {rev}");
    }
}

/// The lease index lists, for each lease the generator uses, the live keys carrying it.
fn check_lease_keys(s: &MvccStore, m: &Model, ctx: &str) {
    for id in 1..=2 {
        let want: Vec<Vec<u8>> = m.states[m.states.len() - 1]
            .values()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key.clone())
            .collect();
        assert_eq!(s.lease_keys(id), want, "{ctx}: keys of lease {id}");
    }
}

fn run_seed(seed: u64, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let (mut db, mut s) = open(dir.path());
    let mut m = Model::new();
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        match rng.gen_range(0..20) {
            0..=11 => {
                let reqs: Vec<_> = (0..rng.gen_range(1..4))
                    .map(|_| gen_write(&mut rng, &m))
                    .collect();
                let meta_val = step.to_be_bytes().to_vec();
                let got = s
                    .apply(&reqs, &[(b"applied".to_vec(), Some(meta_val.clone()))])
                    .unwrap();
                let want: Vec<_> = reqs.iter().map(|r| m.apply(r)).collect();
                assert_eq!(got, want, "{ctx}: {reqs:?}");
                assert_eq!(s.get_meta(b"applied").unwrap(), Some(meta_val));
                assert_eq!(s.current_revision(), m.cur(), "{ctx}");
                assert_eq!(s.compacted_revision(), m.compacted, "{ctx}");
                check_lease_keys(&s, &m, &ctx);
            }
            12..=16 => {
                let req = gen_range(&mut rng, &m, false);
                assert_eq!(s.range(&req), m.range(&req), "{ctx}: {req:?}");
            }
            17 | 18 => check_events(&s, &m, &mut rng, &ctx),
            // Moves the pending buffer to the engine, so reads span both.
            19 if rng.gen_bool(0.5) => s.persist_pending().unwrap(),
            _ => {
                s.flush().unwrap();
                drop(s);
                drop(db);
                (db, s) = open(dir.path());
                assert_eq!(s.current_revision(), m.cur(), "{ctx}: reopen");
                assert_eq!(s.compacted_revision(), m.compacted, "{ctx}: reopen");
                check_lease_keys(&s, &m, &ctx);
            }
        }
    }
    check_all_revisions(&s, &m, &format!("seed {seed} end"));

    let dir2 = tempfile::tempdir().unwrap();
    let (_db2, s2) = open(dir2.path());
    s2.apply(&[WriteRequest::Put(gen_put(&mut rng))], &[])
        .unwrap();
    s2.load(s.dump().map(Result::unwrap), &[]).unwrap();
    assert_eq!(s2.current_revision(), m.cur());
    assert_eq!(s2.compacted_revision(), m.compacted);
    check_all_revisions(&s2, &m, &format!("seed {seed} after load"));
    check_lease_keys(&s2, &m, &format!("seed {seed} after load"));
}

#[test]
fn model_random_seeds() {
    let seeds: u64 = std::env::var("MVCC_MODEL_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    for seed in 0..seeds {
        run_seed(seed, 120);
    }
}
