//! The Raft state machine: etcd's MVCC key space on the MVCC storage engine, plus Raft's own
//! apply metadata.
//!
//! Invariants:
//! - Data, last-applied log id, membership and member attributes of an applied batch reach
//!   the engine in ONE atomic batch (`MvccStore::apply` takes the metadata writes; the MVCC
//!   committer persists whole batches), so after a crash the engine is at some batch
//!   boundary, never between.
//! - The engine is not the source of truth and is not flushed per apply (an apply reaches it
//!   only with the MVCC committer's next persist, see `mvcc::pending`): on restart openraft
//!   re-applies from the engine's last-applied up to the durable committed index in the WAL.
//! - A snapshot is a point-in-time image of the engine taken on the state-machine task; no
//!   member keeps a copy of its store as a snapshot file. Building one (every
//!   `--snapshot-count` entries) only makes the engine durable up to the image, because
//!   openraft may purge the log below it right after. Sending one takes a new image of the
//!   current state and encodes it as the stream asks (`snapshot_data`). A received snapshot
//!   is written into an engine generation of its own as it arrives and switched to at the
//!   install (`staging`). No snapshot is ever held in memory.
//! - The lessor (in-memory lease expiries) hears of a batch's grants and revokes after the
//!   batch commits and before any of its proposers is answered.
//! - Installing a snapshot is crash-safe. A received one is a whole, durable engine
//!   generation before the durable switch to it (`staging`), so a crash leaves the old
//!   generation or the new one. A snapshot file (a restore's, or another member's in tests)
//!   is read through and checked first (only a loadable snapshot becomes the newest file), it
//!   is renamed into place durably next, then the trees are replaced by
//!   `MvccStore::load_from`, streaming from the file, which keeps its own marker until its
//!   last write (the meta tree with last-applied and membership); a restart that finds the
//!   marker (or an engine older than the newest snapshot) reinstalls from the file.
//! - Snapshot files (received, restored, or left by older versions) are written and removed
//!   under `snap_io` only. One is removed once the engine is durable past it: after its
//!   load, or at open when the engine is at least as new, and in both cases only after
//!   `make_engine_durable` (sled's own flush does not fsync everything).
//! - Readers through the state machine's read methods never see a half-installed snapshot:
//!   an install holds `install_gate` for writing from start to end.
//! - Active alarms are meta keys like the member attributes; `alarms` mirrors them (loaded at
//!   open and after every snapshot load) and decides apply-time refusals (see `alarm_set`).
//! - After a defragmentation's engine switch with an uncertain outcome (see `defrag`), every
//!   apply, snapshot image, install and defragmentation fails: nothing is written to an engine
//!   that may not be the current one on disk.
//! - So does the auth store (`auth/` meta keys, see `crate::auth::store`): a client write or
//!   auth change is checked at apply time against the identity and auth revision its entry
//!   carries, before alarms, so every member refuses the same entries (etcd's authApplierV3).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::auth::{AuthError, AuthStore, KeyCheck, META_AUTH_PREFIX};
use crate::mvcc::failpoint::crash_point;
use crate::mvcc::{
    Engine, EngineOptions, MvccError, MvccStore, StoreEngine, WriteRequest, WriteResponse,
};
use crate::proto::depth;
use crate::proto::etcdserverpb::{AlarmResponse, RangeRequest, RangeResponse};
use crate::proto::kvdpb::{
    internal_request, internal_response, AuthResponse, ErrorCode, InternalRequest,
    InternalResponse, MemberAttributes,
};
use crate::raft::codec::{decode, encode};
use crate::raft::error::StoreError;
use crate::raft::log_format::{self, LOG_FORMAT, OLDEST_LOG_FORMAT};
use crate::raft::sm::alarm_set::{AlarmSet, META_ALARM_PREFIX};
use crate::raft::sm::lessor::Lessor;
use crate::raft::sm::snapshot_data::{LiveSnapshot, Snapshot, SnapshotData};
use crate::raft::sm::snapshot_file;
use crate::raft::types::{
    Command, CommandResult, LogId, NodeId, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::sync::LockExt;
use crate::wal::{RealFs, WalFs};

pub(super) const META_LAST_APPLIED: &[u8] = b"raft/last_applied";
pub(super) const META_MEMBERSHIP: &[u8] = b"raft/membership";
const META_INSTALLING: &[u8] = b"raft/installing_snapshot";
const META_MEMBER_PREFIX: &str = "member/";
/// The cluster's log format (u32 little-endian); absent = format 1.
const META_CLUSTER_FORMAT: &[u8] = b"cluster/log_format";
/// `removed/<id>`: a member that was in a configuration and is not any more (etcd's
/// `members/removed`). Ids are never reused, so the mark is permanent.
const META_REMOVED_PREFIX: &str = "removed/";

/// A member's published attributes (etcd's `publish`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAttrs {
    pub name: String,
    pub client_urls: Vec<String>,
}

