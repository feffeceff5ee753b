//! [`Engine`] on sled: each [`Tree`] is a sled tree of the same name in one sled database,
//! except the history, which sled keeps in chunks of records under [`REV_CHUNKS_TREE`]
//! (`chunks`).
//!
//! # Invariants
//! - A batch that writes one tree is one `Tree::apply_batch`; a batch that writes several is
//!   one sled transaction over the three trees. sled recovers each atomically after a crash.
//!   The history's writes go through sled's `apply_batch_appending` either way, which lays
//!   out appends in key order (a load's, the committer's) as whole leaves.
//! - sled's own background flush may make writes durable before [`Engine::flush`]; it keeps
//!   whole batches only, in order, which is what the contract allows.
//! - sled's page cache holds at most [`EngineOptions::cache_bytes`] of pages, counted as
//!   sled counts them (their encoded size; decoded pages take somewhat more), plus at most
//!   16 x 7 pages its LRU shards have queued and not counted yet (the vendored sled's third
//!   patch; `tests/engine_memory.rs`). Every engine opened from another (defragmentation's
//!   fresh generation) gets the same options.
//! - Every write to the history takes [`Trees::history`] for its read-modify-write of chunks,
//!   and so does clearing it. A database that still has the unchunked history tree of earlier
//!   versions (named [`Tree::Rev`]'s name) is migrated when it opens, before anything reads it.

use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use ::sled::transaction::{ConflictableTransactionError, TransactionError};
use ::sled::{IVec, Transactional};

use super::chunks::{self, ChunkIndex, ChunkIter};
use super::{Engine, EngineOptions, Tree, WriteBatch, LEGACY_IDX_TREE};
use crate::mvcc::error::MvccError;
use crate::sync::LockExt;
use crate::sync::RwLockExt;

/// The layout of the trees in the database: 1 kept the history unchunked (migrated on open),
/// 2 keeps it in chunks. Recorded in sled's default tree; a database without it is of a
/// build before layout versions and was migrated above. A newer layout is refused: an older
/// build must not misread it.
pub const ENGINE_FORMAT: u32 = 2;
const ENGINE_FORMAT_KEY: &[u8] = b"kvd/engine_format";

fn check_format(db: &::sled::Db) -> Result<(), MvccError> {
    match db.get(ENGINE_FORMAT_KEY)? {
        Some(v) => {
            let found = <[u8; 4]>::try_from(v.as_ref())
                .map(u32::from_le_bytes)
                .map_err(|_| MvccError::corrupt("engine format record does not decode"))?;
            if found > ENGINE_FORMAT {
                return Err(MvccError::NewerEngine {
                    found,
                    supported: ENGINE_FORMAT,
                });
            }
            Ok(())
        }
        None => {
            db.insert(ENGINE_FORMAT_KEY, &ENGINE_FORMAT.to_le_bytes())?;
            db.flush()?;
            Ok(())
        }
    }
}

impl From<::sled::Error> for MvccError {
    fn from(e: ::sled::Error) -> Self {
        MvccError::storage("engine", e)
    }
}

/// The store's trees in one sled database; cheap to clone. Clones share the database, and
/// [`SledEngine::replace`] moves every clone to another database at once (defragmentation).
#[derive(Clone)]
pub struct SledEngine {
    cell: Arc<RwLock<Arc<Trees>>>,
    options: EngineOptions,
}

/// The sled tree that holds the history in chunks.
pub const REV_CHUNKS_TREE: &str = "mvcc_rev_chunks";

/// One open sled database and its trees.
struct Trees {
    db: ::sled::Db,
    /// The history, in chunks (`chunks`).
    rev: ::sled::Tree,
    meta: ::sled::Tree,
    lease: ::sled::Tree,
    /// Held by every write to `rev`, from reading the chunks it replaces until it is applied
    /// and `index` is updated.
    history: Mutex<()>,
    /// The keys of `rev`'s chunks.
    index: ChunkIndex,
}

impl Trees {
    fn tree(&self, t: Tree) -> &::sled::Tree {
        match t {
            Tree::Rev => &self.rev,
            Tree::Meta => &self.meta,
            Tree::Lease => &self.lease,
        }
    }
}

impl SledEngine {
    /// Opens (or creates) the database in directory `path`, with the default options.
    pub fn open(path: &Path) -> Result<Self, MvccError> {
        Self::open_with(path, EngineOptions::default())
    }

    /// Opens (or creates) the database in directory `path`.
    pub fn open_with(path: &Path, options: EngineOptions) -> Result<Self, MvccError> {
        Self::with_config(::sled::Config::new().path(path), options)
    }

