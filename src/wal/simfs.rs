//! An in-memory [`WalFs`] that models what survives a power loss.
//!
//! Model (deliberately harsher than most real file systems):
//! - every file has *live* bytes (what reads see) and *durable* bytes (what
//!   survives a crash); `sync_data` copies live to durable;
//! - directory entries (create, remove, rename) are live immediately but
//!   durable only after `sync_dir` of their parent; at a crash every entry
//!   whose live and durable states differ independently takes one of the two;
//! - at a crash, the unsynced part of each file is decided per 4 KiB page:
//!   the page keeps its new content, keeps its old content (zeros past the
//!   old end), or becomes zeros/garbage past the old end; if the file had
//!   grown, it is cut at a random point between the durable and live length.
//!   Bytes that were durable are never damaged.
//!
//! A directory renamed (the whole tree moves) may be found back under its old name
//! at a crash until the new name's parent is synced.
//!
//! A directory is like a directory entry: durable once its parent is synced
//! (a root is always durable). At a crash a directory created or removed since
//! that sync survives or vanishes, and everything under a vanished directory
//! vanishes with it; a removed directory that survives comes back empty.
//!
//! Failpoints: [`SimFs::fail_after`] makes the n-th mutating operation (write,
//! set_len, allocate, sync, create, remove (a file or a directory tree), rename, sync_dir) and every one after it fail,
//! i.e. the machine stops doing I/O at that point; [`SimFs::fail_once_after`]
//! fails only that one operation. [`SimFs::crash`] clears failpoints and
//! invalidates every handle opened before it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::sync::LockExt;

use rand::Rng;

use super::fs::{WalFile, WalFs};

const PAGE: usize = 4096;

#[derive(Default)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// live[..dirty_from] == durable[..dirty_from]; lets sync copy only the
    /// new suffix instead of the whole file (keeps the crash tests fast).
    dirty_from: usize,
}

#[derive(Clone, Copy)]
struct FailPoint {
    remaining: u64,
    sticky: bool,
    tripped: bool,
    /// The kind of op the failpoint fired on (write, sync_data, create, ...).
    tripped_on: Option<&'static str>,
}

#[derive(Default)]
struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    live_names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    durable_dirs: BTreeSet<PathBuf>,
    /// Directory renames (from, to) not yet made durable by a sync of `to`'s parent.
    dir_renames: Vec<(PathBuf, PathBuf)>,
    generation: u64,
    fail: Option<FailPoint>,
    mutating_ops: u64,
    sync_delay: Option<Duration>,
}

impl State {
    /// Moves the directory `from`, and everything under it, live and durable, to `to`.
    fn move_tree(&mut self, from: &Path, to: &Path) {
        let moved = |p: &PathBuf| to.join(p.strip_prefix(from).expect("under from"));
        for names in [&mut self.live_names, &mut self.durable_names] {
            let under: Vec<PathBuf> = names
                .keys()
                .filter(|p| p.starts_with(from))
                .cloned()
                .collect();
            for p in under {
                let ino = names.remove(&p).expect("listed");
                names.insert(moved(&p), ino);
            }
        }
        for dirs in [&mut self.dirs, &mut self.durable_dirs] {
            let under: Vec<PathBuf> = dirs
                .iter()
                .filter(|p| p.starts_with(from))
                .cloned()
                .collect();
            for p in under {
                dirs.remove(&p);
                dirs.insert(moved(&p));
            }
        }
    }

    /// Counts a mutating op and decides whether the failpoint fires for it.
    fn tick(&mut self, what: &'static str) -> io::Result<()> {
        self.mutating_ops += 1;
        if let Some(fp) = &mut self.fail {
            if fp.tripped && fp.sticky {
                return Err(injected(what));
            }
            if !fp.tripped {
                if fp.remaining == 0 {
                    fp.tripped = true;
                    fp.tripped_on = Some(what);
                    if !fp.sticky {
                        self.fail = None;
                    }
                    return Err(injected(what));
                }
                fp.remaining -= 1;
            }
        }
        Ok(())
    }
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("simfs: injected failure in {what}"))
}

/// Simulated file system; clones share state.
#[derive(Clone, Default)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for SimFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimFs").finish_non_exhaustive()
    }
}

