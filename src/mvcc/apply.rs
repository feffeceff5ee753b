//! Execution of write requests: history records and leases go to an in-memory overlay
//! of the applied state, the key index is changed in place.
//!
//! A batch runs every request against [`Batch`] (applied state + overlay of this batch's
//! changes); the overlay then becomes one [`Layer`] of the pending buffer, which reaches the
//! engine in one atomic batch with the layers around it.
//!
//! # Invariants
//! - One applier: the applied state cannot change underneath a batch (the store's apply lock).
//! - Every change is logged for undo: a failed request leaves the overlay, the key index and
//!   the counters as they were before it; a storage error rolls back the whole batch, the key
//!   index and the published compacted revision included (see [`super::index::mem`] for why
//!   in-place index changes are safe for readers).
//! - Nothing leaves the batch before it ends: the overlay becomes a [`Layer`] only once every
//!   request ran, so readers never see part of a batch's history or leases.
//! - A request that changes something bumps the revision by exactly one; its changes get sub
//!   revisions 0, 1, ... in the order they are made.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};

use super::error::MvccError;
use super::index::{Found, KeyIndex, Query, Record, Revision};
use super::key_range::KeyRange;
use super::pending::Layer;
use super::request::{WriteRequest, WriteResponse};
use super::view::{live_kvs, range_at, Applied, View};
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::response_op::Response;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, Compare, DeleteRangeRequest, DeleteRangeResponse,
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest,
    TxnResponse,
};
use crate::proto::mvccpb::KeyValue;

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

enum Undo {
    /// A put or tombstone appended to the key's index.
    IdxPush(Vec<u8>),
    Rev(Revision, Option<Option<Vec<u8>>>),
    Lease(i64, Option<Option<i64>>),
    /// The key's lease in the lease index before a change.
    KeyLease(Vec<u8>, i64),
}

/// Where the revision counter stands inside one write request.
struct Ctx {
    /// Store revision before the request.
    base: i64,
    /// Number of changes made so far; also the next sub revision.
    changes: i64,
}

impl Ctx {
    fn next(&mut self) -> Revision {
        let r = Revision {
            main: self.base + 1,
            sub: self.changes,
        };
        self.changes += 1;
        r
    }

    /// The revision reads inside the request see (etcd's `storeTxnWrite.Rev`-like rule).
    fn view_rev(&self) -> i64 {
        if self.changes > 0 {
            self.base + 1
        } else {
            self.base
        }
    }
}

pub(crate) struct Batch<'a> {
    applied: Applied<'a>,
    /// Encoded records written by the batch (always `Some`: compaction removes records in
    /// the background, see `garbage`).
    rev: BTreeMap<Revision, Option<Vec<u8>>>,
    /// Lease id -> granted TTL; `None` = revoked.
    leases: BTreeMap<i64, Option<i64>>,
    /// Every change of the batch, oldest first, to roll back a failed request or batch.
    undo: Vec<Undo>,
    pub cur: i64,
    pub compacted: i64,
    /// The store's published compacted revision. A compaction raises it before changing
    /// the key index in place, so a reader that misses compacted revisions notices.
    published_compacted: &'a AtomicI64,
}

impl View for Batch<'_> {
    fn find(&self, key: &[u8], q: Query) -> Result<Option<Found>, MvccError> {
        self.applied.find(key, q)
    }

    fn scan(
        &self,
        kr: &KeyRange,
        f: &mut dyn FnMut(&[u8], &KeyIndex) -> bool,
    ) -> Result<(), MvccError> {
        self.applied.scan(kr, f)
    }

    fn record(&self, rev: Revision) -> Result<Option<Record>, MvccError> {
        match self.rev.get(&rev) {
            Some(Some(b)) => Ok(Some(Record::decode(b)?)),
            Some(None) => Ok(None),
            None => self.applied.record(rev),
        }
    }
}

impl<'a> Batch<'a> {
    pub fn new(applied: Applied<'a>, cur: i64, published_compacted: &'a AtomicI64) -> Self {
        let compacted = published_compacted.load(AtomicOrdering::SeqCst);
        Batch {
            applied,
            rev: BTreeMap::new(),
            leases: BTreeMap::new(),
            undo: Vec::new(),
            cur,
            compacted,
            published_compacted,
        }
    }

    /// Takes the overlay as a layer of tree writes (no metadata yet).
    pub fn take_writes(&mut self) -> Layer {
        Layer {
            rev: std::mem::take(&mut self.rev),
            lease: std::mem::take(&mut self.leases),
            meta: Default::default(),
            compacted: None,
        }
    }

