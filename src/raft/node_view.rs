//! What the server may see of a member's Raft node and its replicated state, and the few
//! things it may ask of them besides proposing and reading (`node.rs`) and changing the
//! membership (`reconfigure.rs`): the state machine's stores, Raft's status without
//! openraft's types, a watch on leadership, and the steps of a stop.
//!
//! Invariants:
//! - Nothing here hands out openraft's types or the node's fields: the server names what it
//!   needs, so the node's insides can change without touching the server.
//! - The stores handed out (`auth`, `store`, `alarms`, `lessor`) are the applied state of this
//!   member; writes to them happen only by apply (and, for the lessor, by the leader's lease
//!   duties), never through these handles' callers.

use std::path::PathBuf;
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use openraft::metrics::RaftServerMetrics;
use openraft::type_config::alias::WatchReceiverOf;
use openraft::ServerState;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::RaftNode;
use crate::auth::AuthStore;
use crate::mvcc::{Events, MvccError, MvccStore};
use crate::proto::etcdserverpb::{RangeRequest, RangeResponse};
use crate::proto::kvdpb::peer_client::PeerClient;
use crate::raft::error::StoreError;
use crate::raft::sm::alarm_set::AlarmSet;
use crate::raft::sm::backup::BackupImage;
use crate::raft::sm::lessor::Lessor;
use crate::raft::sm::state_machine::Defragmented;
use crate::raft::sm::state_machine::MemberAttrs;
use crate::raft::types::{Fatal, Member, Membership, NodeId, TypeConfig};
use crate::wal::WalStats;

/// This member's role in Raft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Leader,
    Candidate,
    Follower,
    Learner,
    /// Raft has stopped.
    Shutdown,
}

impl From<ServerState> for Role {
    fn from(s: ServerState) -> Role {
        match s {
            ServerState::Leader => Role::Leader,
            ServerState::Candidate => Role::Candidate,
            ServerState::Follower => Role::Follower,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
        }
    }
}

/// A copy of Raft's state at one moment.
#[derive(Clone, Debug)]
pub struct RaftStatus {
    pub role: Role,
    pub leader: Option<NodeId>,
    pub term: u64,
    /// The last log index this member knows committed.
    pub committed: u64,
    pub applied: u64,
    pub last_log_index: u64,
    /// The configuration this member holds (the newest in its log, committed or not).
    pub membership: Membership,
}

impl RaftStatus {
    pub fn is_voter(&self, id: NodeId) -> bool {
        self.membership.voter_ids().any(|v| v == id)
    }
}

/// Leadership as it changes: role, term, leader and membership only (openraft's server
/// metrics), so a waiter is not woken by every append and apply.
pub struct LeadershipWatch {
    id: NodeId,
    rx: WatchReceiverOf<TypeConfig, RaftServerMetrics<TypeConfig>>,
}

impl LeadershipWatch {
    pub fn leader(&self) -> Option<NodeId> {
        self.rx.borrow_watched().current_leader
    }

