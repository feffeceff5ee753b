//! kvd: an etcd-compatible, Raft-replicated key-value store.
pub mod mvcc;
pub mod proto;