    /// The granted TTL of lease `id`, if it exists.
    fn lease_ttl(&self, id: i64) -> Result<Option<i64>, MvccError> {
        match self.leases.get(&id) {
            Some(ttl) => Ok(*ttl),
            None => self.applied.lease_ttl(id),
        }
    }

    fn set_lease(&mut self, id: i64, ttl: Option<i64>) {
        let old = self.leases.insert(id, ttl);
        self.undo.push(Undo::Lease(id, old));
    }

    fn push_idx(&mut self, key: &[u8], rev: Revision, tombstone: bool) {
        self.applied.idx.push(key, rev, tombstone);
        self.undo.push(Undo::IdxPush(key.to_vec()));
    }

    /// [`Self::push_idx`] of a put, returning the key's life before it (`MemIndex::put`).
    fn put_idx(&mut self, key: &[u8], rev: Revision) -> Option<(i64, i64)> {
        let life = self.applied.idx.put(key, rev);
        self.undo.push(Undo::IdxPush(key.to_vec()));
        life
    }

    /// Records in the lease index that `key` now carries `lease` (0: none or deleted).
    fn set_key_lease(&mut self, key: &[u8], lease: i64) {
        let old = self.applied.leases.set(key, lease);
        if old != lease {
            self.undo.push(Undo::KeyLease(key.to_vec(), old));
        }
    }

    fn set_rev(&mut self, rev: Revision, rec: &Record) {
        let old = self.rev.insert(rev, Some(rec.encode()));
        self.undo.push(Undo::Rev(rev, old));
    }

