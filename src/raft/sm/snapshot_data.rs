//! What openraft hands around as a snapshot's data ([`SnapshotData`]): the state machine read
//! live from its engine when the snapshot is sent, or received into an engine generation of its
//! own (`staging`).
//!
//! Invariants:
//! - A member keeps no copy of its store as a snapshot. A snapshot to send is taken when a
//!   follower needs one ([`StateMachine::get_current_snapshot`]): an [`Image`] of the engine at
//!   the last applied entry, encoded into the snapshot format (`snapshot_format`) one chunk at a
//!   time as the stream to the follower asks for it. What is sent is current, not as old as the
//!   last `--snapshot-count`, and nothing is written to disk for it.
//! - The image is consistent while it is read: applies add revisions above its bound, and the
//!   history it covers is not deleted (compaction waits) until it is dropped: when the send
//!   ends, fails or is cancelled.
//! - The bytes are those a file of the same snapshot would hold, checksum included, so the
//!   receiver (`snapshot_stream::receive`) checks what it assembled exactly as before.
//!
//! [`StateMachine::get_current_snapshot`]: crate::raft::sm::state_machine::StateMachine
//! [`Image`]: crate::mvcc::Image

use crate::mvcc::ImageRecord;
use crate::raft::error::StoreError;
use crate::raft::sm::snapshot_format::ChunkWriter;
use crate::raft::types::{SnapshotMeta, TypeConfig};

/// A snapshot as openraft hands it around: its metadata and [`SnapshotData`], never bytes in
/// memory.
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;

/// A snapshot's data: see the module doc.
#[derive(Debug)]
pub enum SnapshotData {
    /// A snapshot file, as releases before the staged install received them (tests only:
    /// `snapshot_file_install`).
    #[cfg(test)]
    File(crate::raft::sm::snapshot_file_install::SnapshotFile),
    /// The state machine as it was when the snapshot was taken, read as it is sent.
    Live(LiveSnapshot),
    /// Received from a leader into an engine generation of its own, ready to switch to.
    Staged(Box<crate::raft::sm::state_machine::StagedSnapshot>),
}

/// The records of an image, as its engine holds them: encoded without a copy of their own.
type Entries = Box<dyn Iterator<Item = Result<ImageRecord, StoreError>> + Send>;

/// An image of the state machine with the meta it was taken at.
pub struct LiveSnapshot {
    meta: SnapshotMeta,
    entries: Entries,
}

impl std::fmt::Debug for LiveSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LiveSnapshot({:?})", self.meta.last_log_id)
    }
}

impl LiveSnapshot {
    /// The snapshot of `meta` holding `image`'s entries.
    pub fn new(meta: SnapshotMeta, image: crate::mvcc::Image) -> LiveSnapshot {
        LiveSnapshot {
            meta,
            entries: Box::new(image.records().map(|e| e.map_err(StoreError::from))),
        }
    }

    /// Encodes the snapshot, chunk by chunk.
    pub fn encoder(self) -> Result<Encoder, StoreError> {
        Ok(Encoder {
            writer: Some(ChunkWriter::new(&self.meta)),
            entries: self.entries,
        })
    }

    /// Writes the snapshot into a temporary in `dir` (see `snapshot_file_install::write`),
    /// for an install from another member's image (openraft's storage suite does this).
    #[cfg(test)]
    pub fn write_file(
        self,
        fs: &std::sync::Arc<dyn crate::wal::WalFs>,
        dir: &std::path::Path,
    ) -> Result<crate::raft::sm::snapshot_file_install::Built, StoreError> {
        let entries = self
            .entries
            .map(|e| e.map(|(tree, k, v)| (tree.to_string(), k.to_vec(), v.to_vec())));
        crate::raft::sm::snapshot_file_install::write(fs, dir, &self.meta, entries)
    }
}

/// The bytes of a [`LiveSnapshot`], encoded as they are asked for.
pub struct Encoder {
    /// `None` once the end marker and checksum are out.
    writer: Option<ChunkWriter>,
    entries: Entries,
}

/// Room for the entry that takes a chunk over its size, beyond the size (most entries are a
/// record of at most a few KiB).
const CHUNK_SLACK: usize = 64 << 10;

impl Encoder {
    /// The next at least `size` bytes (fewer at the end; one entry may take it over `size`),
    /// or `None` after the last. Reads the engine: call it off the async workers.
    pub fn next_chunk(&mut self, size: usize) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(w) = self.writer.as_mut() else {
            return Ok(None);
        };
        // The chunk's buffer at its full size at once: grown from empty, its bytes would be
        // copied over ten times on the way to `size`. One large entry may still grow it.
        w.reserve((size + CHUNK_SLACK).saturating_sub(w.len()));
        while w.len() < size {
            match self.entries.next() {
                Some(e) => {
                    let (tree, k, v) = e?;
                    w.push(tree, &k, &v)?;
                }
                None => {
                    let w = self.writer.take().expect("checked above");
                    return Ok(Some(w.finish()));
                }
            }
        }
        Ok(Some(w.take(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::sm::snapshot_format;
    use crate::raft::sm::snapshot_format::tests::meta;

    fn entries(n: usize) -> Entries {
        Box::new((0..n).map(|i| {
            Ok((
                crate::mvcc::REV_TREE,
                format!("k{i:06}").into_bytes().into(),
                vec![b'v'; 300].into(),
            ))
        }))
    }

    /// The chunks, put together, are the file a snapshot of the same entries is written as,
    /// and read back as the same entries; every chunk but the last is at least the size asked.
    #[test]
    fn encoded_chunks_are_the_bytes_of_the_snapshot_file() {
        let d = tempfile::tempdir().unwrap();
        let file = LiveSnapshot {
            meta: meta(),
            entries: entries(5000),
        }
        .write_file(&crate::wal::real_fs(), d.path())
        .unwrap()
        .publish()
        .unwrap();
        let mut enc = LiveSnapshot {
            meta: meta(),
            entries: entries(5000),
        }
        .encoder()
        .unwrap();
        let (mut all, mut sizes) = (Vec::new(), Vec::new());
        while let Some(c) = enc.next_chunk(64 << 10).unwrap() {
            sizes.push(c.len());
            all.extend_from_slice(&c);
        }
        assert!(enc.next_chunk(64 << 10).unwrap().is_none());
        assert_eq!(all, std::fs::read(&file).unwrap());
        assert!(sizes.len() > 10, "{sizes:?}");
        assert!(sizes[..sizes.len() - 1].iter().all(|&s| s >= 64 << 10));
        let got = snapshot_format::verify(&all[..], &file).unwrap();
        assert_eq!(got, meta());
    }

    /// An error reading the engine ends the encoding with that error.
    #[test]
    fn an_engine_error_stops_the_encoding() {
        let failing: Entries = Box::new(entries(100).chain(std::iter::once(Err(StoreError::Io(
            std::io::Error::other("disk gone"),
        )))));
        let mut enc = LiveSnapshot {
            meta: meta(),
            entries: failing,
        }
        .encoder()
        .unwrap();
        let e = enc.next_chunk(1 << 20).unwrap_err();
        assert!(matches!(e, StoreError::Io(_)), "{e}");
    }
}
