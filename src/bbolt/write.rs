//! Writing a new bbolt file front to back, bottom up, from keys given in order (a bulk load).
//!
//! Leaves are written as they fill. Each level of branch pages above them is one pending
//! page in memory; when it fills it is written and its first key moves up a level. So memory
//! is the tree's height times a page, whatever the number of keys.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::error::BoltError;
use super::page::{
    encode_bucket, put_branch_elem, put_leaf_elem, Meta, PageHeader, BRANCH_PAGE, BUCKET_LEAF_FLAG,
    DEFAULT_PAGE_SIZE, ELEMENT_SIZE, FREELIST_PAGE, LEAF_PAGE, MAX_KEY_SIZE, MAX_VALUE_SIZE,
    MIN_KEYS_PER_PAGE, PAGE_HEADER_SIZE,
};

/// Pages fill to 90% before a new one starts, as etcd's defrag fills the buckets it copies
/// with bbolt (same bulk, in-order load); see docs/decisions/0017-bbolt-files.md.
const FILL_PERCENT: f64 = 0.9;
/// Page 2 holds the (empty) freelist; the tree's pages start after it.
const FREELIST_PGID: u64 = 2;
const FIRST_DATA_PGID: u64 = 3;

pub struct Writer {
    sink: Sink,
    /// The root bucket's tree: one element per top-level bucket.
    root: Tree,
    /// The bucket being written, with its name.
    current: Option<(Vec<u8>, Tree)>,
}

impl Writer {
    /// Creates (truncates) `path`; page size 4096.
    pub fn create(path: &Path) -> Result<Writer, BoltError> {
        let file = File::create(path)?;
        let ps = DEFAULT_PAGE_SIZE as usize;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        // Meta and freelist pages are written last, in place; the tree starts after them.
        out.seek(SeekFrom::Start(FIRST_DATA_PGID * ps as u64))?;
        Ok(Writer {
            sink: Sink {
                out,
                page_size: ps,
                next: FIRST_DATA_PGID,
                buf: Vec::new(),
                unsynced: 0,
            },
            root: Tree::new(),
            current: None,
        })
    }

    /// Starts top-level bucket `name`; buckets must be started in strictly ascending name
    /// order, one at a time (the previous one is finished by starting the next / finish()).
    pub fn bucket(&mut self, name: &[u8]) -> Result<(), BoltError> {
        check_key(name)?;
        if let Some((prev, _)) = &self.current {
            if name <= prev.as_slice() {
                return Err(BoltError::Unsorted);
            }
        }
        self.end_bucket()?;
        self.current = Some((name.to_vec(), Tree::new()));
        Ok(())
    }

    /// Adds a key to the current bucket; keys strictly ascending within a bucket
    /// (BoltError::Unsorted otherwise). Values larger than a page use overflow pages.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), BoltError> {
        check_key(key)?;
        if value.len() > MAX_VALUE_SIZE {
            return Err(BoltError::ValueTooLarge(value.len()));
        }
        let (_, tree) = self.current.as_mut().ok_or(BoltError::NoCurrentBucket)?;
        tree.put(&mut self.sink, 0, key, value)
    }

    /// Writes the branch pages, root bucket, freelist and both meta pages (txid given),
    /// fsyncs the file, and returns its length in bytes.
    pub fn finish(mut self, txid: u64) -> Result<u64, BoltError> {
        self.end_bucket()?;
        let root = self.root.finish(&mut self.sink)?;
        let hwm = self.sink.next;
        let ps = self.sink.page_size;
        let file = self.sink.out.into_inner().map_err(|e| e.into_error())?;
        // The tree is durable before any meta page names it: an interrupted finish leaves a
        // file with no valid meta page, which no reader takes for a database.
        file.sync_data()?;
        let mut page = vec![0u8; ps];
        PageHeader {
            id: FREELIST_PGID,
            flags: FREELIST_PAGE,
            count: 0,
            overflow: 0,
        }
        .encode(&mut page);
        file.write_all_at(&page, FREELIST_PGID * ps as u64)?;
        let mut meta = Meta {
            page_size: ps as u32,
            flags: 0,
            root,
            sequence: 0,
            freelist: FREELIST_PGID,
            hwm,
            txid,
        };
        // As bbolt's Tx.WriteTo: both metas describe the same tree, meta 1 one txid older.
        for pgid in 0..2 {
            page.fill(0);
            meta.encode(pgid, &mut page);
            file.write_all_at(&page, pgid * ps as u64)?;
            meta.txid = txid.saturating_sub(1);
        }
        file.sync_all()?;
        Ok(hwm * ps as u64)
    }

    /// Finishes the current bucket's tree and adds its header to the root bucket.
    fn end_bucket(&mut self) -> Result<(), BoltError> {
        if let Some((name, mut tree)) = self.current.take() {
            let root = tree.finish(&mut self.sink)?;
            self.root.put(
                &mut self.sink,
                BUCKET_LEAF_FLAG,
                &name,
                &encode_bucket(root),
            )?;
        }
        Ok(())
    }
}

