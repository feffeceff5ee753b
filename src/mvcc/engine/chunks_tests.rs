//! The chunked history tree against a model (a `BTreeMap`): random writes in batches, then
//! point reads, scans both ways with random bounds, and the chunks' own invariants.

use std::collections::BTreeMap;
use std::ops::Bound::{self, Excluded, Included, Unbounded};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::chunks::{self, ChunkIndex, ChunkIter, CHUNK_BYTES, CHUNK_RECORDS};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn key(i: u64) -> Vec<u8> {
    // A history key's shape: main revision, separator, sub revision.
    let mut k = i.to_be_bytes().to_vec();
    k.push(b'_');
    k.extend_from_slice(&(i % 3).to_be_bytes());
    k
}

fn apply(
    tree: &::sled::Tree,
    index: &ChunkIndex,
    model: &mut Model,
    writes: &[(Vec<u8>, Option<Vec<u8>>)],
) {
    let mut plan = chunks::plan(tree, writes.iter().map(|(k, v)| (&k[..], v.as_deref()))).unwrap();
    tree.apply_batch(std::mem::take(&mut plan.batch)).unwrap();
    index.update(&plan);
    for (k, v) in writes {
        match v {
            Some(v) => model.insert(k.clone(), v.clone()),
            None => model.remove(k),
        };
    }
}

fn check_chunks(tree: &::sled::Tree, model: &Model) {
    let mut all = Vec::new();
    let mut prev_end: Option<Vec<u8>> = None;
    for item in tree.iter() {
        let (ck, chunk) = item.unwrap();
        let rs = chunks::records(&ck, &chunk).unwrap();
        assert!(!rs.is_empty(), "empty chunk");
        assert_eq!(&rs[0].0[..], &ck[..], "chunk key is its first record's");
        assert!(rs.len() <= CHUNK_RECORDS);
        assert!(
            rs.len() == 1 || chunk.len() <= CHUNK_BYTES,
            "chunk of {} bytes",
            chunk.len()
        );
        assert!(rs.windows(2).all(|w| w[0].0 < w[1].0), "records sorted");
        if let Some(p) = &prev_end {
            assert!(ck[..] > p[..], "chunks overlap");
        }
        prev_end = Some(rs.last().unwrap().0.to_vec());
        all.extend(rs.into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())));
    }
    assert_eq!(
        all,
        model
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    );
}

fn bound(rng: &mut StdRng, max: u64) -> Bound<Vec<u8>> {
    match rng.gen_range(0..5) {
        0 => Unbounded,
        1 | 2 => Included(key(rng.gen_range(0..max))),
        _ => Excluded(key(rng.gen_range(0..max))),
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Included(k) => Included(&k[..]),
        Excluded(k) => Excluded(&k[..]),
        Unbounded => Unbounded,
    }
}

/// Point reads through the current index, through one that is behind (`stale`, from some
/// rounds ago: what a reader racing a write holds), and through an empty one, then scans.
fn check_reads(
    tree: &::sled::Tree,
    indexes: [&ChunkIndex; 3],
    model: &Model,
    rng: &mut StdRng,
    max: u64,
) {
    for _ in 0..50 {
        let k = key(rng.gen_range(0..max));
        for index in indexes {
            assert_eq!(
                chunks::get(tree, index, &k).unwrap().map(|v| v.to_vec()),
                model.get(&k).cloned()
            );
        }
    }
    // Many keys at once: runs of neighbours (chunks shared), in order and shuffled, with
    // absent keys among them.
    for _ in 0..20 {
        let start = rng.gen_range(0..max);
        let mut ks: Vec<Vec<u8>> = (start..(start + rng.gen_range(1..80)).min(max + 3))
            .filter(|_| rng.gen_bool(0.7))
            .map(key)
            .collect();
        if !ks.is_empty() && rng.gen_bool(0.3) {
            ks.reverse();
            let mid = ks.len() / 2;
            ks.swap(0, mid);
        }
        let refs: Vec<&[u8]> = ks.iter().map(|k| &k[..]).collect();
        let want: Vec<Option<Vec<u8>>> = ks.iter().map(|k| model.get(k).cloned()).collect();
        for index in indexes {
            let got: Vec<Option<Vec<u8>>> = chunks::get_many(tree, index, &refs)
                .unwrap()
                .into_iter()
                .map(|v| v.map(|v| v.to_vec()))
                .collect();
            assert_eq!(got, want, "get_many of {} keys from {start}", ks.len());
        }
    }
    for _ in 0..30 {
        let (lo, hi) = (bound(rng, max), bound(rng, max));
        // BTreeMap's range panics on these (and on equal bounds both excluded).
        let inverted = match (&lo, &hi) {
            (Excluded(a), Excluded(b)) => a >= b,
            (Included(a) | Excluded(a), Included(b) | Excluded(b)) => a > b,
            _ => false,
        };
        let want: Vec<Vec<u8>> = if inverted {
            vec![]
        } else {
            model
                .range((lo.clone(), hi.clone()))
                .map(|(k, _)| k.clone())
                .collect()
        };
        let scan = |back: bool| -> Vec<Vec<u8>> {
            let it = ChunkIter::new(tree, as_ref(&lo), as_ref(&hi));
            let mut got: Vec<Vec<u8>> = if back {
                it.rev().map(|r| r.unwrap().0.to_vec()).collect()
            } else {
                it.map(|r| r.unwrap().0.to_vec()).collect()
            };
            if back {
                got.reverse();
            }
            got
        };
        assert_eq!(scan(false), want, "forward {lo:?}..{hi:?}");
        assert_eq!(scan(true), want, "backward {lo:?}..{hi:?}");
        // Both ends of one scan meet without losing or repeating a record.
        let mut it = ChunkIter::new(tree, as_ref(&lo), as_ref(&hi));
        let (mut front, mut back) = (Vec::new(), Vec::new());
        loop {
            if rng.gen_bool(0.5) {
                match it.next() {
                    Some(r) => front.push(r.unwrap().0.to_vec()),
                    None => break,
                }
            } else {
                match it.next_back() {
                    Some(r) => back.push(r.unwrap().0.to_vec()),
                    None => break,
                }
            }
        }
        back.reverse();
        front.extend(back);
        assert_eq!(front, want, "both ends {lo:?}..{hi:?}");
    }
}

