//! Read path shared by reads of the applied state and reads inside an apply batch.
//!
//! # Invariants
//! - A [`View`] answers for one revision range that does not change under it: [`Applied`]'s
//!   callers bound every lookup by a revision they know is fully applied, and an apply batch
//!   is the only writer while it runs.
//! - [`Applied`] reads the pending buffer before the engine (see [`super::pending`]).

use super::engine::{Engine, StoreEngine, Tree};
use super::error::MvccError;
use super::etcd::gosort;
use super::index::lease::LeaseIndex;
use super::index::mem::MemIndex;
use super::index::{decode_i64, Found, KeyIndex, Query, Record, Revision};
use super::key_range::KeyRange;
use super::page_counts::PageCounts;
use super::pending::PendingWrites;
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::{RangeRequest, RangeResponse};
use crate::proto::mvccpb::KeyValue;

/// A consistent source of key indexes and history records.
pub(crate) trait View {
    /// Answers `q` about `key`'s revisions (`None`: the key has none that qualify).
    fn find(&self, key: &[u8], q: Query) -> Result<Option<Found>, MvccError>;
    /// Visits the key indexes in `kr` in key order until `f` returns false.
    fn scan(
        &self,
        kr: &KeyRange,
        f: &mut dyn FnMut(&[u8], &KeyIndex) -> bool,
    ) -> Result<(), MvccError>;
    fn record(&self, rev: Revision) -> Result<Option<Record>, MvccError>;
    /// The record of each of `revs`, in the order given.
    fn records(&self, revs: &[Revision]) -> Result<Vec<Option<Record>>, MvccError> {
        revs.iter().map(|r| self.record(*r)).collect()
    }
}

/// The applied state: the in-memory index and the trees (pending buffer over the engine),
/// read without the apply lock. Callers bound every lookup by a revision they know is fully
/// applied, so a concurrent apply only adds entries they cannot see.
#[derive(Clone, Copy)]
pub(crate) struct Applied<'a> {
    pub idx: &'a MemIndex,
    pub leases: &'a LeaseIndex,
    pub engine: &'a StoreEngine,
    pub pending: &'a PendingWrites,
}

impl Applied<'_> {
    /// The granted TTL of lease `id`, if the lease exists.
    pub fn lease_ttl(&self, id: i64) -> Result<Option<i64>, MvccError> {
        if let Some(ttl) = self.pending.lease(id) {
            return Ok(ttl);
        }
        self.engine
            .get(Tree::Lease, &id.to_be_bytes())?
            .map(|v| decode_i64(&v))
            .transpose()
    }
}

impl View for Applied<'_> {
    fn find(&self, key: &[u8], q: Query) -> Result<Option<Found>, MvccError> {
        Ok(self.idx.find(key, q))
    }

    fn scan(
        &self,
        kr: &KeyRange,
        f: &mut dyn FnMut(&[u8], &KeyIndex) -> bool,
    ) -> Result<(), MvccError> {
        self.idx.scan(kr, f);
        Ok(())
    }

    fn record(&self, rev: Revision) -> Result<Option<Record>, MvccError> {
        if let Some(v) = self.pending.rev(rev) {
            return v.map(|v| Record::decode(&v)).transpose();
        }
        self.engine
            .get(Tree::Rev, &rev.to_bytes())?
            .map(|v| Record::decode(&v))
            .transpose()
    }

    /// The pending buffer first, as [`View::record`]; the rest from the engine in one
    /// [`Engine::get_many`], in revision order (the order of the history tree's keys), so
    /// records written together are read together.
    fn records(&self, revs: &[Revision]) -> Result<Vec<Option<Record>>, MvccError> {
        let mut out: Vec<Option<Record>> = Vec::with_capacity(revs.len());
        let mut stored = Vec::new();
        for (i, r) in revs.iter().enumerate() {
            match self.pending.rev(*r) {
                Some(v) => out.push(v.map(|v| Record::decode(&v)).transpose()?),
                None => {
                    out.push(None);
                    stored.push((r.to_bytes(), i));
                }
            }
        }
        stored.sort_unstable();
        let keys: Vec<&[u8]> = stored.iter().map(|(k, _)| &k[..]).collect();
        let values = self.engine.get_many(Tree::Rev, &keys)?;
        for ((_, i), v) in stored.iter().zip(values) {
            out[*i] = v.map(|v| Record::decode(&v)).transpose()?;
        }
        Ok(out)
    }
}

