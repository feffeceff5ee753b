//! The backend quota (etcd's `backendQuota` and its `quotaAlarmer`): before a put, a txn with
//! puts or a lease grant is proposed, a member whose state-machine database plus the request's
//! cost reaches `--quota-backend-bytes` raises a NOSPACE alarm through Raft and refuses the
//! request with etcd's `etcdserver: mvcc: database space exceeded` (ResourceExhausted).
//!
//! Invariants:
//! - Only the proposing member's own database size is judged, before proposing; what every
//!   member refuses while the alarm is active is decided at apply time from the log
//!   (`raft::sm::alarm_set`), so all members agree.
//! - Costs are etcd's: 256 bytes of overhead plus key and value per put, the larger branch of
//!   a txn (top-level puts only), 64 bytes per lease grant; a request of cost 0 always passes.
//! - The database size is re-read at most every [`SIZE_REFRESH`]: sled keeps large values in
//!   one file each, so a walk of its directory per request would cost a syscall per value.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::{request_op, AlarmRequest, AlarmType, PutRequest, TxnRequest};
use crate::proto::kvdpb::{internal_request, InternalRequest};
use crate::raft::RaftNode;
use crate::server::api::maintenance::dir_size;
use crate::server::config::{DEFAULT_QUOTA_BYTES, MAX_QUOTA_BYTES};
use crate::server::error::ApiError;
use crate::sync::LockExt;

/// etcd's `kvOverhead`: the estimated cost of a key's metadata.
const KV_OVERHEAD: u64 = 256;
/// etcd's `leaseOverhead`: the estimated cost of a lease.
pub const LEASE_OVERHEAD: u64 = 64;
/// How long a measured database size is trusted.
const SIZE_REFRESH: Duration = Duration::from_millis(100);

/// etcd's `costPut`.
pub fn cost_put(r: &PutRequest) -> u64 {
    KV_OVERHEAD + r.key.len() as u64 + r.value.len() as u64
}

/// etcd's `costTxn`: the larger of the two branches' top-level puts.
pub fn cost_txn(r: &TxnRequest) -> u64 {
    let branch = |ops: &[crate::proto::etcdserverpb::RequestOp]| -> u64 {
        ops.iter()
            .map(|op| match &op.request {
                Some(request_op::Request::RequestPut(p)) => cost_put(p),
                _ => 0,
            })
            .sum()
    };
    branch(&r.success).max(branch(&r.failure))
}

/// A member's backend quota.
pub struct Quota {
    /// `None`: no quota (a negative `--quota-backend-bytes`).
    limit: Option<u64>,
    /// The current state-machine database directory (it changes when a defragmentation
    /// switches engine generations).
    db_dir: Box<dyn Fn() -> PathBuf + Send + Sync>,
    size: Mutex<Option<(Instant, u64)>>,
}

impl Quota {
    /// The quota from the resolved flag, logging it as etcd does once at start.
    pub fn new(limit: Option<u64>, db_dir: impl Fn() -> PathBuf + Send + Sync + 'static) -> Self {
        match limit {
            None => tracing::warn!("disabling backend quota"),
            Some(q) if q == DEFAULT_QUOTA_BYTES => tracing::info!(
                quota_size_bytes = q,
                quota_size = "2.1 GB",
                "enabled backend quota with default value"
            ),
            Some(q) => {
                if q > MAX_QUOTA_BYTES {
                    tracing::warn!(
                        "backend quota {q} exceeds maximum recommended quota {MAX_QUOTA_BYTES}"
                    );
                }
                tracing::info!(quota_size_bytes = q, "enabled backend quota");
            }
        }
        Quota {
            limit,
            db_dir: Box::new(db_dir),
            size: Mutex::new(None),
        }
    }

    /// The state-machine database's size, at most [`SIZE_REFRESH`] old.
    fn db_size(&self) -> u64 {
        let mut cached = self.size.lock_or_recover();
        match *cached {
            Some((at, size)) if at.elapsed() < SIZE_REFRESH => size,
            _ => {
                let size = dir_size(&(self.db_dir)());
                *cached = Some((Instant::now(), size));
                size
            }
        }
    }

    /// etcd's `Available`: whether a request of `cost` fits (database size + cost < quota).
    pub fn available(&self, cost: u64) -> bool {
        match self.limit {
            Some(limit) if cost > 0 => self.db_size().saturating_add(cost) < limit,
            _ => true,
        }
    }

    /// etcd's `quotaAlarmer.check`: refuses a request of `cost` that does not fit, after
    /// raising this member's NOSPACE alarm through Raft (unless one is already active).
    pub async fn check(&self, node: &RaftNode, cost: u64) -> Result<(), ApiError> {
        if self.available(cost) {
            return Ok(());
        }
        if !node.alarms().is_active(AlarmType::Nospace) {
            let req = InternalRequest {
                request: Some(internal_request::Request::Alarm(AlarmRequest {
                    action: AlarmAction::Activate as i32,
                    member_id: node.id,
                    alarm: AlarmType::Nospace as i32,
                })),
                ..Default::default()
            };
            // As etcd, the refusal does not depend on the alarm's proposal succeeding.
            if let Err(e) = node.propose(req).await {
                tracing::warn!("raising the NOSPACE alarm: {e}");
            }
        }
        Err(ApiError::NoSpace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::RequestOp;

    fn put(k: &str, v: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: k.into(),
                value: v.into(),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn costs_are_etcds() {
        let p = PutRequest {
            key: b"ab".to_vec(),
            value: b"cde".to_vec(),
            ..Default::default()
        };
        assert_eq!(cost_put(&p), 261);
        let t = TxnRequest {
            success: vec![put("a", "1"), put("b", "2")],
            failure: vec![put("c", "123456")],
            ..Default::default()
        };
        assert_eq!(cost_txn(&t), 2 * 258);
        assert_eq!(cost_txn(&TxnRequest::default()), 0);
    }

    #[test]
    fn available_is_strictly_below_the_quota() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![0u8; 1000]).unwrap();
        let path = dir.path().to_path_buf();
        let q = Quota::new(Some(1300), move || path.clone());
        assert!(q.available(299));
        assert!(!q.available(300));
        assert!(q.available(0));
        let path = dir.path().to_path_buf();
        let none = Quota::new(None, move || path.clone());
        assert!(none.available(u64::MAX));
    }
}
