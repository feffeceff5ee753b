//! The sender's side of [`snapshot_stream::chunks`](super::snapshot_stream::chunks): the
//! header first, then every byte of the snapshot in order, read on a thread of its own; a
//! read that fails ends the stream early and is left in the returned failure.

use std::fs::OpenOptions;
use std::io::BufWriter;

use futures::StreamExt;

use super::snapshot_stream::chunks;
use crate::raft::limits::SNAPSHOT_CHUNK;
use crate::raft::sm::snapshot_data::SnapshotData;
use crate::raft::sm::snapshot_file_install::SnapshotFile;
use crate::raft::sm::snapshot_format::Writer;
use crate::raft::types::SnapshotMeta;

/// A snapshot file of a little over two chunks.
fn snapshot(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("snap");
    let meta = SnapshotMeta {
        last_log_id: Some(openraft::testing::log_id::<crate::raft::TypeConfig>(
            1, 1, 7,
        )),
        ..Default::default()
    };
    let out = BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut w = Writer::new(out, &meta).unwrap();
    let value = vec![7u8; 64 << 10];
    for i in 0u64..(2 * SNAPSHOT_CHUNK as u64 / (64 << 10) + 3) {
        w.push("mvcc_rev", &i.to_be_bytes(), &value).unwrap();
    }
    w.finish()
        .unwrap()
        .into_inner()
        .unwrap()
        .sync_all()
        .unwrap();
    path
}

#[tokio::test]
async fn a_send_streams_the_header_then_every_byte() {
    let d = tempfile::tempdir().unwrap();
    let path = snapshot(d.path());
    let (_, file) = SnapshotFile::open(&path).unwrap();
    let (stream, failure) = chunks(b"header".to_vec(), SnapshotData::File(file));
    let got: Vec<_> = stream.collect().await;
    assert_eq!(&got[0].header[..], b"header");
    assert!(got[0].data.is_empty());
    assert!(got[1..].iter().all(|c| c.header.is_empty()));
    assert_eq!(got.len(), 1 + 3, "the header and three chunks");
    let data: Vec<u8> = got[1..].iter().flat_map(|c| c.data.clone()).collect();
    assert!(data == std::fs::read(&path).unwrap(), "the bytes differ");
    assert!(failure.lock().unwrap().is_none());
}

#[tokio::test]
async fn a_read_that_fails_ends_the_send_and_says_why() {
    let d = tempfile::tempdir().unwrap();
    let path = snapshot(d.path());
    let (_, file) = SnapshotFile::open(&path).unwrap();
    // Shrunk under the sender (as a newer snapshot replacing it would) once the header and
    // the first chunk were sent: the third chunk, at least, cannot be read.
    let (stream, failure) = chunks(Vec::new(), SnapshotData::File(file));
    let mut stream = Box::pin(stream);
    stream.next().await.unwrap();
    assert_eq!(stream.next().await.unwrap().data.len(), SNAPSHOT_CHUNK);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(SNAPSHOT_CHUNK as u64 + 10)
        .unwrap();
    let rest: Vec<_> = stream.collect().await;
    // The second chunk may have been read ahead before the file shrank; nothing after it.
    assert!(rest.len() <= 1, "{} chunks after a failed read", rest.len());
    let why = failure.lock().unwrap().take().expect("a failure");
    assert!(why.to_string().contains("shrunk"), "{why}");
}
