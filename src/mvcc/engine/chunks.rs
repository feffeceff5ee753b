//! The history tree ([`Tree::Rev`](super::Tree::Rev)) on sled, in chunks: each sled entry
//! holds a run of consecutive history records, keyed by the first record's key.
//!
//! Why: sled 0.34 pays a tree insert per entry and splits an append-only leaf every 8-9
//! inserts; the history is written in key order, so packing records into chunks makes the
//! committer's sled work per record several times smaller
//! (docs/decisions/0030-history-in-chunks.md). Callers see records, never chunks.
//!
//! # Invariants
//! - A chunk's sled key is the key of its first record. Its records are sorted by key, unique,
//!   and below the next chunk's key: the chunk that holds key `k`, if any, is the last chunk
//!   whose key is at most `k`. Each chunk covers a *region*, from its key up to the next
//!   chunk's key; keys below the first chunk form the head region.
//! - No chunk is empty. A chunk holds at most [`CHUNK_RECORDS`] records and, unless it holds
//!   a single record, at most [`CHUNK_BYTES`] of encoded records.
//! - Encoding, per record: key length (u32 BE), key, value length (u32 BE), value.
//! - Every write goes through [`plan`], and the caller holds one lock across the plan and
//!   its application, so the chunks a plan read are the ones it replaces. A plan's chunks
//!   replace their regions' old chunks in one sled batch: a reader sees a region before or
//!   after the write, never in part.
//! - [`ChunkIndex`] (the chunk keys in memory) is a hint, updated after each plan is applied:
//!   a point read trusts only what the chunk it names says in sled (see [`get`]), so a stale
//!   hint costs a reverse scan, never a wrong answer.
//! - A scan ([`ChunkIter`]) narrows its bounds to each record it yields, so a chunk rewritten
//!   under it (a region split into several chunks) never yields a key twice or out of order.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{self, Excluded, Included, Unbounded};
use std::ops::Range;
use std::sync::RwLock;

use ::sled::IVec;

use crate::mvcc::error::MvccError;
use crate::sync::RwLockExt;

/// Most records in one chunk.
pub const CHUNK_RECORDS: usize = 32;
/// A chunk takes no more records once its encoding would pass this size. sled writes a node
/// over 128 KiB (its segment size over 4) as a blob, and its cache then counts the page at
/// the size of the blob's pointer, so written pages stay in memory; a leaf holds up to 17
/// entries, and 17 chunks of 6 KiB stay under that (docs/decisions/0030-history-in-chunks.md).
pub const CHUNK_BYTES: usize = 6 << 10;

/// Most entries in a sled 0.34 leaf (it splits past 16), and the node size over which sled
/// writes a blob (its default 512 KiB segment over 4, less headers).
const SLED_LEAF_ENTRIES: usize = 17;
const SLED_BLOB_THRESHOLD: usize = (512 << 10) / 4 - 64;
// A full leaf of full chunks (with their keys and framing) stays inline.
const _: () = assert!(SLED_LEAF_ENTRIES * (CHUNK_BYTES + 64) < SLED_BLOB_THRESHOLD);

fn corrupt(chunk_key: &[u8]) -> MvccError {
    MvccError::corrupt(format!("history chunk {chunk_key:02x?} does not decode"))
}

fn read_len(buf: &[u8], at: usize) -> Option<usize> {
    let b = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes(b.try_into().ok()?) as usize)
}

/// The record encoded at `at`: where its key and value lie in `buf`, and where the next
/// record starts. `None` if it does not decode.
fn record_at(buf: &[u8], at: usize) -> Option<(Range<usize>, Range<usize>, usize)> {
    let ks = at.checked_add(4)?;
    let ke = ks.checked_add(read_len(buf, at)?)?;
    let vs = ke.checked_add(4)?;
    let ve = vs.checked_add(read_len(buf, ke)?)?;
    (ve <= buf.len()).then_some((ks..ke, vs..ve, ve))
}

/// Every record of the chunk stored under `chunk_key`, as slices of it (no copies).
pub fn records(chunk_key: &[u8], chunk: &IVec) -> Result<Vec<(IVec, IVec)>, MvccError> {
    let mut out = Vec::with_capacity(CHUNK_RECORDS);
    let mut at = 0;
    while at < chunk.len() {
        let (k, v, next) = record_at(chunk, at).ok_or_else(|| corrupt(chunk_key))?;
        out.push((
            chunk.subslice(k.start, k.len()),
            chunk.subslice(v.start, v.len()),
        ));
        at = next;
    }
    Ok(out)
}

/// What a chunk whose key is at most `key` says about `key`.
enum Found {
    Value(IVec),
    /// A record above `key` follows: `key` would be in this chunk.
    Absent,
    /// Every record is below `key`: a later chunk may hold it.
    Beyond,
}