#[test]
fn chunked_history_matches_a_model() {
    let db = ::sled::Config::new().temporary(true).open().unwrap();
    let tree = db.open_tree("chunks").unwrap();
    let index = ChunkIndex::default();
    let mut stale = ChunkIndex::default();
    let mut model = Model::new();
    let mut rng = StdRng::seed_from_u64(20261202);
    let mut next = 0u64;
    for round in 0..120 {
        let mut writes = Vec::new();
        for _ in 0..rng.gen_range(0..200) {
            let w = match rng.gen_range(0..10) {
                // Mostly appends, as the committer writes.
                0..=5 => {
                    next += 1;
                    (key(next), Some(vec![round as u8; rng.gen_range(0..400)]))
                }
                // A rewrite of an old record, or one below every chunk.
                6 => (key(rng.gen_range(0..next + 1)), Some(vec![7; 3])),
                // Deletes, as compaction's.
                _ => (key(rng.gen_range(0..next + 1)), None),
            };
            writes.push(w);
        }
        // Now and then one large value, which gets a chunk alone.
        if round % 17 == 0 {
            next += 1;
            writes.push((key(next), Some(vec![1; CHUNK_BYTES + 10])));
        }
        apply(&tree, &index, &mut model, &writes);
        check_chunks(&tree, &model);
        let empty = ChunkIndex::default();
        check_reads(&tree, [&index, &stale, &empty], &model, &mut rng, next + 2);
        if round % 5 == 0 {
            stale = ChunkIndex::load(&tree).unwrap();
        }
    }
    // Delete everything in random batches: no chunk is left behind.
    let mut left: Vec<Vec<u8>> = model.keys().cloned().collect();
    while !left.is_empty() {
        let n = rng.gen_range(1..300).min(left.len());
        let writes: Vec<_> = left.drain(..n).map(|k| (k, None)).collect();
        apply(&tree, &index, &mut model, &writes);
        check_chunks(&tree, &model);
    }
    assert_eq!(tree.len(), 0);
    let reloaded = ChunkIndex::load(&tree).unwrap();
    assert!(chunks::get(&tree, &reloaded, &key(1)).unwrap().is_none());
}

#[test]
fn a_chunk_that_does_not_decode_is_an_error_not_a_panic() {
    let db = ::sled::Config::new().temporary(true).open().unwrap();
    let tree = db.open_tree("chunks").unwrap();
    tree.insert(key(5), vec![0, 0, 0, 9, 1]).unwrap();
    assert!(chunks::get(&tree, &ChunkIndex::default(), &key(5)).is_err());
    assert!(chunks::get(&tree, &ChunkIndex::load(&tree).unwrap(), &key(5)).is_err());
    assert!(ChunkIter::new(&tree, Unbounded, Unbounded)
        .next()
        .unwrap()
        .is_err());
    assert!(chunks::plan(&tree, [(&key(6)[..], None)].into_iter()).is_err());
}

#[test]
fn migration_packs_an_unchunked_tree() {
    let db = ::sled::Config::new().temporary(true).open().unwrap();
    let (from, to) = (db.open_tree("old").unwrap(), db.open_tree("new").unwrap());
    let mut model = Model::new();
    for i in 0..(CHUNK_RECORDS as u64 * 256 * 2 + 5) {
        let v = vec![(i % 251) as u8; (i % 50) as usize];
        from.insert(key(i), v.clone()).unwrap();
        model.insert(key(i), v);
    }
    // Leftovers of an interrupted migration are cleared first.
    to.insert(key(1_000_000), b"stale".to_vec()).unwrap();
    chunks::migrate(&from, &to).unwrap();
    check_chunks(&to, &model);
}
