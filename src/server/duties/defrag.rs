//! `Maintenance.Defragment` and the status sizes it changes: `dbSize` (the engine's files on
//! disk) and `dbSizeInUse` (the live records' bytes).
//!
//! A defragmentation rewrites only this member's engine (`raft::sm::state_machine` defrag),
//! pausing its applies meanwhile; the other members go on. etcd 3.4 answers with an empty
//! response (no header), and so does kvd.
//!
//! `dbSizeInUse` is the sum of the keys' and values' bytes of every record in the engine's
//! trees: what a defragmentation would copy, so right after one `dbSize` is that plus sled's
//! overhead. It is computed by a scan of the engine (off the runtime's threads, one at a
//! time, kept even if the caller gave up) and reused for [`IN_USE_TTL`], so frequent status
//! calls do not each read the whole store; a call that finds a scan running waits at most
//! [`IN_USE_WAIT`] and answers with the last value (etcd's figure is free: bbolt's page
//! counts).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::proto::etcdserverpb::DefragmentResponse;
use crate::raft::RaftNode;
use crate::server::api::maintenance::dir_size;
use crate::server::error::ApiError;
use crate::sync::LockExt;

/// How long a computed `dbSizeInUse` is reused: a scan reads the whole store (1.5 GiB at a
/// million keys of 1 KiB), so a monitor polling status every few seconds must not run one
/// each time.
pub const IN_USE_TTL: Duration = Duration::from_secs(30);

/// How long a status call waits for a running scan before answering with the last value.
pub const IN_USE_WAIT: Duration = Duration::from_millis(500);

/// Defragments this member's engine; answers when the new one is in use.
pub(crate) async fn defragment(node: &RaftNode) -> Result<DefragmentResponse, ApiError> {
    // In a task of its own: a client that gives up does not stop it halfway (nothing would be
    // lost, but the copy would be wasted).
    let node = node.clone();
    tokio::spawn(async move {
        let before = dir_size(&node.db_dir());
        tracing::info!(
            current_db_size_bytes = before,
            "starting to defragment the storage backend..."
        );
        crate::metrics::DEFRAG_INFLIGHT.set(1);
        let d = node.defragment().await;
        crate::metrics::DEFRAG_INFLIGHT.set(0);
        let d = d.map_err(|e| {
            tracing::warn!(error = %e, "defragmenting the storage backend failed");
            ApiError::Internal(format!("defragment: {e}"))
        })?;
        crate::metrics::DEFRAG_SECONDS.observe(d.took);
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

/// Per engine directory: the last computed `dbSizeInUse` and whether a scan is running.
#[derive(Default)]
struct InUse {
    last: Option<(Instant, u64)>,
    scanning: bool,
}

static IN_USE: Mutex<Option<HashMap<PathBuf, InUse>>> = Mutex::new(None);

fn in_use<T>(f: impl FnOnce(&mut HashMap<PathBuf, InUse>) -> T) -> T {
    f(IN_USE.lock_or_recover().get_or_insert_with(HashMap::new))
}

fn forget_in_use(dir: &PathBuf) {
    in_use(|m| m.remove(dir));
}

/// `dbSizeInUse` (see the module doc): the value computed within [`IN_USE_TTL`], else the
/// result of a scan if it ends within [`IN_USE_WAIT`], else the last value known; None if
/// there is none yet (the caller answers with `dbSize`, an upper bound). The scan runs in a
/// task of its own, one per engine at a time, and its result is kept whether or not the
/// status call that started it is still waiting: a client with a short deadline on a large
/// store must not start a new full scan with each retry.
pub(crate) async fn size_in_use(node: &RaftNode) -> Option<u64> {
    let dir = node.db_dir();
    let start = in_use(|m| {
        let e = m.entry(dir.clone()).or_default();
        if e.last.is_some_and(|(at, _)| at.elapsed() < IN_USE_TTL) || e.scanning {
            return false;
        }
        e.scanning = true;
        true
    });
    if start {
        let store = node.store().clone();
        let dir = dir.clone();
        tokio::spawn(async move {
            let n = match tokio::task::spawn_blocking(move || store.live_bytes()).await {
                Ok(Ok(n)) => Some(n),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "sizing the live records");
                    None
                }
                Err(_) => None,
            };
            in_use(|m| {
                let e = m.entry(dir).or_default();
                e.scanning = false;
                if let Some(n) = n {
                    e.last = Some((Instant::now(), n));
                }
            });
        });
    }
    let waited = Instant::now();
    loop {
        let (fresh, last, scanning) = in_use(|m| {
            let e = m.entry(dir.clone()).or_default();
            let fresh = e.last.filter(|(at, _)| at.elapsed() < IN_USE_TTL);
            (fresh, e.last, e.scanning)
        });
        if let Some((_, n)) = fresh {
            return Some(n);
        }
        if !scanning || waited.elapsed() >= IN_USE_WAIT {
            return last.map(|(_, n)| n);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
