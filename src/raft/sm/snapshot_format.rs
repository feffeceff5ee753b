//! The byte format of a snapshot file, written and read one entry at a time.
//!
//! Layout (integers little-endian):
//! ```text
//! magic "KVDSNAP\0" (8) | version u32 = 2 | meta_len u32 | meta (bincode SnapshotMeta)
//! | entry* | 0u8 | entries u64 | crc32 u32 (over every preceding byte)
//! entry: tree_len u8 (> 0) | tree | key_len u32 | value_len u32 | key | value
//! ```
//! Version 1 files (`data_len u64 | bincode payload | crc32` after the meta, written by kvd
//! before snapshots streamed) are still read, whole, so a member upgraded with one starts.
//!
//! A snapshot sent to a follower is these bytes in chunks: [`ChunkWriter`] writes them into
//! memory a chunk at a time, and the receiver reads them from the chunks as they arrive
//! ([`ChunkInput`]), lending each entry's key and value from its chunk ([`Reader::lent`]).
//!
//! Invariants:
//! - Memory is bounded by one entry, whatever the file's size: [`Writer`] writes each entry
//!   through as it comes; [`Reader`] allocates an entry's bytes as they are read (a corrupt
//!   length cannot make it allocate more than the file holds, and never more than
//!   [`MAX_ENTRY`]). A lent entry holds its chunk until it is dropped.
//! - The bytes are the same whichever writer wrote them: a [`ChunkWriter`]'s chunks, put
//!   together, are a [`Writer`]'s file of the same entries; likewise [`Reader::lent`] yields
//!   the entries the plain [`Reader`] does, and refuses what it refuses.
//! - [`Reader`] yields entries before it has checked the checksum (it is at the end); it
//!   reports a mismatch, a truncation or trailing bytes as an error instead of its end. A
//!   caller that must not act on a damaged file reads it through once first ([`verify`]).

use std::borrow::Cow;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::raft::codec::{decode, encode};
use crate::raft::error::StoreError;
use crate::raft::limits::MAX_REQUEST_BYTES;
use crate::raft::types::SnapshotMeta;

pub(crate) const MAGIC: &[u8; 8] = b"KVDSNAP\0";
const VERSION: u32 = 2;
const LEGACY_VERSION: u32 = 1;

/// The largest key plus value an entry may hold: a history entry holds one request's key
/// and value with their revision; twice the largest request is generous.
pub const MAX_ENTRY: usize = 2 * MAX_REQUEST_BYTES;

/// The largest encoded meta (a membership config with its members' URLs).
const MAX_META: usize = 16 << 20;

/// One entry of the state machine's trees: (tree name, key, value).
pub type Entry = (String, Vec<u8>, Vec<u8>);

