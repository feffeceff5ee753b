//! The `count` of a paginated listing, carried from page to page.
//!
//! Every page of a listing (`key` = the page's first key, a fixed `range_end`, `limit`, and
//! from the second page on the revision of the first) answers `count`: the number of keys
//! live in `[key, range_end)` at that revision. Counted by a scan, each page costs as much as
//! the rest of the range, and a listing of n keys in pages of p costs n²/2p key visits: the
//! listing is quadratic (etcd's is too). A page that follows another of the same range end
//! and revision instead subtracts, from the count the earlier page found, the live keys
//! between the two pages' first keys: what the client just read. A listing then costs one
//! count of the whole range, at its first page, and a page's worth of keys per later page.
//!
//! Invariants:
//! - An entry is a fact about the store's history: the number of live keys in `[start, end)`
//!   at revision `rev`. Applies only add revisions after the current one, and compaction only
//!   removes history older than the revisions it still serves, so the fact stays true for as
//!   long as reads at `rev` are served; a store that loads another image forgets them all.
//! - An entry is only used for a range that starts at or after its `start` and ends at the
//!   same `end` (the raw `range_end`, so `"\0"`, "every key from", matches only itself).
//! - Small and bounded ([`ENTRIES`]), the least recently stored dropped first.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::sync::LockExt;

/// Listings remembered at once: concurrent listings of different ranges (an API server
/// lists each resource type under its own prefix).
const ENTRIES: usize = 64;

/// The number of live keys in `[start, end)` at `rev`.
struct Entry {
    end: Vec<u8>,
    rev: i64,
    start: Vec<u8>,
    count: usize,
}

/// Counts remembered from the pages of recent listings.
#[derive(Default)]
pub(crate) struct PageCounts {
    entries: Mutex<VecDeque<Entry>>,
}

impl PageCounts {
    /// The closest remembered count for a range ending at `end` and starting at `start`, at
    /// `rev`: `(its start, its count)`, its start at or before `start`.
    pub fn closest(&self, end: &[u8], rev: i64, start: &[u8]) -> Option<(Vec<u8>, usize)> {
        let entries = self.entries.lock_or_recover();
        entries
            .iter()
            .filter(|e| e.rev == rev && e.end == end && e.start.as_slice() <= start)
            .max_by(|a, b| a.start.cmp(&b.start))
            .map(|e| (e.start.clone(), e.count))
    }

    /// Remembers that `count` keys are live in `[start, end)` at `rev`, in place of what was
    /// remembered for the same listing (same `end` and `rev`).
    pub fn remember(&self, end: &[u8], rev: i64, start: &[u8], count: usize) {
        let mut entries = self.entries.lock_or_recover();
        entries.retain(|e| !(e.rev == rev && e.end == end));
        if entries.len() == ENTRIES {
            entries.pop_front();
        }
        entries.push_back(Entry {
            end: end.to_vec(),
            rev,
            start: start.to_vec(),
            count,
        });
    }

    /// Forgets every count (the store loaded another image).
    pub fn clear(&self) {
        self.entries.lock_or_recover().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closest_earlier_start_of_the_same_listing_is_found() {
        let c = PageCounts::default();
        c.remember(b"b", 7, b"a1", 100);
        assert_eq!(c.closest(b"b", 7, b"a5"), Some((b"a1".to_vec(), 100)));
        assert_eq!(c.closest(b"b", 7, b"a1"), Some((b"a1".to_vec(), 100)));
        assert_eq!(c.closest(b"b", 7, b"a0"), None, "starts after the range");
        assert_eq!(c.closest(b"b", 8, b"a5"), None, "another revision");
        assert_eq!(c.closest(b"c", 7, b"a5"), None, "another end");
        // The next page replaces the listing's entry.
        c.remember(b"b", 7, b"a5", 60);
        assert_eq!(c.closest(b"b", 7, b"a9"), Some((b"a5".to_vec(), 60)));
        assert_eq!(c.closest(b"b", 7, b"a2"), None);
    }

    #[test]
    fn it_stays_small() {
        let c = PageCounts::default();
        for rev in 0..(ENTRIES as i64 + 10) {
            c.remember(b"z", rev, b"a", 1);
        }
        assert_eq!(c.entries.lock_or_recover().len(), ENTRIES);
        assert_eq!(c.closest(b"z", 0, b"a"), None, "the oldest went first");
        c.clear();
        assert_eq!(c.closest(b"z", ENTRIES as i64, b"a"), None);
    }
}
