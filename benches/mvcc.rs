//! MVCC apply cost: one `MvccStore::apply` of 1, 64 or 256 puts of 8-byte keys and 256-byte
//! values over a key space of 10k keys, so later batches overwrite and grow key histories.
//!
//! - `mvcc_apply_puts`: what the state machine pays per applied batch: the batch goes into the
//!   pending buffer; the committer thread writes it to sled in the background (every 100 ms).
//! - `mvcc_apply_commit_puts`: apply followed by an explicit commit, i.e. one sled transaction
//!   per batch, which is what every apply paid before the pending buffer.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvd::mvcc::{MvccStore, WriteRequest};
use kvd::proto::etcdserverpb::PutRequest;

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
        let db = sled::Config::new().temporary(true).open().unwrap();
        let store = MvccStore::open(&db).unwrap();
        let mut next = 0u64;
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, &n| {
            b.iter(|| {
                let out = store.apply(&puts(&mut next, n), &[]).unwrap();
                assert!(out.iter().all(|r| r.is_ok()));
                if commit {
                    store.commit().unwrap();
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

criterion_group!(benches, mvcc_apply_puts, mvcc_apply_commit_puts);
criterion_main!(benches);
