//! Per-peer link health as seen by this member's outgoing RPCs (openraft's, and the prober's),
//! and the one place that reports a peer going away and coming back.
//!
//! Invariants:
//! - A peer counts as *active* only after an uninterrupted run of successful RPCs (any failed
//!   RPC ends the run), and not at all once nothing has succeeded for [`LINK_STALE`]. etcd's
//!   strict reconfiguration check relies on this view.
//! - Log volume per peer is bounded whatever the retry rate: one warning when it stops
//!   answering (with the cause), at most one summary per [`SUMMARY_EVERY`] while it stays so,
//!   one line when it answers again. A peer that flaps faster than that is reported once per
//!   [`SUMMARY_EVERY`], with the count of outages in between.
//! - [`Links::wait_up`] returns as soon as any RPC to the peer succeeds, so a sender that backs
//!   off from a down peer resumes within one heartbeat or probe of the peer coming back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sync::LockExt;

use tokio::sync::Notify;

use crate::raft::net::peer_error::PeerFailure;
use crate::raft::types::NodeId;

/// A link with no successful RPC for this long is down even if no RPC has failed yet (a
/// replication stream can hang rather than fail). Heartbeats keep a healthy link far fresher.
const LINK_STALE: Duration = Duration::from_secs(2);

/// Longest silence in the log about a peer that stays unreachable.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Link {
    /// Start of the current run of successful RPCs; `None` after a failure.
    up_since: Option<Instant>,
    last_ok: Option<Instant>,
    /// Set while the peer is down (since its last failure, no success).
    down: Option<Outage>,
    /// When the last "stopped answering" warning (or summary) about this peer was written.
    last_report: Option<Instant>,
    /// Outages not reported on their own since `last_report` (flapping).
    unreported: u64,
}

struct Outage {
    since: Instant,
    attempts: u64,
    cause: PeerFailure,
    /// Whether this outage's start was logged (so its end is, too).
    reported: bool,
}

/// Per-target link health; cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Links {
    inner: Arc<Mutex<HashMap<NodeId, Link>>>,
    up: Arc<Notify>,
    /// This member's id: the `Local` label of the active-peer metrics.
    local: NodeId,
}

fn due(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|t| now.duration_since(t) >= SUMMARY_EVERY)
}

impl Links {
    /// The links of member `local`.
    pub fn for_member(local: NodeId) -> Links {
        Links {
            local,
            ..Links::default()
        }
    }

    /// Records a successful exchange with `target`.
    pub fn ok(&self, target: NodeId) {
        let now = Instant::now();
        let mut m = self.inner.lock_or_recover();
        let l = m.entry(target).or_default();
        if l.up_since.is_none() {
            l.up_since = Some(now);
            crate::metrics::peer_active(self.local, target, true);
        }
        l.last_ok = Some(now);
        if let Some(o) = l.down.take() {
            if o.reported {
                tracing::info!(
                    peer = %format!("{target:x}"),
                    down_for = ?now.duration_since(o.since),
                    attempts = o.attempts,
                    "peer is answering again"
                );
            }
            drop(m);
            self.up.notify_waiters();
        }
    }

    /// Records a failed exchange with `target`.
    pub fn failed(&self, target: NodeId, cause: PeerFailure) {
        let now = Instant::now();
        crate::metrics::PEER_SENT_FAILURES.inc(target);
        let mut m = self.inner.lock_or_recover();
        let l = m.entry(target).or_default();
        if l.up_since.take().is_some() {
            crate::metrics::peer_active(self.local, target, false);
        }
        let peer = format!("{target:x}");
        match &mut l.down {
            None => {
                let reported = due(l.last_report, now);
                if reported && cause == PeerFailure::Stopping {
                    // A graceful stop, said by the peer itself: expected, not a fault.
                    tracing::info!(%peer, "peer is stopping");
                    l.last_report = Some(now);
                    l.unreported = 0;
                } else if reported {
                    tracing::warn!(
                        %peer, %cause, flaps = l.unreported,
                        "peer stopped answering; retrying with backoff, summary every {}s",
                        SUMMARY_EVERY.as_secs()
                    );
                    l.last_report = Some(now);
                    l.unreported = 0;
                } else {
                    l.unreported += 1;
                }
                l.down = Some(Outage {
                    since: now,
                    attempts: 1,
                    cause,
                    reported,
                });
            }
            Some(o) => {
                o.attempts += 1;
                o.cause = cause;
                if due(l.last_report, now) {
                    tracing::warn!(
                        %peer, %cause, down_for = ?now.duration_since(o.since),
                        attempts = o.attempts, flaps = l.unreported,
                        "peer still not answering"
                    );
                    o.reported = true;
                    l.last_report = Some(now);
                    l.unreported = 0;
                }
            }
        }
    }

