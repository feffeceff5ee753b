//! Durable file operations for every file kvd writes itself (the WAL, snapshot files, the
//! engine generation pointer, identity and log-name files, restores), all through a
//! [`WalFs`], so the power-loss simulation (`wal::simfs`) sees every step. The WAL layer is
//! the lowest one, so every layer can use these.
//!
//! # Invariants: what is durable once a call returns Ok
//! - [`create_dir_durable`]: the directory and every ancestor it created.
//! - [`write_file_durable`] (and `_with_mode`): `path` holds exactly `bytes`; a power loss at any point before
//!   leaves the old content (or no file) or the new one, never a mix or nothing.
//! - [`rename_durable`]: the file is under its new name and no longer under its old one.
//! - [`sync_tree`]: every file and directory entry under `dir` that existed when it was
//!   listed (others' files, e.g. sled's, which sync neither files nor directories fully).
//! - [`remove_dir_all_durable`]: the directory is gone.
//!
//! A file under a name whose directory entry is not durable can vanish with a power loss,
//! however often the file itself was synced: hence the directory fsync after every creation,
//! rename and removal here.

use std::io;
use std::path::{Path, PathBuf};

use super::fs::{WalFile, WalFs};

/// Creates `dir` and any missing ancestors, fsyncing the parent of each directory it creates
/// (top-down), so the new entries survive a power loss. Every directory kvd creates goes
/// through this.
pub fn create_dir_durable(fs: &dyn WalFs, dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    for d in dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
        match fs.list_dir(d) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(d),
            Err(e) => return Err(e),
        }
    }
    for d in missing.into_iter().rev() {
        fs.create_dir_all(d)?;
        let parent = match d.parent() {
            None => continue,
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
        };
        fs.sync_dir(parent)?;
    }
    Ok(())
}

/// The directory holding `path`'s entry (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Renames `from` (a file already synced) to `to` and fsyncs `to`'s directory, so that a
/// power loss after it returns leaves the file under its new name. Both names must be in one
/// directory: only that directory is synced.
pub fn rename_durable(fs: &dyn WalFs, from: &Path, to: &Path) -> io::Result<()> {
    fs.rename(from, to)?;
    fs.sync_dir(parent_dir(to))
}

/// A new, empty file at `path`, replacing one left there (a temporary a crash left).
pub fn create_replacing(fs: &dyn WalFs, path: &Path) -> io::Result<Box<dyn WalFile>> {
    remove_leftover(fs, path)?;
    fs.create_file(path)
}

fn remove_leftover(fs: &dyn WalFs, path: &Path) -> io::Result<()> {
    match fs.remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `path` with `.tmp` appended: the temporary [`write_file_durable`] renames over it.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

/// Replaces the small file `path` with `bytes` so that a power loss leaves the old content or
/// the new one, never a mix or nothing: a temporary sibling ([`temp_path`]) written and
/// fsynced, renamed over `path`, then the directory fsynced.
pub fn write_file_durable(fs: &dyn WalFs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_durable(fs, path, bytes, None)
}

/// [`write_file_durable`] with the permission bits `mode` on the file from its creation (a
/// private key is never readable by others, not even empty).
pub fn write_file_durable_with_mode(
    fs: &dyn WalFs,
    path: &Path,
    bytes: &[u8],
    mode: u32,
) -> io::Result<()> {
    write_durable(fs, path, bytes, Some(mode))
}

fn write_durable(fs: &dyn WalFs, path: &Path, bytes: &[u8], mode: Option<u32>) -> io::Result<()> {
    let tmp = temp_path(path);
    remove_leftover(fs, &tmp)?;
    let mut f = match mode {
        None => fs.create_file(&tmp)?,
        Some(mode) => fs.create_file_with_mode(&tmp, mode)?,
    };
    f.append(bytes)?;
    f.sync_all()?;
    drop(f);
    rename_durable(fs, &tmp, path)
}

/// fsyncs every file and directory under `dir`, and `dir` itself: for a tree another library
/// wrote (sled syncs its log on flush, but not necessarily the files it wrote once at open,
/// nor any directory). An entry removed meanwhile needs no sync (sled replaces its snapshot
/// and removes blobs as it runs); `dir` itself missing is Ok too.
pub fn sync_tree(fs: &dyn WalFs, dir: &Path) -> io::Result<()> {
    let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
    let names = match fs.list_dir(dir) {
        Err(e) if gone(&e) => return Ok(()),
        r => r?,
    };
    for name in names {
        let path = dir.join(name);
        let res = if fs.is_dir(&path) {
            sync_tree(fs, &path)
        } else {
            fs.sync_file(&path)
        };
        match res {
            Err(e) if gone(&e) => {}
            r => r?,
        }
    }
    fs.sync_dir(dir)
}

/// Removes `dir` and everything under it, then fsyncs its parent.
pub fn remove_dir_all_durable(fs: &dyn WalFs, dir: &Path) -> io::Result<()> {
    fs.remove_dir_all(dir)?;
    fs.sync_dir(parent_dir(dir))
}
#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::wal::fs::WalFs;
    use crate::wal::SimFs;

    /// A file renamed into place by [`rename_durable`] survives every simulated power loss
    /// under its new name, whole.
    #[test]
    fn a_durable_rename_survives_a_power_loss() {
        let root = Path::new("/d");
        let (part, done) = (root.join("backup.db.part"), root.join("backup.db"));
        for seed in 0..64 {
            let fs = SimFs::new();
            fs.create_dir_all(root).unwrap();
            fs.sync_dir(Path::new("/")).unwrap();
            let mut f = fs.create_file(&part).unwrap();
            f.append(b"the whole backup").unwrap();
            f.sync_data().unwrap();
            drop(f);
            rename_durable(&fs, &part, &done).unwrap();
            fs.crash(&mut StdRng::seed_from_u64(seed));
            assert_eq!(
                fs.file_contents(&done).as_deref(),
                Some(&b"the whole backup"[..]),
                "seed {seed}"
            );
            assert_eq!(fs.file_contents(&part), None, "seed {seed}");
        }
    }

    #[test]
    fn a_bare_file_name_is_in_the_current_directory() {
        assert_eq!(parent_dir(Path::new("snap.db")), Path::new("."));
        assert_eq!(parent_dir(Path::new("/x/snap.db")), Path::new("/x"));
    }
}
