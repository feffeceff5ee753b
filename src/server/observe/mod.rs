//! What a member exports about itself: the `/metrics` scrape (WAL, Raft, MVCC and gRPC
//! figures), served on `--listen-metrics-urls`, and the health endpoints (`/health`, `/livez`,
//! `/readyz`), served there and on the client port.
//!
//! Invariants:
//! - Scraping never blocks the write path: WAL figures are an atomic snapshot
//!   ([`crate::wal::Wal::stats`]), Raft figures come from openraft's metrics watch, and the
//!   process-wide counters live in [`crate::metrics`] as relaxed atomics.
//! - The health endpoints answer the same on both listeners (one router, [`health::router`]);
//!   `/health` fails when [`crate::raft::RaftNode::has_leader`] is false, the same check that
//!   makes `hasleader` requests fail with "no leader".

mod collect;
mod endpoint;
pub mod health;

pub use collect::Scrape;
pub use endpoint::{metrics_router, serve};
