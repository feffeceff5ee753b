//! Errors of the Raft storage layer (log store, state machine, snapshots).

use std::path::PathBuf;

use crate::mvcc::MvccError;
use crate::wal::WalError;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("state machine: {0}")]
    Mvcc(#[from] MvccError),
    #[error("cannot decode {what}: {reason}")]
    Decode { what: String, reason: String },
    #[error("snapshot {file}: {reason}")]
    Snapshot { file: PathBuf, reason: String },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl From<StoreError> for std::io::Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io(e) => e,
            e => std::io::Error::other(e.to_string()),
        }
    }
}
