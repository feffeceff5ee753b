//! A key of the in-memory index with its first eight bytes beside it, as a number.
//!
//! A search in the index ([`crate::mvcc::index::mem`]) compares the probe with several stored keys in
//! each tree node it passes. Each stored key's bytes are an allocation of their own, so on a
//! large index each comparison costs a cache miss; comparing `head`s first, which sit in the
//! node itself, leaves the bytes to keys whose first eight bytes are equal. Keys that share a
//! long prefix (Kubernetes' `/registry/...`) gain nothing and lose one integer comparison.
//!
//! Invariant: ordering by `(head, bytes)` is the bytewise ordering of the keys. `head` is the
//! first eight bytes, big-endian, padded with zeros. Where two heads differ, their first
//! differing byte is either a byte both keys have, which orders the keys, or a position where
//! one key has ended: then the other key's byte is not zero, and the shorter key, a prefix of
//! the other, is the lesser in both orderings.
//!
//! Lookups borrow a stored key as `dyn KeyProbe`, the only way `BTreeMap` lets a borrowed
//! probe ([`Probe`], no allocation) and an owned key ([`IndexKey`]) compare alike.

use std::borrow::Borrow;
use std::cmp::Ordering;

/// What a search compares: see the module docs.
pub(crate) trait KeyProbe {
    fn head(&self) -> u64;
    fn bytes(&self) -> &[u8];
}

fn head_of(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// A key as the index stores it.
#[derive(Clone, Debug)]
pub(crate) struct IndexKey {
    head: u64,
    bytes: Box<[u8]>,
}

impl IndexKey {
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl From<&[u8]> for IndexKey {
    fn from(key: &[u8]) -> Self {
        IndexKey {
            head: head_of(key),
            bytes: key.into(),
        }
    }
}

impl From<Vec<u8>> for IndexKey {
    fn from(key: Vec<u8>) -> Self {
        IndexKey {
            head: head_of(&key),
            bytes: key.into_boxed_slice(),
        }
    }
}

/// A key looked up in the index.
pub(crate) struct Probe<'a> {
    head: u64,
    bytes: &'a [u8],
}

impl<'a> Probe<'a> {
    pub fn new(key: &'a [u8]) -> Self {
        Probe {
            head: head_of(key),
            bytes: key,
        }
    }
}

impl KeyProbe for IndexKey {
    fn head(&self) -> u64 {
        self.head
    }
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl KeyProbe for Probe<'_> {
    fn head(&self) -> u64 {
        self.head
    }
    fn bytes(&self) -> &[u8] {
        self.bytes
    }
}

fn compare(a: &dyn KeyProbe, b: &dyn KeyProbe) -> Ordering {
    a.head()
        .cmp(&b.head())
        .then_with(|| a.bytes().cmp(b.bytes()))
}

impl Ord for dyn KeyProbe + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        compare(self, other)
    }
}

impl PartialOrd for dyn KeyProbe + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for dyn KeyProbe + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for dyn KeyProbe + '_ {}

impl Ord for IndexKey {
    fn cmp(&self, other: &Self) -> Ordering {
        compare(self, other)
    }
}

impl PartialOrd for IndexKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for IndexKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for IndexKey {}

impl<'a> Borrow<dyn KeyProbe + 'a> for IndexKey {
    fn borrow(&self) -> &(dyn KeyProbe + 'a) {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys around the eight-byte boundary, with zero bytes and shared prefixes.
    fn keys() -> Vec<Vec<u8>> {
        let mut ks: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![0; 8],
            vec![0; 9],
            vec![1],
            b"a".to_vec(),
            b"a\0".to_vec(),
            b"a\0\0\0\0\0\0\0".to_vec(),
            b"a\0\0\0\0\0\0\0\0".to_vec(),
            b"a\0\0\0\0\0\0\0\x01".to_vec(),
            b"abcdefg".to_vec(),
            b"abcdefgh".to_vec(),
            b"abcdefgh\0".to_vec(),
            b"abcdefghi".to_vec(),
            b"abcdefgi".to_vec(),
            b"/registry/pods/a".to_vec(),
            b"/registry/pods/b".to_vec(),
            b"/registry/pod".to_vec(),
            vec![0xff; 8],
            vec![0xff; 12],
        ];
        for i in 0u32..300 {
            let k = i.wrapping_mul(2_654_435_761).to_be_bytes();
            ks.push(k[..(i as usize % 5)].to_vec());
            ks.push(format!("{:x}", i * 7919).into_bytes());
        }
        ks
    }

    #[test]
    fn ordering_is_bytewise() {
        let ks = keys();
        for a in &ks {
            for b in &ks {
                let (ia, ib) = (IndexKey::from(a.as_slice()), IndexKey::from(b.clone()));
                assert_eq!(ia.cmp(&ib), a.cmp(b), "{a:?} {b:?}");
                let (pa, pb) = (Probe::new(a), Probe::new(b));
                let (pa, pb): (&dyn KeyProbe, &dyn KeyProbe) = (&pa, &pb);
                assert_eq!(pa.cmp(pb), a.cmp(b), "{a:?} {b:?}");
                assert_eq!(pa.cmp(ib.borrow()), a.cmp(b), "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn a_map_finds_and_ranges_by_probe() {
        use std::collections::BTreeMap;
        use std::ops::Bound;
        let ks = keys();
        let map: BTreeMap<IndexKey, usize> = ks
            .iter()
            .enumerate()
            .map(|(i, k)| (IndexKey::from(k.as_slice()), i))
            .collect();
        let sorted: BTreeMap<&[u8], ()> = ks.iter().map(|k| (k.as_slice(), ())).collect();
        for k in &ks {
            let p = Probe::new(k);
            let got = map.get::<dyn KeyProbe>(&p).map(|i| ks[*i].as_slice());
            assert_eq!(got, Some(k.as_slice()));
            let from: Vec<&[u8]> = map
                .range::<dyn KeyProbe, _>((Bound::Included(&p as &dyn KeyProbe), Bound::Unbounded))
                .map(|(k, _)| k.bytes())
                .collect();
            let want: Vec<&[u8]> = sorted
                .range::<[u8], _>((Bound::Included(k.as_slice()), Bound::Unbounded))
                .map(|(k, _)| *k)
                .collect();
            assert_eq!(from, want);
        }
        assert!(!map.contains_key::<dyn KeyProbe>(&Probe::new(b"no such key")));
    }
}
