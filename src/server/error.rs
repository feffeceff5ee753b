//! The one place where errors become gRPC statuses, with etcd's codes and messages.
//!
//! The errors a client can see ([`MvccError`], [`AuthError`], [`ProposeError`], [`ApiError`],
//! which wraps the others; docs/architecture.md, "Errors", lists every error enum) each
//! name their etcd kind ([`ErrorCode`], which is also what crosses the peer protocol), and
//! [`grpc_code`] gives each kind etcd's gRPC code (etcd's api/v3rpc/rpctypes/error.go). The
//! JSON gateway calls the gRPC services in process, so its error bodies come from the same
//! statuses.
//!
//! etcd's clients recognise server errors by their message text (clientv3's rpctypes map the
//! string back to a typed error), so the message must be etcd's, byte for byte.

use tonic::{Code, Status};

use crate::auth::AuthError;
use crate::mvcc::MvccError;
use crate::proto::kvdpb::ErrorCode;
use crate::raft::net::peer_error;
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
    /// A NOSPACE alarm is active, or the write would take the database past its quota.
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    /// A CORRUPT alarm is active: writes are refused.
    #[error("etcdserver: corrupt cluster")]
    Corrupt,
    /// An alarm request with an action etcd does not define (etcd 3.4 crashes on one; kvd
    /// refuses it before it is proposed).
    #[error("etcdserver: unknown alarm action")]
    BadAlarmAction,
    /// A request the store refused, read locally or applied (here or on the leader).
    #[error(transparent)]
    Mvcc(#[from] MvccError),
    /// An auth error (etcd's auth store), checked here or applied.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// An error made elsewhere whose kind has no variant here (another member's status, or an
    /// apply result of such a kind): passed on with its gRPC code and message unchanged.
    #[error("{1}")]
    Remote(Code, String),
    #[error("{0}")]
    Unimplemented(String),
    #[error("etcdserver: {0}")]
    Internal(String),
    /// See `ProposeError::ClusterFormat`.
    #[error("{0}")]
    ClusterFormat(String),
    /// See `ProposeError::NeedsUpgrade`.
    #[error("{0}")]
    NeedsUpgrade(String),
}

impl ApiError {
    /// The error's etcd kind; `Unspecified` for an error passed on by gRPC code alone.
    pub fn kind(&self) -> ErrorCode {
        use ErrorCode as K;
        match self {
            ApiError::RequestTooLarge => K::RequestTooLarge,
            ApiError::NoLeader => K::NoLeader,
            ApiError::Timeout => K::Timeout,
            ApiError::Stopped => K::Stopped,
            ApiError::MemberNotFound => K::MemberNotFound,
            ApiError::LeaseTtlTooLarge => K::LeaseTtlTooLarge,
            ApiError::NotLeader => K::NotLeader,
            ApiError::LeaderChanged => K::LeaderChanged,
            ApiError::PeerUrlsExist => K::PeerUrlsExist,
            ApiError::MemberIdExists => K::MemberIdExists,
            ApiError::BadMemberUrls => K::BadMemberUrls,
            ApiError::NotEnoughStartedMembers => K::NotEnoughStartedMembers,
            ApiError::Unhealthy => K::Unhealthy,
            ApiError::TooManyLearners => K::TooManyLearners,
            ApiError::NotLearner => K::NotLearner,
            ApiError::LearnerNotReady => K::LearnerNotReady,
            ApiError::BadLeaderTransferee => K::BadLeaderTransferee,
            ApiError::LeaderTransferTimeout => K::LeaderTransferTimeout,
            ApiError::NotSupportedForLearner => K::NotSupportedForLearner,
            ApiError::NoSpace => K::NoSpace,
            ApiError::Corrupt => K::Corrupt,
            ApiError::BadAlarmAction => K::BadAlarmAction,
            ApiError::Mvcc(e) => e.kind(),
            ApiError::Auth(e) => e.kind(),
            ApiError::Remote(..) => K::Unspecified,
            ApiError::Unimplemented(_) => K::Unimplemented,
            ApiError::Internal(_) => K::Internal,
            ApiError::ClusterFormat(_) => K::ClusterFormat,
            ApiError::NeedsUpgrade(_) => K::NeedsUpgrade,
        }
    }