    /// Whether this member is the leader (role and leader id agree).
    pub fn leading(&self) -> bool {
        let m = self.rx.borrow_watched();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// Whether the newest committed configuration names `id`, and whether there is one.
    pub fn committed_has(&self, id: NodeId) -> (bool, bool) {
        let m = self.rx.borrow_watched();
        let c = &m.committed_membership_config;
        (c.membership().get_node(&id).is_some(), c.log_id().is_some())
    }

    /// The newest committed configuration.
    pub fn committed_membership(&self) -> Membership {
        self.rx
            .borrow_watched()
            .committed_membership_config
            .membership()
            .clone()
    }

    /// Waits for the next change; false once Raft has stopped.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

impl RaftNode {
    /// The auth store as this member has applied it.
    pub fn auth(&self) -> &AuthStore {
        self.sm.auth()
    }

    /// The MVCC store as this member has applied it.
    pub fn store(&self) -> &MvccStore {
        self.sm.store()
    }

    pub fn alarms(&self) -> &AlarmSet {
        self.sm.alarms()
    }

    /// The leases; primary (answering keep-alives and expiring) only on the leader.
    pub fn lessor(&self) -> &Lessor {
        self.sm.lessor()
    }

    /// A range over the applied store, serializable: a linearizable read takes
    /// [`RaftNode::read_barrier`] first.
    pub async fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        self.sm.range(req).await
    }

    /// The leases the applied state holds, with their TTLs.
    pub async fn leases(&self) -> Result<Vec<(i64, i64)>, MvccError> {
        self.sm.leases().await
    }

    /// Waits until this member has applied `index`.
    pub async fn wait_applied(&self, index: u64) {
        self.sm.wait_applied(index).await
    }

    /// The store revision, updated after every applied batch.
    pub fn watch_revision(&self) -> watch::Receiver<i64> {
        self.sm.revision()
    }

    /// Events of the applied history (see `StateMachine::events_since`).
    pub async fn events_since(
        &self,
        start_rev: i64,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
        limit: usize,
    ) -> Result<Events, MvccError> {
        self.sm
            .events_since(start_rev, key, range_end, prev_kv, limit)
            .await
    }

    /// Why this member stopped applying (it needs a newer kvd), if it did.
    pub fn needs_upgrade(&self) -> Option<&str> {
        self.sm.needs_upgrade()
    }

    /// The cluster's log format as this member has applied it.
    pub fn cluster_format(&self) -> u32 {
        self.sm.cluster_format()
    }

    /// The directory of the engine generation in use.
    pub fn db_dir(&self) -> PathBuf {
        self.sm.db_dir()
    }

    /// A member's published name and client URLs; `None` until it has started.
    pub fn member_attrs(&self, id: NodeId) -> Result<Option<MemberAttrs>, StoreError> {
        self.sm.member_attrs(id)
    }

    /// The configuration the state machine has applied (what a restart starts from).
    pub fn applied_membership(&self) -> Result<Membership, StoreError> {
        Ok(self.sm.membership()?.membership().clone())
    }

    /// An image of the applied state for a backup.
    pub fn backup_image(&self) -> Result<BackupImage, StoreError> {
        self.sm.backup_image()
    }

    /// Defragments the engine (see `StateMachine::defragment`).
    pub async fn defragment(&self) -> Result<Defragmented, StoreError> {
        self.sm.defragment().await
    }

    pub fn wal_stats(&self) -> WalStats {
        self.log.wal().stats()
    }

    /// The durations of the WAL's most recent fsyncs (for Status's slow-disk warning).
    pub fn recent_fsyncs(&self) -> crate::metrics::RecentSummary {
        self.log.wal().recent_fsyncs()
    }

    /// A client of a peer's peer-protocol service.
    pub fn peer(&self, member: &Member) -> Result<PeerClient<Channel>, String> {
        self.channels.peer(member)
    }

    /// Whether this member can dial `url` (https needs peer TLS here).
    pub fn can_dial(&self, url: &str) -> bool {
        self.channels.can_dial(url)
    }

    /// Raft's state now.
    pub fn status(&self) -> RaftStatus {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        RaftStatus {
            role: m.state.into(),
            leader: m.current_leader,
            term: m.current_term,
            committed: m.local_committed.map_or(0, |l| l.index),
            applied: m.last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            membership: m.membership_config.membership().clone(),
        }
    }

    /// Whether this member leads now.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow_watched().current_leader == Some(self.id)
    }

    pub fn watch_leadership(&self) -> LeadershipWatch {
        LeadershipWatch {
            id: self.id,
            rx: self.raft.server_metrics(),
        }
    }

    /// Resolves when Raft stops without being asked to: openraft stops on a storage error (a
    /// WAL write or fsync, the state-machine database), and a member that cannot persist must
    /// not keep answering as if it could.
    pub async fn stopped(&self) -> Fatal {
        // The sender lives in openraft's core task: `changed` fails once the core has ended.
        let mut rx = self.raft.server_metrics();
        while rx.changed().await.is_ok() {}
        match &self.raft.metrics().borrow_watched().running_state {
            Err(e) => e.clone(),
            Ok(()) => Fatal::Stopped,
        }
    }

