//! Log formats: which replicated entries a member can apply.
//!
//! Every kind of log entry belongs to the format that introduced it. A member publishes the
//! newest format it applies; the cluster's format is the oldest any member applies, and a
//! leader proposes only entries of the cluster's format or older (see docs/operations.md,
//! "Upgrading").
//!
//! # Invariants
//! - Formats only grow: a kind of entry never changes its format, and a new kind (or a new
//!   field that changes how an entry applies) gets a new format.
//! - Format 1 is what every build before versions applied (members that publish no format):
//!   put, delete-range, txn, compaction, publish, lease grant and lease revoke.

/// The newest log format this build applies.
pub const LOG_FORMAT: u32 = 2;

/// The format of members that publish none (every build before versions).
pub const OLDEST_LOG_FORMAT: u32 = 1;
