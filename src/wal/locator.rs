//! Where each live Entry record sits in the segment files, so the Raft log store can drop
//! entries from memory and read them back on demand (`Wal::read_entries`).
//!
//! Invariants:
//! - The locator is updated from the same record stream that reaches the disk, in the same
//!   order: by recovery from the surviving frames, then by the flusher as it appends each
//!   batch. So for every index it holds, the location is that of the newest Entry record for
//!   the index that no later TruncateAfter or PurgeUpTo has cancelled: the entry the log
//!   store would have rebuilt from a replay.
//! - A location is added once its bytes are written to the file (before the batch's
//!   fdatasync). The log store reads back only entries it was told are durable, so a read
//!   never races the write of the same bytes.
//! - Entries at or below a PurgeUpTo are forgotten before the flusher may unlink their
//!   segment; a reader that looked a location up just before that and finds the file gone
//!   sees the purge, not corruption.

use std::collections::BTreeMap;
use std::ops::Range;

use super::Record;

/// One Entry frame: its segment, the frame's offset in it and the frame's length
/// (header included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub seq: u64,
    pub offset: u64,
    pub len: u32,
}

impl Loc {
    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.len)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Locator {
    locs: BTreeMap<u64, Loc>,
}

impl Locator {
    /// Applies one record as it lands at `loc` (an Entry's frame; ignored for the others).
    pub fn observe(&mut self, rec: &Record, loc: Loc) {
        match rec {
            Record::Entry { index, .. } => {
                // A rewrite of an index replaces the old entry and everything after it, as
                // openraft only rewrites after a truncation (recorded before it).
                self.locs.split_off(index);
                self.locs.insert(*index, loc);
            }
            Record::TruncateAfter { index } => {
                self.locs.split_off(&index.map_or(0, |i| i + 1));
            }
            Record::PurgeUpTo { index, .. } => {
                self.locs = self.locs.split_off(&(index + 1));
            }
            Record::Vote(_) | Record::Committed(_) => {}
        }
    }

    /// The locations of the indexes in `range`, in order, from the first one the locator
    /// holds to the first hole after it.
    pub fn lookup(&self, range: Range<u64>) -> Vec<(u64, Loc)> {
        let mut out: Vec<(u64, Loc)> = Vec::new();
        for (&i, &loc) in self.locs.range(range) {
            if out.last().is_some_and(|&(prev, _)| prev + 1 != i) {
                break;
            }
            out.push((i, loc));
        }
        out
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.locs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64) -> Record {
        Record::Entry {
            index,
            data: vec![],
        }
    }

    fn at(offset: u64) -> Loc {
        Loc {
            seq: 0,
            offset,
            len: 10,
        }
    }

    #[test]
    fn truncation_rewrite_and_purge_follow_replay_semantics() {
        let mut l = Locator::default();
        for i in 1..=5 {
            l.observe(&entry(i), at(i * 10));
        }
        l.observe(&Record::TruncateAfter { index: Some(3) }, at(0));
        assert_eq!(l.lookup(1..10).len(), 3);
        // A rewrite of index 3 (after a truncation to 2) cancels the old 3.
        l.observe(&entry(3), at(100));
        assert_eq!(l.lookup(3..4), vec![(3, at(100))]);
        l.observe(
            &Record::PurgeUpTo {
                index: 2,
                data: vec![],
            },
            at(0),
        );
        assert_eq!(l.lookup(1..3), vec![]);
        assert_eq!(l.lookup(1..10), vec![(3, at(100))]);
        l.observe(&Record::TruncateAfter { index: None }, at(0));
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn lookup_stops_at_a_hole() {
        let mut l = Locator::default();
        l.observe(&entry(1), at(10));
        l.observe(&entry(2), at(20));
        l.observe(&entry(4), at(40));
        assert_eq!(l.lookup(0..3).len(), 2);
        assert_eq!(l.lookup(1..9).len(), 2);
        assert_eq!(l.lookup(2..9).len(), 1);
        assert_eq!(l.lookup(3..9), vec![(4, at(40))]);
    }
}
