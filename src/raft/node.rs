//! One member's Raft node and the two things every client request needs from it: proposing a
//! write (locally on the leader, forwarded to the leader otherwise) and a linearizable read
//! barrier (read index, obtained from the leader when this member is a follower).
//!
//! Invariants:
//! - A write acknowledged by this member has been applied by this member, even when the leader
//!   applied it: the forwarding member waits for its own apply of the returned log index, so a
//!   client reads its own write (serializably too) on the member it wrote through, as with etcd.
//! - A linearizable read is served only after this member has applied the leader's commit
//!   index as confirmed by a quorum at the time of the request.
//! - A write is proposed again (to the same or a new leader) only when it provably never
//!   entered any log: openraft refused it before appending (`ForwardToLeader`), the leader
//!   answered "not leader", or the connection to the leader could not be made. Any other
//!   failure may leave the entry in a log that still commits, so it ends the request with
//!   etcd's "leader changed" or "request timed out" (outcome unknown), as etcd does; a retry
//!   there would apply one client request twice.

use openraft::async_runtime::WatchReceiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use openraft::raft::ReadPolicy;
use prost::Message;

use crate::proto::kvdpb::{ErrorCode, InternalRequest, InternalResponse, ReadIndexRequest};
use crate::raft::cluster_format::PeerFormats;
pub use crate::raft::error::ProposeError;
use crate::raft::log::log_store::LogStore;
use crate::raft::log_format;
use crate::raft::net::commit_hold::CommitWaits;
use crate::raft::net::forward_batch::{ForwardError, Forwarder};
use crate::raft::net::network::Channels;
use crate::raft::net::peer_error::{self, PeerFailure};
use crate::raft::read_batch::Coalescer;
use crate::raft::sm::state_machine::StateMachine;
use crate::raft::types::{Command, CommandResult, Member, NodeId, TypeConfig};
use crate::sync::LockExt;

use crate::raft::limits::REQUEST_TIMEOUT;

/// openraft's node over kvd's types and state machine.
pub type Raft = openraft::Raft<TypeConfig, StateMachine>;

/// How long a request that needs a newer log format than the cluster's waits for the leader
/// to raise it (it does within about a second of hearing every member) before it is refused.
const FORMAT_GRACE: Duration = Duration::from_secs(3);

/// A member's Raft node with its storage.
#[derive(Clone)]
pub struct RaftNode {
    pub id: NodeId,
    pub(super) raft: Raft,
    pub(super) sm: StateMachine,
    pub(super) log: LogStore,
    pub(super) channels: Channels,
    /// Last time the leader reached this member (appends and heartbeats), for `has_leader`.
    pub(super) leader_contact: Arc<Mutex<Instant>>,
    pub election_timeout: Duration,
    /// Shared read-index rounds for linearizable reads.
    pub(super) reads: Coalescer<u64, ProposeError>,
    /// Commit indexes followers wait for (their forwarded writes and read indexes), which the
    /// replication streams send without holding them (`crate::raft::net::commit_hold`).
    pub(super) commit_waits: CommitWaits,
    /// Writes this member forwards to the leader, sent in batches under load.
    pub(super) forwarder: Forwarder,
    /// The log format each peer applies, as the prober hears it.
    pub(super) formats: PeerFormats,
    /// True once the member stops ([`Self::begin_stop`]): the peer service then answers
    /// "stopping" and ends its append streams instead of calling into a core that is going
    /// away (openraft logs such a call as an error).
    pub(super) stopping: Arc<tokio::sync::watch::Sender<bool>>,
    /// Append streams from a leader being served: Raft stops once they ended (or after a
    /// short wait), so none is cut off inside openraft.
    pub(super) open_streams: Arc<tokio::sync::watch::Sender<usize>>,
    /// Per-peer link health, shared with the network and the prober.
    pub(super) links: crate::raft::net::links::Links,
}