/// Shared state-machine handle: the apply task and every reader (KV service, watchers,
/// snapshot builder) hold one.
pub struct SmShared {
    pub mvcc: MvccStore,
    snap_dir: PathBuf,
    /// What snapshot files and engine generations are written, synced, renamed and removed
    /// through (`wal::durable`); the real file system outside tests.
    fs: Arc<dyn WalFs>,
    /// Serializes snapshot file I/O: a build, an install and a read of the newest snapshot
    /// may otherwise race (one removing the file another is about to read).
    snap_io: std::sync::Mutex<()>,
    /// Held for writing by a snapshot install, for reading by the readers of the state
    /// machine's methods: they see the state before the install or after it, never a mix.
    install_gate: tokio::sync::RwLock<()>,
    applied_tx: watch::Sender<u64>,
    /// The leader's lease expiry bookkeeping; apply tells it about grants and revokes.
    pub lessor: Lessor,
    /// The store revision after the last apply: watchers wake on it and read new events from
    /// the MVCC history (which holds the batch, in memory or in the engine, before this is
    /// sent).
    revision_tx: watch::Sender<i64>,
    /// The active alarms, as the applied state holds them.
    pub alarms: AlarmSet,
    /// Users, roles and permissions, as the applied state holds them, and simple tokens.
    pub auth: AuthStore,
    /// The current engine generation's directory (see `engine_dir`).
    db_dir: std::sync::Mutex<PathBuf>,
    /// Held for writing by a defragmentation; applies, snapshot builds and installs take it
    /// for reading first (see `defrag`).
    defrag_gate: Arc<tokio::sync::RwLock<()>>,
    /// The cluster's log format, as the applied state holds it.
    cluster_format: AtomicU32,
    /// Why this member stopped applying, once it met an entry it cannot apply.
    needs_upgrade: std::sync::OnceLock<String>,
    /// Set when the member stops: a stopped apply gives up waiting.
    closing: watch::Sender<bool>,
    /// Set by a defragmentation whose engine switch is uncertain: the switch's error, which
    /// every later write returns.
    refused: std::sync::Mutex<Option<(PathBuf, std::sync::Arc<std::io::Error>)>>,
}

#[derive(Clone)]
pub struct StateMachine {
    pub(super) shared: Arc<SmShared>,
}

impl StateMachine {
    /// The MVCC store itself. Reads through it are not held back by a snapshot install (the
    /// `range`/`leases` methods here are); it serves revisions, flushing and lease bookkeeping.
    pub fn store(&self) -> &MvccStore {
        &self.shared.mvcc
    }

    /// The leader's lease expiry tracking, fed by this state machine's applies.
    pub fn lessor(&self) -> &Lessor {
        &self.shared.lessor
    }

