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
//! - A voter is added in one log entry and `member add` answers once that entry is durable
//!   on a quorum of the *old* voters, when etcd 3.4 answers too (`crate::raft::reconfigure`
//!   says why that is safe); the commit may need the new member itself (growing a one-member
//!   cluster to two), so it finishes in the background and the change lock is held until it
//!   does: the next change waits for it (or answers "request timed out", as etcd does while the
//!   added member it needs for a quorum has not started).
//! - What a client sees: an error or a timeout before that point means the member may or may
//!   not be added (the entry may be on the leader only, and is lost if that leader dies before
//!   replicating it; `member list` tells). A success means the member is in the configuration
//!   every member will have, started or not; if the leader dies right after answering, the
//!   next leader is elected under that configuration (for two voters: once the new member has
//!   started), exactly as with etcd.

pub(crate) mod check;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::OwnedMutexGuard;

use super::error::ApiError;
use super::membership::check::{admit_learner, admit_voters, quorum, Voter};
use crate::proto::etcdserverpb::{
    Member as EtcdMember, MemberAddRequest, MemberAddResponse, MemberPromoteRequest,
    MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest,
    MemberUpdateResponse,
};
use crate::proto::kvdpb::{membership_request, membership_response, MembershipRequest};
use crate::raft::limits::REQUEST_TIMEOUT;
use crate::raft::net::links::Links;
use crate::raft::net::peer_error::PeerFailure;
use crate::raft::types::Membership;
use crate::raft::{Member, NodeId, RaftNode, ReconfigError};
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
pub fn members_of(m: &Membership, node: &RaftNode) -> Result<Vec<EtcdMember>, ApiError> {
    let voters: BTreeSet<NodeId> = m.voter_ids().collect();
    let mut out = Vec::new();
    for (id, member) in m.nodes() {
        let attrs = node
            .member_attrs(*id)
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .unwrap_or_default();
        out.push(EtcdMember {
            id: *id,
            name: attrs.name,
            peer_ur_ls: member.peer_urls.clone(),
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

impl From<ReconfigError> for ApiError {
    fn from(e: ReconfigError) -> Self {
        match e {
            ReconfigError::NotLeader => ApiError::NotLeader,
            ReconfigError::LeaderChanged => ApiError::LeaderChanged,
            ReconfigError::Timeout => ApiError::Timeout,
            ReconfigError::Stopped => ApiError::Stopped,
            ReconfigError::Internal(s) => ApiError::Internal(s),
        }
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
        let mut c = self.node.peer(leader).map_err(ApiError::Internal)?;
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
        if !self.node.is_leader() {
            return Err(ApiError::NotLeader);
        }
        match req {
            Q::Add(r) => self.add(r, one_at_a_time).await.map(R::Add),
            Q::Remove(r) => self.remove(r).await.map(R::Remove),
            Q::Update(r) => self.update(r).await.map(R::Update),
            Q::Promote(r) => self.promote(r).await.map(R::Promote),
        }
    }

    fn started(&self, id: NodeId) -> Result<bool, ApiError> {
        Ok(self
            .node
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
            Some(m) => members_of(m, &self.node),
            None => members_of(&self.node.membership(), &self.node),
        }
    }

    /// A member never lets into the membership a peer URL it cannot dial: `https://` needs
    /// peer TLS on this member (and `unix://` is not dialed at all).
    fn can_dial_all(&self, urls: &[String]) -> bool {
        match urls.iter().find(|u| !self.node.can_dial(u)) {
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
        let m = self.node.membership();
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
            self.node.add_learner(id, node).await?
        } else {
            self.node.add_voter(id, node, one_at_a_time).await?
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

    async fn remove(&self, r: MemberRemoveRequest) -> Result<MemberRemoveResponse, ApiError> {
        let id = r.id;
        let m = self.node.membership();
        if m.get_node(&id).is_none() {
            return Err(ApiError::MemberNotFound);
        }
        let is_voter = m.voter_ids().any(|v| v == id);
        if is_voter {
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
        }
        tracing::info!(member = %format!("{id:x}"), voter = is_voter, "removing member");
        let membership = self.node.remove_member(id, is_voter).await?;
        if id != self.node.id {
            if let Some(node) = m.get_node(&id) {
                let (node, target, cluster_id) = (self.node.clone(), node.clone(), self.cluster_id);
                tokio::spawn(async move { node.notify_removed(target, cluster_id, id).await });
            }
        }
        Ok(MemberRemoveResponse {
            header: None,
            members: self.header_members(membership.as_ref())?,
        })
    }

    async fn update(&self, r: MemberUpdateRequest) -> Result<MemberUpdateResponse, ApiError> {
        let m = self.node.membership();
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
        let membership = self.node.update_member(r.id, node).await?;
        Ok(MemberUpdateResponse {
            header: None,
            members: self.header_members(membership.as_ref())?,
        })
    }

    async fn promote(&self, r: MemberPromoteRequest) -> Result<MemberPromoteResponse, ApiError> {
        let id = r.id;
        let m = self.node.membership();
        if m.get_node(&id).is_none() {
            return Err(ApiError::MemberNotFound);
        }
        if m.voter_ids().any(|v| v == id) {
            return Err(ApiError::NotLearner);
        }
        let (matched, last) = self.node.learner_progress(id);
        if (matched as f64) < (last as f64) * LEARNER_READY {
            return Err(ApiError::LearnerNotReady);
        }
        let mut voters: BTreeSet<NodeId> = m.voter_ids().collect();
        voters.insert(id);
        self.check_quorum(&voters, Some((id, self.started(id)?)))?;
        tracing::info!(member = %format!("{id:x}"), matched, last, "promoting learner");
        let membership = self.node.promote_learner(id).await?;
        Ok(MemberPromoteResponse {
            header: None,
            members: self.header_members(membership.as_ref())?,
        })
    }

    /// MoveLeader: served by the leader only, as etcd (clients find the leader themselves).
    /// Returns once the target leads, or fails after the request timeout.
    pub async fn move_leader(&self, target: NodeId) -> Result<(), ApiError> {
        let status = self.node.status();
        if status.leader != Some(self.node.id) {
            return Err(ApiError::NotLeader);
        }
        if !status.is_voter(target) {
            return Err(ApiError::BadLeaderTransferee);
        }
        if target == self.node.id {
            return Ok(());
        }
        tracing::info!(to = %format!("{target:x}"), "moving leadership");
        match self.node.transfer_leadership(target, REQUEST_TIMEOUT).await {
            Ok(()) => Ok(()),
            Err(ReconfigError::Timeout) => Err(ApiError::LeaderTransferTimeout),
            Err(e) => Err(e.into()),
        }
    }
}