fn find(chunk_key: &[u8], chunk: &IVec, key: &[u8]) -> Result<Found, MvccError> {
    let mut at = 0;
    while at < chunk.len() {
        let (k, v, next) = record_at(chunk, at).ok_or_else(|| corrupt(chunk_key))?;
        match chunk[k].cmp(key) {
            std::cmp::Ordering::Less => at = next,
            std::cmp::Ordering::Equal => return Ok(Found::Value(chunk.subslice(v.start, v.len()))),
            std::cmp::Ordering::Greater => return Ok(Found::Absent),
        }
    }
    Ok(Found::Beyond)
}

/// The keys of the chunks, in memory (about 50 bytes per chunk of up to 32 records).
#[derive(Default)]
pub struct ChunkIndex(RwLock<BTreeSet<Vec<u8>>>);

impl ChunkIndex {
    /// The index of every chunk in `tree`.
    pub fn load(tree: &::sled::Tree) -> Result<Self, MvccError> {
        let mut keys = BTreeSet::new();
        for k in tree.iter().keys() {
            keys.insert(k?.to_vec());
        }
        Ok(ChunkIndex(RwLock::new(keys)))
    }

    /// Records a plan's chunks once its batch is applied.
    pub fn update(&self, plan: &Plan) {
        let mut keys = self.0.write_or_recover();
        for k in &plan.removed {
            keys.remove(k);
        }
        keys.extend(plan.added.iter().cloned());
    }

    pub fn clear(&self) {
        self.0.write_or_recover().clear();
    }
}

/// The chunk that holds `key`, if any: the last one whose key is at most `key`.
fn chunk_of(tree: &::sled::Tree, key: &[u8]) -> Result<Option<(IVec, IVec)>, MvccError> {
    Ok(tree.range::<&[u8], _>(..=key).next_back().transpose()?)
}

/// The value of `key`. The index names the chunk to read; its answer stands if the chunk,
/// as sled has it now, has a record at or above `key` (then no other chunk can hold `key`).
/// Otherwise the index may be behind a write, and a reverse scan finds the chunk.
pub fn get(tree: &::sled::Tree, index: &ChunkIndex, key: &[u8]) -> Result<Option<IVec>, MvccError> {
    Ok(get_in(tree, index, key)?.0)
}

/// A chunk as read from sled: its key and its records.
type Read = (IVec, IVec);

/// [`get`], with the chunk that answered, if one did.
fn get_in(
    tree: &::sled::Tree,
    index: &ChunkIndex,
    key: &[u8],
) -> Result<(Option<IVec>, Option<Read>), MvccError> {
    let hinted = {
        let keys = index.0.read_or_recover();
        let hint = keys
            .range::<[u8], _>((Unbounded, Included(key)))
            .next_back();
        match hint {
            Some(ck) => tree.get(ck)?.map(|chunk| (IVec::from(&ck[..]), chunk)),
            None => None,
        }
    };
    if let Some((ck, chunk)) = hinted {
        match find(&ck, &chunk, key)? {
            Found::Value(v) => return Ok((Some(v), Some((ck, chunk)))),
            Found::Absent => return Ok((None, Some((ck, chunk)))),
            Found::Beyond => {}
        }
    }
    from_scan(tree, key)
}

/// [`get_in`] by a reverse scan from `key`, which finds the chunk whatever the index says.
fn from_scan(tree: &::sled::Tree, key: &[u8]) -> Result<(Option<IVec>, Option<Read>), MvccError> {
    match chunk_of(tree, key)? {
        Some((ck, chunk)) => match find(&ck, &chunk, key)? {
            Found::Value(v) => Ok((Some(v), Some((ck, chunk)))),
            Found::Absent | Found::Beyond => Ok((None, None)),
        },
        None => Ok((None, None)),
    }
}

/// The values of `keys`, each as [`get`] answers it, in the order given. A chunk read for one
/// key also answers the keys after it that it holds or would hold (a record above the key
/// follows in it), so keys in ascending order that share chunks read each chunk once. Such
/// an answer stands as [`get`]'s does: history records are only appended above every key
/// there is, so a chunk that had a record above `key` when it was read still answers for it.
pub fn get_many(
    tree: &::sled::Tree,
    index: &ChunkIndex,
    keys: &[&[u8]],
) -> Result<Vec<Option<IVec>>, MvccError> {
    let mut out = Vec::with_capacity(keys.len());
    let mut last: Option<Read> = None;
    for &key in keys {
        if let Some((ck, chunk)) = last.as_ref().filter(|(ck, _)| &ck[..] <= key) {
            match find(ck, chunk, key)? {
                Found::Value(v) => {
                    out.push(Some(v));
                    continue;
                }
                Found::Absent => {
                    out.push(None);
                    continue;
                }
                Found::Beyond => {}
            }
        }
        let (answer, read) = get_in(tree, index, key)?;
        if read.is_some() {
            last = read;
        }
        out.push(answer);
    }
    Ok(out)
}

