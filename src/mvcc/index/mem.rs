//! The in-memory key index, etcd's `treeIndex`: user key -> [`KeyIndex`], ordered by key
//! (an [`IndexKey`] compares its first eight bytes inline).
//!
//! It is not persisted: [`MemIndex::rebuild`] derives it from the history tree when the
//! store opens, as etcd rebuilds its tree index from the backend; a snapshot load builds it
//! from the records as it writes them ([`IndexBuilder`]), without reading them back. A
//! persisted index would cost a rewrite of the key's whole revision list on every put, so
//! a hot key would make each write O(its history) (docs/decisions/mvcc-0003-memory-index.md).
//!
//! # Invariants
//! - Two writers, each key under the write lock: the single applier, which appends
//!   revisions newer than `current` (or undoes its own appends), and the background
//!   compaction ([`MemIndex::compact`]), which drops revisions at or below the compacted
//!   revision, published long before. That is safe for concurrent readers, which read at
//!   revisions between the two, and the writers touch disjoint revisions of a key: a key
//!   compaction removes whole is not live, and the applier only tombstones live keys.
//! - Callbacks passed to [`MemIndex::scan`] run under the read lock and must not call
//!   back into the index.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::sync::RwLockExt;

use crate::mvcc::engine::{Engine, StoreEngine, Tree};
use crate::mvcc::error::MvccError;
use crate::mvcc::index::key::{IndexKey, KeyProbe, Probe};
use crate::mvcc::index::{Found, KeyIndex, Query, Record, Revision};
use crate::mvcc::key_range::KeyRange;

/// An index derived from history records given in revision order, as [`MemIndex::rebuild`]
/// reads them from the engine, or as a snapshot load writes them (one pass instead of two).
#[derive(Default)]
pub(crate) struct IndexBuilder {
    map: BTreeMap<IndexKey, KeyIndex>,
    last: Option<Revision>,
}

impl IndexBuilder {
    /// Adds the history record `rec` stored at revision bytes `rev`, and tells `on_record`
    /// its key and lease (0 for a tombstone). `Ok(false)`, adding nothing, if `rev` is not
    /// newer than the last one added: the records are out of order, and the builder is of
    /// no use (the caller derives the index from the engine instead).
    pub fn add(
        &mut self,
        rev: &[u8],
        rec: &[u8],
        on_record: &mut dyn FnMut(&[u8], i64),
    ) -> Result<bool, MvccError> {
        let r = Revision::from_bytes(rev)?;
        if self.last.is_some_and(|last| last >= r) {
            return Ok(false);
        }
        self.last = Some(r);
        let (tombstone, head) = Record::decode_head(rec)?;
        on_record(&head.key, if tombstone { 0 } else { head.lease });
        let life = (head.create_revision, head.version);
        self.map
            .entry(IndexKey::from(head.key))
            .or_default()
            .restore(r, tombstone, life);
        Ok(true)
    }

    /// Replaces `idx`'s whole content with what was added.
    pub fn finish(self, idx: &MemIndex) {
        *idx.write() = self.map;
    }
}

/// Keys compacted per hold of the write lock.
const COMPACT_CHUNK: usize = 1024;

#[derive(Default)]
pub(crate) struct MemIndex {
    map: RwLock<BTreeMap<IndexKey, KeyIndex>>,
}

impl MemIndex {
    // A panicking reader cannot leave the map half-changed; a panicking applier takes the
    // process down with it. So poisoning carries no information here.
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<IndexKey, KeyIndex>> {
        self.map.read_or_recover()
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<IndexKey, KeyIndex>> {
        self.map.write_or_recover()
    }

    /// Replaces the whole index with one derived from the history tree, and tells
    /// `on_record` each record's key and lease (0 for a tombstone) in revision order.
    pub fn rebuild(
        &self,
        engine: &StoreEngine,
        on_record: &mut dyn FnMut(&[u8], i64),
    ) -> Result<(), MvccError> {
        let mut b = IndexBuilder::default();
        for item in engine.iter(Tree::Rev) {
            let (k, v) = item?;
            if !b.add(&k, &v, on_record)? {
                return Err(MvccError::corrupt("history records out of revision order"));
            }
        }
        b.finish(self);
        Ok(())
    }

    /// Compacts every key's index at `at` (see [`KeyIndex::compact`]) and returns the
    /// revisions removed, whose records are garbage. Takes the write lock for
    /// [`COMPACT_CHUNK`] keys at a time, so readers and the applier wait for a chunk, not for
    /// the whole index.
    pub fn compact(&self, at: i64) -> Vec<Revision> {
        let mut removed = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let mut map = self.write();
            let from = after.take();
            let from = from.as_deref().map(Probe::new);
            let lower = from
                .as_ref()
                .map_or(Bound::Unbounded, |p| Bound::Excluded(p as &dyn KeyProbe));
            let mut emptied = Vec::new();
            for (n, (k, ki)) in map
                .range_mut::<dyn KeyProbe, _>((lower, Bound::Unbounded))
                .take(COMPACT_CHUNK)
                .enumerate()
            {
                if n + 1 == COMPACT_CHUNK {
                    after = Some(k.bytes().to_vec());
                }
                let (rest, gone) = ki.compact(at);
                if gone.is_empty() {
                    continue;
                }
                removed.extend(gone);
                match rest {
                    Some(rest) => *ki = rest,
                    None => emptied.push(k.clone()),
                }
            }
            for k in emptied {
                map.remove(&k);
            }
            if after.is_none() {
                return removed;
            }
        }
    }

