//! The auth layer's one error enum: etcd's auth errors, each with the message etcd's clients
//! recognise (etcd's api/v3rpc/rpctypes) and a kind that crosses the peer protocol.

use crate::proto::kvdpb::ErrorCode;

#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    #[error("etcdserver: permission not given")]
    PermissionNotGiven,
}

impl AuthError {
    pub fn kind(&self) -> ErrorCode {
        use AuthError as A;
        use ErrorCode as K;
        match self {
            A::RootUserNotExist => K::RootUserNotExist,
            A::RootRoleNotExist => K::RootRoleNotExist,
            A::UserAlreadyExist => K::UserAlreadyExist,
            A::UserEmpty => K::UserEmpty,
            A::UserNotFound => K::UserNotFound,
            A::RoleAlreadyExist => K::RoleAlreadyExist,
            A::RoleNotFound => K::RoleNotFound,
            A::RoleEmpty => K::RoleEmpty,
            A::AuthFailed => K::AuthFailed,
            A::PermissionDenied => K::PermissionDenied,
            A::RoleNotGranted => K::RoleNotGranted,
            A::PermissionNotGranted => K::PermissionNotGranted,
            A::AuthNotEnabled => K::AuthNotEnabled,
            A::InvalidAuthToken => K::InvalidAuthToken,
            A::InvalidAuthMgmt => K::InvalidAuthMgmt,
            A::AuthOldRevision => K::AuthOldRevision,
            A::PermissionNotGiven => K::PermissionNotGiven,
        }
    }

    /// The error of kind `kind`, if it is an auth kind.
    pub fn of_kind(kind: ErrorCode) -> Option<AuthError> {
        use AuthError as A;
        use ErrorCode as K;
        Some(match kind {
            K::RootUserNotExist => A::RootUserNotExist,
            K::RootRoleNotExist => A::RootRoleNotExist,
            K::UserAlreadyExist => A::UserAlreadyExist,
            K::UserEmpty => A::UserEmpty,
            K::UserNotFound => A::UserNotFound,
            K::RoleAlreadyExist => A::RoleAlreadyExist,
            K::RoleNotFound => A::RoleNotFound,
            K::RoleEmpty => A::RoleEmpty,
            K::AuthFailed => A::AuthFailed,
            K::PermissionDenied => A::PermissionDenied,
            K::RoleNotGranted => A::RoleNotGranted,
            K::PermissionNotGranted => A::PermissionNotGranted,
            K::AuthNotEnabled => A::AuthNotEnabled,
            K::InvalidAuthToken => A::InvalidAuthToken,
            K::InvalidAuthMgmt => A::InvalidAuthMgmt,
            K::AuthOldRevision => A::AuthOldRevision,
            K::PermissionNotGiven => A::PermissionNotGiven,
            _ => return None,
        })
    }
}
