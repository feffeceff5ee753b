//! A store image in etcd's storage form and back: what a backup writes into etcd's buckets
//! `key` and `lease`, and what a restore reads from them (encodings in [`crate::mvcc::etcd::format`]).
//!
//! # Invariants
//! - [`Image::etcd_history`] yields etcd history keys in ascending order (etcd's key order is
//!   revision order, as kvd's is), so a bbolt writer can take them as they come.
//! - [`entries_from_etcd`] accepts only a history that loads into a consistent store: keys
//!   strictly ascending, every record well formed, every put's `mod_revision` equal to its
//!   revision, and every lease named by a live key present. Its current revision is etcd's:
//!   the newest history revision, or the compacted revision if that is newer, and at least 1.

use std::collections::{BTreeMap, BTreeSet};

use crate::mvcc::error::MvccError;
use crate::mvcc::etcd::format::{
    history_from_etcd, history_to_etcd, lease_from_etcd, lease_to_etcd,
};
use crate::mvcc::index::{decode_i64, Record, Revision};
use crate::mvcc::{Image, LEASE_TREE, META_COMPACTED, META_CURRENT, META_TREE, REV_TREE};

/// A bucket's entries as (key, value).
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Entries in the form [`crate::mvcc::MvccStore::load`] takes: (tree, key, value).
pub type TreeEntries = Vec<(String, Vec<u8>, Vec<u8>)>;

impl Image {
    /// The store revision the image was taken at.
    pub fn revision(&self) -> i64 {
        self.upto.main
    }

    /// The compacted revision at the image, or [`crate::mvcc::NEVER_COMPACTED`].
    pub fn compacted(&self) -> Result<i64, MvccError> {
        match self.meta(META_COMPACTED) {
            Some(v) => decode_i64(v),
            None => Ok(crate::mvcc::NEVER_COMPACTED),
        }
    }

    /// A value of the meta tree at the image (the caller's metadata included).
    pub fn meta(&self, key: &[u8]) -> Option<&[u8]> {
        self.small
            .iter()
            .find(|(tree, k, _)| *tree == META_TREE && k == key)
            .map(|(_, _, v)| &v[..])
    }

