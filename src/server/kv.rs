//! The etcd v3 KV service.
//!
//! Reads are linearizable (read index) unless `serializable`; writes go through Raft. Every
//! response carries etcd's header; nested txn responses carry only the revision (the MVCC layer
//! fills those), as etcd's do.

use tonic::{Request, Response, Status};

use super::context::ServerCtx;
use super::error::ApiError;
use super::learner;
use crate::mvcc;
use crate::proto::etcdserverpb::kv_server::Kv;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use crate::proto::kvdpb::internal_request::Request as In;
use crate::proto::kvdpb::internal_response::Response as Out;
use crate::proto::kvdpb::InternalRequest;

pub struct KvService {
    pub ctx: ServerCtx,
}

impl KvService {
    /// Proposes a write as the caller: the apply checks their permissions (etcd checks
    /// writes in its applier, against the auth revision the request was made at).
    async fn write(
        &self,
        md: &tonic::metadata::MetadataMap,
        ext: &http::Extensions,
        req: In,
    ) -> Result<Out, ApiError> {
        self.ctx.check_leader(md)?;
        let ai = self.ctx.auth_info(md, ext).await?;
        self.ctx
            .propose_as(
                InternalRequest {
                    request: Some(req),
                    ..Default::default()
                },
                ai.as_ref(),
            )
            .await
    }

    fn unexpected(&self) -> Status {
        ApiError::Internal("unexpected apply result".into()).into()
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, req: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let (md, ext, r) = req.into_parts();
        if r.key.is_empty() {
            return Err(ApiError::Mvcc(mvcc::MvccError::EmptyKey).into());
        }
        learner::refuse_linearizable_range(&self.ctx.node, r.serializable)?;
        if !r.serializable {
            self.ctx.node.read_barrier().await.map_err(ApiError::from)?;
        }
        // The token and the permission after the barrier, as etcd's doSerialize: a
        // linearizable read is judged by the auth state of at least its read index, so a
        // role revoked or a user deleted through another member counts.
        let ai = self.ctx.auth_info(&md, &ext).await?;
        let auth = self.ctx.node.sm.auth();
        auth.check_op(ai.as_ref(), &r.key, &r.range_end, false)
            .map_err(ApiError::from)?;
        let mut resp = self.ctx.node.sm.range(&r).await.map_err(ApiError::from)?;
        // The revision the data was read at; the store may have moved on since.
        resp.header = self.ctx.header(resp.header.map_or(0, |h| h.revision));
        Ok(Response::new(resp))
    }

    type RangeStreamStream =
        futures::stream::Empty<Result<crate::proto::etcdserverpb::RangeStreamResponse, Status>>;

    async fn range_stream(
        &self,
        _req: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(ApiError::Unimplemented("RangeStream is not supported".into()).into())
    }

    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let (md, ext, r) = req.into_parts();
        // Before validation, as etcd's quota layer wraps the KV server.
        let cost = super::quota::cost_put(&r);
        self.ctx.quota.check(&self.ctx.node, cost).await?;
        // Lease existence is checked when the put is applied: a check here could wrongly
        // refuse a lease granted through another member that this one has not applied yet.
        mvcc::check_put(&r).map_err(ApiError::from)?;
        match self.write(&md, &ext, In::Put(r)).await? {
            Out::Put(mut p) => {
                p.header = self.ctx.header(p.header.map_or(0, |h| h.revision));
                Ok(Response::new(p))
            }
            _ => Err(self.unexpected()),
        }
    }

    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let (md, ext, r) = req.into_parts();
        if r.key.is_empty() {
            return Err(ApiError::Mvcc(mvcc::MvccError::EmptyKey).into());
        }
        match self.write(&md, &ext, In::DeleteRange(r)).await? {
            Out::DeleteRange(mut d) => {
                d.header = self.ctx.header(d.header.map_or(0, |h| h.revision));
                Ok(Response::new(d))
            }
            _ => Err(self.unexpected()),
        }
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let (md, ext, r) = req.into_parts();
        let cost = super::quota::cost_txn(&r);
        self.ctx.quota.check(&self.ctx.node, cost).await?;
        mvcc::check_txn(&r, self.ctx.max_txn_ops).map_err(ApiError::from)?;
        match self.write(&md, &ext, In::Txn(r)).await? {
            Out::Txn(mut t) => {
                t.header = self.ctx.header(t.header.map_or(0, |h| h.revision));
                Ok(Response::new(t))
            }
            _ => Err(self.unexpected()),
        }
    }

    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let (md, ext, r) = req.into_parts();
        let physical = r.physical.then_some(r.revision);
        match self.write(&md, &ext, In::Compaction(r)).await? {
            Out::Compaction(mut c) => {
                if let Some(rev) = physical {
                    // As etcd: answer once this member has deleted the compacted records.
                    let store = self.ctx.node.sm.store();
                    store
                        .wait_physically_compacted(rev)
                        .await
                        .map_err(ApiError::from)?;
                }
                c.header = self.ctx.header(c.header.map_or(0, |h| h.revision));
                Ok(Response::new(c))
            }
            _ => Err(self.unexpected()),
        }
    }
}
