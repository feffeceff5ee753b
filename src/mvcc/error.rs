//! Errors of the MVCC layer. `Display` strings are etcd's gRPC error messages so the API
//! layer can pass them through verbatim.

use serde::{Deserialize, Serialize};

/// An error returned by the MVCC store or by the request validation helpers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
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
    /// The caller tried to write a meta key in the prefix reserved for the MVCC layer.
    #[error("kvd: mvcc: meta key {0:?} is reserved")]
    ReservedMetaKey(Vec<u8>),
    /// The underlying storage failed or holds data this module cannot decode.
    #[error("kvd: mvcc: storage error: {0}")]
    Storage(String),
}

impl From<prost::DecodeError> for MvccError {
    fn from(e: prost::DecodeError) -> Self {
        MvccError::Storage(format!("corrupt record: {e}"))
    }
}

impl From<bincode::Error> for MvccError {
    fn from(e: bincode::Error) -> Self {
        MvccError::Storage(format!("corrupt key index: {e}"))
    }
}
