//! Replacing the whole store with a snapshot's content: in place ([`MvccStore::load`]), or
//! written into a fresh engine aside ([`stage`]) that then replaces the store's own
//! ([`MvccStore::install_staged`]).
//!
//! # Invariants
//! - A load is atomic with respect to a crash and reopen. The marker [`META_LOADING`] is
//!   durable before the first old entry is removed, and the load's last write removes it: one
//!   engine batch that writes the whole new meta tree, the caller's metadata (Raft's
//!   last-applied index and membership) included. The engine recovers a prefix of its batches
//!   (see [`super::engine`]), so a store reopened without the marker holds the old content or
//!   all of the new one; with the marker it holds a mix, and [`MvccStore::load_interrupted`]
//!   tells the caller to load again.
//! - [`MvccStore::load`] checks its entries ([`check_entries`]) before anything is removed: a
//!   load refused for its content leaves the store as it was. [`MvccStore::load_from`] streams
//!   its entries (it never holds them all): its caller checks them first, and an entry
//!   refused or an error of the source midway leaves an interrupted load (the marker set).
//! - The key and lease indexes after a load are those a reopen derives from the engine: a
//!   load builds them from the history records it writes, in revision order (as a dump
//!   lists them), and derives them from the engine after the load when the records came in
//!   another order.
//! - A staged engine is no store's until it is installed: [`stage`] writes it whole (the meta
//!   tree last) and flushes it; crash safety is the caller's switch, run by
//!   [`MvccStore::install_staged`] before any handle moves, so a crash leaves the old engine
//!   or the staged one, each whole.
//! - A load's entries are decoded (and the indexes built) on the caller's thread while a second
//!   thread writes the engine batches, in the order they were made: when either stops, the
//!   engine holds a prefix of the batches, as above.
//! - A load's memory does not grow with its size: the queues between its threads are bounded,
//!   and so is what the engine holds unwritten ([`BulkWriter`]).
//! - A load does not exclude readers (the trees change under them); the caller keeps reads
//!   out while it runs.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, SyncSender};

use bytes::Bytes;

use crate::sync::LockExt;

use super::engine::{Buf, BulkWriter, Engine, StoreEngine, Tree, WriteBatch, LEGACY_IDX_TREE};
use super::error::{MvccError, StorageError};
use super::failpoint::{crash_point, Armed};
use super::index::lease::LeaseBuilder;
use super::index::mem::IndexBuilder;
use super::{exclude_images, MvccStore, LEASE_TREE, META_TREE, RESERVED_META_PREFIX, REV_TREE};

/// Set in the meta tree while a load runs (see the module doc).
const META_LOADING: &[u8] = b"mvcc/loading";

/// History and lease entries per engine batch. Small under test, so the crash tests stop a load
/// between batches.
const BATCH: usize = if cfg!(test) { 4 } else { 1024 };

/// An entry of a snapshot or a dump, as a load takes it: its tree's name, key and value.
pub trait LoadEntry {
    /// The name of the entry's tree.
    fn tree(&self) -> &str;
    /// The entry's key and value.
    fn into_parts(self) -> (Buf<'static>, Buf<'static>);
}

/// An entry decoded into buffers of its own.
impl LoadEntry for (String, Vec<u8>, Vec<u8>) {
    fn tree(&self) -> &str {
        &self.0
    }

    fn into_parts(self) -> (Buf<'static>, Buf<'static>) {
        (self.1.into(), self.2.into())
    }
}

/// An entry lent from the buffer it was received in (a snapshot's chunk).
impl LoadEntry for (Cow<'static, str>, Bytes, Bytes) {
    fn tree(&self) -> &str {
        &self.0
    }

    fn into_parts(self) -> (Buf<'static>, Buf<'static>) {
        (self.1.into(), self.2.into())
    }
}

