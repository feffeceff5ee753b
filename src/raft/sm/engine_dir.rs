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
//! - Every file and directory operation here goes through the `WalFs` it is given (the
//!   durable steps are `wal::durable`'s), so the power-loss simulation covers the switch.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::raft::error::StoreError;
use crate::sync::LockExt;
use crate::wal::durable::{create_replacing, parent_dir};
use crate::wal::{create_dir_durable, sync_tree, WalFs};

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
fn current_name(fs: &dyn WalFs, sm_dir: &Path) -> io::Result<String> {
    match fs.read_file(&sm_dir.join(POINTER)) {
        Ok(s) => {
            let name = String::from_utf8_lossy(&s).trim().to_string();
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
pub fn open_current(fs: &dyn WalFs, sm_dir: &Path) -> io::Result<PathBuf> {
    let current = current_name(fs, sm_dir)?;
    if current != FIRST && !fs.is_dir(&sm_dir.join(&current)) {
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
    let mut names = fs.list_dir(sm_dir)?;
    names.sort();
    for name in names {
        let path = sm_dir.join(&name);
        if name == POINTER_TMP {
            fs.remove_file(&path)?;
            removed = true;
        } else if generation(&name).is_some() && name != current {
            tracing::warn!(dir = %path.display(), "removing an engine directory left by a defragmentation or a snapshot receive");
            fs.remove_dir_all(&path)?;
            removed = true;
        }
    }
    if removed {
        fs.sync_dir(sm_dir)?;
    }
    let dir = sm_dir.join(&current);
    create_dir_durable(fs, &dir)?;
    Ok(dir)
}

/// A new, empty directory for a generation after `current` and after every other generation
/// on disk: a defragmentation and a snapshot being received may prepare one each at the same
/// time, and a discarded one may still be on its way out.
pub fn prepare_next(fs: &dyn WalFs, current: &Path) -> io::Result<PathBuf> {
    // Two preparations must not pick the same number.
    static PREPARING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = PREPARING.lock_or_recover();
    let sm_dir = current.parent().unwrap_or(Path::new("."));
    let name = current
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if current_name(fs, sm_dir)? != name {
        // A switch whose outcome is uncertain: the next start decides, not this.
        return Err(io::Error::other(format!(
            "{POINTER} does not name {}; restart the member",
            current.display()
        )));
    }
    let newest = fs
        .list_dir(sm_dir)?
        .iter()
        .filter_map(|n| generation(n))
        .chain(generation(&name))
        .max()
        .unwrap_or(0);
    let next = sm_dir.join(name_of(newest + 1));
    create_dir_durable(fs, &next)?;
    Ok(next)
}

/// Makes `next` (from [`prepare_next`], its engine flushed) the current generation, durably.
/// An error before the rename leaves the current generation as it was (`next` may be
/// removed); from the rename on, it is [`StoreError::SwitchUncertain`]: either generation may
/// be current on disk, so neither may be removed, nor written as if it were the only one.
pub fn switch_to(fs: &dyn WalFs, next: &Path) -> Result<(), StoreError> {
    let sm_dir = parent_dir(next);
    // A file whose directory entry is not durable can vanish with a power loss.
    sync_tree(fs, next)?;
    let name = next
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // `wal::write_file_durable`'s steps, but an error from the rename on is not an ordinary
    // one: the pointer on disk may be either.
    let tmp = sm_dir.join(POINTER_TMP);
    let mut f = create_replacing(fs, &tmp)?;
    f.append(name.as_bytes())?;
    f.sync_all()?;
    drop(f);
    let uncertain = |e: io::Error| StoreError::SwitchUncertain {
        dir: next.to_path_buf(),
        source: std::sync::Arc::new(e),
    };
    fs.rename(&tmp, &sm_dir.join(POINTER)).map_err(uncertain)?;
    sync_after_rename(fs, sm_dir).map_err(uncertain)?;
    Ok(())
}

/// The fsync of `sm/` that makes a switch durable; tests make it fail.
fn sync_after_rename(fs: &dyn WalFs, sm_dir: &Path) -> io::Result<()> {
    #[cfg(test)]
    {
        let mut failing = FAIL_SYNC_AFTER_RENAME.lock_or_recover();
        if let Some(i) = failing.iter().position(|d| d == sm_dir) {
            failing.remove(i);
            return Err(io::Error::other("injected fsync failure"));
        }
    }
    fs.sync_dir(sm_dir)
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
pub fn sync_engine(fs: &dyn WalFs, db_dir: &Path) -> io::Result<()> {
    sync_tree(fs, db_dir)?;
    if let Some(sm_dir) = db_dir.parent() {
        record_step(sm_dir, "engine synced");
    }
    Ok(())
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
pub fn remove_when_closed(fs: Arc<dyn WalFs>, old: PathBuf, patience: Duration) {
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
            // Not durable on its own: a removal a power loss undoes is redone at the next start.
            match fs.remove_dir_all(&old) {
                Ok(()) => {
                    let _ = fs.sync_dir(parent_dir(&old));
                    tracing::info!(dir = %old.display(), "removed an engine directory no longer used");
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
    // sled's lock is on the real file: this asks the OS, not a `WalFs`.
    let Ok(f) = std::fs::File::open(db_file) else {
        return true;
    };
    // SAFETY: flock on a descriptor this function owns; released when `f` closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::wal::RealFs;

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
        let first = open_current(&RealFs, sm).unwrap();
        assert_eq!(first, sm.join("db"));
        fs::write(first.join("data"), b"old").unwrap();

        // A crash after preparing the next generation, before the switch: the old one stays.
        let next = prepare_next(&RealFs, &first).unwrap();
        assert_eq!(next, sm.join("db.1"));
        fs::write(next.join("data"), b"half").unwrap();
        fs::write(sm.join(POINTER_TMP), b"db.1").unwrap();
        assert_eq!(open_current(&RealFs, sm).unwrap(), first);
        assert_eq!(names(sm), ["db"]);

        // A switch: the new one is current from then on, and the old one is a leftover.
        let next = prepare_next(&RealFs, &first).unwrap();
        fs::write(next.join("data"), b"new").unwrap();
        switch_to(&RealFs, &next).unwrap();
        assert_eq!(open_current(&RealFs, sm).unwrap(), next);
        assert_eq!(names(sm), ["db.1", "db.current"]);
        assert_eq!(fs::read(next.join("data")).unwrap(), b"new");
        assert_eq!(prepare_next(&RealFs, &next).unwrap(), sm.join("db.2"));
    }

    /// A defragmentation and a snapshot being received prepare a generation each at the same
    /// time: they get different directories, past any on disk, and neither empties the other.
    #[test]
    fn generations_prepared_side_by_side_are_distinct() {
        let d = tempfile::tempdir().unwrap();
        let sm = d.path();
        let first = open_current(&RealFs, sm).unwrap();
        let a = prepare_next(&RealFs, &first).unwrap();
        fs::write(a.join("data"), b"a").unwrap();
        let b = prepare_next(&RealFs, &first).unwrap();
        assert_eq!((a.clone(), b.clone()), (sm.join("db.1"), sm.join("db.2")));
        assert_eq!(fs::read(a.join("data")).unwrap(), b"a", "left alone");
        switch_to(&RealFs, &b).unwrap();
        assert_eq!(prepare_next(&RealFs, &b).unwrap(), sm.join("db.3"));
    }

    #[test]
    fn a_pointer_naming_a_missing_generation_stops_the_start_and_removes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let sm = d.path();
        let first = open_current(&RealFs, sm).unwrap();
        fs::write(first.join("data"), b"applied state").unwrap();
        fs::write(sm.join(POINTER), b"db.1").unwrap();
        assert!(open_current(&RealFs, sm).is_err());
        assert_eq!(fs::read(first.join("data")).unwrap(), b"applied state");
        assert!(!sm.join("db.1").exists());
    }

    #[test]
    fn the_generation_the_pointer_names_is_never_prepared_over() {
        let d = tempfile::tempdir().unwrap();
        let sm = d.path();
        let first = open_current(&RealFs, sm).unwrap();
        let next = prepare_next(&RealFs, &first).unwrap();
        fs::write(next.join("data"), b"new").unwrap();
        // As after an uncertain switch: the pointer names `db.1`, the engine is still on `db`.
        fs::write(sm.join(POINTER), b"db.1").unwrap();
        assert!(prepare_next(&RealFs, &first).is_err());
        assert_eq!(fs::read(next.join("data")).unwrap(), b"new");
    }

    #[test]
    fn a_pointer_naming_nothing_valid_is_refused() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join(POINTER), b"../elsewhere").unwrap();
        assert!(open_current(&RealFs, d.path()).is_err());
    }

    #[test]
    fn removal_waits_for_the_engine_to_close() {
        let d = tempfile::tempdir().unwrap();
        let old = d.path().join("db.3");
        let engine = crate::mvcc::StoreEngine::open(&old).unwrap();
        remove_when_closed(Arc::new(RealFs), old.clone(), Duration::from_secs(10));
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

/// Power loss during a defragmentation's switch, on the simulated file system: the engine's
/// files stand in for sled's (written, never synced by their writer, as sled leaves some).
#[cfg(test)]
mod power_loss_tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::wal::{SimFs, WalFile};

    const FILES: [&str; 2] = ["db", "blobs/7"];

    fn sm_dir() -> &'static Path {
        Path::new("/member/sm")
    }

    /// Writes `content` into the engine files under `dir`, unsynced (as sled may leave them).
    fn write_engine(fs: &SimFs, dir: &Path, content: &[u8]) -> io::Result<()> {
        for f in FILES {
            let path = dir.join(f);
            fs.create_dir_all(parent_dir(&path))?;
            let mut file: Box<dyn WalFile> = fs.create_file(&path)?;
            file.append(content)?;
        }
        Ok(())
    }

    fn engine_content(fs: &SimFs, dir: &Path) -> Vec<Option<Vec<u8>>> {
        FILES
            .iter()
            .map(|f| fs.file_contents(&dir.join(f)))
            .collect()
    }

    /// A member on generation `db`, its engine synced (as a snapshot point leaves it).
    fn member() -> (SimFs, PathBuf) {
        let fs = SimFs::new();
        create_dir_durable(&fs, sm_dir()).unwrap();
        let first = open_current(&fs, sm_dir()).unwrap();
        write_engine(&fs, &first, b"old").unwrap();
        sync_engine(&fs, &first).unwrap();
        (fs, first)
    }

    /// One defragmentation's steps up to the switch, then the next start's cleanup; stops at
    /// the first error (the failpoint). Whether the switch returned Ok.
    fn defragment(fs: &SimFs, first: &Path) -> bool {
        let Ok(next) = prepare_next(fs, first) else {
            return false;
        };
        if write_engine(fs, &next, b"new").is_err() || switch_to(fs, &next).is_err() {
            return false;
        }
        let _ = open_current(fs, sm_dir());
        true
    }

    /// At every step of a switch (and of the cleanup at the next start), a power loss leaves
    /// `sm/` opening to the old generation or the new one, whole, never neither; and once
    /// the switch returned, always the new one.
    #[test]
    fn a_power_loss_at_any_step_of_a_switch_opens_to_one_whole_generation() {
        let mut saw = (false, false);
        for n in 0.. {
            let mut done = false;
            for seed in 0..24 {
                let (fs, first) = member();
                fs.fail_after(n);
                let switched = defragment(&fs, &first);
                done = !fs.failpoint_tripped();
                fs.crash(&mut StdRng::seed_from_u64(seed));
                let dir = open_current(&fs, sm_dir()).unwrap_or_else(|e| {
                    panic!("failpoint {n}, seed {seed}: no generation opens: {e}")
                });
                let want: &[u8] = if dir == first {
                    assert!(
                        !switched,
                        "failpoint {n}, seed {seed}: a switch that returned Ok was lost"
                    );
                    saw.0 = true;
                    b"old"
                } else {
                    assert_eq!(dir, sm_dir().join("db.1"), "failpoint {n}, seed {seed}");
                    saw.1 = true;
                    b"new"
                };
                assert_eq!(
                    engine_content(&fs, &dir),
                    vec![Some(want.to_vec()); FILES.len()],
                    "failpoint {n}, seed {seed}: {} is not whole",
                    dir.display()
                );
                let mut left = fs.list_dir(sm_dir()).unwrap();
                left.retain(|n| n.starts_with("db") && n != "db.current");
                assert_eq!(
                    left.len(),
                    1,
                    "failpoint {n}, seed {seed}: leftovers {left:?}"
                );
            }
            if done {
                assert!(n > 10, "only {n} steps");
                break;
            }
        }
        assert_eq!(saw, (true, true), "both outcomes happen");
    }
}
