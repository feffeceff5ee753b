//! Revisions, the per-key revision index and the history record encoding.
//!
//! # Invariants
//! - [`Revision::to_bytes`] orders bytewise as revisions order, and round-trips through
//!   [`Revision::from_bytes`]; it is the history tree's key encoding on disk.
//! - [`Record`]'s encoding (tombstone flag byte + prost `KeyValue`) is the history tree's
//!   value encoding on disk; both encodings are part of the data-dir and snapshot formats.
//! - A [`KeyIndex`] keeps the invariants stated on its type.

pub(super) mod key;
pub(super) mod lease;
pub(super) mod mem;

use prost::Message;

use crate::mvcc::error::MvccError;
use crate::proto::mvccpb::KeyValue;

/// A point in the history: `main` is bumped once per write request, `sub` numbers the
/// changes within that request from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    /// The store revision (`mod_revision` of the written key).
    pub main: i64,
    /// Index of the change within the write request.
    pub sub: i64,
}

impl Revision {
    /// Key of this revision in the history tree. Big endian so that the engine's byte order is
    /// revision order (revisions are never negative).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.main.to_be_bytes());
        b[8..].copy_from_slice(&self.sub.to_be_bytes());
        b
    }

    /// Inverse of [`Revision::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<Self, MvccError> {
        if b.len() != 16 {
            return Err(MvccError::corrupt(format!(
                "bad revision key length {}",
                b.len()
            )));
        }
        let mut m = [0u8; 8];
        let mut s = [0u8; 8];
        m.copy_from_slice(&b[..8]);
        s.copy_from_slice(&b[8..]);
        Ok(Revision {
            main: i64::from_be_bytes(m),
            sub: i64::from_be_bytes(s),
        })
    }
}

type Generations = smallvec::SmallVec<[Generation; 1]>;

/// One life of a key: from its creation up to (if `closed`) its deletion. When `closed`,
/// the last revision is the tombstone.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Generation {
    revs: Vec<Revision>,
    closed: bool,
}

/// All revisions of one key that are still in the history, grouped by generation like
/// etcd's `keyIndex`. Most keys have one generation; it is kept inline, so that a put on a
/// key touches one allocation (its revisions), not two.
///
/// Invariants: no generation is empty; only the last generation may be open; revisions
/// strictly increase across the whole index. While the key is live, `created` and `version`
/// are its current value's `create_revision` and `version` (etcd's generation `created` and
/// `ver`), so a put needs no history read to fill them in; otherwise they mean nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyIndex {
    gens: Generations,
    created: i64,
    version: i64,
}

/// A revision found in a [`KeyIndex`] and whether it is the tombstone of its generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub rev: Revision,
    pub tombstone: bool,
}

/// A question about one key's revisions, answered by [`KeyIndex::query`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Query {
    /// [`KeyIndex::latest`].
    Latest,
    /// [`KeyIndex::before`].
    Before(Revision),
}

impl KeyIndex {
    pub fn query(&self, q: Query) -> Option<Found> {
        match q {
            Query::Latest => self.latest(),
            Query::Before(rev) => self.before(rev),
        }
    }

    /// The last revision satisfying `pred`, which must hold for a prefix of the revisions.
    fn last_where(&self, pred: impl Fn(Revision) -> bool) -> Option<Found> {
        for g in self.gens.iter().rev() {
            let n = g.revs.partition_point(|r| pred(*r));
            if n > 0 {
                return Some(Found {
                    rev: g.revs[n - 1],
                    tombstone: g.closed && n == g.revs.len(),
                });
            }
        }
        None
    }

    /// The newest revision of the key.
    pub fn latest(&self) -> Option<Found> {
        self.last_where(|_| true)
    }

    /// The newest revision with `main <= rev`: the key's state as seen at store revision `rev`.
    pub fn at(&self, rev: i64) -> Option<Found> {
        self.last_where(|r| r.main <= rev)
    }

    /// The newest revision strictly before `rev` (the state a change at `rev` replaced).
    pub fn before(&self, rev: Revision) -> Option<Found> {
        self.last_where(|r| r < rev)
    }

    /// Whether the key exists (is not deleted) at its newest revision.
    pub fn is_live(&self) -> bool {
        matches!(self.gens.last(), Some(g) if !g.closed)
    }

    /// `(create_revision, version)` of the key's current value, if it is live.
    pub fn life(&self) -> Option<(i64, i64)> {
        self.is_live().then_some((self.created, self.version))
    }

    pub fn put(&mut self, rev: Revision) {
        debug_assert!(self.latest().is_none_or(|f| f.rev < rev));
        match self.gens.last_mut() {
            Some(g) if !g.closed => {
                g.revs.push(rev);
                self.version += 1;
            }
            _ => {
                self.gens.push(Generation {
                    revs: vec![rev],
                    closed: false,
                });
                (self.created, self.version) = (rev.main, 1);
            }
        }
    }

    pub fn tombstone(&mut self, rev: Revision) {
        let g = self
            .gens
            .last_mut()
            .filter(|g| !g.closed)
            .expect("tombstone of a key that is not live");
        debug_assert!(g.revs.last().is_none_or(|r| *r < rev));
        g.revs.push(rev);
        g.closed = true;
    }

    /// Undoes the last [`Self::put`] or [`Self::tombstone`]. Returns whether the index is
    /// now empty.
    pub fn unpush(&mut self) -> bool {
        if let Some(g) = self.gens.last_mut() {
            g.revs.pop();
            if g.closed {
                // A tombstone always closes a generation that already had a put.
                g.closed = false;
            } else {
                self.version -= 1;
            }
            if g.revs.is_empty() {
                self.gens.pop();
            }
        }
        self.gens.is_empty()
    }

