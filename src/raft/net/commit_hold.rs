//! Holds back a replication request that carries only a newer commit index, briefly, so the
//! next request with entries carries that index instead.
//!
//! openraft's replication stream sends an entry-less AppendEntries whenever the leader's
//! commit index advances and no new entries are waiting. Under a steady trickle of writes (one
//! client) that doubles the requests, responses and follower wake-ups per write, all on the
//! CPUs the next write needs, and the next write follows within a fraction of a millisecond
//! anyway. So an entry-less request waits up to [`COMMIT_HOLD`] in this adapter; if a request
//! with entries comes first, the held one is dropped. Nothing is lost by dropping it:
//!
//! - every request openraft builds reads the newest commit index as it is built, so the later
//!   request carries an index at least as new, from the same leader and session;
//! - openraft matches responses to requests by log ids, not by count (a dropped request's
//!   range, `prev == last == matched`, is acknowledged by the next response);
//! - a request that is the stream's last (a heartbeat, a probe) is sent as soon as the stream
//!   ends, without waiting.
//!
//! A follower that waits for a commit is not made to wait ([`CommitWaits`]): nothing is held
//! while a write a follower forwarded is in flight on the leader (the follower answers its
//! client only once it has applied the entry itself), nor until a stream has sent a commit
//! index covering the last such write answered or the last read index given to a follower.
//!
//! The cost: a follower with no such waiter learns of a commit that no later write carries up
//! to [`COMMIT_HOLD`] late (its serializable reads and its watchers trail by as much).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use openraft::raft::AppendEntriesRequest;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::raft::types::TypeConfig;

/// How long an entry-less request waits for a request with entries to carry its commit index.
/// At one client a write follows the previous commit by 0.2-0.5 ms on a busy 2-vCPU machine.
pub const COMMIT_HOLD: Duration = Duration::from_millis(2);

type Request = AppendEntriesRequest<TypeConfig>;

/// What followers wait for: writes they forwarded that the leader has not answered yet, and
/// the highest log index one of them waits to hear committed (a forwarded write the leader
/// answered, a read index it gave). Clones share it.
#[derive(Clone)]
pub struct CommitWaits(Arc<Waits>);

struct Waits {
    forwarding: AtomicUsize,
    index: AtomicU64,
    /// Wakes holding streams. Not on every forwarded write under load: only when the last one
    /// in flight is answered, or a read index is given.
    wake: watch::Sender<()>,
}

impl Default for CommitWaits {
    fn default() -> Self {
        CommitWaits(Arc::new(Waits {
            forwarding: AtomicUsize::new(0),
            index: AtomicU64::new(0),
            wake: watch::channel(()).0,
        }))
    }
}

impl CommitWaits {
    /// A follower forwarded a write: no commit is held until the leader answers it (the
    /// follower answers its client only once it has applied the entry itself).
    pub fn forwarding(&self) -> Forwarding {
        self.0.forwarding.fetch_add(1, Ordering::SeqCst);
        Forwarding {
            waits: self.clone(),
            index: None,
        }
    }

    /// A follower waits for `index`, which the leader has committed, to reach it.
    pub fn wait_for(&self, index: u64) {
        self.0.index.fetch_max(index, Ordering::SeqCst);
        self.0.wake.send_replace(());
    }

    /// Whether a follower waits for a commit a stream that has sent up to `sent` has not sent.
    fn awaited(&self, sent: u64) -> bool {
        self.0.forwarding.load(Ordering::SeqCst) > 0 || self.0.index.load(Ordering::SeqCst) > sent
    }

    fn subscribe(&self) -> watch::Receiver<()> {
        self.0.wake.subscribe()
    }
}

/// A forwarded write in flight on the leader (see [`CommitWaits::forwarding`]).
pub struct Forwarding {
    waits: CommitWaits,
    index: Option<u64>,
}

impl Forwarding {
    /// The leader committed and applied the write at `index`; the follower now waits for it.
    pub fn answered(mut self, index: u64) {
        self.note(index);
    }

    /// One write of a batch was committed and applied at `index`; the batch is still in flight.
    pub fn note(&mut self, index: u64) {
        self.index = Some(self.index.map_or(index, |i| i.max(index)));
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        let w = &self.waits.0;
        if let Some(i) = self.index {
            w.index.fetch_max(i, Ordering::SeqCst);
        }
        if w.forwarding.fetch_sub(1, Ordering::SeqCst) == 1 {
            w.wake.send_replace(());
        }
    }
}

/// Wraps openraft's request stream (see the module docs).
pub struct CommitHold<S> {
    inner: S,
    held: Option<Request>,
    hold: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    inner_done: bool,
    /// The highest commit index this stream has sent.
    sent_commit: u64,
    waits: CommitWaits,
    /// Wakes a holding stream when a follower starts waiting.
    wait_changes: WatchStream<()>,
}

impl<S> CommitHold<S> {
    pub fn new(inner: S, hold: Duration, waits: &CommitWaits) -> Self {
        CommitHold {
            inner,
            held: None,
            hold,
            deadline: Box::pin(tokio::time::sleep(Duration::ZERO)),
            inner_done: false,
            sent_commit: 0,
            wait_changes: WatchStream::from_changes(waits.subscribe()),
            waits: waits.clone(),
        }
    }

    /// Whether a follower waits for a commit this stream has not sent.
    fn awaited(&self) -> bool {
        self.waits.awaited(self.sent_commit)
    }

    fn send(&mut self, req: Request) -> Poll<Option<Request>> {
        if let Some(c) = &req.leader_commit {
            self.sent_commit = self.sent_commit.max(c.index);
        }
        Poll::Ready(Some(req))
    }
}

impl<S: Stream<Item = Request> + Unpin> Stream for CommitHold<S> {
    type Item = Request;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Request>> {
        let this = &mut *self;
        // Registers for the next change; the current value is read through `awaited`.
        while let Poll::Ready(Some(_)) = Pin::new(&mut this.wait_changes).poll_next(cx) {}
        loop {
            if this.inner_done {
                return match this.held.take() {
                    Some(req) => this.send(req),
                    None => Poll::Ready(None),
                };
            }
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(req)) if req.entries.is_empty() => {
                    // A newer commit replaces the held one; the first one's deadline stands.
                    if this.held.is_none() {
                        let at = tokio::time::Instant::now() + this.hold;
                        this.deadline.as_mut().reset(at);
                    }
                    this.held = Some(req);
                }
                Poll::Ready(Some(req)) => {
                    this.held = None;
                    return this.send(req);
                }
                Poll::Ready(None) => this.inner_done = true,
                Poll::Pending => {
                    let due = this.held.is_some()
                        && (this.awaited() || this.deadline.as_mut().poll(cx).is_ready());
                    return match this.held.take_if(|_| due) {
                        Some(req) => this.send(req),
                        None => Poll::Pending,
                    };
                }
            }
        }
    }
}
