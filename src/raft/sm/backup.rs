//! The state machine's side of backups and restores: a consistent image with the Raft
//! position it belongs to, and the snapshot file a restored member starts from.
//!
//! # Invariants
//! - A [`BackupImage`]'s applied log id and membership are those stored with the image's
//!   data: both come from the meta tree copied under the MVCC apply lock, never from a
//!   separate read that an apply could move past.
//! - A restored member holds [`write_restored`]'s state machine, written straight into its
//!   engine (no snapshot file), synced before it returns; on its first start openraft finds
//!   applied state beyond its empty log and purges the log up to it, so a member added later
//!   receives the data by snapshot, never by replaying a log that lacks it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use openraft::type_config::alias::LeaderIdOf;
use openraft::vote::RaftLeaderIdExt;

use crate::mvcc::engine::Tree;
use crate::mvcc::Image;
use crate::mvcc::{Engine, StoreEngine};
use crate::raft::codec::{decode, encode};
use crate::raft::error::StoreError;
use crate::raft::sm::engine_dir;
use crate::raft::sm::state_machine::{StateMachine, META_LAST_APPLIED, META_MEMBERSHIP};
use crate::raft::types::{
    LogId, Member, Membership, NodeId, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::wal::{RealFs, WalFs};

/// The index of a restored cluster's snapshot: every member starts from the same log
/// position, with the log below it purged.
pub const RESTORED_INDEX: u64 = 1;

/// A point-in-time image of the state machine for a backup.
pub struct BackupImage {
    /// The last log entry the image includes.
    pub applied: Option<LogId>,
    pub membership: StoredMembership,
    pub image: Image,
}

impl StateMachine {
    /// Takes a [`BackupImage`]. Cheap (see `MvccStore::image`); the history is read when the
    /// image is iterated, and compactions wait until it is.
    pub fn backup_image(&self) -> Result<BackupImage, StoreError> {
        let image = self.store().image()?;
        let applied = match image.meta(META_LAST_APPLIED) {
            Some(b) => decode("last applied", b)?,
            None => None,
        };
        let membership = match image.meta(META_MEMBERSHIP) {
            Some(b) => decode("membership", b)?,
            None => StoredMembership::default(),
        };
        Ok(BackupImage {
            applied,
            membership,
            image,
        })
    }
}

/// The log id of a restored cluster's snapshot. Term 1 of a leader id no member has: the
/// members' first election is at a term above it.
pub fn restored_log_id() -> LogId {
    LogId::new(
        LeaderIdOf::<TypeConfig>::new_committed(1, 0),
        RESTORED_INDEX,
    )
}

/// Writes the state a member of a restored cluster starts from into `sm_dir` (the state
/// machine directory, whose engine must be empty): `entries` (MVCC trees, as
/// `mvcc::entries_from_etcd` builds them) under a membership of `members` as voters.
/// The entries are written as they come (a restore streams them from the backup file); the
/// first error among them stops the write, and the caller discards the directory.
pub fn write_restored<E>(
    sm_dir: &Path,
    members: &BTreeMap<NodeId, Member>,
    entries: impl IntoIterator<Item = Result<(String, Vec<u8>, Vec<u8>), E>>,
) -> Result<(), StoreError>
where
    StoreError: From<E>,
{
    let log_id = restored_log_id();
    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    let membership = Membership::new(vec![voters], members.clone()).map_err(|source| {
        StoreError::Membership {
            what: "the restored membership",
            source,
        }
    })?;
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
    };
    // The engine is sled's, on the real file system: so is everything beside it.
    let fs: Arc<dyn WalFs> = Arc::new(RealFs);
    crate::wal::create_dir_durable(fs.as_ref(), sm_dir)?;
    let db = engine_dir::open_current(fs.as_ref(), sm_dir)?;
    // Its files are fsynced whole below, before anything relies on them: the restore's log
    // writes need not wait for the disk one by one. A member opening it waits again.
    let engine = StoreEngine::open_aside(&db, Default::default())?;
    if Tree::ALL.iter().any(|t| engine.iter(*t).next().is_some()) {
        return Err(StoreError::Snapshot {
            file: db,
            reason: "a state machine already exists: restore into an empty data dir".into(),
        });
    }
    let checked = entries.into_iter().map(|e| -> Result<_, StoreError> {
        let e = e.map_err(StoreError::from)?;
        crate::mvcc::check_entries([&e])?;
        Ok(e)
    });
    // Straight into the engine, as a received snapshot is staged: a restore that fails
    // midway leaves a partial engine, which its caller discards with the unfinished data dir.
    let staged = crate::mvcc::stage::<_, _, StoreError>(
        &engine,
        checked,
        &[
            (META_LAST_APPLIED.to_vec(), Some(encode(&meta.last_log_id))),
            (
                META_MEMBERSHIP.to_vec(),
                Some(encode(&meta.last_membership)),
            ),
        ],
    )?;
    drop(engine);
    engine_dir::sync_engine(fs.as_ref(), &db)?;
    // Every history record decoded, in order, as the key index was built from it: the member
    // opens. Otherwise opening it now (which derives the index from the engine) proves it
    // before the data dir is handed over.
    if !staged.indexed() {
        drop(StateMachine::open(sm_dir)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::failpoint::crash_after;
    use crate::mvcc::WriteRequest;
    use crate::proto::etcdserverpb::{PutRequest, RangeRequest};
    use crate::raft::sm::engine_dir;
    use crate::raft::sm::snapshot_file;

    /// The trees of a store holding `keys` puts, as a restore reads them from a backup.
    fn source(keys: usize) -> Vec<(String, Vec<u8>, Vec<u8>)> {
        let d = tempfile::tempdir().unwrap();
        let sm = StateMachine::open(d.path()).unwrap();
        let reqs: Vec<_> = (0..keys)
            .map(|i| {
                WriteRequest::Put(PutRequest {
                    key: format!("k{i:05}").into_bytes(),
                    value: format!("v{i}").into_bytes(),
                    ..Default::default()
                })
            })
            .collect();
        for r in sm.store().apply(&reqs, &[]).unwrap() {
            r.unwrap();
        }
        let entries = sm.store().dump().map(Result::unwrap).collect();
        entries
    }

    fn reopen(dir: &Path) -> StateMachine {
        // The engine a failed open dropped may hold its lock a moment longer.
        for _ in 0..300 {
            if let Ok(sm) = StateMachine::open(dir) {
                return sm;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        StateMachine::open(dir).unwrap()
    }

    fn keys(sm: &StateMachine) -> usize {
        let all = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        };
        sm.store().range(&all).unwrap().kvs.len()
    }

    /// A restore writes the state machine straight into its engine and syncs it before it
    /// returns (sled's flush leaves files and directory entries unsynced); it leaves no
    /// snapshot file, and the member opens with the whole backup. A restore that fails
    /// midway (crashed at any step) leaves a directory its caller discards; a restore into an
    /// engine that holds anything is refused.
    #[test]
    fn a_restore_is_written_into_the_engine_and_synced() {
        let entries = source(200);
        let members = BTreeMap::from([(
            1,
            Member {
                peer_urls: vec!["http://127.0.0.1:2380".into()],
            },
        )]);
        let mut crashes = 0;
        for n in 1..100 {
            let d = tempfile::tempdir().unwrap();
            crash_after(Some(n));
            let res =
                write_restored::<StoreError>(d.path(), &members, entries.iter().cloned().map(Ok));
            crash_after(None);
            if res.is_err() {
                crashes += 1;
                continue;
            }
            let steps = engine_dir::steps(d.path());
            assert!(steps.contains(&"engine synced"), "{steps:?}");
            let sm = reopen(d.path());
            assert_eq!(keys(&sm), 200);
            assert_eq!(sm.last_applied().unwrap(), Some(restored_log_id()));
            assert!(snapshot_file::latest(&RealFs, &d.path().join("snap"))
                .unwrap()
                .is_none());
            drop(sm);
            let again =
                write_restored::<StoreError>(d.path(), &members, entries.iter().cloned().map(Ok));
            assert!(again.is_err(), "restored over a state machine");
            assert_eq!(keys(&reopen(d.path())), 200);
            break;
        }
        assert!(crashes >= 2, "only {crashes} crash points");
    }
}
