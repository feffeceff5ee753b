//! The [`Engine`] contract (see the module doc), checked against [`SledEngine`] and the
//! test-only [`MemEngine`].

use std::ops::Bound::{Excluded, Included, Unbounded};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::mem::MemEngine;
use super::{Engine, SledEngine, Tree, WriteBatch};

fn keys<E: Engine>(it: E::Iter) -> Vec<Vec<u8>> {
    it.map(|r| r.unwrap().0.to_vec()).collect()
}

fn fill<E: Engine>(e: &E, tree: Tree, ks: &[&[u8]]) {
    let mut b = WriteBatch::default();
    for k in ks {
        b.put(tree, *k, *k);
    }
    e.write(b).unwrap();
}

fn point_reads_and_trees_are_separate<E: Engine>(e: &E) {
    let mut b = WriteBatch::default();
    b.put(Tree::Rev, &b"k"[..], &b"rev"[..]);
    b.put(Tree::Meta, &b"k"[..], &b"meta"[..]);
    e.write(b).unwrap();
    assert_eq!(
        e.get(Tree::Rev, b"k").unwrap().as_deref(),
        Some(&b"rev"[..])
    );
    assert_eq!(
        e.get(Tree::Meta, b"k").unwrap().as_deref(),
        Some(&b"meta"[..])
    );
    assert!(e.get(Tree::Lease, b"k").unwrap().is_none());

    // Writes apply in order within a batch.
    let mut b = WriteBatch::default();
    b.put(Tree::Rev, &b"k"[..], &b"x"[..]);
    b.delete(Tree::Rev, &b"k"[..]);
    b.delete(Tree::Meta, &b"k"[..]);
    b.put(Tree::Meta, &b"k"[..], &b"y"[..]);
    e.write(b).unwrap();
    assert!(e.get(Tree::Rev, b"k").unwrap().is_none());
    assert_eq!(e.get(Tree::Meta, b"k").unwrap().as_deref(), Some(&b"y"[..]));
    e.write(WriteBatch::default()).unwrap();
}

fn range_bounds_and_order<E: Engine>(e: &E) {
    let all: [&[u8]; 6] = [b"", b"a", b"a\0", b"ab", b"b", b"\xff"];
    fill(e, Tree::Lease, &all);
    let v = |s: &[&[u8]]| s.iter().map(|k| k.to_vec()).collect::<Vec<_>>();
    assert_eq!(keys::<E>(e.iter(Tree::Lease)), v(&all));
    let scan = |lo, hi| keys::<E>(e.range(Tree::Lease, lo, hi));
    assert_eq!(scan(Included(b"a"), Excluded(b"b")), v(&all[1..4]));
    assert_eq!(scan(Included(b"a"), Included(b"b")), v(&all[1..5]));
    assert_eq!(scan(Unbounded, Excluded(b"a\0")), v(&all[..2]));
    assert_eq!(scan(Included(b"ab"), Unbounded), v(&all[3..]));
    assert_eq!(scan(Excluded(b"a"), Included(b"ab")), v(&all[2..4]));
    assert_eq!(scan(Excluded(b"a"), Excluded(b"ab")), v(&all[2..3]));
    // Empty and inverted ranges are empty.
    assert!(scan(Included(b""), Excluded(b"")).is_empty());
    assert!(scan(Excluded(b"a"), Excluded(b"a")).is_empty());
    assert!(scan(Included(b"b"), Excluded(b"a")).is_empty());
    assert!(scan(Included(b"b"), Included(b"a")).is_empty());
    assert_eq!(
        keys::<E>(e.iter(Tree::Meta)),
        v(&[b"k"]),
        "other trees unchanged"
    );

    // Reverse order, and both ends of one scan.
    let back: Vec<_> = e
        .range(Tree::Lease, Included(b"a"), Unbounded)
        .rev()
        .map(|r| r.unwrap().0.to_vec())
        .collect();
    assert_eq!(back, v(&[b"\xff", b"b", b"ab", b"a\0", b"a"]));
    let mut it = e.range(Tree::Lease, Included(b"a"), Included(b"b"));
    assert_eq!(&*it.next().unwrap().unwrap().0, b"a");
    assert_eq!(&*it.next_back().unwrap().unwrap().0, b"b");
    assert_eq!(&*it.next_back().unwrap().unwrap().0, b"ab");
    assert_eq!(&*it.next().unwrap().unwrap().0, b"a\0");
    assert!(it.next().is_none());

    e.clear(Tree::Lease).unwrap();
    assert!(keys::<E>(e.iter(Tree::Lease)).is_empty());
}

