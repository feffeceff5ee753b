//! Raft log storage on the WAL.
//!
//! Invariants:
//! - Every entry, vote, committed id, truncation and purge is a WAL record; the WAL writes them
//!   in submission order, so replaying the WAL reproduces the log exactly as openraft saw it.
//! - `append` makes entries readable (in memory) before returning and reports them flushed only
//!   from the WAL's callback, i.e. after fdatasync. `save_vote` returns only once the vote is
//!   durable.
//! - The in-memory map holds the newest entries, every one in `(evicted, last]`; entries in
//!   `(purged, evicted]` are only in the WAL and are read back through its locator (record
//!   0028). An entry leaves memory only once its append is fdatasynced, oldest first, while
//!   the map is over `--experimental-raft-log-cache-bytes`; the newest entry always stays.
//! - Purges happen only below a durable snapshot (openraft guarantees that ordering); they
//!   bound the WAL, the window bounds memory.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;

use crate::raft::codec::{decode, encode};
use crate::raft::error::StoreError;
use crate::raft::limits::LOG_CACHE_BYTES;
use crate::raft::log::in_place::InPlace;
use crate::raft::types::{Entry, LogId, TypeConfig, Vote};
use crate::sync::LockExt;
use crate::wal::{Record, Wal, WalBackend};

struct LogState_ {
    /// The newest entries: every one in `(evicted, last]` (the in-memory window).
    entries: BTreeMap<u64, Entry>,
    /// Approximate bytes held by `entries` (see [`entry_bytes`]).
    entry_bytes: usize,
    /// Entries in `(purged, evicted]` are only in the WAL and are read back on demand.
    evicted: Option<u64>,
    /// What `entries` may hold before the oldest durable ones are dropped from memory.
    cache_bytes: usize,
    last: Option<LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    /// True when `committed` changed since it was last written to the WAL.
    committed_dirty: bool,
    purged: Option<LogId>,
    /// Whether an append is written on the caller's thread (decision 0034).
    in_place: InPlace,
}

impl Default for LogState_ {
    fn default() -> Self {
        LogState_ {
            entries: BTreeMap::new(),
            entry_bytes: 0,
            evicted: None,
            cache_bytes: LOG_CACHE_BYTES,
            last: None,
            vote: None,
            committed: None,
            committed_dirty: false,
            purged: None,
            in_place: InPlace::default(),
        }
    }
}

/// The memory an entry costs in the window: its command plus the entry and map slot.
fn entry_bytes(e: &Entry) -> usize {
    command_len(e) + 128
}

impl LogState_ {
    /// The committed id as a record to ride along with the next WAL write, if it changed. It
    /// is never written on its own: that would cost an fsync per commit on every member, and a
    /// recovered committed id that lags the truth is safe (openraft re-learns the rest).
    fn take_committed(&mut self) -> Option<Record> {
        if !std::mem::take(&mut self.committed_dirty) {
            return None;
        }
        Some(Record::Committed(encode(&self.committed)))
    }

    /// The first index the log may still hold.
    fn first_live(&self) -> u64 {
        self.purged.map_or(0, |l| l.index + 1)
    }

    /// The first index held in memory (if the log reaches it).
    fn first_in_memory(&self) -> u64 {
        self.evicted.map_or(0, |i| i + 1)
    }

    fn insert(&mut self, e: Entry) {
        self.entry_bytes += entry_bytes(&e);
        self.last = Some(e.log_id());
        if let Some(old) = self.entries.insert(e.index(), e) {
            self.entry_bytes -= entry_bytes(&old);
        }
    }

    /// Drops every entry after `index` (None: all).
    fn truncate_after(&mut self, index: Option<u64>) {
        let from = index.map_or(0, |i| i + 1);
        for e in self.entries.split_off(&from).values() {
            self.entry_bytes -= entry_bytes(e);
        }
        self.evicted = match index {
            None => None,
            Some(i) => self.evicted.map(|e| e.min(i)),
        };
    }

    /// Drops every entry at or below `log_id`.
    fn purge(&mut self, log_id: LogId) {
        let keep = self.entries.split_off(&(log_id.index + 1));
        for e in std::mem::replace(&mut self.entries, keep).values() {
            self.entry_bytes -= entry_bytes(e);
        }
        self.evicted = Some(self.evicted.map_or(log_id.index, |e| e.max(log_id.index)));
        self.purged = Some(log_id);
        if self.last.is_none_or(|l| l.index < log_id.index) {
            self.last = Some(log_id);
        }
    }