impl RaftNode {
    /// Current leader id and its member record, if known.
    pub fn leader(&self) -> Option<(NodeId, Member)> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let id = m.current_leader?;
        let node = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, node))
    }

    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow_watched().current_term
    }

    /// Whether this member currently has a live leader, as etcd's "no leader" check means it:
    /// a leader that has heard from a quorum recently, or a follower that has heard from its
    /// leader within an election timeout (openraft keeps naming the last leader otherwise).
    pub fn has_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let limit = 2 * self.election_timeout;
        match m.current_leader {
            None => false,
            Some(l) if l == self.id => {
                m.membership_config.membership().voter_ids().count() == 1
                    || m.last_quorum_acked
                        .is_some_and(|t| openraft::Instant::elapsed(&t.into_inner()) <= limit)
            }
            Some(_) => self.leader_contact.lock_or_recover().elapsed() <= limit,
        }
    }

    /// Whether this member is a learner of the configuration it knows.
    pub fn is_learner(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let c = m.membership_config.membership();
        // Every client request asks: the configs themselves, not `voter_ids`, which
        // collects them into a new set.
        c.get_node(&self.id).is_some() && !c.get_joint_config().iter().any(|v| v.contains(&self.id))
    }

    /// Whether this member leads (what [`Self::leader`] would name it), without copying its
    /// member record as `leader` does: the common case of every write on the leader.
    fn leads(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        m.current_leader == Some(self.id)
            && m.membership_config
                .membership()
                .get_node(&self.id)
                .is_some()
    }

    /// Called by the peer service whenever the leader's append or heartbeat arrives.
    pub fn touch_leader(&self) {
        *self.leader_contact.lock_or_recover() = Instant::now();
    }

    /// Waits (until `deadline`) for a leader to be known.
    pub async fn wait_leader(&self, deadline: Instant) -> Result<(NodeId, Member), ProposeError> {
        let mut rx = self.raft.metrics();
        loop {
            if let Some(l) = self.leader() {
                return Ok(l);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ProposeError::NoLeader);
            }
            match tokio::time::timeout(left, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(ProposeError::Stopped),
                Err(_) => return Err(ProposeError::NoLeader),
            }
        }
    }

    /// Replicates `req` and returns what applying it produced, once this member has applied it.
    pub async fn propose(&self, req: InternalRequest) -> Result<InternalResponse, ProposeError> {
        use crate::metrics::{PROPOSALS_FAILED, PROPOSALS_PENDING};
        use std::sync::atomic::Ordering::Relaxed;
        // A guard, so a caller that drops the future (client went away) still decrements.
        struct InFlight;
        impl Drop for InFlight {
            fn drop(&mut self) {
                PROPOSALS_PENDING.fetch_sub(1, Relaxed);
            }
        }
        PROPOSALS_PENDING.fetch_add(1, Relaxed);
        let _in_flight = InFlight;
        let r = match self.admit(req).await {
            Ok(req) => self.propose_inner(req).await,
            Err(e) => Err(e),
        };
        if r.is_err() {
            PROPOSALS_FAILED.fetch_add(1, Relaxed);
        }
        r
    }

    /// Replicates a request the caller has admitted itself (the cluster format's own raise).
    pub(super) async fn propose_unchecked(
        &self,
        req: InternalRequest,
    ) -> Result<InternalResponse, ProposeError> {
        self.propose_inner(req).await
    }

    /// A request may enter the log only if every member can apply it: it is marked with the
    /// log format it needs, which must not be newer than the cluster's. A cluster that is
    /// still raising its format (a new cluster's first second) is given a moment.
    async fn admit(&self, mut req: InternalRequest) -> Result<InternalRequest, ProposeError> {
        if let Some(why) = self.sm.needs_upgrade() {
            return Err(ProposeError::NeedsUpgrade(why.to_string()));
        }
        log_format::mark(&mut req);
        let needed = log_format::needed(&req);
        let until = Instant::now() + FORMAT_GRACE;
        while needed > self.sm.cluster_format() {
            if Instant::now() >= until {
                return Err(self.format_refusal(needed));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(req)
    }

    /// Whether the cluster's log format allows entries of format `needed` now.
    pub fn format_allows(&self, needed: u32) -> bool {
        needed <= self.sm.cluster_format()
    }

    fn format_refusal(&self, needed: u32) -> ProposeError {
        let behind = self.formats.behind(self, needed);
        let who = if behind.is_empty() {
            "some member".to_string()
        } else {
            format!("member(s) {}", behind.join(", "))
        };
        // A member that is down reports nothing, as a build that predates formats does.
        ProposeError::ClusterFormat(format!(
            "kvd: this request needs every member to apply log format {needed}, and the \
             cluster's log format is {}: {who} did not report it (down, or running a kvd \
             older than {}); start or upgrade them and retry",
            self.sm.cluster_format(),
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn propose_inner(&self, req: InternalRequest) -> Result<InternalResponse, ProposeError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let cmd = Command(Bytes::from(req.encode_to_vec()));
        loop {
            let attempt = if self.leads() {
                let left = deadline.saturating_duration_since(Instant::now());
                self.write_local(cmd.clone(), left).await
            } else {
                let (leader, member) = self.wait_leader(deadline).await?;
                let left = deadline.saturating_duration_since(Instant::now());
                if leader == self.id {
                    self.write_local(cmd.clone(), left).await
                } else {
                    self.write_forwarded(&member, &req, left).await
                }
            };
            match attempt {
                Ok((resp, index)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::timeout(left, self.sm.wait_applied(index))
                        .await
                        .map_err(|_| ProposeError::Timeout)?;
                    return Ok(resp);
                }
                // Leadership moved while we were asking: look again.
                Err(Retry::Again) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(Retry::Again) => return Err(ProposeError::Timeout),
                Err(Retry::Fail(e)) => return Err(e),
            }
        }
    }

    async fn write_local(
        &self,
        cmd: Command,
        left: Duration,
    ) -> Result<(InternalResponse, u64), Retry> {
        // A stopping member lets go of the call (etcd answers "server stopped" too); the
        // entry may still commit, as after any Stopped answer.
        let r = self
            .unless_stopping(tokio::time::timeout(left, self.raft.client_write(cmd)))
            .await
            .ok_or(Retry::Fail(ProposeError::Stopped))?
            .map_err(|_| Retry::Fail(ProposeError::Timeout))?;
        use openraft::error::RaftError;
        match r {
            Ok(resp) => written(Ok((resp.data, resp.log_id.index))),
            Err(RaftError::APIError(e)) => written(Err(e)),
            Err(e) => Err(Retry::Fail(ProposeError::Internal(e.to_string()))),
        }
    }

    async fn write_forwarded(
        &self,
        leader: &Member,
        req: &InternalRequest,
        left: Duration,
    ) -> Result<(InternalResponse, u64), Retry> {
        let call = self.forwarder.forward(leader, req.clone());
        match tokio::time::timeout(left, call).await {
            Err(_) => Err(Retry::Fail(ProposeError::Timeout)),
            Ok(Ok(r)) => {
                let resp = r.response.ok_or(Retry::Fail(ProposeError::Internal(
                    "empty forward reply".into(),
                )))?;
                Ok((resp, r.log_index))
            }
            Ok(Err(ForwardError::BadLeaderUrl(e))) => Err(Retry::Fail(ProposeError::Internal(e))),
            Ok(Err(ForwardError::Status(s))) => Err(Self::forward_failed(&s)),
        }
    }

    /// What a forwarded write's error status means for the request, by the kind the leader
    /// sent and the status's transport cause.
    fn forward_failed(s: &tonic::Status) -> Retry {
        let kind = peer_error::kind_of(s);
        let failure = PeerFailure::of_status(s);
        // The member we took for the leader refused before appending, or could not be reached
        // at all: the request entered no log, so try the next leader. A member that sends no
        // kind answers a forwarded write FailedPrecondition only for that refusal.
        let refused = kind == ErrorCode::NotLeader
            || (kind == ErrorCode::Unspecified
                && failure == PeerFailure::Status(tonic::Code::FailedPrecondition));
        if refused || failure.never_sent() {
            return Retry::Again;
        }
        if let Some(e) = ProposeError::of_kind(kind) {
            return Retry::Fail(e);
        }
        match failure {
            // The leader's own answer (it may have appended the entry).
            PeerFailure::Status(code) => {
                Retry::Fail(ProposeError::Leader(code, s.message().to_string()))
            }
            // The call broke on an established connection: the leader may have appended it.
            _ => {
                tracing::debug!("forwarded write failed, outcome unknown: {s}");
                Retry::Fail(ProposeError::Timeout)
            }
        }
    }

    /// Leader side of a forwarded write: proposes it here and answers with its response and
    /// the log index it was applied at.
    pub async fn propose_forwarded(
        &self,
        mut req: InternalRequest,
    ) -> Result<(InternalResponse, u64), tonic::Status> {
        // Checked by the forwarding member too, unless it is older than log formats.
        log_format::mark(&mut req);
        let needed = log_format::needed(&req);
        if !self.format_allows(needed) {
            return Err(Retry::into_peer_status(Retry::Fail(
                self.format_refusal(needed),
            )));
        }
        let cmd = Command(Bytes::from(req.encode_to_vec()));
        self.write_local(cmd, REQUEST_TIMEOUT)
            .await
            .map_err(Retry::into_peer_status)
    }

    /// Leader side of a batch of forwarded writes: proposes them together and yields each
    /// one's outcome in request order, as [`Self::propose_forwarded`] would answer it. The
    /// stream ends early only if Raft stops or the batch outlives [`REQUEST_TIMEOUT`].
    pub async fn propose_forwarded_many(
        &self,
        reqs: Vec<InternalRequest>,
    ) -> Result<
        impl futures::Stream<Item = Result<(InternalResponse, u64), tonic::Status>> + Send + 'static,
        tonic::Status,
    > {
        use futures::StreamExt;
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        let cmds: Vec<Command> = reqs
            .iter()
            .map(|r| Command(Bytes::from(r.encode_to_vec())))
            .collect();
        let results = self
            .raft
            .client_write_many(cmds)
            .await
            .map_err(|_| Retry::into_peer_status(Retry::Fail(ProposeError::Stopped)))?;
        let answered = futures::stream::unfold(Some(results), move |results| async move {
            let mut results = results?;
            let next = tokio::time::timeout_at(deadline, results.next()).await;
            let item = match next {
                Ok(Some(Ok(r))) => written(r.map(|w| (w.response, w.log_id.index)))
                    .map_err(Retry::into_peer_status),
                // Raft stopped (the rest will not be answered) or the batch took too long:
                // one error, then the end; the follower gives the rest up as unknown.
                Ok(Some(Err(_))) => {
                    return Some((
                        Err(Retry::into_peer_status(Retry::Fail(ProposeError::Stopped))),
                        None,
                    ))
                }
                Ok(None) => return None,
                Err(_) => {
                    return Some((
                        Err(Retry::into_peer_status(Retry::Fail(ProposeError::Timeout))),
                        None,
                    ))
                }
            };
            Some((item, Some(results)))
        });
        Ok(answered)
    }

    /// The leader's read index (leader side of ReadIndex): confirms leadership with a quorum.
    pub async fn local_read_index(&self) -> Result<u64, tonic::Status> {
        let read = self.raft.get_read_log_id(ReadPolicy::ReadIndex);
        match self
            .unless_stopping(read)
            .await
            .ok_or_else(peer_error::stopping)?
        {
            Ok((read, _)) => Ok(read.index()),
            Err(e) if e.forward_to_leader().is_some() => Err(peer_error::not_leader()),
            Err(e) => Err(tonic::Status::unavailable(e.to_string())),
        }
    }

    /// Blocks until a linearizable read may be served from this member's state machine.
    /// Concurrent callers share read-index rounds (see [`crate::raft::read_batch`]).
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        if let Some(why) = self.sm.needs_upgrade() {
            return Err(ProposeError::NeedsUpgrade(why.to_string()));
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let node = self.clone();
        let index = tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.reads.get(
                move || node.clone().read_index_round(),
                ProposeError::Stopped,
            ),
        )
        .await
        .inspect_err(|_| crate::metrics::SLOW_READ_INDEXES.inc())
        .map_err(|_| ProposeError::Timeout)?
        .inspect_err(|_| crate::metrics::READ_INDEXES_FAILED.inc())?;
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left, self.sm.wait_applied(index))
            .await
            .map_err(|_| ProposeError::Timeout)
    }

    /// One read-index round: the leader's commit index, confirmed by a quorum now.
    async fn read_index_round(self) -> Result<u64, ProposeError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            if self.is_stopping() {
                return Err(ProposeError::Stopped);
            }
            let (leader, member) = self.wait_leader(deadline).await?;
            let left = deadline.saturating_duration_since(Instant::now());
            let index = if leader == self.id {
                tokio::time::timeout(left, self.local_read_index()).await
            } else {
                let mut client = self
                    .channels
                    .peer(&member)
                    .map_err(ProposeError::Internal)?;
                tokio::time::timeout(left, async move {
                    client
                        .read_index(ReadIndexRequest {})
                        .await
                        .map(|r| r.into_inner().read_index)
                })
                .await
            };
            match index {
                Err(_) => return Err(ProposeError::Timeout),
                Ok(Ok(index)) => return Ok(index),
                Ok(Err(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Err(_)) => return Err(ProposeError::Timeout),
            }
        }
    }
}

