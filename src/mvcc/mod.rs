//! Multi-version key-value storage with etcd 3.4 semantics, on a storage [`engine`].
//!
//! # Layout
//! Three engine trees, changed through the write-back buffer of [`pending`]: an apply merges
//! its batch into memory, a committer thread persists it to the engine in one atomic batch
//! about every 100 ms:
//! - [`REV_TREE`]: the history. Key = main revision (8 bytes BE) ++ sub revision (8 bytes
//!   BE); value = one tombstone flag byte ++ prost-encoded `KeyValue`. Tombstones hold only
//!   `key` and `mod_revision`.
//! - [`LEASE_TREE`]: lease id (8 bytes BE) -> granted TTL in seconds (8 bytes BE). Which keys
//!   a lease holds is not stored: it is the set of live keys whose current `KeyValue.lease`
//!   is the id, kept in memory by [`index::lease`] in step with the key index and rebuilt
//!   with it, so a revoke costs O(keys of its lease).
//! - [`META_TREE`]: the current and compacted revision under keys starting with
//!   [`RESERVED_META_PREFIX`], plus whatever the caller passes to [`MvccStore::apply`].
//!
//! Beside them, in memory only: the pending writes ([`pending`]), the key index (user
//! key -> generations of revisions, like etcd's `keyIndex`), so "the key's revision visible
//! at R" needs no history scan, and the lease index (lease -> its live keys). The index is rebuilt from the history on open and on
//! snapshot load (see [`index::mem`]).
//!
//! # Invariants
//! - Every live key's `lease` is 0 or names a lease in [`LEASE_TREE`]: a put naming a
//!   missing lease fails, and revoking a lease deletes its keys in the same request.
//! - Every revision listed in a key index has a record in the history, and every record
//!   above the compacted revision is listed (below it, compacted records may wait for
//!   deletion).
//! - An empty store is at revision 1. Each write request that changes something bumps
//!   the revision by exactly one; its changes get sub revisions 0, 1, ...
//! - Compaction at C keeps, per key, the newest revision <= C unless it is a tombstone,
//!   and everything newer than C. Hence any revision R >= C reads the same data as before
//!   the compaction. The apply only publishes C; the key index and the history are
//!   compacted in the background once the batch is persisted (see [`garbage`]).
//! - The published current revision (an atomic) is raised only after the batch that
//!   produced it is in the pending buffer, so readers never look for data that is not there
//!   yet. Every read of the trees goes through the buffer first.
//!   The published compacted revision is raised *before* the compaction is applied, and
//!   readers check it again after reading: a read that raced with a compaction fails
//!   with [`MvccError::Compacted`] rather than returning partial data.
//! - The engine holds a prefix of the applied batches, whole batches only, including the
//!   caller's metadata; [`MvccStore::flush`] (and [`MvccStore::dump`]) persist everything
//!   first.
//! - One applier: [`MvccStore::apply`] and [`MvccStore::load`] serialize on a mutex;
//!   reads run concurrently and lock-free.
//! - History is deleted only by the background compaction ([`garbage`]) or a load, and both
//!   (and a [`defrag`], which replaces the engine) first wait until no snapshot [`Image`] is
//!   being copied: an image reads its history from
//!   the engine after applies have moved on, and everything up to its revision is still there.
//!   (An image may also hold compacted records not yet deleted; loading it compacts again.)
//!
//! # Modules
//! The internal modules form a DAG, lowest first: `error`; `engine`, `key_range`, `request`,
//! `check`; [`index`] (revisions and the record encoding, then the in-memory key index and
//! lease index over them); [`etcd`] (etcd's storage encoding, its images, and Go's sort for
//! etcd's order of ties; the image conversion comes after the store type); `garbage`;
//! `pending`; `view`; `apply`; this module with `load`, `hash` and `defrag` (more
//! `impl MvccStore`: snapshot loads, etcd's HashKV and kvd's Hash, defragmentation);
//! `failpoint` beside `engine`. A module uses only modules before it.

mod apply;
mod check;
mod defrag;
pub mod engine;
mod error;
pub mod etcd;
pub(crate) mod failpoint;
mod garbage;
mod hash;
mod index;
mod key_range;
mod load;
mod page_counts;
mod pending;
mod request;
mod view;

#[cfg(test)]
mod garbage_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Included, Unbounded};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

