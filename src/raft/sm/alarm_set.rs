//! The cluster's active alarms (etcd's alarm store), part of the replicated state: raised and
//! cleared by `Alarm` log entries, applied by every member in log order.
//!
//! Invariants:
//! - Each active alarm is a meta key `alarm/<type, 8 hex>/<member id, 16 hex>` (empty value)
//!   of the state machine, written in the same batch as the entry that raised it, so alarms
//!   survive restarts and travel in snapshots with every other meta key.
//! - The in-memory set equals those keys: loaded when the state machine opens and after a
//!   snapshot load, and changed by the applier as it walks a batch, so an entry applied after
//!   an alarm entry of the same batch is judged with that alarm active (as etcd's applier is
//!   swapped by the alarm's apply).
//! - While NOSPACE is active, puts, txns with a put in either branch, and lease grants are
//!   refused at apply time (etcd's `applierV3Capped`); while CORRUPT is active, every write
//!   (put, delete, txn, compaction, lease grant and revoke) is (etcd's `applierV3Corrupt`).
//!   Both are decided from the log alone, so every member refuses the same entries.

use std::collections::BTreeSet;
use std::sync::RwLock;

use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::{request_op, AlarmMember, AlarmRequest, AlarmResponse, AlarmType};
use crate::proto::kvdpb::{internal_request, ErrorCode, InternalRequest};
use crate::sync::RwLockExt;

/// Meta key prefix of active alarms.
pub const META_ALARM_PREFIX: &str = "alarm/";

const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";
const CORRUPT: &str = "etcdserver: corrupt cluster";

/// The meta key of alarm `kind` raised for `member`.
pub fn meta_key(kind: i32, member: u64) -> Vec<u8> {
    format!("{META_ALARM_PREFIX}{:08x}/{member:016x}", kind as u32).into_bytes()
}

/// Inverse of [`meta_key`].
pub fn parse_meta_key(k: &[u8]) -> Option<(i32, u64)> {
    let s = std::str::from_utf8(k)
        .ok()?
        .strip_prefix(META_ALARM_PREFIX)?;
    let (kind, member) = s.split_once('/')?;
    Some((
        u32::from_str_radix(kind, 16).ok()? as i32,
        u64::from_str_radix(member, 16).ok()?,
    ))
}

/// etcd's name of an alarm type (`AlarmType.String()`: the number for a type it lacks).
pub fn type_name(kind: i32) -> String {
    match AlarmType::try_from(kind) {
        Ok(t) => t.as_str_name().to_string(),
        Err(_) => kind.to_string(),
    }
}

/// An alarm as etcd prints it (gogo-protobuf's compact text of `AlarmMember`, which
/// `etcdctl alarm list` and Status's `errors` show): zero fields left out, a space after each.
pub fn alarm_text(a: &AlarmMember) -> String {
    let mut s = String::new();
    if a.member_id != 0 {
        s.push_str(&format!("memberID:{} ", a.member_id));
    }
    if a.alarm != 0 {
        s.push_str(&format!("alarm:{} ", type_name(a.alarm)));
    }
    s
}

/// The active alarms as (type, member id).
#[derive(Default)]
pub struct AlarmSet {
    set: RwLock<BTreeSet<(i32, u64)>>,
}

/// A meta write: the key and its value, `None` to delete.
pub type MetaWrite = (Vec<u8>, Option<Vec<u8>>);

impl AlarmSet {
    /// Replaces the set with the alarms stored under `entries` (meta keys and values).
    pub fn load(&self, entries: &[(Vec<u8>, Vec<u8>)]) {
        let set = entries
            .iter()
            .filter_map(|(k, _)| parse_meta_key(k))
            .collect();
        *self.set.write_or_recover() = set;
    }

    /// Every active alarm of type `kind` (0, `NONE`: all), ordered by type then member id.
    pub fn get(&self, kind: i32) -> Vec<AlarmMember> {
        let set = self.set.read_or_recover();
        set.iter()
            .filter(|(t, _)| kind == AlarmType::None as i32 || *t == kind)
            .map(|&(alarm, member_id)| AlarmMember { member_id, alarm })
            .collect()
    }

    pub fn is_active(&self, kind: AlarmType) -> bool {
        let set = self.set.read_or_recover();
        set.iter().any(|(t, _)| *t == kind as i32)
    }

    /// Applies an alarm entry: the response etcd's applier gives, and the meta write (if the
    /// set changed). GET and unknown actions change nothing (the proposer refuses them; an
    /// entry written by other rules is answered with no alarms rather than stop the member).
    pub fn apply(&self, ar: &AlarmRequest) -> (AlarmResponse, Option<MetaWrite>) {
        let key = (ar.alarm, ar.member_id);
        let member = AlarmMember {
            member_id: ar.member_id,
            alarm: ar.alarm,
        };
        let mut set = self.set.write_or_recover();
        let mut resp = AlarmResponse::default();
        let write = match AlarmAction::try_from(ar.action) {
            Ok(AlarmAction::Activate) => {
                resp.alarms.push(member);
                let first = !set.iter().any(|(t, _)| *t == ar.alarm);
                if !set.insert(key) {
                    return (resp, None);
                }
                if first {
                    tracing::warn!(
                        "alarm {} raised by peer {:x}",
                        type_name(ar.alarm),
                        ar.member_id
                    );
                }
                Some((meta_key(ar.alarm, ar.member_id), Some(Vec::new())))
            }
            Ok(AlarmAction::Deactivate) => {
                if !set.remove(&key) {
                    return (resp, None);
                }
                resp.alarms.push(member);
                if !set.iter().any(|(t, _)| *t == ar.alarm) {
                    tracing::warn!(
                        "alarm disarmed action:DEACTIVATE memberID:{} alarm:{}",
                        ar.member_id,
                        type_name(ar.alarm)
                    );
                }
                Some((meta_key(ar.alarm, ar.member_id), None))
            }
            Ok(AlarmAction::Get) | Err(_) => None,
        };
        (resp, write)
    }

