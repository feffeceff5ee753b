//! Starting a member, the first stages of [`crate::server::run`]: its directory and identity, its
//! listeners, and its storage under a running Raft node.
//!
//! Invariants:
//! - `member/` is durable before anything inside it is trusted to be.
//! - Every listener is bound before any state changes, so a port clash is a clear error on a
//!   member that has not touched its data dir.
//! - The state machine is never ahead of the log when Raft starts: a state machine that
//!   applied entries the log lost (a power loss after sled's own flush) is rolled back first.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::net::TcpListener;

use crate::raft::log::log_store::LogStore;
use crate::raft::net::links::Links;
use crate::raft::net::network::Channels;
use crate::raft::sm::state_machine::StateMachine;
use crate::raft::{Member, RaftNode, RaftSettings};
use crate::server::config::{ClusterState, Config};
use crate::server::lifecycle::identity::{self, Identity};
use crate::server::tls::material::Material;
use crate::server::ServerError;

/// A member's directory and who it is.
pub struct MemberDir {
    /// `<data-dir>/member`.
    pub dir: PathBuf,
    pub ident: Identity,
    /// The identity was created by this start (an empty data dir).
    pub fresh: bool,
    /// The WAL's directory, and its lock, held while the member runs.
    pub wal_dir: PathBuf,
    _wal_lock: std::fs::File,
    pub channels: Channels,
    /// TLS configs of the listeners (the peer client's is inside `channels`).
    pub tls: Material,
}

impl MemberDir {
    /// Where backups for clients are written before they are streamed (emptied at start).
    pub fn backup_dir(&self) -> PathBuf {
        self.dir.join("backup")
    }
}

/// Makes `member/` durable and loads (or creates) the member's identity.
pub async fn open_member(cfg: &Config) -> Result<MemberDir, ServerError> {
    if let Some(marker) = crate::server::backup::etcd_dir::etcd_marker(&cfg.data_dir) {
        return Err(ServerError::Config(
            crate::server::backup::etcd_dir::refusal(&cfg.data_dir, &marker),
        ));
    }
    let dir = cfg.data_dir.join("member");
    crate::wal::create_dir_durable(&crate::wal::RealFs, &dir)?;
    let tls = Material::load(cfg)?;
    let channels = Channels::for_member()
        .map_err(ServerError::Config)?
        .with_tls(tls.peer_client.clone());
    let (ident, fresh) = identity::load_or_create(cfg, &dir, &channels).await?;
    crate::server::backup::stream::clean(&dir.join("backup"))?;
    let wal_dir = crate::server::lifecycle::wal_home::wal_dir(cfg, &dir);
    let wal_lock = crate::server::lifecycle::wal_home::claim(&wal_dir, &dir, &ident, &cfg.wal)?;
    tracing::info!(
        name = %cfg.name,
        member_id = %format!("{:x}", ident.member_id),
        cluster_id = %format!("{:x}", ident.cluster_id),
        data_dir = %cfg.data_dir.display(),
        "starting member"
    );
    Ok(MemberDir {
        dir,
        ident,
        fresh,
        wal_dir,
        _wal_lock: wal_lock,
        channels,
        tls,
    })
}

/// The member's bound sockets, one per `--listen-*` URL.
pub struct Listeners {
    pub peer: Vec<TcpListener>,
    pub client: Vec<TcpListener>,
    pub metrics: Vec<TcpListener>,
}

impl Listeners {
    pub async fn bind(cfg: &Config) -> Result<Self, ServerError> {
        Ok(Listeners {
            peer: bind_all(&cfg.listen_peer).await?,
            client: bind_all(&cfg.listen_client).await?,
            metrics: bind_all(&cfg.listen_metrics).await?,
        })
    }
}

async fn bind_all(addrs: &[SocketAddr]) -> Result<Vec<TcpListener>, ServerError> {
    let mut out = Vec::with_capacity(addrs.len());
    for addr in addrs {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Listen {
                addr: *addr,
                source,
            })?;
        out.push(l);
    }
    Ok(out)
}

/// The Raft settings the flags give.
fn raft_settings(cfg: &Config) -> RaftSettings {
    RaftSettings {
        cluster_name: cfg.initial_cluster_token.clone(),
        heartbeat: cfg.heartbeat,
        election_timeout: cfg.election_timeout,
        snapshot_count: cfg.snapshot_count,
        snapshot_catchup_entries: cfg.snapshot_catchup_entries,
    }
}

/// Opens the log and the state machine and starts Raft on them. A member of a new cluster
/// also proposes the bootstrap configuration.
pub async fn start_raft(
    cfg: &Config,
    member: &MemberDir,
    links: &Links,
) -> Result<RaftNode, ServerError> {
    use crate::server::lifecycle::wal_home;
    let sm = StateMachine::open_with(&member.dir.join("sm"), cfg.engine)?;
    let applied = sm.last_applied()?;
    let wal = &member.wal_dir;
    // Before opening the log, which would write a first segment into an empty directory.
    wal_home::check_not_lost(wal, !cfg.wal.has_segments(wal)?, applied)?;
    let log = LogStore::open_on(wal, &cfg.wal)?;
    wal_home::check_not_lost(wal, log.holds_nothing(), applied)?;
    wal_home::name(wal, member.ident.cluster_id, member.ident.member_id)?;
    log.set_cache_bytes(cfg.raft_log_cache_bytes);
    if cfg.force_new_cluster && !member.fresh {
        crate::raft::force_new_cluster::force_new_cluster(&log, &sm, member.ident.member_id)
            .await?;
    }
    // Before Raft applies anything or any client is served, as etcd checks before it starts.
    // A new member has nothing to compare; a forced new cluster has no peers to ask.
    if cfg.initial_corrupt_check && !member.fresh && !cfg.force_new_cluster {
        crate::server::duties::corrupt::initial_check(
            &sm,
            &member.channels,
            member.ident.member_id,
        )
        .await?;
    }
    let node = RaftNode::start(
        member.ident.member_id,
        &raft_settings(cfg),
        log,
        sm,
        &member.channels,
        links,
    )
    .await?;
    if member.fresh && cfg.initial_cluster_state == ClusterState::New {
        node.initialize(initial_members(&member.ident));
    }
    Ok(node)
}

/// The bootstrap configuration of a new cluster.
fn initial_members(ident: &Identity) -> BTreeMap<u64, Member> {
    ident
        .initial_members
        .iter()
        .map(|(id, urls)| {
            (
                *id,
                Member {
                    peer_urls: urls.clone(),
                },
            )
        })
        .collect()
}
