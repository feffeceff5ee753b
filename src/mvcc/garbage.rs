//! Compaction's real work, in the background: compacting the key index and deleting the
//! history records it removes.
//!
//! A compaction's apply only publishes the new compacted revision (and stores it with its
//! batch). Once that batch is persisted, the committer thread compacts the key index
//! ([`MemIndex::compact`], a chunk of keys per lock) and deletes the removed records from the
//! engine, [`CHUNK`] at a time, pausing between chunks, so that a compaction does not stop
//! every member's writes while it deletes. etcd does the same: its apply compacts the index
//! and schedules the deletion, done in batches of 1,000 keys with pauses between. Why:
//! docs/decisions/mvcc-0002-background-compaction.md.
//!
//! # Invariants
//! - Leaving the index uncompacted for a while changes no answer: every read is at a
//!   revision >= the published compacted revision C (lower ones are refused), and the newest
//!   revision <= R of a key is the same for every R >= C whether or not older ones are still
//!   listed. The one reader that walks the history by revision instead,
//!   [`super::MvccStore::events_since`], skips tombstones at or below C (always garbage).
//! - A compaction is scheduled only once the layer holding it is in the engine
//!   ([`super::pending::PendingWrites::persist`]). Every record it removes was applied before
//!   it, so it is in the engine by then: a later persist never writes a deleted record back.
//! - Each step runs with the history gate held for writing: no snapshot image is being copied
//!   (an image needs every record up to its revision) and no load replaces the trees.
//! - Nothing here is persistent. A crash or a close loses the queue, harmlessly: opening or
//!   loading a store compacts the rebuilt index at the stored compacted revision and queues
//!   what that removes ([`super::MvccStore::open`]).
//! - [`Garbage::done`] only grows, and names a compaction C only once every record that C
//!   and every earlier compaction removed is deleted from the engine (not yet flushed): what
//!   a physical Compact waits for (etcd's `physc`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::sync::LockExt;

use super::engine::{Engine, StoreEngine, Tree, WriteBatch};
use super::error::MvccError;
use super::index::mem::MemIndex;
use super::index::Revision;

/// Records deleted per engine batch: a few milliseconds of work, so neither the committer's
/// persists nor a snapshot waiting for the history gate are held up for long.
pub const CHUNK: usize = 256;

/// After a chunk, the collector rests this many times as long as the chunk took: deletion
/// takes at most a third of a CPU per member, so the members' writes keep theirs.
const REST_FACTOR: u32 = 2;

pub(crate) struct Garbage {
    queue: Mutex<Queue>,
    /// Held while a step runs; [`Self::close`] takes it to wait for one in flight.
    running: Mutex<()>,
    closed: AtomicBool,
    /// The highest compaction whose records are all deleted (see the module doc).
    done: tokio::sync::watch::Sender<i64>,
}

impl Default for Garbage {
    fn default() -> Self {
        Garbage {
            queue: Mutex::default(),
            running: Mutex::default(),
            closed: AtomicBool::default(),
            done: tokio::sync::watch::Sender::new(super::NEVER_COMPACTED),
        }
    }
}

#[derive(Default)]
struct Queue {
    /// A persisted compaction whose key index is not compacted yet.
    scheduled: Option<i64>,
    /// Records removed from the index, to delete from the engine.
    revs: Vec<Revision>,
    /// When the current run of work started, and how many records it has deleted.
    since: Option<(Instant, usize)>,
    /// The highest compaction whose work is queued: done once the queue is empty.
    target: i64,
}

/// What one [`Garbage::step`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing to do, or a snapshot copy or a load holds the history: try later.
    Idle,
    /// Work done; go on after `rest`.
    Worked { rest: Duration },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is a single assignment or push: poisoning means nothing.
    m.lock_or_recover()
}

impl Garbage {
    /// Schedules the index compaction of a persisted compaction at `at`.
    pub fn schedule(&self, at: i64) {
        let mut q = lock(&self.queue);
        q.scheduled = Some(q.scheduled.map_or(at, |s| s.max(at)));
        q.target = q.target.max(at);
        q.since.get_or_insert((Instant::now(), 0));
    }

    /// Records that the work of the compaction at `at` is queued (or was never needed):
    /// [`Self::done`] reaches `at` once the queue is empty.
    pub fn note(&self, at: i64) {
        let mut q = lock(&self.queue);
        q.target = q.target.max(at);
        self.publish_if_empty(&q);
    }

