//! Snapshot files: `snap/<last index, 16 hex>.snap`.
//!
//! Layout (integers little-endian):
//! ```text
//! magic "KVDSNAP\0" (8) | version u32 | meta_len u32 | meta (bincode SnapshotMeta)
//! | data_len u64 | data | crc32 u32 (over every preceding byte)
//! ```
//! A file is written as `<name>.tmp`, fsynced, renamed into place, and the directory fsynced,
//! so a crash leaves either the old set of snapshots or the new one, never a partial file under
//! a final name.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::error::StoreError;
use super::log_store::{decode, encode};
use super::types::SnapshotMeta;

const MAGIC: &[u8; 8] = b"KVDSNAP\0";
const VERSION: u32 = 1;

fn file_name(meta: &SnapshotMeta) -> String {
    format!("{:016x}.snap", meta.last_log_id.map_or(0, |l| l.index))
}

fn bad(path: &Path, reason: impl Into<String>) -> StoreError {
    StoreError::Snapshot {
        file: path.to_path_buf(),
        reason: reason.into(),
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Bytes written between two fdatasyncs of a snapshot file. A snapshot is tens of MB, taken
/// by every member at once: written in one go, its writeback is queued ahead of the WAL's
/// fdatasyncs on a shared disk (see docs/decisions/0001-snapshot-files-in-4-mib-steps.md).
const SYNC_EVERY: usize = 4 << 20;

/// Writes a snapshot durably (see the module doc).
pub fn write(dir: &Path, meta: &SnapshotMeta, data: &[u8]) -> Result<PathBuf, StoreError> {
    let meta_b = encode(meta);
    let mut head = Vec::with_capacity(meta_b.len() + 32);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&(meta_b.len() as u32).to_le_bytes());
    head.extend_from_slice(&meta_b);
    head.extend_from_slice(&(data.len() as u64).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head);
    crc.update(data);

    let name = file_name(meta);
    let tmp = dir.join(format!("{name}.tmp"));
    let dst = dir.join(name);
    let mut f = File::create(&tmp)?;
    f.write_all(&head)?;
    for part in data.chunks(SYNC_EVERY) {
        f.write_all(part)?;
        f.sync_data()?;
    }
    f.write_all(&crc.finalize().to_le_bytes())?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, &dst)?;
    sync_dir(dir)?;
    Ok(dst)
}

/// Reads and verifies a whole snapshot file.
pub fn read(path: &Path) -> Result<(SnapshotMeta, Vec<u8>), StoreError> {
    let mut buf = Vec::new();
    File::open(path)?.read_to_end(&mut buf)?;
    if buf.len() < 8 + 4 + 4 + 8 + 4 || &buf[..8] != MAGIC {
        return Err(bad(path, "not a kvd snapshot file"));
    }
    let (body, crc) = buf.split_at(buf.len() - 4);
    if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
        return Err(bad(path, "checksum mismatch"));
    }
    let version = u32::from_le_bytes(body[8..12].try_into().unwrap());
    if version != VERSION {
        return Err(bad(
            path,
            format!("unsupported snapshot format version {version}"),
        ));
    }
    let meta_len = u32::from_le_bytes(body[12..16].try_into().unwrap()) as usize;
    let meta_end = 16 + meta_len;
    if body.len() < meta_end + 8 {
        return Err(bad(path, "truncated"));
    }
    let meta: SnapshotMeta = decode("snapshot meta", &body[16..meta_end])?;
    let data_len = u64::from_le_bytes(body[meta_end..meta_end + 8].try_into().unwrap()) as usize;
    let data = &body[meta_end + 8..];
    if data.len() != data_len {
        return Err(bad(path, "length mismatch"));
    }
    Ok((meta, data.to_vec()))
}

fn snapshot_files(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().and_then(|x| x.to_str()) == Some("snap") {
            v.push(p);
        }
    }
    v.sort();
    Ok(v)
}

/// Removes leftovers of writes interrupted by a crash (never renamed, so never used). Only
/// safe while no snapshot is being written, i.e. when the state machine opens.
pub fn remove_temporaries(dir: &Path) -> Result<(), StoreError> {
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().and_then(|x| x.to_str()) == Some("tmp") {
            fs::remove_file(&p)?;
        }
    }
    Ok(())
}

/// The newest snapshot, if any.
pub fn latest(dir: &Path) -> Result<Option<(SnapshotMeta, PathBuf)>, StoreError> {
    match snapshot_files(dir)?.pop() {
        Some(p) => Ok(Some((read(&p)?.0, p))),
        None => Ok(None),
    }
}

