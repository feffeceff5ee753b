//! Which directory under `member/sm/` holds the state machine's engine, and the crash-safe
//! switch to a new one (defragmentation).
//!
//! ```text
//! sm/db            generation 0 (every member starts here)
//! sm/db.N          generation N, written by the N-th defragmentation
//! sm/db.current    the name of the current generation; absent = "db"
//! ```
//!
//! # Invariants
//! - The current generation is whole: a new one becomes current (the atomic rename of
//!   `db.current`, then an fsync of `sm/`) only after its engine was flushed and its
//!   directories fsynced. A crash before the rename leaves the old one current, after it the
//!   new one; every other `db*` directory is left over and removed at the next open.
//! - A generation `db.current` may name is never removed. Once the rename of `db.current` has
//!   been attempted, a failure of it or of the fsync after it leaves the pointer on disk
//!   uncertain: [`switch_to`] says so ([`StoreError::SwitchUncertain`]), both generations stay,
//!   and only the next start, reading the pointer, removes the other. A pointer naming a
//!   directory that does not exist stops the start and removes nothing.
//! - A directory is never renamed while an engine has it open (sled reads large values from
//!   files by path), and an old generation is removed only once its engine has closed (its
//!   lock is free) or at the next start.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::raft::error::StoreError;
#[cfg(test)]
use crate::sync::LockExt;
use crate::wal::fsync_dir;

const FIRST: &str = "db";
const POINTER: &str = "db.current";
const POINTER_TMP: &str = "db.current.tmp";

/// The generation number of an engine directory name: `db` is 0, `db.N` is N.
fn generation(name: &str) -> Option<u64> {
    if name == FIRST {
        return Some(0);
    }
    name.strip_prefix("db.")?.parse().ok()
}

fn name_of(gen: u64) -> String {
    if gen == 0 {
        FIRST.to_string()
    } else {
        format!("db.{gen}")
    }
}

/// The current generation's name, from the pointer file.
fn current_name(sm_dir: &Path) -> io::Result<String> {
    match fs::read_to_string(sm_dir.join(POINTER)) {
        Ok(s) => {
            let name = s.trim().to_string();
            if generation(&name).is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: {name:?} names no engine directory",
                        sm_dir.join(POINTER).display()
                    ),
                ));
            }
            Ok(name)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(FIRST.to_string()),
        Err(e) => Err(e),
    }
}

/// The current engine directory (created if missing), after removing every other generation
/// and an unfinished pointer: what a crash during a defragmentation left.
pub fn open_current(sm_dir: &Path) -> io::Result<PathBuf> {
    let current = current_name(sm_dir)?;
    if current != FIRST && !sm_dir.join(&current).is_dir() {
        // Only a lost directory gets here (a switch names a generation already durable):
        // starting empty, and removing the others as leftovers, would drop the applied state.
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} names {current}, which does not exist; nothing was removed",
                sm_dir.join(POINTER).display()
            ),
        ));
    }
    let mut removed = false;
    for entry in fs::read_dir(sm_dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == POINTER_TMP {
            fs::remove_file(entry.path())?;
            removed = true;
        } else if generation(&name).is_some() && name != current {
            tracing::warn!(dir = %entry.path().display(), "removing an engine directory left by a defragmentation");
            fs::remove_dir_all(entry.path())?;
            removed = true;
        }
    }
    if removed {
        fsync_dir(sm_dir)?;
    }
    let dir = sm_dir.join(&current);
    crate::wal::create_dir_durable(&crate::wal::RealFs, &dir)?;
    Ok(dir)
}

/// A new, empty directory for the generation after `current`.
pub fn prepare_next(current: &Path) -> io::Result<PathBuf> {
    let sm_dir = current.parent().unwrap_or(Path::new("."));
    let gen = current
        .file_name()
        .and_then(|n| generation(&n.to_string_lossy()))
        .unwrap_or(0);
    let next = sm_dir.join(name_of(gen + 1));
    if current_name(sm_dir)? == name_of(gen + 1) {
        // A switch to it whose outcome is uncertain: the next start decides, not this.
        return Err(io::Error::other(format!(
            "{} is named by {POINTER}; restart the member",
            next.display()
        )));
    }
    if next.exists() {
        fs::remove_dir_all(&next)?;
    }
    crate::wal::create_dir_durable(&crate::wal::RealFs, &next)?;
    Ok(next)
}