/// Adds `records` (sorted, unique) to `out` as chunks, each under its first record's key,
/// and the chunks' keys to `keys`.
fn pack<'r>(
    records: impl Iterator<Item = (&'r [u8], &'r [u8])>,
    out: &mut ::sled::Batch,
    keys: &mut Vec<Vec<u8>>,
) {
    let mut chunk: Vec<u8> = Vec::new();
    let mut first: Option<&[u8]> = None;
    let mut n = 0;
    for (k, v) in records {
        let size = 8 + k.len() + v.len();
        if n == CHUNK_RECORDS || (n > 0 && chunk.len() + size > CHUNK_BYTES) {
            let first = first.take().unwrap_or_default();
            keys.push(first.to_vec());
            out.insert(first, std::mem::take(&mut chunk));
            n = 0;
        }
        if n == 0 {
            first = Some(k);
            chunk.reserve(size.max(CHUNK_BYTES.min(size * CHUNK_RECORDS)));
        }
        chunk.extend_from_slice(&(k.len() as u32).to_be_bytes());
        chunk.extend_from_slice(k);
        chunk.extend_from_slice(&(v.len() as u32).to_be_bytes());
        chunk.extend_from_slice(v);
        n += 1;
    }
    if n > 0 {
        let first = first.unwrap_or_default();
        keys.push(first.to_vec());
        out.insert(first, chunk);
    }
}

/// One region a plan rewrites: its records after the writes, and where it ends.
struct Region<'a> {
    /// The next chunk's key (exclusive), or `None` for the last region.
    end: Option<IVec>,
    records: BTreeMap<Cow<'a, [u8]>, Cow<'a, [u8]>>,
}

/// A write to the chunked tree: the sled batch, and the chunk keys it removes and adds (for
/// [`ChunkIndex::update`]).
pub struct Plan {
    pub batch: ::sled::Batch,
    removed: Vec<Vec<u8>>,
    added: Vec<Vec<u8>>,
}

/// The plan that applies `writes` (in order; `None` deletes) to the chunked `tree`: each
/// region a write falls in is read once, changed, and written back as new chunks in place of
/// its old one. The caller holds the history lock until the batch is applied.
pub fn plan<'a>(
    tree: &::sled::Tree,
    writes: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) -> Result<Plan, MvccError> {
    // Keyed by the region's chunk key; `None` is the head region (below every chunk).
    let mut regions: BTreeMap<Option<Vec<u8>>, Region<'a>> = BTreeMap::new();
    for (k, v) in writes {
        let start = region_of(tree, &mut regions, k)?;
        let records = &mut regions.get_mut(&start).expect("region just found").records;
        match v {
            Some(v) => {
                records.insert(Cow::Borrowed(k), Cow::Borrowed(v));
            }
            None => {
                records.remove(k);
            }
        }
    }
    let mut plan = Plan {
        batch: ::sled::Batch::default(),
        removed: Vec::new(),
        added: Vec::new(),
    };
    for (start, region) in regions {
        if let Some(old) = start {
            // The first new chunk usually has the same key; the batch keeps the later write.
            plan.batch.remove(&old[..]);
            plan.removed.push(old);
        }
        pack(
            region.records.iter().map(|(k, v)| (&k[..], &v[..])),
            &mut plan.batch,
            &mut plan.added,
        );
    }
    Ok(plan)
}

/// The region of `key` (its chunk key), read into `regions` if not there yet.
fn region_of<'a>(
    tree: &::sled::Tree,
    regions: &mut BTreeMap<Option<Vec<u8>>, Region<'a>>,
    key: &[u8],
) -> Result<Option<Vec<u8>>, MvccError> {
    let probe = Some(key.to_vec());
    if let Some((start, r)) = regions.range(..=&probe).next_back() {
        if r.end.as_ref().is_none_or(|end| key < &end[..]) {
            return Ok(start.clone());
        }
    }
    let (start, end, records) = match chunk_of(tree, key)? {
        Some((ck, chunk)) => {
            let end = tree.get_gt(&ck)?.map(|(k, _)| k);
            let records = records(&ck, &chunk)?
                .into_iter()
                .map(|(k, v)| (Cow::Owned(k.to_vec()), Cow::Owned(v.to_vec())))
                .collect();
            (Some(ck.to_vec()), end, records)
        }
        None => (None, tree.first()?.map(|(k, _)| k), BTreeMap::new()),
    };
    regions.insert(start.clone(), Region { end, records });
    Ok(start)
}

