//! The etcd v3 Watch service.
//!
//! # Design
//! Every watcher is what etcd calls "unsynced": it keeps a cursor, the next revision it has
//! to deliver, and reads its events from the MVCC history whenever the store revision moves
//! past the cursor. There is no in-memory event fan-out, so the write path never waits for a
//! watcher and a slow client only slows down its own stream.
//!
//! One task per gRPC stream owns all of that stream's watchers and is the only producer of
//! its responses. It wakes on requests, on store revision changes, on the progress ticker
//! and (with `hasleader=true`) on the leader check ticker.
//!
//! # Invariants
//! - A watcher's cursor only grows, and every matching event below it has been sent (or
//!   dropped by the watcher's filters): no gaps, no duplicates, revision order.
//! - All events of one revision go into one response (`events_since` never splits a
//!   revision); only `fragment` watchers may split a response, flagging every part but the
//!   last with `fragment: true`.
//! - A watcher's created response precedes its events and its canceled response follows
//!   them, because one task produces all of a stream's responses in order.
//! - The work done between two looks at the incoming requests is bounded: each watcher
//!   reads at most [`EVENTS_PER_READ`] events (plus the rest of the last revision) per pass.
//! - The response channel is bounded; a client that stops reading makes its stream task
//!   wait on `send`, which blocks nothing else.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use prost::Message;
use tokio::sync::mpsc;
use tokio::time::{interval_at, Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::context::ServerCtx;
use super::error::ApiError;
use crate::mvcc::MvccError;
use crate::proto::etcdserverpb::watch_create_request::FilterType;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::proto::etcdserverpb::watch_server::Watch;
use crate::proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use crate::proto::mvccpb::{event::EventType, Event};

/// Events one watcher reads per pass (a revision is never split, so a pass can return more).
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
    pub ctx: ServerCtx,
    /// How often watchers that asked for progress notifications get one while idle.
    pub progress_interval: Duration,
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
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let stream = WatchStream {
            ctx: self.ctx.clone(),
            tx,
            watchers: BTreeMap::new(),
            next_auto_id: 0,
            deferred_progress: false,
        };
        tokio::spawn(stream.run(req.into_inner(), self.progress_interval, require_leader));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct Watcher {
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// The next revision to deliver.
    next: i64,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    fragment: bool,
    progress_notify: bool,
    /// Events were sent since the last progress tick; etcd notifies only idle watchers.
    active: bool,
}

/// The client is gone (or the stream must end); the task stops.
struct Gone;

struct WatchStream {
    ctx: ServerCtx,
    tx: mpsc::Sender<Result<WatchResponse, Status>>,
    watchers: BTreeMap<i64, Watcher>,
    next_auto_id: i64,
    /// A progress request arrived while some watcher was behind; answer once none is.
    deferred_progress: bool,
}

impl WatchStream {
    async fn run(
        mut self,
        mut inbound: Streaming<WatchRequest>,
        progress_interval: Duration,
        require_leader: bool,
    ) {
        let mut revision = self.ctx.node.sm.revision();
        let mut progress = interval_at(Instant::now() + progress_interval, progress_interval);
        progress.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let election = self.ctx.node.election_timeout;
        let mut leader_check = interval_at(Instant::now() + election, election);
        leader_check.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut no_leader_checks = 0;
        // etcd keeps serving after the client half-closes; only the response side ends it.
        let mut inbound_open = true;
        loop {
            let behind = match self.sync().await {
                Ok(b) => b,
                Err(Gone) => return,
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
                r = revision.changed() => match r {
                    Ok(()) => Ok(()),
                    // The state machine is gone: the member is stopping.
                    Err(_) => {
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

    async fn send(&self, resp: WatchResponse) -> Result<(), Gone> {
        self.tx.send(Ok(resp)).await.map_err(|_| Gone)
    }

    fn response(&self, revision: i64, watch_id: i64) -> WatchResponse {
        WatchResponse {
            header: self.ctx.header(revision),
            watch_id,
            ..Default::default()
        }
    }

    async fn handle(&mut self, req: WatchRequest) -> Result<(), Gone> {
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
            Some(RequestUnion::CancelRequest(c)) => {
                // etcd answers only cancels of watchers that exist.
                if self.watchers.remove(&c.watch_id).is_some() {
                    let mut r = self.response(self.ctx.current_revision(), c.watch_id);
                    r.canceled = true;
                    self.send(r).await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
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

    async fn create(&mut self, c: WatchCreateRequest) -> Result<(), Gone> {
        let cur = self.ctx.current_revision();
        // etcd: an empty key means the smallest key, "\0".
        let key = if c.key.is_empty() { vec![0] } else { c.key };
        let from_key = c.range_end == [0];
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
        self.watchers.insert(
            id,
            Watcher {
                key,
                range_end: c.range_end,
                next: if c.start_revision == 0 {
                    cur + 1
                } else {
                    c.start_revision
                },
                prev_kv: c.prev_kv,
                no_put: has(FilterType::Noput),
                no_delete: has(FilterType::Nodelete),
                fragment: c.fragment,
                progress_notify: c.progress_notify,
                active: false,
            },
        );
        let mut r = self.response(cur, id);
        r.created = true;
        self.send(r).await
    }

    fn all_synced(&self) -> bool {
        let cur = self.ctx.current_revision();
        self.watchers.values().all(|w| w.next > cur)
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
        let mut due = Vec::new();
        for (id, w) in self.watchers.iter_mut() {
            if w.progress_notify && !w.active && w.next > cur {
                due.push(*id);
            }
            w.active = false;
        }
        for id in due {
            self.send(self.response(cur, id)).await?;
        }
        Ok(())
    }

    /// One pass over the watchers: each one behind the store revision reads and sends its next
    /// batch of events. Returns whether some watcher is still behind.
    async fn sync(&mut self) -> Result<bool, Gone> {
        let mvcc = self.ctx.node.sm.shared.mvcc.clone();
        let cur = mvcc.current_revision();
        let ids: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.next <= cur)
            .map(|(id, _)| *id)
            .collect();
        let mut behind = false;
        for id in ids {
            let Some(w) = self.watchers.get_mut(&id) else {
                continue;
            };
            match mvcc.events_since(w.next, &w.key, &w.range_end, w.prev_kv, EVENTS_PER_READ) {
                Ok(read) => {
                    w.next = read.next_revision;
                    behind |= w.next <= cur;
                    let events: Vec<Event> = read
                        .events
                        .into_iter()
                        .filter(|e| {
                            let put = e.r#type == EventType::Put as i32;
                            !(put && w.no_put || !put && w.no_delete)
                        })
                        .collect();
                    if events.is_empty() {
                        continue;
                    }
                    w.active = true;
                    let fragment = w.fragment;
                    // At least the revision of the events just read, as etcd's header is.
                    let mut r = self.response(mvcc.current_revision(), id);
                    r.events = events;
                    self.send_events(r, fragment).await?;
                }
                Err(MvccError::Compacted) => {
                    self.watchers.remove(&id);
                    // etcd's compaction cancel carries no header revision.
                    let mut r = self.response(0, id);
                    r.canceled = true;
                    r.compact_revision = mvcc.compacted_revision();
                    r.cancel_reason = MvccError::Compacted.to_string();
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
    async fn send_events(&self, resp: WatchResponse, fragment: bool) -> Result<(), Gone> {
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
