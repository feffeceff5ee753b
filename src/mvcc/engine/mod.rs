//! The storage engine under the MVCC store: a few named ordered trees of byte keys and values,
//! point reads, range scans, atomic write batches across trees, and a durability point.
//!
//! [`Engine`] is everything the store asks of its storage; no other part of `mvcc` (or of the
//! Raft state machine) touches the storage library. [`SledEngine`] is the one production
//! implementation. The store holds a [`SledEngine`] concretely and calls it only through this
//! trait: one engine type in the binary keeps the store free of type parameters, and the
//! trait's associated types keep the hot paths (point reads, history scans) free of boxing and
//! copies. Swapping the engine means implementing the trait and changing [`StoreEngine`].
//!
//! # Invariants (the contract every implementation keeps; `tests` checks them)
//! - The trees are exactly [`Tree::ALL`], opened (created if missing) when the engine opens,
//!   and named on disk by [`Tree::name`]. Keys order bytewise, shorter prefix first.
//! - [`Engine::write`] is atomic across trees: a reader, and the engine reopened after a crash,
//!   sees all of a batch or none of it. Writes within a batch apply in order (a later write of
//!   a key wins). Batches are applied in the order `write` returns.
//! - Reads see every write whose `write` has returned. A range scan that runs concurrently with
//!   writes sees, for each key, either the old or the new value, never a torn one; it does not
//!   promise a point-in-time view of the whole range. [`Engine::get_many`] likewise answers
//!   each key as [`Engine::get`] would at some moment of the call.
//! - A range whose start is above its end is empty. Scans run in key order, or reverse key
//!   order from the back ([`DoubleEndedIterator`]).
//! - Durability: after [`Engine::flush`] returns, every write that returned before it survives
//!   a crash. Without a flush, a crash keeps some prefix of the batches (whole batches only),
//!   possibly none of them.
//! - [`Engine::clear`] is not atomic: a crash midway can leave part of the tree. Callers that
//!   need a crash-atomic replacement mark it first (see `load`).
//! - Handles are cheap clones of one engine; the engine closes when the last one is dropped.

mod bulk;
mod chunks;
mod sled;

#[cfg(test)]
mod append_tests;
#[cfg(test)]
mod chunks_tests;
#[cfg(test)]
mod mem;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::ops::Bound;

use super::error::MvccError;

pub use self::bulk::BulkWriter;
pub use self::sled::SledEngine;

/// The engine the store runs on.
pub type StoreEngine = SledEngine;

/// How an engine is opened: the memory it may keep for itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// Bytes of decoded pages the engine keeps in memory (sled's `cache_capacity`). Pages
    /// beyond it are read back from the engine's files (the OS page cache) when needed.
    pub cache_bytes: u64,
}

impl EngineOptions {
    /// The default cache: 64 MiB. sled's own default, 1 GiB, kept a whole store of 300,000
    /// values of 1 KiB in memory, twice etcd 3.4's size; 256 MiB was still over it
    /// (docs/benchmarks.md, "Memory"). Like bbolt's pages, the rest stays in the
    /// kernel's page cache, which gives it back under memory pressure.
    pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;
    /// The smallest cache accepted (sled refuses less than 256 bytes; less than a few pages
    /// would read every node back from the files on each access).
    pub const MIN_CACHE_BYTES: u64 = 1 << 20;
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            cache_bytes: Self::DEFAULT_CACHE_BYTES,
        }
    }
}

/// The trees of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tree {
    /// The history by revision.
    Rev,
    /// MVCC metadata and the caller's metadata.
    Meta,
    /// Leases.
    Lease,
}

impl Tree {
    /// Every tree, in a fixed order.
    pub const ALL: [Tree; 3] = [Tree::Rev, Tree::Meta, Tree::Lease];

    /// The tree's name in snapshots, and on disk for every tree but the history, which sled
    /// keeps in chunks under another name (`sled::REV_CHUNKS_TREE`).
    pub const fn name(self) -> &'static str {
        match self {
            Tree::Rev => "mvcc_rev",
            Tree::Meta => "mvcc_meta",
            Tree::Lease => "mvcc_lease",
        }
    }
}

/// A tree that earlier layouts kept (a persisted key index): dropped when an engine opens,
/// and skipped in snapshots.
pub const LEGACY_IDX_TREE: &str = "mvcc_idx";

/// A key or value of a [`WriteBatch`]: borrowed, owned, or shared with the buffer it was
/// received in (a snapshot's chunk, whose entries are not copied out of it).
#[derive(Clone, Debug)]
pub enum Buf<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
    Shared(bytes::Bytes),
}

