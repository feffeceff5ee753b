//! Errors of the Raft layer: [`StoreError`] for its storage (log store, state machine,
//! snapshots), [`ProposeError`] for a request it replicates or reads through.

use std::path::PathBuf;

use crate::mvcc::MvccError;
use crate::proto::kvdpb::ErrorCode;
use crate::wal::WalError;

/// Why a proposal or a read barrier failed. Messages are etcd's.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ProposeError {
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: server stopped")]
    Stopped,
    /// The entry was appended but dropped from this leader's log (truncated by a new leader,
    /// or purged under a snapshot): it may or may not commit elsewhere.
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    #[error("etcdserver: {0}")]
    Internal(String),
    /// The leader's answer to a forwarded write, of a kind with no variant here (an internal
    /// error, or an answer from a member that sends no kind): passed on with its gRPC code and
    /// message unchanged.
    #[error("{1}")]
    Leader(tonic::Code, String),
    /// The request needs a newer log format than the cluster's: some member runs an older
    /// kvd. The message names what to do.
    #[error("{0}")]
    ClusterFormat(String),
    /// This member stopped applying at an entry it cannot apply (see
    /// `StateMachine::needs_upgrade`); the message says which and what to do.
    #[error("{0}")]
    NeedsUpgrade(String),
}

impl ProposeError {
    /// The error's etcd kind, sent with a leader's answer to a forwarded write.
    pub fn kind(&self) -> ErrorCode {
        match self {
            ProposeError::NoLeader => ErrorCode::NoLeader,
            ProposeError::Timeout => ErrorCode::Timeout,
            ProposeError::Stopped => ErrorCode::Stopped,
            ProposeError::LeaderChanged => ErrorCode::LeaderChanged,
            ProposeError::Internal(_) => ErrorCode::Internal,
            ProposeError::Leader(..) => ErrorCode::Unspecified,
            ProposeError::ClusterFormat(_) => ErrorCode::ClusterFormat,
            ProposeError::NeedsUpgrade(_) => ErrorCode::NeedsUpgrade,
        }
    }

    /// The error of kind `kind`, for the kinds whose message is fixed.
    pub fn of_kind(kind: ErrorCode) -> Option<ProposeError> {
        Some(match kind {
            ErrorCode::NoLeader => ProposeError::NoLeader,
            ErrorCode::Timeout => ProposeError::Timeout,
            ErrorCode::Stopped => ProposeError::Stopped,
            ErrorCode::LeaderChanged => ProposeError::LeaderChanged,
            _ => return None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("state machine: {0}")]
    Mvcc(#[from] MvccError),
    /// A stored record (log entry, vote, metadata) that does not decode.
    #[error("cannot decode {what}: {source}")]
    Decode {
        what: &'static str,
        source: bincode::Error,
    },
    /// Stored Raft state that decodes but is not what it must be: `reason` says what was
    /// found (a missing entry, a member missing from its own configuration).
    #[error("inconsistent {what}: {reason}")]
    Inconsistent { what: &'static str, reason: String },
    /// A membership configuration that openraft refuses (no voter, a voter without a node).
    #[error("{what}: {source}")]
    Membership {
        what: &'static str,
        source: openraft::error::MembershipError<crate::raft::types::NodeId>,
    },
    /// A snapshot file that is not what it must be; `reason` says what was found.
    #[error("snapshot {file}: {reason}")]
    Snapshot { file: PathBuf, reason: String },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The iterator feeding a write failed; its caller holds the cause (a restore reading
    /// its backup file).
    #[error("the entries' source failed")]
    SourceFailed,
    /// A switch of the state machine's engine to the generation in `dir` failed once the
    /// rename of its pointer had been attempted: either generation may be current on disk.
    /// The state machine refuses every write from then on (so the member exits, as on any
    /// storage error); the next start reads the pointer and keeps the one it names.
    #[error(
        "switching the state machine's engine to {dir}: {source}; which engine is current is \
         decided at the next start"
    )]
    SwitchUncertain {
        dir: PathBuf,
        source: std::sync::Arc<std::io::Error>,
    },
}

impl From<StoreError> for std::io::Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io(e) => e,
            e => std::io::Error::other(e),
        }
    }
}