/// Copies every record of the unchunked tree `from` into the chunked tree `to` (cleared
/// first): the migration of a store written before chunks. Not atomic; the caller drops
/// `from` only after a flush, and runs this again if it finds `from` still there.
pub fn migrate(from: &::sled::Tree, to: &::sled::Tree) -> Result<(), MvccError> {
    const GROUP: usize = CHUNK_RECORDS * 256;
    to.clear()?;
    let mut group: Vec<(IVec, IVec)> = Vec::with_capacity(GROUP);
    let mut it = from.iter();
    loop {
        let item = it.next().transpose()?;
        let end = item.is_none();
        group.extend(item);
        if group.len() == GROUP || (end && !group.is_empty()) {
            let mut batch = ::sled::Batch::default();
            pack(
                group.iter().map(|(k, v)| (&k[..], &v[..])),
                &mut batch,
                &mut Vec::new(),
            );
            to.apply_batch(batch)?;
            group.clear();
        }
        if end {
            return Ok(());
        }
    }
}

/// A scan of the chunked tree's records between two bounds, either way.
pub struct ChunkIter {
    chunks: ::sled::Iter,
    /// Narrowed to each record yielded from the front...
    lo: Bound<IVec>,
    /// ... and from the back.
    hi: Bound<IVec>,
    front: std::vec::IntoIter<(IVec, IVec)>,
    back: std::vec::IntoIter<(IVec, IVec)>,
    /// An error finding the first chunk, reported first.
    failed: Option<MvccError>,
}

fn owned(b: Bound<&[u8]>) -> Bound<IVec> {
    match b {
        Included(k) => Included(IVec::from(k)),
        Excluded(k) => Excluded(IVec::from(k)),
        Unbounded => Unbounded,
    }
}

impl ChunkIter {
    pub fn new(tree: &::sled::Tree, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Self {
        let (from, failed) = match lo {
            Included(k) | Excluded(k) => match chunk_of(tree, k) {
                Ok(Some((ck, _))) => (Included(ck), None),
                Ok(None) => (Unbounded, None),
                Err(e) => (Unbounded, Some(e)),
            },
            Unbounded => (Unbounded, None),
        };
        let hi = owned(hi);
        ChunkIter {
            chunks: tree.range((from, hi.clone())),
            lo: owned(lo),
            hi,
            front: Vec::new().into_iter(),
            back: Vec::new().into_iter(),
            failed,
        }
    }

    fn above_lo(&self, k: &[u8]) -> bool {
        match &self.lo {
            Included(lo) => k >= &lo[..],
            Excluded(lo) => k > &lo[..],
            Unbounded => true,
        }
    }

    fn below_hi(&self, k: &[u8]) -> bool {
        match &self.hi {
            Included(hi) => k <= &hi[..],
            Excluded(hi) => k < &hi[..],
            Unbounded => true,
        }
    }

    /// Yields `r` at `end` if it lies within the bounds, and narrows that end's bound past it.
    fn take(&mut self, end: End, r: (IVec, IVec)) -> Option<(IVec, IVec)> {
        if !(self.above_lo(&r.0) && self.below_hi(&r.0)) {
            return None;
        }
        let bound = Excluded(r.0.clone());
        match end {
            End::Front => self.lo = bound,
            End::Back => self.hi = bound,
        }
        Some(r)
    }

    /// The next record from `end`: from that end's buffer, refilled from the next chunk at
    /// that end; once the chunks are used up, what is left sits in the other end's buffer.
    #[inline]
    fn step(&mut self, end: End) -> Option<Result<(IVec, IVec), MvccError>> {
        if let Some(e) = self.failed.take() {
            return Some(Err(e));
        }
        loop {
            let buffered = match end {
                End::Front => self.front.next(),
                End::Back => self.back.next_back(),
            };
            if let Some(r) = buffered {
                if let Some(r) = self.take(end, r) {
                    return Some(Ok(r));
                }
                continue;
            }
            let chunk = match end {
                End::Front => self.chunks.next(),
                End::Back => self.chunks.next_back(),
            };
            match chunk {
                Some(Ok((ck, chunk))) => match records(&ck, &chunk) {
                    Ok(rs) => match end {
                        End::Front => self.front = rs.into_iter(),
                        End::Back => self.back = rs.into_iter(),
                    },
                    Err(e) => return Some(Err(e)),
                },
                Some(Err(e)) => return Some(Err(e.into())),
                None => break,
            }
        }
        loop {
            let r = match end {
                End::Front => self.back.next(),
                End::Back => self.front.next_back(),
            }?;
            if let Some(r) = self.take(end, r) {
                return Some(Ok(r));
            }
        }
    }
}

/// Which end of a [`ChunkIter`] a step takes from.
#[derive(Clone, Copy)]
enum End {
    Front,
    Back,
}

impl Iterator for ChunkIter {
    type Item = Result<(IVec, IVec), MvccError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.step(End::Front)
    }
}

impl DoubleEndedIterator for ChunkIter {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.step(End::Back)
    }
}
