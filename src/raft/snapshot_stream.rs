//! A snapshot file on the wire: the leader's side streams it from its file in
//! [`SNAPSHOT_CHUNK`]s, the receiving side appends the chunks to a file.
//!
//! Invariants:
//! - Neither side holds more than a chunk or two of a snapshot in memory: the sender reads
//!   the next chunk only when the gRPC stream asks for it (HTTP/2 flow control holds the
//!   stream back while the peer is behind), the receiver takes the next chunk only once the
//!   previous one is written.
//! - The bytes sent are the snapshot file itself, checksum included: the receiver checks the
//!   file it assembled before openraft sees it (once: the install does not read it again,
//!   see `snapshot_file`), so a stream that broke, or ended early because the file shrank
//!   under the sender (a newer snapshot replaced it), fails that send only; it is never
//!   installed, and never reaches openraft's install, where any error stops the member.
//! - A send that fails is restarted by openraft from the newest snapshot file; nothing is
//!   rebuilt for it (the file stays until a newer snapshot replaces it).

use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use tonic::Status;

use super::error::StoreError;
use super::limits::SNAPSHOT_CHUNK;
use super::snapshot_file::{Incoming, SnapshotFile};
use super::types::SnapshotMeta;
use crate::proto::kvdpb::SnapshotChunk;

/// Why a send stopped early, if it did (a read of the file failed).
pub type SendFailure = Arc<Mutex<Option<StoreError>>>;

/// The chunks of a send: `header` alone first, then `file`'s bytes, read one chunk at a
/// time as the stream is polled. A read error ends the stream early and is left in the
/// returned [`SendFailure`] (the receiver refuses the short file).
pub fn chunks(
    header: Vec<u8>,
    file: SnapshotFile,
) -> (
    impl Stream<Item = SnapshotChunk> + Send + 'static,
    SendFailure,
) {
    let failure = SendFailure::default();
    let first = SnapshotChunk {
        header,
        data: Vec::new(),
    };
    let file = Arc::new(file);
    let failed = failure.clone();
    let data = futures::stream::unfold(0u64, move |offset| {
        let (file, failed) = (file.clone(), failed.clone());
        async move {
            let len = file.len();
            if offset >= len {
                return None;
            }
            let n = (len - offset).min(SNAPSHOT_CHUNK as u64) as usize;
            let read = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; n];
                file.read_at(offset, &mut buf).map(|()| buf)
            })
            .await
            .unwrap_or_else(|e| Err(StoreError::Io(std::io::Error::other(e))));
            match read {
                Ok(data) => Some((
                    SnapshotChunk {
                        header: Vec::new(),
                        data,
                    },
                    offset + n as u64,
                )),
                Err(e) => {
                    *failed.lock().unwrap() = Some(e);
                    None
                }
            }
        }
    });
    (futures::stream::iter([first]).chain(data), failure)
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// Appends `first` and then every chunk of `rest` to `incoming`, checks the whole file against
/// `meta` ([`SnapshotFile::check`]) and hands it over (synced, still a temporary, marked as
/// checked: see `snapshot_file::adopt`). A broken stream, a failed write or a file that does not check
/// drops the temporary and fails this send only (`Aborted`: the leader sends again).
pub async fn receive(
    mut incoming: Incoming,
    meta: &SnapshotMeta,
    first: Vec<u8>,
    mut rest: impl Stream<Item = Result<SnapshotChunk, Status>> + Unpin,
) -> Result<SnapshotFile, Status> {
    let mut next = Some(first);
    loop {
        if let Some(data) = next.take().filter(|d| !d.is_empty()) {
            // A write and maybe an fdatasync: off the async workers.
            incoming =
                tokio::task::spawn_blocking(move || incoming.append(&data).map(|()| incoming))
                    .await
                    .map_err(internal)?
                    .map_err(internal)?;
        }
        match rest.next().await {
            Some(chunk) => next = Some(chunk?.data),
            None => break,
        }
    }
    let meta = meta.clone();
    tokio::task::spawn_blocking(move || {
        let file = incoming.finish().map_err(internal)?;
        match file.check(&meta) {
            Ok(checked) => Ok(checked),
            Err(e) => {
                tracing::warn!("refused a received snapshot: {e}");
                Err(Status::aborted(format!("received snapshot refused: {e}")))
            }
        }
    })
    .await
    .map_err(internal)?
}
