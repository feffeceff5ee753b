//! Raft: openraft's type config, the WAL-backed log store, the MVCC state machine,
//! snapshot files, the peer network (client and server, with per-peer health in `links`,
//! typed failure causes in `peer_error`, and commit indexes that ride on the next write in
//! `commit_hold`), the peer prober and the node glue that proposes writes and serves
//! read-index barriers.

pub mod alarm_set;
pub mod background;
pub mod backup;
pub mod cluster_format;
pub mod commit_hold;
pub mod dial;
#[cfg(feature = "testkit")]
pub mod dial_override;
pub mod engine_dir;
pub mod error;
pub mod force_new_cluster;
pub mod forward_batch;
pub mod in_place;
pub mod lessor;
pub mod limits;
pub mod links;
pub mod log_format;
pub mod log_store;
pub mod network;
pub mod node;
pub mod peer_error;
pub mod peer_service;
pub mod prober;
pub mod read_batch;
pub mod snapshot_data;
pub mod snapshot_file;
pub mod snapshot_format;
pub mod snapshot_stream;
pub mod state_machine;
pub mod types;

pub use error::{ProposeError, StoreError};
pub use node::RaftNode;
pub use types::{Fatal, Member, NodeId, Raft, TypeConfig};

#[cfg(test)]
mod commit_hold_tests;
#[cfg(test)]
mod storage_suite;
