//! Applied writes not yet persisted to the engine: the write-back buffer in front of the
//! trees.
//!
//! An apply only merges its batch into [`PendingWrites`]' *active* layer; a committer thread
//! persists the layer to the engine in one atomic batch every [`COMMIT_INTERVAL`], as etcd
//! commits bbolt's batch transaction every 100 ms or 10,000 writes with reads going through a
//! buffer of the uncommitted part. An apply that fills the layer to [`MAX_PENDING`] writes
//! persists it itself, so memory stays bounded when applies outrun the engine. Why a buffer
//! at all: docs/decisions/mvcc-0001-pending-buffer.md.
//!
//! # Invariants
//! - Every read goes pending first, then the engine: (active, frozen) are looked at under one
//!   read lock, newest layer first. [`PendingWrites::persist`] freezes the active layer,
//!   writes the frozen layer to the engine, and only then drops it, so an entry that is in
//!   neither layer is in the engine (or was never written). Range reads merge a snapshot of
//!   both layers over a live engine scan; an entry in both agrees, and pending wins.
//! - The engine only ever holds whole layers: a layer is one atomic engine batch holding every
//!   tree's writes, including the caller's metadata (the Raft last-applied index). So after a
//!   crash the engine is at some past apply boundary, never between, and Raft re-applies the
//!   rest from its log.
//! - One persister at a time (`persist_lock`), and the frozen layer is replaced only after it
//!   is in the engine; a failed persist keeps it frozen (readers still see it) and is retried.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use crate::sync::LockExt;
use crate::sync::RwLockExt;

use super::engine::{Engine, StoreEngine, Tree, WriteBatch};
use super::error::MvccError;
use super::garbage::Garbage;
use super::index::Revision;

/// How long applied writes may wait in memory before the committer persists them (etcd's
/// `--backend-batch-interval` default).
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// Pending writes that make the committer start at once (etcd's `--backend-batch-limit`).
pub const MAX_PENDING: usize = 10_000;

/// One set of tree writes; `None` deletes.
#[derive(Default, Debug)]
pub(crate) struct Layer {
    pub rev: BTreeMap<Revision, Option<Vec<u8>>>,
    pub meta: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Lease id -> granted TTL.
    pub lease: BTreeMap<i64, Option<i64>>,
    /// The revision of a compaction applied in this layer. Once the layer is persisted,
    /// [`Garbage`] compacts the key index and deletes the removed records.
    pub compacted: Option<i64>,
}

impl Layer {
    pub fn len(&self) -> usize {
        self.rev.len() + self.meta.len() + self.lease.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0 && self.compacted.is_none()
    }

    /// Takes `newer`'s writes over this layer's.
    fn absorb(&mut self, newer: Layer) {
        self.rev.extend(newer.rev);
        self.meta.extend(newer.meta);
        self.lease.extend(newer.lease);
        self.compacted = newer.compacted.or(self.compacted);
    }
}

#[derive(Default)]
struct State {
    active: Layer,
    /// Being persisted by the committer.
    frozen: Option<Arc<Layer>>,
    /// When the oldest write in `active` arrived.
    since: Option<Instant>,
}

#[derive(Default)]
pub(crate) struct PendingWrites {
    state: RwLock<State>,
    persist_lock: Mutex<()>,
    /// Persisted compactions whose index and history are still to be compacted.
    pub garbage: Garbage,
    /// Test failpoint: every persist fails as an engine error would, after freezing the layer.
    #[cfg(test)]
    pub fail_persists: std::sync::atomic::AtomicBool,
}

