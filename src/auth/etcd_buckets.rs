//! The auth store in etcd's backup schema and back: what a backup writes into etcd's buckets
//! `auth`, `authUsers` and `authRoles`, and what a restore reads from them (etcd 3.4's
//! auth/store.go).
//!
//! # Invariants
//! - The encodings are etcd's and kvd's alike: `authEnabled` is one byte (1 on, 0 off),
//!   `authRevision` a big-endian u64, users and roles prost-encoded `authpb` messages under
//!   their names. So a round trip through etcd's schema changes no byte of the auth state.
//! - [`from_etcd`] refuses what would not load into a consistent store (a record that does
//!   not decode, or whose name differs from its key) before anything is written; keys of the
//!   `auth` bucket other than those two are ignored, as etcd ignores them.
//! - [`to_etcd`] writes `authRevision` even when kvd never changed the auth state (revision 1,
//!   what a fresh etcd database holds), and each bucket's keys in ascending order.

use std::collections::BTreeMap;

use prost::Message;

use super::store::{META_ENABLED, META_REVISION, META_ROLE, META_USER};
use crate::proto::authpb::{Role, User};

/// etcd's bucket of the enabled flag and the auth revision.
pub const AUTH_BUCKET: &[u8] = b"auth";
/// etcd's bucket of roles, by name.
pub const AUTH_ROLES_BUCKET: &[u8] = b"authRoles";
/// etcd's bucket of users, by name.
pub const AUTH_USERS_BUCKET: &[u8] = b"authUsers";

const ENABLED_KEY: &[u8] = b"authEnabled";
const REVISION_KEY: &[u8] = b"authRevision";

/// A bucket's pairs, keys ascending.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The auth state as etcd's three buckets hold it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    pub auth: Pairs,
    pub roles: Pairs,
    pub users: Pairs,
}

