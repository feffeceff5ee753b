//! Write-ahead log under the Raft log store.
//!
//! # Layout
//!
//! The WAL is a directory of segment files named `NNNNNNNNNNNNNNNN.wal`
//! (16 lower-case hex digits: the segment sequence number, contiguous).
//! All integers are fixed-width little-endian; nothing is padded. A segment's
//! blocks are reserved when it is created (`reserve` bytes of zeros, so
//! a batch's fdatasync has no file size to commit); the zeros after the last
//! frame of the last segment are not part of the log.
//!
//! ```text
//! segment file
//! +-------------------------------------------------------------+
//! | header (24 bytes)                                           |
//! |   magic "KVDWAL\0\0" [8] | version u32 (=1) | seq u64 | crc u32 |
//! |   (crc32 over the 20 bytes before it)                       |
//! +-------------------------------------------------------------+
//! | frame | frame | ... | BatchEnd | frame | ... | BatchEnd | ... |
//! +-------------------------------------------------------------+
//!
//! frame
//! +-----------+---------+-----------+---------------------+
//! | len u32   | type u8 | crc32 u32 | payload [len bytes] |
//! +-----------+---------+-----------+---------------------+
//!   crc32 = crc32(type byte ++ payload)
//!
//! type  record         payload
//!  0    (never valid: all-zero bytes must not parse)
//!  1    Entry          index u64 | data
//!  2    Vote           data
//!  3    Committed      data
//!  4    TruncateAfter  is_some u8 (0|1) | index u64 (0 if None)
//!  5    PurgeUpTo      index u64 | data
//!  6    BatchEnd       batch_start u64 (offset of the batch's first frame)
//! ```
//!
//! # Invariants
//!
//! - Records reach the disk in submission order; each `submit` callback runs
//!   after an fdatasync covering its records, and never after an I/O error.
//! - A record whose payload exceeds `format::MAX_PAYLOAD` is refused at
//!   `submit` (`RecordTooLarge`, nothing written) without poisoning the WAL.
//! - Each group commit (batch) is appended and fdatasynced before anything
//!   else is written (the next batch, or the next segment file) and ends with
//!   a `BatchEnd` frame; so after a power loss only the last batch of the last
//!   segment can be damaged, and a batch followed by *any* later bytes or
//!   segment file is provably synced. Recovery truncates a torn tail only
//!   where nothing proves it synced, and refuses (`Corrupt`) damage anywhere
//!   else: acknowledged records are never dropped.
//! - A segment is created, its header fdatasynced and the directory fsynced
//!   before any record is written into it. The first batch in a new segment
//!   (and the first after opening a multi-segment WAL) restates the latest
//!   Vote, Committed and PurgeUpTo, so older segments only ever hold
//!   superseded state and entries, and may be unlinked once a durable
//!   PurgeUpTo covers all their entries (oldest first, dir fsynced after).
//! - Consequently the records returned by `open` can repeat Vote, Committed
//!   and PurgeUpTo records; replaying them in order (last one wins) gives the
//!   right state. Entries at or below the latest PurgeUpTo may or may not be
//!   returned.
//!
//! # Recovery
//!
//! `open` reads the segments in order. A frame that fails to parse (bad crc,
//! type, length, or cut short) at offset X is a *torn tail* only if nothing
//! proves X's batch was fdatasynced. Proof is any of: a later segment file
//! exists (whatever its content); a `BatchEnd` of a later batch follows
//! (`batch_start > X`); X's own `BatchEnd` (`batch_start <= X`) is followed
//! by any non-zero byte (zeros are what reserved blocks hold). Only zeros
//! after the last valid frame of the last segment is its clean end. Valid frames of X's own batch after X prove nothing: the
//! pages of one in-flight write survive or vanish independently. A torn tail
//! is truncated to X and fsynced, with a warning; anything else is
//! `WalError::Corrupt { file, offset: X }` and the WAL does not open. A
//! garbage header on the newest segment (crash between create and header
//! fsync) is torn and the file removed; on any other segment it is
//! `BadHeader`; a different format version is `IncompatibleVersion`.
//!
//! A hole in the segment sequence is explained only by an interrupted purge:
//! the segments before it are removed if the last `PurgeUpTo` after the hole
//! covers every entry they hold and the entries after the hole continue from
//! it; otherwise `MissingSegment` names the missing file and nothing is
//! deleted.
//!
//! Limitation: damage inside the *last* batch of the last segment, with
//! nothing but zeros after that batch's end (e.g. a bit flip after its fdatasync),
//! cannot be told apart from a torn write, so it is repaired (dropping that
//! batch's records from the damaged one on) rather than reported. The same
//! holds if the damage also destroys every `BatchEnd` after it.
//!
//! # Reading entries back
//!
//! The WAL knows where every live Entry frame is (`locator`: built by recovery from the
//! surviving frames, then kept by the flusher as it writes), so `read_entries` returns an
//! entry by index with one positioned read per segment span, its crc checked, exactly as a
//! replay would have rebuilt it. The Raft log store uses it for entries it no longer keeps in
//! memory.
//!
//! # Callbacks
//!
//! `submit` callbacks run on the flusher thread, in order. They must be
//! quick and must not wait for the WAL (e.g. call `write_sync`): the flusher
//! cannot make progress until they return.

