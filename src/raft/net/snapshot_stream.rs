//! A snapshot on the wire: the leader's side streams it in [`SNAPSHOT_CHUNK`]s, encoded from
//! its engine as it goes (in tests, also read from a file), the receiving side writes it into an engine
//! generation of its own as the chunks arrive (`state_machine::staging`).
//!
//! Invariants:
//! - Neither side holds more than a few chunks of a snapshot in memory: the sender reads
//!   (encodes) one chunk ahead of the gRPC stream, on a thread at nice 10, and waits while
//!   the stream does not take it (HTTP/2 flow control holds the stream back while the peer
//!   is behind); the receiver takes the next chunk only while its engine writes keep up (a
//!   queue of two chunks).
//! - The bytes sent are a whole snapshot file's, checksum included: the receiver checks what
//!   it staged before openraft sees it, so a stream that broke, or ended early because a read
//!   failed on the sender, fails that send only; it is never installed, and never reaches
//!   openraft's install, where any error stops the member.
//! - A send that fails is restarted by openraft with a new snapshot of the current state
//!   (`snapshot_data`): a retry sends what is current then, and the failed send's image is
//!   dropped with its stream.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tonic::Status;

use crate::proto::kvdpb::SnapshotChunk;
use crate::raft::error::StoreError;
use crate::raft::limits::SNAPSHOT_CHUNK;
use crate::raft::sm::background;
use crate::raft::sm::snapshot_data::{Encoder, SnapshotData};
use crate::raft::sm::state_machine::{StagedSnapshot, Stager};
use crate::sync::LockExt;

/// Why a send stopped early, if it did (a read of the file or of the engine failed).
pub type SendFailure = Arc<Mutex<Option<StoreError>>>;

/// Where the bytes of a send come from.
enum Source {
    /// A snapshot file, read from `offset` on (tests: kvd sends live snapshots).
    #[cfg(test)]
    File {
        file: crate::raft::sm::snapshot_file_install::SnapshotFile,
        offset: u64,
    },
    /// A live snapshot, encoded as it is sent.
    Live(Encoder),
}

impl Source {
    /// The next chunk, or `None` after the last. Blocks (file or engine reads).
    fn next(&mut self) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            #[cfg(test)]
            Source::File { file, offset } => {
                let len = file.len();
                if *offset >= len {
                    return Ok(None);
                }
                let n = (len - *offset).min(SNAPSHOT_CHUNK as u64) as usize;
                let mut buf = vec![0u8; n];
                file.read_at(*offset, &mut buf)?;
                *offset += n as u64;
                Ok(Some(buf))
            }
            Source::Live(enc) => enc.next_chunk(SNAPSHOT_CHUNK),
        }
    }
}

/// The chunks of a send: `header` alone first, then the snapshot's bytes, one chunk at a
/// time as the stream is polled (a file's read, a live snapshot's encoded). A read error ends
/// the stream early and is left in the returned [`SendFailure`] (the receiver refuses the
/// short file).
pub fn chunks(
    header: Vec<u8>,
    data: SnapshotData,
) -> (
    impl Stream<Item = SnapshotChunk> + Send + 'static,
    SendFailure,
) {
    let failure = SendFailure::default();
    let first = SnapshotChunk {
        header: header.into(),
        data: Bytes::new(),
    };
    let source = match data {
        #[cfg(test)]
        SnapshotData::File(file) => Ok(Source::File { file, offset: 0 }),
        SnapshotData::Live(live) => live.encoder().map(Source::Live),
        // openraft sends what `get_current_snapshot` gives, which is live.
        SnapshotData::Staged(s) => Err(StoreError::Io(std::io::Error::other(format!(
            "{s:?} is a received snapshot, installed, never sent"
        )))),
    };
    // Read (a live snapshot: encoded from the engine) on a thread at a lower priority, one
    // chunk ahead of the stream: the leader's client traffic goes first.
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(1);
    let failed = failure.clone();
    let started = background::spawn("kvd-snap-send", move || {
        let mut source = source?;
        while let Some(chunk) = source.next()? {
            if tx.blocking_send(chunk).is_err() {
                // The stream was dropped: the send ended.
                break;
            }
        }
        Ok(())
    })
    .map_err(StoreError::Io);
    let done = match started {
        Ok(done) => Some(done),
        Err(e) => {
            *failure.lock_or_recover() = Some(e);
            None
        }
    };
    let data = futures::stream::unfold((rx, done), move |(mut rx, done)| {
        let failed = failed.clone();
        async move {
            if let Some(data) = rx.recv().await {
                let chunk = SnapshotChunk {
                    header: Bytes::new(),
                    data: data.into(),
                };
                return Some((chunk, (rx, done)));
            }
            // The reader ended: after the last chunk, or early on an error (which the
            // receiver's check of the whole file also catches).
            let ended = match done?.await {
                Ok(ended) => ended,
                Err(_) => Err(StoreError::Io(std::io::Error::other(
                    "the snapshot send thread panicked",
                ))),
            };
            if let Err(e) = ended {
                *failed.lock_or_recover() = Some(e);
            }
            None
        }
    });
    (futures::stream::iter([first]).chain(data), failure)
}

/// Hands `first` and then every chunk of `rest` to `stager`, which writes the snapshot into an
/// engine generation of its own as it arrives and checks it whole at the end (framing, trees,
/// checksum, and that it is the snapshot of the `meta` it was staged for: see
/// `state_machine::staging`). A broken stream, a failed write or a snapshot that does not check
/// discards the generation and fails this send only (`Aborted`: the leader sends again).
pub async fn receive(
    mut stager: Stager,
    first: Bytes,
    mut rest: impl Stream<Item = Result<SnapshotChunk, Status>> + Unpin,
) -> Result<StagedSnapshot, Status> {
    let saved = crate::metrics::timed(&crate::metrics::SNAP_DB_SAVE_SECONDS);
    let mut next = Some(first);
    let mut broken = None;
    while let Some(data) = next.take() {
        if stager.push(data).await.is_err() {
            // The writer stopped: `finish` says why.
            break;
        }
        match rest.next().await {
            Some(Ok(chunk)) => next = Some(chunk.data),
            Some(Err(e)) => broken = Some(e),
            None => {}
        }
    }
    if let Some(e) = broken {
        // Dropping the stager ends the writer's input early; it discards the generation.
        drop(stager);
        return Err(e);
    }
    match stager.finish().await {
        Ok(staged) => Ok(saved(staged)),
        Err(e) => {
            tracing::warn!("refused a received snapshot: {e}");
            Err(Status::aborted(format!("received snapshot refused: {e}")))
        }
    }
}
