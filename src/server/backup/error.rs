//! What can go wrong saving, reading or restoring a backup.

use std::path::PathBuf;

use crate::bbolt::BoltError;
use crate::mvcc::MvccError;
use crate::raft::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a readable bbolt database.
    #[error("not a valid snapshot database: {0}")]
    Bolt(#[from] BoltError),
    /// A record of the snapshot cannot be part of a store (etcd's schema broken).
    #[error("{path}: invalid snapshot content: {source}")]
    Content { path: PathBuf, source: MvccError },
    /// A user, role or auth flag of the snapshot that cannot be restored.
    #[error("{path}: invalid snapshot content: {source}")]
    Auth {
        path: PathBuf,
        source: crate::auth::etcd_buckets::BadAuthRecord,
    },
    /// A bucket a snapshot must have is absent.
    #[error("{path}: not an etcd snapshot: bucket {bucket:?} is missing")]
    MissingBucket { path: PathBuf, bucket: String },
    /// etcdctl's words.
    #[error("snapshot missing hash but --skip-hash-check=false")]
    MissingHash,
    /// etcdctl's words.
    #[error("expected sha256 {expected}, got {got}")]
    HashMismatch { expected: String, got: String },
    /// etcdctl's words.
    #[error("data-dir {0:?} exists")]
    DataDirExists(PathBuf),
    /// etcdctl's words.
    #[error("wal-dir {0:?} exists")]
    WalDirExists(PathBuf),
    #[error("{0}")]
    Flags(String),
    #[error("{0}")]
    Mvcc(#[from] MvccError),
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl BackupError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> BackupError {
        let path = path.into();
        move |source| BackupError::Io { path, source }
    }
}