pub mod backend;
pub mod diskcheck;
pub mod durable;
mod flusher;
pub mod format;
pub mod fs;
mod locator;
mod recovery;
#[cfg(any(test, feature = "testkit"))]
pub mod simfs;

#[cfg(test)]
mod in_place_tests;
#[cfg(test)]
mod reserve_tests;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use crate::sync::LockExt;

pub use backend::WalBackend;
pub use durable::{
    create_dir_durable, remove_dir_all_durable, rename_durable, sync_tree, write_file_durable,
    write_file_durable_with_mode,
};
pub use fs::{real_fs, RealFs, WalFile, WalFs};
#[cfg(any(test, feature = "testkit"))]
pub use simfs::SimFs;

/// What the Raft layer writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// One Raft log entry (opaque bytes).
    Entry { index: u64, data: Vec<u8> },
    /// Opaque encoded vote.
    Vote(Vec<u8>),
    /// Opaque encoded committed log id.
    Committed(Vec<u8>),
    /// Drop all entries with index > `index` (None: all entries).
    TruncateAfter { index: Option<u64> },
    /// Entries <= `index` are no longer needed; `data` is an opaque log id.
    PurgeUpTo { index: u64, data: Vec<u8> },
}

/// Clone, so one failure reaches every caller waiting on it with its cause intact (an
/// `io::Error` is shared, not re-created from its text).
#[derive(Debug, Clone, thiserror::Error)]
pub enum WalError {
    #[error("wal I/O error: {0}")]
    Io(#[source] std::sync::Arc<std::io::Error>),
    #[error("wal corrupt: {file} at offset {offset}: {reason}")]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("wal segment {file} has a bad header: {reason}")]
    BadHeader { file: PathBuf, reason: String },
    #[error(
        "wal segment {file} has format version {found}, this build reads version {}",
        format::FORMAT_VERSION
    )]
    IncompatibleVersion { file: PathBuf, found: u32 },
    #[error(
        "wal segment {missing} is missing and the segments before it are not covered by the \
         durable purge point {purged:?} ({holds}); refusing to delete them (segments from {first_kept} on are intact)"
    )]
    MissingSegment {
        /// The first segment of the hole.
        missing: PathBuf,
        first_kept: PathBuf,
        /// What the purge point does not cover.
        holds: String,
        purged: Option<u64>,
    },
    #[error(
        "wal record payload of {len} bytes exceeds the maximum of {}",
        format::MAX_PAYLOAD
    )]
    RecordTooLarge { len: usize },
    #[error("wal is closed")]
    Closed,
    #[error("wal refuses writes after an earlier I/O failure: {0}")]
    Poisoned(#[source] std::sync::Arc<WalError>),
}

impl From<std::io::Error> for WalError {
    fn from(e: std::io::Error) -> Self {
        WalError::Io(std::sync::Arc::new(e))
    }
}

