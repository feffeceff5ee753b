//! bbolt database files: the format of etcd's backend and of the snapshots
//! `Maintenance.Snapshot` streams and `etcdctl snapshot save|status|restore` use.
//!
//! A leaf module: it names no other module of the crate. [`Reader`] reads any file Go bbolt
//! wrote (page by page, never mapping or loading the whole file); [`Writer`] bulk-loads a
//! new file from buckets and keys given in order, with memory bounded by the tree's height.
//! Why kvd has its own reader and writer: docs/decisions/0017-bbolt-files.md.
//!
//! # The format
//!
//! The file is an array of fixed-size pages (the size is in the meta page; 4096 here); page
//! `n` starts at byte `n * page_size`. Integers are little-endian.
//!
//! ```text
//! page header (16 bytes, at the start of every page)
//!   0      8       10      12        16
//!   | id u64 | flags u16 | count u16 | overflow u32 |
//!   flags: 0x01 branch, 0x02 leaf, 0x04 meta, 0x10 freelist
//!   overflow: how many pages after this one belong to it (a page of 1 + overflow pages)
//!
//! pages 0 and 1: meta (after the page header)
//!   | magic u32 = 0xED0CDAED | version u32 = 2 | page_size u32 | flags u32 |
//!   | root bucket: root pgid u64, sequence u64 | freelist pgid u64 |
//!   | pgid u64 (high-water mark: pages in use) | txid u64 | checksum u64 |
//!   checksum: FNV-1a 64 of the 56 meta bytes before it. The valid meta with the higher txid
//!   is the current one; a commit writes the other, so a torn meta write loses one commit.
//!
//! branch page: count elements, then their keys
//!   element (16 bytes): | pos u32 | ksize u32 | child pgid u64 |
//!   key i = bytes [elem_i + pos, + ksize): the first key of child i
//!
//! leaf page: count elements, then key, value, key, value, ...
//!   element (16 bytes): | flags u32 | pos u32 | ksize u32 | vsize u32 |
//!   key = [elem + pos, + ksize), value right after it (vsize bytes)
//!   flags 0x01: the value is a nested bucket:
//!     | root pgid u64 | sequence u64 |                  a bucket with its own pages
//!     | 0 u64 | sequence u64 | page header | elements… | an inline bucket: a whole leaf
//!                                                       page inside the value (small buckets)
//!
//! freelist page: count u16 page ids (u64 each) after the header; when count is 0xFFFF the
//!   first u64 holds the real count. meta.freelist = 2^64-1 means "not on disk" (etcd sets
//!   bbolt's NoFreelistSync, so its own files and snapshots have none).
//! ```
//!
//! The root bucket (meta.root) is a tree whose leaf keys are the top-level bucket names,
//! each with the bucket flag. A page and its overflow pages are read as one buffer, so a
//! value bigger than a page simply runs on into the overflow pages.
//!
//! # Invariants
//!
//! - Within a tree, leaf keys are strictly ascending from the leftmost leaf to the rightmost;
//!   a branch key is the first key of its child, and branch keys ascend.
//! - Every page id below the high-water mark is either reachable exactly once (meta pages,
//!   freelist page, tree pages with their overflow) or in the freelist: bbolt's `Tx.Check`,
//!   which `etcdctl snapshot status` runs, reports anything else. The writer's files have
//!   every page reachable and an empty freelist on page 2.
//! - Reading: a page id is checked against the high-water mark and the mark against the file
//!   length before anything is read or allocated, so a corrupt header cannot make the reader
//!   allocate more than the file holds; a walk reads at most high-water-mark pages in all
//!   (a page with its overflow counting 1 + overflow) and at most 64 levels, so a cycle ends
//!   in an error, never a loop, and one walk never reads or holds more than the file. Bytes
//!   after the last page are ignored (etcd appends a sha256 to snapshot files).
//! - Writing: pages are appended in page-id order; metas and freelist are written last,
//!   after an fsync of the tree, so an unfinished file has no valid meta page.

mod error;
mod page;
mod read;
mod write;

pub use error::{BoltError, MetaFault, PageFault};
pub use read::Reader;
pub use write::Writer;

#[cfg(test)]
mod tests;