fn check_key(key: &[u8]) -> Result<(), BoltError> {
    if key.is_empty() {
        return Err(BoltError::EmptyKey);
    }
    if key.len() > MAX_KEY_SIZE {
        return Err(BoltError::KeyTooLarge(key.len()));
    }
    Ok(())
}

/// Where pages go: appended to the file in page-id order.
struct Sink {
    out: BufWriter<File>,
    page_size: usize,
    /// The next page id to hand out; at the end, the high-water mark.
    next: u64,
    /// Scratch for building a page, reused.
    buf: Vec<u8>,
    /// Bytes written since the last fdatasync.
    unsynced: usize,
}

/// Bytes written between two fdatasyncs. A backup is as large as the store and is written
/// while the member serves writes: written in one go, its writeback queues ahead of the WAL's
/// fdatasyncs on a shared disk (as docs/decisions/0001-snapshot-files-in-4-mib-steps.md
/// measured for snapshot files).
const SYNC_EVERY: usize = 4 << 20;

impl Sink {
    fn threshold(&self) -> usize {
        (self.page_size as f64 * FILL_PERCENT) as usize
    }

    /// Writes `node` as one page (with overflow pages if it needs them); returns its id.
    fn write(&mut self, node: &Node, flags: u16) -> Result<u64, BoltError> {
        let size = node.size();
        let pages = size.div_ceil(self.page_size).max(1);
        let id = self.next;
        self.buf.clear();
        self.buf.resize(pages * self.page_size, 0);
        PageHeader {
            id,
            flags,
            count: node.elems.len() as u16,
            overflow: (pages - 1) as u32,
        }
        .encode(&mut self.buf);
        let mut data_at = PAGE_HEADER_SIZE + node.elems.len() * ELEMENT_SIZE;
        let mut from = 0;
        for (i, e) in node.elems.iter().enumerate() {
            if flags == BRANCH_PAGE {
                put_branch_elem(&mut self.buf, i, data_at, e.klen, e.child);
            } else {
                put_leaf_elem(&mut self.buf, i, e.flags, data_at, e.klen, e.vlen);
            }
            let n = (e.klen + e.vlen) as usize;
            self.buf[data_at..data_at + n].copy_from_slice(&node.data[from..from + n]);
            data_at += n;
            from += n;
        }
        self.out.write_all(&self.buf)?;
        self.next += pages as u64;
        self.unsynced += self.buf.len();
        if self.unsynced >= SYNC_EVERY {
            self.out.flush()?;
            self.out.get_ref().sync_data()?;
            self.unsynced = 0;
        }
        Ok(id)
    }
}

struct Elem {
    flags: u32,
    klen: u32,
    vlen: u32,
    child: u64,
}

/// A page being filled: element headers, and keys and values back to back.
#[derive(Default)]
struct Node {
    elems: Vec<Elem>,
    data: Vec<u8>,
}

