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

pub(crate) mod api;
pub mod backup;
pub mod config;
pub(crate) mod context;
pub(crate) mod duties;
pub(crate) mod error;
pub(crate) mod gateway;
mod lifecycle;
pub(crate) mod membership;
pub(crate) mod observe;
pub mod tls;
pub mod version;

use std::future::Future;
use std::net::SocketAddr;

use crate::raft::net::links::Links;
use config::Config;
use lifecycle::{serve, start, stop};

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
    /// The flags give Raft settings it refuses, or Raft could not start on the stored state.
    #[error(transparent)]
    RaftStart(#[from] crate::raft::StartError),
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
    let links = Links::for_member(member.ident.member_id);
    let node = start::start_raft(&cfg, &member, &links).await?;
    let serving = serve::serve(&cfg, &member, &node, links, listeners);
    let initial_member = member.ident.initial_members.contains_key(&node.id);
    let reason = stop::wait_for_stop(&node, initial_member, &serving, shutdown).await;
    stop::shut_down(&node, serving, reason).await
}