    /// The error of kind `kind`, for the kinds whose message is fixed.
    pub fn of_kind(kind: ErrorCode) -> Option<ApiError> {
        use ErrorCode as K;
        if let Some(e) = AuthError::of_kind(kind) {
            return Some(ApiError::Auth(e));
        }
        if let Some(e) = MvccError::of_kind(kind) {
            return Some(ApiError::Mvcc(e));
        }
        if let Some(e) = ProposeError::of_kind(kind) {
            return Some(e.into());
        }
        Some(match kind {
            K::RequestTooLarge => ApiError::RequestTooLarge,
            K::MemberNotFound => ApiError::MemberNotFound,
            K::LeaseTtlTooLarge => ApiError::LeaseTtlTooLarge,
            K::NotLeader => ApiError::NotLeader,
            K::PeerUrlsExist => ApiError::PeerUrlsExist,
            K::MemberIdExists => ApiError::MemberIdExists,
            K::BadMemberUrls => ApiError::BadMemberUrls,
            K::NotEnoughStartedMembers => ApiError::NotEnoughStartedMembers,
            K::Unhealthy => ApiError::Unhealthy,
            K::TooManyLearners => ApiError::TooManyLearners,
            K::NotLearner => ApiError::NotLearner,
            K::LearnerNotReady => ApiError::LearnerNotReady,
            K::BadLeaderTransferee => ApiError::BadLeaderTransferee,
            K::LeaderTransferTimeout => ApiError::LeaderTransferTimeout,
            K::NotSupportedForLearner => ApiError::NotSupportedForLearner,
            K::NoSpace => ApiError::NoSpace,
            K::Corrupt => ApiError::Corrupt,
            K::BadAlarmAction => ApiError::BadAlarmAction,
            _ => return None,
        })
    }

    /// The error an apply result names (`InternalResponse.error` with its `error_code`); a
    /// kind with no fixed message, or none (a leader that sends none), keeps the message.
    pub fn applied(kind: i32, message: String) -> ApiError {
        let kind = ErrorCode::try_from(kind).unwrap_or(ErrorCode::Unspecified);
        ApiError::of_kind(kind).unwrap_or_else(|| ApiError::Remote(grpc_code(kind), message))
    }

    /// The error a member's answer over the peer protocol stands for: by the kind it carries,
    /// else its gRPC code and message, passed on unchanged.
    pub fn from_peer(s: &Status) -> ApiError {
        ApiError::of_kind(peer_error::kind_of(s))
            .unwrap_or_else(|| ApiError::Remote(s.code(), s.message().to_string()))
    }

    /// The status a member answers another with over the peer protocol: the client's status,
    /// with the kind in its details.
    pub fn into_peer_status(self) -> Status {
        let kind = self.kind();
        let s = Status::from(self);
        peer_error::status_of_kind(s.code(), s.message(), kind)
    }
}

