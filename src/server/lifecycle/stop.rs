//! Stopping, the last stage of [`crate::server::run`]: what ends a member, and the order in which it
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

use crate::raft::{Fatal, RaftNode};
use crate::server::lifecycle::serve::Serving;
use crate::server::ServerError;

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
    let removed = node.removed(initial_member, serving.removed_rx.clone());
    tokio::select! {
        _ = shutdown => StopReason::Asked,
        why = node.stopped() => {
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
        // Settle openraft's record of its dead core first: a task aborted below may be the
        // one joining the core (any call into a stopped Raft joins it), and openraft panics
        // on a later call if that join was abandoned half way.
        node.stop_raft().await;
    }
    serving.stop_background();
    if !failed {
        node.hand_over_leadership().await;
    }
    node.begin_stop();
    serving.stop_servers();
    node.stop_raft().await;
    node.persist_on_stop().await;
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
