//! etcd's HashKV (a checksum of the key-value history up to a revision) and kvd's Hash (a
//! checksum of the whole state machine), for `etcdctl endpoint hashkv` and the corruption
//! checks.
//!
//! # HashKV
//! etcd 3.4 (`mvcc/kvstore.go`, `HashByRev`) feeds CRC-32C (Castagnoli) with the bucket name
//! `key`, then with every history entry of its `key` bucket whose revision is at most `rev`, as
//! the bucket stores it: etcd's revision key (17 or 18 bytes, see [`super::etcd::format`]) and
//! etcd's marshalled `KeyValue`. Entries at or below the compacted revision `C` count only if
//! they are in `keep`, the revisions a compaction at `rev` would keep (each key's newest
//! revision `<= rev` unless it is a tombstone); when `keep` is empty (no key is live at
//! `rev`), etcd counts every entry its bucket still holds below `C`, which once the compaction
//! has finished are the revisions the compaction at `C` kept. kvd computes the same set from
//! its key index, whatever its background compaction has deleted so far, so a kvd member and
//! an etcd member that applied the same writes answer the same hash.
//!
//! # Hash
//! etcd hashes its whole bbolt file, which kvd cannot reproduce. kvd's Hash is CRC-32C over the
//! same logical history as HashKV at the current revision with `keep` taken at `C` (so records
//! the background compaction has not deleted yet do not count), then the lease tree and the
//! meta tree (`lease`, `meta`, then each key and value in key order). Two members that applied
//! the same log index answer the same Hash; it is not comparable with etcd's.
//!
//! # Invariants
//! - Both hold the history gate for reading from the moment they fix the revision until they
//!   have read the history: neither background compaction nor a snapshot load deletes a record
//!   they will read. Applies go on meanwhile (they only add revisions above the bound).
//! - The current and compacted revisions are read together under the apply lock.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::sync::LockExt;

use super::engine::{Engine, Tree};
use super::error::MvccError;
use super::etcd::format::{rev_key, value, KEY_BUCKET, LEASE_BUCKET, META_BUCKET};
use super::index::{Record, Revision};
use super::key_range::KeyRange;
use super::view::View;
use super::{MvccStore, NEVER_COMPACTED};

/// CRC-32C (Castagnoli), Go's `crc32.MakeTable(Castagnoli)`, fed in pieces (the `crc32c`
/// crate, with the CPU's instruction where there is one).
#[derive(Clone, Copy, Debug, Default)]
pub struct Crc32c(u32);

impl Crc32c {
    pub fn update(&mut self, data: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, data);
    }

    pub fn sum(&self) -> u32 {
        self.0
    }
}

/// The answer to HashKV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvHash {
    pub hash: u32,
    /// The revision hashed up to (`hash_revision`).
    pub revision: i64,
    /// The store's current revision when the hash began (the response header's revision).
    pub current: i64,
    /// The compacted revision when the hash began, [`NEVER_COMPACTED`] if none.
    pub compacted: i64,
}

/// Which revisions at or below the compacted revision a hash counts.
enum Below {
    /// etcd's HashKV: `keep` at the hashed revision, or (if that is empty) at `C`.
    HashKv,
    /// kvd's Hash: what the compaction at `C` keeps.
    Compacted,
}

impl MvccStore {
    /// etcd's HashKV at `rev` (0 = the current revision); see the module docs. Fails with
    /// [`MvccError::Compacted`] if `0 < rev <= C`, [`MvccError::FutureRev`] past the current
    /// revision, as etcd does.
    pub fn hash_kv(&self, rev: i64) -> Result<KvHash, MvccError> {
        let (hold, current, compacted) = self.hold_history(|| Ok(()))?;
        if rev > 0 && rev <= compacted {
            return Err(MvccError::Compacted);
        }
        if rev > current {
            return Err(MvccError::FutureRev);
        }
        let rev = if rev == 0 { current } else { rev };
        let mut h = Crc32c::default();
        h.update(KEY_BUCKET);
        self.hash_history(&mut h, rev, compacted, Below::HashKv)?;
        drop(hold);
        Ok(KvHash {
            hash: h.sum(),
            revision: rev,
            current,
            compacted,
        })
    }

    /// kvd's Hash of the whole state machine and the current revision; see the module docs.
    pub fn hash_all(&self) -> Result<(u32, i64), MvccError> {
        let mut small = Vec::new();
        let (hold, current, compacted) = self.hold_history(|| {
            // Under the apply lock, the pending buffer persisted: the small trees as of
            // `current`.
            self.inner.persist_pending()?;
            for tree in [Tree::Lease, Tree::Meta] {
                for item in self.inner.engine.iter(tree) {
                    let (k, v) = item?;
                    small.push((tree, k.to_vec(), v.to_vec()));
                }
            }
            Ok(())
        })?;
        let mut h = Crc32c::default();
        h.update(KEY_BUCKET);
        self.hash_history(&mut h, current, compacted, Below::Compacted)?;
        drop(hold);
        let mut last = None;
        for (tree, k, v) in &small {
            if last != Some(*tree) {
                h.update(if *tree == Tree::Lease {
                    LEASE_BUCKET
                } else {
                    META_BUCKET
                });
                last = Some(*tree);
            }
            h.update(k);
            h.update(v);
        }
        Ok((h.sum(), current))
    }

