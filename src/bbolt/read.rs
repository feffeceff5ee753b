//! Reading a bbolt file page by page with positioned reads: no mmap, and memory bounded by
//! the tree's height times the largest page (with its overflow) on the path being read, and
//! never above the file's size: one walk of a tree reads (and so holds) at most the pages
//! below the high-water mark, counting each page with its overflow.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::error::{BoltError, MetaFault, PageFault};
use super::page::{
    branch_elem, decode_bucket, leaf_elem, BucketRoot, Meta, PageHeader, BRANCH_PAGE,
    BUCKET_LEAF_FLAG, DEFAULT_PAGE_SIZE, LEAF_PAGE, MAGIC, META_END, PAGE_HEADER_SIZE,
};

/// No real tree comes near this depth: with at least two children per branch page, 64
/// levels would address 2^64 pages. Deeper means a cycle or garbage.
const MAX_DEPTH: u32 = 64;

pub struct Reader {
    file: File,
    meta: Meta,
}

/// What one walk of a tree tracks: how many pages it may still read, overflow pages included
/// (each page at most once in a valid tree, so more than the file holds is a cycle, and
/// garbage cannot make a walk read or hold more than the file), and the last key, for order.
struct Walk {
    budget: u64,
    last: Vec<u8>,
    started: bool,
}

