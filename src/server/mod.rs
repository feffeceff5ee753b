//! The kvd server: opens a member's storage, starts Raft, and serves the etcd v3 API to
//! clients and the peer protocol to other members until told to stop.
//!
//! Data dir layout (like etcd's `member/`):
//! ```text
//! <data-dir>/member/member.json  identity: format version, member id, cluster id, name
//! <data-dir>/member/wal/         write-ahead log segments (the source of truth), or the
//!                                directory `--wal-dir` names (`wal_home`)
//! <data-dir>/member/sm/db/       sled: MVCC key space + apply metadata (rebuilt from WAL);
//!                                after a defragmentation `sm/db.N/`, named by `sm/db.current`
//! <data-dir>/member/sm/snap/     Raft snapshot files
//! ```

pub mod alarms;
pub mod auth;
pub mod backup;
pub mod client_cert;
mod client_dispatch;
pub mod cluster;
mod compactor;
pub mod config;
pub mod config_compat;
pub mod config_env;
pub mod config_file;
pub mod config_gates;
pub mod config_tls;
pub mod context;
pub mod corrupt;
mod defrag;
mod downgrade;
pub mod election;
pub mod error;
pub mod gateway;
pub mod identity;
pub mod kv;
mod leader_duties;
pub mod learner;
pub mod lease;
pub mod local_client;
pub mod lock;
pub mod maintenance;
pub mod membership;
pub mod observe;
pub mod oversize;
pub mod quota;
mod reconfig_check;
mod request_path;
pub mod tls;
pub mod version;
pub mod watch_hub;
pub mod watches;

mod serve;
mod start;
mod stop;
pub mod wal_home;

use std::future::Future;
use std::net::SocketAddr;

use crate::raft::links::Links;
use config::Config;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Config(String),
    #[error("listen tcp {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open data dir: {0}")]
    Storage(#[from] crate::raft::StoreError),
    /// The flags give openraft settings it refuses.
    #[error("raft: {0}")]
    RaftConfig(#[from] openraft::ConfigError),
    /// openraft could not start on the stored state.
    #[error("raft: {0}")]
    RaftStart(#[source] crate::raft::Fatal),
    /// Raft stopped on its own, on a storage error (a WAL write or fsync, the state-machine
    /// database): the member exits rather than answer as if it could persist.
    #[error("raft: {0}")]
    RaftStopped(#[source] crate::raft::Fatal),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Certificates, keys, CAs or CRLs that cannot be used.
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
    /// The initial corruption check found a peer with another hash at the same revision and
    /// compaction (etcd's message).
    #[error("{0}")]
    Inconsistent(String),
    /// The WAL directory is another member's, in use, or not where this member's log is
    /// (`wal_home`).
    #[error("{0}")]
    WalMismatch(String),
}

/// Runs a member until `shutdown` resolves, then stops gracefully (a leader hands leadership
/// over first). The stages are [`start`] (identity, listeners, storage and Raft), [`serve`]
/// (every server and background duty) and [`stop`] (what ends a member, and the order in which
/// it lets go).
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    let member = start::open_member(&cfg).await?;
    // Bind before the storage opens, so a port clash is a clear error before any state
    // changes.
    let listeners = start::Listeners::bind(&cfg).await?;
    let links = Links::default();
    let node = start::start_raft(&cfg, &member, &links).await?;
    let serving = serve::serve(&cfg, &member, &node, links, listeners);
    let initial_member = member.ident.initial_members.contains_key(&node.id);
    let reason = stop::wait_for_stop(&node, initial_member, &serving, shutdown).await;
    stop::shut_down(&node, serving, reason).await
}
