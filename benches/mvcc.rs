//! MVCC apply cost: one `MvccStore::apply` of 1, 64 or 256 puts of 8-byte keys and 256-byte
//! values over a key space of 10k keys, so later batches overwrite and grow key histories.
//!
//! - `mvcc_apply_puts`: what the state machine pays per applied batch: the batch goes into the
//!   pending buffer; the committer thread writes it to sled in the background (every 100 ms).
//! - `mvcc_apply_commit_puts`: apply followed by an explicit `persist_pending`, i.e. one sled
//!   transaction per batch: the cost the pending buffer takes off the apply path.
//! - `mvcc_apply_compaction`: the apply of a compaction of 10k keys with 4 revisions each
//!   (30k revisions removed): what every write waits for behind it. The key index and the
//!   history are compacted later, in the background, and not measured here.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use kvd::mvcc::{MvccStore, StoreEngine, WriteRequest};
use kvd::proto::etcdserverpb::{CompactionRequest, PutRequest};

fn puts(next: &mut u64, n: usize) -> Vec<WriteRequest> {
    let reqs = (0..n as u64)
        .map(|k| {
            WriteRequest::Put(PutRequest {
                key: ((*next + k) % 10_000).to_be_bytes().to_vec(),
                value: vec![0xcd; 256],
                ..Default::default()
            })
        })
        .collect();
    *next += n as u64;
    reqs
}

fn bench(c: &mut Criterion, group: &str, commit: bool) {
    let mut g = c.benchmark_group(group);
    for batch in [1usize, 64, 256] {
        let store = MvccStore::open(StoreEngine::temporary().unwrap()).unwrap();
        let mut next = 0u64;
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, &n| {
            b.iter(|| {
                let out = store.apply(&puts(&mut next, n), &[]).unwrap();
                assert!(out.iter().all(|r| r.is_ok()));
                if commit {
                    store.persist_pending().unwrap();
                }
            })
        });
    }
    g.finish();
}

fn mvcc_apply_puts(c: &mut Criterion) {
    bench(c, "mvcc_apply_puts", false);
}

fn mvcc_apply_commit_puts(c: &mut Criterion) {
    bench(c, "mvcc_apply_commit_puts", true);
}

/// A store holding `revs` revisions of each of 10k keys, and its current revision.
fn history(revs: usize) -> (MvccStore, i64) {
    let store = MvccStore::open(StoreEngine::temporary().unwrap()).unwrap();
    let mut next = 0u64;
    for _ in 0..revs * 10_000 / 256 + 1 {
        store.apply(&puts(&mut next, 256), &[]).unwrap();
    }
    let rev = store.current_revision();
    (store, rev)
}

fn mvcc_apply_compaction(c: &mut Criterion) {
    let mut g = c.benchmark_group("mvcc_apply_compaction");
    g.sample_size(10);
    g.bench_function("10k_keys_x4", |b| {
        b.iter_batched_ref(
            || history(4),
            |(store, rev)| {
                let req = WriteRequest::Compact(CompactionRequest {
                    revision: *rev,
                    physical: false,
                });
                let out = store.apply(&[req], &[]).unwrap();
                assert!(out[0].is_ok());
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(
    benches,
    mvcc_apply_puts,
    mvcc_apply_commit_puts,
    mvcc_apply_compaction
);
criterion_main!(benches);
