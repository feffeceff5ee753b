//! The cluster's log format: what the members apply, as the prober hears it, and the leader's
//! proposal that raises the replicated cluster format once every member applies a newer one.
//!
//! # Invariants
//! - The cluster format is replicated state (a `ClusterFormat` entry, applied by every member
//!   into its meta tree), so every member gates proposals on the same value for the same log
//!   prefix. It only rises: nothing proposes a lower one.
//! - The leader raises it only when it has heard, from every voter and learner of the current
//!   configuration, the format it applies (builds before versions answer none: format 1), and
//!   only to the oldest of them. A member that cannot be reached keeps it where it is.
//! - A `ClusterFormat` entry is marked with the format it announces, so a member that meets
//!   one it cannot reach (an older kvd that joined late) stops applying there.
//! - Builds before 0.2.0 apply a `ClusterFormat` entry as nothing, so a member upgraded from
//!   one holds an older cluster format than the others. The leader therefore announces the
//!   cluster format again (same value) whenever a member's format changes or is first heard
//!   in its term; the apply keeps the larger value, so a stale member catches up and no
//!   member's value ever goes down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver;

use crate::proto::etcdserverpb::HashKvRequest;
use crate::proto::kvdpb::{internal_request, ClusterFormat, InternalRequest};
use crate::raft::log_format::{self, LOG_FORMAT, OLDEST_LOG_FORMAT, RELEASE_0_1_FORMAT};
use crate::raft::node::RaftNode;
use crate::raft::types::{Member, NodeId};
use crate::sync::LockExt;

/// How often the format of a peer that publishes none is found out again (it may have been
/// replaced by another build meanwhile).
const RECLASSIFY: Duration = Duration::from_secs(10);

/// The format of a peer that publishes none: release 0.1.0 serves the peer `HashKV` RPC
/// (asked here for a future revision, which it refuses at once), earlier builds do not.
/// `None` if the peer could not tell.
pub async fn classify_unversioned(node: &RaftNode, peer: &Member) -> Option<u32> {
    let mut c = node.channels.peer(peer).ok()?;
    let call = c.hash_kv(HashKvRequest { revision: i64::MAX });
    match tokio::time::timeout(Duration::from_secs(1), call).await {
        Ok(Ok(_)) => Some(RELEASE_0_1_FORMAT),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Some(OLDEST_LOG_FORMAT),
        Ok(Err(s)) if s.code() == tonic::Code::OutOfRange => Some(RELEASE_0_1_FORMAT),
        _ => None,
    }
}

/// The log format each peer applies, from its last probe answer (builds before versions
/// answer none, and are told apart by [`classify_unversioned`]).
#[derive(Clone, Default)]
pub struct PeerFormats {
    seen: Arc<Mutex<HashMap<NodeId, (u32, Instant)>>>,
    /// A raise is being proposed: one at a time.
    raising: Arc<AtomicBool>,
    /// A member's format changed (or was first heard) since the last announcement.
    changed: Arc<AtomicBool>,
}

impl PeerFormats {
    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, (u32, Instant)>> {
        // Plain values: a panic while holding the lock leaves nothing half-changed.
        self.seen.lock_or_recover()
    }

    pub fn heard(&self, id: NodeId, format: u32) {
        let before = self.seen().insert(id, (format, Instant::now()));
        if before.map(|(f, _)| f) != Some(format) {
            self.changed.store(true, Ordering::SeqCst);
        }
    }

    /// The format `id` applies, if it answered a probe since this member started.
    pub fn of(&self, id: NodeId) -> Option<u32> {
        self.seen().get(&id).map(|(f, _)| *f)
    }

    /// Whether the format of a peer that publishes none is due to be found out (again).
    pub fn unversioned_due(&self, id: NodeId) -> bool {
        self.seen()
            .get(&id)
            .is_none_or(|(_, at)| at.elapsed() >= RECLASSIFY)
    }

    /// The members of the current configuration that apply an older format than `format`,
    /// by name (or id), for the message that asks to upgrade them.
    pub fn behind(&self, node: &RaftNode, format: u32) -> Vec<String> {
        members(node)
            .into_iter()
            .filter(|id| {
                *id != node.id
                    && self
                        .of(*id)
                        .is_none_or(|f| f.max(log_format::OLDEST_LOG_FORMAT) < format)
            })
            .map(|id| match node.sm.member_attrs(id) {
                Ok(Some(a)) if !a.name.is_empty() => a.name,
                _ => format!("{id:x}"),
            })
            .collect()
    }

    /// On the leader, proposes the oldest format of the current members as the cluster's
    /// when that is newer than the cluster's now, or announces it again when a member's
    /// format changed (in the background, one at a time).
    pub fn raise_if_due(&self, node: &RaftNode) {
        let m = node.raft.metrics();
        if m.borrow_watched().current_leader != Some(node.id) {
            return;
        }
        let target = log_format::cluster(members(node).into_iter().map(|id| {
            if id == node.id {
                Some(LOG_FORMAT)
            } else {
                self.of(id)
            }
        }));
        let Some(target) = target else { return };
        let current = node.sm.cluster_format();
        let due = target > current || (target == current && self.changed.load(Ordering::SeqCst));
        if !due || self.raising.swap(true, Ordering::SeqCst) {
            return;
        }
        self.changed.store(false, Ordering::SeqCst);
        let (node, raising, changed) = (node.clone(), self.raising.clone(), self.changed.clone());
        tokio::spawn(async move {
            let mut req = InternalRequest {
                request: Some(internal_request::Request::ClusterFormat(ClusterFormat {
                    format: target,
                })),
                ..Default::default()
            };
            log_format::mark(&mut req);
            match node.propose_unchecked(req).await {
                Ok(_) if target > current => tracing::info!(
                    format = target,
                    "every member applies log format {target}: raised the cluster's"
                ),
                Ok(_) => {}
                Err(e) => {
                    changed.store(true, Ordering::SeqCst);
                    tracing::debug!("announcing the cluster log format {target}: {e}");
                }
            }
            raising.store(false, Ordering::SeqCst);
        });
    }
}

/// Voters and learners of the configuration this member knows.
fn members(node: &RaftNode) -> Vec<NodeId> {
    node.raft
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .nodes()
        .map(|(id, _)| *id)
        .collect()
}
