//! Byte layouts of bbolt pages: the page header, the meta page, branch and leaf elements, the
//! bucket header. All integers are little-endian (bbolt writes its structs in the native
//! order of amd64/arm64; big-endian files do not occur in practice and are not read).
//! Decoding never trusts a length or offset: every slice is bounds-checked here.

use super::error::{MetaFault, PageFault};

pub const PAGE_HEADER_SIZE: usize = 16;
pub const ELEMENT_SIZE: usize = 16; // both branch and leaf elements
pub const BUCKET_HEADER_SIZE: usize = 16;
/// Bytes of the meta struct covered by its checksum (everything before the checksum).
const META_SUMMED: usize = 56;
pub const META_END: usize = PAGE_HEADER_SIZE + META_SUMMED + 8;

pub const MAGIC: u32 = 0xED0C_DAED;
pub const VERSION: u32 = 2;
pub const DEFAULT_PAGE_SIZE: u32 = 4096;

pub const BRANCH_PAGE: u16 = 0x01;
pub const LEAF_PAGE: u16 = 0x02;
pub const META_PAGE: u16 = 0x04;
pub const FREELIST_PAGE: u16 = 0x10;
/// Leaf element flag: the value is a nested bucket's header.
pub const BUCKET_LEAF_FLAG: u32 = 0x01;
/// Meta `freelist` value when the freelist is not on disk (bbolt's `NoFreelistSync`, which
/// etcd sets): readers rebuild it by walking the tree.
pub const PGID_NO_FREELIST: u64 = u64::MAX;

pub const MAX_KEY_SIZE: usize = 32768;
pub const MAX_VALUE_SIZE: usize = (1 << 31) - 2;
/// bbolt's split rule keeps at least this many elements on a page before splitting.
pub const MIN_KEYS_PER_PAGE: usize = 2;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// 64-bit FNV-1a, bbolt's meta checksum.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageHeader {
    pub id: u64,
    pub flags: u16,
    pub count: u16,
    pub overflow: u32,
}

impl PageHeader {
    /// `b` must hold at least `PAGE_HEADER_SIZE` bytes.
    pub fn decode(b: &[u8]) -> PageHeader {
        PageHeader {
            id: u64_at(b, 0),
            flags: u16_at(b, 8),
            count: u16_at(b, 10),
            overflow: u32_at(b, 12),
        }
    }

    pub fn encode(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..10].copy_from_slice(&self.flags.to_le_bytes());
        b[10..12].copy_from_slice(&self.count.to_le_bytes());
        b[12..16].copy_from_slice(&self.overflow.to_le_bytes());
    }
}

/// The meta struct that follows the page header of pages 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub page_size: u32,
    pub flags: u32,
    /// Root page of the root bucket (whose keys are the top-level bucket names).
    pub root: u64,
    pub sequence: u64,
    pub freelist: u64,
    /// High-water mark: the number of pages in use; every page id is below it.
    pub hwm: u64,
    pub txid: u64,
}

fn page_size_ok(ps: u32) -> bool {
    ps.is_power_of_two() && (512..=1 << 20).contains(&ps)
}

impl Meta {
    /// Decodes and validates the meta page whose bytes start at `b[0]` (the page header).
    pub fn decode(b: &[u8]) -> Result<Meta, MetaFault> {
        if b.len() < META_END {
            return Err(MetaFault::Missing);
        }
        let m = &b[PAGE_HEADER_SIZE..];
        let magic = u32_at(m, 0);
        if magic != MAGIC {
            return Err(MetaFault::Magic(magic));
        }
        let version = u32_at(m, 4);
        if version != VERSION {
            return Err(MetaFault::Version(version));
        }
        if fnv1a64(&m[..META_SUMMED]) != u64_at(m, META_SUMMED) {
            return Err(MetaFault::Checksum);
        }
        let flags = PageHeader::decode(b).flags;
        if flags & META_PAGE == 0 {
            return Err(MetaFault::NotMeta(flags));
        }
        let meta = Meta {
            page_size: u32_at(m, 8),
            flags: u32_at(m, 12),
            root: u64_at(m, 16),
            sequence: u64_at(m, 24),
            freelist: u64_at(m, 32),
            hwm: u64_at(m, 40),
            txid: u64_at(m, 48),
        };
        if !page_size_ok(meta.page_size) {
            return Err(MetaFault::PageSize(meta.page_size));
        }
        let in_range = |id: u64| (2..meta.hwm).contains(&id);
        if !in_range(meta.root) || !(meta.freelist == PGID_NO_FREELIST || in_range(meta.freelist)) {
            return Err(MetaFault::Bounds);
        }
        Ok(meta)
    }

    /// Writes a meta page for page `pgid` into `b` (at least `META_END` bytes).
    pub fn encode(&self, pgid: u64, b: &mut [u8]) {
        PageHeader {
            id: pgid,
            flags: META_PAGE,
            count: 0,
            overflow: 0,
        }
        .encode(b);
        let m = &mut b[PAGE_HEADER_SIZE..META_END];
        m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        m[4..8].copy_from_slice(&VERSION.to_le_bytes());
        m[8..12].copy_from_slice(&self.page_size.to_le_bytes());
        m[12..16].copy_from_slice(&self.flags.to_le_bytes());
        m[16..24].copy_from_slice(&self.root.to_le_bytes());
        m[24..32].copy_from_slice(&self.sequence.to_le_bytes());
        m[32..40].copy_from_slice(&self.freelist.to_le_bytes());
        m[40..48].copy_from_slice(&self.hwm.to_le_bytes());
        m[48..56].copy_from_slice(&self.txid.to_le_bytes());
        let sum = fnv1a64(&m[..META_SUMMED]);
        m[META_SUMMED..META_SUMMED + 8].copy_from_slice(&sum.to_le_bytes());
    }
}

