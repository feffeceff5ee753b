//! The replicated state machine: what a member applies from the log and what it sends and
//! receives as a snapshot.
//!
//! Owns the MVCC store behind openraft's `RaftStateMachine` ([`state_machine`]), the other
//! replicated state beside it (alarms in [`alarm_set`], lease expiry in [`lessor`]), the
//! engine's generations on disk and their switch ([`engine_dir`], defragment), snapshot files
//! and their format ([`snapshot_file`], [`snapshot_format`], [`snapshot_data`]), the state
//! machine's side of backups and restores ([`backup`]), and low-priority snapshot work
//! ([`background`]).
//!
//! Invariants:
//! - Apply is deterministic: what an entry does depends only on the entries before it (see
//!   docs/architecture.md "Deterministic apply"); an entry this build cannot apply stops the
//!   apply at that index, it is never skipped.
//! - This folder uses only the Raft layer's leaves (`types`, `codec`, `error`, `limits`,
//!   `log_format`) and the layers below (mvcc, auth, wal): never the log store, the network or
//!   the node, so a state machine can be built and tested alone (tests/layering.rs checks).

pub mod alarm_set;
pub(crate) mod background;
pub(crate) mod backup;
pub(crate) mod engine_dir;
pub mod lessor;
pub(crate) mod snapshot_data;
pub mod snapshot_file;
#[cfg(test)]
pub(crate) mod snapshot_file_install;
pub mod snapshot_format;
pub(crate) mod state_machine;