#[derive(Debug, Clone)]
pub struct WalOptions {
    /// A new segment is started before the next batch once the current one
    /// has reached this size (so segments overshoot by at most one batch).
    pub segment_size: u64,
    /// Bytes of blocks a new segment reserves (zeros, so a batch's fdatasync has no file
    /// size to commit), at most `segment_size`. Default: 64 MiB, the default segment size.
    pub reserve: u64,
    /// Skips the fdatasync of each batch (etcd's `--unsafe-no-fsync`): writes are acknowledged
    /// once they reach the OS, so a power loss can lose acknowledged records. Only for tests
    /// that prove the durability checks catch exactly that.
    pub unsafe_no_fsync: bool,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_size: 64 << 20,
            reserve: 64 << 20,
            unsafe_no_fsync: false,
        }
    }
}

impl WalOptions {
    /// What a new segment reserves.
    pub(crate) fn reservation(&self) -> u64 {
        self.reserve.min(self.segment_size)
    }
}

/// Upper bounds (seconds) of the fsync latency histogram buckets, etcd's
/// `etcd_disk_wal_fsync_duration_seconds` ones.
pub use crate::metrics::DISK_BUCKETS as FSYNC_BUCKETS;

/// A snapshot of the WAL counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WalStats {
    /// fdatasyncs of record batches (header and directory syncs not counted).
    pub fsyncs: u64,
    /// Records written, including restated state records.
    pub records: u64,
    pub bytes_written: u64,
    pub batches: u64,
    /// Cumulative counts: `fsync_buckets[k]` = fsyncs that took <= FSYNC_BUCKETS[k].
    /// The +Inf bucket is `fsyncs`.
    pub fsync_buckets: [u64; 14],
    pub fsync_seconds_sum: f64,
}

#[derive(Default)]
struct Stats {
    fsyncs: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    batches: AtomicU64,
    fsync_nanos: AtomicU64,
    /// The duration of the latest fsync ([`Wal::last_fsync`]).
    last_fsync_nanos: AtomicU64,
    buckets: [AtomicU64; 14],
    /// The last minute's fsync latencies, for `endpoint status` (the buckets above are
    /// totals since start, for Prometheus).
    recent: crate::metrics::RecentLatency,
}