    /// Publishes the queue's target as done if nothing is left to do.
    fn publish_if_empty(&self, q: &Queue) {
        if q.scheduled.is_none() && q.revs.is_empty() {
            let target = q.target;
            self.done.send_if_modified(|d| {
                let raise = target > *d;
                if raise {
                    *d = target;
                }
                raise
            });
        }
    }

    /// Waits until every record that the compaction at `at` removed is deleted from the
    /// engine. Waits forever for a compaction that never reaches the engine (a closed store).
    /// While anyone waits, the collector does not rest between chunks.
    pub async fn wait_done(&self, at: i64) {
        let mut rx = self.done.subscribe();
        // The sender lives as long as `self`.
        let _ = rx.wait_for(|d| *d >= at).await;
    }

    /// Queues records to delete (already removed from the index).
    pub fn add(&self, revs: &[Revision]) {
        if revs.is_empty() {
            return;
        }
        let mut q = lock(&self.queue);
        q.revs.extend_from_slice(revs);
        // In revision order, so that a chunk of deletions covers neighbouring records: the
        // history is stored in chunks of consecutive records (engine::chunks), and a batch
        // rewrites each chunk it touches once. In key order (as the index yields them) a
        // chunk's garbage is spread over many batches and the chunk is rewritten by each.
        // Steps take from the end, so the newest garbage goes first; the order of deletion
        // changes no answer (the module doc's first invariant).
        q.revs.sort_unstable();
        q.since.get_or_insert((Instant::now(), 0));
    }

    /// Whether a compaction or records are waiting.
    pub fn has_work(&self) -> bool {
        let q = lock(&self.queue);
        q.scheduled.is_some() || !q.revs.is_empty()
    }

    /// Forgets all work (the trees are being replaced).
    pub fn clear(&self) {
        *lock(&self.queue) = Queue::default();
    }

    /// Stops [`Self::step`] for good, waiting for a step in flight. The store calls it when
    /// its last handle goes, so the committer thread does not keep the database open after.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        drop(lock(&self.running));
    }

    /// Takes the lock that [`Self::close`] waits on; `None` once closed.
    pub fn enter(&self) -> Option<MutexGuard<'_, ()>> {
        let g = lock(&self.running);
        (!self.closed.load(Ordering::SeqCst)).then_some(g)
    }

    /// One unit of work, inside [`Self::enter`]: compacts `idx` for a scheduled compaction,
    /// else deletes up to [`CHUNK`] queued records from the history in one engine batch.
    pub fn step(
        &self,
        idx: &MemIndex,
        engine: &StoreEngine,
        gate: &tokio::sync::RwLock<()>,
    ) -> Result<Step, MvccError> {
        let Ok(_no_images) = gate.try_write() else {
            return Ok(Step::Idle);
        };
        let started = Instant::now();
        let scheduled = lock(&self.queue).scheduled.take();
        if let Some(at) = scheduled {
            let removed = idx.compact(at);
            tracing::info!(
                revision = at,
                removed = removed.len(),
                took_ms = started.elapsed().as_millis() as u64,
                "compacted the key index"
            );
            self.add(&removed);
            self.publish_if_empty(&lock(&self.queue));
            return Ok(Step::Worked {
                rest: Duration::ZERO,
            });
        }
        let chunk = {
            let mut q = lock(&self.queue);
            let at = q.revs.len().saturating_sub(CHUNK);
            q.revs.split_off(at)
        };
        if chunk.is_empty() {
            return Ok(Step::Idle);
        }
        let mut batch = WriteBatch::default();
        for r in &chunk {
            batch.delete(Tree::Rev, r.to_bytes().to_vec());
        }
        if let Err(e) = engine.write(batch) {
            lock(&self.queue).revs.extend(chunk);
            return Err(e);
        }
        crate::metrics::COMPACTION_KEYS.inc_by(chunk.len() as u64);
        let took = started.elapsed();
        let mut q = lock(&self.queue);
        if let Some((_, n)) = &mut q.since {
            *n += chunk.len();
        }
        self.publish_if_empty(&q);
        if q.revs.is_empty() && q.scheduled.is_none() {
            if let Some((since, n)) = q.since.take() {
                tracing::info!(
                    records = n,
                    took_ms = since.elapsed().as_millis() as u64,
                    "finished deleting compacted history"
                );
            }
        }
        // A physical compaction's client is waiting for this work: no rests then (etcd's
        // physical compaction is not paced differently, but its deletion is not paced at all).
        let rest = if self.done.receiver_count() > 0 {
            Duration::ZERO
        } else {
            took * REST_FACTOR
        };
        Ok(Step::Worked { rest })
    }
}
