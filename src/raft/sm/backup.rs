//! The state machine's side of backups and restores: a consistent image with the Raft
//! position it belongs to, and the snapshot file a restored member starts from.
//!
//! # Invariants
//! - A [`BackupImage`]'s applied log id and membership are those stored with the image's
//!   data: both come from the meta tree copied under the MVCC apply lock, never from a
//!   separate read that an apply could move past.
//! - A restored member holds [`write_restored`]'s snapshot file and its state machine loaded
//!   from it; on its first start openraft finds applied state beyond its empty log and purges
//!   the log up to the snapshot, so a member added later receives the data by snapshot, never
//!   by replaying a log that lacks it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use openraft::type_config::alias::LeaderIdOf;
use openraft::vote::RaftLeaderIdExt;

use crate::mvcc::Image;
use crate::raft::codec::decode;
use crate::raft::error::StoreError;
use crate::raft::sm::snapshot_file;
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

/// Writes the snapshot a member of a restored cluster starts from into `sm_dir` (the state
/// machine directory, which must not hold a snapshot yet): `entries` (MVCC trees, as
/// `mvcc::entries_from_etcd` builds them) under a membership of `members` as voters.
/// The entries are written as they come (a restore streams them from the backup file); the
/// first error among them stops the write and nothing is published.
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
    let snap_dir = sm_dir.join("snap");
    // The engine is sled's, on the real file system: so is everything beside it.
    let fs: Arc<dyn WalFs> = Arc::new(RealFs);
    crate::wal::create_dir_durable(fs.as_ref(), sm_dir)?;
    crate::wal::create_dir_durable(fs.as_ref(), &snap_dir)?;
    if let Some((_, existing)) = snapshot_file::latest(fs.as_ref(), &snap_dir)? {
        return Err(StoreError::Snapshot {
            file: existing,
            reason: "a snapshot already exists: restore into an empty data dir".into(),
        });
    }
    let checked = entries.into_iter().map(|e| -> Result<_, StoreError> {
        let e = e.map_err(StoreError::from)?;
        crate::mvcc::check_entries([&e])?;
        Ok(e)
    });
    snapshot_file::write::<StoreError>(&fs, &snap_dir, &meta, checked)?.publish()?;
    // Loading it now, rather than at the member's first start, makes that start an ordinary
    // one, and proves the snapshot loads before the data dir is handed over.
    let sm = StateMachine::open(sm_dir)?;
    sm.store().flush()?;
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

    /// A restore crashed at every step of its load (the engine flushed up to there) reopens
    /// with the whole backup; and the restore removes its snapshot file only after the engine
    /// was synced (sled's flush leaves files and directory entries unsynced).
    #[test]
    fn a_restore_is_durable_before_its_snapshot_file_is_removed() {
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
            if res.is_ok() {
                let steps = engine_dir::steps(d.path());
                let removed = steps
                    .iter()
                    .position(|s| *s == "snapshot files removed")
                    .unwrap_or_else(|| panic!("the snapshot file stays: {steps:?}"));
                assert!(
                    steps[..removed].contains(&"engine synced"),
                    "removed before the engine was synced: {steps:?}"
                );
            }
            let sm = reopen(d.path());
            assert_eq!(keys(&sm), 200, "crash at step {n}");
            assert_eq!(sm.last_applied().unwrap(), Some(restored_log_id()));
            assert!(snapshot_file::latest(&RealFs, &d.path().join("snap"))
                .unwrap()
                .is_none());
            if res.is_ok() {
                break;
            }
            crashes += 1;
        }
        assert!(crashes >= 2, "only {crashes} crash points");
    }
}
