//! The etcd v3 Watch service.
//!
//! # Design
//! Like etcd, a stream's watchers are either *synced* or *unsynced*. Synced watchers are at
//! the stream's frontier: the [`Hub`] reads each new revision's events from the MVCC store
//! once and broadcasts them, and the stream looks up each event's key among its synced
//! watchers (a hash map for single keys, a list for ranges), so a write costs one store scan
//! per member, not one per watcher. Unsynced watchers (a `start_revision` in the past, or a
//! stream that fell more than the hub's buffer behind) each keep their own cursor and read
//! their events from the MVCC history until they reach the frontier, then join the synced
//! ones. Nothing here is on the write path: apply only bumps a revision channel.
//!
//! One task per gRPC stream owns all of that stream's watchers and is the only producer of
//! its responses. It wakes on requests, on hub batches, on the progress ticker and (with
//! `hasleader=true`) on the leader check ticker.
//!
//! # Invariants
//! - A watcher's cursor (the stream frontier for synced ones) only grows, and every matching
//!   event below it has been sent (or dropped by the watcher's filters): no gaps, no
//!   duplicates, revision order. A watcher joins the synced set only when its cursor lies
//!   within a batch (it takes that batch's events from its cursor on) or equals the frontier.
//! - A batch that does not start at the stream's frontier (the stream lagged the hub) or is
//!   `lost` turns every synced watcher unsynced at the frontier before anything else.
//! - All events of one revision go into one response (hub batches and `events_since` never
//!   split a revision); only `fragment` watchers may split a response, flagging every part
//!   but the last with `fragment: true`.
//! - A watcher's created response precedes its events and its canceled response follows
//!   them, because one task produces all of a stream's responses in order.
//! - The work done between two looks at the incoming requests is bounded: one hub batch, or
//!   at most [`EVENTS_PER_READ`] events (plus the rest of the last revision) per unsynced
//!   watcher.
//! - With auth enabled, a watcher delivers only events its creator may read now: whenever the
//!   auth revision changes (a role or permission revoked, a user deleted, auth enabled), the
//!   stream re-checks every watcher's range against its creator before it delivers another
//!   event, and cancels the ones no longer readable with etcd's permission-denied reason. A
//!   watcher created while auth was disabled has no creator: on the re-check it takes the
//!   identity the stream's credentials give then (a client certificate's CN; a token from
//!   before auth was enabled is never valid), as a new create would.
//! - Memory is bounded: the response channel holds [`STREAM_BUFFER`] responses, the hub
//!   [`HUB_BUFFER`](crate::server::api::watch_hub::HUB_BUFFER) batches. A client that stops reading fills
//!   the channel; its stream then drops its hub subscription before it waits (so the hub
//!   retains nothing on its behalf), blocks nothing else, and when the client reads again
//!   subscribes anew and its watchers catch up from the store, as after a lag.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use prost::Message;
use tokio::sync::{broadcast, mpsc};
use tokio::time::{interval_at, Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::AuthInfo;
use crate::mvcc::MvccError;
use crate::proto::etcdserverpb::watch_create_request::FilterType;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::proto::etcdserverpb::watch_server::Watch;
use crate::proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use crate::proto::mvccpb::{event::EventType, Event};
use crate::server::api::watch_hub::{Batch, Hub, PrevKvInterest};
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;

/// Events one unsynced watcher reads per pass (a revision is never split, so a pass can
/// return more).
pub const EVENTS_PER_READ: usize = 1000;

/// Responses buffered per stream before its task waits for the client to read.
const STREAM_BUFFER: usize = 16;

/// etcd cancels a `hasleader` stream after this many election timeouts without a leader.
const MAX_NO_LEADER_CHECKS: u32 = 3;

/// etcd's watch id for responses that belong to no watcher (progress responses, failed
/// creates).
pub const INVALID_WATCH_ID: i64 = -1;

/// etcd's cancel reasons for a create request it refuses (mvcc's ErrEmptyWatcherRange and
/// ErrWatcherDuplicateID); they travel in `cancel_reason`, not as a gRPC status.
const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

pub struct WatchService {
    ctx: ServerCtx,
    /// How often watchers that asked for progress notifications get one while idle.
    progress_interval: Duration,
    /// Started by the first watch call (it needs the runtime).
    hub: OnceLock<Arc<Hub>>,
}

impl WatchService {
    pub fn new(ctx: ServerCtx, progress_interval: Duration) -> Self {
        WatchService {
            ctx,
            progress_interval,
            hub: OnceLock::new(),
        }
    }
}

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = ReceiverStream<Result<WatchResponse, Status>>;

    async fn watch(
        &self,
        req: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let require_leader = req
            .metadata()
            .get("hasleader")
            .and_then(|v| v.to_str().ok())
            == Some("true");
        self.ctx.check_leader(req.metadata())?;
        let hub = self.hub.get_or_init(|| Hub::start(&self.ctx)).clone();
        let (frontier, batches) = hub.subscribe().ok_or(ApiError::Stopped)?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let stream = WatchStream {
            md: req.metadata().clone(),
            ext: req.extensions().clone(),
            ctx: self.ctx.clone(),
            hub,
            tx,
            watchers: BTreeMap::new(),
            synced_keys: HashMap::new(),
            synced_ranges: BTreeSet::new(),
            unsynced: BTreeSet::new(),
            frontier,
            batches: Some(batches),
            next_auto_id: 0,
            deferred_progress: false,
            auth_revision: self.ctx.node.auth().watch_revision(),
        };
        tokio::spawn(stream.run(req.into_inner(), self.progress_interval, require_leader));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// etcd's cancel reason of a watch refused by auth: `rpctypes.ErrGRPCPermissionDenied.Error()`.
const PERMISSION_DENIED_REASON: &str =
    "rpc error: code = PermissionDenied desc = etcdserver: permission denied";

struct Watcher {
    /// Who created it, checked again when the auth state changes; `None` if auth was
    /// disabled then.
    user: Option<String>,
    key: Vec<u8>,
    /// etcd's: empty for one key, "\0" for every key from `key` on.
    range_end: Vec<u8>,
    /// The next revision to deliver while unsynced (a synced watcher's is the frontier).
    next: i64,
    synced: bool,
    /// Keeps the hub reading `prev_kv` while this watcher lives.
    prev_kv: Option<PrevKvInterest>,
    no_put: bool,
    no_delete: bool,
    fragment: bool,
    progress_notify: bool,
    /// Events were sent since the last progress tick; etcd notifies only idle watchers.
    active: bool,
}

impl Watcher {
    fn contains(&self, k: &[u8]) -> bool {
        crate::mvcc::range_contains(&self.key, &self.range_end, k)
    }

    /// The event as this watcher delivers it, or `None` if its filters drop it.
    fn deliver(&self, e: &Event) -> Option<Event> {
        let put = e.r#type == EventType::Put as i32;
        if put && self.no_put || !put && self.no_delete {
            return None;
        }
        let mut e = e.clone();
        if self.prev_kv.is_none() {
            e.prev_kv = None;
        }
        Some(e)
    }
}

fn rev_of(e: &Event) -> i64 {
    e.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

/// The client is gone (or the stream must end); the task stops.
struct Gone;

struct WatchStream {
    /// The stream's credentials (token, client certificate), for each create's auth check.
    md: tonic::metadata::MetadataMap,
    ext: http::Extensions,
    ctx: ServerCtx,
    hub: Arc<Hub>,
    tx: mpsc::Sender<Result<WatchResponse, Status>>,
    watchers: BTreeMap<i64, Watcher>,
    /// Synced single-key watchers by key.
    synced_keys: HashMap<Vec<u8>, Vec<i64>>,
    /// Synced prefix / range / from-key watchers.
    synced_ranges: BTreeSet<i64>,
    unsynced: BTreeSet<i64>,
    /// The next revision the hub will send this stream: synced watchers' cursor.
    frontier: i64,
    /// The hub's batches; `None` while the client does not read (see [`Self::send`]).
    batches: Option<broadcast::Receiver<Arc<Batch>>>,
    next_auto_id: i64,
    /// A progress request arrived while some watcher was behind; answer once none is.
    deferred_progress: bool,
    /// The auth store's revision: a change means the watchers' permissions are re-checked.
    auth_revision: tokio::sync::watch::Receiver<u64>,
}

impl WatchStream {
    async fn run(
        mut self,
        mut inbound: Streaming<WatchRequest>,
        progress_interval: Duration,
        require_leader: bool,
    ) {
        let mut progress = interval_at(Instant::now() + progress_interval, progress_interval);
        progress.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let election = self.ctx.node.election_timeout;
        let mut leader_check = interval_at(Instant::now() + election, election);
        leader_check.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut no_leader_checks = 0;
        // etcd keeps serving after the client half-closes; only the response side ends it.
        let mut inbound_open = true;
        loop {
            // Back from a stall: the batches published meanwhile were not received; the
            // synced watchers take them from the store, as after a lag.
            if self.batches.is_none() {
                let Some((frontier, b)) = self.hub.subscribe() else {
                    let _ = self.tx.send(Err(ApiError::Stopped.into())).await;
                    return;
                };
                if frontier > self.frontier {
                    self.desync_all();
                    self.frontier = frontier;
                }
                self.batches = Some(b);
            }
            if self.recheck_if_auth_changed().await.is_err() {
                return;
            }
            let behind = match self.sync().await {
                Ok(b) => b,
                Err(Gone) => return,
            };
            let Some(batches) = self.batches.as_mut() else {
                // The client stalled again during the catch-up; subscribe when it reads.
                continue;
            };
            let step = tokio::select! {
                biased;
                _ = self.tx.closed() => return,
                m = inbound.next(), if inbound_open => match m {
                    Some(Ok(req)) => self.handle(req).await,
                    // A broken request stream means the client is gone.
                    Some(Err(_)) => return,
                    None => {
                        inbound_open = false;
                        Ok(())
                    }
                },
                _ = leader_check.tick(), if require_leader => {
                    if self.ctx.node.has_leader() {
                        no_leader_checks = 0;
                        Ok(())
                    } else {
                        no_leader_checks += 1;
                        if no_leader_checks >= MAX_NO_LEADER_CHECKS {
                            let _ = self.tx.send(Err(ApiError::NoLeader.into())).await;
                            return;
                        }
                        Ok(())
                    }
                },
                _ = progress.tick() => self.progress_tick().await,
                // The sender lives as long as the state machine, which this stream holds.
                r = self.auth_revision.changed() => match r {
                    Ok(()) => self.recheck_auth().await,
                    Err(_) => return,
                },
                b = batches.recv() => match b {
                    Ok(batch) => self.on_batch(&batch).await,
                    // The gap shows when the next batch does not start at the frontier.
                    Err(broadcast::error::RecvError::Lagged(_)) => Ok(()),
                    // The store is gone: the member is stopping.
                    Err(broadcast::error::RecvError::Closed) => {
                        let _ = self.tx.send(Err(ApiError::Stopped.into())).await;
                        return;
                    }
                },
                // Some watcher is still catching up: another pass, after looking at requests.
                _ = std::future::ready(()), if behind => Ok(()),
            };
            if step.is_err() {
                return;
            }
        }
    }

    /// Queues a response. A client that does not read fills the queue: the stream then lets
    /// go of the hub before it waits, so the hub's buffer does not keep every batch published
    /// while it waits (with large values, hundreds of MiB); [`Self::run`] subscribes again once
    /// the client reads.
    async fn send(&mut self, resp: WatchResponse) -> Result<(), Gone> {
        match self.tx.try_send(Ok(resp)) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Gone),
            Err(mpsc::error::TrySendError::Full(resp)) => {
                self.batches = None;
                self.tx.send(resp).await.map_err(|_| Gone)
            }
        }
    }

    fn response(&self, revision: i64, watch_id: i64) -> WatchResponse {
        WatchResponse {
            header: self.ctx.header(revision),
            watch_id,
            ..Default::default()
        }
    }

    /// The watcher's cursor: the next revision it has to deliver.
    fn next_of(&self, w: &Watcher) -> i64 {
        if w.synced {
            self.frontier
        } else {
            w.next
        }
    }

    fn make_synced(&mut self, id: i64) {
        let Some(w) = self.watchers.get_mut(&id) else {
            return;
        };
        self.unsynced.remove(&id);
        if w.synced {
            return;
        }
        w.synced = true;
        if w.range_end.is_empty() {
            self.synced_keys.entry(w.key.clone()).or_default().push(id);
        } else {
            self.synced_ranges.insert(id);
        }
    }

    /// Takes the watcher out of the synced indexes (if it is there); returns it.
    fn unindex(&mut self, id: i64) -> Option<&mut Watcher> {
        let w = self.watchers.get_mut(&id)?;
        if w.synced {
            w.synced = false;
            w.next = self.frontier;
            if w.range_end.is_empty() {
                if let Some(ids) = self.synced_keys.get_mut(&w.key) {
                    ids.retain(|i| *i != id);
                    if ids.is_empty() {
                        self.synced_keys.remove(&w.key);
                    }
                }
            } else {
                self.synced_ranges.remove(&id);
            }
        }
        Some(w)
    }

    fn make_unsynced(&mut self, id: i64) {
        if self.unindex(id).is_some() {
            self.unsynced.insert(id);
        }
    }

    fn remove(&mut self, id: i64) -> bool {
        self.unindex(id);
        self.unsynced.remove(&id);
        self.watchers.remove(&id).is_some()
    }

    /// Every synced watcher becomes unsynced at the frontier (the stream missed batches).
    fn desync_all(&mut self) {
        let ids: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.synced)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.make_unsynced(id);
        }
    }

    async fn handle(&mut self, req: WatchRequest) -> Result<(), Gone> {
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
            Some(RequestUnion::CancelRequest(c)) => {
                // etcd answers only cancels of watchers that exist.
                if self.remove(c.watch_id) {
                    let mut r = self.response(self.ctx.current_revision(), c.watch_id);
                    r.canceled = true;
                    self.send(r).await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                // Linearizable, as etcd made it in 3.5/3.6 (kube-apiserver's consistent reads
                // from its watch cache rely on it): the answer is not older than any write
                // acknowledged before the request, even on a follower that has yet to apply
                // it. With no leader there is no such revision to report, so no answer.
                if let Err(e) = self.ctx.node.read_barrier().await {
                    tracing::debug!("progress request unanswered: {e}");
                    return Ok(());
                }
                if self.all_synced() {
                    self.send_progress().await
                } else {
                    self.deferred_progress = true;
                    Ok(())
                }
            }
            None => Ok(()),
        }
    }

    /// Re-checks the watchers if the auth state changed since they were last checked.
    async fn recheck_if_auth_changed(&mut self) -> Result<(), Gone> {
        if self.auth_revision.has_changed().unwrap_or(false) {
            self.recheck_auth().await?;
        }
        Ok(())
    }

    /// Cancels every watcher whose creator may no longer read its range, as a create would be
    /// refused (same cancel reason); watchers without a creator take the stream's identity.
    async fn recheck_auth(&mut self) -> Result<(), Gone> {
        self.auth_revision.borrow_and_update();
        if !self.ctx.node.auth().is_enabled() {
            return Ok(());
        }
        let stream_user = if self.watchers.values().any(|w| w.user.is_none()) {
            match self.ctx.auth_info(&self.md, &self.ext).await {
                Ok(ai) => ai.map(|ai| ai.username),
                Err(_) => None,
            }
        } else {
            None
        };
        let auth = self.ctx.node.auth();
        let mut refused = Vec::new();
        for (id, w) in self.watchers.iter_mut() {
            if w.user.is_none() {
                w.user.clone_from(&stream_user);
            }
            let ai = w.user.as_ref().map(|username| AuthInfo {
                username: username.clone(),
                revision: auth.revision(),
            });
            if auth
                .check_op(ai.as_ref(), &w.key, &w.range_end, false)
                .is_err()
            {
                refused.push(*id);
            }
        }
        for id in refused {
            self.remove(id);
            tracing::debug!(
                watch_id = id,
                "watch cancelled: its creator may no longer read it"
            );
            let mut r = self.response(self.ctx.current_revision(), id);
            r.canceled = true;
            r.cancel_reason = PERMISSION_DENIED_REASON.into();
            self.send(r).await?;
        }
        if self.deferred_progress && self.all_synced() {
            self.send_progress().await?;
        }
        Ok(())
    }

    async fn create(&mut self, c: WatchCreateRequest) -> Result<(), Gone> {
        let cur = self.ctx.current_revision();
        // etcd: an empty key means the smallest key, "\0".
        let key = if c.key.is_empty() { vec![0] } else { c.key };
        let from_key = c.range_end == [0];
        // etcd's isWatchPermitted: read on the whole range; a refusal (or a bad token) cancels
        // the watch with the full status text of permission denied, under the requested id.
        let (permitted, user) = match self.ctx.auth_info(&self.md, &self.ext).await {
            Ok(ai) => {
                let ai = ai.unwrap_or_default();
                let auth = self.ctx.node.auth();
                let permitted = auth.check_op(Some(&ai), &key, &c.range_end, false).is_ok();
                let user = auth.is_enabled().then_some(ai.username);
                (permitted, user)
            }
            Err(_) => (false, None),
        };
        if !permitted {
            let mut r = self.response(cur, c.watch_id);
            r.created = true;
            r.canceled = true;
            r.cancel_reason = PERMISSION_DENIED_REASON.into();
            return self.send(r).await;
        }
        let refused = if !c.range_end.is_empty() && !from_key && key >= c.range_end {
            Some(EMPTY_RANGE)
        } else if c.watch_id != 0 && self.watchers.contains_key(&c.watch_id) {
            Some(DUPLICATE_ID)
        } else {
            None
        };
        if let Some(reason) = refused {
            let mut r = self.response(cur, INVALID_WATCH_ID);
            r.created = true;
            r.canceled = true;
            r.cancel_reason = reason.into();
            return self.send(r).await;
        }
        // etcd's AutoWatchID is 0: a zero id asks the server to pick the lowest free one.
        let id = if c.watch_id != 0 {
            c.watch_id
        } else {
            while self.watchers.contains_key(&self.next_auto_id) {
                self.next_auto_id += 1;
            }
            self.next_auto_id += 1;
            self.next_auto_id - 1
        };
        let has = |f: FilterType| c.filters.contains(&(f as i32));
        let next = if c.start_revision == 0 {
            cur + 1
        } else {
            c.start_revision
        };
        self.watchers.insert(
            id,
            Watcher {
                user,
                key,
                range_end: c.range_end,
                next,
                synced: false,
                prev_kv: c.prev_kv.then(|| self.hub.want_prev_kv()),
                no_put: has(FilterType::Noput),
                no_delete: has(FilterType::Nodelete),
                fragment: c.fragment,
                progress_notify: c.progress_notify,
                active: false,
            },
        );
        if next == self.frontier {
            self.make_synced(id);
        } else {
            self.unsynced.insert(id);
        }
        let mut r = self.response(cur, id);
        r.created = true;
        self.send(r).await
    }

    fn all_synced(&self) -> bool {
        let cur = self.ctx.current_revision();
        self.watchers.values().all(|w| self.next_of(w) > cur)
    }

    async fn send_progress(&mut self) -> Result<(), Gone> {
        self.deferred_progress = false;
        let r = self.response(self.ctx.current_revision(), INVALID_WATCH_ID);
        self.send(r).await
    }

    /// etcd's periodic progress notification: to each synced watcher that asked for it and
    /// got no events since the previous tick.
    async fn progress_tick(&mut self) -> Result<(), Gone> {
        let cur = self.ctx.current_revision();
        let frontier = self.frontier;
        let mut due = Vec::new();
        for (id, w) in self.watchers.iter_mut() {
            let next = if w.synced { frontier } else { w.next };
            if w.progress_notify && !w.active && next > cur {
                due.push(*id);
            }
            w.active = false;
        }
        for id in due {
            self.send(self.response(cur, id)).await?;
        }
        Ok(())
    }

    /// Delivers one hub batch to the synced watchers, and to the unsynced ones whose cursor
    /// lies within it (they join the synced set).
    async fn on_batch(&mut self, b: &Batch) -> Result<(), Gone> {
        // The batch may hold events written after a permission change not seen yet.
        self.recheck_if_auth_changed().await?;
        if b.from != self.frontier || b.lost {
            self.desync_all();
        }
        if !b.prev_kv {
            // Read without prev_kv: watchers that want it take these revisions from the store.
            let want: Vec<i64> = self
                .watchers
                .iter()
                .filter(|(_, w)| w.synced && w.prev_kv.is_some())
                .map(|(id, _)| *id)
                .collect();
            for id in want {
                self.make_unsynced(id);
            }
        }
        let mut out: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
        for e in &b.events {
            let Some(kv) = &e.kv else { continue };
            let ids = self.synced_keys.get(&kv.key).into_iter().flatten();
            let ranges = self
                .synced_ranges
                .iter()
                .filter(|id| self.watchers.get(id).is_some_and(|w| w.contains(&kv.key)));
            for id in ids.chain(ranges) {
                if let Some(ev) = self.watchers.get(id).and_then(|w| w.deliver(e)) {
                    out.entry(*id).or_default().push(ev);
                }
            }
        }
        if !b.lost {
            let joining: Vec<i64> = self
                .unsynced
                .iter()
                .filter(|id| {
                    self.watchers.get(id).is_some_and(|w| {
                        b.from <= w.next && w.next <= b.to && (b.prev_kv || w.prev_kv.is_none())
                    })
                })
                .copied()
                .collect();
            for id in joining {
                let w = &self.watchers[&id];
                let evs: Vec<Event> = b
                    .events
                    .iter()
                    .filter(|e| rev_of(e) >= w.next)
                    .filter(|e| e.kv.as_ref().is_some_and(|kv| w.contains(&kv.key)))
                    .filter_map(|e| w.deliver(e))
                    .collect();
                if !evs.is_empty() {
                    out.insert(id, evs);
                }
                self.make_synced(id);
            }
        }
        self.frontier = self.frontier.max(b.to);
        for (id, events) in out {
            let Some(w) = self.watchers.get_mut(&id) else {
                continue;
            };
            w.active = true;
            let fragment = w.fragment;
            // At least the revision of the events sent, as etcd's header is.
            let mut r = self.response(self.ctx.current_revision(), id);
            r.events = events;
            self.send_events(r, fragment).await?;
        }
        if self.deferred_progress && self.all_synced() {
            self.send_progress().await?;
        }
        Ok(())
    }

    /// One pass over the unsynced watchers behind the frontier: each reads and sends its
    /// next batch of events from the store; one that reaches the frontier joins the synced
    /// set. Returns whether some watcher is still behind.
    async fn sync(&mut self) -> Result<bool, Gone> {
        let mvcc = self.ctx.node.store().clone();
        let ids: Vec<i64> = self
            .unsynced
            .iter()
            .filter(|id| {
                self.watchers
                    .get(id)
                    .is_some_and(|w| w.next < self.frontier)
            })
            .copied()
            .collect();
        let mut behind = false;
        for id in ids {
            // The store may hold events written after a permission change not seen yet.
            self.recheck_if_auth_changed().await?;
            let Some(w) = self.watchers.get_mut(&id) else {
                continue;
            };
            let prev_kv = w.prev_kv.is_some();
            let read = self
                .ctx
                .node
                .events_since(w.next, &w.key, &w.range_end, prev_kv, EVENTS_PER_READ)
                .await;
            match read {
                Ok(read) => {
                    w.next = read.next_revision;
                    let events: Vec<Event> =
                        read.events.iter().filter_map(|e| w.deliver(e)).collect();
                    let (next, fragment) = (w.next, w.fragment);
                    if !events.is_empty() {
                        w.active = true;
                    }
                    if next == self.frontier {
                        self.make_synced(id);
                    } else if next < self.frontier {
                        behind = true;
                    }
                    // Past the frontier: it waits for the batch that covers its cursor.
                    if events.is_empty() {
                        continue;
                    }
                    // At least the revision of the events just read, as etcd's header is.
                    let mut r = self.response(mvcc.current_revision(), id);
                    r.events = events;
                    self.send_events(r, fragment).await?;
                }
                Err(MvccError::Compacted) => {
                    self.remove(id);
                    // etcd 3.4's compaction cancel carries no header revision and no
                    // cancel_reason: clients read compact_revision (clientv3 turns it into
                    // ErrCompacted itself).
                    let mut r = self.response(0, id);
                    r.canceled = true;
                    r.compact_revision = mvcc.compacted_revision();
                    self.send(r).await?;
                }
                Err(e) => {
                    tracing::error!("watch: reading history: {e}");
                    let _ = self.tx.send(Err(ApiError::from(e).into())).await;
                    return Err(Gone);
                }
            }
        }
        if !behind && self.deferred_progress && self.all_synced() {
            self.send_progress().await?;
        }
        Ok(behind)
    }

    /// Sends an event response, split like etcd's `sendFragments` when the watcher asked for
    /// fragments and the response exceeds the request size limit.
    async fn send_events(&mut self, resp: WatchResponse, fragment: bool) -> Result<(), Gone> {
        let max = self.ctx.max_request_bytes;
        if !fragment || resp.encoded_len() < max || resp.events.len() < 2 {
            return self.send(resp).await;
        }
        for part in fragments(resp, max) {
            self.send(part).await?;
        }
        Ok(())
    }
}