/// An entry whose key and value are lent from the input's buffer ([`Reader::lent`]); the tree
/// name is borrowed when it is one of the store's.
pub type LentEntry = (Cow<'static, str>, Bytes, Bytes);

fn bad(file: &Path, reason: impl Into<String>) -> StoreError {
    StoreError::Snapshot {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

/// A writer that folds every byte it passes on into a CRC.
struct Crc<W> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for Crc<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A buffered input that folds every byte consumed from it into a CRC, a whole buffer of the
/// input at a time (a received chunk, a file reader's buffer): the per-entry reads of a few
/// bytes each cost no CRC call of their own.
struct CrcInput<R> {
    inner: R,
    crc: crc32fast::Hasher,
    /// Bytes at the front of `inner`'s buffer consumed here, not yet hashed nor consumed
    /// from `inner` (which then returns the same buffer again).
    held: usize,
}

impl<R: BufRead> CrcInput<R> {
    /// The bytes not yet consumed (empty at the end of the input).
    fn buf(&mut self) -> io::Result<&[u8]> {
        let whole = self.inner.fill_buf()?;
        if self.held > 0 && self.held == whole.len() {
            self.crc.update(whole);
            self.inner.consume(self.held);
            self.held = 0;
        }
        Ok(&self.inner.fill_buf()?[self.held..])
    }

    fn consume(&mut self, n: usize) {
        self.held += n;
    }

    /// Hashes every byte consumed so far: the CRC then covers exactly them.
    fn settle(&mut self) -> io::Result<()> {
        if self.held > 0 {
            self.crc.update(&self.inner.fill_buf()?[..self.held]);
            self.inner.consume(self.held);
            self.held = 0;
        }
        Ok(())
    }

    fn read_exact(&mut self, out: &mut [u8]) -> io::Result<()> {
        let mut at = 0;
        while at < out.len() {
            let b = self.buf()?;
            if b.is_empty() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let n = b.len().min(out.len() - at);
            out[at..at + n].copy_from_slice(&b[..n]);
            self.consume(n);
            at += n;
        }
        Ok(())
    }

    /// Appends up to `len` bytes to `v` as they come, fewer only at the end of the input.
    fn read_into(&mut self, v: &mut Vec<u8>, len: usize) -> io::Result<usize> {
        let mut got = 0;
        while got < len {
            let b = self.buf()?;
            if b.is_empty() {
                break;
            }
            let n = b.len().min(len - got);
            v.extend_from_slice(&b[..n]);
            self.consume(n);
            got += n;
        }
        Ok(got)
    }
}

impl<R: Lend> CrcInput<R> {
    /// The next `len` bytes, lent from the input's buffer if they lie whole in it (`None`
    /// otherwise, or if the input does not lend); consumed if lent.
    fn lend(&mut self, len: usize) -> io::Result<Option<Bytes>> {
        if self.buf()?.len() < len {
            return Ok(None);
        }
        let lent = self.inner.lend(self.held, len);
        if lent.is_some() {
            self.consume(len);
        }
        Ok(lent)
    }
}

/// An input that can lend the bytes of its buffer as shared [`Bytes`], without a copy: a
/// received snapshot's chunks, each one [`Bytes`].
pub trait Lend: BufRead {
    /// `len` bytes of the buffer the last `fill_buf` returned, from `at` on (the caller has
    /// checked that they lie in it); `None` if this input cannot lend them.
    fn lend(&mut self, at: usize, len: usize) -> Option<Bytes>;
}

impl<T: Lend + ?Sized> Lend for &mut T {
    fn lend(&mut self, at: usize, len: usize) -> Option<Bytes> {
        (**self).lend(at, len)
    }
}

/// A snapshot's bytes as they arrive in chunks (a send's, each one [`Bytes`]), read as one
/// buffered input whose buffer is the current chunk: entries are decoded, and lent
/// ([`Reader::lent`]), from it where they lie. Ends when `chunks` does.
pub struct ChunkInput<I> {
    chunks: I,
    chunk: Bytes,
    /// Bytes consumed so far.
    read: u64,
}

impl<I: Iterator<Item = Bytes>> ChunkInput<I> {
    pub fn new(chunks: I) -> Self {
        ChunkInput {
            chunks,
            chunk: Bytes::new(),
            read: 0,
        }
    }

    /// The bytes consumed so far.
    pub fn consumed(&self) -> u64 {
        self.read
    }

    /// The source of the chunks.
    pub fn chunks_mut(&mut self) -> &mut I {
        &mut self.chunks
    }
}

impl<I: Iterator<Item = Bytes>> BufRead for ChunkInput<I> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.chunk.is_empty() {
            match self.chunks.next() {
                Some(c) => self.chunk = c,
                None => break,
            }
        }
        Ok(&self.chunk)
    }

    fn consume(&mut self, n: usize) {
        bytes::Buf::advance(&mut self.chunk, n);
        self.read += n as u64;
    }
}

impl<I: Iterator<Item = Bytes>> io::Read for ChunkInput<I> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let b = self.fill_buf()?;
        let n = buf.len().min(b.len());
        buf[..n].copy_from_slice(&b[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl<I: Iterator<Item = Bytes>> Lend for ChunkInput<I> {
    fn lend(&mut self, at: usize, len: usize) -> Option<Bytes> {
        Some(self.chunk.slice(at..at + len))
    }
}

/// Writes a snapshot's bytes to `W` one entry at a time (see the module doc).
pub struct Writer<W: Write> {
    out: Crc<W>,
    entries: u64,
}

/// The bytes of a snapshot's header: magic, version and `meta`.
fn header(meta: &SnapshotMeta) -> Vec<u8> {
    let meta_b = encode(meta);
    let mut h = Vec::with_capacity(16 + meta_b.len());
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&(meta_b.len() as u32).to_le_bytes());
    h.extend_from_slice(&meta_b);
    h
}

/// An entry's framing before its key and value, in `head`; returns its length. A tree name
/// must be 1 to 255 bytes (the store's are short names).
fn entry_head(
    head: &mut [u8; 1 + 255 + 8],
    tree: &str,
    key: &[u8],
    value: &[u8],
) -> io::Result<usize> {
    let too_big = |what| io::Error::new(io::ErrorKind::InvalidInput, what);
    if tree.is_empty() || tree.len() > u8::MAX as usize {
        return Err(too_big("snapshot entry: tree name of 1 to 255 bytes"));
    }
    if key.len() + value.len() > MAX_ENTRY {
        return Err(too_big("snapshot entry larger than MAX_ENTRY"));
    }
    let n = 1 + tree.len();
    head[0] = tree.len() as u8;
    head[1..n].copy_from_slice(tree.as_bytes());
    head[n..n + 4].copy_from_slice(&(key.len() as u32).to_le_bytes());
    head[n + 4..n + 8].copy_from_slice(&(value.len() as u32).to_le_bytes());
    Ok(n + 8)
}

impl<W: Write> Writer<W> {
    /// Starts a snapshot of `meta` (writes the header).
    pub fn new(out: W, meta: &SnapshotMeta) -> io::Result<Self> {
        let mut out = Crc {
            inner: out,
            crc: crc32fast::Hasher::new(),
        };
        out.write_all(&header(meta))?;
        Ok(Writer { out, entries: 0 })
    }

    /// Appends one entry. A tree name must be 1 to 255 bytes (the store's are short names).
    pub fn push(&mut self, tree: &str, key: &[u8], value: &[u8]) -> io::Result<()> {
        let mut head = [0u8; 1 + 255 + 8];
        let n = entry_head(&mut head, tree, key, value)?;
        self.out.write_all(&head[..n])?;
        self.out.write_all(key)?;
        self.out.write_all(value)?;
        self.entries += 1;
        Ok(())
    }

    /// Writes the end marker, the entry count and the checksum; returns the writer (not
    /// flushed or synced: the caller's to do).
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(&[0])?;
        self.out.write_all(&self.entries.to_le_bytes())?;
        let crc = self.out.crc.clone().finalize();
        let mut inner = self.out.inner;
        inner.write_all(&crc.to_le_bytes())?;
        Ok(inner)
    }
}

/// Writes a snapshot's bytes into memory, to be taken a chunk at a time ([`ChunkWriter::take`]):
/// the bytes of all the chunks, in order, are a [`Writer`]'s file of the same entries. The
/// checksum is computed over each chunk once, as it is taken, instead of over each entry's
/// three pieces as they are written.
pub struct ChunkWriter {
    buf: Vec<u8>,
    crc: crc32fast::Hasher,
    entries: u64,
}

impl ChunkWriter {
    /// Starts a snapshot of `meta` (its header is the first chunk's start).
    pub fn new(meta: &SnapshotMeta) -> Self {
        ChunkWriter {
            buf: header(meta),
            crc: crc32fast::Hasher::new(),
            entries: 0,
        }
    }

    /// Appends one entry (see [`Writer::push`]).
    pub fn push(&mut self, tree: &str, key: &[u8], value: &[u8]) -> io::Result<()> {
        let mut head = [0u8; 1 + 255 + 8];
        let n = entry_head(&mut head, tree, key, value)?;
        self.buf.reserve(n + key.len() + value.len());
        self.buf.extend_from_slice(&head[..n]);
        self.buf.extend_from_slice(key);
        self.buf.extend_from_slice(value);
        self.entries += 1;
        Ok(())
    }

    /// The bytes written and not yet taken.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether every byte written was taken.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Reserves room for `more` bytes in the chunk being written.
    pub fn reserve(&mut self, more: usize) {
        self.buf.reserve(more);
    }

    /// Takes the bytes written so far as a chunk, with `capacity` reserved for the next.
    pub fn take(&mut self, capacity: usize) -> Vec<u8> {
        self.crc.update(&self.buf);
        std::mem::replace(&mut self.buf, Vec::with_capacity(capacity))
    }

    /// Writes the end marker, the entry count and the checksum; returns the last chunk.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf.push(0);
        self.buf.extend_from_slice(&self.entries.to_le_bytes());
        self.crc.update(&self.buf);
        let crc = self.crc.finalize();
        self.buf.extend_from_slice(&crc.to_le_bytes());
        self.buf
    }
}

