//! The server's answers to what followers ask of the leader over the peer protocol
//! ([`LeaderDuties`]): lease keep-alives and time-to-live queries, and membership changes.

use std::sync::Arc;

use tonic::Status;

use crate::proto::etcdserverpb::{
    LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use crate::proto::kvdpb::{membership_request, membership_response};
use crate::raft::peer_service::LeaderDuties;
use crate::raft::RaftNode;
use crate::server::api::lease::{keep_alive_local, time_to_live_local};
use crate::server::membership::Reconfig;

pub struct ServerDuties {
    pub node: RaftNode,
    pub reconfig: Arc<Reconfig>,
}

#[tonic::async_trait]
impl LeaderDuties for ServerDuties {
    fn keep_alive(&self, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
        keep_alive_local(&self.node, id)
    }

    fn time_to_live(
        &self,
        req: &LeaseTimeToLiveRequest,
    ) -> Result<LeaseTimeToLiveResponse, Status> {
        time_to_live_local(&self.node, req)
    }

    async fn reconfigure(
        &self,
        req: membership_request::Request,
    ) -> Result<membership_response::Response, Status> {
        // The answer carries its error kind, so the forwarding member need not read its text.
        self.reconfig.handle_forwarded(req).await
    }
}
