//! What every client-facing service shares: the Raft node, ids for response headers, limits.

use tonic::metadata::MetadataMap;

use super::error::ApiError;
use crate::proto::etcdserverpb::ResponseHeader;
use crate::proto::kvdpb::{internal_response, InternalRequest, InternalResponse};
use crate::raft::RaftNode;

#[derive(Clone)]
pub struct ServerCtx {
    pub node: RaftNode,
    pub cluster_id: u64,
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    pub reconfig: std::sync::Arc<super::membership::Reconfig>,
    /// The backend quota writes are checked against before they are proposed.
    pub quota: std::sync::Arc<super::quota::Quota>,
}

impl ServerCtx {
    /// etcd's response header: this member's id, the cluster id, the given revision and this
    /// member's current term.
    pub fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.node.id,
            revision,
            raft_term: self.node.term(),
        })
    }

    pub fn current_revision(&self) -> i64 {
        self.node.sm.store().current_revision()
    }

    /// Clients in require-leader mode send `hasleader=true`: fail fast without a leader.
    pub fn check_leader(&self, md: &MetadataMap) -> Result<(), ApiError> {
        let wants = md.get("hasleader").and_then(|v| v.to_str().ok()) == Some("true");
        if wants && !self.node.has_leader() {
            return Err(ApiError::NoLeader);
        }
        Ok(())
    }

    /// Replicates a write and returns its response, or the error applying it produced.
    pub async fn propose(
        &self,
        req: InternalRequest,
    ) -> Result<internal_response::Response, ApiError> {
        use prost::Message;
        if req.encoded_len() > self.max_request_bytes {
            return Err(ApiError::RequestTooLarge);
        }
        let InternalResponse {
            response,
            error_code,
            ..
        } = self.node.propose(req).await?;
        match response {
            Some(internal_response::Response::Error(e)) => Err(ApiError::applied(error_code, e)),
            Some(r) => Ok(r),
            None => Err(ApiError::Internal("empty apply result".into())),
        }
    }
}
