//! kvd: an etcd-compatible, Raft-replicated key-value store.
pub mod proto;
pub mod wal;