    /// Adds a revision read back from the history, in revision order, with its record's
    /// `create_revision` and `version` (`life`, ignored for a tombstone). Unlike
    /// [`Self::tombstone`] it tolerates a tombstone with no open generation (it starts a
    /// closed one), so a damaged history still loads.
    pub fn restore(&mut self, rev: Revision, tombstone: bool, life: (i64, i64)) {
        match (tombstone, self.gens.last_mut()) {
            (false, _) => {
                self.put(rev);
                (self.created, self.version) = life;
            }
            (true, Some(g)) if !g.closed => {
                g.revs.push(rev);
                g.closed = true;
            }
            (true, _) => self.gens.push(Generation {
                revs: vec![rev],
                closed: true,
            }),
        }
    }

    /// Compaction at `at` (etcd's `keyIndex.compact`): keeps the newest revision with
    /// `main <= at` unless it is a tombstone, plus everything newer. Returns the remaining
    /// index (`None` if nothing is left) and the revisions whose records must be removed.
    pub fn compact(&self, at: i64) -> (Option<KeyIndex>, Vec<Revision>) {
        let mut removed = Vec::new();
        let mut gens = Generations::new();
        // The generation holding the newest revision <= at decides what stays.
        let pivot = self.at(at);
        for g in &self.gens {
            let Some(p) = pivot else {
                gens.push(g.clone());
                continue;
            };
            let keep_from = g.revs.partition_point(|r| *r < p.rev);
            let keep_from = if p.tombstone && keep_from < g.revs.len() && g.revs[keep_from] == p.rev
            {
                keep_from + 1
            } else {
                keep_from
            };
            removed.extend_from_slice(&g.revs[..keep_from]);
            if keep_from < g.revs.len() {
                gens.push(Generation {
                    revs: g.revs[keep_from..].to_vec(),
                    closed: g.closed,
                });
            }
        }
        let rest = if gens.is_empty() {
            None
        } else {
            Some(KeyIndex {
                gens,
                created: self.created,
                version: self.version,
            })
        };
        (rest, removed)
    }
}

/// A history entry: the key's full state after a put, or a tombstone carrying only
/// `key` and `mod_revision` (what etcd puts into DELETE events).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Record {
    pub kv: KeyValue,
    pub tombstone: bool,
}

impl Record {
    /// One flag byte followed by the prost-encoded `KeyValue`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(1 + self.kv.encoded_len());
        v.push(self.tombstone as u8);
        self.kv.encode(&mut v).expect("Vec has unlimited capacity");
        v
    }

    pub fn decode(b: &[u8]) -> Result<Self, MvccError> {
        let (flag, rest) = b
            .split_first()
            .ok_or_else(|| MvccError::corrupt("empty history record"))?;
        Ok(Record {
            tombstone: *flag != 0,
            kv: KeyValue::decode(rest)?,
        })
    }

    /// What the key index takes from a record ([`Record::decode`] less the value, which is
    /// skipped, not copied): its tombstone flag and [`RecordHead`].
    pub fn decode_head(b: &[u8]) -> Result<(bool, RecordHead), MvccError> {
        let (flag, rest) = b
            .split_first()
            .ok_or_else(|| MvccError::corrupt("empty history record"))?;
        Ok((*flag != 0, RecordHead::decode(rest)?))
    }
}

/// A `KeyValue`'s fields but its value, decoded from the same bytes: the value (tag 5) is
/// an unknown field here, which prost steps over. Building the index from every record of a
/// store (at open, or as a snapshot arrives) then copies no value.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RecordHead {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

/// An 8-byte big-endian integer, as the lease and meta trees store them.
pub(crate) fn decode_i64(v: &[u8]) -> Result<i64, MvccError> {
    let b: [u8; 8] = v
        .try_into()
        .map_err(|_| MvccError::corrupt("bad revision in meta tree"))?;
    Ok(i64::from_be_bytes(b))
}

#[cfg(test)]
mod record_tests {
    use super::*;

    fn record(tombstone: bool, value: Vec<u8>, lease: i64) -> Record {
        Record {
            kv: KeyValue {
                key: b"some/key".to_vec(),
                create_revision: 7,
                mod_revision: 9,
                version: 3,
                value,
                lease,
            },
            tombstone,
        }
    }

    /// The head holds exactly what the full decoding holds, less the value.
    #[test]
    fn a_record_head_is_the_record_less_its_value() {
        for r in [
            record(false, vec![7; 3000], 42),
            record(false, Vec::new(), 0),
            record(true, Vec::new(), 0),
        ] {
            let b = r.encode();
            let full = Record::decode(&b).unwrap();
            let (tombstone, head) = Record::decode_head(&b).unwrap();
            assert_eq!(tombstone, full.tombstone);
            assert_eq!(
                head,
                RecordHead {
                    key: full.kv.key,
                    create_revision: full.kv.create_revision,
                    mod_revision: full.kv.mod_revision,
                    version: full.kv.version,
                    lease: full.kv.lease,
                }
            );
        }
    }

    /// A record cut short, within its value or its key, or empty, does not decode, as the
    /// full decoding refuses it.
    #[test]
    fn a_damaged_record_head_does_not_decode() {
        let b = record(false, vec![7; 300], 42).encode();
        for cut in [0, 5, b.len() - 150, b.len() - 1] {
            assert!(Record::decode(&b[..cut]).is_err(), "cut at {cut}");
            assert!(Record::decode_head(&b[..cut]).is_err(), "cut at {cut}");
        }
    }
}
