//! The follower's half of forwarded writes: requests bound for the leader are sent together.
//!
//! Each leader (by peer URL) has a lane. A request joins its lane's queue; while fewer than
//! [`MAX_CALLS`] calls to that leader are in flight, a sender task takes everything queued (up
//! to [`BATCH_BYTES`], at least one request) and sends it: a lone request as a unary
//! `Peer.Forward`, several as one `Peer.ForwardMany`, whose outcomes stream back in request
//! order. Under load, requests that arrive while the calls are out go in the next call, so the
//! per-call costs on both members (an HTTP/2 stream, headers, a server task, a proposal) are
//! paid once per batch; with one client every request still goes at once, alone.
//!
//! Invariants:
//! - Every queued request gets exactly one answer: the leader's outcome, or the status of the
//!   call that carried it. A request whose outcome did not arrive from a call that was sent
//!   gets a status that says its outcome is unknown (never one that allows sending it again);
//!   `RaftNode::forward_failed` decides on retries from the status, as for the unary call.
//! - A leader that does not know `ForwardMany` (an older kvd, during a rolling upgrade) answers
//!   UNIMPLEMENTED and has proposed nothing: that batch's requests are answered "not leader",
//!   which sends them again, and the lane sends single `Forward` calls for [`RECHECK_MANY`]
//!   before it tries a batch again. The switch, and the switch back once the leader takes a
//!   batch, are each logged once.
//! - A sender task ends when its lane's queue is empty, and a call ends within
//!   [`CALL_TIMEOUT`], so a stuck leader holds a lane's slots for a bounded time.
//! - A lane exists only while it has requests or calls (or remembers an old leader), and its
//!   peer client is built when it is created: a leader URL that cannot be dialled fails the
//!   request before it is queued.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use tokio::sync::oneshot;

use tonic::transport::Channel;

use crate::proto::kvdpb::peer_client::PeerClient;
use crate::proto::kvdpb::{ForwardManyRequest, ForwardRequest, ForwardResponse, InternalRequest};
use crate::raft::limits::REQUEST_TIMEOUT;
use crate::raft::net::network::Channels;
use crate::raft::types::Member;
use crate::sync::LockExt;

/// Calls in flight to one leader at a time. More lets a request go sooner when the leader
/// answers slowly; fewer makes larger batches (the choice is measured in decision 0036).
pub const MAX_CALLS: usize = 8;

/// A batch ends once its requests reach this many encoded bytes (one request may exceed it
/// alone). Far under the peer message limit, which allows one maximal request and more.
pub const BATCH_BYTES: usize = 1 << 20;

/// Requests per batch at most (openraft appends a batch in one go).
pub const MAX_BATCH: usize = 256;

/// How long one call may take before its unanswered requests are given up as unknown. Each
/// caller's own deadline is shorter; this only frees the lane.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(REQUEST_TIMEOUT.as_secs() + 1);

/// How long a lane sends single calls after the leader said it has no `ForwardMany`.
pub const RECHECK_MANY: Duration = Duration::from_secs(60);

/// A forwarded request's answer: the leader's response and the log index it was applied at,
/// or the status that failed it (from the leader, or the call's own).
pub type Answer = Result<ForwardResponse, tonic::Status>;

/// Why [`Forwarder::forward`] has no answer from the leader.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The leader's peer URL cannot be dialled from here; nothing was sent.
    #[error("{0}")]
    BadLeaderUrl(String),
    /// The leader's error, or the call's own failure.
    #[error("{0}")]
    Status(tonic::Status),
}

struct Queued {
    req: InternalRequest,
    size: usize,
    tx: oneshot::Sender<Answer>,
}

struct Lane {
    client: PeerClient<Channel>,
    queue: VecDeque<Queued>,
    calls: usize,
    /// When the leader answered `ForwardMany` UNIMPLEMENTED; asked again after
    /// [`RECHECK_MANY`] (it may have been upgraded since).
    unary_since: Option<Instant>,
}

/// A member's forwarding lanes; clones share them.
#[derive(Clone)]
pub struct Forwarder {
    channels: Channels,
    lanes: Arc<Mutex<HashMap<String, Lane>>>,
}

impl Forwarder {
    pub fn new(channels: Channels) -> Self {
        Forwarder {
            channels,
            lanes: Default::default(),
        }
    }

