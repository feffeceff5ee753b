//! etcd's storage encoding of the MVCC state (its bbolt buckets `key` and `lease`), and the
//! conversion between it and kvd's own trees.
//!
//! etcd's snapshots and HashKV are defined over these bytes, so a backup that etcd's tools
//! restore, a restore of etcd's backups, and a HashKV equal to etcd's on the same history all
//! go through here.
//!
//! # Encodings
//! - History key: main revision (8 bytes BE) ++ `_` ++ sub revision (8 bytes BE), plus a
//!   trailing `t` for a tombstone (17 or 18 bytes). kvd's history key is the same without the
//!   separator and the mark (the mark is kvd's value's flag byte).
//! - History value: the marshalled `mvccpb.KeyValue`. A tombstone holds only `key` on etcd;
//!   kvd's tombstone also holds `mod_revision`, which is its key's main revision.
//! - Lease key: the id as 8 bytes BE; value: the marshalled `leasepb.Lease{ID, TTL}`.
//! - A compaction mark (`scheduledCompactRev`, `finishedCompactRev` in bucket `meta`): the
//!   history key encoding of `{main: rev, sub: 0}`.
//!
//! # Invariants
//! - `history_from_etcd(history_to_etcd(k, v)) == (k, v)` for every record kvd writes.
//! - prost encodes fields in tag order and omits defaults, as etcd's gogo-protobuf marshal
//!   does, so the value bytes are byte for byte etcd's.

use prost::Message;

use crate::mvcc::error::MvccError;
use crate::mvcc::index::{Record, Revision};
use crate::proto::mvccpb::KeyValue;

/// etcd's bucket names, as its backend and snapshots use them.
pub const KEY_BUCKET: &[u8] = b"key";
pub const LEASE_BUCKET: &[u8] = b"lease";
pub const META_BUCKET: &[u8] = b"meta";

/// etcd's `leasepb.Lease` as stored in bucket `lease`.
#[derive(Clone, PartialEq, Message)]
pub struct LeaseRecord {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(int64, tag = "2")]
    pub ttl: i64,
    #[prost(int64, tag = "3")]
    pub remaining_ttl: i64,
}

fn bad(what: impl Into<String>) -> MvccError {
    MvccError::corrupt(what.into())
}

/// etcd's history key for `rev`.
pub fn rev_key(rev: Revision, tombstone: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(18);
    b.extend_from_slice(&rev.main.to_be_bytes());
    b.push(b'_');
    b.extend_from_slice(&rev.sub.to_be_bytes());
    if tombstone {
        b.push(b't');
    }
    b
}

/// Inverse of [`rev_key`]: the revision and whether the key marks a tombstone.
pub fn parse_rev_key(b: &[u8]) -> Result<(Revision, bool), MvccError> {
    let tombstone = match b.len() {
        17 => false,
        18 if b[17] == b't' => true,
        _ => return Err(bad(format!("bad etcd revision key {b:02x?}"))),
    };
    if b[8] != b'_' {
        return Err(bad(format!("bad etcd revision key {b:02x?}")));
    }
    let main = i64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
    let sub = i64::from_be_bytes(b[9..17].try_into().expect("8 bytes"));
    if main < 0 || sub < 0 {
        return Err(bad(format!("negative etcd revision {main}_{sub}")));
    }
    Ok((Revision { main, sub }, tombstone))
}

/// The bytes etcd stores for a history record.
pub(crate) fn value(record: &Record) -> Vec<u8> {
    if record.tombstone {
        KeyValue {
            key: record.kv.key.clone(),
            ..Default::default()
        }
        .encode_to_vec()
    } else {
        record.kv.encode_to_vec()
    }
}

/// A kvd history entry (key and value as kvd's history tree stores them) in etcd's encoding.
pub fn history_to_etcd(k: &[u8], v: &[u8]) -> Result<(Vec<u8>, Vec<u8>), MvccError> {
    let rev = Revision::from_bytes(k)?;
    let record = Record::decode(v)?;
    Ok((rev_key(rev, record.tombstone), value(&record)))
}

/// An etcd history entry in kvd's encoding. Refuses a record whose key disagrees with its
/// revision (a put's `mod_revision` must be its key's main revision).
pub fn history_from_etcd(k: &[u8], v: &[u8]) -> Result<(Vec<u8>, Vec<u8>), MvccError> {
    let (rev, tombstone) = parse_rev_key(k)?;
    let mut kv = KeyValue::decode(v)?;
    if kv.key.is_empty() {
        return Err(bad(format!(
            "etcd record at {}_{} has no key",
            rev.main, rev.sub
        )));
    }
    if tombstone {
        kv = KeyValue {
            key: kv.key,
            mod_revision: rev.main,
            ..Default::default()
        };
    } else if kv.mod_revision != rev.main {
        return Err(bad(format!(
            "etcd record at {}_{} has mod_revision {}",
            rev.main, rev.sub, kv.mod_revision
        )));
    }
    Ok((rev.to_bytes().to_vec(), Record { kv, tombstone }.encode()))
}

