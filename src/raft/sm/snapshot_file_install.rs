//! Snapshot files written, received and installed, as releases before the staged install
//! kept them. Tests only: kvd receives snapshots into an engine generation (`staging`) and
//! writes no snapshot file; it only loads (`snapshot_file::entries`) and removes the files an
//! older release left. The tests here install such files through openraft's
//! `install_snapshot`, to exercise that load path and its crash safety.
//!
//! Invariants:
//! - A file is written as a temporary (`<name>.tmp` when built, `incoming-<n>.tmp` when
//!   received), fdatasynced every [`SYNC_EVERY`] bytes, synced, renamed into place, and the
//!   directory synced: a crash leaves either the old set of snapshots or the new one, never a
//!   partial file under a final name. Temporaries are removed when the state machine opens.
//! - Only a file read through once and found whole is renamed to a final name ([`adopt`]), so
//!   the newest snapshot, which a restart may load, always loads.
//! - A file is read through to check it once per process: a received file checked by
//!   `SnapshotFile::check` carries a [`Checked`] (which only that read makes) and [`adopt`]
//!   does not read it again; any other file (opened from disk, copied from elsewhere) is read
//!   through by [`adopt`].

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::metrics::timed;
use crate::raft::error::StoreError;
use crate::raft::sm::snapshot_file::{file_name, Entry, Input, IO_BUFFER, SYNC_EVERY};
use crate::raft::sm::snapshot_format::{self, Reader, Writer};
use crate::raft::types::SnapshotMeta;
use crate::wal::durable::{create_replacing, rename_durable};
use crate::wal::{WalFile, WalFs};

/// A file that fdatasyncs itself every [`SYNC_EVERY`] bytes written.
struct Paced {
    file: Box<dyn WalFile>,
    unsynced: usize,
}

impl Write for Paced {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Never more than a step between two syncs, however large `buf` is.
        let room = SYNC_EVERY - self.unsynced;
        let n = buf.len().min(room);
        self.file.append(&buf[..n])?;
        self.unsynced += n;
        if self.unsynced >= SYNC_EVERY {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A temporary file in the snapshot directory, removed when dropped unless it was renamed
/// to a final name.
struct Temp {
    fs: Arc<dyn WalFs>,
    path: Option<PathBuf>,
}

impl Temp {
    /// Renames the temporary to `dst` (in the same directory) and syncs the directory.
    fn rename_durable(mut self, dst: &Path) -> Result<(), StoreError> {
        let path = self.path.take().expect("renamed once");
        rename_durable(self.fs.as_ref(), &path, dst)?;
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = self.fs.remove_file(&p);
        }
    }
}

static INCOMING: AtomicU64 = AtomicU64::new(0);

/// A fresh, unique temporary in `dir` for a received or copied snapshot.
fn incoming_temp(fs: &Arc<dyn WalFs>, dir: &Path) -> Result<(Temp, Box<dyn WalFile>), StoreError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = INCOMING.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("incoming-{nanos}-{n}.tmp"));
    let file = fs.create_file(&path)?;
    let temp = Temp {
        fs: fs.clone(),
        path: Some(path),
    };
    Ok((temp, file))
}

/// A snapshot written but not yet in place: [`Built::publish`] renames it.
pub struct Built {
    temp: Temp,
    dst: PathBuf,
    /// The file's size in bytes.
    pub bytes: u64,
}

impl Built {
    /// Renames the snapshot into place and syncs the directory. Callers serialize this with
    /// the other renames and removals of the directory (`snap_io`).
    pub fn publish(self) -> Result<PathBuf, StoreError> {
        self.temp.rename_durable(&self.dst)?;
        Ok(self.dst)
    }
}

/// Writes the snapshot of `meta` holding `entries` into a temporary in `dir` through `fs`,
/// one entry at a time, paced (see the module doc), and syncs it. Stops at the first error
/// of `entries` (the temporary is removed).
pub fn write<E>(
    fs: &Arc<dyn WalFs>,
    dir: &Path,
    meta: &SnapshotMeta,
    entries: impl IntoIterator<Item = Result<Entry, E>>,
) -> Result<Built, StoreError>
where
    StoreError: From<E>,
{
    let name = file_name(meta);
    let tmp = dir.join(format!("{name}.tmp"));
    let file = create_replacing(fs.as_ref(), &tmp)?;
    let temp = Temp {
        fs: fs.clone(),
        path: Some(tmp),
    };
    let out = BufWriter::with_capacity(IO_BUFFER, Paced { file, unsynced: 0 });
    let mut w = Writer::new(out, meta)?;
    for e in entries {
        let (tree, k, v) = e?;
        w.push(&tree, &k, &v)?;
    }
    let mut paced = w.finish()?.into_inner().map_err(|e| e.into_error())?;
    // Not observed as etcd_snap_fsync_duration_seconds: that is the engine flush at a
    // snapshot point (`build_snapshot`), which a test checks.
    paced.file.sync_all()?;
    let bytes = paced.file.size();
    Ok(Built {
        temp,
        dst: dir.join(name),
        bytes,
    })
}

/// A snapshot file as openraft hands it around (`SnapshotData`): an open handle and its
/// length. A received snapshot is a temporary, removed if it is dropped before [`adopt`]
/// puts it in place.
pub struct SnapshotFile {
    file: File,
    len: u64,
    path: PathBuf,
    temp: Option<Temp>,
    /// Set only by [`SnapshotFile::check`], which read this file through.
    checked: Option<Checked>,
}

/// The fact that this process read a snapshot file through and found it whole, holding the
/// snapshot of `meta`. Only [`SnapshotFile::check`] makes one (its field is private to this
/// module), so no caller can mark a file checked without reading it.
struct Checked {
    meta: SnapshotMeta,
}