impl PendingWrites {
    // Readers and the persister cannot leave the state half-changed by panicking (every
    // change is one assignment), so poisoning carries no information.
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read_or_recover()
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write_or_recover()
    }

    /// Looks `f` up in the active layer, then the frozen one; `None`: not pending, ask the
    /// engine.
    fn lookup<T>(&self, f: impl Fn(&Layer) -> Option<T>) -> Option<T> {
        let st = self.read();
        f(&st.active).or_else(|| st.frozen.as_deref().and_then(&f))
    }

    /// A history record: `Some(None)` if pending removal, `None` if not pending.
    pub fn rev(&self, r: Revision) -> Option<Option<Vec<u8>>> {
        self.lookup(|l| l.rev.get(&r).cloned())
    }

    pub fn meta(&self, k: &[u8]) -> Option<Option<Vec<u8>>> {
        self.lookup(|l| l.meta.get(k).cloned())
    }

    pub fn lease(&self, id: i64) -> Option<Option<i64>> {
        self.lookup(|l| l.lease.get(&id).copied())
    }

    /// Pending history writes in `[lo, hi)`, newest layer winning.
    pub fn rev_range(&self, lo: Revision, hi: Revision) -> BTreeMap<Revision, Option<Vec<u8>>> {
        let st = self.read();
        let mut out = BTreeMap::new();
        if let Some(f) = &st.frozen {
            out.extend(f.rev.range(lo..hi).map(|(r, v)| (*r, v.clone())));
        }
        out.extend(st.active.rev.range(lo..hi).map(|(r, v)| (*r, v.clone())));
        out
    }

    /// Every pending lease write, newest layer winning.
    pub fn leases(&self) -> BTreeMap<i64, Option<i64>> {
        let st = self.read();
        let mut out = BTreeMap::new();
        if let Some(f) = &st.frozen {
            out.extend(f.lease.iter().map(|(k, v)| (*k, *v)));
        }
        out.extend(st.active.lease.iter().map(|(k, v)| (*k, *v)));
        out
    }

    /// Adds an applied batch. Returns whether the buffer (both layers) is full: the caller must
    /// then [`Self::persist`] before applying more (back-pressure: applies can outrun the
    /// engine).
    pub fn merge(&self, batch: Layer) -> bool {
        let mut st = self.write();
        st.since.get_or_insert_with(Instant::now);
        st.active.absorb(batch);
        st.active.len() + st.frozen.as_ref().map_or(0, |f| f.len()) >= MAX_PENDING
    }

    /// Waits until a persist is due (the interval elapsed with writes pending), or at most
    /// `max`. Returns whether one is due.
    pub fn wait_due(&self, max: Duration) -> bool {
        let due_in = self
            .read()
            .since
            .map(|s| COMMIT_INTERVAL.saturating_sub(s.elapsed()));
        match due_in {
            Some(Duration::ZERO) => true,
            Some(d) if d <= max => {
                std::thread::sleep(d);
                true
            }
            _ => {
                std::thread::sleep(max);
                false
            }
        }
    }

    /// Writes everything pending at the call to `engine`, one atomic batch per layer (a layer
    /// left frozen by a failed persist goes first), and drops it from memory. Writes merged
    /// while it runs wait for the next persist: looping until the buffer is empty would, under
    /// a steady load, persist ever smaller layers back to back. Safe to call from any thread,
    /// concurrently with applies and reads.
    pub fn persist(&self, engine: &StoreEngine) -> Result<(), MvccError> {
        let _one = self.persist_lock.lock_or_recover();
        for _ in 0..2 {
            let (frozen, leftover) = {
                let mut st = self.write();
                let leftover = st.frozen.is_some();
                if !leftover {
                    if st.active.is_empty() {
                        st.since = None;
                        return Ok(());
                    }
                    st.frozen = Some(Arc::new(std::mem::take(&mut st.active)));
                    st.since = None;
                }
                (st.frozen.clone().expect("set above"), leftover)
            };
            #[cfg(test)]
            if self.fail_persists.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(MvccError::corrupt("injected persist failure"));
            }
            let started = Instant::now();
            engine.write(layer_batch(&frozen))?;
            crate::metrics::BACKEND_COMMIT.observe(started.elapsed());
            if let Some(at) = frozen.compacted {
                self.garbage.schedule(at);
            }
            self.write().frozen = None;
            if !leftover {
                break;
            }
        }
        Ok(())
    }

    /// Writes held in memory (both layers).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let st = self.read();
        st.active.len() + st.frozen.as_ref().map_or(0, |f| f.len())
    }

    /// Forgets everything pending (the trees are being replaced by a snapshot).
    pub fn clear(&self) {
        let _one = self.persist_lock.lock_or_recover();
        *self.write() = State::default();
        self.garbage.clear();
    }
}

/// The engine batch that persists `l`: the history, then the meta tree, then leases.
fn layer_batch(l: &Layer) -> WriteBatch<'_> {
    let mut b = WriteBatch::default();
    for (r, v) in &l.rev {
        b.set(Tree::Rev, r.to_bytes().to_vec(), v.as_deref());
    }
    for (k, v) in &l.meta {
        b.set(Tree::Meta, &k[..], v.as_deref());
    }
    for (id, ttl) in &l.lease {
        b.set(
            Tree::Lease,
            id.to_be_bytes().to_vec(),
            ttl.map(|t| t.to_be_bytes().to_vec()),
        );
    }
    b
}
