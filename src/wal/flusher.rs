//! The segment files and the thread that writes queued batches to them.
//!
//! Invariants:
//! - the segment files are touched only by whoever holds the `Flusher`'s mutex: the flusher
//!   thread for each batch it takes from the queue, or a caller of `Wal::write_here` that
//!   found the queue empty and the mutex free (the thread takes a batch only while holding
//!   the mutex, so no write can overtake one queued before it);
//! - at most one batch is being written or synced at any time, and a batch is
//!   fully fdatasynced before the next one is written: this is what lets
//!   recovery assume only the final batch can be torn;
//! - callbacks run in submission order, only after the fdatasync covering
//!   their records returned Ok;
//! - after any I/O error the WAL is poisoned: nothing is acknowledged again
//!   (a failed fsync may have dropped dirty pages, so retrying could report
//!   data durable that never reached the disk);
//! - a segment's blocks are reserved (zeros) when it is created, and cut to
//!   what was written before the next segment is created;
//! - segment rotation happens only between batches, and a new segment's
//!   first batch starts by restating the latest Vote, Committed and PurgeUpTo,
//!   so every older segment holds only superseded state plus entries;
//! - segments are unlinked oldest-first, only after the PurgeUpTo that
//!   condemns them is durable.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::sync::LockExt;

use super::format::{self, HEADER_LEN};
use super::fs::{WalFile, WalFs};
use super::locator::Loc;
use super::recovery::{create_segment, SegmentInfo};
use super::{segment_path, Record, Shared, Submission, WalError, WalOptions};

pub(crate) struct Flusher {
    pub fs: Arc<dyn WalFs>,
    pub dir: PathBuf,
    pub opts: WalOptions,
    pub file: Box<dyn WalFile>,
    pub segments: VecDeque<SegmentInfo>,
    pub vote: Option<Vec<u8>>,
    pub committed: Option<Vec<u8>>,
    pub purge: Option<(u64, Vec<u8>)>,
    /// Restate state at the start of the next batch.
    pub restate: bool,
    pub shared: Arc<Shared>,
    pub buf: Vec<u8>,
}

/// Fails whatever is still queued if the thread exits for any reason,
/// including a panicking callback, so no caller waits forever.
struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let pending = {
            let mut q = self.0.lock();
            q.closed = true;
            std::mem::take(&mut q.pending)
        };
        for p in pending {
            (p.done)(Err(WalError::Closed));
        }
    }
}

