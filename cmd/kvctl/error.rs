//! etcdctl's error reporting: `Error: <message>` on stderr and its exit codes.
use std::fmt;

/// Exit codes of etcdctl (`ctlv3/command/error.go`).
pub const EXIT_ERROR: i32 = 1;
pub const EXIT_BAD_CONNECTION: i32 = 2;
pub const EXIT_INVALID_INPUT: i32 = 3;
pub const EXIT_BAD_FEATURE: i32 = 4;
pub const EXIT_INTERRUPTED: i32 = 5;
pub const EXIT_BAD_ARGS: i32 = 128;

/// An error that ends the command with `Error: <msg>` and an exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    pub code: i32,
    pub msg: String,
}

impl CliError {
    pub fn new(code: i32, msg: impl Into<String>) -> Self {
        CliError {
            code,
            msg: msg.into(),
        }
    }
    pub fn bad_args(msg: impl Into<String>) -> Self {
        Self::new(EXIT_BAD_ARGS, msg)
    }
    pub fn deadline() -> Self {
        Self::new(EXIT_ERROR, "context deadline exceeded")
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for CliError {}

/// The etcd server errors kvctl reacts to. etcd's wire protocol identifies them by the status
/// description alone (clientv3's `rpctypes.Error` maps descriptions back to errors the same
/// way), so this is the one place where a description is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdError {
    AuthNotEnabled,
    InvalidAuthToken,
    UserEmpty,
    AuthOldRevision,
    RootRoleNotExist,
    /// A promote before the learner's log is close enough to the leader's.
    LearnerNotReady,
    /// A change whose voter set would not have a quorum of started (published) members.
    NotEnoughStartedMembers,
    /// A change refused because too few voters are connected (strict reconfiguration check).
    Unhealthy,
    MemberNotFound,
    NotLearner,
}

impl EtcdError {
    pub fn of(s: &tonic::Status) -> Option<EtcdError> {
        match s.message() {
            "etcdserver: authentication is not enabled" => Some(EtcdError::AuthNotEnabled),
            "etcdserver: invalid auth token" => Some(EtcdError::InvalidAuthToken),
            "etcdserver: user name is empty" => Some(EtcdError::UserEmpty),
            "etcdserver: revision of auth store is old" => Some(EtcdError::AuthOldRevision),
            "etcdserver: root user does not have root role" => Some(EtcdError::RootRoleNotExist),
            "etcdserver: can only promote a learner member which is in sync with leader" => {
                Some(EtcdError::LearnerNotReady)
            }
            "etcdserver: re-configuration failed due to not enough started members" => {
                Some(EtcdError::NotEnoughStartedMembers)
            }
            "etcdserver: unhealthy cluster" => Some(EtcdError::Unhealthy),
            "etcdserver: member not found" => Some(EtcdError::MemberNotFound),
            "etcdserver: can only promote a learner member" => Some(EtcdError::NotLearner),
            _ => None,
        }
    }
}

/// Go's names of gRPC status codes, as printed by `status.Error`.
fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The message clientv3 would produce for a gRPC status: etcd's server errors are shown by their
/// description only (`etcdserver: ...`), timeouts as the context error, anything else in Go's
/// `rpc error: code = X desc = Y` form.
pub fn status_message(s: &tonic::Status) -> String {
    let msg = s.message();
    match s.code() {
        tonic::Code::DeadlineExceeded => "context deadline exceeded".to_string(),
        tonic::Code::Cancelled => "context canceled".to_string(),
        _ if msg.starts_with("etcdserver: ") => msg.to_string(),
        code => format!("rpc error: code = {} desc = {}", go_code_name(code), msg),
    }
}

impl From<tonic::Status> for CliError {
    fn from(s: tonic::Status) -> Self {
        CliError::new(EXIT_ERROR, status_message(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        let s =
            tonic::Status::out_of_range("etcdserver: mvcc: required revision has been compacted");
        assert_eq!(
            status_message(&s),
            "etcdserver: mvcc: required revision has been compacted"
        );
        let s =
            tonic::Status::resource_exhausted("grpc: received message larger than max (1 vs. 0)");
        assert_eq!(
            status_message(&s),
            "rpc error: code = ResourceExhausted desc = grpc: received message larger than max (1 vs. 0)"
        );
        let s = tonic::Status::deadline_exceeded("whatever");
        assert_eq!(CliError::from(s), CliError::deadline());
    }
}