pub use check::{check_delete_range, check_put, check_range, check_txn, DEFAULT_MAX_TXN_OPS};
pub use defrag::Copied;
pub use engine::{Engine, EngineOptions, SledEngine, StoreEngine};
pub use error::{MvccError, StorageError};
pub use etcd::image::{entries_from_etcd, EtcdEntries, Pairs, TreeEntries, TreeEntry};
pub use hash::{Crc32c, KvHash};
pub use index::Revision;
pub use key_range::range_contains;
pub use load::{check_entries, stage, tree_name, LoadEntry, Staged};
pub use request::{WriteRequest, WriteResponse};

use apply::Batch;
use engine::Tree;
use index::lease::LeaseIndex;
use index::mem::MemIndex;
use index::{decode_i64, Query, Record};
use key_range::KeyRange;
use pending::{PendingWrites, MAX_PENDING};
use view::{range_at, Applied, View};

use crate::proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use crate::proto::mvccpb::{event::EventType, Event, KeyValue};
use crate::sync::LockExt;

/// Tree holding the history by revision.
pub const REV_TREE: &str = Tree::Rev.name();
/// Tree holding leases.
pub const LEASE_TREE: &str = Tree::Lease.name();
/// Tree holding MVCC metadata and the caller's metadata.
pub const META_TREE: &str = Tree::Meta.name();
/// Meta keys with this prefix belong to the MVCC layer; `apply` refuses them.
pub const RESERVED_META_PREFIX: &[u8] = b"mvcc/";

const META_CURRENT: &[u8] = b"mvcc/current_revision";
const META_COMPACTED: &[u8] = b"mvcc/compacted_revision";

/// A meta tree entry: key and value.
pub type MetaEntry = (Vec<u8>, Vec<u8>);

/// Compacted revision of a store that was never compacted (etcd's `compactMainRev`).
pub const NEVER_COMPACTED: i64 = -1;

/// Events read from the history by [`MvccStore::events_since`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Events {
    /// Events in revision order; `kv.mod_revision` is the event's revision.
    pub events: Vec<Event>,
    /// The revision to continue from: every event with a smaller revision that matches the
    /// key range has been returned.
    pub next_revision: i64,
}

struct Inner {
    engine: StoreEngine,
    idx: MemIndex,
    leases: LeaseIndex,
    pending: Arc<PendingWrites>,
    current: AtomicI64,
    compacted: AtomicI64,
    apply_lock: Mutex<()>,
    /// Read-held by every [`Image`] until its history is copied; the garbage collector and a
    /// load, which delete history, take it for writing. Images and loads take it under
    /// `apply_lock`; the collector only tries, between persists.
    history_gate: Arc<tokio::sync::RwLock<()>>,
    /// Counts carried between the pages of listings.
    page_counts: page_counts::PageCounts,
}

impl Inner {
    fn persist_pending(&self) -> Result<(), MvccError> {
        self.pending.persist(&self.engine)
    }
}

/// A snapshot image from [`MvccStore::image`]. Holding it delays compactions (not other
/// applies), so copy it promptly.
pub struct Image {
    engine: StoreEngine,
    upto: Revision,
    small: Vec<ImageRecord>,
    _hold: tokio::sync::OwnedRwLockReadGuard<()>,
}

