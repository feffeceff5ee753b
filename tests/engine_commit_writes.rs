//! The committer's batches (history records in key order, and the meta tree, in one
//! transaction every 100 ms) are written to disk about once.
//!
//! sled 0.34 wrote each record's chunk as a delta and the last leaf again, whole, each time
//! it split; the vendored sled lays out a transaction's appends to the history as whole
//! leaves, as it does a bulk load's (third_party/sled/KVD_PATCH.md, fifth change). Checked
//! with the bytes this process sent to the disk (`write_bytes` in /proc/self/io); this binary
//! has one test, so nothing else writes meanwhile.

use kvd::mvcc::engine::{Engine, StoreEngine, Tree};

mod common;

const RECORDS: usize = 48 * 1024;
const VALUE: usize = 1024;
/// About 100 ms of puts at 2,500 puts/s: the committer persists every 100 ms.
const PER_BATCH: usize = 256;

#[test]
fn committed_batches_are_written_about_once() {
    let d = common::engine::assert_written_about_once(RECORDS, VALUE, |engine| {
        common::engine::write_commits(engine, RECORDS, VALUE, PER_BATCH)
    });
    let engine = StoreEngine::open(d.path()).unwrap();
    common::engine::assert_records(&engine, RECORDS, VALUE);
    let last = ((RECORDS - 1) / PER_BATCH * PER_BATCH) as u64;
    let applied = engine.get(Tree::Meta, b"applied").unwrap().unwrap();
    assert_eq!(&applied[..], &last.to_be_bytes()[..]);
}
