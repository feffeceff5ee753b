//! Snapshot files: `snap/<last index, 16 hex>.snap`, in the format of `snapshot_format`, as
//! releases before the staged install (`staging`) wrote them. kvd writes none: it loads the
//! newest one an older release left, if the engine is behind it ([`latest`], [`entries`]),
//! and removes those the engine is past. (Writing, receiving and installing files, as those
//! releases did, is `snapshot_file_install`, for tests.)
//!
//! Invariants:
//! - A file is loaded only after it was read through once and found whole ([`verify`]).
//! - Nothing here holds a snapshot in memory: files are read one entry at a time.
//! - Every sync, rename and removal goes through the `WalFs` the caller gives (the durable
//!   steps are `wal::durable`'s), so the power-loss simulation covers them. Reads open the
//!   files directly: they make nothing durable.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

#[cfg(test)]
use crate::sync::LockExt;

use crate::raft::error::StoreError;
pub use crate::raft::sm::snapshot_format::Entry;
use crate::raft::sm::snapshot_format::{self, Reader};
use crate::raft::types::SnapshotMeta;
use crate::wal::WalFs;

pub(crate) fn file_name(meta: &SnapshotMeta) -> String {
    format!("{:016x}.snap", meta.last_log_id.map_or(0, |l| l.index))
}

/// Bytes a snapshot file shrinks by between two fdatasyncs when it is removed (and, in tests,
/// is written by): freed or written in one go, tens of MB of writeback are queued ahead of
/// the WAL's fdatasyncs on a shared disk (see docs/decisions/0001-snapshot-files-in-4-mib-steps.md).
pub const SYNC_EVERY: usize = 4 << 20;

/// The buffer of a file reader (and, in tests, of a writer): small next to [`SYNC_EVERY`],
/// and the only buffer a file read holds.
pub(crate) const IO_BUFFER: usize = 256 << 10;

/// The entries of the snapshot at `path`, read one at a time (checked as
/// `snapshot_format::Reader` says), with its meta.
pub fn entries(path: &Path) -> Result<(SnapshotMeta, Reader<BufReader<Input>>), StoreError> {
    Reader::new(
        BufReader::with_capacity(IO_BUFFER, Input::open(path)?),
        path,
    )
}

/// Reads a whole snapshot file through once and checks it (see `snapshot_format::verify`).
pub fn verify(path: &Path) -> Result<SnapshotMeta, StoreError> {
    snapshot_format::verify(
        BufReader::with_capacity(IO_BUFFER, Input::open(path)?),
        path,
    )
}

/// A snapshot file opened to be read through (checked or loaded). Unit tests count the bytes
/// read through it from each snapshot directory ([`tests::bytes_read_in`]).
pub struct Input {
    file: File,
    #[cfg(test)]
    dir: PathBuf,
}

impl Input {
    pub(crate) fn open(path: &Path) -> io::Result<Input> {
        Ok(Input {
            file: File::open(path)?,
            #[cfg(test)]
            dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
        })
    }
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        #[cfg(test)]
        tests::count_read(&self.dir, n);
        Ok(n)
    }
}

/// The snapshot files in `dir`, oldest first.
pub(crate) fn snapshot_files(fs: &dyn WalFs, dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut v: Vec<PathBuf> = fs
        .list_dir(dir)?
        .into_iter()
        .map(|n| dir.join(n))
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("snap"))
        .collect();
    v.sort();
    Ok(v)
}

/// Removes leftovers of writes interrupted by a crash (never renamed, so never used). Only
/// safe while no snapshot is being written, i.e. when the state machine opens.
pub fn remove_temporaries(fs: &dyn WalFs, dir: &Path) -> Result<(), StoreError> {
    for name in fs.list_dir(dir)? {
        let p = dir.join(name);
        if p.extension().and_then(|x| x.to_str()) == Some("tmp") {
            fs.remove_file(&p)?;
        }
    }
    Ok(())
}

/// The newest snapshot, if any, with its meta (read from its header only).
pub fn latest(fs: &dyn WalFs, dir: &Path) -> Result<Option<(SnapshotMeta, PathBuf)>, StoreError> {
    match snapshot_files(fs, dir)?.pop() {
        Some(p) => {
            let (meta, _) = Reader::new(BufReader::new(File::open(&p)?), &p)?;
            Ok(Some((meta, p)))
        }
        None => Ok(None),
    }
}

