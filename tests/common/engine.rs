//! Records written straight into a storage engine, as a bulk load writes them.

use kvd::mvcc::engine::{Engine, StoreEngine, Tree, WriteBatch};

/// The value of record `i`: `len` bytes of `i % 251`.
pub fn value(i: usize, len: usize) -> Vec<u8> {
    vec![(i % 251) as u8; len]
}

/// Writes `records` history records (key `i` as 8 big-endian bytes, [`value`]`(i, len)`) in
/// key order, in batches of 1024 as a load writes them, then flushes.
pub fn write_records(engine: &StoreEngine, records: usize, len: usize) {
    for first in (0..records).step_by(1024) {
        let mut batch = WriteBatch::default();
        for i in first..(first + 1024).min(records) {
            batch.put(Tree::Rev, (i as u64).to_be_bytes().to_vec(), value(i, len));
        }
        engine.write(batch).unwrap();
    }
    engine.flush().unwrap();
}

/// Writes `records` history records as [`write_records`] does, but in batches of `per_batch`
/// that also write the meta tree (the applied index), as the committer persists applied
/// entries: each batch is a transaction over both trees. Then flushes.
pub fn write_commits(engine: &StoreEngine, records: usize, len: usize, per_batch: usize) {
    for first in (0..records).step_by(per_batch) {
        let mut batch = WriteBatch::default();
        for i in first..(first + per_batch).min(records) {
            batch.put(Tree::Rev, (i as u64).to_be_bytes().to_vec(), value(i, len));
        }
        batch.put(
            Tree::Meta,
            &b"applied"[..],
            (first as u64).to_be_bytes().to_vec(),
        );
        engine.write(batch).unwrap();
    }
    engine.flush().unwrap();
}
