//! Compacted history deleted in the background: what readers, reopens and snapshot loads see
//! while the records are still there.

use super::tests::{compact, del, put, temp_store};
use super::*;
use crate::proto::etcdserverpb::CompactionRequest;

/// a@2 a@3 b@4 b deleted@5 a@6, then a compaction at 5 (and a failing one in the same batch).
/// The collector of `s` is stopped first, so the removed records stay in the engine.
fn compacted_with_garbage_left(s: &MvccStore) {
    s.inner.pending.garbage.close();
    put(s, "a", "1");
    put(s, "a", "2");
    put(s, "b", "1");
    del(s, "b", "");
    put(s, "a", "3");
    let reqs = [5, 3].map(|rev| {
        WriteRequest::Compact(CompactionRequest {
            revision: rev,
            physical: false,
        })
    });
    let out = s.apply(&reqs, &[]).unwrap();
    assert!(out[0].is_ok());
    assert_eq!(out[1], Err(MvccError::Compacted));
    s.persist_pending().unwrap();
    assert_eq!(history(s), [2, 3, 4, 5, 6], "nothing deleted yet");
}

fn history(s: &MvccStore) -> Vec<i64> {
    s.engine()
        .iter(engine::Tree::Rev)
        .map(|item| Revision::from_bytes(&item.unwrap().0).unwrap().main)
        .collect()
}

