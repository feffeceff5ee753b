//! Replacing the whole store with a snapshot's content: [`MvccStore::load`].
//!
//! # Invariants
//! - A load is atomic with respect to a crash and reopen. The marker [`META_LOADING`] is
//!   durable before the first old entry is removed, and the load's last write removes it: one
//!   sled batch that writes the whole new meta tree, the caller's metadata (Raft's
//!   last-applied index and membership) included. sled recovers a prefix of its writes, so a
//!   store reopened without the marker holds the old content or all of the new one; with the
//!   marker it holds a mix, and [`MvccStore::load_interrupted`] tells the caller to load again.
//! - Entries are checked ([`check_entries`]) before anything is removed: a load refused for
//!   its content leaves the store as it was.
//! - A load does not exclude readers (the trees change under them); the caller keeps reads
//!   out while it runs.

use std::collections::BTreeMap;

use super::failpoint::crash_point;
use super::{
    exclude_images, MvccError, MvccStore, LEASE_TREE, LEGACY_IDX_TREE, META_TREE,
    RESERVED_META_PREFIX, REV_TREE,
};

/// Set in the meta tree while a load runs (see the module doc).
const META_LOADING: &[u8] = b"mvcc/loading";

/// History and lease entries per sled batch. Small under test, so the crash tests stop a load
/// between batches.
const BATCH: usize = if cfg!(test) { 4 } else { 1024 };

/// Checks that `entries` can be loaded (every tree is one of the store's), without loading.
pub fn check_entries<'a>(
    entries: impl IntoIterator<Item = &'a (String, Vec<u8>, Vec<u8>)>,
) -> Result<(), MvccError> {
    for (tree, _, _) in entries {
        if ![REV_TREE, LEASE_TREE, META_TREE, LEGACY_IDX_TREE].contains(&tree.as_str()) {
            return Err(MvccError::Storage(format!("unknown tree {tree:?}")));
        }
    }
    Ok(())
}

/// Collects writes to one tree into sled batches of [`BATCH`].
struct Batcher<'a> {
    db: &'a sled::Db,
    tree: &'a sled::Tree,
    batch: sled::Batch,
    len: usize,
}

impl<'a> Batcher<'a> {
    fn new(db: &'a sled::Db, tree: &'a sled::Tree) -> Self {
        Batcher {
            db,
            tree,
            batch: sled::Batch::default(),
            len: 0,
        }
    }

    fn insert(&mut self, k: Vec<u8>, v: Vec<u8>) -> Result<(), MvccError> {
        self.batch.insert(k, v);
        self.len += 1;
        if self.len >= BATCH {
            self.finish()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), MvccError> {
        if self.len > 0 {
            self.tree.apply_batch(std::mem::take(&mut self.batch))?;
            self.len = 0;
            crash_point(self.db)?;
        }
        Ok(())
    }
}

impl MvccStore {
    /// Replaces the whole store content with `entries` (as produced by [`Self::dump`]), then
    /// writes `meta` (`None` = delete) into [`META_TREE`] over what `entries` put there, in
    /// the same last write. Crash-atomic with [`Self::load_interrupted`] (see the module
    /// doc); flushes sled before it returns.
    pub fn load<I>(&self, entries: I, meta: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), MvccError>
    where
        I: IntoIterator<Item = (String, Vec<u8>, Vec<u8>)>,
    {
        if let Some((k, _)) = meta
            .iter()
            .find(|(k, _)| k.starts_with(RESERVED_META_PREFIX))
        {
            return Err(MvccError::ReservedMetaKey(k.clone()));
        }
        let entries: Vec<_> = entries.into_iter().collect();
        check_entries(&entries)?;
        let i = &self.inner;
        let _guard = i.apply_lock.lock().unwrap_or_else(|e| e.into_inner());
        let _no_images = exclude_images(&i.history_gate);
        i.pending.clear();
        i.meta.insert(META_LOADING, &b"1"[..])?;
        i.db.flush()?;
        crash_point(&i.db)?;

        // The old content goes; the meta tree keeps only the marker.
        i.rev.clear()?;
        crash_point(&i.db)?;
        i.lease.clear()?;
        crash_point(&i.db)?;
        let mut old_meta = sled::Batch::default();
        for k in i.meta.iter().keys() {
            let k = k?;
            if k != META_LOADING {
                old_meta.remove(k);
            }
        }
        i.meta.apply_batch(old_meta)?;
        crash_point(&i.db)?;

        let mut rev = Batcher::new(&i.db, &i.rev);
        let mut lease = Batcher::new(&i.db, &i.lease);
        let mut new_meta = BTreeMap::new();
        for (tree, k, v) in entries {
            match tree.as_str() {
                REV_TREE => rev.insert(k, v)?,
                LEASE_TREE => lease.insert(k, v)?,
                META_TREE if k != META_LOADING => {
                    new_meta.insert(k, Some(v));
                }
                _ => {}
            }
        }
        rev.finish()?;
        lease.finish()?;
        new_meta.extend(meta.iter().cloned());
        let mut last = sled::Batch::default();
        for (k, v) in new_meta {
            if let Some(v) = v {
                last.insert(k, v);
            }
        }
        last.remove(META_LOADING);
        i.meta.apply_batch(last)?;
        crash_point(&i.db)?;
        i.db.flush()?;
        self.rebuild_index()
    }

    /// Whether a [`Self::load`] was interrupted (by a crash): the store holds a mix of the old
    /// and the new content, and must be loaded again before it is used.
    pub fn load_interrupted(&self) -> Result<bool, MvccError> {
        Ok(self.get_meta(META_LOADING)?.is_some())
    }
}
