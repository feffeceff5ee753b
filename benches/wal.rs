//! WAL group-commit cost: one `write_sync` of a batch of 256-byte entries (append + one
//! fdatasync) for batch sizes 1, 8, 64 and 256, on the real file system in a tempdir.
//! Throughput is reported in records/s, so the fsync amortisation across a batch shows
//! directly.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvd::wal::{Record, Wal, WalOptions};

fn wal_append_fsync(c: &mut Criterion) {
    let mut g = c.benchmark_group("wal_append_fsync");
    // Each iteration is at least one fdatasync: keep the sample count modest.
    g.sample_size(20);
    for batch in [1usize, 8, 64, 256] {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), WalOptions::default()).unwrap();
        let mut next = 1u64;
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, &n| {
            b.iter(|| {
                let recs: Vec<Record> = (0..n as u64)
                    .map(|k| Record::Entry {
                        index: next + k,
                        data: vec![0xab; 256],
                    })
                    .collect();
                next += n as u64;
                wal.write_sync(recs).unwrap();
            })
        });
        wal.close();
    }
    g.finish();
}

criterion_group!(benches, wal_append_fsync);
criterion_main!(benches);
