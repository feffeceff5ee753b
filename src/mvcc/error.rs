//! Errors of the MVCC layer. `Display` strings are etcd's gRPC error messages so the API
//! layer can pass them through verbatim; [`MvccError::kind`] is what the other layers go by.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

use crate::proto::kvdpb::ErrorCode;

/// An error returned by the MVCC store or by the request validation helpers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MvccError {
    /// The requested revision is older than the compacted revision.
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    /// The requested revision is newer than the current revision.
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRev,
    /// `ignore_value`/`ignore_lease` on a missing key, or an empty `RequestOp` in a txn.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    /// A txn level has more compares/success/failure ops than allowed.
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    /// Two puts, or a put and a delete, of the same key in one txn branch.
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    /// A request without a key.
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    /// `ignore_value` together with a non-empty value.
    #[error("etcdserver: value is provided")]
    ValueProvided,
    /// `ignore_lease` together with a non-zero lease.
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// A put or revoke naming a lease that does not exist.
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    /// A grant with the id of an existing lease.
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    /// A lease grant that reached the store without the id its proposer must choose: refused
    /// as a request, never a storage failure that would stop the member.
    #[error("etcdserver: lease grant without an id")]
    NoLeaseId,
    /// Unknown sort order or sort target.
    #[error("etcdserver: invalid sort option")]
    InvalidSortOption,
    /// A lease revoke whose caller's guard refused one of the keys the lease holds at that
    /// point of the batch ([`super::MvccStore::apply_guarded`]); the caller knows why.
    #[error("etcdserver: permission denied")]
    RevokeRefused,
    /// The caller tried to write a meta key in the prefix reserved for the MVCC layer.
    #[error("kvd: mvcc: meta key {0:?} is reserved")]
    ReservedMetaKey(Vec<u8>),
    /// The underlying storage failed or holds data this module cannot decode.
    #[error("kvd: mvcc: storage error: {0}")]
    Storage(#[source] StorageError),
    /// The state-machine database was written by a newer kvd, in an engine format this build
    /// cannot read.
    #[error(
        "kvd: mvcc: storage error: the state-machine database was written by a newer kvd \
         (engine format {found}; this kvd reads up to {supported}): run the newer kvd on this \
         data dir"
    )]
    NewerEngine { found: u32, supported: u32 },
}

/// Why the storage failed: what was being done or what was found, and the error that caused
/// it, kept as an error value (the [`Error::source`] chain), never flattened into the text.
#[derive(Debug, Clone)]
pub struct StorageError {
    what: Cow<'static, str>,
    cause: Option<Arc<dyn Error + Send + Sync + 'static>>,
}

impl StorageError {
    /// A failure this layer describes alone, with no lower error behind it (stored data that
    /// is not what it must be, a fault a test injects): `what` says what and where.
    pub fn new(what: impl Into<Cow<'static, str>>) -> Self {
        StorageError {
            what: what.into(),
            cause: None,
        }
    }

    /// A failure of something below this layer (the engine, the file system, a decoder)
    /// while doing `what`.
    pub fn caused(
        what: impl Into<Cow<'static, str>>,
        cause: impl Error + Send + Sync + 'static,
    ) -> Self {
        StorageError {
            what: what.into(),
            cause: Some(Arc::new(cause)),
        }
    }

    /// What was being done or found, without the cause.
    pub fn what(&self) -> &str {
        &self.what
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            Some(c) => write!(f, "{}: {c}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl Error for StorageError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.cause.as_deref().map(|c| c as &(dyn Error + 'static))
    }
}

/// Two storage errors are equal when they say the same and share their cause (the same
/// error value, cloned), so comparing never reads a cause's text.
impl PartialEq for StorageError {
    fn eq(&self, other: &Self) -> bool {
        self.what == other.what
            && match (&self.cause, &other.cause) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Eq for StorageError {}

impl MvccError {
    /// A [`StorageError::new`]: stored data this layer finds wrong.
    pub fn corrupt(what: impl Into<Cow<'static, str>>) -> Self {
        MvccError::Storage(StorageError::new(what))
    }

    /// A [`StorageError::caused`]: a lower layer failed while doing `what`.
    pub fn storage(
        what: impl Into<Cow<'static, str>>,
        cause: impl Error + Send + Sync + 'static,
    ) -> Self {
        MvccError::Storage(StorageError::caused(what, cause))
    }

    /// The error's etcd kind, which picks its gRPC code and travels between members.
    pub fn kind(&self) -> ErrorCode {
        match self {
            MvccError::Compacted => ErrorCode::Compacted,
            MvccError::FutureRev => ErrorCode::FutureRev,
            MvccError::KeyNotFound => ErrorCode::KeyNotFound,
            MvccError::TooManyOps => ErrorCode::TooManyOps,
            MvccError::DuplicateKey => ErrorCode::DuplicateKey,
            MvccError::EmptyKey => ErrorCode::EmptyKey,
            MvccError::ValueProvided => ErrorCode::ValueProvided,
            MvccError::LeaseProvided => ErrorCode::LeaseProvided,
            MvccError::LeaseNotFound => ErrorCode::LeaseNotFound,
            MvccError::LeaseExists => ErrorCode::LeaseExists,
            MvccError::NoLeaseId => ErrorCode::NoLeaseId,
            MvccError::InvalidSortOption => ErrorCode::InvalidSortOption,
            MvccError::RevokeRefused => ErrorCode::PermissionDenied,
            MvccError::ReservedMetaKey(_) => ErrorCode::ReservedMetaKey,
            MvccError::Storage(_) | MvccError::NewerEngine { .. } => ErrorCode::Storage,
        }
    }

    /// The error of kind `kind`, for the kinds whose message is fixed (`None` for the others,
    /// whose message carries data, and for kinds of other layers).
    pub fn of_kind(kind: ErrorCode) -> Option<MvccError> {
        Some(match kind {
            ErrorCode::Compacted => MvccError::Compacted,
            ErrorCode::FutureRev => MvccError::FutureRev,
            ErrorCode::KeyNotFound => MvccError::KeyNotFound,
            ErrorCode::TooManyOps => MvccError::TooManyOps,
            ErrorCode::DuplicateKey => MvccError::DuplicateKey,
            ErrorCode::EmptyKey => MvccError::EmptyKey,
            ErrorCode::ValueProvided => MvccError::ValueProvided,
            ErrorCode::LeaseProvided => MvccError::LeaseProvided,
            ErrorCode::LeaseNotFound => MvccError::LeaseNotFound,
            ErrorCode::LeaseExists => MvccError::LeaseExists,
            ErrorCode::NoLeaseId => MvccError::NoLeaseId,
            ErrorCode::InvalidSortOption => MvccError::InvalidSortOption,
            _ => return None,
        })
    }
}

impl From<prost::DecodeError> for MvccError {
    fn from(e: prost::DecodeError) -> Self {
        MvccError::storage("corrupt record", e)
    }
}

impl From<bincode::Error> for MvccError {
    fn from(e: bincode::Error) -> Self {
        MvccError::storage("corrupt key index", e)
    }
}