    /// Stops applying and stops Raft. Safe to call more than once.
    pub async fn stop_raft(&self) {
        self.begin_stop();
        // The streams' inputs end at `begin_stop`; openraft answers what it has and ends them.
        let mut open = self.open_streams.subscribe();
        let _ = tokio::time::timeout(
            std::time::Duration::from_millis(500),
            open.wait_for(|n| *n == 0),
        )
        .await;
        // An apply that stopped before an entry it cannot apply waits until the close.
        self.sm.close();
        // openraft 0.10.0-alpha.37: when a write waiting for a stopped core to be joined is
        // cancelled (our stop cancels writes in flight), the other waiters panic while holding
        // the core-state lock, and `shutdown` then panics on the poisoned lock. The core is gone
        // by then: nothing is left to stop, and the member goes on stopping.
        use futures::FutureExt;
        if std::panic::AssertUnwindSafe(self.raft.shutdown())
            .catch_unwind()
            .await
            .is_err()
        {
            tracing::warn!("Raft's core had already stopped; its shutdown panicked in openraft");
        }
    }

    /// This member's view of each other member of its configuration, from its RPCs to them
    /// (openraft's and the prober's): for operators' diagnosis (`kvctl endpoint diagnose`).
    pub fn peer_views(&self) -> Vec<PeerView> {
        let status = self.status();
        status
            .membership
            .nodes()
            .map(|(id, _)| *id)
            .filter(|id| *id != self.id)
            .map(|id| PeerView {
                id,
                reachable: self.links.is_up(id) && self.links.last_contact(id).is_some(),
                last_contact: self.links.last_contact(id),
            })
            .collect()
    }

    /// Marks the member as stopping, before its servers and Raft stop: peers are told so
    /// (and log it as a stop, not a fault), and their append streams end.
    pub fn begin_stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Whether the member is stopping ([`Self::begin_stop`]).
    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Counts an append stream as open until the guard is dropped (see [`Self::stop_raft`]).
    pub(crate) fn stream_opened(&self) -> OpenStream {
        self.open_streams.send_modify(|n| *n += 1);
        OpenStream(self.open_streams.clone())
    }

    /// Resolves once the member is stopping.
    pub(crate) fn when_stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stopping.subscribe();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// Runs `call`, a call into openraft, unless the member begins to stop first; then drops
    /// it and answers `None`. openraft logs a call whose core stops under it as an error, and
    /// the core stops only after [`Self::begin_stop`], so no such call is left by then.
    pub(crate) async fn unless_stopping<T>(
        &self,
        call: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        tokio::select! {
            // Stopping is looked at first: a task that runs again only once the core has
            // stopped must drop its call unpolled, or openraft logs the closed reply channel
            // it finds as an error (seen on graceful stops under load, tests/quiet_logs.rs).
            biased;
            () = self.when_stopping() => None,
            r = call => Some(r),
        }
    }

    /// After [`Self::stop_raft`]: writes what a restart reads first, the committed index and
    /// the applied state. Failures are logged; the WAL still holds everything.
    pub async fn persist_on_stop(&self) {
        if let Err(e) = self.log.flush_committed().await {
            tracing::warn!("could not persist the committed index: {e}");
        }
        if let Err(e) = self.sm.store().flush() {
            tracing::warn!("could not write applied state to the state-machine database: {e}");
        }
    }
}

/// An append stream being served; dropped with the stream.
pub(crate) struct OpenStream(Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// One member's view of one peer ([`RaftNode::peer_views`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerView {
    pub id: NodeId,
    /// The last RPC to it succeeded.
    pub reachable: bool,
    /// How long ago an RPC to it last succeeded; `None` if none did since this member started.
    pub last_contact: Option<std::time::Duration>,
}