    /// Drops the oldest entries at or below `durable` from memory while the window is over
    /// its budget. The newest entry always stays: it is the log's last id.
    fn evict(&mut self, durable: u64) {
        while self.entry_bytes > self.cache_bytes && self.entries.len() > 1 {
            let Some(entry) = self.entries.first_entry() else {
                break;
            };
            if *entry.key() > durable {
                break;
            }
            let (index, e) = entry.remove_entry();
            self.entry_bytes -= entry_bytes(&e);
            self.evicted = Some(index);
        }
    }
}

/// The WAL-backed log store; clones share the same log.
#[derive(Clone)]
pub struct LogStore {
    state: Arc<Mutex<LogState_>>,
    wal: Arc<Wal>,
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl LogStore {
    /// Opens the WAL in `dir` and rebuilds the log from its records.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_on(dir, &WalBackend::default())
    }

    /// Like [`open`](Self::open), on the given WAL backend (tests: a simulated file system).
    pub fn open_on(dir: &Path, backend: &WalBackend) -> Result<Self, StoreError> {
        let (wal, records) = backend.open(dir)?;
        Self::from_parts(wal, records)
    }

    /// Builds the store from an opened WAL and its recovered records (tests use this with a
    /// simulated file system).
    pub fn from_parts(wal: Wal, records: Vec<Record>) -> Result<Self, StoreError> {
        let mut st = LogState_::default();
        for r in records {
            match r {
                Record::Entry { index, data } => {
                    let e: Entry = decode("entry", &data)?;
                    debug_assert_eq!(e.index(), index);
                    st.truncate_after(index.checked_sub(1));
                    st.insert(e);
                    // Every recovered entry is durable: keep only the window in memory.
                    st.evict(index);
                }
                Record::Vote(b) => st.vote = Some(decode("vote", &b)?),
                Record::Committed(b) => st.committed = decode("committed", &b)?,
                Record::TruncateAfter { index } => st.truncate_after(index),
                Record::PurgeUpTo { index, data } => {
                    let purged: LogId = decode("purge", &data)?;
                    debug_assert_eq!(purged.index, index);
                    st.purge(purged);
                }
            }
        }
        // The last id after the replay: the newest entry in memory, else the newest one only
        // the WAL holds (a truncation below the window), else the purge point.
        st.last = match st.entries.values().next_back() {
            Some(e) => Some(e.log_id()),
            None if st.evicted.is_some_and(|e| e >= st.first_live()) => {
                let i = st.evicted.unwrap_or_default();
                let data = wal.read_entries(i..i + 1, 1)?.pop().ok_or_else(|| {
                    StoreError::Inconsistent {
                        what: "log",
                        reason: format!("entry {i} is not in the WAL"),
                    }
                })?;
                Some(decode::<Entry>("entry", &data)?.log_id())
            }
            None => st.purged,
        };
        Ok(LogStore {
            state: Arc::new(Mutex::new(st)),
            wal: Arc::new(wal),
        })
    }

    /// The switch that lets appends be written on openraft's thread while this member
    /// follows ([`crate::raft::log::in_place::track_role`] keeps it).
    pub fn following(&self) -> Arc<AtomicBool> {
        self.state.lock_or_recover().in_place.following()
    }

    /// Keeps about `bytes` of the newest entries in memory (`--experimental-raft-log-cache-
    /// bytes`); the rest stay readable from the WAL. Call it before Raft starts: every entry
    /// held then was recovered from the WAL, so all of them are durable.
    pub fn set_cache_bytes(&self, bytes: usize) {
        let mut st = self.state.lock_or_recover();
        st.cache_bytes = bytes;
        let durable = st.entries.keys().next_back().copied().unwrap_or(0);
        st.evict(durable);
    }

    /// Makes the latest committed id durable (graceful stop), so a restart re-applies up to it.
    pub async fn flush_committed(&self) -> Result<(), StoreError> {
        let rec = self.state.lock_or_recover().take_committed();
        if let Some(r) = rec {
            self.wal.write(vec![r]).await?;
        }
        Ok(())
    }

    /// The WAL, for metrics.
    pub fn wal(&self) -> &Arc<Wal> {
        &self.wal
    }

    /// Neither a vote nor an entry (nor a purge point): the log of a member that never took
    /// part in an election or a replication.
    pub fn holds_nothing(&self) -> bool {
        let st = self.state.lock_or_recover();
        st.vote.is_none() && st.last.is_none()
    }

    /// Last log index held (or purged up to).
    pub fn last_index(&self) -> u64 {
        self.state.lock_or_recover().last.map_or(0, |l| l.index)
    }