impl SimFs {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock_or_recover()
    }

    /// The next `n` mutating ops succeed; the one after and all later ones fail.
    pub fn fail_after(&self, n: u64) {
        self.lock().fail = Some(FailPoint {
            remaining: n,
            sticky: true,
            tripped: false,
            tripped_on: None,
        });
    }

    /// Like [`fail_after`](Self::fail_after) but only one op fails.
    pub fn fail_once_after(&self, n: u64) {
        self.lock().fail = Some(FailPoint {
            remaining: n,
            sticky: false,
            tripped: false,
            tripped_on: None,
        });
    }

    pub fn clear_failpoint(&self) {
        self.lock().fail = None;
    }

    /// Whether a failpoint has fired (and is still in force).
    pub fn failpoint_tripped(&self) -> bool {
        self.lock().fail.is_some_and(|f| f.tripped)
    }

    /// The kind of op a sticky failpoint fired on ("write", "sync_data", "create", "remove",
    /// "rename", "sync_dir", "set_len", "allocate"), while it is in force.
    pub fn tripped_on(&self) -> Option<&'static str> {
        self.lock().fail.and_then(|f| f.tripped_on)
    }

    /// Mutating ops performed so far (what `fail_after` counts).
    pub fn mutating_ops(&self) -> u64 {
        self.lock().mutating_ops
    }

    /// Makes every `sync_data` sleep, to emulate a slow disk.
    pub fn set_sync_delay(&self, d: Option<Duration>) {
        self.lock().sync_delay = d;
    }

    /// Live content of a file, if it exists.
    pub fn file_contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.lock();
        let ino = st.live_names.get(path)?;
        Some(st.inodes[ino].live.clone())
    }

    /// Overwrites a file's content, live and durable (for corruption tests).
    pub fn set_file_contents(&self, path: &Path, data: Vec<u8>) {
        let mut st = self.lock();
        let ino = st.live_names[path];
        let node = st.inodes.get_mut(&ino).unwrap();
        node.dirty_from = data.len();
        node.live = data.clone();
        node.durable = data;
    }

    /// Simulates power loss. Handles opened before the crash stop working.
    pub fn crash<R: Rng + ?Sized>(&self, rng: &mut R) {
        let mut st = self.lock();
        let st = &mut *st;
        // A directory rename not made durable happened or did not, its contents with it.
        for (from, to) in std::mem::take(&mut st.dir_renames).into_iter().rev() {
            if rng.gen_bool(0.5) {
                st.move_tree(&to, &from);
            }
        }
        let paths: BTreeSet<PathBuf> = st
            .live_names
            .keys()
            .chain(st.durable_names.keys())
            .cloned()
            .collect();
        let mut names = BTreeMap::new();
        for p in paths {
            let live = st.live_names.get(&p).copied();
            let durable = st.durable_names.get(&p).copied();
            let pick = if live == durable || rng.gen_bool(0.5) {
                durable
            } else {
                live
            };
            if let Some(ino) = pick {
                names.insert(p, ino);
            }
        }
        // Sorted order visits a parent before its children. A directory created or removed
        // since its parent's last sync independently survives or vanishes.
        let mut dirs = BTreeSet::new();
        for d in st.dirs.union(&st.durable_dirs) {
            let parent_ok = d.parent().is_none_or(|p| dirs.contains(p));
            let settled = st.dirs.contains(d) && st.durable_dirs.contains(d);
            if parent_ok && (settled || rng.gen_bool(0.5)) {
                dirs.insert(d.clone());
            }
        }
        names.retain(|p, _| p.parent().is_some_and(|d| dirs.contains(d)));
        st.durable_dirs = dirs.clone();
        st.dirs = dirs;
        let keep: BTreeSet<u64> = names.values().copied().collect();
        st.inodes.retain(|ino, _| keep.contains(ino));
        for node in st.inodes.values_mut() {
            let bytes = crash_content(&node.live, &node.durable, rng);
            node.dirty_from = bytes.len();
            node.live = bytes.clone();
            node.durable = bytes;
        }
        st.live_names = names.clone();
        st.durable_names = names;
        st.generation += 1;
        st.fail = None;
    }
}

fn crash_content<R: Rng + ?Sized>(live: &[u8], durable: &[u8], rng: &mut R) -> Vec<u8> {
    let dlen = durable.len();
    let new_len = if live.len() > dlen {
        rng.gen_range(dlen..=live.len())
    } else if rng.gen_bool(0.5) {
        live.len()
    } else {
        dlen
    };
    let mut out = durable.to_vec();
    out.resize(new_len, 0);
    let mut page = 0;
    while page < new_len {
        let end = (page + PAGE).min(new_len);
        let live_end = end.min(live.len());
        let changed = live.get(page..live_end) != durable.get(page..live_end.min(dlen))
            || (end > dlen && live_end > page);
        if changed {
            match rng.gen_range(0..10) {
                // The new content made it.
                0..=5 => {
                    if live_end > page {
                        out[page..live_end].copy_from_slice(&live[page..live_end]);
                    }
                }
                // The old content (zeros past the old end) stayed.
                6..=7 => {}
                // Zeros or garbage, but only where nothing was durable.
                8 => out[page.max(dlen).min(end)..end].fill(0),
                _ => rng.fill(&mut out[page.max(dlen).min(end)..end]),
            }
        }
        page = end;
    }
    out
}

struct SimFile {
    state: Arc<Mutex<State>>,
    ino: u64,
    generation: u64,
    len: u64,
}

impl SimFile {
    fn with<T>(&self, what: &'static str, f: impl FnOnce(&mut State) -> T) -> io::Result<T> {
        let mut st = self.state.lock_or_recover();
        if st.generation != self.generation {
            return Err(io::Error::other("simfs: handle from before a crash"));
        }
        st.tick(what)?;
        Ok(f(&mut st))
    }
}

