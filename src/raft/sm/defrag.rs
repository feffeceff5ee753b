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
//! - A switch whose outcome on disk is uncertain (the pointer's rename or the fsync after it
//!   failed) removes neither generation and leaves the state machine refusing every apply,
//!   snapshot and defragmentation: writes to the old engine could be made durable there
//!   (and the log purged below them) while the pointer names the new one. The member exits
//!   on the refused apply (docs/decisions/0014-exit-on-storage-error.md), and its next start
//!   keeps the generation the pointer names.
//! - One defragmentation at a time (the gate).
//! - A defragmentation waits, without the gate, until no snapshot image is held (a send to a
//!   follower in progress), so applies do not pause for the length of a send.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::StateMachine;
use crate::mvcc::{MvccError, StorageError, StoreEngine};
use crate::raft::error::StoreError;
use crate::raft::sm::engine_dir;
use crate::sync::LockExt;

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
        self.shared.db_dir.lock_or_recover().clone()
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
        self.usable()?;
        let started = Instant::now();
        let from = self.db_dir();
        let to = engine_dir::prepare_next(self.shared.fs.as_ref(), &from)?;
        // Its files are fsynced whole by the switch: the copy's log writes need not wait for
        // the disk one by one.
        let fresh = StoreEngine::open_aside(&to, self.shared.mvcc.engine().options())?;
        let mut switch_failed = None;
        let res = self.shared.mvcc.defragment(&fresh, || {
            // Switched to, it is the store's engine: its writes wait for the disk again.
            fresh.end_write_back();
            engine_dir::switch_to(self.shared.fs.as_ref(), &to).map_err(|e| {
                // The cause goes to the caller through `switch_failed`, not through the store.
                let m = MvccError::Storage(StorageError::new(
                    "switching to the defragmented engine failed",
                ));
                switch_failed = Some(e);
                m
            })
        });
        drop(fresh);
        let (old, copied) = match (res, switch_failed) {
            (Ok(r), _) => r,
            (Err(_), Some(e @ StoreError::SwitchUncertain { .. })) => {
                // Both generations stay; the next start keeps the one the pointer names.
                tracing::error!(error = %e, "defragmentation: the engine switch is uncertain; this member stops writing and must restart");
                self.refuse_writes(&e);
                return Err(e);
            }
            (Err(e), _) => {
                // The old generation stays current; the new one is a leftover.
                engine_dir::remove_when_closed(self.shared.fs.clone(), to, OLD_ENGINE_PATIENCE);
                return Err(e.into());
            }
        };
        *self.shared.db_dir.lock_or_recover() = to.clone();
        drop(old);
        engine_dir::remove_when_closed(self.shared.fs.clone(), from.clone(), OLD_ENGINE_PATIENCE);
        Ok(Defragmented {
            from,
            to,
            records: copied.records,
            took: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use openraft::storage::{EntryResponder, RaftStateMachine};

    use super::*;
    use crate::mvcc::WriteRequest;
    use crate::proto::etcdserverpb::{PutRequest, RangeRequest};
    use crate::raft::codec::encode;
    use crate::raft::sm::state_machine::META_LAST_APPLIED;
    use crate::raft::types::{LogId, TypeConfig};

    /// `keys` puts, recorded as applied up to log index `keys`, flushed.
    fn fill(sm: &StateMachine, keys: usize) {
        let reqs: Vec<_> = (0..keys)
            .map(|i| {
                WriteRequest::Put(PutRequest {
                    key: format!("k{i:05}").into_bytes(),
                    value: format!("v{i}").repeat(50).into_bytes(),
                    ..Default::default()
                })
            })
            .collect();
        let applied: LogId = openraft::testing::log_id::<TypeConfig>(2, 1, keys as u64);
        let meta = vec![(META_LAST_APPLIED.to_vec(), Some(encode(&Some(applied))))];
        for r in sm.store().apply(&reqs, &meta).unwrap() {
            r.unwrap();
        }
        sm.store().flush().unwrap();
    }

    /// Every key and value, and the last applied log id.
    type Observed = (Vec<(Vec<u8>, Vec<u8>)>, Option<LogId>);

    fn observe(sm: &StateMachine) -> Observed {
        let all = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        };
        let kvs = sm.store().range(&all).unwrap().kvs;
        (
            kvs.into_iter().map(|kv| (kv.key, kv.value)).collect(),
            sm.last_applied().unwrap(),
        )
    }

    /// The fsync of `sm/` after the pointer's rename fails: the pointer may name the new
    /// generation, so neither is removed, the state machine refuses writes, and a restart
    /// finds every record in the generation the pointer names.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_uncertain_switch_removes_no_generation_and_a_restart_keeps_every_record() {
        let d = tempfile::tempdir().unwrap();
        let mut sm = StateMachine::open(d.path()).unwrap();
        fill(&sm, 300);
        let want = observe(&sm);
        assert_eq!(want.0.len(), 300);

        engine_dir::fail_sync_after_rename(d.path());
        let err = sm.defragment().await.unwrap_err();
        assert!(matches!(err, StoreError::SwitchUncertain { .. }), "{err}");

        // No more writes to an engine that may not be the current one.
        let nothing =
            futures::stream::iter(Vec::<Result<EntryResponder<TypeConfig>, io::Error>>::new());
        assert!(sm.apply(nothing).await.is_err());
        assert!(sm.defragment().await.is_err());
        // Neither generation is removed, even once the new one's engine has closed.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(d.path().join("db").is_dir());
        assert!(d.path().join("db.1").is_dir());

        drop(sm);
        let sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
        assert_eq!(sm.db_dir(), d.path().join("db.1"), "the pointer names it");
        let got = observe(&sm);
        assert!(
            got == want,
            "after the restart: {} records, applied {:?}",
            got.0.len(),
            got.1
        );
        assert!(!d.path().join("db").exists(), "removed at the start");
    }
}