/// etcd's gRPC code for an error kind (etcd's api/v3rpc/rpctypes/error.go; kinds etcd does not
/// have are `Unknown`, as etcd answers an error it has no status for).
pub fn grpc_code(kind: ErrorCode) -> Code {
    use ErrorCode as K;
    match kind {
        K::EmptyKey
        | K::KeyNotFound
        | K::ValueProvided
        | K::LeaseProvided
        | K::TooManyOps
        | K::DuplicateKey
        | K::RequestTooLarge
        | K::BadMemberUrls
        | K::BadAlarmAction => Code::InvalidArgument,
        K::NoSpace => Code::ResourceExhausted,
        K::Corrupt => Code::DataLoss,
        K::Compacted | K::FutureRev | K::LeaseTtlTooLarge => Code::OutOfRange,
        K::LeaseNotFound | K::MemberNotFound => Code::NotFound,
        K::PeerUrlsExist
        | K::MemberIdExists
        | K::NotEnoughStartedMembers
        | K::LearnerNotReady
        | K::NotLearner
        | K::TooManyLearners
        | K::NotLeader
        | K::LeaseExists
        | K::BadLeaderTransferee => Code::FailedPrecondition,
        K::NoLeader
        | K::Timeout
        | K::Stopped
        | K::Unhealthy
        | K::LeaderChanged
        | K::NotSupportedForLearner
        | K::LeaderTransferTimeout
        | K::Internal => Code::Unavailable,
        K::Unimplemented => Code::Unimplemented,
        K::UserEmpty
        | K::RoleEmpty
        | K::AuthFailed
        | K::PermissionNotGiven
        | K::InvalidAuthMgmt
        | K::AuthOldRevision
        | K::InvalidSortOption => Code::InvalidArgument,
        K::RootUserNotExist
        | K::RootRoleNotExist
        | K::UserAlreadyExist
        | K::UserNotFound
        | K::RoleAlreadyExist
        | K::RoleNotFound
        | K::RoleNotGranted
        | K::PermissionNotGranted
        | K::AuthNotEnabled => Code::FailedPrecondition,
        K::PermissionDenied => Code::PermissionDenied,
        // Like a member that is not ready: clients try another endpoint.
        K::NeedsUpgrade => Code::Unavailable,
        K::ClusterFormat => Code::FailedPrecondition,
        K::InvalidAuthToken => Code::Unauthenticated,
        K::NoLeaseId | K::ReservedMetaKey | K::Storage | K::UndecodableEntry | K::Unspecified => {
            Code::Unknown
        }
    }
}

