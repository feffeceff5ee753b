use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::page::{Meta, PageHeader, PAGE_HEADER_SIZE};
use super::*;

type Buckets = Vec<(Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>;

fn write(path: &Path, buckets: &Buckets, txid: u64) -> u64 {
    let mut w = Writer::create(path).unwrap();
    for (name, kvs) in buckets {
        w.bucket(name).unwrap();
        for (k, v) in kvs {
            w.put(k, v).unwrap();
        }
    }
    w.finish(txid).unwrap()
}

fn read_all(path: &Path) -> Result<Buckets, BoltError> {
    let r = Reader::open(path)?;
    let mut out = Vec::new();
    for name in r.buckets()? {
        let mut kvs = Vec::new();
        r.for_each(&name, |k, v| {
            kvs.push((k.to_vec(), v.to_vec()));
            Ok::<(), BoltError>(())
        })?;
        out.push((name, kvs));
    }
    Ok(out)
}

fn round_trip(buckets: Buckets) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let len = write(&path, &buckets, 42);
    assert_eq!(len, std::fs::metadata(&path).unwrap().len());
    assert_eq!(len % 4096, 0);
    let r = Reader::open(&path).unwrap();
    assert_eq!((r.page_size(), r.txid()), (4096, 42));
    assert_eq!(read_all(&path).unwrap(), buckets);
}

fn seq_keys(n: usize, value_len: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..n as u64)
        .map(|i| (i.to_be_bytes().to_vec(), vec![(i % 251) as u8; value_len]))
        .collect()
}

#[test]
fn no_buckets() {
    round_trip(vec![]);
}

#[test]
fn one_empty_bucket() {
    round_trip(vec![(b"key".to_vec(), vec![])]);
}

#[test]
fn one_key() {
    round_trip(vec![(b"b".to_vec(), vec![(b"k".to_vec(), b"v".to_vec())])]);
}

#[test]
fn many_buckets_need_a_branching_root() {
    // 600 names do not fit one root leaf page, so the root bucket's tree has branches.
    let buckets = (0..600u32)
        .map(|i| {
            (
                format!("bucket-{i:05}").into_bytes(),
                seq_keys(i as usize % 3, 5),
            )
        })
        .collect();
    round_trip(buckets);
}

#[test]
fn two_hundred_thousand_keys() {
    round_trip(vec![
        (b"a".to_vec(), seq_keys(10, 1)),
        (b"key".to_vec(), seq_keys(200_000, 20)),
        (b"z".to_vec(), vec![]),
    ]);
}

#[test]
fn value_sizes_and_overflow() {
    let kvs = [0usize, 1, 4095, 4096, 4097, 1 << 20, 0, 3 * 4096 + 7]
        .iter()
        .enumerate()
        .map(|(i, &n)| (vec![i as u8 + 1], (0..n).map(|j| (j % 253) as u8).collect()))
        .collect();
    round_trip(vec![(b"big".to_vec(), kvs)]);
}

#[test]
fn binary_and_largest_keys() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut keys: Vec<Vec<u8>> = (0..3000)
        .map(|_| {
            let n = rng.gen_range(1..40);
            (0..n).map(|_| rng.gen()).collect()
        })
        .collect();
    // Keys of bbolt's maximum size make branch pages with overflow pages.
    for b in [0u8, 0x80, 0xff] {
        keys.push(vec![b; 32768]);
    }
    keys.sort();
    keys.dedup();
    let kvs = keys.into_iter().map(|k| (k, vec![0u8, 0xff, 0])).collect();
    round_trip(vec![(vec![0xff, 0x00], kvs)]);
}

#[test]
fn writer_refuses_misuse() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::create(&dir.path().join("db")).unwrap();
    assert!(matches!(w.put(b"k", b"v"), Err(BoltError::NoCurrentBucket)));
    assert!(matches!(w.bucket(b""), Err(BoltError::EmptyKey)));
    w.bucket(b"m").unwrap();
    w.put(b"b", b"").unwrap();
    assert!(matches!(w.put(b"b", b""), Err(BoltError::Unsorted)));
    assert!(matches!(w.put(b"a", b""), Err(BoltError::Unsorted)));
    assert!(matches!(w.put(b"", b""), Err(BoltError::EmptyKey)));
    assert!(matches!(
        w.put(&[1; 32769], b""),
        Err(BoltError::KeyTooLarge(32769))
    ));
    assert!(matches!(w.bucket(b"m"), Err(BoltError::Unsorted)));
    assert!(matches!(w.bucket(b"a"), Err(BoltError::Unsorted)));
    w.bucket(b"n").unwrap();
    w.finish(1).unwrap();
}

