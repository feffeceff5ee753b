//! Raft: openraft's type config and the node that proposes writes and serves read-index
//! barriers, over three parts in their own folders:
//! - [`log`]: the Raft log on the WAL;
//! - [`sm`]: the replicated state machine (MVCC store, alarms, leases, snapshots, backups);
//! - [`net`]: the peer transport (openraft's RPCs, dialing, link health, forwarded writes).
//!
//! Order, lowest first (a module uses only modules before it; tests/layering.rs checks the
//! folders): the leaves `types`, `codec`, `error`, `limits`, `log_format`; then `sm` and `log`
//! (independent of each other); then `net`; then the node (`node`, `node_view`, `start`,
//! `reconfigure`, `cluster_format`, `read_batch`, `force_new_cluster`) with the serving side
//! of the peer protocol (`peer_service`) and the prober that drive it.
//!
//! The server uses the node's methods (`node_view`, `reconfigure`), not its fields, and no
//! openraft type leaves this layer.

pub(crate) mod cluster_format;
pub(crate) mod codec;
pub(crate) mod error;
pub(crate) mod force_new_cluster;
pub mod limits;
pub(crate) mod log;
pub mod log_format;
pub mod net;
pub(crate) mod node;
mod node_view;
pub(crate) mod peer_service;
pub(crate) mod prober;
pub(crate) mod read_batch;
mod reconfigure;
pub mod sm;
mod start;
pub mod types;

pub use error::{ProposeError, StoreError};
pub use node::{Raft, RaftNode};
pub use node_view::{LeadershipWatch, PeerView, RaftStatus, Role};
pub use reconfigure::{quorum, ReconfigError};
pub use start::{ConfigError, RaftSettings, StartError};
pub use types::{Fatal, Member, NodeId, TypeConfig};

#[cfg(test)]
mod storage_suite;
