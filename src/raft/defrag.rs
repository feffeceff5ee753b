//! Defragmenting the state machine's engine (etcd's `Maintenance.Defragment` on this member):
//! a new engine generation is written aside from the current one, switched to durably, and
//! the old one removed once closed (see `engine_dir` for the directories and the switch,
//! `mvcc::defrag` for the copy).
//!
//! # Invariants
//! - While a defragmentation runs, this member applies nothing: every apply (and snapshot
//!   build or install) first takes `defrag_gate` for reading, which the defragmentation holds
//!   for writing, awaited, so the waiting state-machine task blocks no runtime thread. Reads
//!   go on. Other members are not involved.
//! - A crash at any point leaves the old generation or the new one current, each whole; and
//!   the state machine is rebuilt from the log above whichever it is, as after any restart.
//! - One defragmentation at a time (the gate).
//! - A defragmentation waits, without the gate, until no snapshot image is held (a send to a
//!   follower in progress), so applies do not pause for the length of a send.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::StateMachine;
use crate::mvcc::{MvccError, StoreEngine};
use crate::raft::engine_dir;
use crate::raft::error::StoreError;

/// How long the old generation may stay open (scans in flight) before its removal is left to
/// the next start.
const OLD_ENGINE_PATIENCE: Duration = Duration::from_secs(60);

/// How often a defragmentation looks again whether a snapshot send has ended.
const IMAGE_POLL: Duration = Duration::from_millis(50);

/// What a defragmentation did.
#[derive(Debug, Clone)]
pub struct Defragmented {
    pub from: PathBuf,
    pub to: PathBuf,
    pub records: u64,
    pub took: Duration,
}

impl StateMachine {
    /// The directory of the current engine generation.
    pub fn db_dir(&self) -> PathBuf {
        self.shared
            .db_dir
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Rewrites the engine into a new generation with only its live records, pausing this
    /// member's applies meanwhile (see the module doc).
    ///
    /// Runs to the end even if the caller stops waiting: the pause is released by the thread
    /// that copies, when it is done.
    pub async fn defragment(&self) -> Result<Defragmented, StoreError> {
        // A snapshot being sent holds an image until the send ends (`snapshot_data`); the copy
        // waits for it, and must not hold the gate (pausing applies) meanwhile. No image can
        // be taken while the gate is held: taking one reads the gate.
        let no_applies = loop {
            let gate = self.shared.defrag_gate.clone().write_owned().await;
            if !self.shared.mvcc.images_held() {
                break gate;
            }
            drop(gate);
            tokio::time::sleep(IMAGE_POLL).await;
        };
        let sm = self.clone();
        tokio::task::spawn_blocking(move || {
            let res = sm.defragment_now();
            drop(no_applies);
            res
        })
        .await
        .map_err(|e| StoreError::Io(std::io::Error::other(e.to_string())))?
    }

    fn defragment_now(&self) -> Result<Defragmented, StoreError> {
        let started = Instant::now();
        let from = self.db_dir();
        let to = engine_dir::prepare_next(&from)?;
        let fresh = StoreEngine::open_with(&to, self.shared.mvcc.engine().options())?;
        let res = self
            .shared
            .mvcc
            .defragment(&fresh, || engine_dir::switch_to(&to).map_err(io_to_mvcc));
        drop(fresh);
        let (old, copied) = match res {
            Ok(r) => r,
            Err(e) => {
                // The old generation stays current; the new one is a leftover.
                engine_dir::remove_when_closed(to, OLD_ENGINE_PATIENCE);
                return Err(e.into());
            }
        };
        *self.shared.db_dir.lock().unwrap_or_else(|e| e.into_inner()) = to.clone();
        drop(old);
        engine_dir::remove_when_closed(from.clone(), OLD_ENGINE_PATIENCE);
        Ok(Defragmented {
            from,
            to,
            records: copied.records,
            took: started.elapsed(),
        })
    }
}

fn io_to_mvcc(e: std::io::Error) -> MvccError {
    MvccError::Storage(format!("switching to the defragmented engine: {e}"))
}