    /// Opens (or creates) the state machine under `dir` (`dir/db` for the MVCC engine,
    /// `dir/snap` for snapshot files) and repairs an interrupted snapshot install.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, EngineOptions::default())
    }

    /// Like [`open`](Self::open), with the engine opened with `engine` (its memory budget).
    pub fn open_with(dir: &Path, engine: EngineOptions) -> Result<Self, StoreError> {
        let fs: Arc<dyn WalFs> = Arc::new(RealFs);
        let snap_dir = dir.join("snap");
        crate::wal::create_dir_durable(fs.as_ref(), &snap_dir)?;
        let db_dir = crate::raft::sm::engine_dir::open_current(fs.as_ref(), dir)?;
        snapshot_file::remove_temporaries(fs.as_ref(), &snap_dir)?;
        let mvcc = MvccStore::open(StoreEngine::open_with(&db_dir, engine)?)?;
        let (applied_tx, _) = watch::channel(0);
        let (revision_tx, _) = watch::channel(mvcc.current_revision());
        let sm = StateMachine {
            shared: Arc::new(SmShared {
                mvcc,
                snap_dir,
                fs,
                snap_io: std::sync::Mutex::new(()),
                install_gate: tokio::sync::RwLock::new(()),
                lessor: Lessor::default(),
                applied_tx,
                revision_tx,
                alarms: AlarmSet::default(),
                auth: AuthStore::default(),
                db_dir: std::sync::Mutex::new(db_dir),
                defrag_gate: Arc::new(tokio::sync::RwLock::new(())),
                cluster_format: AtomicU32::new(OLDEST_LOG_FORMAT),
                needs_upgrade: std::sync::OnceLock::new(),
                closing: watch::channel(false).0,
                refused: std::sync::Mutex::new(None),
            }),
        };
        sm.repair_from_snapshot()?;
        sm.reload_alarms()?;
        sm.reload_auth()?;
        sm.reload_cluster_format()?;
        let applied = sm.last_applied()?.map_or(0, |l| l.index);
        sm.shared.applied_tx.send_replace(applied);
        Ok(sm)
    }

    fn repair_from_snapshot(&self) -> Result<(), StoreError> {
        // The legacy marker: set by versions whose load did not keep its own.
        let interrupted = self.shared.mvcc.load_interrupted()?
            || self.shared.mvcc.get_meta(META_INSTALLING)?.is_some();
        let Some((meta, path)) =
            snapshot_file::latest(self.shared.fs.as_ref(), &self.shared.snap_dir)?
        else {
            if interrupted {
                // Only a roll back to empty loads without a snapshot file.
                tracing::warn!("interrupted roll back of the state machine: redoing it");
                return self.load_snapshot(&SnapshotMeta::default(), std::iter::empty());
            }
            return Ok(());
        };
        let applied = self.last_applied()?;
        if interrupted || applied.map(|l| l.index) < meta.last_log_id.map(|l| l.index) {
            tracing::warn!(snapshot = %path.display(), interrupted, "state machine older than snapshot: reinstalling");
            self.load_snapshot_file(&meta, &path)?;
        }
        // What the engine holds now is at least as new as every file: none is needed once it
        // is durable (it may be only in the page cache: just loaded, or read back after the
        // process crashed).
        self.make_engine_durable()?;
        crash_point(self.shared.mvcc.engine())?;
        let _io = self.shared.snap_io.lock_or_recover();
        snapshot_file::remove_through(self.shared.fs.as_ref(), &self.shared.snap_dir, &meta)?;
        Ok(())
    }

    /// An error once writes are refused (see the module doc).
    pub(super) fn usable(&self) -> Result<(), StoreError> {
        match &*self.shared.refused.lock_or_recover() {
            None => Ok(()),
            Some((dir, source)) => Err(StoreError::SwitchUncertain {
                dir: dir.clone(),
                source: source.clone(),
            }),
        }
    }

    /// Refuses every write from now on with `e` (a [`StoreError::SwitchUncertain`]).
    pub(super) fn refuse_writes(&self, e: &StoreError) {
        if let StoreError::SwitchUncertain { dir, source } = e {
            *self.shared.refused.lock_or_recover() = Some((dir.clone(), source.clone()));
        }
    }

    /// Flushes the engine and fsyncs its files and directories (`engine_dir::sync_engine`):
    /// what must precede removing a snapshot file that the engine's state replaces.
    fn make_engine_durable(&self) -> Result<(), StoreError> {
        self.shared.mvcc.engine().flush()?;
        crate::raft::sm::engine_dir::sync_engine(self.shared.fs.as_ref(), &self.db_dir())?;
        Ok(())
    }

    /// Reloads the in-memory alarm set from the meta tree.
    fn reload_alarms(&self) -> Result<(), StoreError> {
        let stored = self.shared.mvcc.meta_scan(META_ALARM_PREFIX.as_bytes())?;
        self.shared.alarms.load(&stored);
        Ok(())
    }

    /// Reloads the auth store from the meta tree.
    fn reload_auth(&self) -> Result<(), StoreError> {
        let stored = self.shared.mvcc.meta_scan(META_AUTH_PREFIX.as_bytes())?;
        self.shared.auth.load(&stored);
        Ok(())
    }

    fn reload_cluster_format(&self) -> Result<(), StoreError> {
        let f = match self.shared.mvcc.get_meta(META_CLUSTER_FORMAT)? {
            Some(b) => u32::from_le_bytes(b.as_slice().try_into().map_err(|_| {
                StoreError::Inconsistent {
                    what: "cluster log format",
                    reason: format!("{} bytes", b.len()),
                }
            })?),
            None => OLDEST_LOG_FORMAT,
        };
        self.shared.cluster_format.store(f, Ordering::SeqCst);
        Ok(())
    }

    /// The cluster's log format: a leader proposes no entry that needs a newer one.
    pub fn cluster_format(&self) -> u32 {
        self.shared.cluster_format.load(Ordering::SeqCst)
    }

    /// Why this member stopped applying (it met a committed entry it cannot apply), if it did:
    /// it serves no reads or writes until it is restarted on a newer kvd, which applies the
    /// entry and goes on. It keeps its log and data, and takes part in Raft meanwhile.
    pub fn needs_upgrade(&self) -> Option<&str> {
        self.shared.needs_upgrade.get().map(String::as_str)
    }

    /// Applies a batch whose normal entries all decoded to requests this build applies
    /// (`decoded[i]` is entry i's request, `None` for blank and membership entries), in three
    /// phases: classify each entry ([`Self::classify`]), apply the batch's writes and metadata
    /// to the store in one step, and respond to each entry's proposer ([`respond`]) with the
    /// response itself, not its bytes.
    async fn apply_decoded(
        &mut self,
        batch: Vec<EntryResponder<TypeConfig>>,
        decoded: Vec<Option<InternalRequest>>,
    ) -> Result<(), io::Error> {
        // A defragmentation pauses applies (awaited: no runtime thread blocks).
        let _defrag = self.shared.defrag_gate.read().await;
        self.usable()?;
        let Some(last) = batch.last().map(|(e, _)| e.log_id()) else {
            return Ok(());
        };
        let _slow = SlowApply::start();

        let Classified {
            reqs,
            revoke_checks,
            slots,
            mut meta,
            membership,
            cluster_format,
        } = self.classify(&batch, decoded)?;

        // Apply: the writes and metadata together, so the engine holds whole batches.
        meta.push((META_LAST_APPLIED.to_vec(), Some(encode(&Some(last)))));
        if let Some(m) = &membership {
            meta.push((META_MEMBERSHIP.to_vec(), Some(encode(m))));
        }
        let mut revoke_refusals: Vec<Option<AuthError>> = vec![None; reqs.len()];
        let mut may_delete = |i: usize, key: &[u8]| match &revoke_checks[i] {
            None => true,
            Some(check) => match check.check(key, &[], true) {
                Ok(()) => true,
                Err(e) => {
                    revoke_refusals[i] = Some(e);
                    false
                }
            },
        };
        let mut results = self
            .shared
            .mvcc
            .apply_guarded(&reqs, &meta, &mut may_delete)
            .map_err(StoreError::from)?;
        let current = self.shared.mvcc.current_revision();
        if let Some(f) = cluster_format {
            self.shared.cluster_format.store(f, Ordering::SeqCst);
            tracing::info!(format = f, "the cluster's log format is now {f}");
        }
        // Before any responder fires: a client that got its grant can keep it alive at once.
        self.track_leases(&reqs, &results);

        // Respond.
        for ((_, responder), slot) in batch.into_iter().zip(slots) {
            let Some(responder) = responder else { continue };
            let resp = respond(slot, &mut results, &mut revoke_refusals, current);
            responder.send(CommandResult(resp));
        }
        self.shared.applied_tx.send_replace(last.index);
        self.shared.revision_tx.send_replace(current);
        Ok(())
    }

    /// The classify phase of an apply: what each entry of `batch` asks of the store, decided
    /// entry by entry at the auth, alarm and membership state that entry sees. Auth and alarm
    /// entries change their in-memory state here, in log order; MVCC writes are only
    /// collected, to be applied together.
    fn classify(
        &self,
        batch: &[EntryResponder<TypeConfig>],
        decoded: Vec<Option<InternalRequest>>,
    ) -> Result<Classified, StoreError> {
        let mut reqs = Vec::new();
        let mut revoke_checks: Vec<Option<KeyCheck>> = Vec::new();
        let mut slots: Vec<Slot> = Vec::with_capacity(batch.len());
        let mut meta = Vec::new();
        let mut membership: Option<StoredMembership> = None;
        let mut cluster_format = None;
        for ((entry, _), req) in batch.iter().zip(decoded) {
            let mut slot = Slot::Empty;
            match &entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(_) => {
                    let req = req.expect("a normal entry is decoded");
                    if let Err(e) = self.shared.auth.check_entry(&req) {
                        slots.push(Slot::Auth(Err(e)));
                        continue;
                    }
                    if let Some(refused) = self.shared.alarms.refusal(&req) {
                        slots.push(Slot::Refused(refused.0, refused.1));
                        continue;
                    }
                    if let Some(internal_request::Request::Auth(ar)) = &req.request {
                        let (res, writes) = self.shared.auth.apply(ar, entry.log_id().index);
                        meta.extend(writes);
                        slot = Slot::Auth(res);
                    } else if let Some(internal_request::Request::Alarm(ar)) = &req.request {
                        let (resp, write) = self.shared.alarms.apply(ar);
                        meta.extend(write);
                        slot = Slot::Alarm(resp);
                    } else if let Some(internal_request::Request::ClusterFormat(c)) = &req.request {
                        // Never lowered. A member that ran an older build when an earlier raise
                        // applied (and ignored it) catches up at the next one.
                        let f = c
                            .format
                            .max(cluster_format.unwrap_or_else(|| self.cluster_format()));
                        meta.push((META_CLUSTER_FORMAT.to_vec(), Some(f.to_le_bytes().to_vec())));
                        cluster_format = Some(f);
                    } else if let Some(internal_request::Request::Publish(MemberAttributes {
                        member_id,
                        name,
                        client_urls,
                    })) = &req.request
                    {
                        let attrs = MemberAttrs {
                            name: name.clone(),
                            client_urls: client_urls.clone(),
                        };
                        let key = format!("{META_MEMBER_PREFIX}{member_id:016x}");
                        meta.push((key.into_bytes(), Some(encode(&attrs))));
                    } else {
                        // Taken now, at this entry's auth state; asked when the revoke
                        // applies, at its place among the batch's writes.
                        let check = self.shared.auth.revoke_check(&req);
                        if let Some(w) = to_write_request(req) {
                            slot = Slot::Request(reqs.len());
                            reqs.push(w);
                            revoke_checks.push(check);
                        }
                    }
                }
                EntryPayload::Membership(m) => {
                    // Members of the previous configuration missing from this one are removed.
                    let prev = match &membership {
                        Some(p) => p.clone(),
                        None => self.membership()?,
                    };
                    let prev: Vec<NodeId> = prev.membership().nodes().map(|(id, _)| *id).collect();
                    for id in prev.into_iter().filter(|id| m.get_node(id).is_none()) {
                        let key = format!("{META_REMOVED_PREFIX}{id:016x}");
                        meta.push((key.into_bytes(), Some(Vec::new())));
                    }
                    membership = Some(StoredMembership::new(Some(entry.log_id()), m.clone()));
                }
            }
            slots.push(slot);
        }
        Ok(Classified {
            reqs,
            revoke_checks,
            slots,
            meta,
            membership,
            cluster_format,
        })
    }

    /// Tells the lessor which leases the batch's applied writes granted and revoked.
    fn track_leases(
        &self,
        reqs: &[WriteRequest],
        results: &[Result<WriteResponse, crate::mvcc::MvccError>],
    ) {
        for (req, res) in reqs.iter().zip(results) {
            match (req, res) {
                (WriteRequest::LeaseGrant(g), Ok(_)) => self.shared.lessor.granted(g.id, g.ttl),
                (WriteRequest::LeaseRevoke(r), Ok(_)) => self.shared.lessor.revoked(r.id),
                (WriteRequest::LeaseRevokeMany(ids), Ok(_)) => self.shared.lessor.revoked_all(ids),
                _ => {}
            }
        }
    }

    /// Stops applying before an entry this build cannot apply, until the member stops: the
    /// entry stays unapplied (a newer kvd applies it after a restart), never skipped.
    async fn stop_applying(&self, why: String) -> Result<(), io::Error> {
        tracing::error!("{why}");
        let _ = self.shared.needs_upgrade.set(why.clone());
        let mut closing = self.shared.closing.subscribe();
        let _ = closing.wait_for(|c| *c).await;
        Err(io::Error::other(why))
    }

    /// Ends a stopped apply's wait, as the member stops.
    pub fn close(&self) {
        self.shared.closing.send_replace(true);
    }

    /// The auth store (etcd's auth store).
    pub fn auth(&self) -> &AuthStore {
        &self.shared.auth
    }

    /// The active alarms (etcd's alarm store).
    pub fn alarms(&self) -> &AlarmSet {
        &self.shared.alarms
    }

    pub fn last_applied(&self) -> Result<Option<LogId>, StoreError> {
        match self.shared.mvcc.get_meta(META_LAST_APPLIED)? {
            Some(b) => decode("last applied", &b),
            None => Ok(None),
        }
    }

    pub fn membership(&self) -> Result<StoredMembership, StoreError> {
        match self.shared.mvcc.get_meta(META_MEMBERSHIP)? {
            Some(b) => decode("membership", &b),
            None => Ok(StoredMembership::default()),
        }
    }

    /// Published attributes of a member, if it has published.
    pub fn member_attrs(&self, id: NodeId) -> Result<Option<MemberAttrs>, StoreError> {
        let key = format!("{META_MEMBER_PREFIX}{id:016x}");
        match self.shared.mvcc.get_meta(key.as_bytes())? {
            Some(b) => Ok(Some(decode("member attributes", &b)?)),
            None => Ok(None),
        }
    }

    /// Whether `id` was a member and has been removed from the cluster.
    pub fn is_removed(&self, id: NodeId) -> Result<bool, StoreError> {
        let key = format!("{META_REMOVED_PREFIX}{id:016x}");
        Ok(self.shared.mvcc.get_meta(key.as_bytes())?.is_some())
    }

    /// Receiver of the last applied log index.
    pub fn applied_index(&self) -> watch::Receiver<u64> {
        self.shared.applied_tx.subscribe()
    }

    /// Receiver of the current store revision, updated after every applied batch.
    pub fn revision(&self) -> watch::Receiver<i64> {
        self.shared.revision_tx.subscribe()
    }

    /// Waits until the state machine has applied `index`.
    pub async fn wait_applied(&self, index: u64) {
        let mut rx = self.applied_index();
        // The sender lives as long as `self`, so this only ends when the index is reached.
        let _ = rx.wait_for(|&a| a >= index).await;
    }

    /// A range read of the state machine's key space (see `MvccStore::range`); never of a
    /// half-installed snapshot.
    pub async fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        let _installed = self.shared.install_gate.read().await;
        self.shared.mvcc.range(req)
    }

    /// Every lease as (id, granted TTL) (see `MvccStore::leases`); never of a half-installed
    /// snapshot.
    pub async fn leases(&self) -> Result<Vec<(i64, i64)>, MvccError> {
        let _installed = self.shared.install_gate.read().await;
        self.shared.mvcc.leases()
    }

    /// History events (see `MvccStore::events_since`); never of a half-installed snapshot.
    pub async fn events_since(
        &self,
        start_rev: i64,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
        limit: usize,
    ) -> Result<crate::mvcc::Events, MvccError> {
        let _installed = self.shared.install_gate.read().await;
        self.shared
            .mvcc
            .events_since(start_rev, key, range_end, prev_kv, limit)
    }

    /// Loads the snapshot file at `path` (of `meta`), after reading it through once: a file
    /// found damaged leaves the state as it was.
    fn load_snapshot_file(&self, meta: &SnapshotMeta, path: &Path) -> Result<(), StoreError> {
        snapshot_file::verify(path)?;
        let (_, entries) = snapshot_file::entries(path)?;
        self.load_snapshot(meta, entries)
    }

    /// A new snapshot file in the snapshot directory, written as a leader's bytes arrive
    /// (tests: a received snapshot is staged, see `staging`).
    #[cfg(test)]
    pub fn receive_snapshot(
        &self,
    ) -> Result<crate::raft::sm::snapshot_file_install::Incoming, StoreError> {
        crate::raft::sm::snapshot_file_install::Incoming::create(
            &self.shared.fs,
            &self.shared.snap_dir,
        )
    }

    /// Replaces the state with `entries`, crash-atomically (see `MvccStore::load_from`): a
    /// crash midway leaves a store that `open` reloads from the newest snapshot file.
    fn load_snapshot(
        &self,
        meta: &SnapshotMeta,
        entries: impl IntoIterator<Item = Result<snapshot_file::Entry, StoreError>>,
    ) -> Result<(), StoreError> {
        let mvcc = &self.shared.mvcc;
        // The dump carries the snapshot's own last-applied and membership; the meta's are
        // written over them, with the load's last write, in case the dump was taken by an
        // older layout.
        mvcc.load_from(entries, &snapshot_meta_writes(meta))?;
        self.loaded(meta)
    }

    /// What follows a snapshot's load or install: the state beside the store (leases, alarms,
    /// auth, cluster format) read from it, and the applied index and revision announced.
    fn loaded(&self, meta: &SnapshotMeta) -> Result<(), StoreError> {
        let mvcc = &self.shared.mvcc;
        self.shared.lessor.sync(&mvcc.leases()?);
        self.reload_alarms()?;
        self.reload_auth()?;
        self.reload_cluster_format()?;
        let applied = meta.last_log_id.map_or(0, |l| l.index);
        self.shared.applied_tx.send_replace(applied);
        self.shared
            .revision_tx
            .send_replace(mvcc.current_revision());
        Ok(())
    }
}

