//! Stopping, the last stage of [`super::run`]: what ends a member, and the order in which it
//! lets go.
//!
//! Invariants:
//! - Background duties stop before Raft, so none proposes into a stopping node.
//! - A leader hands leadership over before its servers stop, so the cluster does not wait an
//!   election timeout (etcd does the same on graceful stop). A member whose Raft failed has no
//!   leadership to hand over, and makes no further call into Raft before it is shut down.
//! - The committed index and the applied state are written last: neither is needed for
//!   safety (the log holds every applied entry), but a restart then replays nothing.

use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use super::serve::Serving;
use super::{membership, ServerError};
use crate::raft::{Fatal, Raft, RaftNode};

/// Why a member stopped.
pub enum StopReason {
    /// The caller asked (a signal, a test).
    Asked,
    /// Raft stopped on its own, on a storage error.
    RaftFailed(Fatal),
    /// The cluster removed this member.
    Removed,
}

/// Waits until the member must stop.
pub async fn wait_for_stop(
    node: &RaftNode,
    initial_member: bool,
    serving: &Serving,
    shutdown: impl Future<Output = ()>,
) -> StopReason {
    let removed = membership::removed(node.clone(), initial_member, serving.removed_rx.clone());
    tokio::select! {
        _ = shutdown => StopReason::Asked,
        why = raft_stopped(node.raft.clone()) => {
            tracing::error!(error = %why, "raft stopped on a storage error; the member exits");
            StopReason::RaftFailed(why)
        }
        _ = removed => {
            tracing::warn!(
                "the member has been permanently removed from the cluster; \
                 its data dir must be removed before it can join again"
            );
            // Let the reply to the request that removed this member reach its client.
            tokio::time::sleep(Duration::from_secs(1)).await;
            StopReason::Removed
        }
    }
}

/// Stops the member in order and says how it ended.
pub async fn shut_down(
    node: &RaftNode,
    serving: Serving,
    reason: StopReason,
) -> Result<(), ServerError> {
    tracing::info!("stopping member");
    let failed = matches!(reason, StopReason::RaftFailed(_));
    if failed {
        node.sm.close();
        // Settle openraft's record of its dead core first: a task aborted below may be the
        // one joining the core (any call into a stopped Raft joins it), and openraft panics
        // on a later call if that join was abandoned half way.
        let _ = node.raft.shutdown().await;
    }
    serving.stop_background();
    if !failed {
        hand_over_leadership(node).await;
    }
    serving.stop_servers();
    // An apply that stopped before an entry it cannot apply waits until now.
    node.sm.close();
    let _ = node.raft.shutdown().await;
    if let Err(e) = node.log.flush_committed().await {
        tracing::warn!("could not persist the committed index: {e}");
    }
    if let Err(e) = node.sm.store().flush() {
        tracing::warn!("could not write applied state to the state-machine database: {e}");
    }
    for t in serving.servers {
        let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
    }
    for t in serving.aux {
        // The leader watcher only ends with the node, and a scrape in flight need not finish.
        t.abort();
    }
    match reason {
        StopReason::RaftFailed(why) => Err(ServerError::RaftStopped(why)),
        StopReason::Asked | StopReason::Removed => Ok(()),
    }
}

/// Resolves when Raft stops without being asked to: openraft stops on a storage error (a WAL
/// write or fsync, the state-machine database), and a member that cannot persist must not
/// keep answering as if it could. etcd exits in the same cases.
async fn raft_stopped(raft: Raft) -> Fatal {
    // The sender lives in openraft's core task: `changed` fails once the core has ended.
    let mut rx = raft.server_metrics();
    while rx.changed().await.is_ok() {}
    match &raft.metrics().borrow_watched().running_state {
        Err(e) => e.clone(),
        Ok(()) => Fatal::Stopped,
    }
}

/// A leader that stops transfers leadership to another voter first.
async fn hand_over_leadership(node: &RaftNode) {
    let m = node.raft.metrics().borrow_watched().clone();
    if m.current_leader != Some(node.id) {
        return;
    }
    let Some(to) = m
        .membership_config
        .membership()
        .voter_ids()
        .find(|v| *v != node.id)
    else {
        return;
    };
    tracing::info!(to = %format!("{to:x}"), "transferring leadership before stopping");
    if node.raft.trigger().transfer_leader(to).await.is_err() {
        return;
    }
    let mut rx = node.raft.metrics();
    let _ = tokio::time::timeout(
        Duration::from_secs(3),
        rx.wait_until(|m: &openraft::RaftMetrics<crate::raft::TypeConfig>| {
            m.current_leader.is_some_and(|l| l != node.id)
        }),
    )
    .await;
}
