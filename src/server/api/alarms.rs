//! Maintenance.Alarm: listing, raising and clearing alarms (etcd's `EtcdServer.Alarm`).
//!
//! Invariants:
//! - ACTIVATE and DEACTIVATE go through Raft (an `Alarm` entry every member applies, see
//!   `raft::sm::alarm_set`); any other action is refused before it is proposed (etcd 3.4 crashes
//!   answering one).
//! - GET is a linearizable read of the applied alarms: it waits for a read index, as etcd's GET
//!   (which goes through Raft) sees every alarm applied before it was asked, without a log
//!   entry of its own.
//! - Alarm types are not checked, as etcd does not: an unknown type is stored and listed by its
//!   number, and refuses nothing.

use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::{AlarmRequest, AlarmResponse};
use crate::proto::kvdpb::internal_request::Request as In;
use crate::proto::kvdpb::internal_response::Response as Out;
use crate::proto::kvdpb::InternalRequest;
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;

/// Answers an alarm request; the header is the caller's.
pub async fn alarm(ctx: &ServerCtx, req: AlarmRequest) -> Result<AlarmResponse, ApiError> {
    match AlarmAction::try_from(req.action) {
        Ok(AlarmAction::Get) => {
            ctx.node.read_barrier().await.map_err(ApiError::from)?;
            Ok(AlarmResponse {
                header: None,
                alarms: ctx.node.alarms().get(req.alarm),
            })
        }
        Ok(AlarmAction::Activate | AlarmAction::Deactivate) => {
            match ctx
                .propose(InternalRequest {
                    request: Some(In::Alarm(req)),
                    ..Default::default()
                })
                .await?
            {
                Out::Alarm(a) => Ok(a),
                _ => Err(ApiError::Internal("unexpected apply result".into())),
            }
        }
        Err(_) => Err(ApiError::BadAlarmAction),
    }
}