/// The meta writes that end a snapshot's load or staging: its last-applied log id and
/// membership, written over whatever the entries carried (a dump taken by an older layout may
/// lack them), and no install marker.
pub(crate) fn snapshot_meta_writes(meta: &SnapshotMeta) -> [(Vec<u8>, Option<Vec<u8>>); 3] {
    [
        (META_LAST_APPLIED.to_vec(), Some(encode(&meta.last_log_id))),
        (
            META_MEMBERSHIP.to_vec(),
            Some(encode(&meta.last_membership)),
        ),
        (META_INSTALLING.to_vec(), None),
    ]
}

/// What applying one entry answers its proposer.
enum Slot {
    /// Nothing to apply (blank, membership, publish): the current revision.
    Empty,
    /// The result of `reqs[i]`.
    Request(usize),
    /// An alarm entry's answer.
    Alarm(AlarmResponse),
    /// An auth change's result, or a request the auth store refused at apply time.
    Auth(Result<Option<String>, AuthError>),
    /// Refused at apply time by an active alarm, with etcd's error.
    Refused(ErrorCode, &'static str),
}

/// etcd's warning threshold for one apply (`warnApplyDuration`).
const SLOW_APPLY: std::time::Duration = std::time::Duration::from_millis(100);

/// Counts an apply that took longer than [`SLOW_APPLY`] in `etcd_server_slow_apply_total`
/// when dropped. etcd times each request; kvd applies a batch in one step, so a slow batch
/// counts once, whatever the number of requests in it.
struct SlowApply(std::time::Instant);

impl SlowApply {
    fn start() -> SlowApply {
        SlowApply(std::time::Instant::now())
    }
}

impl Drop for SlowApply {
    fn drop(&mut self) {
        if self.0.elapsed() > SLOW_APPLY {
            crate::metrics::SLOW_APPLY.inc();
        }
    }
}

/// What a batch's entries ask of the store ([`StateMachine::classify`]).
struct Classified {
    /// The MVCC writes, in log order.
    reqs: Vec<WriteRequest>,
    /// Per write: the revoke permission check taken at its entry's auth state.
    revoke_checks: Vec<Option<KeyCheck>>,
    /// Per entry: what its proposer is answered.
    slots: Vec<Slot>,
    /// Metadata written with the batch (auth, alarms, member attributes, removals, format).
    meta: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The batch's last membership entry, if any.
    membership: Option<StoredMembership>,
    /// The cluster log format the batch raises to, if it does.
    cluster_format: Option<u32>,
}

/// Decodes a log entry's command with the bound every member applies ([`depth::LOG_LIMIT`]).
///
/// Requests are validated (and their nesting bounded) before they are proposed, so a failure
/// means an entry written by a newer kvd (or damaged in a way its checksum missed): the member
/// stops applying there ([`decode_applicable`]) rather than skip it, which would make its data
/// differ from that of members that apply it.
/// The requests of the normal entries of `batch` (`None` for blank and membership entries), up
/// to the first entry this build cannot apply, and why it cannot.
fn decode_applicable(
    batch: &[EntryResponder<TypeConfig>],
) -> (Vec<Option<InternalRequest>>, Option<String>) {
    let mut out = Vec::with_capacity(batch.len());
    for (entry, _) in batch {
        let EntryPayload::Normal(cmd) = &entry.payload else {
            out.push(None);
            continue;
        };
        let index = entry.log_id().index;
        let req = match decode_command(cmd) {
            Ok(req) => req,
            Err(e) => {
                let why = format!(
                    "this member stopped applying at log entry {index}: it does not decode ({e}); \
                     a newer kvd wrote it, or it is damaged. Restart this member on the kvd \
                     version the other members run (this is kvd {} with log format \
                     {LOG_FORMAT}); it keeps its data and log meanwhile",
                    env!("CARGO_PKG_VERSION")
                );
                return (out, Some(why));
            }
        };
        let needed = log_format::needed(&req);
        if needed > LOG_FORMAT {
            let why = format!(
                "this member stopped applying at log entry {index}: it needs a kvd that applies \
                 log format {needed}, and this is kvd {} with log format {LOG_FORMAT}. Restart \
                 this member on the kvd version the other members run; it keeps its data and \
                 log meanwhile",
                env!("CARGO_PKG_VERSION")
            );
            return (out, Some(why));
        }
        out.push(Some(req));
    }
    (out, None)
}

fn decode_command(cmd: &Command) -> Result<InternalRequest, String> {
    if !depth::within(&cmd.0, depth::LOG_LIMIT) {
        return Err(format!("nested deeper than {} levels", depth::LOG_LIMIT));
    }
    InternalRequest::decode(cmd.0.clone()).map_err(|e| e.to_string())
}

/// Maps a decoded request to the MVCC write it applies, if any.
fn to_write_request(req: InternalRequest) -> Option<WriteRequest> {
    use internal_request::Request as R;
    match req.request? {
        R::Put(p) => Some(WriteRequest::Put(p)),
        R::DeleteRange(d) => Some(WriteRequest::DeleteRange(d)),
        R::Txn(t) => Some(WriteRequest::Txn(t)),
        R::Compaction(c) => Some(WriteRequest::Compact(c)),
        R::LeaseGrant(g) => Some(WriteRequest::LeaseGrant(g)),
        R::LeaseRevoke(r) => Some(WriteRequest::LeaseRevoke(r)),
        R::LeaseRevokeMany(r) => Some(WriteRequest::LeaseRevokeMany(r.ids)),
        R::Publish(_) | R::Alarm(_) | R::Auth(_) | R::ClusterFormat(_) => None,
    }
}

/// The answer to one entry's proposer: its slot's outcome, with the write's result taken
/// out of `results` and a revoke refused by auth told as auth's error.
fn respond(
    slot: Slot,
    results: &mut [Result<WriteResponse, crate::mvcc::MvccError>],
    revoke_refusals: &mut [Option<AuthError>],
    current: i64,
) -> InternalResponse {
    match slot {
        Slot::Empty => InternalResponse {
            response: None,
            revision: current,
            ..Default::default()
        },
        Slot::Alarm(a) => InternalResponse {
            response: Some(internal_response::Response::Alarm(a)),
            revision: current,
            ..Default::default()
        },
        Slot::Auth(Ok(token)) => InternalResponse {
            response: Some(internal_response::Response::Auth(AuthResponse {
                token: token.unwrap_or_default(),
            })),
            revision: current,
            ..Default::default()
        },
        Slot::Auth(Err(e)) => InternalResponse {
            response: Some(internal_response::Response::Error(e.to_string())),
            revision: current,
            error_code: e.kind() as i32,
        },
        Slot::Refused(code, msg) => InternalResponse {
            response: Some(internal_response::Response::Error(msg.to_string())),
            revision: current,
            error_code: code as i32,
        },
        Slot::Request(i) => match std::mem::replace(
            &mut results[i],
            Err(crate::mvcc::MvccError::corrupt("taken")),
        ) {
            Ok(w) => {
                let (r, rev) = to_internal_response(w);
                InternalResponse {
                    response: Some(r),
                    revision: rev,
                    ..Default::default()
                }
            }
            Err(e) => {
                let kind = match (&e, revoke_refusals[i].take()) {
                    (crate::mvcc::MvccError::RevokeRefused, Some(a)) => (a.to_string(), a.kind()),
                    _ => (e.to_string(), e.kind()),
                };
                InternalResponse {
                    response: Some(internal_response::Response::Error(kind.0)),
                    revision: current,
                    error_code: kind.1 as i32,
                }
            }
        },
    }
}

fn to_internal_response(r: WriteResponse) -> (internal_response::Response, i64) {
    use internal_response::Response as R;
    let revision = r.header().map_or(0, |h| h.revision);
    let response = match r {
        WriteResponse::Put(p) => R::Put(p),
        WriteResponse::DeleteRange(d) => R::DeleteRange(d),
        WriteResponse::Txn(t) => R::Txn(t),
        WriteResponse::Compact(c) => R::Compaction(c),
        WriteResponse::LeaseGrant(g) => R::LeaseGrant(g),
        WriteResponse::LeaseRevoke(r) => R::LeaseRevoke(r),
    };
    (response, revision)
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.last_applied()?, self.membership()?))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        let mut batch = Vec::new();
        while let Some(item) = entries.next().await {
            batch.push(item?);
        }
        // Refused even with nothing to apply (checked again under the defragment gate).
        self.usable()?;
        // The entries up to the first one this build cannot apply, decoded.
        let (decoded, stop) = decode_applicable(&batch);
        batch.truncate(decoded.len());
        if batch.is_empty() {
            return match stop {
                Some(why) => self.stop_applying(why).await,
                None => Ok(()),
            };
        }
        let applied = self.apply_decoded(batch, decoded).await;
        match stop {
            Some(why) if applied.is_ok() => self.stop_applying(why).await,
            _ => applied,
        }
    }

    async fn try_create_snapshot_builder(&mut self, _force: bool) -> Option<Self::SnapshotBuilder> {
        Some(self.get_snapshot_builder().await)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let image = self.image().await;
        SnapshotBuilder {
            sm: self.clone(),
            image: Some(image),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        match snapshot {
            // Received from a leader: already in an engine generation of its own.
            SnapshotData::Staged(staged) => Ok(self.install_staged(meta, *staged).await?),
            // Only tests hand over anything else (`install_file`): kvd sends live snapshots and
            // receives them staged.
            #[cfg(test)]
            other => self.install_unstaged(meta, other).await,
            #[cfg(not(test))]
            SnapshotData::Live(live) => Err(io::Error::other(format!(
                "{live:?} is sent, never installed: a snapshot is installed once received"
            ))),
        }
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        // The current state, not the last built one: a follower that needs a snapshot gets
        // what the leader holds now, read from the engine as it is sent (`snapshot_data`).
        let (meta, image) = self.image().await?;
        if meta.last_log_id.is_none() {
            return Ok(None);
        }
        Ok(Some(Snapshot {
            snapshot: SnapshotData::Live(LiveSnapshot::new(meta.clone(), image)),
            meta,
        }))
    }
}