    /// Opens (or creates) the database in directory `path` to be filled aside and made
    /// durable by the caller, who fsyncs its files before anything relies on them (a received
    /// snapshot's generation): until [`Self::end_write_back`], each log write starts the
    /// writeback of its range and does not wait for the device (sled's `write_back`,
    /// third_party/sled/KVD_PATCH.md). A flush still waits for the writes themselves, so a
    /// bulk writer is held back as with [`Self::open_with`].
    pub fn open_aside(path: &Path, options: EngineOptions) -> Result<Self, MvccError> {
        Self::with_config(::sled::Config::new().path(path).write_back(true), options)
    }

    /// From now on each log write waits for the device again, as in an engine opened with
    /// [`Self::open_with`].
    pub fn end_write_back(&self) {
        self.trees().db.set_write_back(false);
    }

    /// Whether log writes only start their writeback (see [`Self::open_aside`]).
    pub fn writes_back(&self) -> bool {
        self.trees().db.writes_back()
    }

    /// A database in a temporary directory, removed when the engine closes.
    pub fn temporary() -> Result<Self, MvccError> {
        Self::with_config(
            ::sled::Config::new().temporary(true),
            EngineOptions::default(),
        )
    }

    /// The options this engine was opened with.
    pub fn options(&self) -> EngineOptions {
        self.options
    }

    /// Opens the database in `path` with sled's periodic background flush off, so that only
    /// [`Engine::flush`] makes writes durable: a test that drops the engine without a flush
    /// sees, on reopen, what a crash could leave.
    #[cfg(test)]
    pub fn open_flushed_only(path: &Path) -> Result<Self, MvccError> {
        Self::with_config(
            ::sled::Config::new().path(path).flush_every_ms(None),
            EngineOptions::default(),
        )
    }

    /// The names of the database's sled trees.
    #[cfg(test)]
    pub fn db_tree_names(&self) -> Vec<String> {
        let names = self.trees().db.tree_names();
        names
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect()
    }

    fn with_config(config: ::sled::Config, options: EngineOptions) -> Result<Self, MvccError> {
        let db = config.cache_capacity(options.cache_bytes).open()?;
        if db
            .tree_names()
            .iter()
            .any(|n| n == LEGACY_IDX_TREE.as_bytes())
        {
            db.drop_tree(LEGACY_IDX_TREE)?;
        }
        let rev = db.open_tree(REV_CHUNKS_TREE)?;
        if db
            .tree_names()
            .iter()
            .any(|n| n == Tree::Rev.name().as_bytes())
        {
            chunks::migrate(&db.open_tree(Tree::Rev.name())?, &rev)?;
            db.flush()?;
            db.drop_tree(Tree::Rev.name())?;
            db.flush()?;
        }
        check_format(&db)?;
        let trees = Trees {
            index: ChunkIndex::load(&rev)?,
            rev,
            meta: db.open_tree(Tree::Meta.name())?,
            lease: db.open_tree(Tree::Lease.name())?,
            history: Mutex::new(()),
            db,
        };
        Ok(SledEngine {
            cell: Arc::new(RwLock::new(Arc::new(trees))),
            options,
        })
    }

    /// The current database. Poisoning cannot leave the cell half-changed (its one write is
    /// an assignment), so a poisoned lock is used as is.
    fn trees(&self) -> RwLockReadGuard<'_, Arc<Trees>> {
        self.cell.read_or_recover()
    }

    /// Moves this engine and every clone of it to `other`'s database, and returns a handle on
    /// the database they used before (its own: replacing through it changes nothing here).
    /// Waits for reads and writes in flight on the old database to return; a scan already
    /// running goes on reading the old one. The caller makes sure nothing writes meanwhile
    /// (the old database is not read again by this engine).
    pub fn replace(&self, other: &SledEngine) -> SledEngine {
        let new = other.trees().clone();
        let old = std::mem::replace(&mut *self.cell.write_or_recover(), new);
        SledEngine {
            cell: Arc::new(RwLock::new(old)),
            options: self.options,
        }
    }

    /// Bytes on disk of the database's files (sled's own count).
    pub fn size_on_disk(&self) -> Result<u64, MvccError> {
        Ok(self.trees().db.size_on_disk()?)
    }
}

/// A range scan of a [`SledEngine`] tree.
pub enum SledIter {
    Plain(::sled::Iter),
    Chunks(ChunkIter),
}

impl Iterator for SledIter {
    type Item = Result<(IVec, IVec), MvccError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            SledIter::Plain(it) => it.next().map(|r| r.map_err(MvccError::from)),
            SledIter::Chunks(it) => it.next(),
        }
    }
}

impl DoubleEndedIterator for SledIter {
    #[inline]
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            SledIter::Plain(it) => it.next_back().map(|r| r.map_err(MvccError::from)),
            SledIter::Chunks(it) => it.next_back(),
        }
    }
}

impl Engine for SledEngine {
    type Bytes = IVec;
    type Iter = SledIter;

