//! Request validation done by etcd's gRPC layer (`v3rpc/key.go`) before a request is
//! proposed. The store itself accepts any request; these helpers let the API layer reject
//! the same requests etcd rejects, with the same errors.
//!
//! # Invariants
//! - The checks read nothing but the request: they run before proposal and give every member
//!   and every retry the same answer.

use std::collections::HashSet;

use super::error::MvccError;
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// etcd's `checkRangeRequest`.
pub fn check_range(r: &RangeRequest) -> Result<(), MvccError> {
    if r.key.is_empty() {
        return Err(MvccError::EmptyKey);
    }
    if SortOrder::try_from(r.sort_order).is_err() || SortTarget::try_from(r.sort_target).is_err() {
        return Err(MvccError::InvalidSortOption);
    }
    Ok(())
}

/// etcd's `checkPutRequest`.
pub fn check_put(r: &PutRequest) -> Result<(), MvccError> {
    if r.key.is_empty() {
        return Err(MvccError::EmptyKey);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(MvccError::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(MvccError::LeaseProvided);
    }
    Ok(())
}

/// etcd's `checkDeleteRequest`.
pub fn check_delete_range(r: &DeleteRangeRequest) -> Result<(), MvccError> {
    if r.key.is_empty() {
        return Err(MvccError::EmptyKey);
    }
    Ok(())
}

/// etcd's `checkTxnRequest` followed by `checkIntervals` on both branches.
pub fn check_txn(r: &TxnRequest, max_txn_ops: usize) -> Result<(), MvccError> {
    check_txn_request(r, max_txn_ops)?;
    check_intervals(&r.success)?;
    check_intervals(&r.failure)?;
    Ok(())
}

/// A nested txn gets the budget left over by its parent's largest list, as in etcd.
fn check_txn_request(r: &TxnRequest, max_txn_ops: usize) -> Result<(), MvccError> {
    let opc = r.compare.len().max(r.success.len()).max(r.failure.len());
    if opc > max_txn_ops {
        return Err(MvccError::TooManyOps);
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(MvccError::EmptyKey);
    }
    for op in r.success.iter().chain(&r.failure) {
        check_request_op(op, max_txn_ops - opc)?;
    }
    Ok(())
}

fn check_request_op(op: &RequestOp, max_txn_ops: usize) -> Result<(), MvccError> {
    match &op.request {
        Some(Request::RequestRange(r)) => check_range(r),
        Some(Request::RequestPut(r)) => check_put(r),
        Some(Request::RequestDeleteRange(r)) => check_delete_range(r),
        Some(Request::RequestTxn(t)) => check_txn_request(t, max_txn_ops),
        None => Err(MvccError::KeyNotFound),
    }
}

/// A deleted interval as etcd's `adt.NewStringAffineInterval`/`Point` builds it.
struct Interval {
    begin: Vec<u8>,
    /// `None` = the point `begin` only.
    end: Option<Vec<u8>>,
}

impl Interval {
    /// Whether the point `k` intersects, evaluated as etcd's interval tree does: an empty
    /// end would be +infinity, but a `"\0"` end (delete to the end of the keyspace) is
    /// taken literally, so such deletes never conflict. etcd 3.4 behaves that way.
    fn hits(&self, k: &[u8]) -> bool {
        match &self.end {
            None => self.begin == k,
            Some(end) => self.begin.as_slice() <= k && (end.is_empty() || k < end.as_slice()),
        }
    }
}

/// etcd's `checkIntervals`: within one branch, no key may be put twice or be both put and
/// deleted, counting nested txns (whose then/else branches may put the same key).
fn check_intervals(reqs: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Vec<Interval>), MvccError> {
    let mut dels: Vec<Interval> = Vec::new();
    for op in reqs {
        if let Some(Request::RequestDeleteRange(d)) = &op.request {
            dels.push(Interval {
                begin: d.key.clone(),
                end: (!d.range_end.is_empty()).then(|| d.range_end.clone()),
            });
        }
    }
    let hit = |dels: &[Interval], k: &[u8]| dels.iter().any(|d| d.hits(k));

    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    for op in reqs {
        let Some(Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || hit(&dels, k) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            if (puts.contains(k) && !puts_then.contains(k)) || hit(&dels, k) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }

    for op in reqs {
        if let Some(Request::RequestPut(p)) = &op.request {
            if puts.contains(&p.key) || hit(&dels, &p.key) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(p.key.clone());
        }
    }
    Ok((puts, dels))
}
