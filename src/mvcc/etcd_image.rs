//! A store image in etcd's storage form and back: what a backup writes into etcd's buckets
//! `key` and `lease`, and what a restore reads from them (encodings in [`super::etcd_format`]).
//!
//! # Invariants
//! - [`Image::etcd_history`] yields etcd history keys in ascending order (etcd's key order is
//!   revision order, as kvd's is), so a bbolt writer can take them as they come.
//! - [`entries_from_etcd`] accepts only a history that loads into a consistent store: keys
//!   strictly ascending, every record well formed, every put's `mod_revision` equal to its
//!   revision, and every lease named by a live key present. Its current revision is etcd's:
//!   the newest history revision, or the compacted revision if that is newer, and at least 1.

use std::collections::{BTreeMap, BTreeSet};

use super::error::MvccError;
use super::etcd_format::{history_from_etcd, history_to_etcd, lease_from_etcd, lease_to_etcd};
use super::index::{decode_i64, Record, Revision};
use super::{Image, LEASE_TREE, META_COMPACTED, META_CURRENT, META_TREE, REV_TREE};

/// A bucket's entries as (key, value).
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Entries in the form [`super::MvccStore::load`] takes: (tree, key, value).
pub type TreeEntries = Vec<(String, Vec<u8>, Vec<u8>)>;

impl Image {
    /// The store revision the image was taken at.
    pub fn revision(&self) -> i64 {
        self.upto.main
    }

    /// The compacted revision at the image, or [`super::NEVER_COMPACTED`].
    pub fn compacted(&self) -> Result<i64, MvccError> {
        match self.meta(META_COMPACTED) {
            Some(v) => decode_i64(v),
            None => Ok(super::NEVER_COMPACTED),
        }
    }

    /// A value of the meta tree at the image (the caller's metadata included).
    pub fn meta(&self, key: &[u8]) -> Option<&[u8]> {
        self.small
            .iter()
            .find(|(tree, k, _)| tree == META_TREE && k == key)
            .map(|(_, _, v)| &v[..])
    }

    /// Every lease as etcd's bucket `lease` holds it, by id.
    pub fn etcd_leases(&self) -> Result<Pairs, MvccError> {
        self.small
            .iter()
            .filter(|(tree, _, _)| tree == LEASE_TREE)
            .map(|(_, k, v)| Ok(lease_to_etcd(decode_i64(k)?, decode_i64(v)?)))
            .collect()
    }

    /// The history up to the image's revision as etcd's bucket `key` holds it, read from the
    /// engine as it is iterated (the image's hold on compaction ends when it is dropped). It
    /// may include records below the compacted revision that the background compaction has
    /// not deleted yet (see the module doc of `garbage`); a reader compacts again.
    pub fn etcd_history(self) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), MvccError>> {
        self.entries().filter_map(|item| match item {
            Ok((tree, k, v)) if tree == REV_TREE => Some(history_to_etcd(&k, &v)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
    }
}

/// Builds the entries [`super::MvccStore::load`] takes from etcd's buckets: `history` as
/// bucket `key` holds it, `leases` as bucket `lease` holds it, and etcd's compacted revision
/// (its `scheduledCompactRev`/`finishedCompactRev`, whichever is newer; none if never
/// compacted). Returns the entries and the store's current revision.
pub fn entries_from_etcd(
    history: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    leases: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    compacted: Option<i64>,
) -> Result<(TreeEntries, i64), MvccError> {
    let bad = MvccError::Storage;
    let mut out = Vec::new();
    let mut last: Option<Revision> = None;
    // Each key's state at the newest revision: its lease if live, None if deleted.
    let mut live: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    for (k, v) in history {
        let (k, v) = history_from_etcd(&k, &v)?;
        let rev = Revision::from_bytes(&k)?;
        if last.is_some_and(|l| l >= rev) {
            return Err(bad(format!(
                "history out of order at revision {}_{}",
                rev.main, rev.sub
            )));
        }
        last = Some(rev);
        let record = Record::decode(&v)?;
        if record.tombstone {
            live.remove(&record.kv.key);
        } else {
            live.insert(record.kv.key.clone(), record.kv.lease);
        }
        out.push((REV_TREE.to_string(), k, v));
    }
    let mut lease_ids = BTreeSet::new();
    for (k, v) in leases {
        let (id, ttl) = lease_from_etcd(&k, &v)?;
        lease_ids.insert(id);
        out.push((
            LEASE_TREE.to_string(),
            id.to_be_bytes().to_vec(),
            ttl.to_be_bytes().to_vec(),
        ));
    }
    if let Some((key, lease)) = live
        .iter()
        .find(|(_, l)| **l != 0 && !lease_ids.contains(l))
    {
        return Err(bad(format!(
            "key {:?} is attached to lease {lease:x}, which the snapshot does not hold",
            String::from_utf8_lossy(key)
        )));
    }
    let newest = last.map_or(1, |r| r.main);
    let current = newest.max(compacted.unwrap_or(1)).max(1);
    out.push((
        META_TREE.to_string(),
        META_CURRENT.to_vec(),
        current.to_be_bytes().to_vec(),
    ));
    if let Some(c) = compacted {
        out.push((
            META_TREE.to_string(),
            META_COMPACTED.to_vec(),
            c.to_be_bytes().to_vec(),
        ));
    }
    Ok((out, current))
}