/// Makes `next` (from [`prepare_next`], its engine flushed) the current generation, durably.
/// An error before the rename leaves the current generation as it was (`next` may be
/// removed); from the rename on, it is [`StoreError::SwitchUncertain`]: either generation may
/// be current on disk, so neither may be removed, nor written as if it were the only one.
pub fn switch_to(next: &Path) -> Result<(), StoreError> {
    let sm_dir = next.parent().unwrap_or(Path::new("."));
    // A file whose directory entry is not durable can vanish with a power loss.
    sync_tree(next)?;
    let name = next
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = sm_dir.join(POINTER_TMP);
    let mut f = fs::File::create(&tmp)?;
    f.write_all(name.as_bytes())?;
    f.sync_all()?;
    drop(f);
    let uncertain = |e: io::Error| StoreError::SwitchUncertain {
        dir: next.to_path_buf(),
        reason: e.to_string(),
    };
    fs::rename(&tmp, sm_dir.join(POINTER)).map_err(uncertain)?;
    sync_after_rename(sm_dir).map_err(uncertain)?;
    Ok(())
}

/// The fsync of `sm/` that makes a switch durable; tests make it fail.
fn sync_after_rename(sm_dir: &Path) -> io::Result<()> {
    #[cfg(test)]
    {
        let mut failing = FAIL_SYNC_AFTER_RENAME.lock_or_recover();
        if let Some(i) = failing.iter().position(|d| d == sm_dir) {
            failing.remove(i);
            return Err(io::Error::other("injected fsync failure"));
        }
    }
    fsync_dir(sm_dir)
}

/// `sm/` directories whose next fsync after a pointer rename fails (test builds only). Keyed by
/// directory, not thread: the switch runs on a blocking-pool thread.
#[cfg(test)]
static FAIL_SYNC_AFTER_RENAME: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Makes the next fsync of `sm_dir` after a pointer rename fail, once.
#[cfg(test)]
pub(crate) fn fail_sync_after_rename(sm_dir: &Path) {
    FAIL_SYNC_AFTER_RENAME
        .lock_or_recover()
        .push(sm_dir.to_path_buf());
}

/// Makes everything the engine in `db_dir` wrote durable; the engine must have been flushed.
/// sled's flush is not enough on its own: it writes its log with `sync_file_range` (neither the
/// file's size nor the disk's write cache), writes its blobs and config without any sync, and
/// syncs no directory.
pub fn sync_engine(db_dir: &Path) -> io::Result<()> {
    sync_tree(db_dir)?;
    if let Some(sm_dir) = db_dir.parent() {
        record_step(sm_dir, "engine synced");
    }
    Ok(())
}

/// fsyncs every file and directory under `dir`: sled syncs its log on flush, but not
/// necessarily the files it wrote once at open (its config, its snapshot) nor any directory.
/// An entry removed meanwhile (sled replaces its snapshot and removes blobs as it runs) needs
/// no sync.
fn sync_tree(dir: &Path) -> io::Result<()> {
    let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
    let entries = match fs::read_dir(dir) {
        Err(e) if gone(&e) => return Ok(()),
        r => r?,
    };
    for entry in entries {
        let entry = entry?;
        let res = match entry.file_type() {
            Ok(t) if t.is_dir() => sync_tree(&entry.path()),
            Ok(_) => fs::File::open(entry.path()).and_then(|f| f.sync_all()),
            Err(e) => Err(e),
        };
        match res {
            Err(e) if gone(&e) => {}
            r => r?,
        }
    }
    fsync_dir(dir)
}

/// Records that `step` happened for the state machine in `sm_dir` (test builds only; nothing
/// otherwise), so tests can check the order of durability steps and removals.
#[inline]
pub(crate) fn record_step(sm_dir: &Path, step: &'static str) {
    #[cfg(test)]
    STEPS
        .lock_or_recover()
        .entry(sm_dir.to_path_buf())
        .or_default()
        .push(step);
    #[cfg(not(test))]
    let _ = (sm_dir, step);
}

#[cfg(test)]
static STEPS: std::sync::Mutex<std::collections::BTreeMap<PathBuf, Vec<&'static str>>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// The steps recorded for `sm_dir` so far, in order.
#[cfg(test)]
pub(crate) fn steps(sm_dir: &Path) -> Vec<&'static str> {
    STEPS
        .lock_or_recover()
        .get(sm_dir)
        .cloned()
        .unwrap_or_default()
}

