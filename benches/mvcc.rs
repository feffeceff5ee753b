//! MVCC apply cost: one `MvccStore::apply` (a single sled transaction, no flush, as the state
//! machine applies a Raft batch) of 1, 64 or 256 puts of 8-byte keys and 256-byte values
//! over a key space of 10k keys, so later batches overwrite and grow key histories.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvd::mvcc::{MvccStore, WriteRequest};
use kvd::proto::etcdserverpb::PutRequest;

fn mvcc_apply_puts(c: &mut Criterion) {
    let mut g = c.benchmark_group("mvcc_apply_puts");
    for batch in [1usize, 64, 256] {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let store = MvccStore::open(&db).unwrap();
        let mut next = 0u64;
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, &n| {
            b.iter(|| {
                let reqs: Vec<WriteRequest> = (0..n as u64)
                    .map(|k| {
                        WriteRequest::Put(PutRequest {
                            key: ((next + k) % 10_000).to_be_bytes().to_vec(),
                            value: vec![0xcd; 256],
                            ..Default::default()
                        })
                    })
                    .collect();
                next += n as u64;
                let out = store.apply(&reqs, &[]).unwrap();
                assert!(out.iter().all(|r| r.is_ok()));
            })
        });
    }
    g.finish();
}

criterion_group!(benches, mvcc_apply_puts);
criterion_main!(benches);