/// An entry's tree name as read, without an allocation of its own (at most 255 bytes).
struct TreeName {
    bytes: [u8; 255],
    len: u8,
}

impl TreeName {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

enum Body {
    Streamed {
        entries: u64,
    },
    /// A version 1 file's entries, decoded whole.
    Legacy(std::vec::IntoIter<Entry>),
    Done,
}

/// Reads a snapshot's entries one at a time (see the module doc). An iterator of
/// `Result<Entry, StoreError>` that ends after the first error.
pub struct Reader<R: BufRead> {
    input: CrcInput<R>,
    file: PathBuf,
    body: Body,
}

/// The version 1 payload: every entry, bincode-encoded at once.
#[derive(serde::Deserialize)]
struct LegacyPayload {
    items: Vec<Entry>,
}

impl<R: BufRead> Reader<R> {
    /// Reads the header of the snapshot in `input` (`file` names it in errors).
    pub fn new(input: R, file: &Path) -> Result<(SnapshotMeta, Self), StoreError> {
        let mut r = Reader {
            input: CrcInput {
                inner: input,
                crc: crc32fast::Hasher::new(),
                held: 0,
            },
            file: file.to_path_buf(),
            body: Body::Done,
        };
        let mut magic = [0u8; 8];
        r.exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(bad(file, "not a kvd snapshot file"));
        }
        let version = r.u32()?;
        let meta_len = r.u32()? as usize;
        if meta_len > MAX_META {
            return Err(bad(file, format!("meta of {meta_len} bytes")));
        }
        let meta: SnapshotMeta = decode("snapshot meta", &r.bytes(meta_len)?)?;
        r.body = match version {
            VERSION => Body::Streamed { entries: 0 },
            LEGACY_VERSION => Body::Legacy(r.legacy_entries()?),
            v => {
                return Err(bad(
                    file,
                    format!("unsupported snapshot format version {v}"),
                ))
            }
        };
        Ok((meta, r))
    }

