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

use openraft::type_config::alias::LeaderIdOf;
use openraft::vote::RaftLeaderIdExt;

use super::error::StoreError;
use super::log_store::decode;
use super::snapshot_file;
use super::state_machine::{StateMachine, META_LAST_APPLIED, META_MEMBERSHIP};
use super::types::{LogId, Member, Membership, NodeId, SnapshotMeta, StoredMembership, TypeConfig};
use crate::mvcc::Image;

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
    let membership =
        Membership::new(vec![voters], members.clone()).map_err(|e| StoreError::Snapshot {
            file: sm_dir.to_path_buf(),
            reason: format!("restored membership: {e}"),
        })?;
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
    };
    let snap_dir = sm_dir.join("snap");
    crate::wal::create_dir_durable(&crate::wal::RealFs, sm_dir)?;
    crate::wal::create_dir_durable(&crate::wal::RealFs, &snap_dir)?;
    if let Some((_, existing)) = snapshot_file::latest(&snap_dir)? {
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
    snapshot_file::write::<StoreError>(&snap_dir, &meta, checked)?.publish()?;
    // Loading it now, rather than at the member's first start, makes that start an ordinary
    // one, and proves the snapshot loads before the data dir is handed over.
    let sm = StateMachine::open(sm_dir)?;
    sm.store().flush()?;
    Ok(())
}
