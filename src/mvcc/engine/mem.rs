//! A test-only [`Engine`] in memory, to run the contract tests against a second
//! implementation. Durability is modelled: [`MemEngine::crash`] returns the engine as the last
//! [`Engine::flush`] left it.
//!
//! # Invariants
//! - Every batch is applied under one write lock, so readers see all of it or none.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, RwLock};

use super::{Engine, Tree, WriteBatch};
use crate::mvcc::error::MvccError;
use crate::sync::LockExt;
use crate::sync::RwLockExt;

type Trees = BTreeMap<Tree, BTreeMap<Vec<u8>, Vec<u8>>>;

#[derive(Clone, Default)]
pub struct MemEngine {
    live: Arc<RwLock<Trees>>,
    durable: Arc<Mutex<Trees>>,
}

impl MemEngine {
    /// A new engine holding what was flushed, as a crash and restart would leave it.
    pub fn crash(&self) -> MemEngine {
        let durable = self.durable.lock_or_recover().clone();
        MemEngine {
            live: Arc::new(RwLock::new(durable.clone())),
            durable: Arc::new(Mutex::new(durable)),
        }
    }
}

fn is_empty_range(lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> bool {
    match (lo, hi) {
        (Bound::Included(l), Bound::Included(h)) => l > h,
        (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(h))
        | (Bound::Excluded(l), Bound::Included(h)) => l >= h,
        _ => false,
    }
}

impl Engine for MemEngine {
    type Bytes = Vec<u8>;
    type Iter = std::vec::IntoIter<Result<(Vec<u8>, Vec<u8>), MvccError>>;

    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, MvccError> {
        let live = self.live.read_or_recover();
        Ok(live.get(&tree).and_then(|t| t.get(key)).cloned())
    }

    fn range(&self, tree: Tree, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Self::Iter {
        let live = self.live.read_or_recover();
        let out: Vec<_> = match live.get(&tree) {
            Some(t) if !is_empty_range(lo, hi) => t
                .range::<[u8], _>((lo, hi))
                .map(|(k, v)| Ok((k.clone(), v.clone())))
                .collect(),
            _ => Vec::new(),
        };
        out.into_iter()
    }

    fn write(&self, batch: WriteBatch<'_>) -> Result<(), MvccError> {
        let mut live = self.live.write_or_recover();
        for (t, k, v) in batch.writes() {
            let tree = live.entry(*t).or_default();
            match v {
                Some(v) => tree.insert(k.to_vec(), v.to_vec()),
                None => tree.remove(&k[..]),
            };
        }
        Ok(())
    }

    fn clear(&self, tree: Tree) -> Result<(), MvccError> {
        self.live.write_or_recover().remove(&tree);
        Ok(())
    }

    fn flush(&self) -> Result<(), MvccError> {
        let live = self.live.read_or_recover().clone();
        *self.durable.lock_or_recover() = live;
        Ok(())
    }
}