    fn exact(&mut self, buf: &mut [u8]) -> Result<(), StoreError> {
        self.input.read_exact(buf).map_err(|e| self.io(e))
    }

    fn io(&self, e: io::Error) -> StoreError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            bad(&self.file, "truncated")
        } else {
            StoreError::Io(e)
        }
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        let mut b = [0u8; 4];
        self.exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let mut b = [0u8; 8];
        self.exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// `len` bytes, allocated as they arrive (see the module doc).
    fn bytes(&mut self, len: usize) -> Result<Vec<u8>, StoreError> {
        let mut v = Vec::with_capacity(len.min(64 << 10));
        let got = self.input.read_into(&mut v, len).map_err(|e| self.io(e))?;
        if got != len {
            return Err(bad(&self.file, "truncated"));
        }
        Ok(v)
    }

    /// The stored checksum, checked against every byte read so far; then the end of input.
    fn check_end(&mut self) -> Result<(), StoreError> {
        self.input.settle().map_err(StoreError::Io)?;
        let want = self.input.crc.clone().finalize();
        if self.u32()? != want {
            return Err(bad(&self.file, "checksum mismatch"));
        }
        if !self.input.buf().map_err(StoreError::Io)?.is_empty() {
            return Err(bad(&self.file, "bytes after the end"));
        }
        Ok(())
    }

    fn legacy_entries(&mut self) -> Result<std::vec::IntoIter<Entry>, StoreError> {
        let len = self.u64()?;
        let data = self.bytes(usize::try_from(len).unwrap_or(usize::MAX))?;
        self.check_end()?;
        let p: LegacyPayload = decode("snapshot", &data)?;
        Ok(p.items.into_iter())
    }

    fn next_entry(&mut self) -> Result<Option<Entry>, StoreError> {
        if let Body::Legacy(items) = &mut self.body {
            return Ok(items.next());
        }
        let Some((tree, key_len, value_len)) = self.next_head()? else {
            return Ok(None);
        };
        let tree = String::from_utf8(tree.as_bytes().to_vec())
            .map_err(|_| bad(&self.file, "tree name is not UTF-8"))?;
        let key = self.bytes(key_len)?;
        let value = self.bytes(value_len)?;
        Ok(Some((tree, key, value)))
    }

    /// The next entry's tree name and its key and value lengths, or `None` after the last
    /// entry (its trailer checked).
    fn next_head(&mut self) -> Result<Option<(TreeName, usize, usize)>, StoreError> {
        let entries = match &mut self.body {
            Body::Streamed { entries } => *entries,
            _ => return Ok(None),
        };
        let mut tree_len = [0u8; 1];
        self.exact(&mut tree_len)?;
        if tree_len[0] == 0 {
            if self.u64()? != entries {
                return Err(bad(&self.file, "entry count mismatch"));
            }
            self.check_end()?;
            self.body = Body::Done;
            return Ok(None);
        }
        let mut tree = TreeName {
            bytes: [0; 255],
            len: tree_len[0],
        };
        let n = tree.len as usize;
        self.exact(&mut tree.bytes[..n])?;
        let key_len = self.u32()? as usize;
        let value_len = self.u32()? as usize;
        if key_len + value_len > MAX_ENTRY {
            return Err(bad(
                &self.file,
                format!("entry of {} bytes", key_len + value_len),
            ));
        }
        self.body = Body::Streamed {
            entries: entries + 1,
        };
        Ok(Some((tree, key_len, value_len)))
    }
}

