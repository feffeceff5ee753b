//! Checkers for histories recorded by clients of a running cluster: linearizability of KV
//! operations ([`check`]) and consistency of watch streams ([`watch`]).
//!
//! A history is what clients saw: each [`Operation`] has a call and a return time from one
//! monotonic clock, the client that issued it and an [`Outcome`]. An operation whose outcome is
//! [`Outcome::Unknown`] (a timeout, a dropped connection) may or may not have taken effect, at
//! any time after its call: its return is treated as +infinity. An operation that
//! [`Outcome::Failed`] definitely had no effect and is ignored (only use it when the server
//! says so before doing anything; when unsure, a write is `Unknown`).
//!
//! The KV checker is Wing & Gong's search with Lowe's memoization of (linearized set, state),
//! as porcupine and Knossos do, and P-compositionality: etcd's key space is a map of
//! independent registers, so each key's sub-history is checked on its own. No maintained Rust
//! crate checks recorded histories against a model this way (crates found test in-process data
//! structures under a model checker instead), hence this module.
//!
//! Invariants the model enforces per key (see [`model`]): a read returns the value of the last
//! write linearized before it, with that write's mod_revision; writes linearized later have
//! larger revisions; a compare-and-set succeeds exactly when its compare holds.

pub mod check;
pub mod history;
pub mod model;
pub mod watch;

#[cfg(test)]
mod tests;

pub use check::{check_history, Anomaly, CheckOptions, Report};
pub use history::{Compare, Input, Kv, Operation, Outcome, Output, Recorder};