/// etcd's lease entry for lease `id` granted for `ttl` seconds.
pub fn lease_to_etcd(id: i64, ttl: i64) -> (Vec<u8>, Vec<u8>) {
    let v = LeaseRecord {
        id,
        ttl,
        remaining_ttl: 0,
    };
    (id.to_be_bytes().to_vec(), v.encode_to_vec())
}

/// The (id, granted TTL) of an etcd lease entry.
pub fn lease_from_etcd(k: &[u8], v: &[u8]) -> Result<(i64, i64), MvccError> {
    let key: [u8; 8] = k
        .try_into()
        .map_err(|_| bad(format!("bad etcd lease key {k:02x?}")))?;
    let id = i64::from_be_bytes(key);
    let l = LeaseRecord::decode(v)?;
    if l.id != id {
        return Err(bad(format!("etcd lease {id:x} stores id {:x}", l.id)));
    }
    Ok((id, l.ttl))
}

/// etcd's encoding of a compaction mark at revision `rev`.
pub fn compact_mark(rev: i64) -> Vec<u8> {
    rev_key(Revision { main: rev, sub: 0 }, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &[u8], main: i64, create: i64, version: i64, lease: i64) -> Record {
        Record {
            kv: KeyValue {
                key: key.to_vec(),
                create_revision: create,
                mod_revision: main,
                version,
                value: b"v".to_vec(),
                lease,
            },
            tombstone: false,
        }
    }

    #[test]
    fn rev_keys_match_etcd_layout() {
        let k = rev_key(Revision { main: 2, sub: 1 }, false);
        assert_eq!(k, b"\0\0\0\0\0\0\0\x02_\0\0\0\0\0\0\0\x01");
        let t = rev_key(Revision { main: 2, sub: 1 }, true);
        assert_eq!(t.len(), 18);
        assert_eq!(t[17], b't');
        assert_eq!(
            parse_rev_key(&t).unwrap(),
            (Revision { main: 2, sub: 1 }, true)
        );
        assert!(parse_rev_key(&k[..16]).is_err());
        let mut no_sep = k.clone();
        no_sep[8] = b'x';
        assert!(parse_rev_key(&no_sep).is_err());
        let mut neg = k;
        neg[0] = 0x80;
        assert!(parse_rev_key(&neg).is_err());
    }

    #[test]
    fn history_round_trips_and_tombstones_lose_only_their_mod_revision() {
        let p = put(b"a", 5, 3, 2, 7);
        let k = Revision { main: 5, sub: 0 }.to_bytes();
        let (ek, ev) = history_to_etcd(&k, &p.encode()).unwrap();
        assert_eq!(ev, p.kv.encode_to_vec());
        assert_eq!(
            history_from_etcd(&ek, &ev).unwrap(),
            (k.to_vec(), p.encode())
        );

        let tomb = Record {
            kv: KeyValue {
                key: b"a".to_vec(),
                mod_revision: 6,
                ..Default::default()
            },
            tombstone: true,
        };
        let k6 = Revision { main: 6, sub: 0 }.to_bytes();
        let (ek, ev) = history_to_etcd(&k6, &tomb.encode()).unwrap();
        // etcd stores a tombstone as the key alone: field 1, length 1, "a".
        assert_eq!(ev, vec![0x0a, 0x01, b'a']);
        assert_eq!(
            history_from_etcd(&ek, &ev).unwrap(),
            (k6.to_vec(), tomb.encode())
        );
    }

    #[test]
    fn inconsistent_etcd_records_are_refused() {
        let p = put(b"a", 5, 3, 2, 0);
        let wrong = rev_key(Revision { main: 4, sub: 0 }, false);
        assert!(history_from_etcd(&wrong, &p.kv.encode_to_vec()).is_err());
        let k = rev_key(Revision { main: 5, sub: 0 }, false);
        assert!(history_from_etcd(&k, b"\xff\xff").is_err());
        assert!(history_from_etcd(&k, &KeyValue::default().encode_to_vec()).is_err());
    }

    #[test]
    fn leases_round_trip() {
        let (k, v) = lease_to_etcd(0x1234, 60);
        assert_eq!(lease_from_etcd(&k, &v).unwrap(), (0x1234, 60));
        let (_, other) = lease_to_etcd(0x99, 60);
        assert!(lease_from_etcd(&k, &other).is_err());
        assert!(lease_from_etcd(&k[..7], &v).is_err());
    }
}