#[test]
fn missing_bucket_and_nested_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    write(&path, &vec![(b"b".to_vec(), seq_keys(3, 1))], 1);
    let r = Reader::open(&path).unwrap();
    let e = r.for_each(b"nope", |_, _| Ok::<(), BoltError>(()));
    assert!(matches!(e, Err(BoltError::NoBucket)));
    // The callback's own error stops the walk and comes back as is.
    let mut seen = 0;
    let e = r.for_each(b"b", |_, _| {
        seen += 1;
        Err(BoltError::Unsorted)
    });
    assert!(matches!(e, Err(BoltError::Unsorted)));
    assert_eq!(seen, 1);
}

/// A small valid file, its bytes, and its current meta.
fn sample(dir: &Path) -> (PathBuf, Vec<u8>) {
    let path = dir.join("db");
    write(
        &path,
        &vec![
            (b"key".to_vec(), seq_keys(2000, 30)),
            (
                b"meta".to_vec(),
                vec![(b"consistent_index".to_vec(), vec![0; 8])],
            ),
            (b"zbig".to_vec(), vec![(b"v".to_vec(), vec![9; 10_000])]),
        ],
        5,
    );
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

fn meta_of(bytes: &[u8], pgid: usize) -> Meta {
    Meta::decode(&bytes[pgid * 4096..]).unwrap()
}

fn put_meta(bytes: &mut [u8], pgid: usize, m: &Meta) {
    m.encode(pgid as u64, &mut bytes[pgid * 4096..]);
}

#[test]
fn trailing_bytes_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = sample(dir.path());
    let before = read_all(&path).unwrap();
    bytes.extend_from_slice(&[0xab; 32]);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(read_all(&path).unwrap(), before);
}

#[test]
fn metas_choose_the_valid_one_with_the_higher_txid() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = sample(dir.path());
    assert_eq!((meta_of(&bytes, 0).txid, meta_of(&bytes, 1).txid), (5, 4));
    assert_eq!(Reader::open(&path).unwrap().txid(), 5);
    // Meta 0 corrupt: meta 1 is used.
    bytes[PAGE_HEADER_SIZE + 20] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(Reader::open(&path).unwrap().txid(), 4);
    assert!(read_all(&path).is_ok());
    // Both corrupt: a typed error naming both faults.
    bytes[4096 + PAGE_HEADER_SIZE + 20] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        Reader::open(&path),
        Err(BoltError::BadMeta {
            meta0: MetaFault::Checksum,
            meta1: MetaFault::Checksum
        })
    ));
    // Version 1 in both.
    let (_, mut bytes) = sample(dir.path());
    for p in [0, 4096] {
        bytes[p + PAGE_HEADER_SIZE + 4] = 1;
    }
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        Reader::open(&path),
        Err(BoltError::BadMeta {
            meta0: MetaFault::Version(1),
            ..
        })
    ));
}

#[test]
fn wrong_magic_and_foreign_files_are_not_bolt() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = sample(dir.path());
    for p in [0, 4096] {
        bytes[p + PAGE_HEADER_SIZE] ^= 0xff;
    }
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(Reader::open(&path), Err(BoltError::NotBolt)));
    for content in [&b""[..], b"hello", &[0u8; 9000]] {
        std::fs::write(&path, content).unwrap();
        assert!(matches!(Reader::open(&path), Err(BoltError::NotBolt)));
    }
}

#[test]
fn truncated_anywhere_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes) = sample(dir.path());
    let cut = dir.path().join("cut");
    // From the first byte after the magic number on (before it, the file is just not bbolt).
    let mut at = 20;
    while at < bytes.len() {
        std::fs::write(&cut, &bytes[..at]).unwrap();
        match Reader::open(&cut) {
            Err(BoltError::Truncated) => {}
            other => panic!("cut at {at}: {:?}", other.map(|r| r.txid())),
        }
        at += 997;
    }
    assert!(read_all(&path).is_ok());
}

#[test]
fn meta_claiming_a_huge_file_is_truncated_not_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = sample(dir.path());
    for p in [0, 1] {
        let mut m = meta_of(&bytes, p);
        m.hwm = 1 << 60;
        put_meta(&mut bytes, p, &m);
    }
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(Reader::open(&path), Err(BoltError::Truncated)));
}

