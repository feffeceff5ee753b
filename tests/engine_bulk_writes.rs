//! A bulk load (a restore, a received snapshot, a defragmentation's copy: the history written
//! in key order, in batches of 1024 records) is written to disk about once.
//!
//! sled 0.34 wrote each insert as a delta and the last leaf again, whole, each time it split,
//! 3-5 times the records' bytes; the vendored sled appends such batches as whole leaves
//! (third_party/sled/KVD_PATCH.md, fourth change). Checked with the bytes this process sent to
//! the disk (`write_bytes` in /proc/self/io); this binary has one test, so nothing else writes
//! meanwhile.

use kvd::mvcc::engine::StoreEngine;

mod common;

const RECORDS: usize = 48 * 1024;
const VALUE: usize = 1024;

#[test]
fn a_bulk_load_is_written_about_once() {
    let d = common::engine::assert_written_about_once(RECORDS, VALUE, |engine| {
        common::engine::write_records(engine, RECORDS, VALUE)
    });
    let engine = StoreEngine::open(d.path()).unwrap();
    common::engine::assert_records(&engine, RECORDS, VALUE);
}
