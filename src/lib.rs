//! kvd: an etcd-compatible, Raft-replicated key-value store.
//!
//! Layers, bottom up; each may use the ones below it and never one above (tests/layering.rs
//! checks this on the source):
//! - [`wal`]: the fsynced write-ahead log, and the disk probe (`wal::diskcheck`).
//! - [`mvcc`]: etcd's revisioned key space, leases and members, on a storage engine.
//! - [`auth`]: users, roles, permissions, tokens (etcd's auth store), beside `mvcc`.
//! - [`raft`]: openraft on the WAL and the MVCC state machine, the peer network, the leader's
//!   lease expiry tracking (`raft::sm::lessor`).
//! - [`server`]: the etcd v3 gRPC services, the JSON gateway, membership checks, the validated
//!   flag set (`server::config`) and what a member exports about itself (`server::observe`).
//! - The binaries (`cmd/`) sit on top.
//!
//! Two leaves any layer may use: [`metrics`] (counters, histograms, the Prometheus text
//! writer) and [`proto`] (the generated etcd and peer messages, and their bounded decoder).
//! Below them all, [`sync`]: the lock-poison policy every module, leaves included, locks with.
//! Test-only code lives in the `kvd-testkit` crate (`testkit/`), or behind the `testkit`
//! feature, which only integration tests enable.

pub mod auth;
pub mod bbolt;
pub mod metrics;
pub mod mvcc;
pub mod proto;
pub mod raft;
pub mod server;
pub mod sync;
pub mod wal;
