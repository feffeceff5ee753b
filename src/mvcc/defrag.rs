//! Defragmentation: the store's trees rewritten into a fresh engine, which then replaces the
//! old one under every handle.
//!
//! sled, like bbolt, does not give disk space back when records are deleted (a compaction
//! deletes most of the history); a copy of only the live records does. etcd's defrag copies
//! bbolt into a new file and swaps it in, blocking the member's backend meanwhile.
//!
//! # Invariants
//! - The copy is of one apply boundary: `apply_lock` is held from before the pending buffer is
//!   persisted until the new engine has replaced the old one, so no apply, snapshot image or
//!   load changes the trees meanwhile; the history gate keeps the collector (the only other
//!   writer) out. Readers go on, on the old engine, then on the new one: both hold the same
//!   records.
//! - The new engine is flushed before `commit` runs, and replaces the old one only if `commit`
//!   succeeds: the caller's durable switch (a crash before it reopens the old engine, after it
//!   the new one; both are whole).

use std::ops::Bound::Unbounded;

use crate::sync::LockExt;

use super::engine::{BulkWriter, Engine, StoreEngine, Tree, WriteBatch};
use super::error::MvccError;
use super::{exclude_images, MvccStore};

/// Records copied per engine batch.
const COPY_BATCH: usize = 1024;

/// What a defragmentation copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    pub records: u64,
    /// Keys and values, in bytes.
    pub bytes: u64,
}

impl MvccStore {
    /// Copies every tree into `fresh` (an empty engine), flushes it, runs `commit` (the
    /// caller's durable switch to it) and moves every handle of this store's engine to it.
    /// Applies wait meanwhile; reads do not. Returns the old engine, for the caller to close,
    /// and what was copied. On an error nothing changes here (`fresh` is left to the caller).
    pub fn defragment(
        &self,
        fresh: &StoreEngine,
        commit: impl FnOnce() -> Result<(), MvccError>,
    ) -> Result<(StoreEngine, Copied), MvccError> {
        let i = &self.inner;
        let _no_applies = i.apply_lock.lock_or_recover();
        let _no_deletions = exclude_images(&i.history_gate);
        i.persist_pending()?;
        let copied = copy_trees(&i.engine, fresh)?;
        fresh.flush()?;
        commit()?;
        Ok((i.engine.replace(fresh), copied))
    }

    /// Keys and values of every record in the store's trees, in bytes: what a defragmented
    /// engine holds, before the engine's own overhead. Reads the whole store.
    pub fn live_bytes(&self) -> Result<u64, MvccError> {
        self.persist_pending()?;
        let mut n = 0;
        for tree in Tree::ALL {
            for item in self.inner.engine.range(tree, Unbounded, Unbounded) {
                let (k, v) = item?;
                n += (k.len() + v.len()) as u64;
            }
        }
        Ok(n)
    }
}

fn copy_trees(from: &StoreEngine, to: &StoreEngine) -> Result<Copied, MvccError> {
    let mut copied = Copied::default();
    let mut out = BulkWriter::new(to);
    for tree in Tree::ALL {
        let mut batch = WriteBatch::default();
        for item in from.range(tree, Unbounded, Unbounded) {
            let (k, v) = item?;
            copied.records += 1;
            copied.bytes += (k.len() + v.len()) as u64;
            batch.put(tree, k.to_vec(), v.to_vec());
            if batch.len() >= COPY_BATCH {
                out.write(std::mem::take(&mut batch))?;
            }
        }
        out.write(batch)?;
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::tests::{compact, put, temp_store};

    #[test]
    fn defragmented_store_reads_the_same_and_shrinks_after_a_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let s = MvccStore::open(StoreEngine::open(&dir.path().join("a")).unwrap()).unwrap();
        let big = "x".repeat(1024);
        for i in 0..3000 {
            put(&s, &format!("k{}", i % 30), &big);
        }
        let at = s.current_revision();
        compact(&s, at).unwrap();
        s.settle();
        s.flush().unwrap();
        let before_size = s.engine().size_on_disk().unwrap();
        let before: Vec<_> = s.dump().map(Result::unwrap).collect();

        let fresh = StoreEngine::open(&dir.path().join("b")).unwrap();
        let mut committed = false;
        let (old, copied) = s
            .defragment(&fresh, || {
                committed = true;
                Ok(())
            })
            .unwrap();
        assert!(committed);
        assert_eq!(copied.records as usize, before.len());
        let after: Vec<_> = s.dump().map(Result::unwrap).collect();
        assert_eq!(after, before, "same trees after the copy");
        let after_size = s.engine().size_on_disk().unwrap();
        assert!(
            after_size * 3 < before_size,
            "defragmented {before_size} -> {after_size} bytes"
        );
        drop(old);

        // The store goes on, on the new engine (and only there).
        put(&s, "k1", "new");
        s.flush().unwrap();
        assert_eq!(s.get_at(b"k1", 0).unwrap().unwrap().value, b"new");
        assert!(fresh
            .get(Tree::Meta, b"mvcc/current_revision")
            .unwrap()
            .is_some());
        assert_eq!(s.get_at(b"k2", at).unwrap().unwrap().value, big.as_bytes());
        assert_eq!(s.get_at(b"k2", at - 1).unwrap_err(), MvccError::Compacted);
    }

    #[test]
    fn failed_commit_leaves_the_store_on_its_engine() {
        let (_d, db, s) = temp_store();
        put(&s, "a", "1");
        let fresh = StoreEngine::temporary().unwrap();
        let res = s.defragment(&fresh, || Err(MvccError::corrupt("switch failed")));
        assert_eq!(res.err(), Some(MvccError::corrupt("switch failed")));
        put(&s, "a", "2");
        s.flush().unwrap();
        let cur = |e: &StoreEngine| {
            e.get(Tree::Meta, b"mvcc/current_revision")
                .unwrap()
                .map(|v| v.to_vec())
        };
        assert_eq!(
            cur(&db),
            Some(3i64.to_be_bytes().to_vec()),
            "applies go on here"
        );
        assert_eq!(
            cur(&fresh),
            Some(2i64.to_be_bytes().to_vec()),
            "the copy is left as is"
        );
        assert_eq!(s.get_at(b"a", 0).unwrap().unwrap().value, b"2");
    }
}
