//! Every member probes every other member of its configuration twice a second, whatever its
//! role, as etcd keeps rafthttp streams between all members all the time; ten times a second
//! while one of them does not answer, as etcd redials a lost stream every 100 ms, so that a
//! member that comes back (a restart, a new member started) is reached within about 100 ms:
//! the replication and heartbeat streams waiting to retry it wait for the probe's answer
//! ([`Links::wait_up`]).
//!
//! Invariants:
//! - A member's view of which peers are *active* ([`Links`], used by the strict
//!   reconfiguration check) does not depend on who leads: a member that has just been elected
//!   already knows which peers it has reached without interruption for the last 5 s.
//! - A round never waits longer than [`PROBE_TIMEOUT`] for a peer, so live peers are probed
//!   well within `Links`' staleness limit even while another peer is down.
//! - A member that a peer reports as removed (the peer has applied its removal) stops: this is
//!   how a member removed while it was down learns of it when restarted.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use tokio::sync::watch;

use crate::proto::kvdpb::ProbeRequest;
use crate::raft::net::links::Links;
use crate::raft::net::peer_error::PeerFailure;
use crate::raft::node::RaftNode;
use crate::raft::types::{Member, NodeId};

pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// The interval while a peer does not answer (see the module doc).
pub const PROBE_INTERVAL_DOWN: Duration = Duration::from_millis(100);
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Probes peers until this member learns it was removed (then sets `removed` and returns).
pub async fn run(node: RaftNode, links: Links, cluster_id: u64, removed: watch::Sender<bool>) {
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::time::sleep_until(next).await;
        let round = tokio::time::Instant::now();
        let mut interval = PROBE_INTERVAL;
        let peers = peers_of(&node);
        let probes = peers.into_iter().map(|(id, m)| {
            let node = node.clone();
            async move { (id, probe(&node, id, &m, cluster_id).await) }
        });
        let mut unversioned = Vec::new();
        for (id, r) in futures::future::join_all(probes).await {
            match r {
                Ok((_, format)) => {
                    links.ok(id);
                    if format != 0 {
                        node.formats.heard(id, format);
                    } else if node.formats.unversioned_due(id) {
                        unversioned.push(id);
                    }
                }
                Err(f) => {
                    links.failed(id, f);
                    interval = PROBE_INTERVAL_DOWN;
                }
            }
            if matches!(r, Ok((true, _))) {
                tracing::warn!(
                    peer = %format!("{id:x}"),
                    "a peer reports this member as removed from the cluster"
                );
                let _ = removed.send(true);
                return;
            }
        }
        for id in unversioned {
            let Some(m) = peers_of(&node).into_iter().find(|(p, _)| *p == id) else {
                continue;
            };
            if let Some(f) = crate::raft::cluster_format::classify_unversioned(&node, &m.1).await {
                node.formats.heard(id, f);
            }
        }
        node.formats.raise_if_due(&node);
        // A round that took longer than the interval (a peer timing out) is followed at once.
        next = round + interval;
    }
}

/// The other members of the configuration this member knows.
fn peers_of(node: &RaftNode) -> Vec<(NodeId, Member)> {
    node.raft
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .nodes()
        .filter(|(id, _)| **id != node.id)
        .map(|(id, m)| (*id, m.clone()))
        .collect()
}

/// One probe: `Ok((removed, log format))` when the peer answered.
async fn probe(
    node: &RaftNode,
    peer_id: NodeId,
    peer: &Member,
    cluster_id: u64,
) -> Result<(bool, u32), PeerFailure> {
    let mut c = node
        .channels
        .peer(peer)
        .map_err(|_| PeerFailure::BadAddress)?;
    let call = c.probe(ProbeRequest {
        cluster_id,
        member_id: node.id,
    });
    let sent = std::time::Instant::now();
    match tokio::time::timeout(PROBE_TIMEOUT, call).await {
        Ok(Ok(r)) => {
            // etcd's prober feeds the same histogram with its own round trips.
            crate::metrics::PEER_ROUND_TRIP.observe(peer_id, sent.elapsed());
            let r = r.into_inner();
            Ok((r.removed, r.log_format))
        }
        Ok(Err(s)) => Err(PeerFailure::of_status(&s)),
        Err(_) => Err(PeerFailure::Timeout),
    }
}