    /// Records the outcome of one tonic call to `target`.
    pub fn record<T>(&self, target: NodeId, r: &Result<T, tonic::Status>) {
        match r {
            Ok(_) => self.ok(target),
            Err(s) => self.failed(target, PeerFailure::of_status(s)),
        }
    }

    /// Whether `target`'s last answer was that it is stopping, and nothing succeeded since.
    pub fn stopping(&self, target: NodeId) -> bool {
        let m = self.inner.lock_or_recover();
        m.get(&target)
            .and_then(|l| l.down.as_ref())
            .is_some_and(|o| o.cause == PeerFailure::Stopping)
    }

    /// How long ago an RPC to `target` last succeeded (`None`: never, since this member
    /// started).
    pub fn last_contact(&self, target: NodeId) -> Option<Duration> {
        let m = self.inner.lock_or_recover();
        m.get(&target).and_then(|l| l.last_ok).map(|t| t.elapsed())
    }

    /// Whether `target` answered its last RPC (or has not been asked yet).
    pub fn is_up(&self, target: NodeId) -> bool {
        let m = self.inner.lock_or_recover();
        m.get(&target).is_some_and(|l| l.down.is_none())
    }

    /// Waits until an RPC to `target` succeeds, or `max` has passed.
    pub async fn wait_up(&self, target: NodeId, max: Duration) {
        let woken = self.up.notified();
        tokio::pin!(woken);
        let deadline = tokio::time::Instant::now() + max;
        loop {
            // Registered before the check, so a success in between is not missed.
            woken.as_mut().enable();
            if self.is_up(target) {
                return;
            }
            if tokio::time::timeout_at(deadline, woken.as_mut())
                .await
                .is_err()
            {
                return;
            }
            woken.set(self.up.notified());
        }
    }

    /// When the current uninterrupted run of successful RPCs to `target` began, if it is up.
    pub fn active_since(&self, target: NodeId) -> Option<Instant> {
        let m = self.inner.lock_or_recover();
        let l = m.get(&target)?;
        if l.last_ok?.elapsed() > LINK_STALE {
            return None;
        }
        l.up_since
    }

    /// Whether `target` has been reachable without interruption for at least `interval`.
    pub fn active_for(&self, target: NodeId, interval: Duration) -> bool {
        self.active_since(target)
            .is_some_and(|t| t.elapsed() >= interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_up_returns_when_the_peer_answers() {
        let links = Links::default();
        links.failed(7, PeerFailure::Refused);
        let l2 = links.clone();
        let t = Instant::now();
        let waiter = tokio::spawn(async move { l2.wait_up(7, Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        links.ok(7);
        waiter.await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        // Already up: no wait at all.
        let t = Instant::now();
        links.wait_up(7, Duration::from_secs(10)).await;
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn wait_up_gives_up_after_max() {
        let links = Links::default();
        links.failed(7, PeerFailure::Refused);
        let t = Instant::now();
        links.wait_up(7, Duration::from_millis(100)).await;
        let e = t.elapsed();
        assert!(
            e >= Duration::from_millis(100) && e < Duration::from_secs(5),
            "{e:?}"
        );
    }

    #[test]
    fn a_run_of_successes_makes_a_peer_active_and_a_failure_ends_it() {
        let links = Links::default();
        assert!(links.active_since(7).is_none());
        links.ok(7);
        assert!(links.active_since(7).is_some());
        links.failed(7, PeerFailure::Timeout);
        assert!(links.active_since(7).is_none());
        links.ok(7);
        assert!(links.active_for(7, Duration::ZERO));
    }
}