    /// Takes the history gate for reading and reads the current and compacted revisions
    /// together, running `under_lock` while the apply lock is held.
    fn hold_history(
        &self,
        under_lock: impl FnOnce() -> Result<(), MvccError>,
    ) -> Result<(tokio::sync::OwnedRwLockReadGuard<()>, i64, i64), MvccError> {
        let i = &self.inner;
        let _guard = i.apply_lock.lock_or_recover();
        // Under `apply_lock` no load holds the gate; background compaction may, for a step.
        let hold = loop {
            match i.history_gate.clone().try_read_owned() {
                Ok(hold) => break hold,
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        under_lock()?;
        Ok((hold, self.current_revision(), self.compacted_revision()))
    }

    /// Feeds `h` with the history entries a hash at `rev` counts, in revision order.
    fn hash_history(
        &self,
        h: &mut Crc32c,
        rev: i64,
        compacted: i64,
        below: Below,
    ) -> Result<(), MvccError> {
        let view = self.applied();
        let mut feed = |r: Revision, rec: &Record| {
            h.update(&rev_key(r, rec.tombstone));
            h.update(&value(rec));
        };
        if compacted != NEVER_COMPACTED {
            let kept = match below {
                Below::HashKv => {
                    let (any_live, at_rev) = live_at(&view, rev, compacted)?;
                    if any_live {
                        at_rev
                    } else {
                        live_at(&view, compacted, compacted)?.1
                    }
                }
                Below::Compacted => live_at(&view, compacted, compacted)?.1,
            };
            // (A negative `rev` counts nothing, as etcd's upper bound then excludes all.)
            for r in kept.into_iter().filter(|r| r.main <= rev) {
                let rec = view.record(r)?.ok_or_else(|| {
                    MvccError::corrupt(format!("history record {}_{} is missing", r.main, r.sub))
                })?;
                feed(r, &rec);
            }
        }
        let lo = Revision {
            main: compacted.max(0) + 1,
            sub: 0,
        };
        let hi = Revision {
            main: rev + 1,
            sub: 0,
        };
        if hi <= lo {
            return Ok(());
        }
        for item in self.history(lo, hi) {
            let (r, rec) = item?;
            feed(r, &rec);
        }
        Ok(())
    }
}

/// Whether any key is live at `rev`, and the live revisions at `rev` that are at or below
/// `compacted` (etcd's `kvindex.Keep(rev)` restricted to what lies below the compaction).
fn live_at(
    view: &dyn View,
    rev: i64,
    compacted: i64,
) -> Result<(bool, BTreeSet<Revision>), MvccError> {
    let mut any = false;
    let mut out = BTreeSet::new();
    view.scan(&KeyRange::From(Vec::new()), &mut |_, ki| {
        if let Some(f) = ki.at(rev) {
            if !f.tombstone {
                any = true;
                if f.rev.main <= compacted {
                    out.insert(f.rev);
                }
            }
        }
        true
    })?;
    Ok((any, out))
}

#[cfg(test)]
mod tests {
    use super::Crc32c;
    use crate::mvcc::tests::{compact, del, put, temp_store};
    use crate::mvcc::MvccError;

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C.
        let mut h = Crc32c::default();
        h.update(b"123456789");
        assert_eq!(h.sum(), 0xE306_9283);
        let mut h = Crc32c::default();
        h.update(b"1234");
        h.update(b"56789");
        assert_eq!(h.sum(), 0xE306_9283);
    }

    /// The values etcd 3.4.23 answered for the same writes (tests/etcdctl_diff/hashkv_diff.sh
    /// runs the same history against a live etcd).
    #[test]
    fn hash_kv_equals_etcds_on_the_same_history() {
        let (_d, _db, s) = temp_store();
        assert_eq!(s.hash_kv(0).unwrap().hash, 1084519789); // an empty etcd's
        put(&s, "x", "y");
        assert_eq!(s.hash_kv(0).unwrap().hash, 1369599507);
        assert_eq!(s.hash_kv(1).unwrap().hash, 1084519789);
        assert_eq!(s.hash_kv(3), Err(MvccError::FutureRev));
        // etcd hashes nothing but the bucket name below revision 1.
        assert_eq!(s.hash_kv(-5).unwrap().hash, 1084519789);
        compact(&s, 2).unwrap();
        assert_eq!(s.hash_kv(2), Err(MvccError::Compacted));
        let h = s.hash_kv(0).unwrap();
        assert_eq!((h.revision, h.current, h.compacted), (2, 2, 2));
    }

    /// Records the background compaction has not deleted yet do not change any hash.
    #[test]
    fn hashes_do_not_depend_on_background_compaction() {
        let (_d, _db, s) = temp_store();
        for i in 0..20 {
            put(&s, &format!("k{}", i % 4), &format!("v{i}"));
        }
        del(&s, "k1", "");
        put(&s, "k9", "x");
        compact(&s, 15).unwrap();
        del(&s, "k2", "");
        let before = (
            s.hash_kv(0).unwrap(),
            s.hash_kv(18).unwrap(),
            s.hash_all().unwrap(),
        );
        s.settle();
        let after = (
            s.hash_kv(0).unwrap(),
            s.hash_kv(18).unwrap(),
            s.hash_all().unwrap(),
        );
        assert_eq!(before, after);
    }
}