/// Rewrites the page header of page `pgid` with `f`.
fn patch_header(bytes: &mut [u8], pgid: u64, f: impl FnOnce(&mut PageHeader)) {
    let at = pgid as usize * 4096;
    let mut h = PageHeader::decode(&bytes[at..]);
    f(&mut h);
    h.encode(&mut bytes[at..]);
}

#[test]
fn corrupt_headers_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (path, clean) = sample(dir.path());
    let root = meta_of(&clean, 0).root;

    // A root page claiming 2^32 - 1 overflow pages: refused before any allocation.
    let mut bytes = clean.clone();
    patch_header(&mut bytes, root, |h| h.overflow = u32::MAX);
    std::fs::write(&path, &bytes).unwrap();
    let e = Reader::open(&path).unwrap().buckets().unwrap_err();
    assert!(
        matches!(e, BoltError::BadPage { pgid, reason: PageFault::Overflow(_) } if pgid == root),
        "{e:?}"
    );

    // Wrong page type.
    let mut bytes = clean.clone();
    patch_header(&mut bytes, root, |h| h.flags = 0x10);
    std::fs::write(&path, &bytes).unwrap();
    let e = Reader::open(&path).unwrap().buckets().unwrap_err();
    assert!(matches!(
        e,
        BoltError::BadPage {
            reason: PageFault::WrongType(0x10),
            ..
        }
    ));

    // A count far past the page's end: the extra elements are garbage (caught as out of
    // order) until one lies outside the page.
    let mut bytes = clean.clone();
    patch_header(&mut bytes, root, |h| h.count = u16::MAX);
    std::fs::write(&path, &bytes).unwrap();
    let e = Reader::open(&path).unwrap().buckets().unwrap_err();
    assert!(
        matches!(
            e,
            BoltError::BadPage {
                reason: PageFault::ElementBounds(_) | PageFault::KeyOrder,
                ..
            }
        ),
        "{e:?}"
    );
    // An element whose key runs past the page.
    let mut bytes = clean.clone();
    let ksize = root as usize * 4096 + PAGE_HEADER_SIZE + 8;
    bytes[ksize..ksize + 4].copy_from_slice(&5000u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let e = Reader::open(&path).unwrap().buckets().unwrap_err();
    assert!(
        matches!(
            e,
            BoltError::BadPage {
                reason: PageFault::ElementBounds(0),
                ..
            }
        ),
        "{e:?}"
    );
}

/// The root page id of bucket `name` in a file `sample` wrote (never inline there).
fn bucket_root(bytes: &[u8], name: &[u8]) -> u64 {
    let root = meta_of(bytes, 0).root as usize;
    let page = &bytes[root * 4096..(root + 1) * 4096];
    let h = PageHeader::decode(page);
    (0..h.count)
        .map(|i| super::page::leaf_elem(page, i).unwrap())
        .find(|e| e.key == name)
        .map(|e| u64::from_le_bytes(e.value[..8].try_into().unwrap()))
        .unwrap()
}

#[test]
fn a_cycle_ends_in_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = sample(dir.path());
    let key_root = bucket_root(&bytes, b"key");
    let at = key_root as usize * 4096;
    assert_eq!(
        PageHeader::decode(&bytes[at..]).flags,
        0x01,
        "a branch root"
    );
    // Point the branch root's last child at the root itself.
    let count = PageHeader::decode(&bytes[at..]).count as usize;
    let child = at + PAGE_HEADER_SIZE + (count - 1) * 16 + 8;
    bytes[child..child + 8].copy_from_slice(&key_root.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let r = Reader::open(&path).unwrap();
    let e = r
        .for_each(b"key", |_, _| Ok::<(), BoltError>(()))
        .unwrap_err();
    assert!(
        matches!(
            e,
            BoltError::BadPage {
                reason: PageFault::KeyOrder | PageFault::Cycle | PageFault::TooDeep,
                ..
            }
        ),
        "{e:?}"
    );
}

