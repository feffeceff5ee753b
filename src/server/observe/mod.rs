//! What a member exports about itself: the `/metrics` scrape (WAL, Raft, MVCC and gRPC
//! figures) and the `/health` rule, served on `--listen-metrics-urls`.
//!
//! Invariants:
//! - Scraping never blocks the write path: WAL figures are an atomic snapshot
//!   ([`crate::wal::Wal::stats`]), Raft figures come from openraft's metrics watch, and the
//!   process-wide counters live in [`crate::metrics`] as relaxed atomics.
//! - `/health` is healthy exactly when [`crate::raft::RaftNode::has_leader`] is true, the same
//!   check that makes `hasleader` requests fail with "no leader".

mod collect;
mod endpoint;

pub use collect::{render, Scrape};
pub use endpoint::{healthy, router, serve};