/// Batch `i` writes `i` under many keys of two trees. A reader that reads the keys in the
/// batch's write order must never see a key older than one it read before: with batches
/// visible all at once, reads are monotonic; a batch seen half-applied would break it.
/// With `one_tree`, the meta key is written by a batch of its own before the rev tree's.
fn batches_are_all_or_nothing_for_readers<E: Engine>(e: &E, one_tree: bool) {
    const KEYS: u8 = 32;
    let write = |i: u64| {
        let mut b = WriteBatch::default();
        b.put(Tree::Meta, &b"i"[..], i.to_be_bytes().to_vec());
        if one_tree {
            e.write(std::mem::take(&mut b)).unwrap();
        }
        for k in 0..KEYS {
            b.put(Tree::Rev, vec![k], i.to_be_bytes().to_vec());
        }
        e.write(b).unwrap();
    };
    write(0);
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (e, done) = (e.clone(), done.clone());
        std::thread::spawn(move || {
            let read = |t: Tree, k: &[u8]| {
                let v = e.get(t, k).unwrap().expect("written");
                u64::from_be_bytes(v.as_ref().try_into().unwrap())
            };
            let mut rounds = 0u64;
            while !done.load(Ordering::SeqCst) || rounds < 10 {
                rounds += 1;
                // Separate batches are ordered, not atomic together.
                let mut seen = if one_tree { 0 } else { read(Tree::Meta, b"i") };
                for k in 0..KEYS {
                    let v = read(Tree::Rev, &[k]);
                    assert!(v >= seen, "key {k} at {v} after {seen}: batch seen in part");
                    seen = v;
                }
                // Forward through a scan, then the other tree.
                let scan: Vec<u64> = e
                    .iter(Tree::Rev)
                    .map(|r| u64::from_be_bytes(r.unwrap().1.as_ref().try_into().unwrap()))
                    .collect();
                assert_eq!(scan.len(), KEYS as usize);
                let last = *scan.last().unwrap();
                assert!(
                    scan.windows(2).all(|w| w[0] <= w[1]),
                    "scan saw a batch in part"
                );
                assert!(
                    read(Tree::Meta, b"i") >= last,
                    "meta older than the rev tree"
                );
            }
        })
    };
    for i in 1..300 {
        write(i);
    }
    done.store(true, Ordering::SeqCst);
    reader.join().unwrap();
}

fn contract<E: Engine>(e: &E) {
    point_reads_and_trees_are_separate(e);
    range_bounds_and_order(e);
    batches_are_all_or_nothing_for_readers(e, false);
    batches_are_all_or_nothing_for_readers(e, true);
}

#[test]
fn sled_engine_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    contract(&SledEngine::open_flushed_only(dir.path()).unwrap());
}

#[test]
fn mem_engine_keeps_the_contract() {
    contract(&MemEngine::default());
}

