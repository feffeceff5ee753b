//! The Raft log on the WAL: openraft's `RaftLogStorage` ([`log_store`]) with an in-memory
//! window of recent entries, and the follower's choice to write its log in place
//! ([`in_place`]).
//!
//! Invariants:
//! - An entry, a vote or a purge is acknowledged to openraft only after the WAL record holding
//!   it is fsynced.
//! - This folder uses only the Raft layer's leaves and the WAL: never the state machine, the
//!   network or the node (tests/layering.rs checks).

pub(crate) mod in_place;
pub(crate) mod log_store;
