//! Simple tokens (etcd's auth/simple_token.go): `<16 random letters>.<log index>`, assigned on
//! every member by the applied Authenticate entry, kept in memory only, valid for a TTL that
//! each use renews.
//!
//! Invariants:
//! - A token names one user; deleting the user, changing their password or disabling auth
//!   drops their tokens on every member (the same applied entries drop them everywhere).
//! - Expired tokens are dropped lazily (on lookup, and by a sweep when tokens are assigned),
//!   so the map is bounded by the logins of one TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::LockExt;

use rand::Rng;

/// etcd's default `--auth-token-ttl`, seconds.
pub const DEFAULT_TTL_SECS: u64 = 300;

pub struct SimpleTokens {
    map: Mutex<HashMap<String, (String, Instant)>>,
    ttl_secs: AtomicU64,
    last_sweep: Mutex<Option<Instant>>,
}

impl Default for SimpleTokens {
    fn default() -> Self {
        SimpleTokens {
            map: Mutex::default(),
            ttl_secs: AtomicU64::new(DEFAULT_TTL_SECS),
            last_sweep: Mutex::default(),
        }
    }
}

/// etcd's token prefix: 16 random ASCII letters.
pub fn new_prefix() -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut rng = rand::thread_rng();
    (0..16)
        .map(|_| LETTERS[rng.gen_range(0..LETTERS.len())] as char)
        .collect()
}

impl SimpleTokens {
    fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs.load(Ordering::Relaxed).max(1))
    }

    /// Sets the TTL of tokens (`--auth-token-ttl`).
    pub fn set_ttl(&self, ttl: Duration) {
        self.ttl_secs.store(ttl.as_secs().max(1), Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.map.lock_or_recover()
    }

    pub fn assign(&self, token: String, user: String) {
        let now = Instant::now();
        let mut map = self.lock();
        let mut last = self.last_sweep.lock_or_recover();
        if last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            map.retain(|_, (_, exp)| *exp > now);
            *last = Some(now);
        }
        map.insert(token, (user, now + self.ttl()));
    }

    /// The user a live token names, renewing its TTL.
    pub fn user(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        let mut map = self.lock();
        let (user, exp) = map.get_mut(token)?;
        if *exp <= now {
            map.remove(token);
            return None;
        }
        *exp = now + self.ttl();
        Some(user.clone())
    }

    pub fn invalidate_user(&self, user: &str) {
        self.lock().retain(|_, (u, _)| u != user);
    }

    pub fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_expire_and_renew() {
        let t = SimpleTokens::default();
        t.set_ttl(Duration::from_secs(1));
        t.assign("abc.5".into(), "u".into());
        assert_eq!(t.user("abc.5").as_deref(), Some("u"));
        assert_eq!(t.user("abc.6"), None);
        t.invalidate_user("u");
        assert_eq!(t.user("abc.5"), None);
        let p = new_prefix();
        assert_eq!(p.len(), 16);
        assert!(p.bytes().all(|b| b.is_ascii_alphabetic()));
    }
}