/// The store's own tree named `name`, as a `'static` name; `None` for any other name.
pub fn tree_name(name: &[u8]) -> Option<&'static str> {
    [REV_TREE, LEASE_TREE, META_TREE, LEGACY_IDX_TREE]
        .into_iter()
        .find(|t| t.as_bytes() == name)
}

/// Checks that `entries` can be loaded (every tree is one of the store's), without loading.
pub fn check_entries<'a, T: LoadEntry + 'a>(
    entries: impl IntoIterator<Item = &'a T>,
) -> Result<(), MvccError> {
    for e in entries {
        let tree = e.tree();
        if tree_name(tree.as_bytes()).is_none() {
            return Err(MvccError::corrupt(format!("unknown tree {tree:?}")));
        }
    }
    Ok(())
}

/// Engine batches queued between the thread that decodes a load's entries and the one that
/// writes them (see [`write_trees`]).
const QUEUED_BATCHES: usize = 2;

/// The writing thread has stopped (on an engine error, which it returns).
struct WriterStopped;

/// Collects writes to one tree into engine batches of [`BATCH`], handed to the writing thread.
struct Batcher<'a> {
    to_writer: &'a SyncSender<WriteBatch<'static>>,
    tree: Tree,
    batch: WriteBatch<'static>,
}

impl<'a> Batcher<'a> {
    fn new(to_writer: &'a SyncSender<WriteBatch<'static>>, tree: Tree) -> Self {
        Batcher {
            to_writer,
            tree,
            batch: WriteBatch::default(),
        }
    }

    fn insert(&mut self, k: Buf<'static>, v: Buf<'static>) -> Result<(), WriterStopped> {
        self.batch.put(self.tree, k, v);
        if self.batch.len() >= BATCH {
            self.finish()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), WriterStopped> {
        if !self.batch.is_empty() {
            self.to_writer
                .send(std::mem::take(&mut self.batch))
                .map_err(|_| WriterStopped)?;
        }
        Ok(())
    }
}

impl MvccStore {
    /// Replaces the whole store content with `entries` (as produced by [`Self::dump`]), then
    /// writes `meta` (`None` = delete) into [`META_TREE`] over what `entries` put there, in
    /// the same last write. Crash-atomic with [`Self::load_interrupted`] (see the module
    /// doc); flushes the engine before it returns.
    pub fn load<I>(&self, entries: I, meta: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), MvccError>
    where
        I: IntoIterator<Item = (String, Vec<u8>, Vec<u8>)>,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        check_entries(&entries)?;
        self.load_from(entries.into_iter().map(Ok::<_, MvccError>), meta)
    }

    /// [`Self::load`] from a fallible stream of entries, read one at a time, in engine
    /// batches: memory does not grow with the number of entries (beyond the key index every
    /// store keeps). The caller checks the entries first (see the module doc).
    pub fn load_from<I, T, E>(
        &self,
        entries: I,
        meta: &[(Vec<u8>, Option<Vec<u8>>)],
    ) -> Result<(), E>
    where
        I: IntoIterator<Item = Result<T, E>>,
        T: LoadEntry,
        E: From<MvccError>,
    {
        check_meta(meta)?;
        let i = &self.inner;
        let _guard = i.apply_lock.lock_or_recover();
        let _no_images = exclude_images(&i.history_gate);
        let engine = &i.engine;
        i.pending.clear();
        let mut marker = WriteBatch::default();
        marker.put(Tree::Meta, META_LOADING, &b"1"[..]);
        engine.write(marker)?;
        engine.flush()?;
        crash_point(engine)?;

        // The old content goes; the meta tree keeps only the marker.
        engine.clear(Tree::Rev)?;
        crash_point(engine)?;
        engine.clear(Tree::Lease)?;
        crash_point(engine)?;
        let mut old_meta = WriteBatch::default();
        for item in engine.iter(Tree::Meta) {
            let (k, _) = item?;
            if &k[..] != META_LOADING {
                old_meta.delete(Tree::Meta, k.to_vec());
            }
        }
        engine.write(old_meta)?;
        crash_point(engine)?;

        let (mut new_meta, built) = write_trees(engine, entries)?;
        new_meta.extend(meta.iter().cloned());
        let mut last = meta_batch(new_meta);
        last.delete(Tree::Meta, META_LOADING);
        engine.write(last)?;
        crash_point(engine)?;
        engine.flush()?;
        match built {
            Some((idx, leases)) => {
                idx.finish(&i.idx);
                leases.finish(&i.leases);
                Ok(self.index_rebuilt()?)
            }
            None => Ok(self.rebuild_index()?),
        }
    }