impl WalFile for SimFile {
    fn size(&self) -> u64 {
        self.len
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let ino = self.ino;
        self.with("write", |st| {
            let node = st.inodes.get_mut(&ino).unwrap();
            node.dirty_from = node.dirty_from.min(offset as usize);
            let live = &mut node.live;
            let end = offset as usize + buf.len();
            if live.len() < end {
                live.resize(end, 0);
            }
            live[offset as usize..end].copy_from_slice(buf);
        })?;
        self.len = self.len.max(offset + buf.len() as u64);
        Ok(())
    }
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write_at(self.len, buf)
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let ino = self.ino;
        self.with("set_len", |st| {
            st.inodes
                .get_mut(&ino)
                .unwrap()
                .live
                .resize(len as usize, 0)
        })?;
        self.len = len;
        Ok(())
    }
    fn allocate(&mut self, len: u64) -> io::Result<()> {
        let ino = self.ino;
        self.with("allocate", |st| {
            let node = st.inodes.get_mut(&ino).unwrap();
            if node.live.len() < len as usize {
                node.dirty_from = node.dirty_from.min(node.live.len());
                node.live.resize(len as usize, 0);
            }
        })
    }
    fn resume_at(&mut self, end: u64) {
        self.len = end;
    }
    fn sync_data(&mut self) -> io::Result<()> {
        let ino = self.ino;
        let delay = self.with("sync_data", |st| {
            let node = st.inodes.get_mut(&ino).unwrap();
            let same = node.dirty_from.min(node.durable.len()).min(node.live.len());
            node.durable.truncate(same);
            node.durable.extend_from_slice(&node.live[same..]);
            node.dirty_from = node.live.len();
            st.sync_delay
        })?;
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        Ok(())
    }
}

fn not_found(p: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}", p.display()))
}

impl WalFs for SimFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.lock();
        for a in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
            if st.dirs.insert(a.to_path_buf()) && a.parent().is_none() {
                st.durable_dirs.insert(a.to_path_buf());
            }
        }
        Ok(())
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.lock();
        if !st.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(st
            .live_names
            .keys()
            .chain(st.dirs.iter())
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        let st = self.lock();
        let ino = st.live_names.get(path).ok_or_else(|| not_found(path))?;
        Ok(st.inodes[ino].live.clone())
    }
    fn create_file(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let mut st = self.lock();
        st.tick("create")?;
        if st.live_names.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}", path.display()),
            ));
        }
        if !path.parent().is_some_and(|d| st.dirs.contains(d)) {
            return Err(not_found(path));
        }
        let ino = st.next_ino;
        st.next_ino += 1;
        st.inodes.insert(ino, Inode::default());
        st.live_names.insert(path.to_path_buf(), ino);
        Ok(Box::new(SimFile {
            state: self.state.clone(),
            ino,
            generation: st.generation,
            len: 0,
        }))
    }
    fn open_file(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let st = self.lock();
        let ino = *st.live_names.get(path).ok_or_else(|| not_found(path))?;
        Ok(Box::new(SimFile {
            state: self.state.clone(),
            ino,
            generation: st.generation,
            len: st.inodes[&ino].live.len() as u64,
        }))
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick("remove")?;
        st.live_names.remove(path).ok_or_else(|| not_found(path))?;
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick("rename")?;
        if st.dirs.contains(from) {
            // Modelled as the directory moving with everything in it; until `to`'s parent is
            // synced, a crash may undo the move (see `crash`).
            if st.dirs.contains(to) || st.live_names.contains_key(to) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}", to.display()),
                ));
            }
            st.move_tree(from, to);
            st.dir_renames.push((from.to_path_buf(), to.to_path_buf()));
            return Ok(());
        }
        let ino = st.live_names.remove(from).ok_or_else(|| not_found(from))?;
        st.live_names.insert(to.to_path_buf(), ino);
        Ok(())
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick("sync_dir")?;
        let st = &mut *st;
        st.durable_names.retain(|p, _| p.parent() != Some(dir));
        for (p, ino) in &st.live_names {
            if p.parent() == Some(dir) {
                st.durable_names.insert(p.clone(), *ino);
            }
        }
        st.durable_dirs
            .retain(|d| d.parent() != Some(dir) || st.dirs.contains(d));
        st.dir_renames.retain(|(_, to)| to.parent() != Some(dir));
        for d in &st.dirs {
            if d.parent() == Some(dir) {
                st.durable_dirs.insert(d.clone());
            }
        }
        Ok(())
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.lock().dirs.contains(path)
    }
    fn sync_file(&self, path: &Path) -> io::Result<()> {
        let mut file = self.open_file(path)?;
        file.sync_data()
    }
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick("remove")?;
        if !st.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        // Modelled as unlinking everything inside (durably: a directory that comes back with a
        // power loss comes back empty, as a new one made in its place is) and then the
        // directory, whose own entry is durable once its parent is synced.
        let inside = |p: &Path| p.starts_with(dir);
        st.live_names.retain(|p, _| !inside(p));
        st.durable_names.retain(|p, _| !inside(p));
        st.dirs.retain(|d| !inside(d));
        st.durable_dirs.retain(|d| d == dir || !inside(d));
        Ok(())
    }
}