/// The live value of every key of `kr` at revision `rev`, in key order, at most `limit`
/// values if `limit > 0`, plus the total number of live keys. `count_only` skips loading
/// values. With `known` (the number of live keys in `kr` at `rev`, already counted) and a
/// `limit`, the scan stops at the `limit`th live key.
pub(crate) fn live_kvs(
    v: &dyn View,
    kr: &KeyRange,
    rev: i64,
    limit: usize,
    count_only: bool,
    known: Option<usize>,
) -> Result<(Vec<KeyValue>, usize), MvccError> {
    let mut count = 0usize;
    let mut revs = Vec::new();
    let stop_at = known.filter(|_| limit > 0).map(|_| limit);
    v.scan(kr, &mut |_, ki| {
        if let Some(f) = ki.at(rev) {
            if !f.tombstone {
                count += 1;
                if !count_only && (limit == 0 || revs.len() < limit) {
                    revs.push(f.rev);
                }
            }
        }
        stop_at != Some(count)
    })?;
    let kvs = v
        .records(&revs)?
        .into_iter()
        // The index said this revision is the visible one; if its record is gone, a
        // compaction past `rev` ran concurrently.
        .map(|rec| rec.map(|r| r.kv).ok_or(MvccError::Compacted))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((kvs, known.unwrap_or(count)))
}

/// The number of live keys in `[from, to)` at `rev`.
fn live_between(v: &dyn View, from: &[u8], to: &[u8], rev: i64) -> Result<usize, MvccError> {
    if from >= to {
        return Ok(0);
    }
    let kr = KeyRange::Between(from.to_vec(), to.to_vec());
    let mut n = 0;
    v.scan(&kr, &mut |_, ki| {
        n += ki.at(rev).is_some_and(|f| !f.tombstone) as usize;
        true
    })?;
    Ok(n)
}

/// The count of a page of a listing, from the count an earlier page of the same listing
/// found (see [`PageCounts`]), if one is remembered.
fn count_from_earlier_page(
    v: &dyn View,
    counts: &PageCounts,
    req: &RangeRequest,
    rev: i64,
) -> Result<Option<usize>, MvccError> {
    let Some((start, count)) = counts.closest(&req.range_end, rev, &req.key) else {
        return Ok(None);
    };
    let gap = live_between(v, &start, &req.key, rev)?;
    Ok(count.checked_sub(gap))
}

/// etcd 3.4's `applierV3backend.Range` on top of `mvcc.rangeKeys`. `cur` is the revision
/// of the view, `compacted` the compacted revision. The header is left `None`.
/// With `counts`, a page of a listing (a limit, no sort, no filter, a range) takes its count
/// from an earlier page's and leaves its own for the next.
pub(crate) fn range_at(
    v: &dyn View,
    req: &RangeRequest,
    cur: i64,
    compacted: i64,
    counts: Option<&PageCounts>,
) -> Result<RangeResponse, MvccError> {
    if req.revision > cur {
        return Err(MvccError::FutureRev);
    }
    let rev = if req.revision <= 0 { cur } else { req.revision };
    if rev < compacted {
        return Err(MvccError::Compacted);
    }
    let raw_order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    // etcd decides on the raw sort order: a non-KEY target with order NONE still fetches
    // only limit+1 keys and then sorts that prefix.
    let fetch = if raw_order != SortOrder::None || filtered || req.limit <= 0 {
        0
    } else {
        usize::try_from(req.limit).unwrap_or(usize::MAX - 1) + 1
    };
    let kr = KeyRange::new(&req.key, &req.range_end);
    // A page: only it is read, not the rest of the range.
    let counts =
        counts.filter(|_| fetch > 0 && matches!(kr, KeyRange::From(_) | KeyRange::Between(..)));
    let known = match counts {
        Some(c) => count_from_earlier_page(v, c, req, rev)?,
        None => None,
    };
    let (mut kvs, count) = live_kvs(v, &kr, rev, fetch, req.count_only, known)?;
    if let Some(c) = counts {
        c.remember(&req.range_end, rev, &req.key, count);
    }

    if req.max_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision <= req.max_mod_revision);
    }
    if req.min_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision >= req.min_mod_revision);
    }
    if req.max_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision <= req.max_create_revision);
    }
    if req.min_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision >= req.min_create_revision);
    }

    let order = if target != SortTarget::Key && raw_order == SortOrder::None {
        SortOrder::Ascend
    } else {
        raw_order
    };
    if order != SortOrder::None {
        let less = |a: &KeyValue, b: &KeyValue| -> bool {
            match target {
                SortTarget::Key => a.key < b.key,
                SortTarget::Version => a.version < b.version,
                SortTarget::Create => a.create_revision < b.create_revision,
                SortTarget::Mod => a.mod_revision < b.mod_revision,
                SortTarget::Value => a.value < b.value,
            }
        };
        // etcd uses Go's sort.Sort, which is not stable: ties come out in whatever order
        // Go's pdqsort leaves them, which `gosort` reproduces exactly.
        match order {
            SortOrder::Descend => gosort::sort_by_reverse(&mut kvs, less),
            _ => gosort::sort_by(&mut kvs, less),
        }
    }

    let mut more = false;
    if req.limit > 0 && kvs.len() as i64 > req.limit {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    Ok(RangeResponse {
        header: None,
        kvs,
        more,
        count: count as i64,
    })
}
