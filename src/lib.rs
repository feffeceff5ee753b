//! kvd: an etcd-compatible, Raft-replicated key-value store.
//!
//! Layers, bottom up: [`wal`] (fsynced write-ahead log), [`mvcc`] (etcd's revisioned key space
//! on sled), [`raft`] (openraft on the WAL and the MVCC state machine, peer network), [`server`]
//! (the etcd v3 gRPC services). [`config`] is the validated flag set; [`diskcheck`] measures a disk's fsync latency; [`metrics`] serves Prometheus metrics
//! and `/health`. [`linearizability`] checks histories recorded by test clients.

pub mod config;
pub mod diskcheck;
pub mod lease;
pub mod linearizability;
pub mod metrics;
pub mod mvcc;
pub mod proto;
pub mod raft;
pub mod server;
pub mod wal;
