//! `snapshot status`: a backup file summarised as etcd summarises it.

use std::path::Path;

use crate::bbolt::Reader;
use crate::mvcc::etcd::format::{parse_rev_key, KEY_BUCKET};

use super::{has_trailer, BackupError, TRAILER_LEN};

/// etcd's `snapshot status` fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbStatus {
    /// crc32 (Castagnoli) over every bucket's name, keys and values, in order.
    pub hash: u32,
    /// The main revision of the newest history record.
    pub revision: i64,
    /// Keys in all buckets.
    pub total_key: u64,
    /// Database bytes (without the trailer).
    pub total_size: u64,
}

/// Reads the database at `path` (with or without a trailer) and summarises it.
pub fn status(path: &Path) -> Result<DbStatus, BackupError> {
    let len = std::fs::metadata(path)
        .map_err(BackupError::io(path))?
        .len();
    let total_size = if has_trailer(len) {
        len - TRAILER_LEN as u64
    } else {
        len
    };
    let r = Reader::open(path)?;
    let mut st = DbStatus {
        hash: 0,
        revision: 0,
        total_key: 0,
        total_size,
    };
    for name in r.buckets()? {
        st.hash = crc32c::crc32c_append(st.hash, &name);
        let is_key = name == KEY_BUCKET;
        r.for_each(&name, |k, v| -> Result<(), BackupError> {
            st.hash = crc32c::crc32c_append(st.hash, k);
            st.hash = crc32c::crc32c_append(st.hash, v);
            if is_key {
                let (rev, _) = parse_rev_key(k).map_err(|source| BackupError::Content {
                    path: path.to_path_buf(),
                    source,
                })?;
                st.revision = rev.main;
            }
            st.total_key += 1;
            Ok(())
        })?;
    }
    Ok(st)
}
