//! The watch hub: reads the events of each newly applied revision from the MVCC store once,
//! for every watch stream of the member, and broadcasts them (etcd's synced watcher group,
//! fed from the store instead of from the apply path).
//!
//! Without it every watcher would scan the new revisions itself, so a write would cost one
//! store scan per watcher; with it a write costs one scan, and each stream only looks up the
//! keys of the new events among its own watchers.
//!
//! # Invariants
//! - Batches are contiguous: each one holds every event with `from <= revision < to`, whole
//!   revisions only, and the next batch starts at this one's `to`.
//! - The hub never waits for a stream: the broadcast channel keeps the last [`HUB_BUFFER`]
//!   batches, and a stream that falls further behind sees a gap (`from` past its cursor) and
//!   catches up from the store, so memory is bounded whatever the clients do.
//! - A batch carries `prev_kv` only when some watcher asked for it when it was read; a
//!   `lost` batch (its revisions were compacted before the hub read them) has no events and
//!   tells streams to read those revisions from the store (which reports the compaction).
//! - The apply path only bumps the revision watch channel; it never waits for the hub.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{broadcast, watch};

use crate::mvcc::MvccError;
use crate::proto::mvccpb::Event;
use crate::raft::RaftNode;
use crate::server::context::ServerCtx;
use crate::sync::LockExt;

/// Batches kept for streams that are behind.
pub const HUB_BUFFER: usize = 256;

/// Events the hub reads per batch (a revision is never split, so a batch can hold more).
const HUB_READ: usize = 1000;

#[derive(Debug)]
pub struct Batch {
    pub from: i64,
    pub to: i64,
    /// In revision order; `kv.mod_revision` is the event's revision.
    pub events: Vec<Event>,
    pub prev_kv: bool,
    pub lost: bool,
}

struct State {
    /// The `from` of the next batch.
    frontier: i64,
    /// `None` once the store is gone: receivers then see the channel closed.
    tx: Option<broadcast::Sender<Arc<Batch>>>,
}

pub struct Hub {
    state: Mutex<State>,
    prev_kv_watchers: AtomicUsize,
}

/// Counts a watcher that wants `prev_kv` for as long as it lives.
pub struct PrevKvInterest(Arc<Hub>);

impl Drop for PrevKvInterest {
    fn drop(&mut self) {
        self.0.prev_kv_watchers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Hub {
    /// Starts the hub task; it ends when the store's revision channel closes or the hub is
    /// dropped.
    pub fn start(ctx: &ServerCtx) -> Arc<Hub> {
        let node = ctx.node.clone();
        let revision = ctx.node.watch_revision();
        let (tx, _) = broadcast::channel(HUB_BUFFER);
        let hub = Arc::new(Hub {
            state: Mutex::new(State {
                frontier: node.store().current_revision() + 1,
                tx: Some(tx),
            }),
            prev_kv_watchers: AtomicUsize::new(0),
        });
        tokio::spawn(run(Arc::downgrade(&hub), node, revision));
        hub
    }

    /// The `from` of the next batch the returned receiver will get, and the receiver.
    /// `None` once the member is stopping.
    pub fn subscribe(&self) -> Option<(i64, broadcast::Receiver<Arc<Batch>>)> {
        let st = self.state.lock_or_recover();
        st.tx.as_ref().map(|tx| (st.frontier, tx.subscribe()))
    }

    pub fn want_prev_kv(self: &Arc<Self>) -> PrevKvInterest {
        self.prev_kv_watchers.fetch_add(1, Ordering::Relaxed);
        PrevKvInterest(self.clone())
    }

    fn frontier(&self) -> i64 {
        self.state.lock_or_recover().frontier
    }

    fn publish(&self, batch: Batch) {
        let mut st = self.state.lock_or_recover();
        debug_assert_eq!(batch.from, st.frontier);
        st.frontier = batch.to;
        if let Some(tx) = &st.tx {
            // No receivers is fine: nobody watches.
            let _ = tx.send(Arc::new(batch));
        }
    }

    fn close(&self) {
        self.state.lock_or_recover().tx = None;
    }
}

async fn run(hub: Weak<Hub>, node: RaftNode, mut revision: watch::Receiver<i64>) {
    loop {
        if revision.changed().await.is_err() {
            break;
        }
        let Some(hub) = hub.upgrade() else { return };
        let cur = node.store().current_revision();
        let mut from = hub.frontier();
        while from <= cur {
            let prev_kv = hub.prev_kv_watchers.load(Ordering::Relaxed) > 0;
            let batch = match node.events_since(from, &[0], &[0], prev_kv, HUB_READ).await {
                // Never past `cur`: revisions applied since are the next pass's.
                Ok(read) => Batch {
                    from,
                    to: read.next_revision.min(cur + 1),
                    events: read
                        .events
                        .into_iter()
                        .filter(|e| e.kv.as_ref().is_some_and(|kv| kv.mod_revision <= cur))
                        .collect(),
                    prev_kv,
                    lost: false,
                },
                Err(MvccError::Compacted) => Batch {
                    from,
                    to: cur + 1,
                    events: Vec::new(),
                    prev_kv,
                    lost: true,
                },
                Err(e) => {
                    tracing::error!("watch hub: reading history: {e}");
                    hub.close();
                    return;
                }
            };
            from = batch.to;
            hub.publish(batch);
            // Let streams run between big batches.
            tokio::task::yield_now().await;
        }
    }
    if let Some(hub) = hub.upgrade() {
        hub.close();
    }
}
