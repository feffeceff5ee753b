//! The client API: etcd's gRPC services (KV, Watch, Lease, Cluster, Maintenance, Auth, Lock,
//! Election), the one request path they and the member's own recipes share, and the client
//! port's dispatch with its size and learner guards. The JSON gateway (`super::gateway`) is an
//! in-process client of these same services.
//!
//! Invariants:
//! - Every KV request and lease grant, from any caller, goes through [`request_path`]: the
//!   same validation, quota, permissions and answer.
//! - A service reaches the replicated state only through `crate::raft::RaftNode`'s methods.

pub(crate) mod alarms;
pub(crate) mod auth;
pub(crate) mod client_cert;
pub(crate) mod client_dispatch;
pub(crate) mod cluster;
pub(crate) mod election;
pub(crate) mod kv;
pub(crate) mod learner;
pub(crate) mod lease;
pub(crate) mod local_client;
pub(crate) mod lock;
pub(crate) mod maintenance;
pub(crate) mod oversize;
pub(crate) mod request_path;
pub(crate) mod watch_hub;
pub(crate) mod watches;