/// Reopens sled once the previous engine's threads let go of its lock.
pub(super) fn reopen_sled(dir: &std::path::Path) -> SledEngine {
    for _ in 0..300 {
        if let Ok(e) = SledEngine::open_flushed_only(dir) {
            return e;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("reopen sled");
}

fn flushed_writes_survive<E: Engine>(e: E, crash: impl FnOnce(E) -> E) {
    let mut b = WriteBatch::default();
    b.put(Tree::Rev, &b"r"[..], &b"1"[..]);
    b.put(Tree::Meta, &b"m"[..], &b"2"[..]);
    b.put(Tree::Lease, &b"l"[..], &b"3"[..]);
    e.write(b).unwrap();
    e.flush().unwrap();
    let e = crash(e);
    assert_eq!(e.get(Tree::Rev, b"r").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(e.get(Tree::Meta, b"m").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(
        e.get(Tree::Lease, b"l").unwrap().as_deref(),
        Some(&b"3"[..])
    );
}

#[test]
fn sled_engine_flushed_writes_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    flushed_writes_survive(SledEngine::open_flushed_only(&path).unwrap(), |e| {
        drop(e);
        reopen_sled(&path)
    });
}

/// An engine filled aside (its writes not waited for one by one) reads and recovers as any
/// other, and waits for each write again once told to.
#[test]
fn sled_engine_opened_aside_writes_back_until_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let e = SledEngine::open_aside(dir.path(), Default::default()).unwrap();
    assert!(e.writes_back());
    contract(&e);
    let before = e.range(Tree::Rev, Unbounded, Unbounded).count();
    // Enough to fill several of sled's 512 KiB log buffers.
    let mut b = WriteBatch::default();
    for i in 0u32..3000 {
        b.put(Tree::Rev, i.to_be_bytes().to_vec(), vec![i as u8; 1024]);
    }
    e.write(b).unwrap();
    e.end_write_back();
    assert!(!e.writes_back());
    let path = dir.path().to_path_buf();
    flushed_writes_survive(e, |e| {
        drop(e);
        reopen_sled(&path)
    });
    let e = reopen_sled(&path);
    assert!(!e.writes_back(), "a reopened engine waits for its writes");
    // With the one `flushed_writes_survive` adds.
    let after = e.range(Tree::Rev, Unbounded, Unbounded).count();
    assert_eq!(after, before + 3000 + 1);
}

#[test]
fn mem_engine_flushed_writes_survive_a_crash() {
    flushed_writes_survive(MemEngine::default(), |e| e.crash());
}

/// The on-disk layout: sled trees named as before, a legacy index tree dropped on open, and
/// an unchunked history tree (earlier versions) migrated into chunks and dropped.
#[test]
fn sled_engine_uses_the_stored_tree_names() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = ::sled::Config::new().path(dir.path()).open().unwrap();
        db.open_tree("mvcc_rev")
            .unwrap()
            .insert(b"r", b"1")
            .unwrap();
        db.open_tree("mvcc_meta")
            .unwrap()
            .insert(b"m", b"2")
            .unwrap();
        db.open_tree("mvcc_lease")
            .unwrap()
            .insert(b"l", b"3")
            .unwrap();
        db.open_tree(super::LEGACY_IDX_TREE)
            .unwrap()
            .insert(b"x", b"4")
            .unwrap();
        db.flush().unwrap();
    }
    let e = reopen_sled(dir.path());
    assert_eq!(e.get(Tree::Rev, b"r").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(e.get(Tree::Meta, b"m").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(
        e.get(Tree::Lease, b"l").unwrap().as_deref(),
        Some(&b"3"[..])
    );
    let names = e.db_tree_names();
    assert!(!names.iter().any(|n| n == super::LEGACY_IDX_TREE));
    assert!(!names.iter().any(|n| n == "mvcc_rev"), "{names:?}");
    assert!(names.iter().any(|n| n == "mvcc_rev_chunks"), "{names:?}");
    // The migration is done once: the migrated history survives the next open.
    drop(e);
    let e = reopen_sled(dir.path());
    assert_eq!(e.get(Tree::Rev, b"r").unwrap().as_deref(), Some(&b"1"[..]));
}

/// A database records its layout; one written by a newer layout is refused with a message
/// that says so, and left as it was.
#[test]
fn a_newer_engine_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(reopen_sled(dir.path()));
    {
        let db = ::sled::Config::new().path(dir.path()).open().unwrap();
        let rec = db
            .get(b"kvd/engine_format")
            .unwrap()
            .expect("recorded on open");
        assert_eq!(&rec[..], &super::sled::ENGINE_FORMAT.to_le_bytes());
        db.insert(
            b"kvd/engine_format",
            &(super::sled::ENGINE_FORMAT + 1).to_le_bytes(),
        )
        .unwrap();
        db.flush().unwrap();
    }
    let e = (0..300)
        .find_map(|_| match SledEngine::open(dir.path()) {
            Err(e @ crate::mvcc::MvccError::NewerEngine { .. }) => Some(e.to_string()),
            _ => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                None
            }
        })
        .expect("refused");
    assert!(e.contains("engine format"), "{e}");
}
