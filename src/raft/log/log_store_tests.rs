//! The in-memory window of the log store: entries beyond it are read back from the WAL,
//! across truncations, purges and reopening.

use bytes::Bytes;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::testing::log_id;

use super::*;
use crate::raft::types::Command;

fn entry(term: u64, index: u64) -> Entry {
    let mut v = vec![0u8; 1024];
    v[..8].copy_from_slice(&index.to_le_bytes());
    v[8..16].copy_from_slice(&term.to_le_bytes());
    Entry::new_normal(
        log_id::<TypeConfig>(term, 1, index),
        Command(Bytes::from(v)),
    )
}

/// Checks that `got` are the entries `first..first + got.len()` of `term_of`.
fn check(got: &[Entry], first: u64, term_of: impl Fn(u64) -> u64) {
    for (k, e) in got.iter().enumerate() {
        let i = first + k as u64;
        assert_eq!(e.index(), i);
        let want = entry(term_of(i), i);
        assert_eq!(e.log_id(), want.log_id());
        assert_eq!(e.payload, want.payload, "entry {i}");
    }
}

async fn append(log: &mut LogStore, term: u64, range: std::ops::Range<u64>) {
    for chunk in range.collect::<Vec<_>>().chunks(500) {
        let entries: Vec<Entry> = chunk.iter().map(|&i| entry(term, i)).collect();
        log.append(entries, IOFlushed::noop()).await.unwrap();
    }
    // An empty write completes after every earlier one: the appends are durable.
    log.wal().write(vec![]).await.unwrap();
}

fn in_memory(log: &LogStore) -> usize {
    log.state.lock().unwrap().entries.len()
}

#[tokio::test]
async fn entries_beyond_the_window_are_read_back_from_the_wal() {
    let d = tempfile::tempdir().unwrap();
    let mut log = LogStore::open(d.path()).unwrap();
    log.set_cache_bytes(8 << 10);
    append(&mut log, 1, 0..300).await;
    assert!(
        in_memory(&log) <= 8,
        "window not bounded: {}",
        in_memory(&log)
    );

    let all = log.try_get_log_entries(0..).await.unwrap();
    assert_eq!(all.len(), 300);
    check(&all, 0, |_| 1);
    check(&log.try_get_log_entries(17..=40).await.unwrap(), 17, |_| 1);
    // A replication batch stops at its byte limit, across the WAL and memory parts.
    let batch = log.limited_get_log_entries(0, 300).await.unwrap();
    assert_eq!(batch.len(), 300);

    // A truncation below the window, then a new term's entries.
    log.truncate_after(Some(log_id::<TypeConfig>(1, 1, 99)))
        .await
        .unwrap();
    assert_eq!(log.last_index(), 99);
    assert_eq!(log.try_get_log_entries(0..).await.unwrap().len(), 100);
    append(&mut log, 2, 100..150).await;
    let term_of = |i: u64| if i < 100 { 1 } else { 2 };
    check(&log.try_get_log_entries(0..).await.unwrap(), 0, term_of);

    log.purge(log_id::<TypeConfig>(1, 1, 30)).await.unwrap();
    let rest = log.try_get_log_entries(0..).await.unwrap();
    assert_eq!(rest.len(), 119);
    check(&rest, 31, term_of);
    drop(log);

    // Reopened, the replay rebuilds the same log.
    let mut log = LogStore::open(d.path()).unwrap();
    assert_eq!(log.last_index(), 149);
    let st = log.get_log_state().await.unwrap();
    assert_eq!(st.last_purged_log_id.map(|l| l.index), Some(30));
    assert_eq!(st.last_log_id, Some(entry(2, 149).log_id()));
    check(&log.try_get_log_entries(0..).await.unwrap(), 31, term_of);
}

/// A replay longer than the window keeps only the window in memory, and a truncation below
/// it leaves the last id to be read back from the WAL.
#[tokio::test]
async fn reopening_a_long_log_keeps_only_the_window() {
    let n = (LOG_CACHE_BYTES / 1024 + 2000) as u64;
    let d = tempfile::tempdir().unwrap();
    let mut log = LogStore::open(d.path()).unwrap();
    append(&mut log, 1, 0..n).await;
    assert!((in_memory(&log) as u64) < n);
    drop(log);

    let mut log = LogStore::open(d.path()).unwrap();
    assert!((in_memory(&log) as u64) < n);
    assert_eq!(log.last_index(), n - 1);
    check(&log.try_get_log_entries(0..).await.unwrap(), 0, |_| 1);
    log.truncate_after(Some(log_id::<TypeConfig>(1, 1, 10)))
        .await
        .unwrap();
    drop(log);

    let mut log = LogStore::open(d.path()).unwrap();
    assert_eq!(log.last_index(), 10);
    assert_eq!(in_memory(&log), 0);
    let st = log.get_log_state().await.unwrap();
    assert_eq!(st.last_log_id, Some(entry(1, 10).log_id()));
    check(&log.try_get_log_entries(0..).await.unwrap(), 0, |_| 1);
    append(&mut log, 3, 11..20).await;
    check(&log.try_get_log_entries(0..).await.unwrap(), 0, |i| {
        if i <= 10 {
            1
        } else {
            3
        }
    });
}
