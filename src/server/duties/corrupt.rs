//! Corruption checks (etcd's `corrupt.go`): members compare etcd's HashKV of their histories.
//!
//! - Initial check (`--experimental-initial-corrupt-check`): before Raft starts and before any
//!   client is served, a restarted member hashes its state machine at its revision and asks
//!   every peer for HashKV at that revision. A peer answering a different hash with the same
//!   compacted revision is a mismatch, and the member refuses to start with etcd's
//!   `<id> found data inconsistency with peers`. Unreachable, lagging (future revision) or
//!   compacted peers only produce warnings, as in etcd.
//! - Periodic check (`--experimental-corrupt-check-time`): every interval the leader hashes its
//!   own history, asks its peers for HashKV at that revision, confirms leadership with a read
//!   index, hashes again, and applies etcd 3.4's rules (a peer at a newer revision or
//!   compaction than the leader's, or at the leader's compaction with another hash, is
//!   inconsistent). A CORRUPT alarm is raised through Raft for the member that differs from a
//!   strict majority of the members' hashes; when no majority agrees, for member 0, as etcd
//!   3.4.23 does (docs/decisions/0021-corrupt-alarm-names-the-minority.md). Each finding is
//!   logged once.
//!
//! Peers are asked over the peer protocol (`Peer.HashKV`), as etcd asks its peers' peer URLs
//! (`/members/hashkv`), so the check needs no client URL of a peer.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tonic::transport::Channel;
use tonic::Status;

use crate::mvcc::{KvHash, MvccStore};
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::{AlarmRequest, AlarmType, HashKvRequest, HashKvResponse};
use crate::proto::kvdpb::peer_client::PeerClient;
use crate::proto::kvdpb::{internal_request, ErrorCode, InternalRequest};
use crate::raft::limits::REQUEST_TIMEOUT;
use crate::raft::net::network::Channels;
use crate::raft::net::peer_error;
use crate::raft::sm::state_machine::StateMachine;
use crate::raft::types::{Member, Membership, NodeId};
use crate::raft::{RaftNode, Role};
use crate::server::ServerError;

/// One peer's answer to HashKV.
type PeerHash = (NodeId, Result<HashKvResponse, Status>);

/// How to reach a peer's peer service.
type Dial<'a> = &'a (dyn Fn(&Member) -> Result<PeerClient<Channel>, String> + Sync);

/// This member's HashKV at `rev` (0: current), off the async workers.
async fn local_hash(store: &MvccStore, rev: i64) -> Result<KvHash, String> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || store.hash_kv(rev))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// Asks every peer for HashKV at `rev`, in parallel, each within [`REQUEST_TIMEOUT`].
async fn peer_hashes(dial: Dial<'_>, peers: Vec<(NodeId, Member)>, rev: i64) -> Vec<PeerHash> {
    let calls = peers.into_iter().map(|(id, m)| async move {
        let mut c = match dial(&m) {
            Ok(c) => c,
            Err(e) => return (id, Err(Status::invalid_argument(e))),
        };
        let call = c.hash_kv(HashKvRequest { revision: rev });
        let r = match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
            Ok(r) => r.map(|r| r.into_inner()),
            Err(_) => Err(Status::deadline_exceeded("no answer in time")),
        };
        (id, r)
    });
    futures::future::join_all(calls).await
}

/// The other members of `m`.
fn peers_of(m: &Membership, me: NodeId) -> Vec<(NodeId, Member)> {
    m.nodes()
        .filter(|(id, _)| **id != me)
        .map(|(id, m)| (*id, m.clone()))
        .collect()
}

/// etcd's `CheckInitialHashKV`, run by a restarted member before Raft starts (see the module
/// docs).
pub async fn initial_check(
    sm: &StateMachine,
    channels: &Channels,
    me: NodeId,
) -> Result<(), ServerError> {
    tracing::info!(
        "{me:x} starting initial corruption check with timeout {:?}...",
        REQUEST_TIMEOUT
    );
    let h = local_hash(sm.store(), 0)
        .await
        .map_err(|e| ServerError::Inconsistent(format!("{me:x} failed to fetch hash ({e})")))?;
    let mut mismatch = 0;
    let peers = peers_of(sm.membership()?.membership(), me);
    for (id, r) in peer_hashes(&|m| channels.peer(m), peers, h.revision).await {
        match r {
            Ok(p) if p.hash != h.hash && p.compact_revision == h.compacted => {
                tracing::error!(
                    "{me:x}'s hash {} != {id:x}'s hash {} (revision {}, peer revision {}, \
                     compact revision {})",
                    h.hash,
                    p.hash,
                    h.revision,
                    p.header.map_or(0, |h| h.revision),
                    h.compacted
                );
                mismatch += 1;
            }
            Ok(p) if p.hash != h.hash => tracing::warn!(
                "{me:x} cannot check hash of peer({id:x}): peer has a different compact \
                 revision {} (revision:{})",
                p.compact_revision,
                h.revision
            ),
            Ok(_) => {}
            Err(s) => match peer_error::kind_of(&s) {
                ErrorCode::FutureRev => tracing::warn!(
                    "{me:x} cannot check the hash of peer({id:x}) at revision {}: peer is \
                     lagging behind({:?})",
                    h.revision,
                    s.message()
                ),
                ErrorCode::Compacted => tracing::warn!(
                    "{me:x} cannot check the hash of peer({id:x}) at revision {}: local node \
                     is lagging behind({:?})",
                    h.revision,
                    s.message()
                ),
                _ => tracing::warn!(
                    "{me:x} hash-kv error {:?} on peer {id:x} with revision {}",
                    s.message(),
                    h.revision
                ),
            },
        }
    }
    if mismatch > 0 {
        return Err(ServerError::Inconsistent(format!(
            "{me:x} found data inconsistency with peers"
        )));
    }
    tracing::info!("{me:x} succeeded on initial corruption checking: no corruption");
    Ok(())
}