/// Unlinks a big file after shrinking it [`SYNC_EVERY`] bytes at a time: freeing tens of MB
/// at once (the file system discards the blocks) holds the WAL's fdatasyncs up far longer
/// than the steps do (docs/decisions/0001-snapshot-files-in-4-mib-steps.md). Only old
/// snapshots are removed this way; a crash midway leaves a short old file, which nothing
/// reads (the newest one is used) and the next snapshot removes.
///
/// A file that is gone already (removed by a concurrent removal) counts as removed.
fn remove_in_steps(path: &Path) -> Result<(), StoreError> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let f = match fs::OpenOptions::new().write(true).open(path) {
        Err(e) if gone(&e) => return Ok(()),
        r => r?,
    };
    let mut len = f.metadata()?.len();
    while len > 0 {
        len = len.saturating_sub(SYNC_EVERY as u64);
        f.set_len(len)?;
        f.sync_data()?;
    }
    drop(f);
    match fs::remove_file(path) {
        Err(e) if gone(&e) => Ok(()),
        r => Ok(r?),
    }
}

/// Removes snapshots older than `meta`'s.
pub fn remove_older(dir: &Path, meta: &SnapshotMeta) -> Result<(), StoreError> {
    let keep = dir.join(file_name(meta));
    let mut removed = false;
    for p in snapshot_files(dir)? {
        if p < keep {
            remove_in_steps(&p)?;
            removed = true;
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let meta = SnapshotMeta::default();
        let path = write(d.path(), &meta, b"payload").unwrap();
        let (m, data) = read(&path).unwrap();
        assert_eq!((m, data.as_slice()), (meta.clone(), &b"payload"[..]));
        assert_eq!(latest(d.path()).unwrap().unwrap().1, path);

        let mut bytes = fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(
            e.contains("checksum mismatch") && e.contains(".snap"),
            "{e}"
        );
    }

    /// Files bigger than one step are written and removed in several.
    #[test]
    fn big_snapshots_round_trip_and_older_ones_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..SYNC_EVERY * 2 + 123).map(|i| (i % 251) as u8).collect();
        let older = SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<crate::raft::TypeConfig>(
                1, 1, 7,
            )),
            ..Default::default()
        };
        let newer = SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<crate::raft::TypeConfig>(
                1, 1, 9,
            )),
            ..Default::default()
        };
        let old_path = write(d.path(), &older, &data).unwrap();
        let new_path = write(d.path(), &newer, &data[1..]).unwrap();
        remove_older(d.path(), &newer).unwrap();
        assert!(!old_path.exists());
        let (m, got) = read(&new_path).unwrap();
        assert_eq!((m, got.as_slice()), (newer, &data[1..]));
        assert_eq!(latest(d.path()).unwrap().unwrap().1, new_path);
    }

    /// Two removals of the same old snapshots at once (a build and an install, each done
    /// with its own snapshot) both succeed: a file the other one removed first is removed.
    #[test]
    fn concurrent_removals_of_the_same_old_snapshots_both_succeed() {
        let shm = Path::new("/dev/shm");
        let d = if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let meta = |index| SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<crate::raft::TypeConfig>(
                1, 1, index,
            )),
            ..Default::default()
        };
        for round in 0..200u64 {
            for i in 0..8 {
                fs::write(d.path().join(file_name(&meta(round * 10 + i))), b"old").unwrap();
            }
            let keep = meta(round * 10 + 7);
            let (a, b) = std::thread::scope(|s| {
                let a = s.spawn(|| remove_older(d.path(), &keep));
                let b = s.spawn(|| remove_older(d.path(), &keep));
                (a.join().unwrap(), b.join().unwrap())
            });
            a.unwrap_or_else(|e| panic!("round {round}: {e}"));
            b.unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(snapshot_files(d.path()).unwrap().len(), 1);
        }
        assert!(remove_in_steps(&d.path().join("gone.snap")).is_ok());
    }

    #[test]
    fn temporaries_are_cleaned_only_on_request() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("0000000000000001.snap.tmp"), b"half").unwrap();
        assert!(latest(d.path()).unwrap().is_none());
        assert!(d.path().join("0000000000000001.snap.tmp").exists());
        remove_temporaries(d.path()).unwrap();
        assert!(!d.path().join("0000000000000001.snap.tmp").exists());
    }
}
