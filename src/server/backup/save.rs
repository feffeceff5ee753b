//! Writing a member's state as an etcd backup database (the bytes `Maintenance.Snapshot`
//! streams, before the sha256 trailer).

use std::path::Path;

use crate::auth::etcd_buckets;
use crate::auth::META_AUTH_PREFIX;
use crate::bbolt::Writer;
use crate::mvcc::etcd::format::{compact_mark, KEY_BUCKET, LEASE_BUCKET, META_BUCKET};
use crate::raft::RaftNode;

use super::BackupError;

/// What a saved database holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    /// Length of the database file in bytes.
    pub len: u64,
    /// The store revision of the image.
    pub revision: i64,
    /// The last applied log index the image includes (etcd's `consistent_index`).
    pub applied_index: u64,
}

/// bbolt's transaction id of a saved file: any positive value is valid; a fresh etcd
/// database's first write transaction has this one.
const TXID: u64 = 2;

/// Writes a consistent image of `node`'s applied state as an etcd database at `path` (created or truncated,
/// fsynced). Blocking: call it off the async runtime.
pub fn save(node: &RaftNode, path: &Path) -> Result<Saved, BackupError> {
    let img = node.backup_image()?;
    let applied = img.applied;
    let membership = img.membership.membership().clone();
    let image = img.image;
    let revision = image.revision();
    let compacted = image.compacted()?;
    let leases = image.etcd_leases()?;
    let auth = etcd_buckets::to_etcd(image.meta_prefixed(META_AUTH_PREFIX.as_bytes()));

    let mut w = Writer::create(path)?;
    // Buckets in ascending name order, as bbolt keeps them: `auth*` sort before `key`.
    for (name, pairs) in auth.buckets() {
        w.bucket(name)?;
        for (k, v) in pairs {
            w.put(k, v)?;
        }
    }
    w.bucket(KEY_BUCKET)?;
    for item in image.etcd_history() {
        let (k, v) = item?;
        w.put(&k, &v)?;
    }
    w.bucket(LEASE_BUCKET)?;
    for (k, v) in &leases {
        w.put(k, v)?;
    }
    // etcd's own members (JSON as its backend stores them); a restore replaces them.
    w.bucket(b"members")?;
    let learners: std::collections::BTreeSet<u64> = membership.learner_ids().collect();
    for (id, member) in membership.nodes() {
        let mut m = serde_json::json!({ "id": id, "peerURLs": member.peer_urls });
        if learners.contains(id) {
            m["isLearner"] = true.into();
        }
        if let Ok(Some(a)) = node.member_attrs(*id) {
            if !a.name.is_empty() {
                m["name"] = a.name.into();
            }
            if !a.client_urls.is_empty() {
                m["clientURLs"] = a.client_urls.into();
            }
        }
        let key = format!("{id:x}");
        w.put(key.as_bytes(), m.to_string().as_bytes())?;
    }
    w.bucket(b"members_removed")?;
    w.bucket(META_BUCKET)?;
    let index = applied.map_or(0, |l| l.index);
    let term = applied.map_or(0, |l| l.leader_id.term);
    w.put(b"consistent_index", &index.to_be_bytes())?;
    if compacted > 0 {
        // Scheduled and not marked finished: etcd compacts again when it opens the file,
        // removing any compacted record kvd had not deleted yet (see `Image::etcd_history`).
        w.put(b"scheduledCompactRev", &compact_mark(compacted))?;
    }
    w.put(b"term", &term.to_be_bytes())?;
    let len = w.finish(TXID)?;
    Ok(Saved {
        len,
        revision,
        applied_index: index,
    })
}
