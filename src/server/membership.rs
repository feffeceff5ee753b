//! Run-time membership changes (etcd's MemberAdd/Remove/Update/Promote and MoveLeader).
//!
//! Any member accepts a change; a non-leader forwards it to the leader over the peer protocol
//! (`Peer.Membership`), and only the leader checks and proposes it.
//!
//! Invariants:
//! - Changes are checked and proposed one at a time (`lock`), against the configuration the
//!   leader holds at that moment, so two concurrent requests cannot each pass the quorum checks
//!   against a configuration the other one is about to change.
//! - etcd's strict reconfiguration check: a change that adds or removes a voter is refused
//!   unless, afterwards, the *started* voters (those that have published their name) and the
//!   *active* voters (those this member has reached without interruption for
//!   [`HEALTH_INTERVAL`], through Raft RPCs and the peer prober, so a new leader knows at once;
//!   the leader itself always counts) are each a quorum of the new voter set. A member that is
//!   added is neither started nor active; removing a voter that is down only needs the rest to
//!   keep quorum.
//! - At most [`MAX_LEARNERS`] learner, as etcd; a learner is promoted only once its matched log
//!   index is within [`LEARNER_READY`] of the leader's last log index.
//! - A member id is computed from the peer URLs, the cluster token and the current time, so an
//!   id is never reused after a removal (etcd does the same).
//! - A voter is added in one log entry (openraft's single-step `append_membership`: the voter
//!   sets differ by one, so every quorum of the old set meets every quorum of the new), not
//!   through a joint configuration, and `member add` answers once that entry is durable on a
//!   quorum of the *old* voters (the leader's replication metrics; the leader's own entry
//!   counts once it is flushed). From then on every future leader holds the entry: a candidate
//!   without it needs votes from a quorum of the old voters, one of which has a longer log and
//!   refuses. This is when etcd 3.4 answers (its conf change commits under the old
//!   configuration, then takes effect). openraft commits the entry only with a quorum of the
//!   *new* voters, which may need the new member itself (growing a one-member cluster to two),
//!   so the commit finishes in the background and the change lock is held until it does: the
//!   next change waits for it (or answers "request timed out", as etcd does while the added
//!   member it needs for a quorum has not started).
//! - What a client sees: an error or a timeout before that point means the member may or may
//!   not be added (the entry may be on the leader only, and is lost if that leader dies before
//!   replicating it; `member list` tells). A success means the member is in the configuration
//!   every member will have, started or not; if the leader dies right after answering, the
//!   next leader is elected under that configuration (for two voters: once the new member has
//!   started), exactly as with etcd.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::async_runtime::WatchReceiver;
use openraft::entry::RaftPayload;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::type_config::alias::PayloadOf;
use openraft::{ChangeMembers, Precondition};
use tokio::sync::OwnedMutexGuard;

use super::error::ApiError;
use super::reconfig_check::{admit_learner, admit_voters, quorum, Voter};
use crate::proto::etcdserverpb::{
    Member as EtcdMember, MemberAddRequest, MemberAddResponse, MemberPromoteRequest,
    MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest,
    MemberUpdateResponse,
};
use crate::proto::kvdpb::{
    membership_request, membership_response, MembershipRequest, RemovedRequest,
};
use crate::raft::links::Links;
use crate::raft::node::REQUEST_TIMEOUT;
use crate::raft::peer_error::PeerFailure;
use crate::raft::state_machine::StateMachine;
use crate::raft::types::{Membership, StoredMembership};
use crate::raft::{Member, NodeId, RaftNode, TypeConfig};
use crate::server::config::compute_member_id;

/// How long a member must have reached a peer without interruption for it to count as active
/// (etcd's HealthInterval).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// etcd allows one learner at a time.
pub const MAX_LEARNERS: usize = 1;
/// A learner is in sync when its matched index is at least this fraction of the leader's.
pub const LEARNER_READY: f64 = 0.9;

