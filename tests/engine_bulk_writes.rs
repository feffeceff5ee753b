//! A bulk load (a restore, a received snapshot, a defragmentation's copy: the history written
//! in key order, in batches of 1024 records) is written to disk about once.
//!
//! sled 0.34 wrote each insert as a delta and the last leaf again, whole, each time it split,
//! 3-5 times the records' bytes; the vendored sled appends such batches as whole leaves
//! (third_party/sled/KVD_PATCH.md, fourth change). Checked with the bytes this process sent to
//! the disk (`write_bytes` in /proc/self/io); this binary has one test, so nothing else writes
//! meanwhile.

use kvd::mvcc::engine::{Engine, StoreEngine, Tree};

mod common;

const RECORDS: usize = 48 * 1024;
const VALUE: usize = 1024;

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
fn a_bulk_load_is_written_about_once() {
    // On the build's disk, not a tmpfs /tmp, where nothing would count as written.
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let before = written();
    {
        let engine = StoreEngine::open(d.path()).unwrap();
        common::engine::write_records(&engine, RECORDS, VALUE);
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
}