enum Retry {
    Again,
    Fail(ProposeError),
}

impl Retry {
    /// The leader's answer to a forwarded write that failed: "not leader" when it may be sent
    /// again, else etcd's message and its kind, which the forwarding member passes on and never
    /// retries.
    fn into_peer_status(self) -> tonic::Status {
        match self {
            Retry::Again => peer_error::not_leader(),
            Retry::Fail(e) => {
                peer_error::status_of_kind(tonic::Code::Unavailable, e.to_string(), e.kind())
            }
        }
    }
}

/// What a local proposal's outcome means for the request: its response and log index, or
/// whether it may be proposed again.
fn written(
    r: Result<
        (CommandResult, u64),
        openraft::error::ClientWriteError<crate::raft::types::TypeConfig>,
    >,
) -> Result<(InternalResponse, u64), Retry> {
    use openraft::error::ClientWriteError;
    match r {
        Ok((data, index)) => Ok((data.0, index)),
        // Refused before it was appended: safe to send to the leader.
        Err(ClientWriteError::ForwardToLeader(_)) => Err(Retry::Again),
        // Appended, then dropped from this log: it may still commit elsewhere.
        Err(ClientWriteError::LogEntryDiscarded(_)) => {
            Err(Retry::Fail(ProposeError::LeaderChanged))
        }
        Err(e) => Err(Retry::Fail(ProposeError::Internal(e.to_string()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader's answer to a forwarded write, as the forwarding member receives it.
    fn received(s: tonic::Status) -> tonic::Status {
        let mut h = http::HeaderMap::new();
        s.add_header(&mut h).unwrap();
        tonic::Status::from_header_map(&h).unwrap()
    }

    #[test]
    fn leader_answers_map_back_to_the_same_error() {
        for e in [
            ProposeError::NoLeader,
            ProposeError::Timeout,
            ProposeError::Stopped,
            ProposeError::LeaderChanged,
        ] {
            let s = received(peer_error::status_of_kind(
                tonic::Code::Unavailable,
                e.to_string(),
                e.kind(),
            ));
            match RaftNode::forward_failed(&s) {
                Retry::Fail(got) => assert_eq!(got, e),
                Retry::Again => panic!("{e:?} retried"),
            }
        }
        // A kind without a variant here: passed on as the leader sent it.
        let e = ProposeError::Internal("boom".into());
        let s = received(peer_error::status_of_kind(
            tonic::Code::Unavailable,
            e.to_string(),
            e.kind(),
        ));
        match RaftNode::forward_failed(&s) {
            Retry::Fail(got) => assert_eq!(
                got,
                ProposeError::Leader(tonic::Code::Unavailable, "etcdserver: boom".into())
            ),
            Retry::Again => panic!("retried"),
        }
    }

    #[test]
    fn refusals_before_appending_are_sent_again() {
        assert!(matches!(
            RaftNode::forward_failed(&received(peer_error::not_leader())),
            Retry::Again
        ));
        // From a member that sends no kind.
        assert!(matches!(
            RaftNode::forward_failed(&received(tonic::Status::failed_precondition("not leader"))),
            Retry::Again
        ));
        // Its other answers pass on unchanged, whatever their text.
        match RaftNode::forward_failed(&received(tonic::Status::unavailable(
            "etcdserver: leader changed",
        ))) {
            Retry::Fail(e) => assert_eq!(
                e,
                ProposeError::Leader(
                    tonic::Code::Unavailable,
                    "etcdserver: leader changed".into()
                )
            ),
            Retry::Again => panic!("retried"),
        }
    }
}