    #[inline]
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<IVec>, MvccError> {
        let trees = self.trees();
        match tree {
            Tree::Rev => chunks::get(&trees.rev, &trees.index, key),
            _ => Ok(trees.tree(tree).get(key)?),
        }
    }

    fn get_many(&self, tree: Tree, keys: &[&[u8]]) -> Result<Vec<Option<IVec>>, MvccError> {
        let trees = self.trees();
        match tree {
            Tree::Rev => chunks::get_many(&trees.rev, &trees.index, keys),
            _ => keys.iter().map(|k| Ok(trees.tree(tree).get(k)?)).collect(),
        }
    }

    #[inline]
    fn range(&self, tree: Tree, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> SledIter {
        let trees = self.trees();
        match tree {
            Tree::Rev => SledIter::Chunks(ChunkIter::new(&trees.rev, lo, hi)),
            _ => SledIter::Plain(trees.tree(tree).range::<&[u8], _>((lo, hi))),
        }
    }

    fn write(&self, batch: WriteBatch<'_>) -> Result<(), MvccError> {
        // Held across the write: `replace` waits for it.
        let trees = self.trees();
        let written = batch.trees();
        let _history = written
            .contains(&Tree::Rev)
            .then(|| trees.history.lock_or_recover());
        let rev_batch = || {
            chunks::plan(
                &trees.rev,
                batch
                    .writes()
                    .iter()
                    .filter(|(t, _, _)| *t == Tree::Rev)
                    .map(|(_, k, v)| (&k[..], v.as_deref())),
            )
        };
        match written.as_slice() {
            [] => Ok(()),
            [Tree::Rev] => {
                let mut plan = rev_batch()?;
                // Bulk writes (a load, a received snapshot, a defragmentation's copy) come
                // this way, in key order: appended as whole leaves (third_party/sled).
                trees
                    .rev
                    .apply_batch_appending(std::mem::take(&mut plan.batch))?;
                trees.index.update(&plan);
                Ok(())
            }
            [one] => {
                let mut b = ::sled::Batch::default();
                for (_, k, v) in batch.writes() {
                    match v {
                        Some(v) => b.insert(&k[..], &v[..]),
                        None => b.remove(&k[..]),
                    }
                }
                Ok(trees.tree(*one).apply_batch(b)?)
            }
            _ => {
                // One sled batch per tree, staged whole: a transaction's `insert` and
                // `remove` first read the key's old value (a tree lookup per write, for a
                // result nobody uses here); `apply_batch` does not (third_party/sled).
                let mut b = [(); 3].map(|_| ::sled::Batch::default());
                let plan = match written.contains(&Tree::Rev) {
                    true => {
                        let mut plan = rev_batch()?;
                        b[tree_slot(Tree::Rev)] = std::mem::take(&mut plan.batch);
                        Some(plan)
                    }
                    false => None,
                };
                for (t, k, v) in batch.writes().iter().filter(|(t, _, _)| *t != Tree::Rev) {
                    let b = &mut b[tree_slot(*t)];
                    match v {
                        Some(v) => b.insert(&k[..], &v[..]),
                        None => b.remove(&k[..]),
                    }
                }
                let res = (&trees.rev, &trees.meta, &trees.lease).transaction(|(tr, tm, tl)| {
                    // The committer's batches append to the history in key order: as whole
                    // leaves, as a bulk load's (third_party/sled).
                    tr.apply_batch_appending(&b[tree_slot(Tree::Rev)])?;
                    tm.apply_batch(&b[tree_slot(Tree::Meta)])?;
                    tl.apply_batch(&b[tree_slot(Tree::Lease)])?;
                    Ok::<(), ConflictableTransactionError<()>>(())
                });
                res.map_err(|e| match e {
                    TransactionError::Storage(e) => e.into(),
                    TransactionError::Abort(()) => MvccError::corrupt("engine transaction aborted"),
                })?;
                if let Some(plan) = plan {
                    trees.index.update(&plan);
                }
                Ok(())
            }
        }
    }

    fn clear(&self, tree: Tree) -> Result<(), MvccError> {
        let trees = self.trees();
        let _history = (tree == Tree::Rev).then(|| trees.history.lock_or_recover());
        trees.tree(tree).clear()?;
        if tree == Tree::Rev {
            trees.index.clear();
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), MvccError> {
        // Not under the cell's lock: a flush takes long, and a replace only comes after the
        // new database was flushed through its own handle.
        let trees = self.trees().clone();
        trees.db.flush()?;
        Ok(())
    }
}

/// A tree's place in the per-tree batches of a multi-tree write.
fn tree_slot(t: Tree) -> usize {
    match t {
        Tree::Rev => 0,
        Tree::Meta => 1,
        Tree::Lease => 2,
    }
}
