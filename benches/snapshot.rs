//! What a snapshot costs each side per record, without the network or other processes: the
//! replacement benchmark (`benches/compare/replace.sh`) runs four members on a shared
//! two-core machine and swings by 40%; these do not.
//!
//! A store of 50k puts of 1 KiB values over 50k keys (as `replace.sh` loads, at a sixth of its
//! size), then:
//! - `snapshot/encode`: the leader's side, an image of the store encoded into the snapshot
//!   format in chunks, as a send's `snapshot_data::Encoder` does with a `ChunkWriter` (that
//!   type is the crate's own, so its loop is repeated here in a few lines).
//! - `snapshot/decode`: the receiver reading the snapshot's entries and checksum, no more.
//! - `snapshot/stage`: the receiver's whole work, the snapshot written into a fresh engine
//!   (opened aside, as a received snapshot's is) from its chunks, its entries lent from them
//!   as a received snapshot's are, with the key index built as it comes; its
//!   files' fsync at the end is not included (`staging::stage` does it after).
//! - `snapshot/stage_copied`: the same from one buffer, each entry copied out of it (as a
//!   snapshot file is read), for the cost of those copies.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvd::mvcc::{EngineOptions, MvccStore, Staged, StoreEngine, WriteRequest};
use kvd::proto::etcdserverpb::PutRequest;
use kvd::raft::limits::SNAPSHOT_CHUNK;
use kvd::raft::sm::snapshot_format::{ChunkInput, ChunkWriter, Reader};
use kvd::raft::types::SnapshotMeta;

/// kvd's allocator (without its THP setting: run with `MIMALLOC_ALLOW_THP=0` to match).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const KEYS: u64 = 50_000;

fn store() -> (tempfile::TempDir, MvccStore) {
    let d = tempfile::tempdir().unwrap();
    let store = MvccStore::open(StoreEngine::open(&d.path().join("db")).unwrap()).unwrap();
    for first in (0..KEYS).step_by(256) {
        let reqs: Vec<_> = (first..(first + 256).min(KEYS))
            .map(|k| {
                WriteRequest::Put(PutRequest {
                    key: format!("key-{k:011}").into_bytes(),
                    value: vec![0xcd; 1024],
                    ..Default::default()
                })
            })
            .collect();
        let out = store.apply(&reqs, &[]).unwrap();
        assert!(out.iter().all(|r| r.is_ok()));
    }
    store.persist_pending().unwrap();
    (d, store)
}

/// The snapshot of `store`, encoded as a send encodes it: into chunks of [`SNAPSHOT_CHUNK`],
/// each allocated at its size and handed on (here, to `sent`).
fn encode(store: &MvccStore, mut sent: impl FnMut(Vec<u8>)) {
    let mut w = ChunkWriter::new(&SnapshotMeta::default());
    w.reserve(SNAPSHOT_CHUNK + (64 << 10));
    for r in store.image().unwrap().records() {
        let (tree, k, v) = r.unwrap();
        if w.len() >= SNAPSHOT_CHUNK {
            sent(w.take(SNAPSHOT_CHUNK + (64 << 10)));
        }
        w.push(tree, &k, &v).unwrap();
    }
    sent(w.finish());
}

fn snapshot(c: &mut Criterion) {
    let (_d, store) = store();
    let mut bytes = Vec::new();
    let mut chunks = Vec::new();
    encode(&store, |c| {
        bytes.extend_from_slice(&c);
        chunks.push(bytes::Bytes::from(c));
    });
    let records = KEYS + 10;
    let mut g = c.benchmark_group("snapshot");
    g.sample_size(10);
    g.throughput(Throughput::Elements(records));
    g.bench_function("encode", |b| {
        b.iter(|| {
            let mut n = 0;
            encode(&store, |c| n += c.len());
            n
        })
    });
    g.bench_function("decode", |b| {
        b.iter(|| {
            let (_, r) = Reader::new(&bytes[..], "bench".as_ref()).unwrap();
            r.map(|e| e.unwrap().2.len()).sum::<usize>()
        })
    });
    // Each iteration writes into a fresh engine, opened aside, outside the time measured.
    let stage = |b: &mut criterion::Bencher, run: &dyn Fn(&StoreEngine) -> Staged| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                let d = tempfile::tempdir().unwrap();
                let engine =
                    StoreEngine::open_aside(&d.path().join("db"), EngineOptions::default())
                        .unwrap();
                let t = Instant::now();
                let staged = run(&engine);
                took += t.elapsed();
                assert!(staged.indexed());
            }
            took
        })
    };
    g.bench_function("stage_copied", |b| {
        stage(b, &|engine| {
            let (_, r) = Reader::new(&bytes[..], "bench".as_ref()).unwrap();
            kvd::mvcc::stage(engine, r, &[]).unwrap()
        })
    });
    g.bench_function("stage", |b| {
        stage(b, &|engine| {
            let input = ChunkInput::new(chunks.iter().cloned());
            let (_, r) = Reader::new(input, "bench".as_ref()).unwrap();
            kvd::mvcc::stage(engine, r.lent(), &[]).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, snapshot);
criterion_main!(benches);