impl EtcdAuth {
    /// Each bucket's name and pairs, in the ascending name order bbolt keeps buckets in.
    pub fn buckets(&self) -> [(&'static [u8], &Pairs); 3] {
        [
            (AUTH_BUCKET, &self.auth),
            (AUTH_ROLES_BUCKET, &self.roles),
            (AUTH_USERS_BUCKET, &self.users),
        ]
    }

    /// [`Self::buckets`], to fill them.
    pub fn buckets_mut(&mut self) -> [(&'static [u8], &mut Pairs); 3] {
        [
            (AUTH_BUCKET, &mut self.auth),
            (AUTH_ROLES_BUCKET, &mut self.roles),
            (AUTH_USERS_BUCKET, &mut self.users),
        ]
    }
}

/// Why a backup's auth buckets cannot be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bucket {bucket:?}, key {key:?}: {reason}")]
pub struct BadAuthRecord {
    pub bucket: &'static str,
    pub key: String,
    pub reason: &'static str,
}

/// etcd's buckets from the auth meta entries (`auth/...` keys and their values).
pub fn to_etcd<'a>(meta: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> EtcdAuth {
    let mut auth = BTreeMap::new();
    let mut roles = BTreeMap::new();
    let mut users = BTreeMap::new();
    auth.insert(REVISION_KEY.to_vec(), 1u64.to_be_bytes().to_vec());
    for (k, v) in meta {
        let v = v.to_vec();
        if k == META_ENABLED.as_bytes() {
            auth.insert(ENABLED_KEY.to_vec(), v);
        } else if k == META_REVISION.as_bytes() {
            auth.insert(REVISION_KEY.to_vec(), v);
        } else if let Some(name) = k.strip_prefix(META_USER.as_bytes()) {
            users.insert(name.to_vec(), v);
        } else if let Some(name) = k.strip_prefix(META_ROLE.as_bytes()) {
            roles.insert(name.to_vec(), v);
        }
    }
    EtcdAuth {
        auth: auth.into_iter().collect(),
        roles: roles.into_iter().collect(),
        users: users.into_iter().collect(),
    }
}

/// The auth meta entries (key, value) from etcd's buckets, checked (see the module doc).
pub fn from_etcd(b: &EtcdAuth) -> Result<Pairs, BadAuthRecord> {
    let mut out = Vec::new();
    for (k, v) in &b.auth {
        if k == ENABLED_KEY {
            if !matches!(v.as_slice(), [0] | [1]) {
                return Err(bad("auth", k, "not one byte 0 or 1"));
            }
            out.push((META_ENABLED.as_bytes().to_vec(), v.clone()));
        } else if k == REVISION_KEY {
            if v.len() != 8 {
                return Err(bad("auth", k, "not an 8-byte revision"));
            }
            out.push((META_REVISION.as_bytes().to_vec(), v.clone()));
        }
    }
    named::<User>(&b.users, "authUsers", META_USER, |u| &u.name, &mut out)?;
    named::<Role>(&b.roles, "authRoles", META_ROLE, |r| &r.name, &mut out)?;
    Ok(out)
}

/// Checks the records of a bucket of named messages (users, roles): each must decode as `M`
/// and carry its key as its name. Appends them to `out` under `prefix`.
fn named<M: Message + Default>(
    records: &Pairs,
    bucket: &'static str,
    prefix: &str,
    name: impl Fn(&M) -> &[u8],
    out: &mut Pairs,
) -> Result<(), BadAuthRecord> {
    for (k, v) in records {
        let m = M::decode(v.as_slice()).map_err(|_| bad(bucket, k, "does not decode"))?;
        if name(&m) != k.as_slice() {
            return Err(bad(bucket, k, "its name is not its key"));
        }
        out.push(([prefix.as_bytes(), k].concat(), v.clone()));
    }
    Ok(())
}

fn bad(bucket: &'static str, key: &[u8], reason: &'static str) -> BadAuthRecord {
    BadAuthRecord {
        bucket,
        key: String::from_utf8_lossy(key).into_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::authpb::Permission;

    fn user(name: &str, roles: &[&str]) -> Vec<u8> {
        User {
            name: name.into(),
            password: b"$2a$10$hash".to_vec(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            options: None,
        }
        .encode_to_vec()
    }

    fn role(name: &str) -> Vec<u8> {
        Role {
            name: name.into(),
            key_permission: vec![Permission {
                perm_type: 2,
                key: b"a".to_vec(),
                range_end: b"b".to_vec(),
            }],
        }
        .encode_to_vec()
    }

    fn meta() -> Pairs {
        vec![
            (b"auth/enabled".to_vec(), vec![1]),
            (b"auth/revision".to_vec(), 7u64.to_be_bytes().to_vec()),
            (b"auth/role/reader".to_vec(), role("reader")),
            (b"auth/role/root".to_vec(), role("root")),
            (b"auth/user/alice".to_vec(), user("alice", &["reader"])),
            (b"auth/user/root".to_vec(), user("root", &["root"])),
        ]
    }

    #[test]
    fn a_round_trip_keeps_every_byte() {
        let m = meta();
        let b = to_etcd(m.iter().map(|(k, v)| (&k[..], &v[..])));
        assert_eq!(
            b.auth,
            vec![
                (b"authEnabled".to_vec(), vec![1]),
                (b"authRevision".to_vec(), 7u64.to_be_bytes().to_vec()),
            ]
        );
        assert_eq!(b.users[0].0, b"alice");
        assert_eq!(b.roles[1].0, b"root");
        let mut back = from_etcd(&b).unwrap();
        back.sort();
        assert_eq!(back, m);
    }

    #[test]
    fn a_store_that_never_changed_auth_writes_revision_1() {
        let b = to_etcd(std::iter::empty());
        assert_eq!(
            b.auth,
            vec![(b"authRevision".to_vec(), 1u64.to_be_bytes().to_vec())]
        );
        assert!(b.users.is_empty() && b.roles.is_empty());
    }

    #[test]
    fn bad_records_are_refused() {
        let good = to_etcd(meta().iter().map(|(k, v)| (&k[..], &v[..])));
        let mut b = good.clone();
        b.users[0].0 = b"bob".to_vec();
        let e = from_etcd(&b).unwrap_err();
        assert_eq!(
            (e.bucket, e.reason),
            ("authUsers", "its name is not its key")
        );
        let mut b = good.clone();
        b.roles[0].1 = vec![0xff, 0xff];
        let e = from_etcd(&b).unwrap_err();
        assert_eq!((e.bucket, e.reason), ("authRoles", "does not decode"));
        let mut b = good.clone();
        b.auth[0].1 = vec![2];
        assert_eq!(from_etcd(&b).unwrap_err().bucket, "auth");
        let mut b = good;
        b.auth[1].1 = vec![0; 4];
        assert_eq!(from_etcd(&b).unwrap_err().reason, "not an 8-byte revision");
    }

    #[test]
    fn unknown_auth_keys_are_ignored() {
        let b = EtcdAuth {
            auth: vec![(b"somethingNew".to_vec(), vec![9])],
            ..Default::default()
        };
        assert_eq!(from_etcd(&b).unwrap(), vec![]);
    }
}
