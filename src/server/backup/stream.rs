//! `Maintenance.Snapshot`: a backup saved to a temporary file in the member's directory,
//! then streamed as etcd streams its database: chunks with the bytes remaining after each,
//! then the sha256 of everything sent, in a message of its own.
//!
//! The temporary file is removed when the stream ends, however it ends (sent, client gone,
//! error); files left by a crash are removed when the member starts ([`clean`]).

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::Stream;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tonic::Status;

use crate::proto::etcdserverpb::{ResponseHeader, SnapshotResponse};
use crate::raft::sm::background;
use crate::raft::RaftNode;
use crate::server::error::ApiError;

use super::save;

/// Bytes per message. etcd sends 32 KiB; larger chunks cost fewer messages, and stay well
/// under every client's default receive limit (4 MiB in grpc-go and most others).
const CHUNK: usize = 1 << 20;

/// The storage version etcd 3.5 reports with each chunk.
const STORAGE_VERSION: &str = "3.5.0";

pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

/// A file removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Removes temporary backup files a crash left in `dir`.
pub fn clean(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Saves a backup of `node`'s applied state under `dir` and streams it. `header` gives the response header for
/// the backup's revision (sent with the first message, as etcd 3.5 does).
pub async fn snapshot(
    node: RaftNode,
    dir: PathBuf,
    header: impl FnOnce(i64) -> Option<ResponseHeader>,
) -> Result<SnapshotStream, Status> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let path = dir.join(format!(
        "snapshot-{}-{}.db",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let file = TempFile(path.clone());
    // At a low priority, as Raft snapshots are copied: the member's own work comes first.
    let saved = background::run("backup", move || {
        std::fs::create_dir_all(&dir)?;
        save(&node, &path).map_err(std::io::Error::other)
    })
    .await
    .map_err(|e| Status::from(ApiError::Internal(format!("snapshot task: {e}"))))?
    .map_err(|e| {
        tracing::warn!(error = %e, "saving a snapshot for a client failed");
        Status::from(ApiError::Internal(format!("snapshot: {e}")))
    })?;
    tracing::info!(
        bytes = saved.len,
        revision = saved.revision,
        applied_index = saved.applied_index,
        "sending database snapshot to client"
    );
    let mut header = header(saved.revision);
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        let file = file;
        let result: Result<(), std::io::Error> = async {
            let mut f = tokio::fs::File::open(&file.0).await?;
            let mut h = Sha256::new();
            let mut left = saved.len;
            while left > 0 {
                let mut buf = vec![0u8; (CHUNK as u64).min(left) as usize];
                f.read_exact(&mut buf).await?;
                h.update(&buf);
                left -= buf.len() as u64;
                let msg = SnapshotResponse {
                    header: header.take(),
                    remaining_bytes: left,
                    blob: buf,
                    version: STORAGE_VERSION.to_string(),
                };
                if tx.send(Ok(msg)).await.is_err() {
                    return Ok(()); // the client went away
                }
            }
            let sha = SnapshotResponse {
                header: header.take(),
                remaining_bytes: 0,
                blob: h.finalize().to_vec(),
                version: STORAGE_VERSION.to_string(),
            };
            let _ = tx.send(Ok(sha)).await;
            Ok(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "streaming a snapshot failed");
            let _ = tx
                .send(Err(Status::from(ApiError::Internal(format!(
                    "snapshot: {e}"
                )))))
                .await;
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}
