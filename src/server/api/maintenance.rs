//! The etcd v3 Maintenance service: Alarm, Status, Defragment, Hash, HashKV, Snapshot,
//! MoveLeader and Downgrade.

use tonic::{Request, Response, Status};

use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::proto::etcdserverpb::*;
use crate::raft::sm::alarm_set::alarm_text;
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;

use crate::server::version::ETCD_VERSION;

pub struct MaintenanceService {
    pub ctx: ServerCtx,
    /// Where backups for clients are written before they are streamed.
    pub backup_dir: std::path::PathBuf,
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
    async fn alarm(&self, r: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        // etcd's authMaintenanceServer: listing needs a user, changing needs an admin.
        if r.get_ref().action == alarm_request::AlarmAction::Get as i32 {
            self.ctx.check_user(r.metadata(), r.extensions()).await?;
        } else {
            self.ctx.check_admin(r.metadata(), r.extensions()).await?;
        }
        let mut resp = crate::server::api::alarms::alarm(&self.ctx, r.into_inner()).await?;
        // etcd 3.4 answers without a header; 3.5 (the version kvd reports) fills it.
        resp.header = self.ctx.header(self.ctx.current_revision());
        Ok(Response::new(resp))
    }

    async fn status(&self, r: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        self.ctx.check_admin(r.metadata(), r.extensions()).await?;
        let node = &self.ctx.node;
        let status = node.status();
        let db_size = dir_size(&node.db_dir()) as i64;
        let db_size_in_use = crate::server::duties::defrag::size_in_use(node)
            .await
            .map_or(db_size, |n| n as i64);
        let recent = node.recent_fsyncs();
        let is_learner = !status.is_voter(node.id);
        // etcd's order: "no leader" first, then each active alarm as etcd prints it.
        let mut errors = Vec::new();
        if status.leader.is_none() {
            errors.push(ApiError::NoLeader.to_string());
        }
        errors.extend(node.alarms().get(0).iter().map(alarm_text));
        Ok(Response::new(StatusResponse {
            header: self.ctx.header(self.ctx.current_revision()),
            version: ETCD_VERSION.to_string(),
            db_size,
            leader: status.leader.unwrap_or(0),
            // etcd's raftIndex is the committed index.
            raft_index: status.committed,
            raft_term: status.term,
            raft_applied_index: status.applied,
            errors,
            db_size_in_use,
            is_learner,
            storage_version: String::new(),
            // A 3.6 field: etcd 3.4 and 3.5 (whose version kvd reports) leave it empty.
            db_size_quota: 0,
            downgrade_info: None,
            kvd_recent_wal_fsyncs: recent.count,
            kvd_recent_wal_fsync_p99_us: recent.p99.as_micros() as u64,
            kvd_peers: node
                .peer_views()
                .into_iter()
                .map(|p| KvdPeerView {
                    id: p.id,
                    reachable: p.reachable,
                    last_contact_ms: p.last_contact.map_or(0, |d| d.as_millis() as u64),
                    never_contacted: p.last_contact.is_none(),
                })
                .collect(),
        }))
    }

    async fn defragment(
        &self,
        r: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.ctx.check_admin(r.metadata(), r.extensions()).await?;
        Ok(Response::new(
            crate::server::duties::defrag::defragment(&self.ctx.node).await?,
        ))
    }

    /// kvd's own checksum of the whole state machine (not comparable with etcd's bbolt hash;
    /// see `mvcc::hash`).
    async fn hash(&self, r: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.ctx.check_admin(r.metadata(), r.extensions()).await?;
        let store = self.ctx.node.store().clone();
        let timed = crate::metrics::timed(&crate::metrics::HASH_SECONDS);
        let (hash, rev) = tokio::task::spawn_blocking(move || timed(store.hash_all()))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(ApiError::from)?;
        Ok(Response::new(HashResponse {
            header: self.ctx.header(rev),
            hash,
        }))
    }

    /// etcd's HashKV (see `mvcc::hash`), answered from this member's applied state as etcd
    /// answers it (no read index).
    async fn hash_kv(&self, r: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        self.ctx.check_admin(r.metadata(), r.extensions()).await?;
        let rev = r.into_inner().revision;
        let store = self.ctx.node.store().clone();
        let timed = crate::metrics::timed(&crate::metrics::HASH_REV_SECONDS);
        let h = tokio::task::spawn_blocking(move || timed(store.hash_kv(rev)))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(ApiError::from)?;
        Ok(Response::new(HashKvResponse {
            header: self.ctx.header(h.current),
            hash: h.hash,
            compact_revision: h.compacted,
            hash_revision: h.revision,
        }))
    }

    type SnapshotStream = crate::server::backup::stream::SnapshotStream;

    async fn snapshot(
        &self,
        r: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.ctx.check_admin(r.metadata(), r.extensions()).await?;
        let ctx = self.ctx.clone();
        let stream = crate::server::backup::stream::snapshot(
            self.ctx.node.clone(),
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
        self.ctx.check_admin(r.metadata(), r.extensions()).await?;
        self.ctx
            .reconfig
            .move_leader(r.into_inner().target_id)
            .await?;
        // etcd answers MoveLeader without a header, also when the target already leads.
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }

    async fn downgrade(
        &self,
        r: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        let resp = crate::server::duties::downgrade::downgrade(&self.ctx, r.get_ref()).await?;
        Ok(Response::new(resp))
    }
}
