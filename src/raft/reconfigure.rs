//! Raft's side of membership changes and leadership transfer: the entries that change the
//! configuration, when a change is safe to answer, and how a member learns it was removed.
//! The server decides *whether* a change may be made (etcd's checks, in
//! `server::membership`); this module makes it.
//!
//! Invariants:
//! - A voter is added in one log entry (openraft's single-step `append_membership`: the voter
//!   sets differ by one, so every quorum of the old set meets every quorum of the new), and
//!   [`RaftNode::add_voter`] answers once that entry is durable on a quorum of the *old*
//!   voters, when every future leader holds it. The commit (which may need the new member
//!   itself) finishes in the background, holding the caller's change lock until it does.
//! - Every error says whether the change may still take effect: [`ReconfigError::NotLeader`]
//!   means nothing was appended (ask the next leader); [`ReconfigError::LeaderChanged`] and
//!   [`ReconfigError::Timeout`] mean it may or may not.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::entry::RaftPayload;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::type_config::alias::PayloadOf;
use openraft::{ChangeMembers, Precondition, RaftMetrics};
use tokio::sync::OwnedMutexGuard;

use super::RaftNode;
use crate::proto::kvdpb::RemovedRequest;
use crate::raft::limits::REQUEST_TIMEOUT;
use crate::raft::types::{Member, Membership, NodeId, StoredMembership, TypeConfig};

/// The smallest majority of `n` voters.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Why a membership change or a leadership transfer did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReconfigError {
    /// Refused before anything was appended: whoever leads next may take it.
    #[error("not leader")]
    NotLeader,
    /// Appended, then dropped from this log: it may still commit elsewhere.
    #[error("leader changed")]
    LeaderChanged,
    /// No answer in time; the change may or may not take effect.
    #[error("timed out")]
    Timeout,
    #[error("raft stopped")]
    Stopped,
    #[error("{0}")]
    Internal(String),
}

/// A change openraft refused or lost, by the error's type.
fn classify(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ReconfigError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => ReconfigError::NotLeader,
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => ReconfigError::LeaderChanged,
        // Refused before anything was appended, until this leader's first entry (or the last
        // configuration) commits: asked again, like a leader change, until the deadline.
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::UncommittedLeaderLog(_) | ChangeMembershipError::InProgress(_),
        )) => ReconfigError::NotLeader,
        e => ReconfigError::Internal(e.to_string()),
    }
}

impl RaftNode {
    /// The configuration this member holds (the newest in its log).
    pub fn membership(&self) -> Membership {
        self.raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .clone()
    }