/// Unlinks a snapshot file after shrinking it [`SYNC_EVERY`] bytes at a time: freeing tens of
/// MB at once (the file system discards the blocks) holds the WAL's fdatasyncs up far longer
/// than the steps do (docs/decisions/0001-snapshot-files-in-4-mib-steps.md). The file is
/// first renamed to a temporary ([`retire`]), durably, so a crash midway leaves a short
/// temporary, which the next open removes, never a short file under a snapshot's name: the
/// newest snapshot is the one a restart reads, and it may be the one being removed (an
/// install removes the file it just loaded).
///
/// A file that is gone already (removed by a concurrent removal) counts as removed.
fn remove_in_steps(fs: &dyn WalFs, path: &Path) -> Result<(), StoreError> {
    let Some(retired) = retire(fs, path)? else {
        return Ok(());
    };
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let mut f = match fs.open_file(&retired) {
        Err(e) if gone(&e) => return Ok(()),
        r => r?,
    };
    let mut len = f.size();
    while len > 0 {
        len = len.saturating_sub(SYNC_EVERY as u64);
        f.set_len(len)?;
        f.sync_data()?;
    }
    drop(f);
    match fs.remove_file(&retired) {
        Err(e) if gone(&e) => Ok(()),
        r => Ok(r?),
    }
}

/// Renames snapshot `path` to a temporary and syncs the directory; the temporary's path, or
/// `None` if the file is gone already.
fn retire(fs: &dyn WalFs, path: &Path) -> Result<Option<PathBuf>, StoreError> {
    let retired = path.with_extension("removing.tmp");
    match fs.rename(path, &retired) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        r => r?,
    }
    fs.sync_dir(crate::wal::durable::parent_dir(path))?;
    Ok(Some(retired))
}

/// Removes `meta`'s snapshot and older ones: once the engine is durable past them, a restart
/// needs none.
pub fn remove_through(fs: &dyn WalFs, dir: &Path, meta: &SnapshotMeta) -> Result<(), StoreError> {
    let last = dir.join(file_name(meta));
    remove_where(fs, dir, |p| p <= last.as_path())
}