impl Stats {
    fn observe_fsync(&self, d: Duration) {
        self.recent.observe(d);
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync_nanos
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        self.last_fsync_nanos
            .store(d.as_nanos() as u64, Ordering::Relaxed);
        let secs = d.as_secs_f64();
        for (b, bound) in self.buckets.iter().zip(FSYNC_BUCKETS) {
            if secs <= bound {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    fn add_batch(&self, records: u64, bytes: u64) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.records.fetch_add(records, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    fn snapshot(&self) -> WalStats {
        WalStats {
            fsyncs: self.fsyncs.load(Ordering::Relaxed),
            records: self.records.load(Ordering::Relaxed),
            bytes_written: self.bytes.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            fsync_buckets: std::array::from_fn(|k| self.buckets[k].load(Ordering::Relaxed)),
            fsync_seconds_sum: self.fsync_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// Completion callback passed to [`Wal::submit`].
pub type WalCallback = Box<dyn FnOnce(Result<(), WalError>) + Send>;

/// One `submit`: records waiting for the flusher, and who to tell once they are durable.
pub(crate) struct Submission {
    records: Vec<Record>,
    done: WalCallback,
}

#[derive(Default)]
pub(crate) struct Queue {
    pending: Vec<Submission>,
    closed: bool,
    poisoned: Option<std::sync::Arc<WalError>>,
}

pub(crate) struct Shared {
    queue: Mutex<Queue>,
    cv: Condvar,
    stats: Stats,
    locator: Mutex<locator::Locator>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panicking callback must not wedge every other caller.
        self.queue.lock_or_recover()
    }

    fn locator(&self) -> MutexGuard<'_, locator::Locator> {
        // Each update is one whole record; a panic cannot leave one half-applied.
        self.locator.lock_or_recover()
    }
}

struct Inner {
    shared: Arc<Shared>,
    /// The segment files and what the flusher knows; held while a batch is written.
    engine: Arc<Mutex<flusher::Flusher>>,
    /// For reading entries back ([`Wal::read_entries`]).
    fs: Arc<dyn WalFs>,
    dir: PathBuf,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: ThreadId,
}

impl Inner {
    fn shutdown(&self) {
        {
            let mut q = self.shared.lock();
            q.closed = true;
        }
        self.shared.cv.notify_all();
        let handle = self.thread.lock_or_recover().take();
        // Joining from a callback (the flusher dropping the last handle)
        // would deadlock; the thread exits by itself once the queue drains.
        if std::thread::current().id() != self.thread_id {
            if let Some(h) = handle {
                let _ = h.join();
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Handle to an open WAL. Clones share the same log; the flusher thread is
/// stopped (after draining the queue) when the last clone is dropped.
#[derive(Clone)]
pub struct Wal {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").finish_non_exhaustive()
    }
}

pub(crate) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.wal"))
}

/// The refusal of a submission holding a record larger than a WAL record may be: the
/// caller's mistake, answered to the caller without touching the log.
fn oversized(records: &[Record]) -> Option<WalError> {
    records
        .iter()
        .map(format::payload_len)
        .find(|l| *l > format::MAX_PAYLOAD)
        .map(|len| WalError::RecordTooLarge { len })
}

impl Wal {
    /// Opens (creating the dir if needed), recovers, repairs a torn tail,
    /// returns the surviving records in order.
    pub fn open(dir: &Path, opts: WalOptions) -> Result<(Wal, Vec<Record>), WalError> {
        Self::open_with_fs(Arc::new(RealFs), dir, opts)
    }

    pub fn open_with_fs(
        fs: Arc<dyn WalFs>,
        dir: &Path,
        opts: WalOptions,
    ) -> Result<(Wal, Vec<Record>), WalError> {
        let rec = recovery::recover(&fs, dir, opts.reservation())?;
        let mut vote = None;
        let mut committed = None;
        let mut purge = None;
        for r in &rec.records {
            match r {
                Record::Vote(v) => vote = Some(v.clone()),
                Record::Committed(c) => committed = Some(c.clone()),
                Record::PurgeUpTo { index, data } => purge = Some((*index, data.clone())),
                _ => {}
            }
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            stats: Stats::default(),
            locator: Mutex::new(rec.locator),
        });
        let flusher = flusher::Flusher {
            fs: fs.clone(),
            dir: dir.to_path_buf(),
            opts,
            file: rec.file,
            // The current segment may have been created by a run that died
            // before its restatement was durable; restating again is cheap
            // and keeps older segments deletable.
            restate: rec.segments.len() > 1,
            segments: VecDeque::from(rec.segments),
            vote,
            committed,
            purge,
            shared: shared.clone(),
            buf: Vec::new(),
        };
        let engine = Arc::new(Mutex::new(flusher));
        let handle = {
            let (engine, shared) = (engine.clone(), shared.clone());
            std::thread::Builder::new()
                .name("kvd-wal-flusher".into())
                .spawn(move || flusher::run(engine, shared))?
        };
        let inner = Inner {
            shared,
            engine,
            fs,
            dir: dir.to_path_buf(),
            thread_id: handle.thread().id(),
            thread: Mutex::new(Some(handle)),
        };
        Ok((
            Wal {
                inner: Arc::new(inner),
            },
            rec.records,
        ))
    }

    /// Queues records; they are written in submission order and `done` is
    /// called from the flusher thread once they are fdatasynced (or with the
    /// error). Never blocks on disk. If the WAL is already closed or
    /// poisoned, `done` is called immediately on the calling thread.
    pub fn submit(&self, records: Vec<Record>, done: WalCallback) {
        // Refused here, not by the flusher: an oversized record is the caller's mistake, not
        // an I/O failure, and must not poison the WAL for everyone.
        if let Some(e) = oversized(&records) {
            done(Err(e));
            return;
        }
        let shared = &self.inner.shared;
        let mut q = shared.lock();
        let refused = if q.closed {
            Some(WalError::Closed)
        } else {
            q.poisoned.clone().map(WalError::Poisoned)
        };
        match refused {
            None => {
                q.pending.push(Submission { records, done });
                drop(q);
                shared.cv.notify_one();
            }
            Some(e) => {
                drop(q);
                done(Err(e));
            }
        }
    }

    /// Writes and syncs `records` on the calling thread if the WAL is idle (nothing queued,
    /// no batch being written), then calls `done` here; otherwise queues them as
    /// [`submit`](Self::submit) does. Saves the two thread hand-offs of a queued write at the
    /// price of blocking the caller for the write and its fdatasync.
    pub fn write_here(&self, records: Vec<Record>, done: WalCallback) {
        let shared = &self.inner.shared;
        let idle = {
            let q = shared.lock();
            if q.pending.is_empty() && !q.closed && q.poisoned.is_none() {
                self.inner.engine.try_lock().ok()
            } else {
                None
            }
        };
        let Some(mut engine) = idle else {
            return self.submit(records, done);
        };
        if let Some(e) = oversized(&records) {
            drop(engine);
            done(Err(e));
            return;
        }
        engine.process(vec![Submission { records, done }], None);
    }

    /// Submits and blocks until the records are durable.
    pub fn write_sync(&self, records: Vec<Record>) -> Result<(), WalError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.submit(
            records,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv().unwrap_or(Err(WalError::Closed))
    }

    /// Async variant of [`write_sync`](Self::write_sync) for tokio callers.
    pub async fn write(&self, records: Vec<Record>) -> Result<(), WalError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(
            records,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.await.unwrap_or(Err(WalError::Closed))
    }

    /// Reads back the data of the entries in `range` from the segment files, in index order:
    /// from the first index of the range the WAL holds, until the range ends, their data
    /// reaches `max_bytes` (at least one entry), or an index is not (or no longer) in the
    /// WAL. Callers ask only for entries whose write completed; entries purged meanwhile end
    /// the result early.
    pub fn read_entries(
        &self,
        range: std::ops::Range<u64>,
        max_bytes: usize,
    ) -> Result<Vec<Vec<u8>>, WalError> {
        /// One read covers at most this span of a segment.
        const MAX_SPAN: u64 = 8 << 20;
        let locs = self.inner.shared.locator().lookup(range);
        let mut out = Vec::with_capacity(locs.len());
        let mut bytes = 0usize;
        let mut rest = &locs[..];
        while let Some(&(_, first)) = rest.first() {
            // The run of entries in the same segment that one read of a bounded span covers.
            let n = rest
                .iter()
                .take_while(|(_, l)| l.seq == first.seq && l.end() - first.offset <= MAX_SPAN)
                .count()
                .max(1);
            let (run, tail) = rest.split_at(n);
            rest = tail;
            let end = run.last().map_or(first.end(), |(_, l)| l.end());
            let path = segment_path(&self.inner.dir, first.seq);
            let span =
                match self
                    .inner
                    .fs
                    .read_at(&path, first.offset, (end - first.offset) as usize)
                {
                    Ok(b) => b,
                    // Purged (the segment unlinked) since the lookup.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) => return Err(e.into()),
                };
            for (index, loc) in run {
                let at = (loc.offset - first.offset) as usize;
                let corrupt = |reason: String| WalError::Corrupt {
                    file: path.clone(),
                    offset: loc.offset,
                    reason,
                };
                match format::decode_frame(&span, at).map_err(corrupt)? {
                    (format::Frame::Record(Record::Entry { index: i, data }), _) if i == *index => {
                        bytes += data.len();
                        out.push(data);
                    }
                    _ => return Err(corrupt(format!("not the frame of entry {index}"))),
                }
                if bytes >= max_bytes {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    pub fn stats(&self) -> WalStats {
        self.inner.shared.stats.snapshot()
    }

    /// How long the latest batch fdatasync took (zero before the first).
    pub fn last_fsync(&self) -> Duration {
        Duration::from_nanos(
            self.inner
                .shared
                .stats
                .last_fsync_nanos
                .load(Ordering::Relaxed),
        )
    }

    /// Batch fdatasyncs of the last [`crate::metrics::WINDOW_SECS`] seconds.
    pub fn recent_fsyncs(&self) -> crate::metrics::RecentSummary {
        self.inner.shared.stats.recent.summary()
    }

    /// Stops accepting writes, flushes what is queued and joins the flusher.
    /// Later submits fail with `Closed`. Dropping the last handle does the same.
    pub fn close(&self) {
        self.inner.shutdown();
    }
}