/// Removes an old generation once no engine holds it open (sled keeps an exclusive lock on
/// its `db` file while open), in a thread of its own; gives up after `patience` and leaves it
/// for the next start.
pub fn remove_when_closed(old: PathBuf, patience: Duration) {
    let spawned = std::thread::Builder::new()
        .name("engine-dir-gc".into())
        .spawn(move || {
            let deadline = Instant::now() + patience;
            while !unlocked(&old.join("db")) {
                if Instant::now() > deadline {
                    tracing::warn!(dir = %old.display(), "old engine directory still open; it is removed at the next start");
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            match fs::remove_dir_all(&old) {
                Ok(()) => {
                    if let Some(p) = old.parent() {
                        let _ = fsync_dir(p);
                    }
                    tracing::info!(dir = %old.display(), "removed the engine directory defragmentation replaced");
                }
                Err(e) => tracing::warn!(dir = %old.display(), error = %e, "removing the old engine directory"),
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start removing the old engine directory; the next start does");
    }
}

/// Whether nothing holds sled's lock on `db_file` (or it is gone).
fn unlocked(db_file: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = fs::File::open(db_file) else {
        return true;
    };
    // SAFETY: flock on a descriptor this function owns; released when `f` closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn generations_switch_and_leftovers_go_at_the_next_open() {
        let d = tempfile::tempdir().unwrap();
        let sm = d.path();
        let first = open_current(sm).unwrap();
        assert_eq!(first, sm.join("db"));
        fs::write(first.join("data"), b"old").unwrap();

        // A crash after preparing the next generation, before the switch: the old one stays.
        let next = prepare_next(&first).unwrap();
        assert_eq!(next, sm.join("db.1"));
        fs::write(next.join("data"), b"half").unwrap();
        fs::write(sm.join(POINTER_TMP), b"db.1").unwrap();
        assert_eq!(open_current(sm).unwrap(), first);
        assert_eq!(names(sm), ["db"]);

        // A switch: the new one is current from then on, and the old one is a leftover.
        let next = prepare_next(&first).unwrap();
        fs::write(next.join("data"), b"new").unwrap();
        switch_to(&next).unwrap();
        assert_eq!(open_current(sm).unwrap(), next);
        assert_eq!(names(sm), ["db.1", "db.current"]);
        assert_eq!(fs::read(next.join("data")).unwrap(), b"new");
        assert_eq!(prepare_next(&next).unwrap(), sm.join("db.2"));
    }

    #[test]
    fn a_pointer_naming_a_missing_generation_stops_the_start_and_removes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let sm = d.path();
        let first = open_current(sm).unwrap();
        fs::write(first.join("data"), b"applied state").unwrap();
        fs::write(sm.join(POINTER), b"db.1").unwrap();
        assert!(open_current(sm).is_err());
        assert_eq!(fs::read(first.join("data")).unwrap(), b"applied state");
        assert!(!sm.join("db.1").exists());
    }

    #[test]
    fn the_generation_the_pointer_names_is_never_prepared_over() {
        let d = tempfile::tempdir().unwrap();
        let sm = d.path();
        let first = open_current(sm).unwrap();
        let next = prepare_next(&first).unwrap();
        fs::write(next.join("data"), b"new").unwrap();
        // As after an uncertain switch: the pointer names `db.1`, the engine is still on `db`.
        fs::write(sm.join(POINTER), b"db.1").unwrap();
        assert!(prepare_next(&first).is_err());
        assert_eq!(fs::read(next.join("data")).unwrap(), b"new");
    }

    #[test]
    fn a_pointer_naming_nothing_valid_is_refused() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join(POINTER), b"../elsewhere").unwrap();
        assert!(open_current(d.path()).is_err());
    }

    #[test]
    fn removal_waits_for_the_engine_to_close() {
        let d = tempfile::tempdir().unwrap();
        let old = d.path().join("db.3");
        let engine = crate::mvcc::StoreEngine::open(&old).unwrap();
        remove_when_closed(old.clone(), Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(300));
        assert!(old.exists(), "still open");
        drop(engine);
        let deadline = Instant::now() + Duration::from_secs(10);
        while old.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!old.exists());
    }
}