impl Reader {
    /// Validates both meta pages (magic, version 2, fnv-1a 64 checksum) and uses the valid
    /// one with the higher txid; errors clearly on a truncated / corrupt file.
    pub fn open(path: &Path) -> Result<Reader, BoltError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let meta0 = read_meta(&file, len, 0);
        // Meta 1 sits one page in. Its page size comes from meta 0; when meta 0 is unusable,
        // bbolt assumes the OS page size, and so do we (4096 on the platforms etcd runs on).
        let ps1 = match &meta0 {
            Ok(m) => m.page_size,
            Err(_) => DEFAULT_PAGE_SIZE,
        };
        let meta1 = read_meta(&file, len, u64::from(ps1));
        let meta = match (meta0, meta1) {
            (Ok(a), Ok(b)) => {
                if b.txid > a.txid {
                    b
                } else {
                    a
                }
            }
            (Ok(a), Err(_)) => a,
            (Err(_), Ok(b)) => b,
            (Err(MetaFault::Missing), Err(MetaFault::Missing)) if len == 0 => {
                return Err(BoltError::NotBolt)
            }
            (Err(e0), Err(e1)) => {
                let no_magic = |e: MetaFault| matches!(e, MetaFault::Magic(_) | MetaFault::Missing);
                if !no_magic(e0) || !no_magic(e1) {
                    return Err(BoltError::BadMeta {
                        meta0: e0,
                        meta1: e1,
                    });
                }
                // A file cut inside meta 0 that still starts like one is truncated, not alien.
                if e0 == MetaFault::Missing && starts_with_magic(&file, len)? {
                    return Err(BoltError::Truncated);
                }
                return Err(BoltError::NotBolt);
            }
        };
        // Bytes after the last page are allowed (etcd appends a sha256 to its snapshots);
        // fewer bytes than the pages in use are not.
        let need = meta.hwm.checked_mul(u64::from(meta.page_size));
        if need.is_none_or(|n| n > len) {
            return Err(BoltError::Truncated);
        }
        Ok(Reader { file, meta })
    }

    pub fn page_size(&self) -> u32 {
        self.meta.page_size
    }

    pub fn txid(&self) -> u64 {
        self.meta.txid
    }

    /// Names of the top-level buckets, in key order.
    pub fn buckets(&self) -> Result<Vec<Vec<u8>>, BoltError> {
        let mut names = Vec::new();
        self.walk(
            &mut self.new_walk(),
            TreeRoot::Page(self.meta.root),
            0,
            &mut |_, flags, k, _| {
                if flags & BUCKET_LEAF_FLAG != 0 {
                    names.push(k.to_vec());
                }
                Ok::<(), BoltError>(())
            },
        )?;
        Ok(names)
    }

    /// Calls `f` for every key/value of top-level bucket `name` in key order (nested buckets
    /// inside it are skipped). Err(BoltError::NoBucket) if absent. Stops at f's first error.
    pub fn for_each<E: From<BoltError>>(
        &self,
        name: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let (pgid, value) = self.bucket_value(name)?.ok_or(BoltError::NoBucket)?;
        let root = match decode_bucket(&value) {
            Ok(BucketRoot::Page(p)) => TreeRoot::Page(p),
            Ok(BucketRoot::Inline(page)) => TreeRoot::Inline(page),
            Err(reason) => return Err(BoltError::BadPage { pgid, reason }.into()),
        };
        self.walk(&mut self.new_walk(), root, 0, &mut |_, flags, k, v| {
            if flags & BUCKET_LEAF_FLAG != 0 {
                return Ok(());
            }
            f(k, v)
        })
    }

    /// The value (bucket header) of top-level bucket `name`, with the page holding it.
    fn bucket_value(&self, name: &[u8]) -> Result<Option<(u64, Vec<u8>)>, BoltError> {
        let mut found = None;
        self.walk(
            &mut self.new_walk(),
            TreeRoot::Page(self.meta.root),
            0,
            &mut |pgid, flags, k, v| {
                // bbolt's Tx.Bucket answers nil for a plain value under a bucket's name.
                if k == name && flags & BUCKET_LEAF_FLAG != 0 {
                    found = Some((pgid, v.to_vec()));
                }
                Ok::<(), BoltError>(())
            },
        )?;
        Ok(found)
    }

    fn new_walk(&self) -> Walk {
        Walk {
            budget: self.meta.hwm,
            last: Vec::new(),
            started: false,
        }
    }

    /// Visits the leaf elements of the tree at `root` in order, checking page types, bounds,
    /// key order, depth and the page budget as it goes.
    fn walk<E: From<BoltError>>(
        &self,
        w: &mut Walk,
        root: TreeRoot<'_>,
        depth: u32,
        f: &mut impl FnMut(u64, u32, &[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let (pgid, owned);
        let page: &[u8] = match root {
            TreeRoot::Inline(p) => {
                pgid = 0;
                p
            }
            TreeRoot::Page(id) => {
                if depth > MAX_DEPTH {
                    return Err(bad(id, PageFault::TooDeep).into());
                }
                pgid = id;
                owned = self.read_page(w, id)?;
                &owned
            }
        };
        let hdr = PageHeader::decode(page);
        if hdr.flags & BRANCH_PAGE != 0 && pgid != 0 {
            if hdr.count == 0 {
                return Err(bad(pgid, PageFault::EmptyBranch).into());
            }
            for i in 0..hdr.count {
                let (_, child) = branch_elem(page, i).map_err(|r| bad(pgid, r))?;
                self.walk(w, TreeRoot::Page(child), depth + 1, f)?;
            }
        } else if hdr.flags & LEAF_PAGE != 0 {
            for i in 0..hdr.count {
                let e = leaf_elem(page, i).map_err(|r| bad(pgid, r))?;
                if w.started && e.key <= w.last.as_slice() {
                    return Err(bad(pgid, PageFault::KeyOrder).into());
                }
                w.started = true;
                w.last.clear();
                w.last.extend_from_slice(e.key);
                f(pgid, e.flags, e.key, e.value)?;
            }
        } else {
            return Err(bad(pgid, PageFault::WrongType(hdr.flags)).into());
        }
        Ok(())
    }

    /// Reads page `pgid` with its overflow pages, and takes them from the walk's budget.
    /// Allocates only after checking that the pages lie below the high-water mark, which
    /// `open` checked against the file length, and that the walk has that many pages left.
    fn read_page(&self, w: &mut Walk, pgid: u64) -> Result<Vec<u8>, BoltError> {
        let ps = u64::from(self.meta.page_size);
        if pgid < 2 || pgid >= self.meta.hwm {
            return Err(bad(pgid, PageFault::OutOfBounds));
        }
        let mut head = [0u8; PAGE_HEADER_SIZE];
        self.file.read_exact_at(&mut head, pgid * ps)?;
        let hdr = PageHeader::decode(&head);
        if hdr.id != pgid {
            return Err(bad(pgid, PageFault::IdMismatch(hdr.id)));
        }
        let end = pgid + u64::from(hdr.overflow) + 1;
        if end > self.meta.hwm {
            return Err(bad(pgid, PageFault::Overflow(hdr.overflow)));
        }
        let pages = end - pgid;
        if pages > w.budget {
            return Err(bad(pgid, PageFault::Cycle));
        }
        w.budget -= pages;
        let mut buf = vec![0u8; ((end - pgid) * ps) as usize];
        self.file.read_exact_at(&mut buf, pgid * ps)?;
        Ok(buf)
    }
}

enum TreeRoot<'a> {
    Page(u64),
    Inline(&'a [u8]),
}

fn bad(pgid: u64, reason: PageFault) -> BoltError {
    BoltError::BadPage { pgid, reason }
}

/// Reads and validates the meta page at byte `at`.
fn read_meta(file: &File, len: u64, at: u64) -> Result<Meta, MetaFault> {
    if len < at + META_END as u64 {
        return Err(MetaFault::Missing);
    }
    let mut b = [0u8; META_END];
    file.read_exact_at(&mut b, at)
        .map_err(|_| MetaFault::Missing)?;
    Meta::decode(&b)
}

fn starts_with_magic(file: &File, len: u64) -> Result<bool, BoltError> {
    let at = PAGE_HEADER_SIZE as u64;
    if len < at + 4 {
        return Ok(false);
    }
    let mut b = [0u8; 4];
    file.read_exact_at(&mut b, at)?;
    Ok(u32::from_le_bytes(b) == MAGIC)
}
