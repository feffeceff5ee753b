//! Key-range permissions (etcd's range_perm_cache): a user's READ and WRITE grants as unions
//! of key intervals, and whether a request's range is covered.
//!
//! Invariants:
//! - An interval is `[start, end)` with `end == None` for "to the end of the key space"
//!   (etcd's from-key `range_end` of `\0`); a single key `k` is `[k, k\0)`.
//! - A request is permitted when the union of the user's intervals of that type covers the
//!   request's whole interval (etcd's `IntervalTree.Contains`), not when one grant does.

use crate::proto::authpb::{permission::Type as PermType, Permission, Role};

/// `[start, end)`; `end == None` is unbounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    pub start: Vec<u8>,
    pub end: Option<Vec<u8>>,
}

impl Interval {
    /// The interval of a request or grant (`key`, `range_end`) as etcd reads them: an empty
    /// `range_end` is the single key, `\0` everything from `key` on.
    pub fn of(key: &[u8], range_end: &[u8]) -> Interval {
        let end = match range_end {
            [] => {
                let mut k = key.to_vec();
                k.push(0);
                Some(k)
            }
            [0] => None,
            e => Some(e.to_vec()),
        };
        Interval {
            start: key.to_vec(),
            end,
        }
    }

    fn is_empty(&self) -> bool {
        self.end.as_ref().is_some_and(|e| *e <= self.start)
    }
}

/// One permission type's grants, merged into sorted disjoint intervals.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IntervalSet(Vec<Interval>);

impl IntervalSet {
    pub fn new(mut ivs: Vec<Interval>) -> IntervalSet {
        ivs.retain(|i| !i.is_empty());
        ivs.sort_by(|a, b| a.start.cmp(&b.start));
        let mut merged: Vec<Interval> = Vec::with_capacity(ivs.len());
        for iv in ivs {
            if let Some(last) = merged.last_mut() {
                let touches = match &last.end {
                    None => true,
                    Some(e) => iv.start <= *e,
                };
                if touches {
                    last.end = match (&last.end, iv.end) {
                        (None, _) | (_, None) => None,
                        (Some(a), Some(b)) => Some(if *a >= b { a.clone() } else { b }),
                    };
                    continue;
                }
            }
            merged.push(iv);
        }
        IntervalSet(merged)
    }

    /// Whether the union covers all of `req`.
    pub fn covers(&self, req: &Interval) -> bool {
        if req.is_empty() {
            // etcd checks an empty range against its start key alone.
            return self.covers(&Interval::of(&req.start, &[]));
        }
        // Disjoint and not touching: one interval must hold the whole request.
        self.0.iter().any(|iv| {
            iv.start <= req.start
                && match (&iv.end, &req.end) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(a), Some(b)) => a >= b,
                }
        })
    }
}

/// A user's merged grants (etcd's unifiedRangePermissions).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UserPerms {
    pub read: IntervalSet,
    pub write: IntervalSet,
}

impl UserPerms {
    pub fn of_roles<'a>(roles: impl Iterator<Item = &'a Role>) -> UserPerms {
        let (mut read, mut write) = (Vec::new(), Vec::new());
        for p in roles.flat_map(|r| &r.key_permission) {
            let iv = Interval::of(&p.key, &p.range_end);
            match PermType::try_from(p.perm_type) {
                Ok(PermType::Read) => read.push(iv),
                Ok(PermType::Write) => write.push(iv),
                Ok(PermType::Readwrite) => {
                    read.push(iv.clone());
                    write.push(iv);
                }
                Err(_) => {}
            }
        }
        UserPerms {
            read: IntervalSet::new(read),
            write: IntervalSet::new(write),
        }
    }

    pub fn permits(&self, key: &[u8], range_end: &[u8], write: bool) -> bool {
        let set = if write { &self.write } else { &self.read };
        set.covers(&Interval::of(key, range_end))
    }
}

/// Whether two permissions name the same key range (etcd replaces the type of such a grant).
pub fn same_range(a: &Permission, key: &[u8], range_end: &[u8]) -> bool {
    a.key == key && a.range_end == range_end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(perms: &[(PermType, &[u8], &[u8])]) -> Role {
        Role {
            name: b"r".to_vec(),
            key_permission: perms
                .iter()
                .map(|(t, k, e)| Permission {
                    perm_type: *t as i32,
                    key: k.to_vec(),
                    range_end: e.to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn prefix_read_only() {
        let r = role(&[(PermType::Read, b"foo/", b"foo0")]);
        let p = UserPerms::of_roles([&r].into_iter());
        assert!(p.permits(b"foo/a", b"", false));
        assert!(p.permits(b"foo/", b"foo0", false));
        assert!(p.permits(b"foo/a", b"foo/b", false));
        assert!(!p.permits(b"foo/a", b"", true));
        assert!(!p.permits(b"fop", b"", false));
        assert!(!p.permits(b"foo/", b"\0", false));
        assert!(!p.permits(b"a", b"foo/b", false));
    }

    #[test]
    fn union_of_adjacent_grants_covers() {
        let r1 = role(&[(PermType::Readwrite, b"a", b"c")]);
        let r2 = role(&[(PermType::Write, b"c", b"e"), (PermType::Read, b"x", b"")]);
        let p = UserPerms::of_roles([&r1, &r2].into_iter());
        assert!(p.permits(b"b", b"d", true));
        assert!(!p.permits(b"b", b"d", false));
        assert!(p.permits(b"x", b"", false));
        assert!(!p.permits(b"x", b"y", false));
        assert!(!p.permits(b"x\0", b"", false));
    }

    #[test]
    fn from_key_grants() {
        let r = role(&[(PermType::Readwrite, b"k", b"\0")]);
        let p = UserPerms::of_roles([&r].into_iter());
        assert!(p.permits(b"k", b"\0", false));
        assert!(p.permits(b"zzz", b"", true));
        assert!(!p.permits(b"j", b"\0", true));
        let all = role(&[(PermType::Read, b"\0", b"\0")]);
        let p = UserPerms::of_roles([&all].into_iter());
        assert!(p.permits(b"\0", b"\0", false));
        assert!(p.permits(b"anything", b"", false));
    }
}
