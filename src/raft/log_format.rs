//! Log formats: which replicated entries a member can apply.
//!
//! Every kind of log entry belongs to the format that introduced it. A member publishes the
//! newest format it applies (in its probe answers); the cluster's format is the oldest any
//! member applies, and a leader proposes only entries of the cluster's format or older (see
//! docs/operations.md, "Upgrading").
//!
//! # Invariants
//! - Formats only grow: a kind of entry never changes its format, and a new kind (or a new
//!   field that changes how an entry applies) gets a new format.
//! - Format 1 is what the builds before auth applied (release 0.0.0): put, delete-range, txn,
//!   compaction, publish, lease grant and lease revoke. Format 2 adds what release 0.1.0
//!   applies: paced lease revokes, alarms and auth changes. Neither publishes a format; a peer
//!   that publishes none is told apart by the peer RPCs it serves (`cluster_format`).
//! - Format 3 (this build) adds the cluster format's own entry and honours `log_format`
//!   marks: it stops before an entry marked newer than it, where older builds skipped
//!   entries they could not decode.

/// The newest log format this build applies.
pub const LOG_FORMAT: u32 = 3;

/// The format of release 0.1.0 (a peer that publishes no format but serves the peer `HashKV`
/// RPC, which arrived with it).
pub const RELEASE_0_1_FORMAT: u32 = 2;

/// The format of members that publish none (every build before versions).
pub const OLDEST_LOG_FORMAT: u32 = 1;

use crate::proto::kvdpb::{internal_request::Request as R, InternalRequest};

/// The log format that introduced the kind of `req` (an unknown kind decodes as none and
/// needs a format this build does not have).
pub fn of_kind(req: &InternalRequest) -> u32 {
    match &req.request {
        Some(
            R::Put(_)
            | R::DeleteRange(_)
            | R::Txn(_)
            | R::Compaction(_)
            | R::Publish(_)
            | R::LeaseGrant(_)
            | R::LeaseRevoke(_),
        ) => 1,
        Some(R::LeaseRevokeMany(_) | R::Alarm(_) | R::Auth(_)) => 2,
        Some(R::ClusterFormat(_)) => 3,
        None => LOG_FORMAT + 1,
    }
}

/// The format a member needs to apply `req`: its kind's, or the one its proposer marked.
pub fn needed(req: &InternalRequest) -> u32 {
    of_kind(req).max(req.log_format)
}

/// Marks `req` with the format it needs, so that a member of an older format that meets it
/// stops there (builds before versions ignore the mark; the cluster format keeps such
/// entries from them).
pub fn mark(req: &mut InternalRequest) {
    let f = match &req.request {
        Some(R::ClusterFormat(c)) => c.format.max(of_kind(req)),
        _ => of_kind(req),
    };
    if f > OLDEST_LOG_FORMAT {
        req.log_format = req.log_format.max(f);
    }
}

/// The cluster format that follows from the members' formats (`None` for a member whose
/// format is not known yet): the oldest, once every member's is known.
pub fn cluster(members: impl IntoIterator<Item = Option<u32>>) -> Option<u32> {
    members.into_iter().try_fold(LOG_FORMAT, |min, f| {
        f.map(|f| min.min(f.max(OLDEST_LOG_FORMAT)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::PutRequest;
    use crate::proto::kvdpb::{ClusterFormat, LeaseRevokeManyRequest};

    #[test]
    fn kinds_marks_and_the_cluster_minimum() {
        let mut put = InternalRequest {
            request: Some(R::Put(PutRequest::default())),
            ..Default::default()
        };
        mark(&mut put);
        assert_eq!((put.log_format, needed(&put)), (0, 1));
        let mut many = InternalRequest {
            request: Some(R::LeaseRevokeMany(LeaseRevokeManyRequest { ids: vec![1] })),
            ..Default::default()
        };
        mark(&mut many);
        assert_eq!((many.log_format, needed(&many)), (2, 2));
        let mut cf2 = InternalRequest {
            request: Some(R::ClusterFormat(ClusterFormat { format: 2 })),
            ..Default::default()
        };
        mark(&mut cf2);
        assert_eq!(needed(&cf2), 3, "the raise itself is this build's");
        let mut cf = InternalRequest {
            request: Some(R::ClusterFormat(ClusterFormat { format: 7 })),
            ..Default::default()
        };
        mark(&mut cf);
        assert_eq!(
            needed(&cf),
            7,
            "a member below the new cluster format stops at it"
        );
        assert_eq!(needed(&InternalRequest::default()), LOG_FORMAT + 1);
        assert_eq!(cluster([Some(3), Some(0), Some(2)]), Some(1));
        assert_eq!(cluster([Some(3), Some(2)]), Some(2));
        assert_eq!(cluster([Some(2), None]), None);
        assert_eq!(cluster([Some(9)]), Some(LOG_FORMAT));
    }
}