/// etcd's `monitorKVHash`: the leader's periodic check, every `interval`, until aborted.
pub async fn monitor(node: RaftNode, interval: Duration) {
    tracing::info!("enabled corruption checking with {interval:?} interval");
    let mut reported = BTreeSet::new();
    loop {
        tokio::time::sleep(interval).await;
        if node.status().role != Role::Leader {
            continue;
        }
        match check(&node).await {
            Ok(found) => {
                for id in found {
                    raise(&node, id, &mut reported).await;
                }
            }
            Err(e) => tracing::debug!("check hash kv failed {e}"),
        }
    }
}

/// Proposes a CORRUPT alarm for `id` unless one is active; logs each member once.
async fn raise(node: &RaftNode, id: NodeId, reported: &mut BTreeSet<NodeId>) {
    let active = node
        .alarms()
        .get(AlarmType::Corrupt as i32)
        .iter()
        .any(|a| a.member_id == id);
    if active {
        return;
    }
    if reported.insert(id) {
        tracing::warn!("raising the CORRUPT alarm for member {id:x}");
    }
    let req = InternalRequest {
        request: Some(internal_request::Request::Alarm(AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: id,
            alarm: AlarmType::Corrupt as i32,
        })),
        ..Default::default()
    };
    if let Err(e) = node.propose(req).await {
        tracing::warn!("raising the CORRUPT alarm: {e}");
    }
}

/// One pass of etcd's `checkHashKV`; the members to raise CORRUPT for (empty: consistent).
async fn check(node: &RaftNode) -> Result<BTreeSet<NodeId>, String> {
    let me = node.id;
    let h = local_hash(node.store(), 0).await?;
    let peers = peers_of(&node.applied_membership().map_err(|e| e.to_string())?, me);
    let members = peers.len() + 1;
    let answers = peer_hashes(&|m| node.peer(m), peers, h.revision).await;
    node.read_barrier().await.map_err(|e| e.to_string())?;
    let h2 = local_hash(node.store(), 0).await?;

    // Anomalies etcd 3.4 raises for, beside hash mismatches; who is wrong is unknown.
    let mut unknown = false;
    if h2.hash != h.hash && h2.revision == h.revision && h2.compacted == h.compacted {
        tracing::warn!(
            "mismatched hashes {} and {} for revision {}",
            h.hash,
            h2.hash,
            h.revision
        );
        unknown = true;
    }
    // Hashes at the leader's revision and compaction, by member.
    let mut hashes = BTreeMap::from([(me, h.hash)]);
    let mut checked = 0;
    for (id, r) in answers {
        let Ok(p) = r else { continue };
        checked += 1;
        let rev = p.header.map_or(0, |h| h.revision);
        if rev > h2.current {
            tracing::warn!(
                "revision {rev} from member {id:x}, expected at most {}",
                h2.current
            );
            unknown = true;
        }
        if p.compact_revision > h2.compacted {
            tracing::warn!(
                "compact revision {} from member {id:x}, expected at most {}",
                p.compact_revision,
                h2.compacted
            );
            unknown = true;
        }
        if p.compact_revision == h.compacted {
            if p.hash != h.hash {
                tracing::warn!(
                    "hash {} at revision {} from member {id:x}, expected hash {}",
                    p.hash,
                    h.revision,
                    h.hash
                );
            }
            hashes.insert(id, p.hash);
        }
    }
    tracing::info!("finished peer corruption check ({checked} peers checked)");
    Ok(suspects(&hashes, members, unknown))
}

/// The members to raise CORRUPT for, given the hashes at one revision and compaction
/// (`hashes`, the leader's included), the number of members, and whether another anomaly was
/// seen: those that differ from a hash a strict majority of the members hold; member 0 if
/// something is wrong and no majority agrees.
fn suspects(hashes: &BTreeMap<NodeId, u32>, members: usize, unknown: bool) -> BTreeSet<NodeId> {
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for h in hashes.values() {
        *counts.entry(*h).or_default() += 1;
    }
    let mismatch = counts.len() > 1;
    let majority = counts
        .iter()
        .find(|(_, n)| **n * 2 > members)
        .map(|(h, _)| *h);
    let mut out = BTreeSet::new();
    match majority {
        Some(good) if mismatch => {
            out.extend(
                hashes
                    .iter()
                    .filter(|(_, h)| **h != good)
                    .map(|(id, _)| *id),
            );
        }
        None if mismatch => {
            out.insert(0);
        }
        _ => {}
    }
    if unknown && out.is_empty() {
        out.insert(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::suspects;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn the_minority_is_named() {
        let h = BTreeMap::from([(1, 10), (2, 10), (3, 11)]);
        assert_eq!(suspects(&h, 3, false), BTreeSet::from([3]));
        // The leader itself can be the odd one.
        let h = BTreeMap::from([(1, 11), (2, 10), (3, 10)]);
        assert_eq!(suspects(&h, 3, false), BTreeSet::from([1]));
        // No majority among the members (one did not answer): etcd 3.4.23's member 0.
        let h = BTreeMap::from([(1, 10), (2, 11)]);
        assert_eq!(suspects(&h, 3, false), BTreeSet::from([0]));
        let h = BTreeMap::from([(1, 10), (2, 10)]);
        assert_eq!(suspects(&h, 3, false), BTreeSet::new());
        assert_eq!(suspects(&h, 3, true), BTreeSet::from([0]));
    }
}
