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

fn written() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .expect("write_bytes in /proc/self/io")
        .trim()
        .parse()
        .expect("a byte count")
}

#[test]
fn committed_batches_are_written_about_once() {
    // On the build's disk, not a tmpfs /tmp, where nothing would count as written.
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let before = written();
    {
        let engine = StoreEngine::open(d.path()).unwrap();
        common::engine::write_commits(&engine, RECORDS, VALUE, PER_BATCH);
    }
    let bytes = written() - before;
    let data = (RECORDS * (VALUE + 8)) as u64;
    eprintln!(
        "{} MiB of records, {} MiB written ({:.2}x)",
        data >> 20,
        bytes >> 20,
        bytes as f64 / data as f64
    );
    assert!(bytes >= data, "the records did not all reach the disk");
    assert!(
        bytes < data * 3 / 2,
        "{bytes} bytes written for {data} bytes of records"
    );
    let engine = StoreEngine::open(d.path()).unwrap();
    let mut seen = 0;
    for (i, item) in engine.iter(Tree::Rev).enumerate() {
        let (k, v) = item.unwrap();
        assert_eq!(&k[..], &(i as u64).to_be_bytes()[..]);
        assert_eq!(&v[..], &common::engine::value(i, VALUE)[..]);
        seen += 1;
    }
    assert_eq!(seen, RECORDS);
    let last = ((RECORDS - 1) / PER_BATCH * PER_BATCH) as u64;
    let applied = engine.get(Tree::Meta, b"applied").unwrap().unwrap();
    assert_eq!(&applied[..], &last.to_be_bytes()[..]);
}