    /// Entries `start..end` (in order, stopping early at `max_bytes` of commands or at an
    /// entry purged meanwhile): the older ones read back from the WAL, the rest from memory.
    fn read_range(&self, start: u64, end: u64, max_bytes: usize) -> Result<Vec<Entry>, io::Error> {
        // Memory first, under the lock; the WAL part after it, without the lock (disk reads
        // must not stall appends and flush callbacks). Entries move only from memory to the
        // WAL, so what the WAL holds below `evicted` stays put meanwhile.
        let (disk, mem) = {
            let st = self.state.lock_or_recover();
            let start = start.max(st.first_live());
            let end = end.max(start);
            let split = start.max(st.first_in_memory()).min(end);
            let mut mem = Vec::new();
            let mut bytes = 0usize;
            for e in st.entries.range(split..end) {
                if bytes >= max_bytes {
                    break;
                }
                bytes += command_len(e.1);
                mem.push(e.1.clone());
            }
            (start..split, mem)
        };
        if disk.is_empty() {
            return Ok(mem);
        }
        let last_on_disk = disk.end - 1;
        let mut out = Vec::with_capacity(mem.len() + 64);
        let mut bytes = 0usize;
        for data in self.wal.read_entries(disk, max_bytes).map_err(io_err)? {
            let e: Entry = decode("entry", &data).map_err(io_err)?;
            bytes += command_len(&e);
            out.push(e);
        }
        // A short read (a purge meanwhile, or the byte limit) ends the result there.
        if out.last().is_some_and(|e| e.index() == last_on_disk) && bytes < max_bytes {
            for e in mem {
                if bytes >= max_bytes {
                    break;
                }
                bytes += command_len(&e);
                out.push(e);
            }
        }
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        self.read_range(start, end, usize::MAX)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.state.lock_or_recover().vote)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, io::Error> {
        // Bound one replication message so batches stay under the peer message limit.
        self.read_range(start, end, crate::raft::limits::REPLICATION_BATCH_BYTES)
    }
}

/// The bytes of an entry's command (0 for membership and blank entries).
fn command_len(e: &Entry) -> usize {
    match &e.payload {
        openraft::EntryPayload::Normal(c) => c.0.len(),
        _ => 0,
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let st = self.state.lock_or_recover();
        Ok(LogState {
            last_purged_log_id: st.purged,
            last_log_id: st.last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let mut records: Vec<Record> = self
            .state
            .lock_or_recover()
            .take_committed()
            .into_iter()
            .collect();
        records.push(Record::Vote(encode(vote)));
        self.wal.write(records).await.map_err(io_err)?;
        self.state.lock_or_recover().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not written now: it rides with the next WAL write (see `take_committed`), so a
        // commit costs no fsync of its own. The record is ordered after the entries it
        // covers, so a recovered committed id is never newer than the truth.
        let mut st = self.state.lock_or_recover();
        st.committed = committed;
        st.committed_dirty = true;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.state.lock_or_recover().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut records = Vec::new();
        let mut st = self.state.lock_or_recover();
        records.extend(st.take_committed());
        let mut newest = 0;
        let mut n = 0;
        for e in entries {
            n += 1;
            newest = e.index();
            records.push(Record::Entry {
                index: e.index(),
                data: encode(&e),
            });
            st.insert(e);
        }
        // Once these entries are durable they may leave memory (the WAL holds them).
        let state = Arc::downgrade(&self.state);
        let done = move |res: Result<(), crate::wal::WalError>| {
            if res.is_ok() {
                if let Some(state) = state.upgrade() {
                    state.lock_or_recover().evict(newest);
                }
            }
            callback.io_completed(res.map_err(io_err));
        };
        if st.in_place.choose(n, self.wal.last_fsync()) {
            // `done` may run on this thread: the lock must be free. openraft makes one call
            // at a time, so the WAL still gets the records in log order.
            drop(st);
            self.wal.write_here(records, Box::new(done));
        } else {
            // Submitting under the lock keeps WAL order equal to in-memory order even if two
            // appends raced (openraft serializes them, this is belt and braces). `done` takes
            // the lock only on success, which `submit` never reports on this thread.
            self.wal.submit(records, Box::new(done));
        }
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let index = last_log_id.map(|l| l.index);
        {
            let mut st = self.state.lock_or_recover();
            st.truncate_after(index);
            if st.last.is_some_and(|l| index.is_none_or(|i| l.index > i)) {
                st.last = last_log_id.or(st.purged);
            }
        }
        self.wal
            .write(vec![Record::TruncateAfter { index }])
            .await
            .map_err(io_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.wal
            .write(vec![Record::PurgeUpTo {
                index: log_id.index,
                data: encode(&log_id),
            }])
            .await
            .map_err(io_err)?;
        self.state.lock_or_recover().purge(log_id);
        Ok(())
    }
}

#[cfg(test)]
#[path = "log_store_tests.rs"]
mod tests;
