//! In-memory lease expiry bookkeeping (etcd's lessor without checkpointing).
//!
//! Leases themselves (id, granted TTL) are replicated state in the MVCC store; this module
//! only tracks *when* each lease expires, and only on the leader ("primary"), because only the
//! leader decides expiry and proposes revokes.
//!
//! Invariants:
//! - A non-primary lessor tracks nothing: followers never expire leases, and keep-alives are
//!   answered by the primary only.
//! - On promotion every stored lease gets its full TTL plus an extension (the election
//!   timeout), so a leader change or restart never expires a lease earlier than a client that
//!   kept it alive against the old leader could expect.
//! - While primary, the map holds every lease the store holds: promotion loads them all, and
//!   the state machine reports each applied grant and revoke after its batch commits. A grant
//!   applied while primary starts with its full TTL.
//! - A lease handed out by [`Lessor::expired`] is not handed out again for
//!   [`REVOKE_RETRY`], so a slow revoke is not proposed twice, yet a failed one is retried.
//! - [`Lessor::expired`] hands out a bounded number at a time, longest expired first, so a
//!   storm of expiries is revoked in paced batches, oldest first (etcd's `leaseRevokeRate`).
//!
//! Times are tokio instants so the logic can be tested with paused time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::sync::LockExt;

use tokio::time::Instant;

/// How long an expired lease waits before its revoke is proposed again (etcd's
/// `expiredLeaseRetryInterval`).
pub const REVOKE_RETRY: Duration = Duration::from_secs(3);

/// etcd's maximum lease TTL in seconds.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// etcd's minimum lease TTL: `ceil(3 * election ticks / 2 * heartbeat)`, i.e. 1.5 election
/// timeouts rounded up to whole seconds.
pub fn min_ttl(election_timeout: Duration) -> i64 {
    let ms = election_timeout.as_millis() as i64 * 3 / 2;
    ((ms + 999) / 1000).max(1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    ttl: i64,
    expiry: Instant,
    /// When the revoke of this expired lease may be proposed (again).
    next_revoke: Option<Instant>,
}

impl Entry {
    fn new(ttl: i64, expiry: Instant) -> Self {
        Entry {
            ttl,
            expiry,
            next_revoke: None,
        }
    }
}

/// Outcome of a keep-alive or a time-to-live query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<T> {
    Found(T),
    /// The lease does not exist or has expired (its revoke is pending).
    NotFound,
    /// This member is not the lease primary: ask the leader.
    NotPrimary,
}

#[derive(Debug, Default)]
struct State {
    primary: bool,
    leases: HashMap<i64, Entry>,
}

/// The shared lessor; every method takes the current time itself.
#[derive(Debug, Default)]
pub struct Lessor {
    state: Mutex<State>,
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
}