/// One record of an [`Image`]: its tree's name, key and value as the engine holds them (not
/// copied).
pub type ImageRecord = (&'static str, EngineBytes, EngineBytes);

/// Bytes as the store's engine hands them out (a slice of its page, shared).
pub type EngineBytes = <StoreEngine as Engine>::Bytes;

impl Image {
    /// The image's entries as (tree name, key, value), in the form [`MvccStore::load`] takes:
    /// the history up to the image's revision (read from the engine now), then the small trees.
    pub fn entries(self) -> impl Iterator<Item = Result<(String, Vec<u8>, Vec<u8>), MvccError>> {
        self.records()
            .map(|r| r.map(|(tree, k, v)| (tree.to_string(), k.to_vec(), v.to_vec())))
    }

    /// [`Image::entries`] as the engine holds them, without a copy of each key and value (a
    /// snapshot being sent encodes them straight from the engine's pages).
    pub fn records(self) -> impl Iterator<Item = Result<ImageRecord, MvccError>> {
        let Image {
            engine,
            upto,
            small,
            _hold,
        } = self;
        engine
            .range(Tree::Rev, Unbounded, Included(&upto.to_bytes()[..]))
            .map(move |item| {
                // The gate is released when the history has been read, not before.
                let _ = &_hold;
                let (k, v) = item?;
                Ok((REV_TREE, k, v))
            })
            .chain(small.into_iter().map(Ok))
    }
}

/// Waits until no [`Image`] is being copied and keeps new ones from being taken. Blocks the
/// applier, but only for a compaction or a snapshot load that overlaps a snapshot copy.
fn exclude_images(gate: &Arc<tokio::sync::RwLock<()>>) -> tokio::sync::RwLockWriteGuard<'_, ()> {
    let mut waited = false;
    loop {
        if let Ok(g) = gate.try_write() {
            if waited {
                tracing::info!("deleting history waited for a snapshot copy");
            }
            return g;
        }
        waited = true;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

impl Drop for Inner {
    /// A store closed normally leaves nothing behind in memory (a crash may; Raft re-applies).
    fn drop(&mut self) {
        if let Err(e) = self.persist_pending() {
            tracing::error!(error = %e, "persisting pending MVCC writes on close");
        }
    }
}

/// Persists the pending buffer when due, and does the background compaction work between
/// persists, until the store is dropped.
fn run_committer(pending: Arc<PendingWrites>, store: Weak<Inner>) {
    let mut next_step = Instant::now();
    loop {
        let compacting = pending.garbage.has_work();
        let wait = if compacting {
            next_step.saturating_duration_since(Instant::now())
        } else {
            Duration::from_millis(200)
        };
        // The store is upgraded only for a due persist or a compaction step: a store closed
        // with nothing pending (the server flushes on stop) is never kept open, holding
        // the engine's lock, by this thread. A step runs under `enter`, which the last handle's
        // drop waits on (see `Closer`).
        if !pending.wait_due(wait) {
            if store.strong_count() == 0 {
                return;
            }
            if compacting && Instant::now() >= next_step {
                next_step = Instant::now() + compaction_step(&pending, &store);
            }
            continue;
        }
        let Some(inner) = store.upgrade() else { return };
        if let Err(e) = inner.persist_pending() {
            // The writes stay pending (and readable); retry, without spinning.
            tracing::error!(error = %e, "persisting pending MVCC writes");
            drop(inner);
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// One step of background compaction, unless the store is closed or gone. Returns how long
/// to rest before the next.
fn compaction_step(pending: &PendingWrites, store: &Weak<Inner>) -> Duration {
    let idle = Duration::from_millis(20);
    let Some(_running) = pending.garbage.enter() else {
        return idle;
    };
    let Some(inner) = store.upgrade() else {
        return idle;
    };
    match pending
        .garbage
        .step(&inner.idx, &inner.engine, &inner.history_gate)
    {
        Ok(garbage::Step::Worked { rest }) => rest,
        // A snapshot copy or a load holds the history.
        Ok(garbage::Step::Idle) => idle,
        Err(e) => {
            tracing::error!(error = %e, "deleting compacted history");
            Duration::from_secs(1)
        }
    }
}

/// Dropped with the last [`MvccStore`] handle, before the store itself: stops the garbage
/// collector and waits for its chunk in flight, so that the committer thread is not the one
/// holding the database open when the owner has let go of it (a reopen would fail on the
/// engine's lock).
struct Closer(Arc<PendingWrites>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.garbage.close();
    }
}

/// Handle to the MVCC store; cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct MvccStore {
    // Declared first: dropped before `inner`.
    _closer: Arc<Closer>,
    inner: Arc<Inner>,
}

impl MvccStore {
    /// Opens the store on `engine` (empty or holding a store).
    pub fn open(engine: StoreEngine) -> Result<Self, MvccError> {
        let inner = Inner {
            engine,
            idx: MemIndex::default(),
            leases: LeaseIndex::default(),
            pending: Arc::default(),
            current: AtomicI64::new(1),
            compacted: AtomicI64::new(NEVER_COMPACTED),
            apply_lock: Mutex::new(()),
            history_gate: Arc::new(tokio::sync::RwLock::new(())),
            page_counts: Default::default(),
        };
        let store = MvccStore {
            _closer: Arc::new(Closer(inner.pending.clone())),
            inner: Arc::new(inner),
        };
        store.rebuild_index()?;
        let (pending, weak) = (store.inner.pending.clone(), Arc::downgrade(&store.inner));
        std::thread::Builder::new()
            .name("mvcc-commit".into())
            .spawn(move || run_committer(pending, weak))
            .map_err(|e| MvccError::storage("starting the MVCC committer", e))?;
        Ok(store)
    }

    /// Derives the key index from the history, and the counters from the meta tree. Records
    /// that the stored compaction removed but that were not deleted yet (a crash or a close
    /// came first, or a snapshot image carried them) are dropped from the index again and
    /// queued for deletion.
    fn rebuild_index(&self) -> Result<(), MvccError> {
        let i = &self.inner;
        i.leases.rebuild(|f| i.idx.rebuild(&i.engine, f))?;
        self.index_rebuilt()
    }

    /// What follows a new key index (see [`Self::rebuild_index`]): the counters, page counts
    /// and compacted records that the index no longer names.
    fn index_rebuilt(&self) -> Result<(), MvccError> {
        let i = &self.inner;
        i.page_counts.clear();
        self.reload_counters()?;
        let compacted = self.compacted_revision();
        if compacted != NEVER_COMPACTED {
            let garbage = i.idx.compact(compacted);
            if !garbage.is_empty() {
                tracing::info!(
                    records = garbage.len(),
                    compacted,
                    "deleting compacted history left from before"
                );
            }
            i.pending.garbage.add(&garbage);
            i.pending.garbage.note(compacted);
        }
        Ok(())
    }

    fn reload_counters(&self) -> Result<(), MvccError> {
        let i = &self.inner;
        let cur = match self.get_meta(META_CURRENT)? {
            Some(v) => decode_i64(&v)?,
            None => 1,
        };
        let compacted = match self.get_meta(META_COMPACTED)? {
            Some(v) => decode_i64(&v)?,
            None => NEVER_COMPACTED,
        };
        i.current.store(cur, Ordering::SeqCst);
        i.compacted.store(compacted, Ordering::SeqCst);
        Ok(())
    }

    /// The revision of the last applied write (1 for an empty store).
    pub fn current_revision(&self) -> i64 {
        self.inner.current.load(Ordering::SeqCst)
    }

    /// The revision of the last compaction, or [`NEVER_COMPACTED`].
    pub fn compacted_revision(&self) -> i64 {
        self.inner.compacted.load(Ordering::SeqCst)
    }

    fn applied(&self) -> Applied<'_> {
        Applied {
            idx: &self.inner.idx,
            leases: &self.inner.leases,
            engine: &self.inner.engine,
            pending: &self.inner.pending,
        }
    }

    /// Fails if a compaction past `rev` was published while the caller was reading.
    fn recheck_compacted(&self, rev: i64) -> Result<(), MvccError> {
        if rev < self.compacted_revision() {
            return Err(MvccError::Compacted);
        }
        Ok(())
    }

    /// A range read at `req.revision` (0 = current), with etcd 3.4's semantics. The
    /// response header carries only `revision`: the store's current revision when the read
    /// began (etcd's `rr.Rev`), which is also the revision read at when `req.revision` is 0.
    /// Callers must report that one, not a fresh [`Self::current_revision`]: an apply between
    /// the read and a second look would pair the data with a newer revision than it shows.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        crate::metrics::MVCC_RANGE.inc();
        let _open = crate::metrics::OpenRead::start();
        let cur = self.current_revision();
        let compacted = self.compacted_revision();
        let counts = Some(&self.inner.page_counts);
        let mut resp = range_at(&self.applied(), req, cur, compacted, counts)?;
        let rev = if req.revision <= 0 { cur } else { req.revision };
        self.recheck_compacted(rev)?;
        resp.header = Some(ResponseHeader {
            revision: cur,
            ..Default::default()
        });
        Ok(resp)
    }

    /// Applies `reqs` in order and writes `meta` (`None` = delete) into [`META_TREE`], as one
    /// unit: they reach the engine in the same atomic batch (see [`pending`]), later. A request
    /// that fails changes nothing and gets its error in the returned vector; the outer error means
    /// nothing at all was written (a storage read failed, or a reserved meta key). Does not
    /// flush.
    pub fn apply(
        &self,
        reqs: &[WriteRequest],
        meta: &[(Vec<u8>, Option<Vec<u8>>)],
    ) -> Result<Vec<Result<WriteResponse, MvccError>>, MvccError> {
        self.apply_guarded(reqs, meta, &mut |_, _| true)
    }

    /// [`Self::apply`], asking `may_delete(i, key)` before the [`WriteRequest::LeaseRevoke`]
    /// at `reqs[i]` deletes `key`, for every key its lease holds at that point of the batch
    /// (after the requests before it), in key order; one refusal fails the revoke with
    /// [`MvccError::RevokeRefused`] and changes nothing. So a permission check on a lease's
    /// keys sees exactly the keys that applying the log one entry at a time would show it,
    /// however the log was cut into batches.
    pub fn apply_guarded(
        &self,
        reqs: &[WriteRequest],
        meta: &[(Vec<u8>, Option<Vec<u8>>)],
        may_delete: &mut dyn FnMut(usize, &[u8]) -> bool,
    ) -> Result<Vec<Result<WriteResponse, MvccError>>, MvccError> {
        if let Some((k, _)) = meta
            .iter()
            .find(|(k, _)| k.starts_with(RESERVED_META_PREFIX))
        {
            return Err(MvccError::ReservedMetaKey(k.clone()));
        }
        let i = &self.inner;
        let _guard = i.apply_lock.lock_or_recover();
        let old_cur = self.current_revision();
        let old_compacted = self.compacted_revision();
        let mut batch = Batch::new(self.applied(), old_cur, &i.compacted);
        let mut out = Vec::with_capacity(reqs.len());
        for (n, r) in reqs.iter().enumerate() {
            match batch.apply_one(r, &mut |key| may_delete(n, key)) {
                Err(MvccError::Storage(e)) => {
                    batch.rollback(old_compacted);
                    return Err(MvccError::Storage(e));
                }
                res => out.push(res),
            }
        }
        let (cur, compacted) = (batch.cur, batch.compacted);
        let mut layer = batch.take_writes();
        layer
            .meta
            .extend(meta.iter().map(|(k, v)| (k.clone(), v.clone())));
        if cur != old_cur {
            layer
                .meta
                .insert(META_CURRENT.to_vec(), Some(cur.to_be_bytes().to_vec()));
        }
        if compacted != old_compacted {
            layer.compacted = Some(compacted);
            // Already published (by the batch, before it changed the key index), so that
            // a reader that misses compacted data also sees the new compacted revision
            // when it re-checks.
            layer.meta.insert(
                META_COMPACTED.to_vec(),
                Some(compacted.to_be_bytes().to_vec()),
            );
        }
        let full = i.pending.merge(layer);
        i.current.store(cur, Ordering::SeqCst);
        if full {
            // The batch is in memory either way, but memory is not to grow without bound
            // while the engine fails: the apply fails, which stops Raft on this member (etcd
            // exits when bbolt cannot commit). Nothing is lost: the engine stays at an earlier
            // apply boundary and a restarted member re-applies from its log.
            i.persist_pending().map_err(|e| {
                MvccError::storage(
                    format!(
                        "cannot commit {MAX_PENDING} applied writes to the state-machine database"
                    ),
                    e,
                )
            })?;
        }
        Ok(out)
    }

    /// A value from [`META_TREE`].
    pub fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MvccError> {
        if let Some(v) = self.inner.pending.meta(key) {
            return Ok(v);
        }
        Ok(self.inner.engine.get(Tree::Meta, key)?.map(|v| v.to_vec()))
    }

    /// Every entry of [`META_TREE`] whose key starts with `prefix`, in key order. Persists the
    /// pending buffer first (so it reads the engine alone): for start-up and snapshot loads,
    /// not for the apply path.
    pub fn meta_scan(&self, prefix: &[u8]) -> Result<Vec<MetaEntry>, MvccError> {
        self.inner.persist_pending()?;
        let mut out = Vec::new();
        for item in self
            .inner
            .engine
            .range(Tree::Meta, Included(prefix), Unbounded)
        {
            let (k, v) = item?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    /// The value of `key` visible at `rev` (0 = current), if any.
    pub fn get_at(&self, key: &[u8], rev: i64) -> Result<Option<KeyValue>, MvccError> {
        let resp = self.range(&RangeRequest {
            key: key.to_vec(),
            revision: rev,
            ..Default::default()
        })?;
        Ok(resp.kvs.into_iter().next())
    }

    /// History events on keys in `key`/`range_end` (etcd range convention) with revision
    /// `>= start_rev`, up to the current revision. Stops after the revision in which the
    /// `limit`-th event falls (`limit == 0`: no limit), so a revision is never split.
    /// With `prev_kv`, each event carries the key's value before the event if it is still
    /// in the history. `start_rev < compacted revision` fails with `Compacted`.
    pub fn events_since(
        &self,
        start_rev: i64,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
        limit: usize,
    ) -> Result<Events, MvccError> {
        let cur = self.current_revision();
        let start = start_rev.max(1);
        if start < self.compacted_revision() {
            return Err(MvccError::Compacted);
        }
        let kr = KeyRange::new(key, range_end);
        let view = self.applied();
        let lo = Revision {
            main: start,
            sub: 0,
        };
        let hi = Revision {
            main: cur + 1,
            sub: 0,
        };
        let mut events = Vec::new();
        let mut next_revision = cur + 1;
        for item in self.history(lo, hi) {
            let (rev, rec) = item?;
            if !kr.contains(&rec.kv.key) {
                continue;
            }
            if rec.tombstone && rev.main <= self.compacted_revision() {
                // Compacted and not deleted yet (a tombstone at or below the compacted
                // revision is always removed; anything else here, at `start`, is kept).
                continue;
            }
            if limit > 0 && events.len() >= limit {
                let last = events
                    .last()
                    .map(|e: &Event| e.kv.as_ref().map_or(0, |kv| kv.mod_revision));
                if last != Some(rev.main) {
                    next_revision = rev.main;
                    break;
                }
            }
            let prev = if prev_kv {
                self.prev_of(&view, &rec.kv.key, rev)?
            } else {
                None
            };
            events.push(Event {
                r#type: if rec.tombstone {
                    EventType::Delete
                } else {
                    EventType::Put
                } as i32,
                kv: Some(rec.kv),
                prev_kv: prev,
            });
        }
        self.recheck_compacted(start)?;
        Ok(Events {
            events,
            next_revision,
        })
    }

    /// The history records in `[lo, hi)`, in revision order: the engine's merged with the
    /// pending buffer's (which wins where both have one).
    fn history(
        &self,
        lo: Revision,
        hi: Revision,
    ) -> impl Iterator<Item = Result<(Revision, Record), MvccError>> + '_ {
        // The pending snapshot is taken before the engine is read: whatever leaves the buffer
        // afterwards is in the engine by then (see `pending`).
        let mut pending = self.inner.pending.rev_range(lo, hi).into_iter().peekable();
        let mut stored = self
            .inner
            .engine
            .range(
                Tree::Rev,
                Included(&lo.to_bytes()[..]),
                Excluded(&hi.to_bytes()[..]),
            )
            .map(
                |item| -> Result<(Revision, <StoreEngine as Engine>::Bytes), MvccError> {
                    let (k, v) = item?;
                    Ok((Revision::from_bytes(&k)?, v))
                },
            )
            .peekable();
        std::iter::from_fn(move || loop {
            let take_stored = match (stored.peek(), pending.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) | (Some(Ok(_)), None) => true,
                (Some(Ok((s, _))), Some((p, _))) => s < p,
                (None, Some(_)) => false,
            };
            if take_stored {
                return stored.next().map(|item| {
                    let (r, v) = item?;
                    Ok((r, Record::decode(&v)?))
                });
            }
            let (r, v) = pending.next()?;
            if matches!(stored.peek(), Some(Ok((s, _))) if *s == r) {
                stored.next();
            }
            if let Some(v) = v {
                return Some(Record::decode(&v).map(|rec| (r, rec)));
            }
        })
    }

    fn prev_of(
        &self,
        view: &Applied<'_>,
        key: &[u8],
        rev: Revision,
    ) -> Result<Option<KeyValue>, MvccError> {
        let Some(found) = view.find(key, Query::Before(rev))? else {
            return Ok(None);
        };
        if found.tombstone {
            return Ok(None);
        }
        Ok(view.record(found.rev)?.map(|r| r.kv))
    }

    /// A point-in-time image of the store for a snapshot, cheap to take: it persists the
    /// pending buffer, copies the small trees and notes the current revision. The history is
    /// copied later by [`Image::entries`], while applies go on: new revisions land above the
    /// image's bound, and compactions (the only deletions of history) wait until every image
    /// has been copied or dropped.
    pub fn image(&self) -> Result<Image, MvccError> {
        let i = &self.inner;
        let _guard = i.apply_lock.lock_or_recover();
        // Under `apply_lock` no load holds the gate; background compaction may, for a step.
        let hold = loop {
            match i.history_gate.clone().try_read_owned() {
                Ok(hold) => break hold,
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        i.persist_pending()?;
        let upto = Revision {
            main: self.current_revision(),
            sub: i64::MAX,
        };
        let mut small = Vec::new();
        for tree in [Tree::Meta, Tree::Lease] {
            for item in i.engine.iter(tree) {
                let (k, v) = item?;
                small.push((tree.name(), k, v));
            }
        }
        Ok(Image {
            engine: i.engine.clone(),
            upto,
            small,
            _hold: hold,
        })
    }

    /// Whether an [`Image`] is held (or a compaction step is deleting history right now): a
    /// defragmentation or a load would wait for it.
    pub fn images_held(&self) -> bool {
        self.inner.history_gate.try_write().is_err()
    }

    /// Every entry of the MVCC trees as (tree name, key, value): [`Self::image`] copied at
    /// once.
    pub fn dump(&self) -> impl Iterator<Item = Result<(String, Vec<u8>, Vec<u8>), MvccError>> + '_ {
        let (image, failed) = match self.image() {
            Ok(image) => (Some(image), None),
            Err(e) => (None, Some(Err(e))),
        };
        failed
            .into_iter()
            .chain(image.into_iter().flat_map(Image::entries))
    }

    /// The granted TTL of lease `id`, if the lease exists.
    pub fn lease_ttl(&self, id: i64) -> Result<Option<i64>, MvccError> {
        self.applied().lease_ttl(id)
    }

    /// Every lease as (id, granted TTL), by id.
    pub fn leases(&self) -> Result<Vec<(i64, i64)>, MvccError> {
        self.leases_between(|| {})
    }

    /// [`Self::leases`], running `between` after the pending snapshot and before the engine
    /// is read: tests persist there, which is where a concurrent persist can land.
    fn leases_between(&self, between: impl FnOnce()) -> Result<Vec<(i64, i64)>, MvccError> {
        // Pending first (see `pending`): a batch persisted after this snapshot is in the
        // engine by the time the engine is read; read the other way round, it would be in
        // neither.
        let pending = self.inner.pending.leases();
        between();
        let mut all = BTreeMap::new();
        for item in self.inner.engine.iter(Tree::Lease) {
            let (k, v) = item?;
            all.insert(decode_i64(&k)?, decode_i64(&v)?);
        }
        for (id, ttl) in pending {
            match ttl {
                Some(t) => all.insert(id, t),
                None => all.remove(&id),
            };
        }
        Ok(all.into_iter().collect())
    }

    /// The live keys attached to lease `id`, in key order, from the lease index: O(keys of
    /// the lease).
    pub fn lease_keys(&self, id: i64) -> Vec<Vec<u8>> {
        self.inner.leases.keys(id)
    }

    /// Writes the pending buffer to the engine now (the committer does so within
    /// [`pending::COMMIT_INTERVAL`] anyway). Not durable until [`Self::flush`].
    pub fn persist_pending(&self) -> Result<(), MvccError> {
        self.inner.persist_pending()
    }

    /// Persists the pending buffer, then waits until background compaction is done.
    #[cfg(test)]
    pub fn settle(&self) {
        self.persist_pending().unwrap();
        loop {
            // With no step in flight (a step may take the last work and add more).
            let running = self.inner.pending.garbage.enter();
            if !self.inner.pending.garbage.has_work() {
                return;
            }
            drop(running);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until the compaction at `rev` (applied on this store) has deleted every record
    /// it removed from the engine, then makes that durable: etcd's physical compaction, which
    /// answers only once its records are gone (and force-commits bbolt).
    pub async fn wait_physically_compacted(&self, rev: i64) -> Result<(), MvccError> {
        self.inner.pending.garbage.wait_done(rev).await;
        let engine = self.inner.engine.clone();
        tokio::task::spawn_blocking(move || engine.flush())
            .await
            .map_err(|e| MvccError::storage("flushing after a compaction", e))?
    }

    /// Persists the pending buffer and flushes the engine (apply never does).
    pub fn flush(&self) -> Result<(), MvccError> {
        self.inner.persist_pending()?;
        self.inner.engine.flush()
    }

    /// The engine under the store.
    pub fn engine(&self) -> &StoreEngine {
        &self.inner.engine
    }
}
