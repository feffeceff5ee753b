//! The etcd v3 KV service: etcd's require-leader check, then the shared request path
//! ([`crate::server::api::request_path`]), which the member's in-process client takes too.
//!
//! Reads are linearizable (read index) unless `serializable`; writes go through Raft. Every
//! response carries etcd's header; nested txn responses carry only the revision (the MVCC layer
//! fills those), as etcd's do.

use tonic::{Request, Response, Status};

use crate::proto::etcdserverpb::kv_server::Kv;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use crate::server::api::request_path::{self, Caller};
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;

pub struct KvService {
    pub ctx: ServerCtx,
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, req: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let (md, ext, r) = req.into_parts();
        let resp = request_path::range(&self.ctx, Caller::Call(&md, &ext), r).await?;
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
        self.ctx.check_leader(req.metadata())?;
        let (md, ext, r) = req.into_parts();
        let resp = request_path::put(&self.ctx, Caller::Call(&md, &ext), r).await?;
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let (md, ext, r) = req.into_parts();
        let resp = request_path::delete_range(&self.ctx, Caller::Call(&md, &ext), r).await?;
        Ok(Response::new(resp))
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let (md, ext, r) = req.into_parts();
        let resp = request_path::txn(&self.ctx, Caller::Call(&md, &ext), r).await?;
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        let (md, ext, r) = req.into_parts();
        let resp = request_path::compact(&self.ctx, Caller::Call(&md, &ext), r).await?;
        Ok(Response::new(resp))
    }
}