    /// Makes `fresh`, written by [`stage`], this store's engine: runs `commit` (the caller's
    /// durable switch to it), then moves every handle of this store's engine to it and takes
    /// the key and lease indexes from the staging. Applies and images wait meanwhile; readers
    /// see the old content or the new one (the caller keeps them out if a mix of answers
    /// across the switch matters). Returns the old engine, for the caller to close. On an
    /// error of `commit` nothing changes here.
    pub fn install_staged(
        &self,
        fresh: &StoreEngine,
        staged: Staged,
        commit: impl FnOnce() -> Result<(), MvccError>,
    ) -> Result<StoreEngine, MvccError> {
        let i = &self.inner;
        let _guard = i.apply_lock.lock_or_recover();
        let _no_images = exclude_images(&i.history_gate);
        commit()?;
        // What was applied and not yet persisted belongs to the old content.
        i.pending.clear();
        let old = i.engine.replace(fresh);
        match staged.built {
            Some((idx, leases)) => {
                idx.finish(&i.idx);
                leases.finish(&i.leases);
                self.index_rebuilt()?;
            }
            None => self.rebuild_index()?,
        }
        Ok(old)
    }

    /// Whether a [`Self::load`] was interrupted (by a crash): the store holds a mix of the old
    /// and the new content, and must be loaded again before it is used.
    pub fn load_interrupted(&self) -> Result<bool, MvccError> {
        Ok(self.get_meta(META_LOADING)?.is_some())
    }
}

/// The trees of `entries` written into `engine` in batches: the history and leases as they
/// come, the meta tree's entries returned (they go in the caller's last write), with the key
/// and lease indexes built on the way while the history comes in revision order.
///
/// The entries are decoded (and the indexes built) on the calling thread while a second
/// thread writes the batches, in the order they were made, so the engine holds a prefix of
/// them whenever it stops. An engine error stops both; an entry's error stops the decoding,
/// and the batches made before it are written.
fn write_trees<I, T, E>(engine: &StoreEngine, entries: I) -> Result<(MetaWrites, Built), E>
where
    I: IntoIterator<Item = Result<T, E>>,
    T: LoadEntry,
    E: From<MvccError>,
{
    let armed = Armed::take();
    let (to_writer, batches) = sync_channel::<WriteBatch<'static>>(QUEUED_BATCHES);
    std::thread::scope(|s| {
        let writer = std::thread::Builder::new()
            .name("kvd-load-writer".into())
            .spawn_scoped(s, move || {
                armed.enter();
                let mut out = BulkWriter::new(engine);
                let written = batches.into_iter().try_for_each(|b| {
                    out.write(b)?;
                    crash_point(engine)
                });
                (written, Armed::take())
            })
            .map_err(|e| {
                MvccError::Storage(StorageError::caused("starting the engine writer thread", e))
            })?;
        let decoded = decode_trees(entries, &to_writer);
        drop(to_writer);
        let (written, armed) = writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        armed.enter();
        written?;
        match decoded? {
            Ok(done) => Ok(done),
            // The writer stops early only on an error, returned above.
            Err(WriterStopped) => Err(MvccError::Storage(StorageError::new(
                "the engine writer stopped without an error",
            ))
            .into()),
        }
    })
}

