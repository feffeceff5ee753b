//! etcd's `key`/`range_end` pair as a key range.
//!
//! # Invariants
//! - [`KeyRange::bounds`] selects exactly the keys [`KeyRange::contains`] accepts, and is never
//!   an inverted range.

use std::ops::Bound;

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
        match self {
            KeyRange::Single(s) => s == k,
            KeyRange::From(s) => k >= s.as_slice(),
            KeyRange::Between(s, e) => k >= s.as_slice() && k < e.as_slice(),
            KeyRange::Empty => false,
        }
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