    /// The refusal an active alarm gives `req` at apply time, if any (see the module docs).
    pub fn refusal(&self, req: &InternalRequest) -> Option<(ErrorCode, &'static str)> {
        use internal_request::Request as R;
        let req = req.request.as_ref()?;
        let set = self.set.read_or_recover();
        let active = |k: AlarmType| set.iter().any(|(t, _)| *t == k as i32);
        if active(AlarmType::Corrupt)
            && matches!(
                req,
                R::Put(_)
                    | R::DeleteRange(_)
                    | R::Txn(_)
                    | R::Compaction(_)
                    | R::LeaseGrant(_)
                    | R::LeaseRevoke(_)
                    | R::LeaseRevokeMany(_)
            )
        {
            return Some((ErrorCode::Corrupt, CORRUPT));
        }
        if active(AlarmType::Nospace) {
            let capped = match req {
                R::Put(_) | R::LeaseGrant(_) => true,
                R::Txn(t) => t
                    .success
                    .iter()
                    .chain(&t.failure)
                    .any(|op| matches!(op.request, Some(request_op::Request::RequestPut(_)))),
                _ => false,
            };
            if capped {
                return Some((ErrorCode::NoSpace, NO_SPACE));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::{PutRequest, RequestOp, TxnRequest};

    fn req(r: internal_request::Request) -> InternalRequest {
        InternalRequest {
            request: Some(r),
            ..Default::default()
        }
    }

    fn alarm(action: AlarmAction, alarm: AlarmType, member_id: u64) -> AlarmRequest {
        AlarmRequest {
            action: action as i32,
            member_id,
            alarm: alarm as i32,
        }
    }

    #[test]
    fn alarms_print_as_etcd() {
        let a = |member_id, alarm| alarm_text(&AlarmMember { member_id, alarm });
        assert_eq!(
            a(7383792418829112008, 1),
            "memberID:7383792418829112008 alarm:NOSPACE "
        );
        assert_eq!(a(5, 7), "memberID:5 alarm:7 ");
        assert_eq!(a(0, 2), "alarm:CORRUPT ");
    }

    #[test]
    fn meta_keys_round_trip() {
        for (t, m) in [(1, 0), (2, u64::MAX), (7, 0x667880157b8812c8)] {
            assert_eq!(parse_meta_key(&meta_key(t, m)), Some((t, m)));
        }
        assert_eq!(parse_meta_key(b"member/0000000000000001"), None);
    }

    #[test]
    fn activate_deactivate_as_etcd() {
        let s = AlarmSet::default();
        let (r, w) = s.apply(&alarm(AlarmAction::Activate, AlarmType::Nospace, 5));
        assert_eq!(r.alarms.len(), 1);
        assert!(w.is_some_and(|(_, v)| v.is_some()));
        // Again: answered with the alarm, nothing written.
        let (r, w) = s.apply(&alarm(AlarmAction::Activate, AlarmType::Nospace, 5));
        assert_eq!((r.alarms.len(), w), (1, None));
        s.apply(&alarm(AlarmAction::Activate, AlarmType::Corrupt, 3));
        assert_eq!(s.get(0).len(), 2);
        assert_eq!(s.get(AlarmType::Corrupt as i32)[0].member_id, 3);
        // Deactivating what is not active answers no alarms.
        let (r, w) = s.apply(&alarm(AlarmAction::Deactivate, AlarmType::Nospace, 6));
        assert_eq!((r.alarms.len(), w), (0, None));
        let (r, w) = s.apply(&alarm(AlarmAction::Deactivate, AlarmType::Nospace, 5));
        assert_eq!(r.alarms.len(), 1);
        assert!(w.is_some_and(|(_, v)| v.is_none()));
        assert!(!s.is_active(AlarmType::Nospace));
        assert!(s.is_active(AlarmType::Corrupt));
    }

    #[test]
    fn refusals_follow_etcds_appliers() {
        use internal_request::Request as R;
        let s = AlarmSet::default();
        let put = req(R::Put(PutRequest::default()));
        let txn_put = req(R::Txn(TxnRequest {
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest::default())),
            }],
            ..Default::default()
        }));
        let txn_read = req(R::Txn(TxnRequest::default()));
        assert_eq!(s.refusal(&put), None);
        s.apply(&alarm(AlarmAction::Activate, AlarmType::Nospace, 1));
        assert_eq!(s.refusal(&put).map(|r| r.0), Some(ErrorCode::NoSpace));
        assert_eq!(s.refusal(&txn_put).map(|r| r.0), Some(ErrorCode::NoSpace));
        assert_eq!(s.refusal(&txn_read), None);
        s.apply(&alarm(AlarmAction::Activate, AlarmType::Corrupt, 0));
        assert_eq!(s.refusal(&txn_read).map(|r| r.0), Some(ErrorCode::Corrupt));
        assert_eq!(s.refusal(&put).map(|r| r.0), Some(ErrorCode::Corrupt));
    }
}
