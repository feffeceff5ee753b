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
//! Invariants:
//! - Memory is bounded by one entry, whatever the file's size: [`Writer`] writes each entry
//!   through as it comes; [`Reader`] allocates an entry's bytes as they are read (a corrupt
//!   length cannot make it allocate more than the file holds, and never more than
//!   [`MAX_ENTRY`]).
//! - [`Reader`] yields entries before it has checked the checksum (it is at the end); it
//!   reports a mismatch, a truncation or trailing bytes as an error instead of its end. A
//!   caller that must not act on a damaged file reads it through once first ([`verify`]).

use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

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

/// Writes a snapshot's bytes to `W` one entry at a time (see the module doc).
pub struct Writer<W: Write> {
    out: Crc<W>,
    entries: u64,
}

impl<W: Write> Writer<W> {
    /// Starts a snapshot of `meta` (writes the header).
    pub fn new(out: W, meta: &SnapshotMeta) -> io::Result<Self> {
        let meta_b = encode(meta);
        let mut out = Crc {
            inner: out,
            crc: crc32fast::Hasher::new(),
        };
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&(meta_b.len() as u32).to_le_bytes())?;
        out.write_all(&meta_b)?;
        Ok(Writer { out, entries: 0 })
    }

    /// Appends one entry. A tree name must be 1 to 255 bytes (the store's are short names).
    pub fn push(&mut self, tree: &str, key: &[u8], value: &[u8]) -> io::Result<()> {
        let too_big = |what| io::Error::new(io::ErrorKind::InvalidInput, what);
        if tree.is_empty() || tree.len() > u8::MAX as usize {
            return Err(too_big("snapshot entry: tree name of 1 to 255 bytes"));
        }
        if key.len() + value.len() > MAX_ENTRY {
            return Err(too_big("snapshot entry larger than MAX_ENTRY"));
        }
        let mut head = [0u8; 1 + 255 + 8];
        let n = 1 + tree.len();
        head[0] = tree.len() as u8;
        head[1..n].copy_from_slice(tree.as_bytes());
        head[n..n + 4].copy_from_slice(&(key.len() as u32).to_le_bytes());
        head[n + 4..n + 8].copy_from_slice(&(value.len() as u32).to_le_bytes());
        self.out.write_all(&head[..n + 8])?;
        self.out.write_all(key)?;
        self.out.write_all(value)?;
        self.entries += 1;
        Ok(())
    }

    /// The output written so far: bytes taken out of it are not written again, and the
    /// checksum already covers them (a live snapshot sends them as chunks).
    pub fn output_mut(&mut self) -> &mut W {
        &mut self.out.inner
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
        let entries = match &mut self.body {
            Body::Done => return Ok(None),
            Body::Legacy(items) => return Ok(items.next()),
            Body::Streamed { entries } => *entries,
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
        let tree = String::from_utf8(self.bytes(tree_len[0] as usize)?)
            .map_err(|_| bad(&self.file, "tree name is not UTF-8"))?;
        let key_len = self.u32()? as usize;
        let value_len = self.u32()? as usize;
        if key_len + value_len > MAX_ENTRY {
            return Err(bad(
                &self.file,
                format!("entry of {} bytes", key_len + value_len),
            ));
        }
        let key = self.bytes(key_len)?;
        let value = self.bytes(value_len)?;
        self.body = Body::Streamed {
            entries: entries + 1,
        };
        Ok(Some((tree, key, value)))
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
                let tree = if i % 7 == 0 { "lease" } else { "rev" };
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

    fn read(data: &[u8], step: usize) -> Result<(SnapshotMeta, Vec<Entry>), StoreError> {
        let (m, r) = Reader::new(Pieces { data, step }, Path::new("t"))?;
        Ok((m, r.collect::<Result<_, _>>()?))
    }

    #[test]
    fn entries_read_back_whatever_the_input_buffers() {
        let f = file();
        for step in [1, 2, 3, 5, 8, 13, 4096, 1 << 20] {
            let (m, got) = read(&f, step).unwrap();
            assert_eq!(m, meta(), "step {step}");
            assert_eq!(got, entries(), "step {step}");
        }
    }

    #[test]
    fn a_damaged_file_is_refused_whatever_the_input_buffers() {
        let f = file();
        for step in [1, 7, 4096, 1 << 20] {
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