impl std::ops::Deref for Buf<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Buf::Borrowed(b) => b,
            Buf::Owned(v) => v,
            Buf::Shared(b) => b,
        }
    }
}

impl<'a> From<&'a [u8]> for Buf<'a> {
    fn from(b: &'a [u8]) -> Self {
        Buf::Borrowed(b)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for Buf<'a> {
    fn from(b: &'a [u8; N]) -> Self {
        Buf::Borrowed(b)
    }
}

impl<'a> From<&'a Vec<u8>> for Buf<'a> {
    fn from(b: &'a Vec<u8>) -> Self {
        Buf::Borrowed(b)
    }
}

impl From<Vec<u8>> for Buf<'_> {
    fn from(v: Vec<u8>) -> Self {
        Buf::Owned(v)
    }
}

impl From<bytes::Bytes> for Buf<'_> {
    fn from(b: bytes::Bytes) -> Self {
        Buf::Shared(b)
    }
}

impl<'a> From<Cow<'a, [u8]>> for Buf<'a> {
    fn from(c: Cow<'a, [u8]>) -> Self {
        match c {
            Cow::Borrowed(b) => Buf::Borrowed(b),
            Cow::Owned(v) => Buf::Owned(v),
        }
    }
}

/// One write of a [`WriteBatch`]: `None` deletes.
pub type Write<'a> = (Tree, Buf<'a>, Option<Buf<'a>>);

/// Writes to apply atomically, in order, with [`Engine::write`]. Keys and values may be
/// borrowed, so large values are not copied to build a batch.
#[derive(Default, Debug)]
pub struct WriteBatch<'a> {
    writes: Vec<Write<'a>>,
}

impl<'a> WriteBatch<'a> {
    pub fn put(&mut self, tree: Tree, key: impl Into<Buf<'a>>, value: impl Into<Buf<'a>>) {
        self.writes.push((tree, key.into(), Some(value.into())));
    }

    pub fn delete(&mut self, tree: Tree, key: impl Into<Buf<'a>>) {
        self.writes.push((tree, key.into(), None));
    }

    /// Writes a value, or deletes with `None`.
    pub fn set(&mut self, tree: Tree, key: impl Into<Buf<'a>>, value: Option<impl Into<Buf<'a>>>) {
        self.writes.push((tree, key.into(), value.map(Into::into)));
    }

    pub fn len(&self) -> usize {
        self.writes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The bytes of the keys and values written.
    pub fn bytes(&self) -> usize {
        self.writes
            .iter()
            .map(|(_, k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
            .sum()
    }

    /// The writes, in order.
    pub fn writes(&self) -> &[Write<'a>] {
        &self.writes
    }

    /// The trees the batch writes to, each once, in [`Tree::ALL`] order.
    pub fn trees(&self) -> Vec<Tree> {
        Tree::ALL
            .into_iter()
            .filter(|t| self.writes.iter().any(|(w, _, _)| w == t))
            .collect()
    }
}

/// Ordered key-value storage in the named [`Tree`]s; see the module doc for the contract.
pub trait Engine: Clone + Send + Sync + 'static {
    /// A key or value read from the engine.
    type Bytes: AsRef<[u8]> + std::ops::Deref<Target = [u8]> + Send + Sync + 'static;
    /// A range scan, forward with `next` and backward with `next_back`.
    type Iter: DoubleEndedIterator<Item = Result<(Self::Bytes, Self::Bytes), MvccError>>
        + Send
        + 'static;

    /// The value of `key` in `tree`.
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Self::Bytes>, MvccError>;

    /// The value of each of `keys` in `tree`, in the order given, each as [`Engine::get`]
    /// answers it. Keys in ascending order let an engine read what they share once.
    fn get_many(&self, tree: Tree, keys: &[&[u8]]) -> Result<Vec<Option<Self::Bytes>>, MvccError> {
        keys.iter().map(|k| self.get(tree, k)).collect()
    }

    /// The entries of `tree` with keys between `lo` and `hi`, in key order.
    fn range(&self, tree: Tree, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Self::Iter;

    /// Every entry of `tree`, in key order.
    fn iter(&self, tree: Tree) -> Self::Iter {
        self.range(tree, Bound::Unbounded, Bound::Unbounded)
    }

    /// Applies `batch` atomically (see the module doc).
    fn write(&self, batch: WriteBatch<'_>) -> Result<(), MvccError>;

    /// Removes every entry of `tree`; not atomic.
    fn clear(&self, tree: Tree) -> Result<(), MvccError>;

    /// Makes every write that has returned durable.
    fn flush(&self) -> Result<(), MvccError>;
}
