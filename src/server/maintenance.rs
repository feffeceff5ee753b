//! The etcd v3 Maintenance service (Status and MoveLeader; the rest as their issues land).

use openraft::async_runtime::WatchReceiver;
use tonic::{Request, Response, Status};

use super::context::ServerCtx;
use super::error::ApiError;
use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::proto::etcdserverpb::*;

/// The etcd version kvd reports. Clients parse it as integers and gate features on it
/// (e.g. watch progress requests need 3.4.31+ or 3.5.13+); see docs/architecture.md.
pub const ETCD_VERSION: &str = "3.5.17";

pub struct MaintenanceService {
    pub ctx: ServerCtx,
    /// Where backups for clients are written before they are streamed.
    pub backup_dir: std::path::PathBuf,
}

fn not_yet(what: &str) -> Status {
    ApiError::Unimplemented(format!("{what} is not supported yet")).into()
}

/// Bytes in the files under `p` (etcd reports its bbolt file's size; sled is a directory).
pub(crate) fn dir_size(p: &std::path::Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(&self, _r: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        Ok(Response::new(AlarmResponse {
            header: self.ctx.header(self.ctx.current_revision()),
            alarms: vec![],
        }))
    }

    async fn status(&self, _r: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let node = &self.ctx.node;
        let m = node.raft.metrics().borrow_watched().clone();
        let db_size = dir_size(&node.sm.db_dir()) as i64;
        let db_size_in_use = super::defrag::size_in_use(node).await as i64;
        let recent = node.log.wal().recent_fsyncs();
        let is_learner = !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == node.id);
        Ok(Response::new(StatusResponse {
            header: self.ctx.header(self.ctx.current_revision()),
            version: ETCD_VERSION.to_string(),
            db_size,
            leader: m.current_leader.unwrap_or(0),
            raft_index: m.last_log_index.unwrap_or(0),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors: vec![],
            db_size_in_use,
            is_learner,
            storage_version: String::new(),
            db_size_quota: 0,
            downgrade_info: None,
            kvd_recent_wal_fsyncs: recent.count,
            kvd_recent_wal_fsync_p99_us: recent.p99.as_micros() as u64,
        }))
    }

    async fn defragment(
        &self,
        _r: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        Ok(Response::new(
            super::defrag::defragment(&self.ctx.node).await?,
        ))
    }

    async fn hash(&self, _r: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(not_yet("Hash"))
    }

    async fn hash_kv(
        &self,
        _r: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        Err(not_yet("HashKV"))
    }

    type SnapshotStream = super::backup::stream::SnapshotStream;

    async fn snapshot(
        &self,
        _r: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let ctx = self.ctx.clone();
        let stream = super::backup::stream::snapshot(
            self.ctx.node.sm.clone(),
            self.backup_dir.clone(),
            move |rev| ctx.header(rev),
        )
        .await?;
        Ok(Response::new(stream))
    }

    async fn move_leader(
        &self,
        r: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        self.ctx
            .reconfig
            .move_leader(r.into_inner().target_id)
            .await?;
        Ok(Response::new(MoveLeaderResponse {
            header: self.ctx.header(self.ctx.current_revision()),
        }))
    }

    async fn downgrade(
        &self,
        _r: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(not_yet("Downgrade"))
    }
}