    /// A learner's matched log index, and the leader's last log index (0 when unknown).
    pub fn learner_progress(&self, id: NodeId) -> (u64, u64) {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned().flatten())
            .map_or(0, |l| l.index);
        (matched, m.last_log_index.unwrap_or(0))
    }

    /// Adds a learner; answers the new configuration once committed (a learner entry commits
    /// with the voters alone).
    pub async fn add_learner(
        &self,
        id: NodeId,
        member: Member,
    ) -> Result<Option<Membership>, ReconfigError> {
        let call = tokio::time::timeout(REQUEST_TIMEOUT, self.raft.add_learner(id, member, false));
        let r = self
            .unless_stopping(call)
            .await
            .ok_or(ReconfigError::Stopped)?
            .map_err(|_| ReconfigError::Timeout)?;
        Ok(r.map_err(classify)?.membership)
    }

    /// Appends the configuration with voter `id` added (one entry) and returns it once a
    /// quorum of the old voters has the entry, or once it committed, whichever comes first;
    /// the commit finishes in the background, holding `one_at_a_time` (see the module doc).
    /// From a joint configuration (left by a leader that did not finish a two-step change)
    /// openraft's two-step change is used and answered only once it commits.
    pub async fn add_voter(
        &self,
        id: NodeId,
        member: Member,
        one_at_a_time: OwnedMutexGuard<()>,
    ) -> Result<Option<Membership>, ReconfigError> {
        let observed = self
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .clone();
        let current = observed.membership();
        let old_voters: BTreeSet<NodeId> = current.voter_ids().collect();
        let mut voters = old_voters.clone();
        voters.insert(id);
        let mut nodes: BTreeMap<NodeId, Member> =
            current.nodes().map(|(i, n)| (*i, n.clone())).collect();
        nodes.insert(id, member.clone());
        let proposed = Membership::new(vec![voters], nodes)
            .map_err(|e| ReconfigError::Internal(e.to_string()))?;
        let joint = current.get_joint_config().len() > 1;
        let raft = self.raft.clone();
        let after = *observed.log_id();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let stopping = self.when_stopping();
        tokio::spawn(async move {
            let change = async {
                if joint {
                    // Left joint by a change a leader did not finish: openraft's two-step change
                    // leaves it first (the direct append only goes from a uniform set).
                    let add = BTreeMap::from([(id, member)]);
                    raft.change_membership(ChangeMembers::AddVoters(add), true)
                        .await
                } else {
                    let cond = Precondition::LastMembershipLogId {
                        last_membership_log_id: after,
                    };
                    raft.append_membership(proposed, PayloadOf::<TypeConfig>::blank(), [cond])
                        .await
                }
            };
            // As `unless_stopping`: a stop drops the call unpolled (the waiter then hears that
            // the task ended).
            let r = tokio::select! {
                biased;
                () = stopping => return,
                r = change => r,
            };
            match &r {
                Ok(_) => tracing::info!(member = %format!("{id:x}"), "added voter: committed"),
                Err(e) => tracing::warn!(member = %format!("{id:x}"), "adding a voter: {e}"),
            }
            drop(one_at_a_time);
            let _ = done_tx.send(r);
        });
        let mut metrics = self.raft.metrics();
        let kept = metrics.wait_until(|m: &RaftMetrics<TypeConfig>| {
            kept_by_old_quorum(m, id, &old_voters, &observed)
        });
        let (done, kept) = (
            tokio::time::timeout(REQUEST_TIMEOUT, done),
            tokio::time::timeout(REQUEST_TIMEOUT, kept),
        );
        tokio::select! {
            r = done => match r {
                Ok(Ok(r)) => Ok(r.map_err(classify)?.membership),
                // The task ends without an answer when the member stops under it.
                Ok(Err(_)) => Err(ReconfigError::Stopped),
                Err(_) => Err(ReconfigError::Timeout),
            },
            // A joint configuration's first step is not this single-step entry: answered at
            // its commit only.
            r = kept, if !joint => match r {
                Ok(Ok(m)) => Ok(Some(m.membership_config.membership().clone())),
                Ok(Err(_)) => Err(ReconfigError::Stopped),
                Err(_) => Err(ReconfigError::Timeout),
            },
        }
    }

    /// Removes member `id` (a voter or a learner); answers the configuration once committed.
    pub async fn remove_member(
        &self,
        id: NodeId,
        voter: bool,
    ) -> Result<Option<Membership>, ReconfigError> {
        let ids = BTreeSet::from([id]);
        let change = if voter {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        };
        // Removing this member (the leader) is fine: once the change commits, openraft hands
        // leadership to another voter and this member's removal watch stops the process.
        let call =
            tokio::time::timeout(REQUEST_TIMEOUT, self.raft.change_membership(change, false));
        let done = self
            .unless_stopping(call)
            .await
            .ok_or(ReconfigError::Stopped)?
            .map_err(|_| ReconfigError::Timeout)?;
        match done {
            Ok(resp) => Ok(resp.membership),
            // When this member removes itself, the removal watch may stop Raft between the
            // commit and openraft's answer ("raft stopped"); the committed membership then
            // says whether the change went through.
            Err(e) if id == self.id => {
                let committed = self.watch_leadership().committed_membership();
                if committed.get_node(&id).is_some() {
                    return Err(classify(e));
                }
                Ok(Some(committed))
            }
            Err(e) => Err(classify(e)),
        }
    }

    /// Replaces member `id`'s record (its peer URLs); answers the configuration once committed.
    pub async fn update_member(
        &self,
        id: NodeId,
        member: Member,
    ) -> Result<Option<Membership>, ReconfigError> {
        let change = ChangeMembers::SetNodes(BTreeMap::from([(id, member)]));
        self.change(change).await
    }

    /// Makes learner `id` a voter; answers the configuration once committed.
    pub async fn promote_learner(&self, id: NodeId) -> Result<Option<Membership>, ReconfigError> {
        let r = self
            .change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await;
        if r.is_ok() {
            crate::metrics::LEARNER_PROMOTE_SUCCESSES.inc();
        }
        r
    }

    async fn change(
        &self,
        change: ChangeMembers<NodeId, Member>,
    ) -> Result<Option<Membership>, ReconfigError> {
        let call = tokio::time::timeout(REQUEST_TIMEOUT, self.raft.change_membership(change, true));
        let r = self
            .unless_stopping(call)
            .await
            .ok_or(ReconfigError::Stopped)?
            .map_err(|_| ReconfigError::Timeout)?;
        Ok(r.map_err(classify)?.membership)
    }

    /// Asks voter `to` to take over leadership and waits up to `within` until it leads
    /// ([`ReconfigError::Timeout`] otherwise).
    pub async fn transfer_leadership(
        &self,
        to: NodeId,
        within: Duration,
    ) -> Result<(), ReconfigError> {
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|_| ReconfigError::Stopped)?;
        let mut rx = self.raft.metrics();
        tokio::time::timeout(
            within,
            rx.wait_until(|m: &RaftMetrics<TypeConfig>| m.current_leader == Some(to)),
        )
        .await
        .map_err(|_| ReconfigError::Timeout)?
        .map_err(|_| ReconfigError::Stopped)?;
        Ok(())
    }

    /// A leader that stops hands leadership to another voter first, waiting a few seconds at
    /// most; anything else does nothing.
    pub async fn hand_over_leadership(&self) {
        let status = self.status();
        if status.leader != Some(self.id) {
            return;
        }
        let links = &self.links;
        let voters: Vec<NodeId> = status
            .membership
            .voter_ids()
            .filter(|v| *v != self.id)
            .collect();
        // A voter that answers now, if there is one: a stopped one cannot take over.
        let Some(to) = voters
            .iter()
            .copied()
            .find(|v| links.is_up(*v))
            .or(voters.first().copied())
        else {
            return;
        };
        tracing::info!(to = %format!("{to:x}"), "transferring leadership before stopping");
        if self.raft.trigger().transfer_leader(to).await.is_err() {
            return;
        }
        // Until another member leads, or the target stops answering (it may be stopping too:
        // a whole cluster stopped at once), for at most three seconds.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        let mut rx = self.raft.metrics();
        loop {
            if rx
                .borrow_watched()
                .current_leader
                .is_some_and(|l| l != self.id)
            {
                return;
            }
            if !links.is_up(to) {
                tracing::info!(
                    to = %format!("{to:x}"),
                    "the member taking over stopped answering; stopping without waiting for it"
                );
                return;
            }
            let tick = (tokio::time::Instant::now() + Duration::from_millis(50)).min(deadline);
            match tokio::time::timeout_at(tick, rx.changed()).await {
                Ok(Err(_)) => return,
                _ if tokio::time::Instant::now() >= deadline => return,
                _ => {}
            }
        }
    }

    /// Tells a removed member it is out: replication to it stopped when its removal was
    /// proposed, so it may never see the commit itself. Best effort, for ten seconds; a member
    /// that is down learns nothing.
    pub async fn notify_removed(&self, target: Member, cluster_id: u64, member_id: NodeId) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(mut c) = self.channels.peer(&target) {
                let call = c.removed(RemovedRequest {
                    cluster_id,
                    member_id,
                });
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), call).await {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Resolves when this member learns it has been removed: from the leader's notice, or
    /// from a committed configuration without it. `was_member` is whether this member knows
    /// it belonged to the cluster; a joining member replays configurations from before it was
    /// added, which must not count as a removal.
    pub async fn removed(
        &self,
        mut was_member: bool,
        mut notice: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut w = self.watch_leadership();
        loop {
            let (has_me, any) = w.committed_has(self.id);
            if has_me {
                was_member = true;
            } else if was_member && any {
                return;
            }
            tokio::select! {
                up = w.changed() => if !up { std::future::pending::<()>().await },
                r = notice.wait_for(|r| *r) => if r.is_ok() { return } else { std::future::pending::<()>().await },
            }
        }
    }
}

/// Whether the leader whose metrics are `m` holds a configuration newer than `before` with
/// `id` as a voter, and a quorum of `old_voters` (the leader included, once flushed) has the
/// entry that made it: then no leader can be elected without it (see the module doc).
fn kept_by_old_quorum(
    m: &RaftMetrics<TypeConfig>,
    id: NodeId,
    old_voters: &BTreeSet<NodeId>,
    before: &StoredMembership,
) -> bool {
    let config = &m.membership_config;
    let Some(at) = config.log_id() else {
        return false;
    };
    if config.log_id() <= before.log_id() || !config.membership().voter_ids().any(|v| v == id) {
        return false;
    }
    let Some(matched) = &m.replication else {
        return false;
    };
    let have = old_voters
        .iter()
        .filter(|v| {
            matched
                .get(v)
                .cloned()
                .flatten()
                .is_some_and(|l| l.index >= at.index)
        })
        .count();
    have >= quorum(old_voters.len())
}