/// Leader-side membership changes and the routing of requests to the leader.
pub struct Reconfig {
    pub node: RaftNode,
    pub links: Links,
    pub cluster_id: u64,
    /// `--initial-cluster-token`, part of every new member id.
    pub token: String,
    /// Held while a change is checked and proposed, and until an added voter's entry commits.
    lock: Arc<tokio::sync::Mutex<()>>,
}

/// etcd's member list for a membership config: published name and client URLs come from the
/// state machine (empty until the member has started).
pub fn members_of(m: &Membership, sm: &StateMachine) -> Result<Vec<EtcdMember>, ApiError> {
    let voters: BTreeSet<NodeId> = m.voter_ids().collect();
    let mut out = Vec::new();
    for (id, node) in m.nodes() {
        let attrs = sm
            .member_attrs(*id)
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .unwrap_or_default();
        out.push(EtcdMember {
            id: *id,
            name: attrs.name,
            peer_ur_ls: node.peer_urls.clone(),
            client_ur_ls: attrs.client_urls,
            is_learner: !voters.contains(id),
        });
    }
    Ok(out)
}

/// etcd accepts http(s) and unix(s) URLs with an explicit host:port.
fn valid_peer_urls(urls: &[String]) -> bool {
    !urls.is_empty()
        && urls.iter().all(|u| match url::Url::parse(u) {
            Ok(p) => {
                matches!(p.scheme(), "http" | "https" | "unix" | "unixs")
                    && p.host_str().is_some_and(|h| !h.is_empty())
                    && p.port().is_some()
                    && matches!(p.path(), "" | "/")
            }
            Err(_) => false,
        })
}

/// A membership change openraft refused or lost, by the error's type.
fn raft_err(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ApiError {
    match e {
        // Refused before anything was appended: whoever leads next checks and proposes it.
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => ApiError::NotLeader,
        // Appended, then dropped from this log: it may still commit elsewhere, so asking again
        // could apply it twice.
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => ApiError::LeaderChanged,
        // Refused before anything was appended, until this leader's first entry (or the last
        // configuration) commits: asked again, like a leader change, until the deadline.
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::UncommittedLeaderLog(_) | ChangeMembershipError::InProgress(_),
        )) => ApiError::NotLeader,
        e => ApiError::Internal(e.to_string()),
    }
}

