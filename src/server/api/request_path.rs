//! The one path a KV request or a lease grant takes, whoever makes it: the gRPC KV and Lease
//! services (and through them the JSON gateway) and the member's in-process client (Lock and
//! Election) all call these functions, so they validate, check permissions and quotas,
//! propose and answer alike.
//!
//! Invariants:
//! - A write is refused before it is proposed by exactly the checks etcd's gRPC layer makes:
//!   the backend quota first (etcd's quota layer wraps the KV and Lease servers), then
//!   `mvcc::check_*` and the lease TTL bound.
//!   Nothing enters the log that the apply would have to refuse for its shape.
//! - Permissions on a write are decided by the apply (at the auth revision the request was
//!   made at, which the proposal carries); on a read, after the read barrier, so a linearizable
//!   read is judged by the auth state of at least its read index.
//! - Every answer carries this member's header at the revision the store answered at.
//! - A lease id the member picks is picked before proposing, so every member applies the same
//!   id; the TTL in the log is already raised to the minimum.
//! - Require-leader and a stopped apply are the caller's to check first (etcd's interceptor
//!   runs before any of this).

use tonic::metadata::MetadataMap;

use crate::auth::AuthInfo;
use crate::mvcc;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse,
    LeaseGrantRequest, LeaseGrantResponse, PutRequest, PutResponse, RangeRequest, RangeResponse,
    ResponseHeader, TxnRequest, TxnResponse,
};
use crate::proto::kvdpb::internal_request::Request as In;
use crate::proto::kvdpb::internal_response::Response as Out;
use crate::proto::kvdpb::InternalRequest;
use crate::raft::sm::lessor::{min_ttl, MAX_LEASE_TTL};
use crate::server::api::learner;
use crate::server::context::ServerCtx;
use crate::server::duties::quota;
use crate::server::error::ApiError;

/// Who a request is made for.
#[derive(Clone, Copy)]
pub enum Caller<'a> {
    /// A client call's credentials (token metadata or verified certificate), resolved when
    /// the path needs them: for a read, after its barrier.
    Call(&'a MetadataMap, &'a http::Extensions),
    /// An in-process caller whose credentials were resolved when its call began.
    Resolved(Option<&'a AuthInfo>),
}

impl Caller<'_> {
    async fn resolve(self, ctx: &ServerCtx) -> Result<Option<AuthInfo>, ApiError> {
        match self {
            Caller::Call(md, ext) => ctx.auth_info(md, ext).await,
            Caller::Resolved(ai) => Ok(ai.cloned()),
        }
    }
}

/// A response with etcd's header.
trait Answer {
    fn header_mut(&mut self) -> &mut Option<ResponseHeader>;

    /// This member's header at the revision the store answered at (the store may have moved
    /// on since).
    fn stamp(mut self, ctx: &ServerCtx) -> Self
    where
        Self: Sized,
    {
        let h = self.header_mut();
        *h = ctx.header(h.map_or(0, |h| h.revision));
        self
    }
}

macro_rules! answer {
    ($($t:ty),*) => {$(
        impl Answer for $t {
            fn header_mut(&mut self) -> &mut Option<ResponseHeader> {
                &mut self.header
            }
        }
    )*};
}
answer!(
    RangeResponse,
    PutResponse,
    DeleteRangeResponse,
    TxnResponse,
    CompactionResponse
);

/// A range read: linearizable (a read-index round first) unless `serializable`.
pub async fn range(
    ctx: &ServerCtx,
    caller: Caller<'_>,
    r: RangeRequest,
) -> Result<RangeResponse, ApiError> {
    mvcc::check_range(&r)?;
    learner::refuse_linearizable_range(&ctx.node, r.serializable)?;
    if !r.serializable {
        ctx.node.read_barrier().await?;
    }
    // As etcd's doSerialize: credentials and permission after the barrier, so a role revoked
    // or a user deleted through another member before the read index counts.
    let ai = caller.resolve(ctx).await?;
    ctx.node
        .auth()
        .check_op(ai.as_ref(), &r.key, &r.range_end, false)?;
    Ok(ctx.node.range(&r).await?.stamp(ctx))
}

