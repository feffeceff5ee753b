//! Which live keys each lease holds, in memory (etcd's lessor keeps the same item sets).
//!
//! A revoke deletes exactly the keys of its lease, and auth checks a revoke against those
//! keys, so both cost O(keys of the lease) instead of a scan of every live key.
//!
//! # Invariants
//! - `by_key[k] == l` exactly when key `k` is live and its current value carries lease `l`
//!   (non-zero), and then `k` is in `by_lease[l]`; no set in `by_lease` is empty.
//! - One writer, the applier, which changes it in step with the key index (and undoes its
//!   changes with them); it is rebuilt from the history with the key index on open and on
//!   a snapshot load. Readers outside the applier see it between two requests of a batch,
//!   which is fine for what they use it for (time-to-live answers, the API-layer permission
//!   pre-check that apply repeats).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use crate::sync::LockExt;

#[derive(Default)]
struct Maps {
    by_key: HashMap<Box<[u8]>, i64>,
    by_lease: HashMap<i64, BTreeSet<Box<[u8]>>>,
}

#[derive(Default)]
pub(crate) struct LeaseIndex {
    maps: Mutex<Maps>,
}

impl LeaseIndex {
    // The only writer is the applier, which takes the process down if it panics, so a
    // poisoned lock carries no information here.
    fn lock(&self) -> MutexGuard<'_, Maps> {
        self.maps.lock_or_recover()
    }

    /// Sets the lease of `key` (`0`: none, or the key is deleted) and returns the previous
    /// one, for undo.
    pub fn set(&self, key: &[u8], lease: i64) -> i64 {
        let mut m = self.lock();
        if lease == 0 && m.by_key.is_empty() {
            return 0;
        }
        m.set(key, lease)
    }

    /// The live keys of `lease`, in key order.
    pub fn keys(&self, lease: i64) -> Vec<Vec<u8>> {
        self.lock()
            .by_lease
            .get(&lease)
            .map(|s| s.iter().map(|k| k.to_vec()).collect())
            .unwrap_or_default()
    }

    /// Replaces the content with what `fill` reports: every history record in revision
    /// order as (key, lease), a tombstone as lease 0; a later record of a key replaces an
    /// earlier one.
    pub fn rebuild<E>(
        &self,
        fill: impl FnOnce(&mut dyn FnMut(&[u8], i64)) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut b = LeaseBuilder::default();
        fill(&mut |key, lease| b.set(key, lease))?;
        b.finish(self);
        Ok(())
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().by_key.len()
    }
}

/// A lease index built aside, from history records in revision order (see
/// [`LeaseIndex::rebuild`]), then put in place whole.
#[derive(Default)]
pub(crate) struct LeaseBuilder(Maps);

impl LeaseBuilder {
    /// Records that `key`'s latest record carries `lease` (0: none, or a tombstone).
    pub fn set(&mut self, key: &[u8], lease: i64) {
        self.0.set(key, lease);
    }

    /// Replaces `idx`'s whole content with what was set.
    pub fn finish(self, idx: &LeaseIndex) {
        *idx.lock() = self.0;
    }
}

impl Maps {
    fn set(&mut self, key: &[u8], lease: i64) -> i64 {
        let old = if lease == 0 {
            self.by_key.remove(key).unwrap_or(0)
        } else {
            match self.by_key.get_mut(key) {
                Some(l) => std::mem::replace(l, lease),
                None => {
                    self.by_key.insert(key.into(), lease);
                    0
                }
            }
        };
        if old == lease {
            return old;
        }
        if old != 0 {
            if let Some(set) = self.by_lease.get_mut(&old) {
                set.remove(key);
                if set.is_empty() {
                    self.by_lease.remove(&old);
                }
            }
        }
        if lease != 0 {
            self.by_lease.entry(lease).or_default().insert(key.into());
        }
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_move_detach() {
        let idx = LeaseIndex::default();
        assert_eq!(idx.set(b"a", 0), 0);
        assert_eq!(idx.set(b"b", 5), 0);
        assert_eq!(idx.set(b"a", 5), 0);
        assert_eq!(idx.keys(5), vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(idx.set(b"a", 6), 5);
        assert_eq!(idx.keys(5), vec![b"b".to_vec()]);
        assert_eq!(idx.keys(6), vec![b"a".to_vec()]);
        assert_eq!(idx.set(b"b", 0), 5);
        assert!(idx.keys(5).is_empty());
        assert_eq!(idx.len(), 1);
        idx.rebuild(|f| {
            f(b"x", 7);
            f(b"y", 7);
            f(b"x", 0);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(idx.keys(7), vec![b"y".to_vec()]);
        assert!(idx.keys(6).is_empty());
    }
}