impl Reconfig {
    pub fn new(node: RaftNode, links: Links, cluster_id: u64, token: String) -> Self {
        Reconfig {
            node,
            links,
            cluster_id,
            token,
            lock: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Serves a request on any member: handled here when this member leads, forwarded to the
    /// leader otherwise. A leader that stepped down meanwhile answers "not leader"; then the
    /// request goes to whoever leads next, until the request deadline.
    pub async fn request(
        &self,
        req: membership_request::Request,
    ) -> Result<membership_response::Response, ApiError> {
        let deadline = std::time::Instant::now() + REQUEST_TIMEOUT;
        loop {
            let (leader, member) = self.node.wait_leader(deadline).await?;
            let r = if leader == self.node.id {
                self.handle(req.clone()).await
            } else {
                self.forward(&member, req.clone(), deadline).await
            };
            match r {
                Err(ApiError::NotLeader) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(ApiError::NotLeader) => return Err(ApiError::Timeout),
                r => return r,
            }
        }
    }

    async fn forward(
        &self,
        leader: &Member,
        req: membership_request::Request,
        deadline: std::time::Instant,
    ) -> Result<membership_response::Response, ApiError> {
        let mut c = self
            .node
            .channels
            .peer(leader)
            .map_err(ApiError::Internal)?;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let call = c.membership(MembershipRequest { request: Some(req) });
        match tokio::time::timeout(left, call).await {
            Err(_) => Err(ApiError::Timeout),
            Ok(Ok(r)) => r
                .into_inner()
                .response
                .ok_or_else(|| ApiError::Internal("empty membership reply".into())),
            Ok(Err(s)) => {
                let f = PeerFailure::of_status(&s);
                if f.never_sent() || f == PeerFailure::Broken {
                    // The leader could not be reached, or the connection to it broke: treat it
                    // like a leader change and look again.
                    Err(ApiError::NotLeader)
                } else {
                    Err(ApiError::from_peer(&s))
                }
            }
        }
    }

    /// Leader side of a change another member forwarded: [`Reconfig::handle`], answered with
    /// the error's kind for the forwarding member.
    pub async fn handle_forwarded(
        &self,
        req: membership_request::Request,
    ) -> Result<membership_response::Response, tonic::Status> {
        self.handle(req).await.map_err(ApiError::into_peer_status)
    }

    /// Leader side: checks and proposes one change.
    pub async fn handle(
        &self,
        req: membership_request::Request,
    ) -> Result<membership_response::Response, ApiError> {
        use membership_request::Request as Q;
        use membership_response::Response as R;
        // A voter added last may still wait for its commit (see the module doc); etcd answers
        // "request timed out" to a change while the cluster has no quorum.
        let one_at_a_time = tokio::time::timeout(REQUEST_TIMEOUT, self.lock.clone().lock_owned())
            .await
            .map_err(|_| ApiError::Timeout)?;
        if self.node.raft.metrics().borrow_watched().current_leader != Some(self.node.id) {
            return Err(ApiError::NotLeader);
        }
        match req {
            Q::Add(r) => self.add(r, one_at_a_time).await.map(R::Add),
            Q::Remove(r) => self.remove(r).await.map(R::Remove),
            Q::Update(r) => self.update(r).await.map(R::Update),
            Q::Promote(r) => self.promote(r).await.map(R::Promote),
        }
    }

    fn membership(&self) -> Membership {
        self.node
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .clone()
    }

    fn started(&self, id: NodeId) -> Result<bool, ApiError> {
        Ok(self
            .node
            .sm
            .member_attrs(id)
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .is_some())
    }

    fn active(&self, id: NodeId) -> bool {
        id == self.node.id || self.links.active_for(id, HEALTH_INTERVAL)
    }

    /// The strict reconfiguration check for a voter set about to take effect. `joining` is a
    /// member of `voters` that is not a voter yet, and whether it has started.
    fn check_quorum(
        &self,
        voters: &BTreeSet<NodeId>,
        joining: Option<(NodeId, bool)>,
    ) -> Result<(), ApiError> {
        admit_voters(&self.voter_states(voters, joining)?, joining.is_some())
    }

    /// etcd's check before adding a learner (see [`admit_learner`]).
    fn check_connected(&self, voters: &BTreeSet<NodeId>) -> Result<(), ApiError> {
        admit_learner(&self.voter_states(voters, None)?)
    }

    /// What the checks know of each of `voters` (see [`Self::check_quorum`] for `joining`: it
    /// counts as active only if it has started).
    fn voter_states(
        &self,
        voters: &BTreeSet<NodeId>,
        joining: Option<(NodeId, bool)>,
    ) -> Result<Vec<Voter>, ApiError> {
        voters
            .iter()
            .map(|v| {
                Ok(match joining {
                    Some((j, s)) if j == *v => Voter {
                        started: s,
                        active: s && self.active(j),
                    },
                    _ => Voter {
                        started: self.started(*v)?,
                        active: self.active(*v),
                    },
                })
            })
            .collect()
    }

    fn header_members(&self, m: Option<&Membership>) -> Result<Vec<EtcdMember>, ApiError> {
        match m {
            Some(m) => members_of(m, &self.node.sm),
            None => members_of(&self.membership(), &self.node.sm),
        }
    }

    /// A member never lets into the membership a peer URL it cannot dial: `https://` needs
    /// peer TLS on this member (and `unix://` is not dialed at all).
    fn can_dial_all(&self, urls: &[String]) -> bool {
        match urls.iter().find(|u| !self.node.channels.can_dial(u)) {
            Some(u) => {
                tracing::warn!(
                    url = %u,
                    "refused a peer URL this member cannot dial (https needs --peer-cert-file \
                     and --peer-key-file, or --peer-auto-tls)"
                );
                false
            }
            None => true,
        }
    }

    async fn add(
        &self,
        r: MemberAddRequest,
        one_at_a_time: OwnedMutexGuard<()>,
    ) -> Result<MemberAddResponse, ApiError> {
        if !valid_peer_urls(&r.peer_ur_ls) || !self.can_dial_all(&r.peer_ur_ls) {
            return Err(ApiError::BadMemberUrls);
        }
        let m = self.membership();
        if m.nodes()
            .any(|(_, n)| n.peer_urls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(ApiError::PeerUrlsExist);
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let id = compute_member_id(&r.peer_ur_ls, &self.token, Some(now));
        if m.get_node(&id).is_some() {
            return Err(ApiError::MemberIdExists);
        }
        let mut voters: BTreeSet<NodeId> = m.voter_ids().collect();
        if r.is_learner {
            if m.learner_ids().count() >= MAX_LEARNERS {
                return Err(ApiError::TooManyLearners);
            }
            self.check_connected(&voters)?;
        } else {
            voters.insert(id);
            self.check_quorum(&voters, Some((id, false)))?;
        }
        let node = Member {
            peer_urls: r.peer_ur_ls.clone(),
        };
        tracing::info!(member = %format!("{id:x}"), urls = %node, learner = r.is_learner, "adding member");
        // Neither waits for the new member: a learner entry commits with the voters, and a
        // voter's answer needs only the old voters (see the module doc).
        let membership = if r.is_learner {
            tokio::time::timeout(REQUEST_TIMEOUT, self.node.raft.add_learner(id, node, false))
                .await
                .map_err(|_| ApiError::Timeout)?
                .map_err(raft_err)?
                .membership
        } else {
            self.add_voter(id, node, one_at_a_time).await?
        };
        Ok(MemberAddResponse {
            header: None,
            member: Some(EtcdMember {
                id,
                name: String::new(),
                peer_ur_ls: r.peer_ur_ls,
                client_ur_ls: vec![],
                is_learner: r.is_learner,
            }),
            members: self.header_members(membership.as_ref())?,
        })
    }

    /// Appends the configuration with voter `id` added (one entry) and returns it once a
    /// quorum of the old voters has the entry, or once it committed, whichever comes first;
    /// the commit finishes in the background, holding `one_at_a_time` (see the module doc).
    /// From a joint configuration (left by a leader that did not finish a two-step change)
    /// openraft's two-step change is used and answered only once it commits.
    async fn add_voter(
        &self,
        id: NodeId,
        node: Member,
        one_at_a_time: OwnedMutexGuard<()>,
    ) -> Result<Option<Membership>, ApiError> {
        let observed = self
            .node
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
        nodes.insert(id, node.clone());
        let proposed =
            Membership::new(vec![voters], nodes).map_err(|e| ApiError::Internal(e.to_string()))?;
        let joint = current.get_joint_config().len() > 1;
        let raft = self.node.raft.clone();
        let after = *observed.log_id();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let r = if joint {
                // Left joint by a change a leader did not finish: openraft's two-step change
                // leaves it first (the direct append only goes from a uniform set).
                let add = BTreeMap::from([(id, node)]);
                raft.change_membership(ChangeMembers::AddVoters(add), true)
                    .await
            } else {
                let cond = Precondition::LastMembershipLogId {
                    last_membership_log_id: after,
                };
                raft.append_membership(proposed, PayloadOf::<TypeConfig>::blank(), [cond])
                    .await
            };
            match &r {
                Ok(_) => tracing::info!(member = %format!("{id:x}"), "added voter: committed"),
                Err(e) => tracing::warn!(member = %format!("{id:x}"), "adding a voter: {e}"),
            }
            drop(one_at_a_time);
            let _ = done_tx.send(r);
        });
        let mut metrics = self.node.raft.metrics();
        let kept = metrics.wait_until(|m: &openraft::RaftMetrics<TypeConfig>| {
            kept_by_old_quorum(m, id, &old_voters, &observed)
        });
        let (done, kept) = (
            tokio::time::timeout(REQUEST_TIMEOUT, done),
            tokio::time::timeout(REQUEST_TIMEOUT, kept),
        );
        tokio::select! {
            r = done => match r {
                Ok(Ok(r)) => Ok(r.map_err(raft_err)?.membership),
                Ok(Err(_)) => Err(ApiError::Internal("membership change task ended".into())),
                Err(_) => Err(ApiError::Timeout),
            },
            // A joint configuration's first step is not this single-step entry: answered at
            // its commit only.
            r = kept, if !joint => match r {
                Ok(Ok(m)) => Ok(Some(m.membership_config.membership().clone())),
                Ok(Err(_)) => Err(ApiError::Stopped),
                Err(_) => Err(ApiError::Timeout),
            },
        }
    }

    async fn remove(&self, r: MemberRemoveRequest) -> Result<MemberRemoveResponse, ApiError> {
        let id = r.id;
        let m = self.membership();
        if m.get_node(&id).is_none() {
            return Err(ApiError::MemberNotFound);
        }
        let is_voter = m.voter_ids().any(|v| v == id);
        let change = if is_voter {
            let rest: BTreeSet<NodeId> = m.voter_ids().filter(|v| *v != id).collect();
            let started = rest
                .iter()
                .map(|v| self.started(*v))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .filter(|s| *s)
                .count();
            if started < quorum(rest.len()) {
                return Err(ApiError::NotEnoughStartedMembers);
            }
            // A member that is down is not part of the active quorum: removing it changes
            // nothing for the members still serving.
            let down = id != self.node.id && !self.links.active_for(id, Duration::ZERO);
            if !down && rest.iter().filter(|v| self.active(**v)).count() < quorum(rest.len()) {
                return Err(ApiError::Unhealthy);
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        tracing::info!(member = %format!("{id:x}"), voter = is_voter, "removing member");
        // Removing this member (the leader) is fine: once the change commits, openraft hands
        // leadership to another voter and this member's removal watch stops the process.
        let done = tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.node.raft.change_membership(change, false),
        )
        .await
        .map_err(|_| ApiError::Timeout)?;
        let membership = match done {
            Ok(resp) => resp.membership,
            // When this member removes itself, the removal watch may stop Raft between the
            // commit and openraft's answer ("raft stopped"); the committed membership then
            // says whether the change went through.
            Err(e) if id == self.node.id => {
                let committed = self
                    .node
                    .raft
                    .server_metrics()
                    .borrow_watched()
                    .committed_membership_config
                    .membership()
                    .clone();
                if committed.get_node(&id).is_some() {
                    return Err(raft_err(e));
                }
                Some(committed)
            }
            Err(e) => return Err(raft_err(e)),
        };
        if id != self.node.id {
            if let Some(node) = m.get_node(&id) {
                tokio::spawn(notify_removed(
                    self.node.clone(),
                    node.clone(),
                    self.cluster_id,
                    id,
                ));
            }
        }
        Ok(MemberRemoveResponse {
            header: None,
            members: self.header_members(membership.as_ref())?,
        })
    }

    async fn update(&self, r: MemberUpdateRequest) -> Result<MemberUpdateResponse, ApiError> {
        let m = self.membership();
        if m.get_node(&r.id).is_none() {
            return Err(ApiError::MemberNotFound);
        }
        if !valid_peer_urls(&r.peer_ur_ls) || !self.can_dial_all(&r.peer_ur_ls) {
            return Err(ApiError::BadMemberUrls);
        }
        if m.nodes()
            .any(|(id, n)| *id != r.id && n.peer_urls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(ApiError::PeerUrlsExist);
        }
        let node = Member {
            peer_urls: r.peer_ur_ls,
        };
        tracing::info!(member = %format!("{:x}", r.id), urls = %node, "updating member");
        let resp = tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.node.raft.change_membership(
                ChangeMembers::SetNodes(BTreeMap::from([(r.id, node)])),
                true,
            ),
        )
        .await
        .map_err(|_| ApiError::Timeout)?
        .map_err(raft_err)?;
        Ok(MemberUpdateResponse {
            header: None,
            members: self.header_members(resp.membership.as_ref())?,
        })
    }

    async fn promote(&self, r: MemberPromoteRequest) -> Result<MemberPromoteResponse, ApiError> {
        let id = r.id;
        let m = self.membership();
        if m.get_node(&id).is_none() {
            return Err(ApiError::MemberNotFound);
        }
        if m.voter_ids().any(|v| v == id) {
            return Err(ApiError::NotLearner);
        }
        let (matched, last) = {
            let metrics = self.node.raft.metrics();
            let metrics = metrics.borrow_watched();
            let matched = metrics
                .replication
                .as_ref()
                .and_then(|r| r.get(&id).cloned().flatten())
                .map_or(0, |l| l.index);
            (matched, metrics.last_log_index.unwrap_or(0))
        };
        if (matched as f64) < (last as f64) * LEARNER_READY {
            return Err(ApiError::LearnerNotReady);
        }
        let mut voters: BTreeSet<NodeId> = m.voter_ids().collect();
        voters.insert(id);
        self.check_quorum(&voters, Some((id, self.started(id)?)))?;
        tracing::info!(member = %format!("{id:x}"), matched, last, "promoting learner");
        let resp = tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.node
                .raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true),
        )
        .await
        .map_err(|_| ApiError::Timeout)?
        .map_err(raft_err)?;
        Ok(MemberPromoteResponse {
            header: None,
            members: self.header_members(resp.membership.as_ref())?,
        })
    }

    /// MoveLeader: served by the leader only, as etcd (clients find the leader themselves).
    /// Returns once the target leads, or fails after the request timeout.
    pub async fn move_leader(&self, target: NodeId) -> Result<(), ApiError> {
        let m = self.node.raft.metrics().borrow_watched().clone();
        if m.current_leader != Some(self.node.id) {
            return Err(ApiError::NotLeader);
        }
        if !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == target)
        {
            return Err(ApiError::BadLeaderTransferee);
        }
        if target == self.node.id {
            return Ok(());
        }
        tracing::info!(to = %format!("{target:x}"), "moving leadership");
        self.node
            .raft
            .trigger()
            .transfer_leader(target)
            .await
            .map_err(|_| ApiError::Stopped)?;
        let mut rx = self.node.raft.metrics();
        tokio::time::timeout(
            REQUEST_TIMEOUT,
            rx.wait_until(|m: &openraft::RaftMetrics<crate::raft::TypeConfig>| {
                m.current_leader == Some(target)
            }),
        )
        .await
        .map_err(|_| ApiError::LeaderTransferTimeout)?
        .map_err(|_| ApiError::Stopped)?;
        Ok(())
    }
}

