//! Backups in etcd's own format, so etcd's tools and kvd's read each other's.
//!
//! A backup is what etcd's `Maintenance.Snapshot` streams: a bbolt database in etcd's schema
//! (buckets `auth`, `authRoles`, `authUsers`, `key`, `lease`, `members`, `members_removed`,
//! `meta`; see `mvcc::etcd::format` and `auth::etcd_buckets`) followed by the sha256 of those
//! bytes. [`save`] writes one from a
//! member's state machine, [`status`] summarises one as `etcdctl snapshot status` does, and
//! [`restore`] turns one (kvd's or etcd's) into the data dir of a member of a new cluster.
//! [`etcd_dir`] recognises an etcd data dir, which kvd refuses to start on.
//!
//! # Invariants
//! - A saved file is a consistent image at one applied log entry: the history, leases,
//!   compaction, users, roles and `consistent_index` all come from one
//!   `raft::sm::backup::BackupImage`.
//! - A save writes a temporary file next to its destination and renames it only when complete,
//!   so a crash leaves no partial backup under the final name.
//! - A restore checks the whole file (trailer hash, bbolt structure, every record) before it
//!   creates anything; what it then writes into the data dir is only trusted by kvd once the
//!   last step (the member identity, written atomically) is done, and a data dir that already
//!   holds a member is refused.

mod error;
pub mod etcd_dir;
pub mod restore;
pub mod save;
pub mod status;
pub mod stream;

pub use error::BackupError;
pub use restore::{restore, RestoreOptions};
pub use save::{save, Saved};
pub use status::{status, DbStatus};

/// Length of the sha256 trailer after the database bytes.
pub const TRAILER_LEN: usize = 32;

/// Whether a file of `len` bytes ends with a trailer, by etcd's rule: bbolt files are whole
/// pages, so a length 32 past a multiple of 512 means a trailer follows.
pub fn has_trailer(len: u64) -> bool {
    len % 512 == TRAILER_LEN as u64
}