type Image = (SnapshotMeta, crate::mvcc::Image);

impl StateMachine {
    /// An image of the state machine at its last applied entry, with that entry's meta.
    /// Called on the state-machine task, so no apply interleaves with taking it; the history
    /// itself is read later, while applies go on (see `mvcc::Image`).
    async fn image(&self) -> Result<Image, StoreError> {
        let _defrag = self.shared.defrag_gate.read().await;
        self.usable()?;
        let meta = SnapshotMeta {
            last_log_id: self.last_applied()?,
            last_membership: self.membership()?,
        };
        Ok((meta, self.shared.mvcc.image()?))
    }
}

pub struct SnapshotBuilder {
    sm: StateMachine,
    image: Option<Result<Image, StoreError>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    /// Makes the engine durable up to the image, so that openraft may purge the log below it;
    /// nothing is copied (see the module doc). Files of snapshots the engine is now past
    /// (received, restored, or from an older version) are removed.
    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let (meta, image) = self
            .image
            .take()
            .ok_or_else(|| io::Error::other("snapshot builder used twice"))??;
        let shared = self.sm.shared.clone();
        let file_meta = meta.clone();
        // A flush of a large engine takes a while: at a low priority (see `background`).
        crate::raft::sm::background::run("snapshot", move || -> Result<_, StoreError> {
            let t0 = std::time::Instant::now();
            // Taking the image persisted the pending buffer; this makes it durable. It is
            // this member's snapshot save, as etcd's fsync of its `.snap` file is.
            let synced = crate::metrics::timed(&crate::metrics::SNAP_FSYNC_SECONDS);
            synced(shared.mvcc.engine().flush())?;
            let _io = shared.snap_io.lock_or_recover();
            snapshot_file::remove_through(shared.fs.as_ref(), &shared.snap_dir, &file_meta)?;
            tracing::debug!(
                index = file_meta.last_log_id.map_or(0, |l| l.index),
                flush_ms = t0.elapsed().as_millis() as u64,
                "snapshot point: engine flushed"
            );
            Ok(())
        })
        .await??;
        Ok(Snapshot {
            snapshot: SnapshotData::Live(LiveSnapshot::new(meta.clone(), image)),
            meta,
        })
    }
}