/// A page that claims the rest of the file as its overflow and is its own child: each level
/// of the cycle would read and hold the whole file again, 65 times before the depth limit.
/// The walk's budget counts overflow pages, so the second read is refused before it
/// allocates: no walk reads or holds more than the file.
#[test]
fn a_cycle_through_a_page_as_large_as_the_file_is_refused_before_it_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = sample(dir.path());
    let hwm = meta_of(&bytes, 0).hwm;
    let big = 3u64;
    let at = big as usize * 4096;
    assert_eq!(PageHeader::decode(&bytes[at..]).id, big);
    assert!(hwm > 20, "the file spans {hwm} pages");
    patch_header(&mut bytes, big, |h| {
        h.flags = 0x01;
        h.count = 1;
        h.overflow = (hwm - big - 1) as u32;
    });
    // Its one element: a 1-byte key right after the element, and itself as the child.
    let elem = at + PAGE_HEADER_SIZE;
    bytes[elem..elem + 4].copy_from_slice(&16u32.to_le_bytes());
    bytes[elem + 4..elem + 8].copy_from_slice(&1u32.to_le_bytes());
    bytes[elem + 8..elem + 16].copy_from_slice(&big.to_le_bytes());
    // The key bucket's first child leads there.
    let root = bucket_root(&bytes, b"key") as usize * 4096;
    let child = root + PAGE_HEADER_SIZE + 8;
    bytes[child..child + 8].copy_from_slice(&big.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();

    let r = Reader::open(&path).unwrap();
    let e = r
        .for_each(b"key", |_, _| Ok::<(), BoltError>(()))
        .unwrap_err();
    assert!(
        matches!(e, BoltError::BadPage { pgid, reason: PageFault::Cycle } if pgid == big),
        "{e:?}"
    );
}

#[test]
fn a_child_far_beyond_the_file_is_out_of_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = sample(dir.path());
    let at = bucket_root(&bytes, b"key") as usize * 4096;
    for child in [1u64 << 60, 1, 0] {
        let elem = at + PAGE_HEADER_SIZE + 8;
        bytes[elem..elem + 8].copy_from_slice(&child.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let r = Reader::open(&path).unwrap();
        let e = r
            .for_each(b"key", |_, _| Ok::<(), BoltError>(()))
            .unwrap_err();
        assert!(
            matches!(e, BoltError::BadPage { pgid, reason: PageFault::OutOfBounds } if pgid == child),
            "child {child}: {e:?}"
        );
    }
}

#[test]
fn random_byte_flips_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (path, clean) = sample(dir.path());
    let mut rng = StdRng::seed_from_u64(2026);
    let mut errors = 0;
    for round in 0..400 {
        let mut bytes = clean.clone();
        for _ in 0..rng.gen_range(1..6) {
            // Half the flips hit the first 16 pages, where the headers and metas are.
            let at = if round % 2 == 0 {
                rng.gen_range(0..16 * 4096)
            } else {
                rng.gen_range(0..bytes.len())
            };
            bytes[at] ^= 1 << rng.gen_range(0..8);
        }
        std::fs::write(&path, &bytes).unwrap();
        if read_all(&path).is_err() {
            errors += 1;
        }
    }
    // Most single flips land in values and are invisible; some must be caught.
    assert!(errors > 0);
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/etcd-3.4.23.snapshot.db")
}

/// etcd's revision key: 8-byte main, '_', 8-byte sub, and 't' for a tombstone.
fn rev_key(main: u64, tombstone: bool) -> Vec<u8> {
    let mut k = main.to_be_bytes().to_vec();
    k.push(b'_');
    k.extend_from_slice(&0u64.to_be_bytes());
    if tombstone {
        k.push(b't');
    }
    k
}

