//! Read path shared by committed reads and reads inside an apply batch.

use std::ops::Bound;

use super::gosort;
use super::index::{Found, KeyIndex, Query, Record, Revision};
use super::mem_index::MemIndex;
use super::pending::Pending;
use super::MvccError;
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::{RangeRequest, RangeResponse};
use crate::proto::mvccpb::KeyValue;

/// The keys selected by etcd's `key`/`range_end` pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyRange {
    /// `range_end` empty: exactly `key`.
    Single(Vec<u8>),
    /// `range_end == "\0"`: every key `>= key`.
    From(Vec<u8>),
    /// `[key, range_end)` with `key < range_end`.
    Between(Vec<u8>, Vec<u8>),
    /// `range_end <= key`: nothing.
    Empty,
}

impl KeyRange {
    pub fn new(key: &[u8], range_end: &[u8]) -> Self {
        if range_end.is_empty() {
            KeyRange::Single(key.to_vec())
        } else if range_end == [0] {
            KeyRange::From(key.to_vec())
        } else if key < range_end {
            KeyRange::Between(key.to_vec(), range_end.to_vec())
        } else {
            KeyRange::Empty
        }
    }

    pub fn contains(&self, k: &[u8]) -> bool {
        match self {
            KeyRange::Single(s) => s == k,
            KeyRange::From(s) => k >= s.as_slice(),
            KeyRange::Between(s, e) => k >= s.as_slice() && k < e.as_slice(),
            KeyRange::Empty => false,
        }
    }

    pub fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        match self {
            KeyRange::Single(s) => (Bound::Included(s), Bound::Included(s)),
            KeyRange::From(s) => (Bound::Included(s), Bound::Unbounded),
            KeyRange::Between(s, e) => (Bound::Included(s), Bound::Excluded(e)),
            // An empty half-open range that sled and BTreeMap accept without panicking.
            KeyRange::Empty => (Bound::Included(&[]), Bound::Excluded(&[])),
        }
    }
}

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
}

/// The applied state: the in-memory index and the history (pending buffer over sled's
/// tree), read without the apply lock. Callers bound every lookup by a revision they know is
/// fully applied, so a concurrent apply only adds entries they cannot see.
#[derive(Clone, Copy)]
pub(crate) struct Committed<'a> {
    pub idx: &'a MemIndex,
    pub rev: &'a sled::Tree,
    pub pending: &'a Pending,
}

impl View for Committed<'_> {
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
        self.rev
            .get(rev.to_bytes())?
            .map(|v| Record::decode(&v))
            .transpose()
    }
}

/// The live value of every key of `kr` at revision `rev`, in key order, at most `limit`
/// values if `limit > 0`, plus the total number of live keys. `count_only` skips loading
/// values.
pub(crate) fn live_kvs(
    v: &dyn View,
    kr: &KeyRange,
    rev: i64,
    limit: usize,
    count_only: bool,
) -> Result<(Vec<KeyValue>, usize), MvccError> {
    let mut count = 0usize;
    let mut revs = Vec::new();
    v.scan(kr, &mut |_, ki| {
        if let Some(f) = ki.at(rev) {
            if !f.tombstone {
                count += 1;
                if !count_only && (limit == 0 || revs.len() < limit) {
                    revs.push(f.rev);
                }
            }
        }
        true
    })?;
    let mut kvs = Vec::with_capacity(revs.len());
    for r in revs {
        // The index said this revision is the visible one; if its record is gone, a
        // compaction past `rev` ran concurrently.
        let rec = v.record(r)?.ok_or(MvccError::Compacted)?;
        kvs.push(rec.kv);
    }
    Ok((kvs, count))
}

/// etcd 3.4's `applierV3backend.Range` on top of `mvcc.rangeKeys`. `cur` is the revision
/// of the view, `compacted` the compacted revision. The header is left `None`.
pub(crate) fn range_at(
    v: &dyn View,
    req: &RangeRequest,
    cur: i64,
    compacted: i64,
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
    let (mut kvs, count) = live_kvs(v, &kr, rev, fetch, req.count_only)?;

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