/// Runs `f`, which blocks for long, without holding up the other tasks of this worker: on the
/// multi-threaded runtime they move to another thread meanwhile (kvd may run one worker).
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Holds `etcd_server_snapshot_apply_in_progress_total` at 1 while a received snapshot is
/// loaded; back to 0 when dropped, so an install that fails does not leave it set.
struct ApplyingSnapshot;

impl ApplyingSnapshot {
    fn start() -> Self {
        crate::metrics::SNAPSHOT_APPLY_IN_PROGRESS.store(1, std::sync::atomic::Ordering::Relaxed);
        ApplyingSnapshot
    }
}

impl Drop for ApplyingSnapshot {
    fn drop(&mut self) {
        crate::metrics::SNAPSHOT_APPLY_IN_PROGRESS.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

#[path = "defrag.rs"]
mod defrag;
pub use defrag::Defragmented;

#[path = "staging.rs"]
mod staging;

#[cfg(test)]
#[path = "install_file.rs"]
mod install_file;
pub use staging::{StagedSnapshot, Stager};

#[cfg(test)]
#[path = "apply_tests.rs"]
mod apply_tests;

#[cfg(test)]
#[path = "install_tests.rs"]
mod install_tests;

#[cfg(test)]
#[path = "determinism_tests.rs"]
mod determinism_tests;