impl std::fmt::Debug for SnapshotFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SnapshotFile({}, {} bytes)",
            self.path.display(),
            self.len
        )
    }
}

impl SnapshotFile {
    /// Opens the snapshot at `path` and reads its meta (not the rest: see [`adopt`]).
    pub fn open(path: &Path) -> Result<(SnapshotMeta, SnapshotFile), StoreError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let (meta, _) = Reader::new(BufReader::new(&file), path)?;
        Ok((
            meta,
            SnapshotFile {
                file,
                len,
                path: path.to_path_buf(),
                temp: None,
                checked: None,
            },
        ))
    }

    /// The file's size in bytes, as it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the file through once, checks it (checksum, framing, trees: see
    /// `snapshot_format::verify`) and that it holds the snapshot of `meta`, and returns it
    /// marked as checked, so that [`adopt`] does not read it again. A receiver checks what it
    /// assembled before openraft sees it: a stream that ended early (the sender's file shrank
    /// under it) is then an error of that one send, which the leader retries, instead of a
    /// failed install, which openraft treats as a storage error that stops the member.
    pub fn check(mut self, meta: &SnapshotMeta) -> Result<SnapshotFile, StoreError> {
        read_through(&self.path, self.len, meta)?;
        self.checked = Some(Checked { meta: meta.clone() });
        Ok(self)
    }

    /// Reads `buf.len()` bytes at `offset`. A file removed or shrunk since it was opened
    /// (replaced by a newer snapshot) is an error, never a short read.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                StoreError::Snapshot {
                    file: self.path.clone(),
                    reason: "shrunk while read (replaced by a newer snapshot)".into(),
                }
            } else {
                StoreError::Io(e)
            }
        })
    }
}

/// A snapshot being received: chunks are appended (paced) to a temporary in the snapshot
/// directory.
pub struct Incoming {
    out: Paced,
    temp: Temp,
    len: u64,
}

impl Incoming {
    /// A new, empty received snapshot in `dir`, written through `fs`.
    pub fn create(fs: &Arc<dyn WalFs>, dir: &Path) -> Result<Incoming, StoreError> {
        let (temp, file) = incoming_temp(fs, dir)?;
        Ok(Incoming {
            out: Paced { file, unsynced: 0 },
            temp,
            len: 0,
        })
    }

    /// Appends `data` (blocks: a write and maybe an fdatasync).
    pub fn append(&mut self, data: &[u8]) -> Result<(), StoreError> {
        self.out.write_all(data)?;
        self.len += data.len() as u64;
        Ok(())
    }

    /// Syncs the file and hands it over, still a temporary, for [`adopt`].
    pub fn finish(mut self) -> Result<SnapshotFile, StoreError> {
        let synced = timed(&crate::metrics::SNAP_DB_FSYNC_SECONDS);
        synced(self.out.file.sync_all())?;
        let path = self.temp.path.clone().expect("not renamed yet");
        Ok(SnapshotFile {
            file: File::open(&path)?,
            len: self.len,
            path,
            temp: Some(self.temp),
            checked: None,
        })
    }
}

/// Checks the first `len` bytes of the file at `path` (see `snapshot_format::verify`) and
/// that they hold the snapshot of `meta`.
fn read_through(path: &Path, len: u64, meta: &SnapshotMeta) -> Result<(), StoreError> {
    let input = BufReader::with_capacity(IO_BUFFER, Input::open(path)?);
    let found = snapshot_format::verify(input.take(len), path)?;
    if &found != meta {
        return Err(StoreError::Snapshot {
            file: path.to_path_buf(),
            reason: format!("holds the snapshot of {found:?}, sent as that of {meta:?}"),
        });
    }
    Ok(())
}

/// Readies `snapshot` (of `meta`) to be put in place in `dir`, once it is found whole: read
/// through once, checksum, framing and trees (see `snapshot_format::verify`), with `meta` in
/// it. A received temporary in `dir` is used as it is, and not read again if
/// [`SnapshotFile::check`] found it whole with this `meta`; any other file (another member's,
/// in tests) is copied (paced, through `fs`) into a temporary first. [`Built::publish`]
/// renames it.
pub fn adopt(
    fs: &Arc<dyn WalFs>,
    snapshot: SnapshotFile,
    dir: &Path,
    meta: &SnapshotMeta,
) -> Result<Built, StoreError> {
    let SnapshotFile {
        file,
        len,
        path,
        temp,
        checked,
        ..
    } = snapshot;
    let temp = match temp.filter(|_| path.parent() == Some(dir)) {
        Some(t) if checked.is_some_and(|c| &c.meta == meta) => {
            return Ok(Built {
                temp: t,
                dst: dir.join(file_name(meta)),
                bytes: len,
            })
        }
        Some(t) => t,
        None => {
            let (temp, out) = incoming_temp(fs, dir)?;
            let mut out = Paced {
                file: out,
                unsynced: 0,
            };
            // From the start: opening it read the header.
            let mut from = &file;
            from.seek(io::SeekFrom::Start(0))?;
            let copied = io::copy(&mut from.take(len), &mut out)?;
            if copied != len {
                return Err(StoreError::Snapshot {
                    file: path,
                    reason: "shrunk while copied".into(),
                });
            }
            out.file.sync_all()?;
            temp
        }
    };
    let tmp_path = temp.path.clone().expect("not renamed yet");
    read_through(&tmp_path, len, meta)?;
    Ok(Built {
        temp,
        dst: dir.join(file_name(meta)),
        bytes: len,
    })
}