    /// Sends `req` to `leader` with whatever else is queued for it, and waits for its answer.
    pub async fn forward(
        &self,
        leader: &Member,
        req: InternalRequest,
    ) -> Result<ForwardResponse, ForwardError> {
        let url = leader
            .peer_urls
            .first()
            .ok_or_else(|| ForwardError::BadLeaderUrl("the leader has no peer URL".into()))?
            .clone();
        let (tx, rx) = oneshot::channel();
        let size = req.encoded_len();
        let start = {
            let mut lanes = self.lanes.lock_or_recover();
            let lane = match lanes.entry(url.clone()) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(Lane {
                    client: self
                        .channels
                        .peer(leader)
                        .map_err(ForwardError::BadLeaderUrl)?,
                    queue: VecDeque::new(),
                    calls: 0,
                    unary_since: None,
                }),
            };
            lane.queue.push_back(Queued { req, size, tx });
            let start = lane.calls < MAX_CALLS;
            if start {
                lane.calls += 1;
            }
            start
        };
        if start {
            tokio::spawn(self.clone().send_queued(url));
        }
        // The sender dropped without answering only if its task was torn down mid-call.
        match rx.await {
            Ok(answer) => answer.map_err(ForwardError::Status),
            Err(_) => Err(ForwardError::Status(tonic::Status::cancelled(
                "forwarding stopped",
            ))),
        }
    }

    /// One of a lane's senders: calls until the queue is empty.
    async fn send_queued(self, url: String) {
        loop {
            let (client, batch, unary_only) = {
                let mut lanes = self.lanes.lock_or_recover();
                let Some(lane) = lanes.get_mut(&url) else {
                    return;
                };
                if lane.queue.is_empty() {
                    lane.calls -= 1;
                    if lane.calls == 0 && lane.unary_since.is_none() {
                        lanes.remove(&url);
                    }
                    return;
                }
                let unary_only = lane.unary_since.is_some_and(|t| t.elapsed() < RECHECK_MANY);
                (lane.client.clone(), take_batch(&mut lane.queue), unary_only)
            };
            let knows_many = call(client, batch, unary_only).await;
            let mut lanes = self.lanes.lock_or_recover();
            let Some(lane) = lanes.get_mut(&url) else {
                continue;
            };
            // Stated once per leader, at each change: during a rolling upgrade every batch
            // would otherwise say it again.
            match knows_many {
                Some(false) => {
                    if lane.unary_since.is_none() {
                        tracing::info!(
                            "leader {url} has no ForwardMany (an older kvd): forwarding one \
                             write per call, asking again every {} s",
                            RECHECK_MANY.as_secs()
                        );
                    }
                    lane.unary_since = Some(Instant::now());
                }
                Some(true) if lane.unary_since.take().is_some() => {
                    tracing::info!("leader {url} takes ForwardMany now: forwarding in batches");
                }
                _ => {}
            }
        }
    }
}

/// Sends one batch and answers each of its requests. Returns whether the leader knows
/// `ForwardMany` when the call showed it: `Some(false)` when it answered UNIMPLEMENTED (the
/// batch was then answered "not leader", to be sent again), `Some(true)` when it took the
/// batch, `None` for single calls and calls that failed before the leader answered.
async fn call(
    mut client: PeerClient<Channel>,
    batch: Vec<Queued>,
    unary_only: bool,
) -> Option<bool> {
    use crate::metrics::{FORWARDED_WRITES, FORWARD_CALLS};
    FORWARDED_WRITES.inc_by(batch.len() as u64);
    FORWARD_CALLS.inc_by(if unary_only { batch.len() } else { 1 } as u64);
    if batch.len() == 1 || unary_only {
        unary_each(&client, batch).await;
        return None;
    }
    let n = batch.len();
    let (reqs, mut waiters): (Vec<_>, VecDeque<_>) =
        batch.into_iter().map(|q| (q.req, q.tx)).unzip();
    let mut taken = false;
    let streamed = tokio::time::timeout(CALL_TIMEOUT, async {
        let mut outcomes = client
            .forward_many(ForwardManyRequest { requests: reqs })
            .await?
            .into_inner();
        taken = true;
        while let Some(o) = outcomes.message().await? {
            let Some(tx) = waiters.pop_front() else { break };
            let _ = tx.send(match o.applied {
                Some(r) => Ok(r),
                None => {
                    let kind = o.kind();
                    Err(crate::raft::net::peer_error::status_of_kind(
                        tonic::Code::from(o.code),
                        o.message,
                        kind,
                    ))
                }
            });
        }
        Ok::<_, tonic::Status>(())
    })
    .await;
    // What the requests still waiting get: the call's own failure, or (the call ended
    // without their outcomes) a status that leaves their outcome open.
    let s = match streamed {
        Ok(Ok(())) if waiters.is_empty() => return Some(true),
        Ok(Ok(())) => tonic::Status::cancelled("the leader ended a forwarded batch early"),
        Ok(Err(s)) => s,
        Err(_) => tonic::Status::deadline_exceeded("forwarded batch timed out"),
    };
    // The leader's own answer that it has no such call: it proposed none of them, so they
    // may be sent again, one at a time (the lane switches).
    let unsupported = waiters.len() == n
        && s.code() == tonic::Code::Unimplemented
        && crate::raft::net::peer_error::PeerFailure::of_status(&s)
            == crate::raft::net::peer_error::PeerFailure::Status(tonic::Code::Unimplemented);
    let s = if unsupported {
        crate::raft::net::peer_error::not_leader()
    } else {
        s
    };
    for tx in waiters {
        let _ = tx.send(Err(s.clone()));
    }
    match (unsupported, taken) {
        (true, _) => Some(false),
        (false, true) => Some(true),
        (false, false) => None,
    }
}

/// Each request as its own `Forward` call, concurrently.
async fn unary_each(client: &PeerClient<Channel>, batch: Vec<Queued>) {
    let calls = batch.into_iter().map(|q| async move {
        let mut client = client.clone();
        let call = client.forward(ForwardRequest {
            request: Some(q.req),
        });
        let answer = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(r) => r.map(|r| r.into_inner()),
            Err(_) => Err(tonic::Status::deadline_exceeded("forwarded write")),
        };
        let _ = q.tx.send(answer);
    });
    futures::future::join_all(calls).await;
}

/// The front of `queue` up to [`BATCH_BYTES`] and [`MAX_BATCH`] (at least one request).
fn take_batch(queue: &mut VecDeque<Queued>) -> Vec<Queued> {
    let mut bytes = 0;
    let mut batch = Vec::new();
    while let Some(q) = queue.front() {
        if !batch.is_empty() && (bytes + q.size > BATCH_BYTES || batch.len() >= MAX_BATCH) {
            break;
        }
        bytes += q.size;
        batch.extend(queue.pop_front());
    }
    batch
}

#[cfg(test)]
#[path = "forward_batch_tests.rs"]
mod tests;
