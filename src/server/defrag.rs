//! `Maintenance.Defragment` and the status sizes it changes: `dbSize` (the engine's files on
//! disk) and `dbSizeInUse` (the live records' bytes).
//!
//! A defragmentation rewrites only this member's engine (`raft::state_machine` defrag),
//! pausing its applies meanwhile; the other members go on. etcd 3.4 answers with an empty
//! response (no header), and so does kvd.
//!
//! `dbSizeInUse` is the sum of the keys' and values' bytes of every record in the engine's
//! trees: what a defragmentation would copy, so right after one `dbSize` is that plus sled's
//! overhead. It is computed by a scan of the engine (off the runtime's threads) and reused
//! for [`IN_USE_TTL`], so frequent status calls do not each read the whole store.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::error::ApiError;
use super::maintenance::dir_size;
use crate::proto::etcdserverpb::DefragmentResponse;
use crate::raft::RaftNode;

/// How long a computed `dbSizeInUse` is reused.
pub const IN_USE_TTL: Duration = Duration::from_secs(5);

/// Defragments this member's engine; answers when the new one is in use.
pub(crate) async fn defragment(node: &RaftNode) -> Result<DefragmentResponse, ApiError> {
    // In a task of its own: a client that gives up does not stop it halfway (nothing would be
    // lost, but the copy would be wasted).
    let sm = node.sm.clone();
    tokio::spawn(async move {
        let before = dir_size(&sm.db_dir());
        tracing::info!(
            current_db_size_bytes = before,
            "starting to defragment the storage backend..."
        );
        let d = sm.defragment().await.map_err(|e| {
            tracing::warn!(error = %e, "defragmenting the storage backend failed");
            ApiError::Internal(format!("defragment: {e}"))
        })?;
        let after = dir_size(&d.to);
        forget_in_use(&d.from);
        tracing::info!(
            from = %d.from.display(),
            to = %d.to.display(),
            records = d.records,
            current_db_size_bytes_before = before,
            current_db_size_bytes_after = after,
            took_ms = d.took.as_millis() as u64,
            "finished defragmenting the storage backend"
        );
        Ok(DefragmentResponse { header: None })
    })
    .await
    .map_err(|e| ApiError::Internal(format!("defragment: {e}")))?
}

static IN_USE: Mutex<Option<HashMap<PathBuf, (Instant, u64)>>> = Mutex::new(None);

fn forget_in_use(dir: &PathBuf) {
    if let Some(m) = IN_USE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        m.remove(dir);
    }
}

/// `dbSizeInUse` (see the module doc); 0 if the engine cannot be read.
pub(crate) async fn size_in_use(node: &RaftNode) -> u64 {
    let dir = node.sm.db_dir();
    if let Some(m) = IN_USE.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        if let Some((at, n)) = m.get(&dir) {
            if at.elapsed() < IN_USE_TTL {
                return *n;
            }
        }
    }
    let store = node.sm.store().clone();
    let n = match tokio::task::spawn_blocking(move || store.live_bytes()).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "sizing the live records");
            return 0;
        }
        Err(_) => return 0,
    };
    IN_USE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(dir, (Instant::now(), n));
    n
}
