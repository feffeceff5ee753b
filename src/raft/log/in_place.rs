//! When a follower writes its log on openraft's own thread instead of the WAL's flusher
//! thread (decision 0034).
//!
//! A queued append costs two thread hand-offs (wake the flusher; the flusher wakes the async
//! worker with the result). On a follower under a sparse load (one client: each append carries
//! one entry and finds the WAL idle) the worker has nothing else to do while the entry is
//! synced, so writing it in place saves both hand-offs on the path of every write.
//!
//! Invariants:
//! - never on the leader: its append runs before openraft sends the entries to the followers,
//!   so an in-place sync there would delay replication by a whole fsync;
//! - only after [`SINGLES`] appends in a row of one entry each, so a busy follower (appends of
//!   many entries, the flusher's group commit overlapping the next append's receipt) keeps
//!   the flusher;
//! - only while the last fsync took at most [`MAX_FSYNC`]: a slow disk must not stall the
//!   member's async worker (reads, watches, heartbeats) for long;
//! - only when the WAL is idle ([`crate::wal::Wal::write_here`] checks): the order of WAL
//!   writes stays the order of appends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use openraft::metrics::RaftServerMetrics;
use openraft::type_config::alias::WatchReceiverOf;

use crate::raft::types::TypeConfig;

/// Appends of one entry in a row before a follower writes in place.
pub const SINGLES: u32 = 3;

/// The longest last fsync with which a follower still writes in place.
pub const MAX_FSYNC: Duration = Duration::from_millis(1);

/// The per-log state of the choice: the role (set by [`track_role`]) and the streak.
#[derive(Debug, Default)]
pub struct InPlace {
    following: Arc<AtomicBool>,
    singles: u32,
}

impl InPlace {
    /// Notes an append of `entries` entries; whether to write it in place, given the WAL's
    /// last fsync took `last_fsync`.
    pub fn choose(&mut self, entries: usize, last_fsync: Duration) -> bool {
        self.singles = if entries == 1 {
            self.singles.saturating_add(1)
        } else {
            0
        };
        self.singles >= SINGLES && last_fsync <= MAX_FSYNC && self.following.load(Ordering::Relaxed)
    }

    /// The switch [`track_role`] keeps up to date.
    pub fn following(&self) -> Arc<AtomicBool> {
        self.following.clone()
    }
}

/// Keeps `following` true while the member whose server metrics `rx` watches is a follower
/// or learner, for as long as it runs.
///
/// It watches openraft's server metrics, which change with the role, the vote, the leader or
/// the membership: the full metrics are sent again on every turn of openraft's core loop
/// (several times a write), and each send would wake this task.
pub fn track_role(
    mut rx: WatchReceiverOf<TypeConfig, RaftServerMetrics<TypeConfig>>,
    following: Arc<AtomicBool>,
) {
    tokio::spawn(async move {
        loop {
            let s = rx.borrow_watched().state;
            let f = matches!(
                s,
                openraft::ServerState::Follower | openraft::ServerState::Learner
            );
            following.store(f, Ordering::Relaxed);
            if rx.changed().await.is_err() {
                following.store(false, Ordering::Relaxed);
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_follower_after_a_streak_of_single_entries_with_a_fast_disk() {
        let fast = Duration::from_micros(200);
        let mut p = InPlace::default();
        // Not following: never, whatever the streak.
        for _ in 0..5 {
            assert!(!p.choose(1, fast));
        }
        p.following().store(true, Ordering::Relaxed);
        assert!(p.choose(1, fast), "the streak counts while leading");
        assert!(!p.choose(2, fast), "a batch breaks the streak");
        assert!(!p.choose(1, fast));
        assert!(!p.choose(1, fast));
        assert!(p.choose(1, fast), "the third single in a row");
        assert!(
            !p.choose(1, MAX_FSYNC + Duration::from_micros(1)),
            "slow disk"
        );
        assert!(p.choose(1, MAX_FSYNC));
        assert!(!p.choose(0, fast), "an empty append is not a single");
    }
}