/// The flusher thread: waits for submissions and writes them, one batch at a time, holding
/// `engine` while it takes a batch and writes it (so a caller writing on its own thread,
/// [`super::Wal::write_here`], is ordered against it).
pub(crate) fn run(engine: Arc<Mutex<Flusher>>, shared: Arc<Shared>) {
    let _guard = ExitGuard(shared.clone());
    loop {
        {
            let mut q = shared.lock();
            while q.pending.is_empty() && !q.closed {
                q = shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            if q.pending.is_empty() {
                return;
            }
        }
        let mut f = engine.lock_or_recover();
        let (batch, poisoned) = {
            let mut q = shared.lock();
            (std::mem::take(&mut q.pending), q.poisoned.clone())
        };
        f.process(batch, poisoned);
    }
}

impl Flusher {
    /// Writes one batch and runs its callbacks (or fails them all if the WAL is poisoned).
    pub(crate) fn process(
        &mut self,
        batch: Vec<Submission>,
        poisoned: Option<std::sync::Arc<WalError>>,
    ) {
        if batch.is_empty() {
            return;
        }
        if let Some(reason) = poisoned {
            for p in batch {
                (p.done)(Err(WalError::Poisoned(reason.clone())));
            }
            return;
        }
        match self.write_batch(&batch) {
            Ok(purge_to) => {
                for p in batch {
                    (p.done)(Ok(()));
                }
                if let Some(idx) = purge_to {
                    if let Err(e) = self.purge_segments(idx) {
                        self.poison(&e);
                    }
                }
            }
            Err(e) => {
                self.poison(&e);
                for p in batch {
                    (p.done)(Err(e.clone()));
                }
            }
        }
    }

    fn poison(&self, e: &WalError) {
        tracing::error!(error = %e, "wal: I/O failure, refusing all further writes");
        let mut q = self.shared.lock();
        if q.poisoned.is_none() {
            q.poisoned = Some(std::sync::Arc::new(e.clone()));
        }
    }

    /// Writes and syncs one group commit. Returns the purge index if the
    /// batch contained a PurgeUpTo (to be applied now that it is durable).
    fn write_batch(&mut self, batch: &[Submission]) -> Result<Option<u64>, WalError> {
        if self.file.size() >= self.opts.segment_size {
            self.rotate()?;
        }
        let batch_start = self.file.size();
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let mut n_records = 0u64;
        if self.restate {
            let state: Vec<Record> = self.state_records();
            for r in &state {
                encode(r, &mut buf)?;
            }
            n_records += state.len() as u64;
        }
        let mut purge_to = None;
        let cur = self.segments.back_mut().expect("current segment");
        // Where each submitted record's frame starts, for the locator once the bytes are written.
        let mut starts = Vec::with_capacity(batch.iter().map(|p| p.records.len()).sum());
        for p in batch {
            for r in &p.records {
                starts.push(batch_start + buf.len() as u64);
                encode(r, &mut buf)?;
                n_records += 1;
                match r {
                    Record::Entry { index, .. } => {
                        cur.max_entry = Some(cur.max_entry.map_or(*index, |m| m.max(*index)))
                    }
                    Record::Vote(v) => self.vote = Some(v.clone()),
                    Record::Committed(c) => self.committed = Some(c.clone()),
                    Record::PurgeUpTo { index, data } => {
                        self.purge = Some((*index, data.clone()));
                        purge_to = Some(*index);
                    }
                    Record::TruncateAfter { .. } => {}
                }
            }
        }
        let records_end = batch_start + buf.len() as u64;
        format::encode_batch_end(batch_start, &mut buf);
        self.file.append(&buf)?;
        self.locate(batch, &starts, records_end);
        if !self.opts.unsafe_no_fsync {
            let t = Instant::now();
            self.file.sync_data()?;
            self.shared.stats.observe_fsync(t.elapsed());
        }
        self.shared.stats.add_batch(n_records, buf.len() as u64);
        self.restate = false;
        // Keep the buffer for the next batch unless one huge batch bloated it.
        if buf.capacity() <= 16 << 20 {
            self.buf = buf;
        }
        Ok(purge_to)
    }

    /// Tells the locator where this batch's records landed (`starts`: each record's frame
    /// offset, in batch order; `end`: where the last one ends).
    fn locate(&self, batch: &[Submission], starts: &[u64], end: u64) {
        let seq = self.segments.back().expect("current segment").seq;
        let mut locator = self.shared.locator();
        let records = batch.iter().flat_map(|p| &p.records);
        let ends = starts.iter().skip(1).copied().chain([end]);
        for ((r, &offset), end) in records.zip(starts).zip(ends) {
            let len = (end - offset) as u32;
            locator.observe(r, Loc { seq, offset, len });
        }
    }

    fn state_records(&self) -> Vec<Record> {
        let mut v = Vec::new();
        if let Some(vote) = &self.vote {
            v.push(Record::Vote(vote.clone()));
        }
        if let Some(c) = &self.committed {
            v.push(Record::Committed(c.clone()));
        }
        if let Some((index, data)) = &self.purge {
            v.push(Record::PurgeUpTo {
                index: *index,
                data: data.clone(),
            });
        }
        v
    }

    fn rotate(&mut self) -> Result<(), WalError> {
        let seq = self.segments.back().expect("current segment").seq + 1;
        // Cut reserved blocks this segment did not fill (the segment size can change between
        // runs): recovery accepts a zero tail only in the last segment.
        let written = self.file.size();
        self.file.set_len(written)?;
        if !self.opts.unsafe_no_fsync {
            self.file.sync_data()?;
        }
        self.file = create_segment(&self.fs, &self.dir, seq, self.opts.reservation())?;
        debug_assert_eq!(self.file.size(), HEADER_LEN as u64);
        self.segments.push_back(SegmentInfo {
            seq,
            max_entry: None,
        });
        self.restate = true;
        Ok(())
    }

    fn purge_segments(&mut self, purge_to: u64) -> Result<(), WalError> {
        let started = std::time::Instant::now();
        let mut removed = 0;
        // Oldest-first and stop at the first keeper: removing a later segment
        // while an older one survives could drop a TruncateAfter and
        // resurrect entries it had cut off.
        while self.segments.len() > 1 {
            let s = &self.segments[0];
            if s.max_entry.is_some_and(|m| m > purge_to) {
                break;
            }
            self.fs.remove_file(&segment_path(&self.dir, s.seq))?;
            self.segments.pop_front();
            removed += 1;
        }
        if removed > 0 {
            self.fs.sync_dir(&self.dir)?;
            tracing::info!(
                removed,
                purge_to,
                took_ms = started.elapsed().as_millis() as u64,
                "wal: purged segments"
            );
        }
        Ok(())
    }
}

fn encode(r: &Record, buf: &mut Vec<u8>) -> Result<(), WalError> {
    format::encode_record(r, buf).map_err(|len| WalError::RecordTooLarge { len })
}