fn remove_where(
    fs: &dyn WalFs,
    dir: &Path,
    remove: impl Fn(&Path) -> bool,
) -> Result<(), StoreError> {
    let mut removed = false;
    for p in snapshot_files(fs, dir)? {
        if remove(&p) {
            remove_in_steps(fs, &p)?;
            removed = true;
        }
    }
    if removed {
        fs.sync_dir(dir)?;
        if let Some(sm_dir) = dir.parent() {
            crate::raft::sm::engine_dir::record_step(sm_dir, "snapshot files removed");
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "snapshot_file_power_loss_tests.rs"]
mod power_loss_tests;

#[cfg(test)]
pub(crate) mod tests {
    use std::fs;

    use super::*;
    use crate::mvcc::{META_TREE, REV_TREE};
    use crate::raft::sm::snapshot_file_install::*;
    use crate::wal::RealFs;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    /// Bytes read through [`Input`], by the directory of the file read.
    static READ: std::sync::Mutex<BTreeMap<PathBuf, u64>> = std::sync::Mutex::new(BTreeMap::new());

    pub(super) fn count_read(dir: &Path, n: usize) {
        let mut read = READ.lock_or_recover();
        *read.entry(dir.to_path_buf()).or_default() += n as u64;
    }

    /// Bytes read so far through [`Input`] (checks and loads) from snapshot files in `dir`.
    pub(crate) fn bytes_read_in(dir: &Path) -> u64 {
        let read = READ.lock_or_recover();
        read.get(dir).copied().unwrap_or(0)
    }

    fn meta_at(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<crate::raft::types::TypeConfig>(
                1, 1, index,
            )),
            ..Default::default()
        }
    }

    fn entries_of(n: usize, value_len: usize) -> Vec<Entry> {
        (0..n)
            .map(|i| {
                let tree = if i % 3 == 0 { META_TREE } else { REV_TREE };
                let v = (0..value_len).map(|j| ((i + j) % 251) as u8).collect();
                (tree.to_string(), format!("k{i:08}").into_bytes(), v)
            })
            .collect()
    }

    fn real() -> Arc<dyn WalFs> {
        Arc::new(RealFs)
    }

    fn write_now(dir: &Path, meta: &SnapshotMeta, entries: &[Entry]) -> PathBuf {
        write(
            &real(),
            dir,
            meta,
            entries.iter().cloned().map(Ok::<_, StoreError>),
        )
        .unwrap()
        .publish()
        .unwrap()
    }

    fn read_all(path: &Path) -> Result<(SnapshotMeta, Vec<Entry>), StoreError> {
        let (meta, r) = entries(path)?;
        Ok((meta, r.collect::<Result<_, _>>()?))
    }

    #[test]
    fn round_trip_and_corruption_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let meta = meta_at(3);
        let want = entries_of(3, 1000);
        let path = write_now(d.path(), &meta, &want);
        assert_eq!(read_all(&path).unwrap(), (meta.clone(), want));
        assert_eq!(verify(&path).unwrap(), meta);
        assert_eq!(
            latest(&RealFs, d.path()).unwrap().unwrap(),
            (meta, path.clone())
        );

        let mut bytes = fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        for e in [verify(&path).unwrap_err(), read_all(&path).unwrap_err()] {
            let e = e.to_string();
            assert!(
                e.contains("checksum mismatch") && e.contains(".snap"),
                "{e}"
            );
        }
    }

    /// A file cut short anywhere, or with bytes after its end, is refused.
    #[test]
    fn truncated_or_extended_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = write_now(d.path(), &meta_at(5), &entries_of(4, 100));
        let whole = fs::read(&path).unwrap();
        for cut in [1, 3, 4, 5, 13, 100, whole.len() / 2, whole.len() - 20] {
            fs::write(&path, &whole[..whole.len() - cut]).unwrap();
            let e = verify(&path).unwrap_err().to_string();
            assert!(
                e.contains("truncated") || e.contains("checksum"),
                "cut {cut}: {e}"
            );
        }
        let mut longer = whole.clone();
        longer.push(0);
        fs::write(&path, &longer).unwrap();
        assert!(verify(&path)
            .unwrap_err()
            .to_string()
            .contains("after the end"));
    }

    /// Files bigger than one step are written and removed in several.
    #[test]
    fn big_snapshots_round_trip_and_older_ones_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let data = entries_of(3, SYNC_EVERY + 123);
        let (older, newer) = (meta_at(7), meta_at(9));
        let old_path = write_now(d.path(), &older, &data);
        let new_path = write_now(d.path(), &newer, &data[1..]);
        remove_through(&RealFs, d.path(), &older).unwrap();
        assert!(!old_path.exists());
        assert_eq!(read_all(&new_path).unwrap(), (newer, data[1..].to_vec()));
        assert_eq!(latest(&RealFs, d.path()).unwrap().unwrap().1, new_path);
    }

    /// A received snapshot is put in place only whole and with the meta it was sent with;
    /// a refused or dropped one leaves no file behind.
    #[test]
    fn received_snapshots_are_checked_before_they_are_put_in_place() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let meta = meta_at(11);
        let want = entries_of(5, 3000);
        let path = write_now(src.path(), &meta, &want);
        let bytes = fs::read(&path).unwrap();
        let receive = |data: &[u8]| {
            let mut inc = Incoming::create(&real(), dst.path()).unwrap();
            for part in data.chunks(1000) {
                inc.append(part).unwrap();
            }
            inc.finish().unwrap()
        };
        let only_final = || {
            let mut names: Vec<_> = fs::read_dir(dst.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        };

        let e = adopt(
            &real(),
            receive(&bytes[..bytes.len() - 1]),
            dst.path(),
            &meta,
        );
        assert!(e.is_err());
        let e = adopt(&real(), receive(&bytes), dst.path(), &meta_at(12))
            .err()
            .unwrap();
        assert!(e.to_string().contains("sent as"), "{e}");
        // Checked as the snapshot of one meta, installed as another's: read again, refused.
        let checked = receive(&bytes).check(&meta).unwrap();
        let e = adopt(&real(), checked, dst.path(), &meta_at(12))
            .err()
            .unwrap();
        assert!(e.to_string().contains("sent as"), "{e}");
        drop(receive(&bytes));
        assert!(only_final().is_empty(), "{:?}", only_final());

        let put = adopt(&real(), receive(&bytes), dst.path(), &meta)
            .unwrap()
            .publish();
        assert_eq!(put.unwrap(), dst.path().join(file_name(&meta)));
        assert_eq!(only_final(), vec![file_name(&meta)]);
        assert_eq!(
            read_all(&dst.path().join(file_name(&meta))).unwrap().1,
            want
        );

        // Another directory's file (not a received temporary) is copied, not moved.
        let other = SnapshotFile::open(&path).unwrap().1;
        adopt(&real(), other, dst.path(), &meta)
            .unwrap()
            .publish()
            .unwrap();
        assert!(path.exists());
    }

    /// Snapshots written by kvd before they streamed (format version 1) are still read.
    #[test]
    fn version_1_files_are_read() {
        let d = tempfile::tempdir().unwrap();
        let meta = meta_at(4);
        let want = entries_of(3, 10);
        #[derive(serde::Serialize)]
        struct Payload<'a> {
            items: &'a [Entry],
        }
        let meta_b = crate::raft::codec::encode(&meta);
        let data = crate::raft::codec::encode(&Payload { items: &want });
        let mut f = snapshot_format::MAGIC.to_vec();
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&(meta_b.len() as u32).to_le_bytes());
        f.extend_from_slice(&meta_b);
        f.extend_from_slice(&(data.len() as u64).to_le_bytes());
        f.extend_from_slice(&data);
        let crc = crc32fast::hash(&f);
        f.extend_from_slice(&crc.to_le_bytes());
        let path = d.path().join(file_name(&meta));
        fs::write(&path, &f).unwrap();
        assert_eq!(read_all(&path).unwrap(), (meta, want));
    }

    /// A received file cut short is refused by [`SnapshotFile::check`].
    #[test]
    fn a_received_snapshot_cut_short_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let whole = fs::read(write_now(d.path(), &meta_at(10), &entries_of(3000, 1024))).unwrap();
        let mut short = Incoming::create(&real(), d.path()).unwrap();
        short.append(&whole[..whole.len() - 100]).unwrap();
        let short = short.finish().unwrap();
        assert!(short.check(&meta_at(10)).is_err());
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
            last_log_id: Some(openraft::testing::log_id::<crate::raft::types::TypeConfig>(
                1, 1, index,
            )),
            ..Default::default()
        };
        for round in 0..200u64 {
            for i in 0..8 {
                fs::write(d.path().join(file_name(&meta(round * 10 + i))), b"old").unwrap();
            }
            let last = meta(round * 10 + 6);
            let (a, b) = std::thread::scope(|s| {
                let a = s.spawn(|| remove_through(&RealFs, d.path(), &last));
                let b = s.spawn(|| remove_through(&RealFs, d.path(), &last));
                (a.join().unwrap(), b.join().unwrap())
            });
            a.unwrap_or_else(|e| panic!("round {round}: {e}"));
            b.unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(snapshot_files(&RealFs, d.path()).unwrap().len(), 1);
        }
        assert!(remove_in_steps(&RealFs, &d.path().join("gone.snap")).is_ok());
    }

    /// A removal interrupted by a crash leaves a short temporary, never a short snapshot: the
    /// newest snapshot still reads (here the older one, once the newest is retired), and the
    /// temporary goes at the next open. A short file under a snapshot's name would fail every
    /// restart.
    #[test]
    fn a_removal_cut_short_leaves_no_short_snapshot() {
        let d = tempfile::tempdir().unwrap();
        write_now(d.path(), &meta_at(10), &entries_of(10, 8));
        let newest = write_now(d.path(), &meta_at(20), &entries_of(10, 8));
        let retired = retire(&RealFs, &newest).unwrap().unwrap();
        // The crash: the first shrinking step done, the unlink not.
        fs::OpenOptions::new()
            .write(true)
            .open(&retired)
            .unwrap()
            .set_len(0)
            .unwrap();
        assert_eq!(latest(&RealFs, d.path()).unwrap().unwrap().0, meta_at(10));
        remove_temporaries(&RealFs, d.path()).unwrap();
        assert!(!retired.exists());
        assert!(
            retire(&RealFs, &newest).unwrap().is_none(),
            "gone: nothing to retire"
        );

        // What the rename prevents: a short file under the newest snapshot's name.
        fs::write(d.path().join(file_name(&meta_at(30))), b"").unwrap();
        assert!(latest(&RealFs, d.path()).is_err());
    }

    #[test]
    fn temporaries_are_cleaned_only_on_request() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("0000000000000001.snap.tmp"), b"half").unwrap();
        assert!(latest(&RealFs, d.path()).unwrap().is_none());
        assert!(d.path().join("0000000000000001.snap.tmp").exists());
        remove_temporaries(&RealFs, d.path()).unwrap();
        assert!(!d.path().join("0000000000000001.snap.tmp").exists());
    }
}
