//! The etcd v3 Lease service, and the leader's lease duties.
//!
//! Grants and revokes are replicated writes. Expiry is the leader's alone: keep-alives and
//! time-to-live queries are answered from the leader's in-memory [`Lessor`] (a follower
//! forwards them over the peer protocol), and a task on the leader proposes the revokes of
//! leases whose time is up, in batches (one `LeaseRevokeMany` entry each), one at a time.
//!
//! Invariants:
//! - The lessor is primary exactly while Raft metrics name this member leader; promotion
//!   happens with the election timeout as grace (see [`crate::raft::sm::lessor`]).
//! - A server-chosen lease id is chosen before proposing, so all members apply the same id;
//!   the TTL in the log is already raised to the minimum.

use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::AuthInfo;
use crate::proto::etcdserverpb::lease_server::Lease;
use crate::proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use crate::proto::kvdpb::internal_request::Request as In;
use crate::proto::kvdpb::internal_response::Response as Out;
use crate::proto::kvdpb::{InternalRequest, LeaseRevokeManyRequest};
use crate::raft::limits::REQUEST_TIMEOUT;
use crate::raft::net::peer_error;
use crate::raft::sm::lessor::Lookup;
use crate::raft::RaftNode;
use crate::server::api::request_path::{self, Caller};
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;

/// How often the leader looks for expired leases (etcd checks every 500ms).
const EXPIRY_CHECK: Duration = Duration::from_millis(500);
/// Most expired leases revoked by one log entry. The entry's apply scans the live keys once
/// for all of them (not once per lease), so a batch costs about one revoke.
const REVOKE_BATCH: usize = 500;
/// Pause between two revoke batches: a storm is revoked at up to `REVOKE_BATCH` per (apply
/// time + pause), at most 5,000 leases/s (etcd: 1,000/s), with room for client writes.
const REVOKE_PAUSE: Duration = Duration::from_millis(100);

/// Leader side of a keep-alive: the lease's TTL, 0 for an unknown or expired lease.
pub fn keep_alive_local(node: &RaftNode, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
    let ttl = match node.lessor().renew(id) {
        Lookup::Found(ttl) => ttl,
        Lookup::NotFound => 0,
        Lookup::NotPrimary => return Err(peer_error::not_leader()),
    };
    Ok(LeaseKeepAliveResponse {
        header: None,
        id,
        ttl,
    })
}

