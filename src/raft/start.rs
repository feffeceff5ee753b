//! Starting Raft on a member's opened log and state machine: openraft's settings from etcd's
//! flags, and the node the server then talks to.
//!
//! Invariants:
//! - A restarted leader must win a new election (`enable_leader_restore` off): it replicates
//!   before its own fsync, so after kill -9 it may lack entries its followers hold, and
//!   resuming its old term could write different entries at the same (term, index)
//!   (docs/decisions/0005-no-leader-restore.md).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::SnapshotPolicy;

use super::RaftNode;
use crate::raft::log::log_store::LogStore;
use crate::raft::net::commit_hold::CommitWaits;
use crate::raft::net::links::Links;
use crate::raft::net::network::{Channels, NetworkFactory};
use crate::raft::node::Raft;
use crate::raft::sm::state_machine::StateMachine;
use crate::raft::types::{Fatal, Member, NodeId};

/// openraft's refusal of the settings.
pub type ConfigError = openraft::ConfigError;

/// The Raft settings etcd's flags give.
#[derive(Clone, Debug)]
pub struct RaftSettings {
    /// `--initial-cluster-token`.
    pub cluster_name: String,
    pub heartbeat: Duration,
    pub election_timeout: Duration,
    /// `--snapshot-count`: entries applied between two snapshots.
    pub snapshot_count: u64,
    /// Entries kept behind a snapshot for slow followers.
    pub snapshot_catchup_entries: u64,
}

/// Why Raft did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The settings are ones openraft refuses.
    #[error("raft: {0}")]
    Config(#[from] ConfigError),
    /// openraft could not start on the stored state.
    #[error("raft: {0}")]
    Start(#[source] Fatal),
}

impl RaftSettings {
    fn openraft(&self) -> Result<openraft::Config, ConfigError> {
        openraft::Config {
            cluster_name: self.cluster_name.clone(),
            heartbeat_interval: self.heartbeat.as_millis() as u64,
            // Campaign after [1.25E, 2E) of silence and grant votes after E, close to etcd's
            // [E, 2E) and E: openraft first waits out a leader lease of `max`, then a random
            // `min..max`. See docs/decisions/0003-election-timeout-range.md.
            election_timeout_min: self.election_timeout.as_millis() as u64 / 4,
            election_timeout_max: self.election_timeout.as_millis() as u64,
            enable_pre_vote: Some(true),
            enable_leader_restore: Some(false),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_count),
            max_in_snapshot_log_to_keep: self.snapshot_catchup_entries,
            install_snapshot_timeout: 10_000,
            ..Default::default()
        }
        .validate()
    }

    /// Checks the settings without starting anything.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.openraft().map(|_| ())
    }
}

impl RaftNode {
    /// Starts Raft as member `id` on `log` and `sm`.
    pub async fn start(
        id: NodeId,
        settings: &RaftSettings,
        log: LogStore,
        sm: StateMachine,
        channels: &Channels,
        links: &Links,
    ) -> Result<RaftNode, StartError> {
        let commit_waits = CommitWaits::default();
        let network = NetworkFactory {
            channels: channels.clone(),
            links: links.clone(),
            commit_waits: commit_waits.clone(),
        };
        let raft = Raft::new(
            id,
            Arc::new(settings.openraft()?),
            network,
            log.clone(),
            sm.clone(),
        )
        .await
        .map_err(StartError::Start)?;
        crate::raft::log::in_place::track_role(raft.server_metrics(), log.following());
        Ok(RaftNode {
            id,
            raft,
            sm,
            log,
            channels: channels.clone(),
            leader_contact: Arc::new(std::sync::Mutex::new(std::time::Instant::now())),
            election_timeout: settings.election_timeout,
            reads: Default::default(),
            commit_waits,
            forwarder: crate::raft::net::forward_batch::Forwarder::new(channels.clone()),
            formats: Default::default(),
            stopping: Arc::new(tokio::sync::watch::channel(false).0),
            open_streams: Arc::new(tokio::sync::watch::channel(0).0),
            links: links.clone(),
        })
    }

    /// Proposes the bootstrap configuration of a new cluster, without waiting: openraft
    /// answers only once the first entry is flushed, and this member's peer server must be up
    /// meanwhile for the other members to reach it.
    pub fn initialize(&self, members: BTreeMap<NodeId, Member>) {
        let raft = self.raft.clone();
        tokio::spawn(async move {
            if let Err(e) = raft.initialize(members).await {
                // Every member of a new cluster initializes with the same config; a member
                // that already heard from a leader refuses, which is fine.
                tracing::debug!("initialize: {e}");
            }
        });
    }
}
