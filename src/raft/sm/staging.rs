//! A snapshot received from a leader, written into a new engine generation as it arrives
//! ([`Stager`]), and installed by switching to that generation ([`StateMachine::install_staged`]).
//!
//! A received snapshot used to be written to a file, synced, read through to check it, then
//! read again and written into the engine: the engine write began only once the last byte had
//! arrived. Now the bytes are decoded as they arrive and written straight into an engine of
//! their own, so the stream and the engine's writes overlap and no file is written or read.
//! Each entry's key and value are lent from the chunk they arrived in (`snapshot_format`'s
//! `Reader::lent`) until the engine has packed them: they are not copied out first.
//!
//! # Invariants
//! - A staged generation is no store's until the install's durable switch (`engine_dir`): a
//!   stream that breaks, a snapshot that does not check (framing, trees, checksum, or a meta
//!   other than the one sent), a member that stops or a crash leave the current generation
//!   as it was, and the staged directory is removed (once its engine has closed, or at the
//!   next start).
//! - A generation is switched to only when whole and durable: every entry written, the meta
//!   tree (with the snapshot's last-applied log id and membership) last, the engine flushed
//!   and its files and directories synced; the checksum, at the end of the stream, was found
//!   right before that. Until that sync its engine writes only start their writeback (sled's
//!   `write_back`): the sync makes them durable, not each write.
//! - The decoding and the engine writes run at nice 10 (`background`), below the member's
//!   applies, WAL writes and peer traffic.
//! - Memory is bounded: the receiver holds at most [`QUEUED_CHUNKS`] chunks besides the one
//!   being decoded and those the engine batches in flight (`mvcc::load`'s few, of about 1 MiB
//!   each) still lend entries from, and waits (holding the leader back through HTTP/2 flow
//!   control) while the engine writes are behind. The key index is built as the history
//!   arrives, as a load does.
//! - The switch is a defragmentation's (`defrag`): under the defrag gate (read) and the
//!   install gate (write), so applies wait and readers see the old state or the new one.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{blocking, snapshot_meta_writes, ApplyingSnapshot, StateMachine};
use crate::mvcc::{MvccError, Staged, StorageError, StoreEngine};
use crate::raft::error::StoreError;
use crate::raft::sm::snapshot_file;
use crate::raft::sm::snapshot_format::{ChunkInput, Reader};
use crate::raft::sm::{background, engine_dir};
use crate::raft::types::SnapshotMeta;
use crate::sync::LockExt;
use crate::wal::WalFs;

/// Chunks received and not yet decoded, at most.
const QUEUED_CHUNKS: usize = 2;

/// How long a discarded generation's engine may stay open before its removal is left to the
/// next start.
const DISCARD_PATIENCE: Duration = Duration::from_secs(60);

/// A received snapshot written whole into a generation of its own, not yet installed.
/// Dropped without being installed, it removes its generation.
pub struct StagedSnapshot {
    meta: SnapshotMeta,
    dir: PathBuf,
    /// `None` once installed.
    engine: Option<(StoreEngine, Staged)>,
    fs: Arc<dyn WalFs>,
    /// The snapshot's size in bytes, as sent.
    bytes: u64,
    /// When its first byte arrived.
    started: Instant,
}

impl std::fmt::Debug for StagedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "StagedSnapshot({:?} in {})",
            self.meta.last_log_id,
            self.dir.display()
        )
    }
}

impl Drop for StagedSnapshot {
    fn drop(&mut self) {
        if let Some((engine, _)) = self.engine.take() {
            drop(engine);
            engine_dir::remove_when_closed(self.fs.clone(), self.dir.clone(), DISCARD_PATIENCE);
        }
    }
}

/// Receives a snapshot's bytes ([`Stager::push`]) and writes its entries into a new engine
/// generation on a thread of its own as they arrive (see the module doc).
pub struct Stager {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    worker: tokio::sync::oneshot::Receiver<Result<StagedSnapshot, StoreError>>,
}

impl Stager {
    /// Hands the next bytes of the snapshot to the writer; waits while it is behind. An error
    /// means the writer stopped: [`Stager::finish`] says why.
    pub async fn push(&mut self, bytes: Bytes) -> Result<(), ()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.tx.send(bytes).await.map_err(|_| ())
    }

    /// The end of the snapshot's bytes: waits for the writer to finish, and returns the staged
    /// snapshot, whole and durable, or why it is not (its generation is then removed).
    pub async fn finish(self) -> Result<StagedSnapshot, StoreError> {
        drop(self.tx);
        self.worker
            .await
            .map_err(|_| StoreError::Io(io::Error::other("the snapshot staging thread panicked")))?
    }
}

/// The chunks received, from the channel [`Stager::push`] sends them on; ends when the
/// sender is dropped.
struct Received(tokio::sync::mpsc::Receiver<Bytes>);

impl Iterator for Received {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        self.0.blocking_recv()
    }
}

/// The received bytes, as one buffered input (see `snapshot_format::ChunkInput`).
type Chunks = ChunkInput<Received>;