impl From<ProposeError> for ApiError {
    fn from(e: ProposeError) -> Self {
        match e {
            ProposeError::NoLeader => ApiError::NoLeader,
            ProposeError::Timeout => ApiError::Timeout,
            ProposeError::Stopped => ApiError::Stopped,
            ProposeError::LeaderChanged => ApiError::LeaderChanged,
            ProposeError::Internal(s) => ApiError::Internal(s),
            ProposeError::Leader(code, msg) => ApiError::Remote(code, msg),
            ProposeError::ClusterFormat(m) => ApiError::ClusterFormat(m),
            ProposeError::NeedsUpgrade(m) => ApiError::NeedsUpgrade(m),
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let code = match &e {
            ApiError::Remote(code, _) => *code,
            e => grpc_code(e.kind()),
        };
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant, with etcd 3.4's gRPC code and message for it (etcd's
    /// api/v3rpc/rpctypes/error.go; kvd's own errors are `Unknown`, as etcd answers errors it
    /// has no status for).
    fn etcd_table() -> Vec<(ApiError, Code, &'static str)> {
        use ApiError as A;
        use Code::*;
        use MvccError as M;
        vec![
            (
                A::RequestTooLarge,
                InvalidArgument,
                "etcdserver: request is too large",
            ),
            (A::NoLeader, Unavailable, "etcdserver: no leader"),
            (A::Timeout, Unavailable, "etcdserver: request timed out"),
            (A::Stopped, Unavailable, "etcdserver: server stopped"),
            (A::MemberNotFound, NotFound, "etcdserver: member not found"),
            (
                A::LeaseTtlTooLarge,
                OutOfRange,
                "etcdserver: too large lease TTL",
            ),
            (A::NotLeader, FailedPrecondition, "etcdserver: not leader"),
            (A::LeaderChanged, Unavailable, "etcdserver: leader changed"),
            (
                A::PeerUrlsExist,
                FailedPrecondition,
                "etcdserver: Peer URLs already exists",
            ),
            (
                A::MemberIdExists,
                FailedPrecondition,
                "etcdserver: member ID already exist",
            ),
            (
                A::BadMemberUrls,
                InvalidArgument,
                "etcdserver: given member URLs are invalid",
            ),
            (
                A::NotEnoughStartedMembers,
                FailedPrecondition,
                "etcdserver: re-configuration failed due to not enough started members",
            ),
            (A::Unhealthy, Unavailable, "etcdserver: unhealthy cluster"),
            (
                A::TooManyLearners,
                FailedPrecondition,
                "etcdserver: too many learner members in cluster",
            ),
            (
                A::NotLearner,
                FailedPrecondition,
                "etcdserver: can only promote a learner member",
            ),
            (
                A::LearnerNotReady,
                FailedPrecondition,
                "etcdserver: can only promote a learner member which is in sync with leader",
            ),
            (
                A::BadLeaderTransferee,
                FailedPrecondition,
                "etcdserver: bad leader transferee",
            ),
            (
                A::LeaderTransferTimeout,
                Unavailable,
                "etcdserver: request timed out, leader transfer took too long",
            ),
            (
                A::NotSupportedForLearner,
                Unavailable,
                "etcdserver: rpc not supported for learner",
            ),
            (
                A::Mvcc(M::Compacted),
                OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                A::Mvcc(M::FutureRev),
                OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                A::Mvcc(M::KeyNotFound),
                InvalidArgument,
                "etcdserver: key not found",
            ),
            (
                A::Mvcc(M::TooManyOps),
                InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            (
                A::Mvcc(M::DuplicateKey),
                InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            (
                A::Mvcc(M::EmptyKey),
                InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                A::Mvcc(M::ValueProvided),
                InvalidArgument,
                "etcdserver: value is provided",
            ),
            (
                A::Mvcc(M::LeaseProvided),
                InvalidArgument,
                "etcdserver: lease is provided",
            ),
            (
                A::Mvcc(M::LeaseNotFound),
                NotFound,
                "etcdserver: requested lease not found",
            ),
            (
                A::Mvcc(M::LeaseExists),
                FailedPrecondition,
                "etcdserver: lease already exists",
            ),
            (
                A::Mvcc(M::NoLeaseId),
                Unknown,
                "etcdserver: lease grant without an id",
            ),
            (
                A::Mvcc(M::InvalidSortOption),
                InvalidArgument,
                "etcdserver: invalid sort option",
            ),
            (
                A::Mvcc(M::ReservedMetaKey(b"m".to_vec())),
                Unknown,
                "kvd: mvcc: meta key [109] is reserved",
            ),
            (
                A::Mvcc(M::corrupt("disk")),
                Unknown,
                "kvd: mvcc: storage error: disk",
            ),
            (
                A::NoSpace,
                ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (A::Corrupt, DataLoss, "etcdserver: corrupt cluster"),
            (
                A::BadAlarmAction,
                InvalidArgument,
                "etcdserver: unknown alarm action",
            ),
            (
                A::Auth(AuthError::RootUserNotExist),
                FailedPrecondition,
                "etcdserver: root user does not exist",
            ),
            (
                A::Auth(AuthError::RootRoleNotExist),
                FailedPrecondition,
                "etcdserver: root user does not have root role",
            ),
            (
                A::Auth(AuthError::UserAlreadyExist),
                FailedPrecondition,
                "etcdserver: user name already exists",
            ),
            (
                A::Auth(AuthError::UserEmpty),
                InvalidArgument,
                "etcdserver: user name is empty",
            ),
            (
                A::Auth(AuthError::UserNotFound),
                FailedPrecondition,
                "etcdserver: user name not found",
            ),
            (
                A::Auth(AuthError::RoleAlreadyExist),
                FailedPrecondition,
                "etcdserver: role name already exists",
            ),
            (
                A::Auth(AuthError::RoleNotFound),
                FailedPrecondition,
                "etcdserver: role name not found",
            ),
            (
                A::Auth(AuthError::RoleEmpty),
                InvalidArgument,
                "etcdserver: role name is empty",
            ),
            (
                A::Auth(AuthError::AuthFailed),
                InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            (
                A::Auth(AuthError::PermissionNotGiven),
                InvalidArgument,
                "etcdserver: permission not given",
            ),
            (
                A::Auth(AuthError::PermissionDenied),
                PermissionDenied,
                "etcdserver: permission denied",
            ),
            (
                A::Auth(AuthError::RoleNotGranted),
                FailedPrecondition,
                "etcdserver: role is not granted to the user",
            ),
            (
                A::Auth(AuthError::PermissionNotGranted),
                FailedPrecondition,
                "etcdserver: permission is not granted to the role",
            ),
            (
                A::Auth(AuthError::AuthNotEnabled),
                FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ),
            (
                A::Auth(AuthError::InvalidAuthToken),
                Unauthenticated,
                "etcdserver: invalid auth token",
            ),
            (
                A::Auth(AuthError::InvalidAuthMgmt),
                InvalidArgument,
                "etcdserver: invalid auth management",
            ),
            (
                A::Auth(AuthError::AuthOldRevision),
                InvalidArgument,
                "etcdserver: revision of auth store is old",
            ),
            (A::Remote(Aborted, "x".into()), Aborted, "x"),
            (A::Unimplemented("nope".into()), Unimplemented, "nope"),
            (A::Internal("boom".into()), Unavailable, "etcdserver: boom"),
        ]
    }

    #[test]
    fn every_error_has_etcds_code_and_message() {
        for (e, code, msg) in etcd_table() {
            let s = Status::from(e.clone());
            assert_eq!((s.code(), s.message()), (code, msg), "{e:?}");
        }
        let s: Status = ApiError::from(ProposeError::NoLeader).into();
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unavailable, "etcdserver: no leader")
        );
        let s: Status = ApiError::from(ProposeError::Leader(Code::Aborted, "x".into())).into();
        assert_eq!((s.code(), s.message()), (Code::Aborted, "x"));
    }

    #[test]
    fn kinds_name_one_variant_each() {
        for k in (0..64).filter_map(|i| ErrorCode::try_from(i).ok()) {
            if let Some(e) = ApiError::of_kind(k) {
                assert_eq!(e.kind(), k);
            }
        }
        for (e, _, _) in etcd_table() {
            if let Some(back) = ApiError::of_kind(e.kind()) {
                assert_eq!(back, e);
            }
        }
    }

    /// What the receiving member makes of an error, through the peer protocol's encoding.
    #[test]
    fn errors_cross_the_peer_protocol_unchanged() {
        for (e, code, msg) in etcd_table() {
            let mut h = http::HeaderMap::new();
            e.clone().into_peer_status().add_header(&mut h).unwrap();
            let got = ApiError::from_peer(&Status::from_header_map(&h).unwrap());
            let s = Status::from(got.clone());
            assert_eq!((s.code(), s.message()), (code, msg), "{e:?} -> {got:?}");
            if ApiError::of_kind(e.kind()).is_some() {
                assert_eq!(got, e);
            }
            // As an apply result (only the store's errors are), too.
            if let ApiError::Mvcc(m) = &e {
                let got = ApiError::applied(m.kind() as i32, m.to_string());
                let s = Status::from(got);
                assert_eq!((s.code(), s.message()), (code, msg), "{e:?}");
            }
        }
        // A member that sends no kind: code and message pass on as they are.
        let got = ApiError::from_peer(&Status::failed_precondition("etcdserver: not leader"));
        assert_eq!(
            got,
            ApiError::Remote(Code::FailedPrecondition, "etcdserver: not leader".into())
        );
        let got = ApiError::applied(0, "etcdserver: lease already exists".into());
        assert_eq!(
            got,
            ApiError::Remote(Code::Unknown, "etcdserver: lease already exists".into())
        );
        assert_eq!(
            ApiError::applied(ErrorCode::LeaseExists as i32, "anything".into()),
            ApiError::Mvcc(MvccError::LeaseExists)
        );
    }
}