/// Whether the leader whose metrics are `m` holds a configuration newer than `before` with
/// `id` as a voter, and a quorum of `old_voters` (the leader included, once flushed) has the
/// entry that made it: then no leader can be elected without it (see the module doc).
fn kept_by_old_quorum(
    m: &openraft::RaftMetrics<TypeConfig>,
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

/// Tells a removed member it is out: replication to it stopped when its removal was proposed,
/// so it may never see the commit itself. Best effort; a member that is down learns nothing.
async fn notify_removed(node: RaftNode, target: Member, cluster_id: u64, member_id: NodeId) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if let Ok(mut c) = node.channels.peer(&target) {
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

/// Resolves when this member learns it has been removed: from the leader's notice, or from a
/// committed configuration without it. `was_member` is whether this member knows it belonged to
/// the cluster; a joining member replays configurations from before it was added, which must
/// not count as a removal.
pub async fn removed(
    node: RaftNode,
    mut was_member: bool,
    mut notice: tokio::sync::watch::Receiver<bool>,
) {
    // Server metrics change with term, leader and membership only; the full metrics change on
    // every append and apply, which woke this task several times per write.
    let mut rx = node.raft.server_metrics();
    loop {
        {
            let m = rx.borrow_watched();
            let committed = &m.committed_membership_config;
            if committed.membership().get_node(&node.id).is_some() {
                was_member = true;
            } else if was_member && committed.log_id().is_some() {
                return;
            }
        }
        tokio::select! {
            r = rx.changed() => if r.is_err() { std::future::pending::<()>().await },
            r = notice.wait_for(|r| *r) => if r.is_ok() { return } else { std::future::pending::<()>().await },
        }
    }
}
