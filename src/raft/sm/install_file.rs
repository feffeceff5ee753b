//! Installing a snapshot that was not staged: a snapshot file, or another member's live image
//! (openraft's storage suite hands those over), through a file in the snapshot directory, as
//! releases before the staged install (`staging`) received snapshots. Tests only: kvd sends
//! live snapshots and receives them staged; the tests install files this way to exercise the
//! load path a file left by an older release takes, and its crash safety.

use std::io;

use super::{blocking, ApplyingSnapshot, StateMachine};
use crate::mvcc::failpoint::crash_point;
use crate::raft::error::StoreError;
use crate::raft::sm::snapshot_data::SnapshotData;
use crate::raft::sm::{snapshot_file, snapshot_file_install};
use crate::raft::types::SnapshotMeta;
use crate::sync::LockExt;

impl StateMachine {
    /// Installs `snapshot` (of `meta`) through a snapshot file: checked, renamed into place,
    /// loaded into the engine, made durable, then removed.
    pub(super) async fn install_unstaged(
        &self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        // Checked whole before it is renamed into place: as the newest snapshot, a file that
        // cannot be loaded would fail every restart. A received file was read through when it
        // arrived and is not read again; any other is read here, before the gates are taken,
        // so reads and defragmentation go on meanwhile.
        let t0 = std::time::Instant::now();
        let dir = self.shared.snap_dir.clone();
        let fs = self.shared.fs.clone();
        let checked_meta = meta.clone();
        let checked = tokio::task::spawn_blocking(move || match snapshot {
            SnapshotData::File(file) => {
                snapshot_file_install::adopt(&fs, file, &dir, &checked_meta)
            }
            // Another member's image (openraft's storage suite installs these).
            SnapshotData::Live(live) => live.write_file(&fs, &dir),
            SnapshotData::Staged(_) => unreachable!("installed by `install_snapshot`"),
        })
        .await
        .map_err(io::Error::other)??;
        let (t1, bytes) = (std::time::Instant::now(), checked.bytes);
        let _defrag = self.shared.defrag_gate.read().await;
        self.usable()?;
        // Readers wait for the end of the install rather than see a half-loaded store.
        let _no_reads = self.shared.install_gate.write().await;
        // Writing a whole key space into the engine takes seconds; the worker's other tasks
        // (peer and client connections, Raft's core) must not wait for it.
        blocking(|| -> Result<(), io::Error> {
            // A build finishing now writes and removes snapshot files too.
            let _io = self.shared.snap_io.lock_or_recover();
            let _applying = ApplyingSnapshot::start();
            let path = checked.publish()?;
            crash_point(self.shared.mvcc.engine()).map_err(StoreError::from)?;
            let (_, entries) = snapshot_file::entries(&path)?;
            self.load_snapshot(meta, entries)?;
            // Once the engine is durable, the file is no longer needed for a restart.
            self.make_engine_durable()?;
            crash_point(self.shared.mvcc.engine()).map_err(StoreError::from)?;
            snapshot_file::remove_through(self.shared.fs.as_ref(), &self.shared.snap_dir, meta)?;
            tracing::info!(
                index = meta.last_log_id.map_or(0, |l| l.index),
                bytes,
                check_ms = (t1 - t0).as_millis() as u64,
                load_ms = t1.elapsed().as_millis() as u64,
                "installed snapshot"
            );
            Ok(())
        })
    }
}
