//! etcd's `key`/`range_end` pair as a key range.
//!
//! # Invariants
//! - [`KeyRange::bounds`] selects exactly the keys [`KeyRange::contains`] accepts, and is never
//!   an inverted range.

use std::ops::{Bound, RangeBounds};

/// The keys selected by etcd's `key`/`range_end` pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyRange {
    /// `range_end` empty: exactly `key`.
    Single(Vec<u8>),
    /// `range_end == "\0"`: every key `>= key`.
    From(Vec<u8>),
    /// `[key, range_end)` with `key < range_end`.
    Between(Vec<u8>, Vec<u8>),
    /// `range_end <= key`: nothing.
    Empty,
}

impl KeyRange {
    pub fn new(key: &[u8], range_end: &[u8]) -> Self {
        if range_end.is_empty() {
            KeyRange::Single(key.to_vec())
        } else if range_end == [0] {
            KeyRange::From(key.to_vec())
        } else if key < range_end {
            KeyRange::Between(key.to_vec(), range_end.to_vec())
        } else {
            KeyRange::Empty
        }
    }

    pub fn contains(&self, k: &[u8]) -> bool {
        RangeBounds::<[u8]>::contains(&self.bounds(), k)
    }

    pub fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        match self {
            KeyRange::Single(s) => (Bound::Included(s), Bound::Included(s)),
            KeyRange::From(s) => (Bound::Included(s), Bound::Unbounded),
            KeyRange::Between(s, e) => (Bound::Included(s), Bound::Excluded(e)),
            // An empty half-open range, which every ordered map accepts without panicking.
            KeyRange::Empty => (Bound::Included(&[]), Bound::Excluded(&[])),
        }
    }
}

/// Whether etcd's pair `key`/`range_end` selects `k`: the test of [`KeyRange::contains`] on
/// the pair as a request carries it, for filters that run per event and must not allocate.
pub fn range_contains(key: &[u8], range_end: &[u8], k: &[u8]) -> bool {
    match range_end {
        [] => k == key,
        [0] => k >= key,
        end => k >= key && k < end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pair_and_the_range_select_the_same_keys() {
        let keys: [&[u8]; 7] = [b"", b"\0", b"a", b"a/", b"a/x", b"a0", b"b"];
        for key in keys {
            for end in keys {
                let kr = KeyRange::new(key, end);
                for k in keys {
                    assert_eq!(
                        kr.contains(k),
                        range_contains(key, end, k),
                        "{key:?} {end:?} {k:?}"
                    );
                }
            }
        }
        assert!(range_contains(b"a", b"", b"a"));
        assert!(!range_contains(b"a", b"", b"ab"));
        assert!(range_contains(b"a/", b"a0", b"a/x"));
        assert!(!range_contains(b"a/", b"a0", b"a0"));
        assert!(range_contains(b"a", b"\0", b"zz"));
    }
}