/// Leader side of a time-to-live query: TTL -1 for an unknown lease, as etcd answers.
pub fn time_to_live_local(
    node: &RaftNode,
    req: &LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, Status> {
    let id = req.id;
    let (granted, left) = match node.lessor().time_to_live(id) {
        Lookup::Found(t) => t,
        Lookup::NotFound => {
            return Ok(LeaseTimeToLiveResponse {
                id,
                ttl: -1,
                ..Default::default()
            })
        }
        Lookup::NotPrimary => return Err(peer_error::not_leader()),
    };
    let keys = if req.keys {
        node.store().lease_keys(id)
    } else {
        Vec::new()
    };
    Ok(LeaseTimeToLiveResponse {
        header: None,
        id,
        ttl: left,
        granted_ttl: granted,
        keys,
    })
}

/// Runs `local` on the leader (here, or on the leader through `remote`), retrying while
/// leadership is moving, until [`REQUEST_TIMEOUT`].
async fn on_leader<T, L, R, F>(node: &RaftNode, local: L, remote: R) -> Result<T, ApiError>
where
    L: Fn() -> Result<T, Status>,
    R: Fn(crate::raft::Member) -> F,
    F: std::future::Future<Output = Result<T, Status>>,
{
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    loop {
        let (leader, member) = node.wait_leader(deadline).await?;
        let res = if leader == node.id {
            local()
        } else {
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::timeout(left, remote(member))
                .await
                .map_err(|_| ApiError::Timeout)?
        };
        match res {
            Ok(v) => return Ok(v),
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unavailable | tonic::Code::FailedPrecondition
                ) =>
            {
                if Instant::now() >= deadline {
                    return Err(ApiError::Timeout);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => return Err(ApiError::from_peer(&s)),
        }
    }
}

async fn keep_alive(node: &RaftNode, id: i64) -> Result<LeaseKeepAliveResponse, ApiError> {
    on_leader(
        node,
        || keep_alive_local(node, id),
        |m| async move {
            let mut c = node.peer(&m).map_err(Status::unavailable)?;
            Ok(c.lease_keep_alive(LeaseKeepAliveRequest { id })
                .await?
                .into_inner())
        },
    )
    .await
}

pub struct LeaseService {
    pub ctx: ServerCtx,
}

impl LeaseService {
    async fn write(&self, ai: Option<&AuthInfo>, req: In) -> Result<Out, ApiError> {
        self.ctx
            .propose_as(
                InternalRequest {
                    request: Some(req),
                    ..Default::default()
                },
                ai,
            )
            .await
    }

    /// etcd's lease checks at the API layer (see `AuthStore::check_lease`).
    fn check_lease(&self, ai: Option<&AuthInfo>, id: i64, write: bool) -> Result<(), ApiError> {
        let auth = self.ctx.node.auth();
        if !auth.is_enabled() {
            return Ok(());
        }
        let keys = self.ctx.node.store().lease_keys(id);
        Ok(auth.check_lease(ai, &keys, write)?)
    }
}

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let (md, ext, r) = req.into_parts();
        let resp = request_path::lease_grant(&self.ctx, Caller::Call(&md, &ext), r).await?;
        Ok(Response::new(resp))
    }

    async fn lease_revoke(
        &self,
        req: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let ai = self.ctx.auth_info(req.metadata(), req.extensions()).await?;
        let r = req.into_inner();
        self.check_lease(ai.as_ref(), r.id, true)?;
        match self.write(ai.as_ref(), In::LeaseRevoke(r)).await? {
            Out::LeaseRevoke(mut r) => {
                r.header = self.ctx.header(self.ctx.current_revision());
                Ok(Response::new(r))
            }
            _ => Err(ApiError::Internal("unexpected apply result".into()).into()),
        }
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let mut input = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            while let Some(Ok(r)) = input.next().await {
                let out = keep_alive(&ctx.node, r.id).await.map(|mut resp| {
                    resp.header = ctx.header(ctx.current_revision());
                    resp
                });
                let failed = out.is_err();
                if tx.send(out.map_err(Status::from)).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let ai = self.ctx.auth_info(req.metadata(), req.extensions()).await?;
        let mut r = req.into_inner();
        // The permission check is on the keys the leader answers with, not on this member's
        // view of the lease (which may lag): with auth on, the keys are always asked for.
        let auth_on = self.ctx.node.auth().is_enabled();
        let wanted_keys = r.keys;
        r.keys |= auth_on;
        let node = &self.ctx.node;
        let mut resp = on_leader(
            node,
            || time_to_live_local(node, &r),
            |m| async move {
                let mut c = node.peer(&m).map_err(Status::unavailable)?;
                Ok(c.lease_time_to_live(r).await?.into_inner())
            },
        )
        .await?;
        if auth_on {
            self.ctx
                .node
                .auth()
                .check_lease(ai.as_ref(), &resp.keys, false)
                .map_err(ApiError::from)?;
        }
        if !wanted_keys {
            resp.keys.clear();
        }
        resp.header = self.ctx.header(self.ctx.current_revision());
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        req: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let leases = self
            .ctx
            .node
            .leases()
            .await
            .map_err(ApiError::from)?
            .into_iter()
            .map(|(id, _)| LeaseStatus { id })
            .collect();
        Ok(Response::new(LeaseLeasesResponse {
            header: self.ctx.header(self.ctx.current_revision()),
            leases,
        }))
    }
}

/// Keeps the lessor primary exactly while this member leads, and while it does, revokes
/// expired leases in paced batches. Runs until the Raft node shuts down.
pub async fn lessor_duties(node: RaftNode) {
    tokio::select! {
        () = follow_leadership(&node) => {}
        () = revoke_expired(&node) => {}
    }
}

/// Promotes and demotes the lessor with this member's leadership; returns when the Raft node
/// shuts down.
async fn follow_leadership(node: &RaftNode) {
    let lessor = &node.lessor();
    // Server metrics (term, leader, state, membership) rather than the full metrics, which change
    // on every append and apply.
    let mut leadership = node.watch_leadership();
    loop {
        let leading = leadership.leading();
        if leading && !lessor.is_primary() {
            let mvcc = &node.store();
            match lessor.promote_with(|| mvcc.leases(), node.election_timeout) {
                Ok(()) => tracing::info!("became lease primary"),
                Err(e) => tracing::error!("cannot load leases: {e}"),
            }
        } else if !leading && lessor.is_primary() {
            lessor.demote();
            tracing::info!("no longer lease primary");
        }
        // Also on a timer: a promotion that failed to load the leases is retried.
        tokio::select! {
            up = leadership.changed() => if !up { lessor.demote(); return },
            () = tokio::time::sleep(EXPIRY_CHECK) => {}
        }
    }
}

/// Proposes the revokes of `ids`: one `LeaseRevokeMany` entry, or, while some member cannot
/// apply that (the cluster's log format is older), one `LeaseRevoke` entry per lease, in
/// order, as root (etcd's lessor revokes with root's identity too).
async fn propose_revokes(node: &RaftNode, ids: Vec<i64>) -> Result<(), crate::raft::ProposeError> {
    let many = InternalRequest {
        request: Some(In::LeaseRevokeMany(LeaseRevokeManyRequest { ids })),
        ..Default::default()
    };
    if node.format_allows(crate::raft::log_format::of_kind(&many)) {
        return node.propose(many).await.map(|_| ());
    }
    let Some(In::LeaseRevokeMany(LeaseRevokeManyRequest { ids })) = many.request else {
        unreachable!("built above")
    };
    let auth = node.auth();
    let (username, auth_revision) = if auth.is_enabled() {
        (crate::auth::ROOT.to_string(), auth.revision())
    } else {
        (String::new(), 0)
    };
    for id in ids {
        // A lease revoked meanwhile is answered "not found" in the response: nothing to do.
        node.propose(InternalRequest {
            request: Some(In::LeaseRevoke(LeaseRevokeRequest { id })),
            username: username.clone(),
            auth_revision,
            ..Default::default()
        })
        .await?;
    }
    Ok(())
}

/// Proposes the revokes of expired leases, [`REVOKE_BATCH`] per entry, one entry at a time,
/// [`REVOKE_PAUSE`] apart. One batch in flight bounds what a storm adds to the log and to
/// memory, and client writes queue behind at most one batch.
async fn revoke_expired(node: &RaftNode) {
    let lessor = &node.lessor();
    // (start, leases revoked) of a storm: a run of full batches, summarised when it ends.
    let mut storm: Option<(Instant, usize)> = None;
    let mut failed_batches = 0usize;
    loop {
        // Every member refuses revokes while CORRUPT is active (etcd's corrupt applier):
        // proposing them would only fill the log with refusals.
        let corrupt = node
            .alarms()
            .is_active(crate::proto::etcdserverpb::AlarmType::Corrupt);
        let ids = if corrupt {
            Vec::new()
        } else {
            lessor.expired(REVOKE_BATCH)
        };
        if ids.is_empty() {
            tokio::time::sleep(EXPIRY_CHECK).await;
            continue;
        }
        let n = ids.len();
        match propose_revokes(node, ids).await {
            Ok(_) => {
                if failed_batches > 0 {
                    tracing::info!(failed_batches, "revoking expired leases works again");
                    failed_batches = 0;
                }
                if n == REVOKE_BATCH && storm.is_none() {
                    storm = Some((Instant::now(), 0));
                    tracing::info!("many leases expired at once: revoking in paced batches");
                }
                match storm.as_mut() {
                    Some((_, total)) => *total += n,
                    None => tracing::debug!(leases = n, "expired leases revoked"),
                }
                if n < REVOKE_BATCH {
                    if let Some((start, total)) = storm.take() {
                        let secs = format!("{:.1}", start.elapsed().as_secs_f64());
                        tracing::info!(leases = total, secs, "expired leases revoked");
                    }
                }
            }
            // Retried after `REVOKE_RETRY`; one line per outage, not per batch.
            Err(e) => {
                if failed_batches == 0 {
                    tracing::warn!(leases = n, "revoking expired leases: {e}; will retry");
                }
                failed_batches += 1;
            }
        }
        tokio::time::sleep(REVOKE_PAUSE).await;
    }
}