#[test]
fn reads_a_snapshot_real_etcd_wrote() {
    // See tests/fixtures/README.md for how the file was made and what it holds.
    let r = Reader::open(&fixture()).unwrap();
    assert_eq!((r.page_size(), r.txid()), (4096, 12));
    let names: Vec<String> = r
        .buckets()
        .unwrap()
        .into_iter()
        .map(|n| String::from_utf8(n).unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "alarm",
            "auth",
            "authRoles",
            "authUsers",
            "cluster",
            "key",
            "lease",
            "members",
            "members_removed",
            "meta"
        ]
    );
    let mut keys = Vec::new();
    let mut big = 0;
    r.for_each(b"key", |k, v| {
        keys.push(k.to_vec());
        if v.len() > 20 * 1024 {
            big += 1;
        }
        Ok::<(), BoltError>(())
    })
    .unwrap();
    // Revision 2 (foo), 4 and 5 (bar and its delete) were compacted away at 5.
    let want: Vec<Vec<u8>> = [
        (3, false),
        (6, false),
        (7, false),
        (8, false),
        (9, false),
        (10, true),
    ]
    .iter()
    .map(|&(m, t)| rev_key(m, t))
    .collect();
    assert_eq!(keys, want);
    assert_eq!(big, 1, "the 20 KiB value, on overflow pages");
    let mut leases = 0;
    r.for_each(b"lease", |_, _| {
        leases += 1;
        Ok::<(), BoltError>(())
    })
    .unwrap();
    assert_eq!(leases, 1);
    let mut meta = Vec::new();
    r.for_each(b"meta", |k, _| {
        meta.push(String::from_utf8(k.to_vec()).unwrap());
        Ok::<(), BoltError>(())
    })
    .unwrap();
    assert_eq!(
        meta,
        [
            "consistent_index",
            "finishedCompactRev",
            "scheduledCompactRev"
        ]
    );
    // `etcdctl snapshot status` (Go bbolt) counted 13 keys over all buckets.
    let mut total = 0;
    for name in r.buckets().unwrap() {
        r.for_each(&name, |_, _| {
            total += 1;
            Ok::<(), BoltError>(())
        })
        .unwrap();
    }
    assert_eq!(total, 13);
}

