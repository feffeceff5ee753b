//! The etcd v3 Cluster service. Its response headers carry no revision, as etcd's do. Membership is Raft's membership config; names and client URLs
//! are the attributes each member published through the log. Changes are checked and proposed
//! by the leader (see [`crate::server::membership`]); this member only relays them and stamps its own
//! response header.

use tonic::{Request, Response, Status};

use crate::proto::etcdserverpb::cluster_server::Cluster;
use crate::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use crate::proto::kvdpb::{membership_request as q, membership_response as r};
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;
use crate::server::membership::members_of;

pub struct ClusterService {
    pub ctx: ServerCtx,
}

impl ClusterService {
    /// Members as etcd lists them: voters and learners, with published name and client URLs
    /// (empty until the member has started and published).
    pub fn members(&self) -> Result<Vec<Member>, ApiError> {
        members_of(&self.ctx.node.membership(), &self.ctx.node)
    }

    async fn change(&self, req: q::Request) -> Result<r::Response, ApiError> {
        self.ctx.reconfig.request(req).await
    }

    fn unexpected() -> Status {
        ApiError::Internal("mismatched membership reply".into()).into()
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        req: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        // etcd's checkMembershipOperationPermission.
        self.ctx
            .check_admin(req.metadata(), req.extensions())
            .await?;
        match self.change(q::Request::Add(req.into_inner())).await? {
            r::Response::Add(mut resp) => {
                resp.header = self.ctx.header(0);
                Ok(Response::new(resp))
            }
            _ => Err(Self::unexpected()),
        }
    }

    async fn member_remove(
        &self,
        req: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        // etcd's checkMembershipOperationPermission.
        self.ctx
            .check_admin(req.metadata(), req.extensions())
            .await?;
        match self.change(q::Request::Remove(req.into_inner())).await? {
            r::Response::Remove(mut resp) => {
                resp.header = self.ctx.header(0);
                Ok(Response::new(resp))
            }
            _ => Err(Self::unexpected()),
        }
    }

    async fn member_update(
        &self,
        req: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        // etcd's checkMembershipOperationPermission.
        self.ctx
            .check_admin(req.metadata(), req.extensions())
            .await?;
        match self.change(q::Request::Update(req.into_inner())).await? {
            r::Response::Update(mut resp) => {
                resp.header = self.ctx.header(0);
                Ok(Response::new(resp))
            }
            _ => Err(Self::unexpected()),
        }
    }

    async fn member_list(
        &self,
        req: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if req.get_ref().linearizable {
            self.ctx.node.read_barrier().await.map_err(ApiError::from)?;
        }
        Ok(Response::new(MemberListResponse {
            header: self.ctx.header(0),
            members: self.members()?,
        }))
    }

    async fn member_promote(
        &self,
        req: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.ctx.check_leader(req.metadata())?;
        // etcd's checkMembershipOperationPermission.
        self.ctx
            .check_admin(req.metadata(), req.extensions())
            .await?;
        match self.change(q::Request::Promote(req.into_inner())).await? {
            r::Response::Promote(mut resp) => {
                resp.header = self.ctx.header(0);
                Ok(Response::new(resp))
            }
            _ => Err(Self::unexpected()),
        }
    }
}