/// One element of a leaf page.
pub struct LeafElem<'a> {
    pub flags: u32,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// Element `i` of the leaf page in `page` (header included). Positions are relative to the
/// element's own header, as bbolt stores them.
pub fn leaf_elem(page: &[u8], i: u16) -> Result<LeafElem<'_>, PageFault> {
    let at = PAGE_HEADER_SIZE + usize::from(i) * ELEMENT_SIZE;
    let e = page
        .get(at..at + ELEMENT_SIZE)
        .ok_or(PageFault::ElementBounds(i))?;
    let (pos, ksize, vsize) = (u32_at(e, 4), u32_at(e, 8), u32_at(e, 12));
    let start = at as u64 + u64::from(pos);
    let kend = start + u64::from(ksize);
    let vend = kend + u64::from(vsize);
    if vend > page.len() as u64 {
        return Err(PageFault::ElementBounds(i));
    }
    Ok(LeafElem {
        flags: u32_at(e, 0),
        key: &page[start as usize..kend as usize],
        value: &page[kend as usize..vend as usize],
    })
}

/// Element `i` of the branch page in `page`: the first key of the child and its page id.
pub fn branch_elem(page: &[u8], i: u16) -> Result<(&[u8], u64), PageFault> {
    let at = PAGE_HEADER_SIZE + usize::from(i) * ELEMENT_SIZE;
    let e = page
        .get(at..at + ELEMENT_SIZE)
        .ok_or(PageFault::ElementBounds(i))?;
    let (pos, ksize, child) = (u32_at(e, 0), u32_at(e, 4), u64_at(e, 8));
    let start = at as u64 + u64::from(pos);
    let end = start + u64::from(ksize);
    if end > page.len() as u64 {
        return Err(PageFault::ElementBounds(i));
    }
    Ok((&page[start as usize..end as usize], child))
}

/// A nested bucket's value: its root page, or (root 0) an inline leaf page after the header.
pub enum BucketRoot<'a> {
    Page(u64),
    Inline(&'a [u8]),
}

pub fn decode_bucket(value: &[u8]) -> Result<BucketRoot<'_>, PageFault> {
    if value.len() < BUCKET_HEADER_SIZE {
        return Err(PageFault::BucketValue);
    }
    match u64_at(value, 0) {
        0 if value.len() >= BUCKET_HEADER_SIZE + PAGE_HEADER_SIZE => {
            Ok(BucketRoot::Inline(&value[BUCKET_HEADER_SIZE..]))
        }
        0 => Err(PageFault::BucketValue),
        root => Ok(BucketRoot::Page(root)),
    }
}

/// The 16-byte header of a non-inline bucket (root page, sequence 0).
pub fn encode_bucket(root: u64) -> [u8; BUCKET_HEADER_SIZE] {
    let mut b = [0u8; BUCKET_HEADER_SIZE];
    b[0..8].copy_from_slice(&root.to_le_bytes());
    b
}

/// Writes a leaf element header at element slot `i` whose key starts at byte `data_at` of
/// the page.
pub fn put_leaf_elem(page: &mut [u8], i: usize, flags: u32, data_at: usize, k: u32, v: u32) {
    let at = PAGE_HEADER_SIZE + i * ELEMENT_SIZE;
    let pos = (data_at - at) as u32;
    page[at..at + 4].copy_from_slice(&flags.to_le_bytes());
    page[at + 4..at + 8].copy_from_slice(&pos.to_le_bytes());
    page[at + 8..at + 12].copy_from_slice(&k.to_le_bytes());
    page[at + 12..at + 16].copy_from_slice(&v.to_le_bytes());
}

/// Writes a branch element header at element slot `i`.
pub fn put_branch_elem(page: &mut [u8], i: usize, data_at: usize, k: u32, child: u64) {
    let at = PAGE_HEADER_SIZE + i * ELEMENT_SIZE;
    let pos = (data_at - at) as u32;
    page[at..at + 4].copy_from_slice(&pos.to_le_bytes());
    page[at + 4..at + 8].copy_from_slice(&k.to_le_bytes());
    page[at + 8..at + 16].copy_from_slice(&child.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_known_values() {
        // Reference values of FNV-1a 64 (the published test vectors).
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn meta_round_trip_and_checksum() {
        let m = Meta {
            page_size: 4096,
            flags: 0,
            root: 3,
            sequence: 0,
            freelist: 2,
            hwm: 4,
            txid: 7,
        };
        let mut b = vec![0u8; 4096];
        m.encode(1, &mut b);
        assert_eq!(Meta::decode(&b), Ok(m));
        b[PAGE_HEADER_SIZE + 48] ^= 1; // txid
        assert_eq!(Meta::decode(&b), Err(MetaFault::Checksum));
    }
}