/// A protobuf mvccpb.KeyValue, encoded by hand (this module names no other).
fn kv_proto(key: &[u8], create: u64, modr: u64, version: u64, value: &[u8]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut out = Vec::new();
    for (tag, bytes) in [(0x0a, key), (0x2a, value)] {
        out.push(tag);
        varint(&mut out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
    for (tag, v) in [(0x10, create), (0x18, modr), (0x20, version)] {
        out.push(tag);
        varint(&mut out, v);
    }
    out
}

/// Revision `rev` of `write_etcd_shape`: 1000 keys, each updated every 1000 revisions; one
/// value of 20 KiB (overflow pages), the others 100 bytes.
fn etcd_shape_kv(rev: u64) -> (Vec<u8>, Vec<u8>) {
    let key = format!("k{:08}", rev % 1000);
    let value = if rev == 500 {
        vec![b'x'; 20 * 1024]
    } else {
        vec![b'v'; 100]
    };
    let create = if rev % 1000 >= 2 {
        rev % 1000
    } else {
        rev % 1000 + 1000
    };
    let version = (rev - create) / 1000 + 1;
    let kv = kv_proto(key.as_bytes(), create, rev, version, &value);
    (rev_key(rev, false), kv)
}

/// A file in etcd's shape: revisions 2..=n+1 in `key`, the consistent index in `meta`.
fn write_etcd_shape(path: &Path, n: u64) {
    let mut w = Writer::create(path).unwrap();
    for b in ["alarm", "auth", "authRoles", "authUsers", "cluster"] {
        w.bucket(b.as_bytes()).unwrap();
    }
    w.bucket(b"key").unwrap();
    for rev in 2..n + 2 {
        let (k, v) = etcd_shape_kv(rev);
        w.put(&k, &v).unwrap();
    }
    for b in ["lease", "members", "members_removed"] {
        w.bucket(b.as_bytes()).unwrap();
    }
    w.bucket(b"meta").unwrap();
    w.put(b"consistent_index", &(n + 10).to_be_bytes()).unwrap();
    w.finish(3).unwrap();
}

/// Go bbolt reads the writer's files: `etcdctl snapshot status` runs bbolt's `Tx.Check`
/// (every page reachable or free, keys ordered) and walks every bucket; `snapshot restore`
/// opens the file read-write with etcd's backend options and commits to it; a real etcd
/// then serves the restored keys.
#[test]
#[ignore = "needs etcd and etcdctl 3.4 on PATH; run with --ignored"]
fn etcdctl_reads_files_the_writer_wrote() {
    use std::process::Command;
    if Command::new("etcdctl").arg("version").output().is_err() {
        eprintln!("SKIPPED: etcdctl is not on PATH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kvd.snapshot.db");
    let n = 20_000;
    write_etcd_shape(&db, n);
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json"])
        .arg(&db)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(status["totalKey"], n + 1, "{status}");
    assert_eq!(status["revision"], n + 1, "{status}");
    assert_eq!(status["totalSize"], std::fs::metadata(&db).unwrap().len());

    let restored = dir.path().join("restored");
    let port: u16 = rand::thread_rng().gen_range(30000..60000);
    let peer = format!("http://127.0.0.1:{}", port + 1);
    let client = format!("http://127.0.0.1:{port}");
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "restore", "--skip-hash-check", "--name", "r"])
        .arg(&db)
        .arg("--data-dir")
        .arg(&restored)
        .args(["--initial-cluster", &format!("r={peer}")])
        .args(["--initial-advertise-peer-urls", &peer])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The restored backend is still a file this reader takes, with the keys intact.
    let r = Reader::open(&restored.join("member/snap/db")).unwrap();
    let mut count = 0;
    r.for_each(b"key", |_, _| {
        count += 1;
        Ok::<(), BoltError>(())
    })
    .unwrap();
    assert_eq!(count, n);
    drop(r);

    // etcd itself starts on the restored data and serves the keys at the last revision.
    let mut etcd = Command::new("etcd")
        .args(["--name", "r", "--data-dir"])
        .arg(&restored)
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let get = || {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &client, "--command-timeout", "2s"])
            .args(["get", "k00000123", "-w", "json"])
            .output()
            .unwrap()
    };
    let mut answer = None;
    for _ in 0..50 {
        let out = get();
        if out.status.success() {
            answer = Some(String::from_utf8_lossy(&out.stdout).into_owned());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Have Go bbolt rewrite the whole file (defrag: a fresh file with branch pages, overflow
    // pages and inline buckets of its own making), then save a snapshot of it.
    let ctl = |args: &[&str]| {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &client])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let saved = dir.path().join("saved.db");
    let defrag = ctl(&["defrag"]);
    let save = ctl(&["snapshot", "save", saved.to_str().unwrap()]);
    etcd.kill().unwrap();
    etcd.wait().unwrap();
    assert!(defrag.0 && save.0, "{defrag:?} {save:?}");
    let answer: serde_json::Value =
        serde_json::from_str(answer.expect("etcd answered").trim()).unwrap();
    assert_eq!(answer["header"]["revision"], n + 1, "{answer}");
    assert_eq!(answer["count"], 1, "{answer}");
    // Revisions 123 + 1000 i for i < 20: the last one is 19123.
    assert_eq!(answer["kvs"][0]["mod_revision"], 19_123, "{answer}");

    // Go bbolt's file, read back here: every revision, byte for byte.
    let r = Reader::open(&saved).unwrap();
    let mut rev = 2;
    r.for_each(b"key", |k, v| {
        let (wk, wv) = etcd_shape_kv(rev);
        assert_eq!((k, v), (&wk[..], &wv[..]), "revision {rev}");
        rev += 1;
        Ok::<(), BoltError>(())
    })
    .unwrap();
    assert_eq!(rev, n + 2);
}

/// Measurement, not a check: `KVD_BBOLT_BENCH=/path/file` writes 1M keys of 1 KiB values
/// there (run under `/usr/bin/time -v`, release build); see the decision record 0017.
#[test]
#[ignore = "measurement; set KVD_BBOLT_BENCH"]
fn measure_write_1m() {
    let Ok(path) = std::env::var("KVD_BBOLT_BENCH") else {
        return;
    };
    let t = std::time::Instant::now();
    let mut w = Writer::create(Path::new(&path)).unwrap();
    w.bucket(b"key").unwrap();
    let mut value = vec![0u8; 1024];
    for rev in 0..1_000_000u64 {
        value[..8].copy_from_slice(&rev.to_le_bytes());
        w.put(&rev_key(rev, false), &value).unwrap();
    }
    let len = w.finish(1).unwrap();
    eprintln!("wrote {len} bytes in {:?}", t.elapsed());
}

/// Reads back what `measure_write_1m` wrote.
#[test]
#[ignore = "measurement; set KVD_BBOLT_BENCH"]
fn measure_read_1m() {
    let Ok(path) = std::env::var("KVD_BBOLT_BENCH") else {
        return;
    };
    let t = std::time::Instant::now();
    let r = Reader::open(Path::new(&path)).unwrap();
    let (mut n, mut bytes) = (0u64, 0usize);
    r.for_each(b"key", |k, v| {
        n += 1;
        bytes += k.len() + v.len();
        Ok::<(), BoltError>(())
    })
    .unwrap();
    assert_eq!(n, 1_000_000);
    eprintln!("read {n} keys, {bytes} bytes in {:?}", t.elapsed());
}