/// The decoding half of [`write_trees`]: batches sent to the writer, the meta writes and the
/// indexes returned; `Ok(Err(WriterStopped))` when the writer stopped first.
fn decode_trees<I, T, E>(
    entries: I,
    to_writer: &SyncSender<WriteBatch<'static>>,
) -> Result<Result<(MetaWrites, Built), WriterStopped>, E>
where
    I: IntoIterator<Item = Result<T, E>>,
    T: LoadEntry,
    E: From<MvccError>,
{
    let mut rev = Batcher::new(to_writer, Tree::Rev);
    let mut lease = Batcher::new(to_writer, Tree::Lease);
    let mut new_meta = BTreeMap::new();
    // Dropped (and derived from the engine after the load, as on open) at the first record
    // out of order or that does not decode.
    let mut built = Some((IndexBuilder::default(), LeaseBuilder::default()));
    for entry in entries {
        let entry = entry?;
        check_entries([&entry])?;
        // One of the store's trees, as checked: a name that outlives the entry.
        let tree = tree_name(entry.tree().as_bytes()).unwrap_or(LEGACY_IDX_TREE);
        let (k, v) = entry.into_parts();
        let sent = match tree {
            REV_TREE => {
                if let Some((idx, leases)) = built.as_mut() {
                    if !matches!(idx.add(&k, &v, &mut |key, l| leases.set(key, l)), Ok(true)) {
                        built = None;
                    }
                }
                rev.insert(k, v)
            }
            LEASE_TREE => lease.insert(k, v),
            META_TREE if &k[..] != META_LOADING => {
                new_meta.insert(k.to_vec(), Some(v.to_vec()));
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(stopped) = sent {
            return Ok(Err(stopped));
        }
    }
    Ok(rev
        .finish()
        .and_then(|()| lease.finish())
        .map(|()| (new_meta, built)))
}

/// Refuses caller metadata under the store's own prefix.
fn check_meta(meta: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), MvccError> {
    match meta
        .iter()
        .find(|(k, _)| k.starts_with(RESERVED_META_PREFIX))
    {
        Some((k, _)) => Err(MvccError::ReservedMetaKey(k.clone())),
        None => Ok(()),
    }
}

/// Meta tree writes by key (`None` = delete).
type MetaWrites = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The key and lease indexes built from a load's history, if it came in revision order.
type Built = Option<(IndexBuilder, LeaseBuilder)>;

/// One engine batch writing `writes` into the meta tree.
fn meta_batch(writes: MetaWrites) -> WriteBatch<'static> {
    let mut b = WriteBatch::default();
    for (k, v) in writes {
        b.set(Tree::Meta, k, v);
    }
    b
}

/// A store's content written into an engine aside by [`stage`], for
/// [`MvccStore::install_staged`].
pub struct Staged {
    built: Built,
}

impl Staged {
    /// Whether the history came in revision order and every record of it decoded, so the key
    /// index was built as it came (otherwise the install derives it from the engine).
    pub fn indexed(&self) -> bool {
        self.built.is_some()
    }
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Staged(indexed: {})", self.built.is_some())
    }
}

/// Writes `entries` (as [`MvccStore::dump`] lists them) and then `meta` into `fresh`, an empty
/// engine no store uses, and flushes it: the whole content of a store, ready to replace a
/// store's engine ([`MvccStore::install_staged`]). Checks each entry as it comes; an error
/// leaves `fresh` partly written, for the caller to discard. Memory does not grow with the
/// number of entries beyond the key index being built.
pub fn stage<I, T, E>(
    fresh: &StoreEngine,
    entries: I,
    meta: &[(Vec<u8>, Option<Vec<u8>>)],
) -> Result<Staged, E>
where
    I: IntoIterator<Item = Result<T, E>>,
    T: LoadEntry,
    E: From<MvccError>,
{
    check_meta(meta)?;
    let (mut new_meta, built) = write_trees(fresh, entries)?;
    new_meta.extend(meta.iter().cloned());
    fresh.write(meta_batch(new_meta))?;
    fresh.flush()?;
    Ok(Staged { built })
}
