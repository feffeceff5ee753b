//! Starting a member, the first stages of [`super::run`]: its directory and identity, its
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
use std::sync::Arc;

use openraft::SnapshotPolicy;
use tokio::net::TcpListener;

use super::config::{ClusterState, Config};
use super::identity::{self, Identity};
use super::tls::material::Material;
use super::ServerError;
use crate::raft::commit_hold::CommitWaits;
use crate::raft::links::Links;
use crate::raft::log_store::LogStore;
use crate::raft::network::{Channels, NetworkFactory};
use crate::raft::state_machine::StateMachine;
use crate::raft::{Member, Raft, RaftNode};

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
    if let Some(marker) = super::backup::etcd_dir::etcd_marker(&cfg.data_dir) {
        return Err(ServerError::Config(super::backup::etcd_dir::refusal(
            &cfg.data_dir,
            &marker,
        )));
    }
    let dir = cfg.data_dir.join("member");
    crate::wal::create_dir_durable(&crate::wal::RealFs, &dir)?;
    let tls = Material::load(cfg)?;
    let channels = Channels::for_member()
        .map_err(ServerError::Config)?
        .with_tls(tls.peer_client.clone());
    let (ident, fresh) = identity::load_or_create(cfg, &dir, &channels).await?;
    super::backup::stream::clean(&dir.join("backup"))?;
    let wal_dir = super::wal_home::wal_dir(cfg, &dir);
    let wal_lock = super::wal_home::claim(&wal_dir, &dir, &ident, &cfg.wal)?;
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

/// openraft's settings from the flags.
fn raft_config(cfg: &Config) -> Result<openraft::Config, ServerError> {
    openraft::Config {
        cluster_name: cfg.initial_cluster_token.clone(),
        heartbeat_interval: cfg.heartbeat.as_millis() as u64,
        // Campaign after [1.25E, 2E) of silence and grant votes after E, close to etcd's
        // [E, 2E) and E: openraft first waits out a leader lease of `max`, then a random
        // `min..max`. See docs/decisions/0003-election-timeout-range.md.
        election_timeout_min: cfg.election_timeout.as_millis() as u64 / 4,
        election_timeout_max: cfg.election_timeout.as_millis() as u64,
        enable_pre_vote: Some(true),
        // A restarted leader must win a new election: it replicates before its own fsync, so
        // after kill -9 it may lack entries its followers hold, and resuming its old term
        // could write different entries at the same (term, index).
        // See docs/decisions/0005-no-leader-restore.md.
        enable_leader_restore: Some(false),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_count),
        max_in_snapshot_log_to_keep: cfg.snapshot_catchup_entries,
        install_snapshot_timeout: 10_000,
        ..Default::default()
    }
    .validate()
    .map_err(ServerError::RaftConfig)
}

/// Opens the log and the state machine and starts Raft on them. A member of a new cluster
/// also proposes the bootstrap configuration.
pub async fn start_raft(
    cfg: &Config,
    member: &MemberDir,
    links: &Links,
) -> Result<RaftNode, ServerError> {
    use super::wal_home;
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
        super::corrupt::initial_check(&sm, &member.channels, member.ident.member_id).await?;
    }
    let commit_waits = CommitWaits::default();
    let network = NetworkFactory {
        channels: member.channels.clone(),
        links: links.clone(),
        commit_waits: commit_waits.clone(),
    };
    let raft = Raft::new(
        member.ident.member_id,
        Arc::new(raft_config(cfg)?),
        network,
        log.clone(),
        sm.clone(),
    )
    .await
    .map_err(ServerError::RaftStart)?;
    crate::raft::in_place::track_role(&raft, log.following());
    let node = RaftNode {
        id: member.ident.member_id,
        raft: raft.clone(),
        sm,
        log,
        channels: member.channels.clone(),
        leader_contact: Arc::new(std::sync::Mutex::new(std::time::Instant::now())),
        election_timeout: cfg.election_timeout,
        reads: Default::default(),
        commit_waits,
        forwarder: crate::raft::forward_batch::Forwarder::new(member.channels.clone()),
        formats: Default::default(),
    };
    if member.fresh && cfg.initial_cluster_state == ClusterState::New {
        initialize(raft, &member.ident);
    }
    Ok(node)
}

/// Proposes the bootstrap configuration, without waiting: openraft answers only once the
/// first entry is flushed, and this member's peer server must be up meanwhile for the other
/// members to reach it.
fn initialize(raft: Raft, ident: &Identity) {
    let members: BTreeMap<u64, Member> = ident
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
        .collect();
    tokio::spawn(async move {
        if let Err(e) = raft.initialize(members).await {
            // Every member of a new cluster initializes with the same config; a member that
            // already heard from a leader refuses, which is fine.
            tracing::debug!("initialize: {e}");
        }
    });
}
