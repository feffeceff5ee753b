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

/// The bytes this process has sent to the disk (`write_bytes` in /proc/self/io).
fn written() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .expect("write_bytes in /proc/self/io")
        .trim()
        .parse()
        .expect("a byte count")
}

/// Opens an engine in a new directory on the build's disk (not a tmpfs /tmp, where nothing
/// would count as written), lets `write` write `records` records of `len` bytes into it and
/// closes it; fails unless the bytes this process sent to the disk meanwhile are at least the
/// records' and under 1.5 times them. The caller's binary must hold only this test, so that
/// nothing else writes meanwhile. Returns the directory, for [`assert_records`].
pub fn assert_written_about_once(
    records: usize,
    len: usize,
    write: impl FnOnce(&StoreEngine),
) -> tempfile::TempDir {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let before = written();
    {
        let engine = StoreEngine::open(d.path()).unwrap();
        write(&engine);
    }
    let bytes = written() - before;
    let data = (records * (len + 8)) as u64;
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
    d
}

/// The history holds records 0..`records` as [`write_records`] writes them, and nothing else.
pub fn assert_records(engine: &StoreEngine, records: usize, len: usize) {
    let mut seen = 0;
    for (i, item) in engine.iter(Tree::Rev).enumerate() {
        let (k, v) = item.unwrap();
        assert_eq!(&k[..], &(i as u64).to_be_bytes()[..]);
        assert_eq!(&v[..], &value(i, len)[..]);
        seen += 1;
    }
    assert_eq!(seen, records);
}