    /// Applies one request; on error the overlay, index and counters are as before the
    /// call.
    /// `may_delete` is asked for each key a [`WriteRequest::LeaseRevoke`] would delete.
    pub fn apply_one(
        &mut self,
        req: &WriteRequest,
        may_delete: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<WriteResponse, MvccError> {
        let (cur, compacted) = (self.cur, self.compacted);
        let mark = self.undo.len();
        let res = self.dispatch(req, may_delete);
        if res.is_err() {
            self.rollback_to(mark);
            self.cur = cur;
            self.compacted = compacted;
            self.published_compacted
                .store(compacted, AtomicOrdering::SeqCst);
        }
        res
    }

    /// Undoes every change of the batch, including the published compacted revision, to
    /// `compacted_before` (the batch's starting point).
    pub fn rollback(&mut self, compacted_before: i64) {
        self.rollback_to(0);
        self.published_compacted
            .store(compacted_before, AtomicOrdering::SeqCst);
    }

    fn rollback_to(&mut self, mark: usize) {
        while self.undo.len() > mark {
            match self.undo.pop().expect("len > mark") {
                Undo::IdxPush(k) => self.applied.idx.unpush(&k),
                Undo::Rev(r, Some(v)) => {
                    self.rev.insert(r, v);
                }
                Undo::Rev(r, None) => {
                    self.rev.remove(&r);
                }
                Undo::Lease(id, Some(v)) => {
                    self.leases.insert(id, v);
                }
                Undo::Lease(id, None) => {
                    self.leases.remove(&id);
                }
                Undo::KeyLease(k, old) => {
                    self.applied.leases.set(&k, old);
                }
            }
        }
    }

    fn dispatch(
        &mut self,
        req: &WriteRequest,
        may_delete: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<WriteResponse, MvccError> {
        Ok(match req {
            WriteRequest::Put(p) => {
                let mut ctx = self.ctx();
                let resp = self.put(&mut ctx, p)?;
                self.finish(&ctx);
                WriteResponse::Put(resp)
            }
            WriteRequest::DeleteRange(d) => {
                let mut ctx = self.ctx();
                let mut resp = self.delete_range(&mut ctx, d)?;
                self.finish(&ctx);
                resp.header = header(self.cur);
                WriteResponse::DeleteRange(resp)
            }
            WriteRequest::Txn(t) => WriteResponse::Txn(self.txn(t)?),
            WriteRequest::Compact(c) => WriteResponse::Compact(self.compact(c)?),
            WriteRequest::LeaseGrant(g) => WriteResponse::LeaseGrant(self.lease_grant(g)?),
            WriteRequest::LeaseRevoke(r) => {
                WriteResponse::LeaseRevoke(self.lease_revoke(r, may_delete)?)
            }
            WriteRequest::LeaseRevokeMany(ids) => {
                WriteResponse::LeaseRevoke(self.lease_revoke_many(ids)?)
            }
        })
    }

    /// The caller has chosen the id and raised the TTL to the minimum, so every member
    /// applies the same lease.
    fn lease_grant(&mut self, req: &LeaseGrantRequest) -> Result<LeaseGrantResponse, MvccError> {
        if req.id == 0 {
            return Err(MvccError::NoLeaseId);
        }
        if self.lease_ttl(req.id)?.is_some() {
            return Err(MvccError::LeaseExists);
        }
        self.set_lease(req.id, Some(req.ttl));
        Ok(LeaseGrantResponse {
            header: header(self.cur),
            id: req.id,
            ttl: req.ttl,
            error: String::new(),
        })
    }

    /// Deletes every key attached to the lease as one revision (one event batch for
    /// watchers, like etcd's revoke txn), then forgets the lease.
    fn lease_revoke(
        &mut self,
        req: &LeaseRevokeRequest,
        may_delete: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<LeaseRevokeResponse, MvccError> {
        let keys = self.applied.leases.keys(req.id);
        // etcd checks the proposer's permission on the lease's keys before it looks the
        // lease up for the revoke itself.
        if !keys.iter().all(|k| may_delete(k)) {
            return Err(MvccError::RevokeRefused);
        }
        if self.lease_ttl(req.id)?.is_none() {
            return Err(MvccError::LeaseNotFound);
        }
        self.revoke_with_keys(req.id, keys)?;
        Ok(LeaseRevokeResponse {
            header: header(self.cur),
        })
    }

    /// [`WriteRequest::LeaseRevokeMany`]: each listed lease that exists, once, in list order.
    fn lease_revoke_many(&mut self, ids: &[i64]) -> Result<LeaseRevokeResponse, MvccError> {
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        for &id in ids {
            if seen.insert(id) && self.lease_ttl(id)?.is_some() {
                let keys = self.applied.leases.keys(id);
                self.revoke_with_keys(id, keys)?;
            }
        }
        Ok(LeaseRevokeResponse {
            header: header(self.cur),
        })
    }

    fn revoke_with_keys(&mut self, id: i64, keys: Vec<Vec<u8>>) -> Result<(), MvccError> {
        let mut ctx = self.ctx();
        for key in keys {
            let d = DeleteRangeRequest {
                key,
                ..Default::default()
            };
            self.delete_range(&mut ctx, &d)?;
        }
        self.finish(&ctx);
        self.set_lease(id, None);
        Ok(())
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            base: self.cur,
            changes: 0,
        }
    }

    fn finish(&mut self, ctx: &Ctx) {
        self.cur = ctx.view_rev();
    }

    /// The key's current value, if it is live.
    fn live(&self, key: &[u8]) -> Result<Option<KeyValue>, MvccError> {
        let Some(found) = self.find(key, Query::Latest)? else {
            return Ok(None);
        };
        if found.tombstone {
            return Ok(None);
        }
        let rec = self.record(found.rev)?.ok_or_else(|| {
            MvccError::corrupt(format!("history record {found:?} of a live key is missing"))
        })?;
        Ok(Some(rec.kv))
    }

    fn put(&mut self, ctx: &mut Ctx, req: &PutRequest) -> Result<PutResponse, MvccError> {
        crate::metrics::MVCC_PUT.inc();
        if req.lease != 0 && self.lease_ttl(req.lease)?.is_none() {
            return Err(MvccError::LeaseNotFound);
        }
        // The previous value is read from the history only when the request needs more of it
        // than the index knows (a history read is an engine lookup, blocked while a persist runs).
        let (prev, rev, life) = if req.prev_kv || req.ignore_value || req.ignore_lease {
            let prev = self.live(&req.key)?;
            if (req.ignore_value || req.ignore_lease) && prev.is_none() {
                return Err(MvccError::KeyNotFound);
            }
            let life = prev.as_ref().map(|p| (p.create_revision, p.version));
            let rev = ctx.next();
            self.push_idx(&req.key, rev, false);
            (prev, rev, life)
        } else {
            #[cfg(debug_assertions)]
            let from_history = self.live(&req.key)?.map(|p| (p.create_revision, p.version));
            // The life before this put and the put itself in one index lookup (a put's
            // biggest cost in the index, with 100,000s of keys).
            let rev = ctx.next();
            let life = self.put_idx(&req.key, rev);
            #[cfg(debug_assertions)]
            debug_assert_eq!(life, from_history, "index life of {:?}", req.key);
            (None, rev, life)
        };
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision: life.map_or(rev.main, |(created, _)| created),
            mod_revision: rev.main,
            version: life.map_or(1, |(_, version)| version + 1),
            value: match (&prev, req.ignore_value) {
                (Some(p), true) => p.value.clone(),
                _ => req.value.clone(),
            },
            lease: match (&prev, req.ignore_lease) {
                (Some(p), true) => p.lease,
                _ => req.lease,
            },
        };
        self.set_key_lease(&kv.key, kv.lease);
        self.set_rev(
            rev,
            &Record {
                kv,
                tombstone: false,
            },
        );
        Ok(PutResponse {
            header: header(rev.main),
            prev_kv: if req.prev_kv { prev } else { None },
        })
    }

    /// The response header is set to the revision after the delete.
    fn delete_range(
        &mut self,
        ctx: &mut Ctx,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, MvccError> {
        crate::metrics::MVCC_DELETE.inc();
        let kr = KeyRange::new(&req.key, &req.range_end);
        let mut victims = Vec::new();
        self.scan(&kr, &mut |k, ki| {
            if ki.is_live() {
                victims.push(k.to_vec());
            }
            true
        })?;
        let mut prev_kvs = Vec::new();
        if req.prev_kv {
            for k in &victims {
                if let Some(kv) = self.live(k)? {
                    prev_kvs.push(kv);
                }
            }
        }
        let deleted = victims.len() as i64;
        for k in victims {
            let rev = ctx.next();
            self.push_idx(&k, rev, true);
            self.set_key_lease(&k, 0);
            self.set_rev(
                rev,
                &Record {
                    kv: KeyValue {
                        key: k,
                        mod_revision: rev.main,
                        ..Default::default()
                    },
                    tombstone: true,
                },
            );
        }
        Ok(DeleteRangeResponse {
            header: header(ctx.view_rev()),
            deleted,
            prev_kvs,
        })
    }

    fn compact(&mut self, req: &CompactionRequest) -> Result<CompactionResponse, MvccError> {
        let at = req.revision;
        if at <= self.compacted {
            return Err(MvccError::Compacted);
        }
        if at > self.cur {
            return Err(MvccError::FutureRev);
        }
        // Only the revision: the key index and the history are compacted in the background
        // once this batch is persisted (see `garbage`). Every read at or above `at` sees the
        // same data either way, and reads below it are refused from now on.
        self.published_compacted.store(at, AtomicOrdering::SeqCst);
        self.compacted = at;
        Ok(CompactionResponse {
            header: header(self.cur),
        })
    }

    /// etcd 3.4 `applierV3backend.Txn`: every compare (also of nested txns) and every
    /// precondition is evaluated against the state before the txn; then the chosen ops
    /// run in order, each seeing the effects of the previous ones.
    fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
        crate::metrics::MVCC_TXN.inc();
        let mut path = Vec::new();
        self.compare_path(req, &mut path)?;
        self.check_ops(req, &path, &mut 0, true)?;
        self.check_ops(req, &path, &mut 0, false)?;
        let mut ctx = self.ctx();
        let mut resp = self.exec_txn(&mut ctx, req, &path, &mut 0)?;
        self.finish(&ctx);
        resp.header = header(self.cur);
        Ok(resp)
    }

    fn compare_path(&self, req: &TxnRequest, path: &mut Vec<bool>) -> Result<(), MvccError> {
        let mut ok = true;
        for c in &req.compare {
            if !self.compare(c)? {
                ok = false;
                break;
            }
        }
        path.push(ok);
        for op in branch(req, ok) {
            if let Some(Request::RequestTxn(t)) = &op.request {
                self.compare_path(t, path)?;
            }
        }
        Ok(())
    }

    /// etcd's `applyCompare`: all keys of the range must satisfy the compare; an empty
    /// range compares a zero `KeyValue`, except that VALUE compares are then false.
    fn compare(&self, c: &Compare) -> Result<bool, MvccError> {
        let kr = KeyRange::new(&c.key, &c.range_end);
        let (kvs, _) = live_kvs(self, &kr, self.cur, 0, false, None)?;
        let target = CompareTarget::try_from(c.target).ok();
        if kvs.is_empty() {
            if target == Some(CompareTarget::Value) {
                return Ok(false);
            }
            return Ok(compare_kv(c, target, &KeyValue::default()));
        }
        Ok(kvs.iter().all(|kv| compare_kv(c, target, kv)))
    }

    /// etcd's `checkRequests` with `checkRequestPut` (`puts`) or `checkRange` (`!puts`)
    /// over the ops on the chosen path.
    fn check_ops(
        &self,
        req: &TxnRequest,
        path: &[bool],
        pos: &mut usize,
        puts: bool,
    ) -> Result<(), MvccError> {
        let ok = path[*pos];
        *pos += 1;
        for op in branch(req, ok) {
            match &op.request {
                Some(Request::RequestTxn(t)) => self.check_ops(t, path, pos, puts)?,
                Some(Request::RequestPut(p)) if puts => self.check_put(p)?,
                Some(Request::RequestRange(r)) if !puts => self.check_range(r)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// etcd's `checkRequestPut`.
    fn check_put(&self, p: &PutRequest) -> Result<(), MvccError> {
        if (p.ignore_value || p.ignore_lease) && self.live(&p.key)?.is_none() {
            return Err(MvccError::KeyNotFound);
        }
        if p.lease != 0 && self.lease_ttl(p.lease)?.is_none() {
            return Err(MvccError::LeaseNotFound);
        }
        Ok(())
    }

    /// etcd's `checkRange`.
    fn check_range(&self, r: &RangeRequest) -> Result<(), MvccError> {
        if r.revision == 0 {
            Ok(())
        } else if r.revision > self.cur {
            Err(MvccError::FutureRev)
        } else if r.revision < self.compacted {
            Err(MvccError::Compacted)
        } else {
            Ok(())
        }
    }

    fn exec_txn(
        &mut self,
        ctx: &mut Ctx,
        req: &TxnRequest,
        path: &[bool],
        pos: &mut usize,
    ) -> Result<TxnResponse, MvccError> {
        let ok = path[*pos];
        *pos += 1;
        let mut responses = Vec::new();
        for op in branch(req, ok) {
            let response = match &op.request {
                None => None,
                Some(Request::RequestRange(r)) => {
                    Some(Response::ResponseRange(self.txn_range(ctx, r)?))
                }
                Some(Request::RequestPut(p)) => Some(Response::ResponsePut(self.put(ctx, p)?)),
                Some(Request::RequestDeleteRange(d)) => {
                    Some(Response::ResponseDeleteRange(self.delete_range(ctx, d)?))
                }
                Some(Request::RequestTxn(t)) => {
                    let mut inner = self.exec_txn(ctx, t, path, pos)?;
                    inner.header = header(ctx.view_rev());
                    Some(Response::ResponseTxn(inner))
                }
            };
            responses.push(ResponseOp { response });
        }
        Ok(TxnResponse {
            header: None,
            succeeded: ok,
            responses,
        })
    }

    fn txn_range(&self, ctx: &Ctx, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        crate::metrics::MVCC_RANGE.inc();
        let rev = ctx.view_rev();
        let mut resp = range_at(self, req, rev, self.compacted, None)?;
        resp.header = header(rev);
        Ok(resp)
    }
}

fn branch(req: &TxnRequest, ok: bool) -> &[RequestOp] {
    if ok {
        &req.success
    } else {
        &req.failure
    }
}

/// etcd's `compareKV`: a target union of the wrong kind compares against zero/empty,
/// an unknown result is true.
fn compare_kv(c: &Compare, target: Option<CompareTarget>, kv: &KeyValue) -> bool {
    let ord = match target {
        Some(CompareTarget::Value) => {
            let want: &[u8] = match &c.target_union {
                Some(TargetUnion::Value(v)) => v,
                _ => &[],
            };
            kv.value.as_slice().cmp(want)
        }
        Some(CompareTarget::Create) => kv.create_revision.cmp(match &c.target_union {
            Some(TargetUnion::CreateRevision(r)) => r,
            _ => &0,
        }),
        Some(CompareTarget::Mod) => kv.mod_revision.cmp(match &c.target_union {
            Some(TargetUnion::ModRevision(r)) => r,
            _ => &0,
        }),
        Some(CompareTarget::Version) => kv.version.cmp(match &c.target_union {
            Some(TargetUnion::Version(r)) => r,
            _ => &0,
        }),
        Some(CompareTarget::Lease) => kv.lease.cmp(match &c.target_union {
            Some(TargetUnion::Lease(r)) => r,
            _ => &0,
        }),
        // etcd's switch has no default: result stays 0.
        None => Ordering::Equal,
    };
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => ord == Ordering::Equal,
        Ok(CompareResult::NotEqual) => ord != Ordering::Equal,
        Ok(CompareResult::Greater) => ord == Ordering::Greater,
        Ok(CompareResult::Less) => ord == Ordering::Less,
        Err(_) => true,
    }
}
