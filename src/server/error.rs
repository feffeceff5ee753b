//! The one place where errors become gRPC statuses, with etcd's codes and messages.
//!
//! etcd's clients recognise server errors by their message text (clientv3's rpctypes map the
//! string back to a typed error), so the message must be etcd's, byte for byte.

use tonic::{Code, Status};

use crate::mvcc::MvccError;
use crate::raft::ProposeError;

/// Errors a client request can end with, as etcd names them.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ApiError {
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: server stopped")]
    Stopped,
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    #[error("etcdserver: not leader")]
    NotLeader,
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlsExist,
    #[error("etcdserver: member ID already exist")]
    MemberIdExists,
    #[error("etcdserver: given member URLs are invalid")]
    BadMemberUrls,
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    NotEnoughStartedMembers,
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,
    #[error("etcdserver: can only promote a learner member")]
    NotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    #[error("etcdserver: request timed out, leader transfer took too long")]
    LeaderTransferTimeout,
    #[error("etcdserver: rpc not supported for learner")]
    NotSupportedForLearner,
    /// A status another member (the leader) answered with, passed on unchanged.
    #[error("{1}")]
    Remote(Code, String),
    #[error("{0}")]
    Unimplemented(String),
    /// An error text produced by applying a request (MVCC or membership), kept verbatim.
    #[error("{0}")]
    Applied(String),
    #[error("etcdserver: {0}")]
    Internal(String),
}

impl From<ProposeError> for ApiError {
    fn from(e: ProposeError) -> Self {
        match e {
            ProposeError::NoLeader => ApiError::NoLeader,
            ProposeError::Timeout => ApiError::Timeout,
            ProposeError::Stopped => ApiError::Stopped,
            ProposeError::LeaderChanged => ApiError::LeaderChanged,
            ProposeError::Internal(s) => ApiError::Internal(s),
        }
    }
}

impl From<MvccError> for ApiError {
    fn from(e: MvccError) -> Self {
        ApiError::Applied(e.to_string())
    }
}

/// etcd's gRPC code for an error message (see etcd's api/v3rpc/rpctypes/error.go).
fn code_of(msg: &str) -> Code {
    match msg {
        "etcdserver: key is not provided"
        | "etcdserver: key not found"
        | "etcdserver: value is provided"
        | "etcdserver: lease is provided"
        | "etcdserver: too many operations in txn request"
        | "etcdserver: duplicate key given in txn request"
        | "etcdserver: request is too large" => Code::InvalidArgument,
        "etcdserver: mvcc: required revision has been compacted"
        | "etcdserver: mvcc: required revision is a future revision"
        | "etcdserver: too large lease TTL" => Code::OutOfRange,
        "etcdserver: requested lease not found" | "etcdserver: member not found" => Code::NotFound,
        "etcdserver: mvcc: database space exceeded" => Code::ResourceExhausted,
        "etcdserver: Peer URLs already exists"
        | "etcdserver: member ID already exist"
        | "etcdserver: re-configuration failed due to not enough started members"
        | "etcdserver: can only promote a learner member which is in sync with leader"
        | "etcdserver: can only promote a learner member"
        | "etcdserver: too many learner members in cluster"
        | "etcdserver: not leader"
        | "etcdserver: lease already exists"
        | "etcdserver: bad leader transferee" => Code::FailedPrecondition,
        "etcdserver: given member URLs are invalid" => Code::InvalidArgument,
        "etcdserver: no leader"
        | "etcdserver: request timed out"
        | "etcdserver: server stopped"
        | "etcdserver: unhealthy cluster"
        | "etcdserver: leader changed"
        | "etcdserver: rpc not supported for learner"
        | "etcdserver: request timed out, leader transfer took too long" => Code::Unavailable,
        _ => Code::Unknown,
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let msg = e.to_string();
        let code = match &e {
            ApiError::Unimplemented(_) => Code::Unimplemented,
            ApiError::Remote(code, _) => *code,
            ApiError::Internal(_) => Code::Unavailable,
            _ => code_of(&msg),
        };
        Status::new(code, msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_codes_and_messages() {
        let s: Status =
            ApiError::Applied("etcdserver: mvcc: required revision has been compacted".into())
                .into();
        assert_eq!(s.code(), Code::OutOfRange);
        let s: Status = ApiError::RequestTooLarge.into();
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "etcdserver: request is too large")
        );
        let s: Status = ApiError::Unhealthy.into();
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unavailable, "etcdserver: unhealthy cluster")
        );
        let s: Status = ApiError::NotEnoughStartedMembers.into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        let s: Status = ApiError::Applied("etcdserver: lease already exists".into()).into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        let s: Status = ApiError::Applied("etcdserver: requested lease not found".into()).into();
        assert_eq!(s.code(), Code::NotFound);
        let s: Status = ApiError::MemberNotFound.into();
        assert_eq!(s.code(), Code::NotFound);
        let s: Status = ApiError::from(ProposeError::NoLeader).into();
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unavailable, "etcdserver: no leader")
        );
    }
}