impl Node {
    fn size(&self) -> usize {
        PAGE_HEADER_SIZE + self.elems.len() * ELEMENT_SIZE + self.data.len()
    }

    /// bbolt's split rule: a page takes elements until it has at least two and the next
    /// would take it past the fill threshold.
    fn full_for(&self, more: usize, threshold: usize) -> bool {
        self.elems.len() >= MIN_KEYS_PER_PAGE && self.size() + ELEMENT_SIZE + more > threshold
    }

    fn first_key(&self) -> &[u8] {
        self.elems
            .first()
            .map_or(&[][..], |e| &self.data[..e.klen as usize])
    }

    fn clear(&mut self) {
        self.elems.clear();
        self.data.clear();
    }
}

/// One tree being loaded bottom up: the pending leaf, and one pending page per branch level.
struct Tree {
    leaf: Node,
    branches: Vec<Node>,
    /// Whether a leaf page has been written; an empty tree still gets one (empty) leaf.
    wrote_leaf: bool,
    last: Vec<u8>,
}

impl Tree {
    fn new() -> Tree {
        Tree {
            leaf: Node::default(),
            branches: Vec::new(),
            wrote_leaf: false,
            last: Vec::new(),
        }
    }

    fn put(
        &mut self,
        sink: &mut Sink,
        flags: u32,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), BoltError> {
        if (self.wrote_leaf || !self.leaf.elems.is_empty()) && key <= self.last.as_slice() {
            return Err(BoltError::Unsorted);
        }
        if self
            .leaf
            .full_for(key.len() + value.len(), sink.threshold())
        {
            self.flush_leaf(sink)?;
        }
        self.leaf.elems.push(Elem {
            flags,
            klen: key.len() as u32,
            vlen: value.len() as u32,
            child: 0,
        });
        self.leaf.data.extend_from_slice(key);
        self.leaf.data.extend_from_slice(value);
        self.last.clear();
        self.last.extend_from_slice(key);
        Ok(())
    }

    fn flush_leaf(&mut self, sink: &mut Sink) -> Result<(), BoltError> {
        let id = sink.write(&self.leaf, LEAF_PAGE)?;
        self.wrote_leaf = true;
        let key = self.leaf.first_key().to_vec();
        self.leaf.clear();
        self.push_branch(sink, 0, &key, id)
    }

    /// Adds child `id`, whose first key is `key`, to the pending branch page of `level`.
    fn push_branch(
        &mut self,
        sink: &mut Sink,
        level: usize,
        key: &[u8],
        id: u64,
    ) -> Result<(), BoltError> {
        if self.branches.len() == level {
            self.branches.push(Node::default());
        }
        if self.branches[level].full_for(key.len(), sink.threshold()) {
            let full = std::mem::take(&mut self.branches[level]);
            let up = sink.write(&full, BRANCH_PAGE)?;
            self.push_branch(sink, level + 1, full.first_key(), up)?;
            self.branches[level] = full;
            self.branches[level].clear();
        }
        let n = &mut self.branches[level];
        n.elems.push(Elem {
            flags: 0,
            klen: key.len() as u32,
            vlen: 0,
            child: id,
        });
        n.data.extend_from_slice(key);
        Ok(())
    }

    /// Writes what is pending, bottom up; returns the root page id.
    fn finish(&mut self, sink: &mut Sink) -> Result<u64, BoltError> {
        if !self.leaf.elems.is_empty() || !self.wrote_leaf {
            self.flush_leaf(sink)?;
        }
        let mut level = 0;
        loop {
            let top = level + 1 == self.branches.len();
            if top && self.branches[level].elems.len() == 1 {
                return Ok(self.branches[level].elems[0].child);
            }
            let node = std::mem::take(&mut self.branches[level]);
            let id = sink.write(&node, BRANCH_PAGE)?;
            self.push_branch(sink, level + 1, node.first_key(), id)?;
            level += 1;
        }
    }
}