pub async fn put(
    ctx: &ServerCtx,
    caller: Caller<'_>,
    r: PutRequest,
) -> Result<PutResponse, ApiError> {
    ctx.quota.check(&ctx.node, quota::cost_put(&r)).await?;
    // Lease existence is checked when the put is applied: a check here could wrongly refuse
    // a lease granted through another member that this one has not applied yet.
    mvcc::check_put(&r)?;
    match write(ctx, caller, In::Put(r)).await? {
        Out::Put(p) => Ok(p.stamp(ctx)),
        _ => Err(unexpected()),
    }
}

pub async fn delete_range(
    ctx: &ServerCtx,
    caller: Caller<'_>,
    r: DeleteRangeRequest,
) -> Result<DeleteRangeResponse, ApiError> {
    mvcc::check_delete_range(&r)?;
    match write(ctx, caller, In::DeleteRange(r)).await? {
        Out::DeleteRange(d) => Ok(d.stamp(ctx)),
        _ => Err(unexpected()),
    }
}

pub async fn txn(
    ctx: &ServerCtx,
    caller: Caller<'_>,
    r: TxnRequest,
) -> Result<TxnResponse, ApiError> {
    ctx.quota.check(&ctx.node, quota::cost_txn(&r)).await?;
    mvcc::check_txn(&r, ctx.max_txn_ops)?;
    match write(ctx, caller, In::Txn(r)).await? {
        Out::Txn(t) => Ok(t.stamp(ctx)),
        _ => Err(unexpected()),
    }
}

/// A compaction; a physical one is answered once this member has deleted the compacted
/// records, as etcd answers it.
pub async fn compact(
    ctx: &ServerCtx,
    caller: Caller<'_>,
    r: CompactionRequest,
) -> Result<CompactionResponse, ApiError> {
    let physical = r.physical.then_some(r.revision);
    let Out::Compaction(c) = write(ctx, caller, In::Compaction(r)).await? else {
        return Err(unexpected());
    };
    if let Some(rev) = physical {
        ctx.node.store().wait_physically_compacted(rev).await?;
    }
    Ok(c.stamp(ctx))
}

/// A lease grant. An id of 0 asks the member to pick one (a positive int64, as etcd's).
pub async fn lease_grant(
    ctx: &ServerCtx,
    caller: Caller<'_>,
    mut r: LeaseGrantRequest,
) -> Result<LeaseGrantResponse, ApiError> {
    ctx.quota.check(&ctx.node, quota::LEASE_OVERHEAD).await?;
    if r.ttl > MAX_LEASE_TTL {
        return Err(ApiError::LeaseTtlTooLarge);
    }
    r.ttl = r.ttl.max(min_ttl(ctx.node.election_timeout));
    let ai = caller.resolve(ctx).await?;
    let caller = Caller::Resolved(ai.as_ref());
    let chosen = r.id == 0;
    loop {
        if chosen {
            r.id = (rand::random::<i64>() & i64::MAX).max(1);
        }
        match write(ctx, caller, In::LeaseGrant(r)).await {
            Ok(Out::LeaseGrant(mut g)) => {
                g.header = ctx.header(ctx.current_revision());
                return Ok(g);
            }
            Ok(_) => return Err(unexpected()),
            // Our pick collided with an existing lease; nobody saw that id.
            Err(ApiError::Mvcc(mvcc::MvccError::LeaseExists)) if chosen => {}
            Err(e) => return Err(e),
        }
    }
}

/// Proposes a write as the caller: the apply checks their permissions (etcd checks writes in
/// its applier, against the auth revision the request was made at).
async fn write(ctx: &ServerCtx, caller: Caller<'_>, req: In) -> Result<Out, ApiError> {
    let ai = caller.resolve(ctx).await?;
    let req = InternalRequest {
        request: Some(req),
        ..Default::default()
    };
    ctx.propose_as(req, ai.as_ref()).await
}

fn unexpected() -> ApiError {
    ApiError::Internal("unexpected apply result".into())
}
