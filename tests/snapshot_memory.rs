//! Snapshots are encoded, checked and read without holding them in memory: the heap's peak
//! while a 96 MiB snapshot is encoded into a file (as a leader encodes what it sends), verified
//! and read back through (as a member loads a file an older release left) stays under a fixed
//! bound (a few buffers and one entry), far below the file's size.
//!
//! The bound holds by design (fixed buffers, one entry at a time), so it is checked by
//! counting the bytes allocated, not by timing or RSS. This binary has one test, so nothing
//! else allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::io::{BufWriter, Write};

use kvd::raft::sm::snapshot_file::{self, Entry};
use kvd::raft::sm::snapshot_format::Writer;
use kvd::raft::types::SnapshotMeta;
use kvd::raft::StoreError;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Heap bytes allocated at peak while `f` runs, beyond what was live when it started.
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let r = f();
    (r, PEAK.load(Ordering::SeqCst) - base)
}

const ENTRIES: usize = 96 * 1024;
const VALUE: usize = 1024;

/// The entries, generated one at a time (as the engine's iterator yields them).
fn entries() -> impl Iterator<Item = Result<Entry, StoreError>> {
    (0..ENTRIES).map(|i| {
        let key = format!("{i:016x}").into_bytes();
        let value = vec![(i % 251) as u8; VALUE];
        Ok((kvd::mvcc::REV_TREE.to_string(), key, value))
    })
}

#[test]
fn building_checking_and_reading_a_big_snapshot_takes_bounded_memory() {
    let d = tempfile::tempdir().unwrap();
    let meta = SnapshotMeta::default();
    // The bound: the file buffer (256 KiB), one entry, the reader's and writer's small state.
    let bound = 1 << 20;

    let path = d.path().join("0000000000000000.snap");
    let ((), built) = peak_during(|| {
        let file = std::fs::File::create(&path).unwrap();
        let mut w = Writer::new(BufWriter::with_capacity(256 << 10, file), &meta).unwrap();
        for e in entries() {
            let (tree, k, v) = e.unwrap();
            w.push(&tree, &k, &v).unwrap();
        }
        w.finish().unwrap().flush().unwrap();
    });
    let size = std::fs::metadata(&path).unwrap().len() as usize;
    assert!(size > ENTRIES * VALUE, "{size}");

    let (found, verified) = peak_during(|| snapshot_file::verify(&path).unwrap());
    assert_eq!(found, meta);

    let (count, read) = peak_during(|| {
        let (_, r) = snapshot_file::entries(&path).unwrap();
        let mut n = 0;
        for e in r {
            let (_, _, v) = e.unwrap();
            assert_eq!(v.len(), VALUE);
            n += 1;
        }
        n
    });
    assert_eq!(count, ENTRIES);
    eprintln!(
        "{size} byte snapshot: peak heap {built} B building, {verified} B verifying, {read} B \
         reading"
    );
    for (what, peak) in [("build", built), ("verify", verified), ("read", read)] {
        assert!(
            peak < bound,
            "{what} allocated {peak} bytes at peak for a {size} byte snapshot"
        );
    }
}