    /// The meta tree's entries at the image whose keys start with `prefix`, in key order.
    pub fn meta_prefixed<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        self.small
            .iter()
            .filter(move |(tree, k, _)| *tree == META_TREE && k.starts_with(prefix))
            .map(|(_, k, v)| (&k[..], &v[..]))
    }

    /// Every lease as etcd's bucket `lease` holds it, by id.
    pub fn etcd_leases(&self) -> Result<Pairs, MvccError> {
        self.small
            .iter()
            .filter(|(tree, _, _)| *tree == LEASE_TREE)
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

/// Builds the entries [`crate::mvcc::MvccStore::load`] takes from etcd's buckets, all in memory
/// (see [`EtcdEntries`], which streams them): returns them and the store's current revision.
pub fn entries_from_etcd(
    history: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    leases: Pairs,
    compacted: Option<i64>,
) -> Result<(TreeEntries, i64), MvccError> {
    let mut it = EtcdEntries::new(history.into_iter().map(Ok), leases, compacted);
    let entries = it.by_ref().collect::<Result<TreeEntries, MvccError>>()?;
    Ok((entries, it.current()))
}

/// One entry in the form [`crate::mvcc::MvccStore::load`] takes: (tree, key, value).
pub type TreeEntry = (String, Vec<u8>, Vec<u8>);

/// The entries [`crate::mvcc::MvccStore::load`] takes, streamed from etcd's buckets as they are
/// read: `history` as bucket `key` holds it (in key order), `leases` as bucket `lease` holds
/// it, and etcd's compacted revision (its `scheduledCompactRev`/`finishedCompactRev`,
/// whichever is newer; none if never compacted). Each history record is checked as it
/// passes; the checks that need the whole history (every lease named by a live key is
/// present) run after it, before the meta entries, so a consumer that stops at the first
/// error never sees a complete-looking store that breaks them. Memory: the leases, and the
/// keys that are live with a lease.
pub struct EtcdEntries<H> {
    history: Option<H>,
    leases: Pairs,
    compacted: Option<i64>,
    last: Option<Revision>,
    /// Keys live with a lease at the newest revision so far, and the lease.
    leased: BTreeMap<Vec<u8>, i64>,
    history_len: usize,
    tail: std::vec::IntoIter<TreeEntry>,
    current: i64,
    failed: bool,
}

impl<H, E> EtcdEntries<H>
where
    H: Iterator<Item = Result<(Vec<u8>, Vec<u8>), E>>,
{
    pub fn new(history: H, leases: Pairs, compacted: Option<i64>) -> Self {
        EtcdEntries {
            history: Some(history),
            leases,
            compacted,
            last: None,
            leased: BTreeMap::new(),
            history_len: 0,
            tail: Vec::new().into_iter(),
            current: 1,
            failed: false,
        }
    }

    /// The store's current revision: etcd's, the newest history revision or the compacted
    /// revision if that is newer, at least 1. Meaningful once the iterator is exhausted.
    pub fn current(&self) -> i64 {
        self.current
    }

    /// History records read so far.
    pub fn history_len(&self) -> usize {
        self.history_len
    }

    fn history_entry(&mut self, k: &[u8], v: &[u8]) -> Result<TreeEntry, MvccError> {
        let (k, v) = history_from_etcd(k, v)?;
        let rev = Revision::from_bytes(&k)?;
        if self.last.is_some_and(|l| l >= rev) {
            return Err(MvccError::corrupt(format!(
                "history out of order at revision {}_{}",
                rev.main, rev.sub
            )));
        }
        self.last = Some(rev);
        let record = Record::decode(&v)?;
        if record.tombstone || record.kv.lease == 0 {
            self.leased.remove(&record.kv.key);
        } else {
            self.leased.insert(record.kv.key.clone(), record.kv.lease);
        }
        self.history_len += 1;
        Ok((REV_TREE.to_string(), k, v))
    }

    /// What follows the history: the leases and the meta entries, once the whole-history
    /// checks pass.
    fn tail(&mut self) -> Result<Vec<TreeEntry>, MvccError> {
        let mut out = Vec::new();
        let mut lease_ids = BTreeSet::new();
        for (k, v) in std::mem::take(&mut self.leases) {
            let (id, ttl) = lease_from_etcd(&k, &v)?;
            lease_ids.insert(id);
            out.push((
                LEASE_TREE.to_string(),
                id.to_be_bytes().to_vec(),
                ttl.to_be_bytes().to_vec(),
            ));
        }
        if let Some((key, lease)) = self.leased.iter().find(|(_, l)| !lease_ids.contains(l)) {
            return Err(MvccError::corrupt(format!(
                "key {:?} is attached to lease {lease:x}, which the snapshot does not hold",
                String::from_utf8_lossy(key)
            )));
        }
        let newest = self.last.map_or(1, |r| r.main);
        self.current = newest.max(self.compacted.unwrap_or(1)).max(1);
        out.push((
            META_TREE.to_string(),
            META_CURRENT.to_vec(),
            self.current.to_be_bytes().to_vec(),
        ));
        if let Some(c) = self.compacted {
            out.push((
                META_TREE.to_string(),
                META_COMPACTED.to_vec(),
                c.to_be_bytes().to_vec(),
            ));
        }
        Ok(out)
    }
}

impl<H, E> Iterator for EtcdEntries<H>
where
    H: Iterator<Item = Result<(Vec<u8>, Vec<u8>), E>>,
    E: From<MvccError>,
{
    type Item = Result<TreeEntry, E>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if let Some(history) = self.history.as_mut() {
            match history.next() {
                Some(item) => {
                    let r = item.and_then(|(k, v)| self.history_entry(&k, &v).map_err(E::from));
                    self.failed = r.is_err();
                    return Some(r);
                }
                None => {
                    self.history = None;
                    match self.tail() {
                        Ok(t) => self.tail = t.into_iter(),
                        Err(e) => {
                            self.failed = true;
                            return Some(Err(e.into()));
                        }
                    }
                }
            }
        }
        self.tail.next().map(Ok)
    }
}