impl Lessor {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock_or_recover()
    }

    pub fn is_primary(&self) -> bool {
        self.lock().primary
    }

    /// Becomes primary with `leases` (id, TTL), each expiring after its TTL plus `extend`.
    /// Servers use [`Self::promote_with`], which cannot miss a concurrent apply.
    pub fn promote(&self, leases: &[(i64, i64)], extend: Duration) {
        self.promote_with(|| Ok::<_, ()>(leases.to_vec()), extend)
            .expect("infallible");
    }

    /// Like [`Self::promote`], reading the leases under the lessor's lock, so a concurrent
    /// apply's grant or revoke is either in `load`'s result or reported after it.
    pub fn promote_with<E>(
        &self,
        load: impl FnOnce() -> Result<Vec<(i64, i64)>, E>,
        extend: Duration,
    ) -> Result<(), E> {
        let mut st = self.lock();
        let leases = load()?;
        let now = Instant::now();
        st.primary = true;
        st.leases = leases
            .into_iter()
            .map(|(id, ttl)| {
                let expiry = now + secs(ttl) + extend;
                (id, Entry::new(ttl, expiry))
            })
            .collect();
        Ok(())
    }

    /// Stops being primary and forgets every expiry.
    pub fn demote(&self) {
        let mut st = self.lock();
        st.primary = false;
        st.leases.clear();
    }

    /// A grant was applied.
    pub fn granted(&self, id: i64, ttl: i64) {
        let mut st = self.lock();
        if st.primary {
            let expiry = Instant::now() + secs(ttl);
            st.leases.insert(id, Entry::new(ttl, expiry));
        }
    }

    /// A revoke was applied.
    pub fn revoked(&self, id: i64) {
        self.lock().leases.remove(&id);
    }

    /// The store was replaced (snapshot install): keep the expiries of leases that still
    /// exist, start new ones with their full TTL, drop the rest.
    pub fn sync(&self, leases: &[(i64, i64)]) {
        let mut st = self.lock();
        if !st.primary {
            return;
        }
        let now = Instant::now();
        let old = std::mem::take(&mut st.leases);
        st.leases = leases
            .iter()
            .map(|&(id, ttl)| {
                let e = old
                    .get(&id)
                    .copied()
                    .unwrap_or(Entry::new(ttl, now + secs(ttl)));
                (id, e)
            })
            .collect();
    }

    /// A keep-alive: restarts the lease's TTL and returns it. An expired lease is not renewed
    /// (its revoke is under way), as etcd answers once the revoke is done.
    pub fn renew(&self, id: i64) -> Lookup<i64> {
        let mut st = self.lock();
        if !st.primary {
            return Lookup::NotPrimary;
        }
        let now = Instant::now();
        match st.leases.get_mut(&id) {
            Some(e) if e.expiry > now => {
                e.expiry = now + secs(e.ttl);
                Lookup::Found(e.ttl)
            }
            _ => Lookup::NotFound,
        }
    }

    /// (granted TTL, remaining whole seconds) of a lease.
    pub fn time_to_live(&self, id: i64) -> Lookup<(i64, i64)> {
        let st = self.lock();
        if !st.primary {
            return Lookup::NotPrimary;
        }
        match st.leases.get(&id) {
            Some(e) => {
                let left = e.expiry.saturating_duration_since(Instant::now());
                Lookup::Found((e.ttl, left.as_secs() as i64))
            }
            None => Lookup::NotFound,
        }
    }

    /// Revokes were applied.
    pub fn revoked_all(&self, ids: &[i64]) {
        let mut st = self.lock();
        for id in ids {
            st.leases.remove(id);
        }
    }

    /// At most `max` leases whose time is up and whose revoke should be proposed now, the
    /// longest expired first, by id. The rest wait for a later call: the caller paces a storm
    /// of expiries instead of proposing every revoke at once.
    pub fn expired(&self, max: usize) -> Vec<i64> {
        let mut st = self.lock();
        if !st.primary || max == 0 {
            return Vec::new();
        }
        let now = Instant::now();
        let mut due: Vec<(Instant, i64)> = st
            .leases
            .iter()
            .filter(|(_, e)| e.expiry <= now && e.next_revoke.is_none_or(|t| t <= now))
            .map(|(id, e)| (e.expiry, *id))
            .collect();
        if due.len() > max {
            due.select_nth_unstable(max - 1);
            due.truncate(max);
        }
        let mut out: Vec<i64> = due.into_iter().map(|(_, id)| id).collect();
        out.sort_unstable();
        for id in &out {
            if let Some(e) = st.leases.get_mut(id) {
                e.next_revoke = Some(now + REVOKE_RETRY);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn min_ttl_is_one_and_a_half_election_timeouts_rounded_up() {
        assert_eq!(min_ttl(Duration::from_millis(1000)), 2);
        assert_eq!(min_ttl(Duration::from_millis(2000)), 3);
        assert_eq!(min_ttl(Duration::from_millis(100)), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn follower_tracks_nothing() {
        let l = Lessor::default();
        l.granted(1, 5);
        assert_eq!(l.renew(1), Lookup::NotPrimary);
        assert_eq!(l.time_to_live(1), Lookup::NotPrimary);
        tokio::time::advance(10 * S).await;
        assert!(l.expired(usize::MAX).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn grant_expires_after_ttl_and_keepalive_extends() {
        let l = Lessor::default();
        l.promote(&[], Duration::ZERO);
        l.granted(7, 5);
        assert_eq!(l.time_to_live(7), Lookup::Found((5, 5)));
        tokio::time::advance(4 * S).await;
        assert!(l.expired(usize::MAX).is_empty());
        assert_eq!(l.renew(7), Lookup::Found(5));
        tokio::time::advance(4 * S).await;
        assert!(l.expired(usize::MAX).is_empty());
        assert_eq!(l.time_to_live(7), Lookup::Found((5, 1)));
        tokio::time::advance(S).await;
        assert_eq!(l.expired(usize::MAX), vec![7]);
        // Expired: no renewal, and no second revoke until the retry interval passed.
        assert_eq!(l.renew(7), Lookup::NotFound);
        assert!(l.expired(usize::MAX).is_empty());
        tokio::time::advance(REVOKE_RETRY).await;
        assert_eq!(l.expired(usize::MAX), vec![7]);
        l.revoked(7);
        assert_eq!(l.time_to_live(7), Lookup::NotFound);
        tokio::time::advance(REVOKE_RETRY).await;
        assert!(l.expired(usize::MAX).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn promotion_gives_full_ttl_plus_extension() {
        let l = Lessor::default();
        l.promote(&[(1, 3), (2, 10)], 2 * S);
        tokio::time::advance(4 * S).await;
        assert!(l.expired(usize::MAX).is_empty());
        tokio::time::advance(S).await;
        assert_eq!(l.expired(usize::MAX), vec![1]);
        l.demote();
        assert_eq!(l.renew(2), Lookup::NotPrimary);
        tokio::time::advance(60 * S).await;
        assert!(l.expired(usize::MAX).is_empty());
        // A new term starts the clock again.
        l.promote(&[(2, 10)], 2 * S);
        tokio::time::advance(11 * S).await;
        assert!(l.expired(usize::MAX).is_empty());
        tokio::time::advance(S).await;
        assert_eq!(l.expired(usize::MAX), vec![2]);
    }

    #[tokio::test(start_paused = true)]
    async fn sync_keeps_known_expiries() {
        let l = Lessor::default();
        l.promote(&[(1, 5)], Duration::ZERO);
        tokio::time::advance(3 * S).await;
        l.sync(&[(1, 5), (2, 5)]);
        assert_eq!(l.time_to_live(1), Lookup::Found((5, 2)));
        assert_eq!(l.time_to_live(2), Lookup::Found((5, 5)));
        l.sync(&[(2, 5)]);
        assert_eq!(l.time_to_live(1), Lookup::NotFound);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_hands_out_at_most_max_longest_expired_first() {
        let l = Lessor::default();
        l.promote(&[], Duration::ZERO);
        for id in 1..=5 {
            l.granted(id, 10);
        }
        tokio::time::advance(S).await;
        for id in [9, 8] {
            l.granted(id, 10);
        }
        tokio::time::advance(10 * S).await;
        assert_eq!(l.expired(3), vec![1, 2, 3]);
        assert_eq!(l.expired(2), vec![4, 5]);
        l.revoked_all(&[1, 2, 3, 4]);
        tokio::time::advance(S).await;
        assert_eq!(l.expired(1), vec![8]);
        assert_eq!(l.expired(5), vec![9]);
        tokio::time::advance(REVOKE_RETRY).await;
        assert_eq!(l.expired(5), vec![5, 8, 9]);
        assert!(l.expired(0).is_empty());
    }
}
