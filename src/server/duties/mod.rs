//! A member's background duties: work nobody asked for in a request. Automatic compaction,
//! the backend quota and its NOSPACE alarm, defragmentation's bookkeeping, the corruption
//! checks (at start and periodically on the leader), the downgrade state, and the duties a
//! leader takes on and drops with its leadership.
//!
//! Invariants:
//! - Each duty is a task started by `super::lifecycle::serve` and aborted by
//!   `super::lifecycle::stop` before Raft stops, so none proposes into a stopping node.
//! - A duty changes replicated state only by proposing, as a client would.

pub(crate) mod compactor;
pub(crate) mod corrupt;
pub(crate) mod defrag;
pub(crate) mod downgrade;
pub(crate) mod leader_duties;
pub(crate) mod quota;
