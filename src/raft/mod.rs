//! Raft: openraft's type config, the WAL-backed log store, the MVCC state machine,
//! snapshot files, the peer network (client and server, with per-peer health in `links`,
//! typed failure causes in `peer_error`, and commit indexes that ride on the next write in
//! `commit_hold`), the peer prober and the node glue that proposes writes and serves
//! read-index barriers.

pub mod alarm_set;
pub(crate) mod background;
pub(crate) mod backup;
pub(crate) mod cluster_format;
pub(crate) mod commit_hold;
pub mod dial;
#[cfg(feature = "testkit")]
pub mod dial_override;
pub(crate) mod engine_dir;
pub(crate) mod error;
pub(crate) mod force_new_cluster;
pub(crate) mod forward_batch;
pub(crate) mod in_place;
pub mod lessor;
pub mod limits;
pub(crate) mod links;
pub mod log_format;
pub(crate) mod log_store;
pub(crate) mod network;
pub(crate) mod node;
mod node_view;
pub(crate) mod peer_error;
pub(crate) mod peer_service;
pub(crate) mod prober;
pub(crate) mod read_batch;
mod reconfigure;
pub(crate) mod snapshot_data;
pub mod snapshot_file;
pub(crate) mod snapshot_format;
pub(crate) mod snapshot_stream;
mod start;
pub(crate) mod state_machine;
pub mod types;

pub use error::{ProposeError, StoreError};
pub use node::RaftNode;
pub use node_view::{LeadershipWatch, RaftStatus, Role};
pub use reconfigure::{quorum, ReconfigError};
pub use start::{ConfigError, RaftSettings, StartError};
pub use types::{Fatal, Member, NodeId, Raft, TypeConfig};

#[cfg(test)]
mod commit_hold_tests;
#[cfg(test)]
mod storage_suite;