impl<R: Lend> Reader<R> {
    /// The entries, each key and value lent from the input's buffer where it lies whole in
    /// it (copied where it straddles two buffers): no copy, and no allocation, per entry.
    pub fn lent(self) -> Lent<R> {
        Lent(self)
    }

    fn next_lent(&mut self) -> Result<Option<LentEntry>, StoreError> {
        if let Body::Legacy(items) = &mut self.body {
            return Ok(items
                .next()
                .map(|(t, k, v)| (Cow::Owned(t), k.into(), v.into())));
        }
        let Some((tree, key_len, value_len)) = self.next_head()? else {
            return Ok(None);
        };
        let tree = match crate::mvcc::tree_name(tree.as_bytes()) {
            Some(known) => Cow::Borrowed(known),
            None => Cow::Owned(
                String::from_utf8(tree.as_bytes().to_vec())
                    .map_err(|_| bad(&self.file, "tree name is not UTF-8"))?,
            ),
        };
        let key = self.lent_bytes(key_len)?;
        let value = self.lent_bytes(value_len)?;
        Ok(Some((tree, key, value)))
    }

    fn lent_bytes(&mut self, len: usize) -> Result<Bytes, StoreError> {
        match self.input.lend(len).map_err(|e| self.io(e))? {
            Some(b) => Ok(b),
            None => Ok(self.bytes(len)?.into()),
        }
    }
}

/// [`Reader::lent`]: an iterator of `Result<LentEntry, StoreError>` that ends after the first
/// error.
pub struct Lent<R: BufRead>(Reader<R>);

impl<R: Lend> Iterator for Lent<R> {
    type Item = Result<LentEntry, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.0.next_lent() {
            Ok(e) => e.map(Ok),
            Err(e) => {
                self.0.body = Body::Done;
                Some(Err(e))
            }
        }
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = Result<Entry, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_entry() {
            Ok(e) => e.map(Ok),
            Err(e) => {
                self.body = Body::Done;
                Some(Err(e))
            }
        }
    }
}