impl StateMachine {
    /// Starts receiving the snapshot of `meta` into a new engine generation (see the module
    /// doc).
    pub fn stage_snapshot(&self, meta: &SnapshotMeta) -> Result<Stager, StoreError> {
        self.usable()?;
        let fs = self.shared.fs.clone();
        let dir = engine_dir::prepare_next(fs.as_ref(), &self.db_dir())?;
        // Its files are fsynced whole before the switch to it: its log writes need not
        // wait for the disk one by one.
        let engine = match StoreEngine::open_aside(&dir, self.shared.mvcc.engine().options()) {
            Ok(e) => e,
            Err(e) => {
                engine_dir::remove_when_closed(fs, dir, DISCARD_PATIENCE);
                return Err(e.into());
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUED_CHUNKS);
        let input = ChunkInput::new(Received(rx));
        let meta = meta.clone();
        // At a lower priority: the member's own applies, WAL writes and peer traffic go first
        // (on a machine it shares, the leader's too); a snapshot being received can wait.
        let worker = background::spawn("kvd-stage", move || {
            let started = Instant::now();
            let mut staged = StagedSnapshot {
                meta,
                dir,
                engine: None,
                fs,
                bytes: 0,
                started,
            };
            let (done, bytes) = stage(&staged, &engine, input);
            staged.bytes = bytes;
            match done {
                Ok(done) => {
                    staged.engine = Some((engine, done));
                    Ok(staged)
                }
                Err(e) => {
                    drop(engine);
                    let dir = staged.dir.clone();
                    engine_dir::remove_when_closed(staged.fs.clone(), dir, DISCARD_PATIENCE);
                    Err(e)
                }
            }
        })
        .map_err(StoreError::Io)?;
        Ok(Stager { tx, worker })
    }

    /// Installs a staged snapshot of `meta`: switches durably to its generation and moves the
    /// store onto it (see the module doc).
    pub(super) async fn install_staged(
        &self,
        meta: &SnapshotMeta,
        mut staged: StagedSnapshot,
    ) -> Result<(), StoreError> {
        if &staged.meta != meta {
            return Err(StoreError::Snapshot {
                file: staged.dir.clone(),
                reason: format!(
                    "staged as the snapshot of {:?}, installed as that of {meta:?}",
                    staged.meta
                ),
            });
        }
        let _defrag = self.shared.defrag_gate.read().await;
        self.usable()?;
        let _no_reads = self.shared.install_gate.write().await;
        blocking(|| {
            let _io = self.shared.snap_io.lock_or_recover();
            let _applying = ApplyingSnapshot::start();
            let t0 = Instant::now();
            let (engine, done) = staged.engine.take().expect("installed once");
            let to = staged.dir.clone();
            let fs = self.shared.fs.clone();
            let mut switch_failed = None;
            let res = self.shared.mvcc.install_staged(&engine, done, || {
                engine_dir::switch_to(fs.as_ref(), &to).map_err(|e| {
                    switch_failed = Some(e);
                    MvccError::Storage(StorageError::new(
                        "switching to the received snapshot's engine failed",
                    ))
                })
            });
            drop(engine);
            let old = match (res, switch_failed) {
                (Ok(old), _) => old,
                (Err(_), Some(e @ StoreError::SwitchUncertain { .. })) => {
                    // Both generations stay; the next start keeps the one the pointer names.
                    tracing::error!(error = %e, "snapshot install: the engine switch is uncertain; this member stops writing and must restart");
                    self.refuse_writes(&e);
                    return Err(e);
                }
                (Err(_), Some(e)) => {
                    engine_dir::remove_when_closed(fs, to, DISCARD_PATIENCE);
                    return Err(e);
                }
                (Err(e), None) => {
                    // The switch is made: the store is on the new engine, whose indexes failed
                    // to load. Stop writing, as after an uncertain switch; a restart rebuilds
                    // them from the engine.
                    let e = StoreError::from(e);
                    self.refuse_writes(&StoreError::SwitchUncertain {
                        dir: to,
                        source: Arc::new(io::Error::other(e.to_string())),
                    });
                    return Err(e);
                }
            };
            let from = std::mem::replace(&mut *self.shared.db_dir.lock_or_recover(), to);
            drop(old);
            engine_dir::remove_when_closed(fs.clone(), from, DISCARD_PATIENCE);
            self.loaded(meta)?;
            snapshot_file::remove_through(fs.as_ref(), &self.shared.snap_dir, meta)?;
            tracing::info!(
                index = meta.last_log_id.map_or(0, |l| l.index),
                bytes = staged.bytes,
                received_ms = (t0 - staged.started).as_millis() as u64,
                switch_ms = t0.elapsed().as_millis() as u64,
                "installed snapshot"
            );
            Ok(())
        })
    }
}

/// Decodes `input` and writes its entries into `engine`, then makes it durable. Returns the
/// staging, or why the snapshot was refused, with the bytes read.
fn stage(
    staged: &StagedSnapshot,
    engine: &StoreEngine,
    mut input: Chunks,
) -> (Result<Staged, StoreError>, u64) {
    let res = (|| {
        let name = staged.dir.join("received snapshot");
        let (found, reader) = Reader::new(&mut input, &name)?;
        if found != staged.meta {
            return Err(StoreError::Snapshot {
                file: name,
                reason: format!(
                    "holds the snapshot of {found:?}, sent as that of {:?}",
                    staged.meta
                ),
            });
        }
        let done = crate::mvcc::stage(engine, reader.lent(), &snapshot_meta_writes(&staged.meta))?;
        let synced = crate::metrics::timed(&crate::metrics::SNAP_DB_FSYNC_SECONDS);
        synced(engine_dir::sync_engine(staged.fs.as_ref(), &staged.dir))?;
        // Installed, it is the store's engine: its writes wait for the disk as the store's do.
        engine.end_write_back();
        Ok(done)
    })();
    // Whatever is left unread (a refused snapshot) is drained so the sender is not stuck.
    if res.is_err() {
        input.chunks_mut().0.close();
    }
    (res, input.consumed())
}
