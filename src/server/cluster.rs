//! The etcd v3 Cluster service. Membership is Raft's membership config; names and client URLs
//! are the attributes each member published through the log.

use openraft::async_runtime::WatchReceiver;
use tonic::{Request, Response, Status};

use super::context::ServerCtx;
use super::error::ApiError;
use crate::proto::etcdserverpb::cluster_server::Cluster;
use crate::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};

pub struct ClusterService {
    pub ctx: ServerCtx,
}

impl ClusterService {
    /// Members as etcd lists them: voters and learners, with published name and client URLs
    /// (empty until the member has started and published).
    pub fn members(&self) -> Result<Vec<Member>, ApiError> {
        let m = self.ctx.node.raft.metrics();
        let cfg = m.borrow_watched().membership_config.clone();
        let membership = cfg.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let mut out = Vec::new();
        for (id, node) in membership.nodes() {
            let attrs = self
                .ctx
                .node
                .sm
                .member_attrs(*id)
                .map_err(|e| ApiError::Internal(e.to_string()))?
                .unwrap_or_default();
            out.push(Member {
                id: *id,
                name: attrs.name,
                peer_ur_ls: node.peer_urls.clone(),
                client_ur_ls: attrs.client_urls,
                is_learner: !voters.contains(id),
            });
        }
        Ok(out)
    }
}

fn not_yet(what: &str) -> Status {
    ApiError::Unimplemented(format!("{what} is not supported yet")).into()
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        _r: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        Err(not_yet("MemberAdd"))
    }

    async fn member_remove(
        &self,
        _r: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        Err(not_yet("MemberRemove"))
    }

    async fn member_update(
        &self,
        _r: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Err(not_yet("MemberUpdate"))
    }

    async fn member_list(
        &self,
        req: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if req.get_ref().linearizable {
            self.ctx.node.read_barrier().await.map_err(ApiError::from)?;
        }
        Ok(Response::new(MemberListResponse {
            header: self.ctx.header(self.ctx.current_revision()),
            members: self.members()?,
        }))
    }

    async fn member_promote(
        &self,
        _r: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        Err(not_yet("MemberPromote"))
    }
}