/// Reads a whole snapshot once, one entry at a time: its checksum, its framing and its
/// entries' trees (only the store's own are loadable). Returns its meta.
pub fn verify(input: impl BufRead, file: &Path) -> Result<SnapshotMeta, StoreError> {
    let (meta, reader) = Reader::new(input, file)?;
    for entry in reader {
        let entry = entry?;
        crate::mvcc::check_entries([&entry])?;
    }
    Ok(meta)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The meta of the snapshots these tests (and `snapshot_data`'s) write.
    pub(crate) fn meta() -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<crate::raft::types::TypeConfig>(
                2, 1, 77,
            )),
            ..Default::default()
        }
    }

    fn entries() -> Vec<Entry> {
        (0..200u32)
            .map(|i| {
                // The store's own trees and others: a lent entry borrows the first's names.
                let tree = match i % 7 {
                    0 => "lease",
                    1 => crate::mvcc::REV_TREE,
                    _ => "rev",
                };
                let value = vec![i as u8; (i as usize * 37) % 3000];
                (tree.to_string(), i.to_be_bytes().to_vec(), value)
            })
            .collect()
    }

    fn file() -> Vec<u8> {
        let mut w = Writer::new(Vec::new(), &meta()).unwrap();
        for (t, k, v) in entries() {
            w.push(&t, &k, &v).unwrap();
        }
        w.finish().unwrap()
    }

    /// An input whose buffers hold at most `step` bytes, so entries and the trailer straddle
    /// buffer boundaries (a received snapshot's chunks end anywhere).
    struct Pieces<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl io::Read for Pieces<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.fill_buf()?.len().min(buf.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.consume(n);
            Ok(n)
        }
    }

    impl BufRead for Pieces<'_> {
        fn fill_buf(&mut self) -> io::Result<&[u8]> {
            Ok(&self.data[..self.step.min(self.data.len())])
        }

        fn consume(&mut self, n: usize) {
            self.data = &self.data[n..];
        }
    }

    type Read = fn(&[u8], usize) -> Result<(SnapshotMeta, Vec<Entry>), StoreError>;

    fn read(data: &[u8], step: usize) -> Result<(SnapshotMeta, Vec<Entry>), StoreError> {
        let (m, r) = Reader::new(Pieces { data, step }, Path::new("t"))?;
        Ok((m, r.collect::<Result<_, _>>()?))
    }

    /// `data` in chunks of `step` bytes, as a send's arrive.
    fn chunked(data: &[u8], step: usize) -> ChunkInput<std::vec::IntoIter<Bytes>> {
        let chunks: Vec<Bytes> = data.chunks(step).map(Bytes::copy_from_slice).collect();
        ChunkInput::new(chunks.into_iter())
    }

    fn read_lent(data: &[u8], step: usize) -> Result<(SnapshotMeta, Vec<Entry>), StoreError> {
        let (m, r) = Reader::new(chunked(data, step), Path::new("t"))?;
        let entries = r
            .lent()
            .map(|e| e.map(|(t, k, v)| (t.into_owned(), k.to_vec(), v.to_vec())))
            .collect::<Result<_, _>>()?;
        Ok((m, entries))
    }

    /// An entry that lies whole in its chunk is lent from it, not copied; the store's tree
    /// names are not allocated.
    #[test]
    fn lent_entries_share_their_chunk() {
        let whole = Bytes::from(file());
        let range = whole.as_ptr_range();
        let input = ChunkInput::new(std::iter::once(whole.clone()));
        let (_, r) = Reader::new(input, Path::new("t")).unwrap();
        let mut borrowed = 0;
        for e in r.lent() {
            let (tree, k, v) = e.unwrap();
            for b in [&k, &v].into_iter().filter(|b| !b.is_empty()) {
                assert!(range.contains(&b.as_ptr()), "a copy of {} bytes", b.len());
            }
            borrowed += matches!(tree, Cow::Borrowed(_)) as usize;
        }
        assert_eq!(borrowed, 29);
    }

    /// A [`ChunkWriter`]'s chunks, put together, are a [`Writer`]'s file of the same entries,
    /// wherever the chunks are taken.
    #[test]
    fn chunks_written_are_the_file() {
        let f = file();
        for every in [1, 3, 50, 1000] {
            let mut w = ChunkWriter::new(&meta());
            let mut all = Vec::new();
            for (i, (t, k, v)) in entries().into_iter().enumerate() {
                if i % every == 0 {
                    all.extend(w.take(0));
                }
                w.push(&t, &k, &v).unwrap();
            }
            all.extend(w.finish());
            assert_eq!(all, f, "a chunk taken every {every} entries");
        }
    }

    /// Whatever the input's buffers, and whether the entries are copied or lent (lying whole
    /// in a chunk or straddling two).
    #[test]
    fn entries_read_back_whatever_the_input_buffers() {
        let f = file();
        for (step, read) in [1, 2, 3, 5, 8, 13, 4096, 1 << 20]
            .into_iter()
            .flat_map(|step| [(step, read as Read), (step, read_lent)])
        {
            let (m, got) = read(&f, step).unwrap();
            assert_eq!(m, meta(), "step {step}");
            assert_eq!(got, entries(), "step {step}");
        }
    }

    /// Whatever the input's buffers, and whether the entries are copied or lent.
    #[test]
    fn a_damaged_file_is_refused_whatever_the_input_buffers() {
        let f = file();
        for (step, read) in [1, 7, 4096, 1 << 20]
            .into_iter()
            .flat_map(|step| [(step, read as Read), (step, read_lent)])
        {
            // A byte changed in an entry's value, in the entry count, in the checksum.
            for at in [f.len() / 2, f.len() - 6, f.len() - 1] {
                let mut bad = f.clone();
                bad[at] ^= 0x40;
                let e = read(&bad, step).unwrap_err().to_string();
                assert!(
                    e.contains("checksum mismatch") || e.contains("entry count mismatch"),
                    "step {step}, byte {at}: {e}"
                );
            }
            let e = read(&f[..f.len() - 1], step).unwrap_err().to_string();
            assert!(e.contains("truncated"), "step {step}: {e}");
            let mut longer = f.clone();
            longer.push(0);
            let e = read(&longer, step).unwrap_err().to_string();
            assert!(e.contains("bytes after the end"), "step {step}: {e}");
        }
    }
}