/// etcd's fragmentation: greedily fill each part while it stays under `max` bytes (a part
/// always holds at least one event); all parts but the last carry `fragment: true`.
fn fragments(resp: WatchResponse, max: usize) -> Vec<WatchResponse> {
    let mut template = resp.clone();
    template.events.clear();
    template.fragment = true;
    let mut parts = Vec::new();
    let mut cur = template.clone();
    for ev in resp.events {
        cur.events.push(ev);
        if cur.events.len() > 1 && cur.encoded_len() >= max {
            let ev = cur.events.pop().expect("just pushed");
            parts.push(std::mem::replace(&mut cur, template.clone()));
            cur.events.push(ev);
        }
    }
    cur.fragment = false;
    parts.push(cur);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::mvccpb::KeyValue;

    #[test]
    fn fragments_keep_every_event_once_and_flag_all_but_last() {
        let events: Vec<Event> = (0..10)
            .map(|i| Event {
                kv: Some(KeyValue {
                    key: format!("k{i}").into(),
                    value: vec![b'x'; 100],
                    mod_revision: 5,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        let resp = WatchResponse {
            watch_id: 3,
            events: events.clone(),
            ..Default::default()
        };
        let parts = fragments(resp, 350);
        assert!(parts.len() > 1);
        let (last, init) = parts.split_last().unwrap();
        assert!(init.iter().all(|p| p.fragment && p.encoded_len() < 350));
        assert!(!last.fragment);
        let all: Vec<Event> = parts.iter().flat_map(|p| p.events.clone()).collect();
        assert_eq!(all, events);
        assert!(parts.iter().all(|p| p.watch_id == 3));
    }
}