    /// Answers `q` about `key` without copying its revisions.
    pub fn find(&self, key: &[u8], q: Query) -> Option<Found> {
        self.read()
            .get::<dyn KeyProbe>(&Probe::new(key))
            .and_then(|ki| ki.query(q))
    }

    /// A copy of `key`'s index.
    #[cfg(test)]
    pub fn get_cloned(&self, key: &[u8]) -> Option<KeyIndex> {
        self.read().get::<dyn KeyProbe>(&Probe::new(key)).cloned()
    }

    /// Visits the indexes of the keys in `kr`, in key order, until `f` returns false.
    pub fn scan(&self, kr: &KeyRange, f: &mut dyn FnMut(&[u8], &KeyIndex) -> bool) {
        #[cfg(test)]
        let f = &mut |k: &[u8], ki: &KeyIndex| {
            tests::VISITED.with(|v| v.set(v.get() + 1));
            f(k, ki)
        };
        let map = self.read();
        match kr {
            KeyRange::Empty => {}
            KeyRange::Single(k) => {
                if let Some(ki) = map.get::<dyn KeyProbe>(&Probe::new(k)) {
                    f(k, ki);
                }
            }
            _ => {
                let (lo, hi) = kr.bounds();
                let (lo, hi) = (lo.map(Probe::new), hi.map(Probe::new));
                let bounds = (
                    lo.as_ref().map(|p| p as &dyn KeyProbe),
                    hi.as_ref().map(|p| p as &dyn KeyProbe),
                );
                for (k, ki) in map.range::<dyn KeyProbe, _>(bounds) {
                    if !f(k.bytes(), ki) {
                        break;
                    }
                }
            }
        }
    }

    /// Records a put (or, with `tombstone`, a delete) of `key` at `rev`.
    pub fn push(&self, key: &[u8], rev: Revision, tombstone: bool) {
        let mut map = self.write();
        if tombstone {
            map.get_mut::<dyn KeyProbe>(&Probe::new(key))
                .expect("tombstone of a key without index")
                .tombstone(rev);
        } else {
            match map.get_mut::<dyn KeyProbe>(&Probe::new(key)) {
                Some(ki) => ki.put(rev),
                None => {
                    let mut ki = KeyIndex::default();
                    ki.put(rev);
                    map.insert(IndexKey::from(key), ki);
                }
            }
        }
    }

    /// Records a put of `key` at `rev`, as [`Self::push`] does, and returns the
    /// `(create_revision, version)` of the value it replaces if that was live
    /// ([`KeyIndex::life`]): one lookup in the map for both.
    pub fn put(&self, key: &[u8], rev: Revision) -> Option<(i64, i64)> {
        let mut map = self.write();
        match map.get_mut::<dyn KeyProbe>(&Probe::new(key)) {
            Some(ki) => {
                let life = ki.life();
                ki.put(rev);
                life
            }
            None => {
                let mut ki = KeyIndex::default();
                ki.put(rev);
                map.insert(IndexKey::from(key), ki);
                None
            }
        }
    }

    /// Undoes the last [`Self::push`] (or [`Self::put`]) on `key`.
    pub fn unpush(&self, key: &[u8]) {
        let mut map = self.write();
        let probe = Probe::new(key);
        if let Some(ki) = map.get_mut::<dyn KeyProbe>(&probe) {
            if ki.unpush() {
                map.remove::<dyn KeyProbe>(&probe);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    thread_local! {
        /// Keys this thread's scans have visited: what a test counts to bound a request's cost.
        pub static VISITED: Cell<u64> = const { Cell::new(0) };
    }
}
