//! The history written in key order in large batches (a load, a received snapshot, a
//! defragmentation's copy, alone; the committer's, with the meta tree in one transaction),
//! which sled lays out as whole leaves (`apply_batch_appending`, third_party/sled): read back
//! the same as batches written one insert at a time, by concurrent readers while it grows,
//! after removes and inserts in the middle, after deletes that empty whole leaves (which sled
//! merges), and after a reopen. That it is written about once is
//! `tests/engine_bulk_writes.rs`'s and `tests/engine_commit_writes.rs`'s.

use std::collections::BTreeMap;
use std::ops::Bound::{Included, Unbounded};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{Engine, SledEngine, Tree, WriteBatch};

const BATCHES: u64 = 40;
const PER_BATCH: u64 = 512;
const VAL: usize = 200;

fn key(i: u64) -> Vec<u8> {
    (i * 4).to_be_bytes().to_vec()
}

fn val(i: u64, round: u8) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; VAL];
    v[0] = round;
    v
}

fn check(e: &SledEngine, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let all: Vec<(Vec<u8>, Vec<u8>)> = e
        .iter(Tree::Rev)
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(all.len(), want.len());
    assert!(all == want, "the history differs from what was written");
    let back: Vec<Vec<u8>> = e
        .iter(Tree::Rev)
        .rev()
        .map(|r| r.unwrap().0.to_vec())
        .collect();
    assert!(back.iter().rev().eq(model.keys()), "reverse scan differs");
    for i in (0..BATCHES * PER_BATCH).step_by(97) {
        for k in [key(i), (i * 4 + 1).to_be_bytes().to_vec()] {
            assert_eq!(
                e.get(Tree::Rev, &k).unwrap().map(|v| v.to_vec()),
                model.get(&k).cloned()
            );
        }
    }
    let lo = key(BATCHES * PER_BATCH / 2);
    let mid: Vec<Vec<u8>> = e
        .range(Tree::Rev, Included(&lo[..]), Unbounded)
        .map(|r| r.unwrap().0.to_vec())
        .collect();
    assert!(mid.iter().eq(model.range(lo.clone()..).map(|(k, _)| k)));
}

#[test]
fn history_appended_in_key_order_reads_back() {
    appended_in_key_order_reads_back(false);
}

/// As the committer writes: each batch also writes the meta tree, so it is a transaction.
#[test]
fn history_appended_with_the_meta_tree_reads_back() {
    appended_in_key_order_reads_back(true);
}

fn appended_in_key_order_reads_back(with_meta: bool) {
    let dir = tempfile::tempdir().unwrap();
    let e = SledEngine::open_flushed_only(dir.path()).unwrap();
    let mut model = BTreeMap::new();

    // Readers scan while the history grows: every scan is in key order, without repeats,
    // and never shorter than the history was when it started.
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (e, written, done) = (e.clone(), written.clone(), done.clone());
        std::thread::spawn(move || {
            let mut scans = 0;
            while !done.load(Ordering::Acquire) || scans == 0 {
                let before = written.load(Ordering::Acquire);
                let ks: Vec<Vec<u8>> = e.iter(Tree::Rev).map(|r| r.unwrap().0.to_vec()).collect();
                assert!(ks.windows(2).all(|w| w[0] < w[1]), "a scan out of order");
                assert!(ks.len() as u64 >= before, "a scan lost records");
                scans += 1;
            }
            scans
        })
    };
    for b in 0..BATCHES {
        let mut batch = WriteBatch::default();
        for i in b * PER_BATCH..(b + 1) * PER_BATCH {
            batch.put(Tree::Rev, key(i), val(i, 0));
            model.insert(key(i), val(i, 0));
        }
        if with_meta {
            batch.put(Tree::Meta, &b"applied"[..], b.to_be_bytes().to_vec());
        }
        e.write(batch).unwrap();
        written.store((b + 1) * PER_BATCH, Ordering::Release);
    }
    done.store(true, Ordering::Release);
    assert!(reader.join().unwrap() > 0);
    e.flush().unwrap();
    check(&e, &model);

    // Removes, rewrites and inserts between existing keys (not appends), then appends again.
    let mut batch = WriteBatch::default();
    for i in (0..BATCHES * PER_BATCH).step_by(3) {
        batch.delete(Tree::Rev, key(i));
        model.remove(&key(i));
    }
    e.write(batch).unwrap();
    let mut batch = WriteBatch::default();
    for i in (1..BATCHES * PER_BATCH).step_by(5) {
        let k = (i * 4 + 1).to_be_bytes().to_vec();
        batch.put(Tree::Rev, k.clone(), val(i, 1));
        model.insert(k, val(i, 1));
        batch.put(Tree::Rev, key(i), val(i, 2));
        model.insert(key(i), val(i, 2));
    }
    e.write(batch).unwrap();
    let mut batch = WriteBatch::default();
    for i in BATCHES * PER_BATCH..(BATCHES + 2) * PER_BATCH {
        batch.put(Tree::Rev, key(i), val(i, 3));
        model.insert(key(i), val(i, 3));
    }
    if with_meta {
        batch.put(Tree::Meta, &b"applied"[..], BATCHES.to_be_bytes().to_vec());
    }
    e.write(batch).unwrap();
    check(&e, &model);
    e.flush().unwrap();
    drop(e);
    let e = super::tests::reopen_sled(dir.path());
    check(&e, &model);
    if with_meta {
        let applied = e.get(Tree::Meta, b"applied").unwrap().unwrap();
        assert_eq!(&applied[..], &BATCHES.to_be_bytes()[..]);
    }
}

/// Compaction deletes runs of old records, so whole chunks go, and then whole leaves of 4
/// entries: sled merges the emptied leaves into their neighbours while the committer goes on
/// appending and readers scan.
#[test]
fn leaves_emptied_by_deletes_merge_while_appends_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let e = SledEngine::open_flushed_only(dir.path()).unwrap();
    let mut model = BTreeMap::new();
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (e, done) = (e.clone(), done.clone());
        std::thread::spawn(move || {
            let mut scans = 0;
            while !done.load(Ordering::Acquire) || scans == 0 {
                let ks: Vec<Vec<u8>> = e.iter(Tree::Rev).map(|r| r.unwrap().0.to_vec()).collect();
                assert!(ks.windows(2).all(|w| w[0] < w[1]), "a scan out of order");
                scans += 1;
            }
            scans
        })
    };
    let mut next = 0;
    for round in 0..BATCHES {
        let mut batch = WriteBatch::default();
        for i in next..next + PER_BATCH {
            batch.put(Tree::Rev, key(i), val(i, 0));
            model.insert(key(i), val(i, 0));
        }
        next += PER_BATCH;
        batch.put(Tree::Meta, &b"applied"[..], round.to_be_bytes().to_vec());
        e.write(batch).unwrap();
        // The oldest 300 records, then every other one of the next 200: whole chunks and
        // leaves go, and a ragged edge of rewritten chunks is left.
        let old: Vec<Vec<u8>> = model.keys().take(500).cloned().collect();
        let mut batch = WriteBatch::default();
        for (n, k) in old.into_iter().enumerate() {
            if n < 300 || n % 2 == 0 {
                batch.delete(Tree::Rev, k.clone());
                model.remove(&k);
            }
        }
        e.write(batch).unwrap();
    }
    done.store(true, Ordering::Release);
    assert!(reader.join().unwrap() > 0);
    check(&e, &model);
    e.flush().unwrap();
    drop(e);
    let e = super::tests::reopen_sled(dir.path());
    check(&e, &model);
}