/// (type, key, mod revision) of every event from `rev` on.
fn events(s: &MvccStore, rev: i64) -> Vec<(i32, Vec<u8>, i64)> {
    s.events_since(rev, b"\0", b"\0", true, 0)
        .unwrap()
        .events
        .into_iter()
        .map(|e| {
            let kv = e.kv.unwrap();
            (e.r#type, kv.key, kv.mod_revision)
        })
        .collect()
}

fn assert_reads_as_compacted_at_5(s: &MvccStore) {
    assert_eq!(s.compacted_revision(), 5);
    assert_eq!(s.get_at(b"a", 5).unwrap().unwrap().value, b"2");
    assert_eq!(s.get_at(b"b", 5).unwrap(), None);
    assert_eq!(s.get_at(b"a", 4).unwrap_err(), MvccError::Compacted);
    // The tombstone at 5 is compacted away, as in etcd: a watch from 5 sees only a@6.
    assert_eq!(events(s, 5), [(EventType::Put as i32, b"a".to_vec(), 6)]);
    assert_eq!(
        s.events_since(4, b"a", b"", false, 0).unwrap_err(),
        MvccError::Compacted
    );
}

#[test]
fn compacted_records_not_yet_deleted_are_never_read() {
    let (_d, _db, s) = temp_store();
    compacted_with_garbage_left(&s);
    assert_reads_as_compacted_at_5(&s);
}

#[test]
fn reopen_deletes_compacted_records_a_close_left() {
    let (_d, db, s) = temp_store();
    compacted_with_garbage_left(&s);
    drop(s);
    let s = MvccStore::open(db.clone()).unwrap();
    assert_reads_as_compacted_at_5(&s);
    s.settle();
    assert_eq!(history(&s), [3, 6]);
    assert_reads_as_compacted_at_5(&s);
}

#[test]
fn loading_an_image_with_compacted_records_drops_them() {
    let (_d, _db, s) = temp_store();
    compacted_with_garbage_left(&s);
    let image: Vec<_> = s.dump().map(Result::unwrap).collect();
    let (_d2, _db2, s2) = temp_store();
    s2.load(image, &[]).unwrap();
    assert_reads_as_compacted_at_5(&s2);
    s2.settle();
    assert_eq!(history(&s2), [3, 6]);
}

#[test]
fn collector_deletes_a_large_compaction_in_chunks_while_applies_go_on() {
    let (_d, _db, s) = temp_store();
    let n = 5 * garbage::CHUNK;
    for i in 0..n {
        put(&s, &format!("k{}", i % 10), "v");
    }
    let at = s.current_revision();
    compact(&s, at).unwrap();
    for i in 0..10 {
        put(&s, &format!("k{i}"), "after");
    }
    s.settle();
    // Per key: its revision at `at` and the one after.
    assert_eq!(history(&s).len(), 20);
    assert_eq!(s.get_at(b"k3", at).unwrap().unwrap().value, b"v");
    assert_eq!(get_value(&s, "k3"), b"after");
}

fn get_value(s: &MvccStore, k: &str) -> Vec<u8> {
    s.get_at(k.as_bytes(), 0).unwrap().unwrap().value
}

/// A physical compaction waits for the collector: when `wait_physically_compacted` returns,
/// the records are gone from the engine (etcd's `physc`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn physical_wait_ends_when_the_records_are_deleted() {
    let (_d, _db, s) = temp_store();
    let n = 3 * garbage::CHUNK;
    for i in 0..n {
        put(&s, &format!("k{}", i % 10), "v");
    }
    let at = s.current_revision();
    compact(&s, at).unwrap();
    s.wait_physically_compacted(at).await.unwrap();
    assert_eq!(
        history(&s).len(),
        10,
        "only each key's revision at the compaction is left"
    );
    // Already done: returns at once, also for an older compaction.
    s.wait_physically_compacted(at).await.unwrap();
    s.wait_physically_compacted(2).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn physical_wait_for_a_compaction_with_nothing_to_delete_ends() {
    let (_d, _db, s) = temp_store();
    put(&s, "a", "1");
    put(&s, "b", "1");
    compact(&s, 3).unwrap();
    tokio::time::timeout(Duration::from_secs(10), s.wait_physically_compacted(3))
        .await
        .expect("no records to delete: done after the persist")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn physical_wait_is_not_done_while_the_collector_is_stopped() {
    let (_d, _db, s) = temp_store();
    compacted_with_garbage_left(&s);
    let waited = tokio::time::timeout(Duration::from_millis(500), s.wait_physically_compacted(5));
    assert!(waited.await.is_err(), "records are still in the engine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopened_store_finishes_the_deletion_a_close_left_and_says_so() {
    let (_d, db, s) = temp_store();
    compacted_with_garbage_left(&s);
    drop(s);
    let s = MvccStore::open(db.clone()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), s.wait_physically_compacted(5))
        .await
        .expect("the reopened store deletes what the compaction at 5 removed")
        .unwrap();
    assert_eq!(history(&s), [3, 6]);
}

/// The collector deletes in revision order, newest first, whatever order the key index
/// yields the garbage in: a chunk of deletions then covers neighbouring history records, so
/// each stored chunk of records is rewritten once rather than once per key.
#[test]
fn collector_deletes_the_newest_garbage_first() {
    let (_d, _db, s) = temp_store();
    s.inner.pending.garbage.close();
    // Key order (k0..k9) and revision order differ: every key has garbage all along.
    let n = 3 * garbage::CHUNK;
    for i in 0..n {
        put(&s, &format!("k{}", i % 10), "v");
    }
    let at = s.current_revision();
    compact(&s, at).unwrap();
    s.persist_pending().unwrap();
    let before = history(&s);
    let step = || {
        let g = &s.inner.pending.garbage;
        g.step(&s.inner.idx, &s.inner.engine, &s.inner.history_gate)
            .unwrap()
    };
    assert_eq!(
        step(),
        garbage::Step::Worked {
            rest: Duration::ZERO
        },
        "the index"
    );
    assert!(matches!(step(), garbage::Step::Worked { .. }));
    let after = history(&s);
    let deleted: Vec<i64> = before
        .iter()
        .filter(|r| !after.contains(r))
        .copied()
        .collect();
    assert_eq!(deleted.len(), garbage::CHUNK);
    // Each key's newest revision at `at` stays; every other record is garbage.
    let garbage_left = after.iter().filter(|&&r| r <= at - 10).count();
    assert_eq!(garbage_left, n - 10 - garbage::CHUNK);
    let oldest_deleted = deleted[0];
    assert!(
        after
            .iter()
            .filter(|&&r| r <= at - 10)
            .all(|&r| r < oldest_deleted),
        "a chunk deletes the newest garbage: deleted {deleted:?}"
    );
}
