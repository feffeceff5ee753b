//! Raft log storage on the WAL.
//!
//! Invariants:
//! - Every entry, vote, committed id, truncation and purge is a WAL record; the WAL writes them
//!   in submission order, so replaying the WAL reproduces the log exactly as openraft saw it.
//! - `append` makes entries readable (in memory) before returning and reports them flushed only
//!   from the WAL's callback, i.e. after fdatasync. `save_vote` returns only once the vote is
//!   durable.
//! - The in-memory map holds every entry not yet purged; purges happen only below a durable
//!   snapshot (openraft guarantees that ordering), which bounds memory.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, Mutex};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;

use super::error::StoreError;
use super::types::{Entry, LogId, TypeConfig, Vote};
use crate::wal::{Record, Wal, WalBackend};

#[derive(Default)]
struct LogState_ {
    entries: BTreeMap<u64, Entry>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    /// True when `committed` changed since it was last written to the WAL.
    committed_dirty: bool,
    purged: Option<LogId>,
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

pub(crate) fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    bincode::serialize(v).expect("in-memory serialization cannot fail")
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    what: &str,
    b: &[u8],
) -> Result<T, StoreError> {
    bincode::deserialize(b).map_err(|e| StoreError::Decode {
        what: what.to_string(),
        reason: e.to_string(),
    })
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
                    st.entries.insert(index, e);
                }
                Record::Vote(b) => st.vote = Some(decode("vote", &b)?),
                Record::Committed(b) => st.committed = decode("committed", &b)?,
                Record::TruncateAfter { index } => {
                    let from = index.map_or(0, |i| i + 1);
                    st.entries.split_off(&from);
                }
                Record::PurgeUpTo { index, data } => {
                    st.entries = st.entries.split_off(&(index + 1));
                    st.purged = Some(decode("purge", &data)?);
                }
            }
        }
        Ok(LogStore {
            state: Arc::new(Mutex::new(st)),
            wal: Arc::new(wal),
        })
    }

    /// Makes the latest committed id durable (graceful stop), so a restart re-applies up to it.
    pub async fn flush_committed(&self) -> Result<(), StoreError> {
        let rec = self.state.lock().unwrap().take_committed();
        if let Some(r) = rec {
            self.wal.write(vec![r]).await?;
        }
        Ok(())
    }

    /// The WAL, for metrics.
    pub fn wal(&self) -> &Arc<Wal> {
        &self.wal
    }

    /// Last log index held (or purged up to).
    pub fn last_index(&self) -> u64 {
        let st = self.state.lock().unwrap();
        st.entries
            .keys()
            .next_back()
            .copied()
            .or(st.purged.as_ref().map(|l| l.index))
            .unwrap_or(0)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let st = self.state.lock().unwrap();
        Ok(st.entries.range(range).map(|(_, e)| e.clone()).collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.state.lock().unwrap().vote)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, io::Error> {
        // Bound one replication message so batches stay under the peer message limit.
        const MAX_BYTES: usize = super::limits::REPLICATION_BATCH_BYTES;
        let st = self.state.lock().unwrap();
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for (_, e) in st.entries.range(start..end) {
            if let openraft::EntryPayload::Normal(c) = &e.payload {
                bytes += c.0.len();
            }
            out.push(e.clone());
            if bytes >= MAX_BYTES {
                break;
            }
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let st = self.state.lock().unwrap();
        let last = st
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id())
            .or(st.purged);
        Ok(LogState {
            last_purged_log_id: st.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let mut records: Vec<Record> = self
            .state
            .lock()
            .unwrap()
            .take_committed()
            .into_iter()
            .collect();
        records.push(Record::Vote(encode(vote)));
        self.wal.write(records).await.map_err(io_err)?;
        self.state.lock().unwrap().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not written now: it rides with the next WAL write (see `take_committed`), so a
        // commit costs no fsync of its own. The record is ordered after the entries it
        // covers, so a recovered committed id is never newer than the truth.
        let mut st = self.state.lock().unwrap();
        st.committed = committed;
        st.committed_dirty = true;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.state.lock().unwrap().committed)
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
        {
            let mut st = self.state.lock().unwrap();
            records.extend(st.take_committed());
            for e in entries {
                records.push(Record::Entry {
                    index: e.index(),
                    data: encode(&e),
                });
                st.entries.insert(e.index(), e);
            }
            // Submitting under the lock keeps WAL order equal to in-memory order even if two
            // appends raced (openraft serializes them, this is belt and braces).
            self.wal.submit(
                records,
                Box::new(move |res| callback.io_completed(res.map_err(io_err))),
            );
        }
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let index = last_log_id.map(|l| l.index);
        {
            let mut st = self.state.lock().unwrap();
            st.entries.split_off(&index.map_or(0, |i| i + 1));
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
        let mut st = self.state.lock().unwrap();
        st.entries = st.entries.split_off(&(log_id.index + 1));
        st.purged = Some(log_id);
        Ok(())
    }
}
