//! The storage engine's page cache holds what it is configured to hold: reading a whole store
//! (a restart's key-index rebuild, a full listing, a snapshot send) leaves at most the cache's
//! capacity of pages in memory, plus a small slack, however big the store.
//!
//! sled 0.34 counted a page against its capacity only once the page's LRU shard had queued 64
//! accesses, over 256 shards: up to ~16,000 pages stayed in memory uncounted, 130-190 MB of
//! 1 KiB values (third_party/sled/KVD_PATCH.md, third change). Checked by counting the heap
//! bytes live after a scan, not by RSS; this binary has one test, so nothing else allocates
//! meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kvd::mvcc::engine::{Engine, EngineOptions, StoreEngine, Tree};

mod common;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::SeqCst);
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

const RECORDS: usize = 48 * 1024;
const VALUE: usize = 1024;
const CACHE: u64 = 4 << 20;

#[test]
fn a_full_scan_keeps_no_more_pages_than_the_cache_holds() {
    let d = tempfile::tempdir().unwrap();
    let options = EngineOptions { cache_bytes: CACHE };
    {
        let engine = StoreEngine::open_with(d.path(), options).unwrap();
        common::engine::write_records(&engine, RECORDS, VALUE);
    }
    // Reopened, as a restart: nothing of the store is in memory yet.
    let engine = StoreEngine::open_with(d.path(), options).unwrap();
    let before = LIVE.load(Ordering::SeqCst);
    let mut seen = 0;
    for item in engine.iter(Tree::Rev) {
        let (_, v) = item.unwrap();
        assert_eq!(v.len(), VALUE);
        seen += 1;
    }
    assert_eq!(seen, RECORDS);
    let held = LIVE.load(Ordering::SeqCst).saturating_sub(before);
    eprintln!(
        "{} MiB of records scanned; {} KiB held after the scan (cache {} KiB)",
        (RECORDS * VALUE) >> 20,
        held >> 10,
        CACHE >> 10
    );
    // The cache, plus what its shards may have queued and not counted yet (16 x 7 pages of
    // about 8 KiB), plus the engine's own small state.
    let bound = CACHE as usize + (4 << 20);
    assert!(
        held < bound,
        "{held} bytes held after scanning {} bytes with a {CACHE}-byte cache",
        RECORDS * VALUE
    );
}
