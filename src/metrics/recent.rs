//! A rolling window of latencies: what the last minute looked like, where the Prometheus
//! histograms only give totals since the process started (a disk that turned slow an hour ago
//! barely moves a lifetime p99).
//!
//! Invariants:
//! - The window is [`WINDOW_SECS`] one-second slots in a ring; slot `s % WINDOW_SECS` holds the
//!   observations of second `s` (seconds counted from the window's creation). A slot is reset
//!   when a later second reuses it, and a query ignores slots older than the window, so an
//!   idle member reports an empty window rather than stale latencies.
//! - Each slot is a small HDR histogram (1 significant digit: quantiles within ~6%), so the
//!   whole window is a few tens of KiB and a query merges at most [`WINDOW_SECS`] of them.
//! - Recording takes a mutex for a few hundred nanoseconds; the WAL flusher records once per
//!   fsynced batch, so contention is a Status call at worst.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::LockExt;

use hdrhistogram::Histogram;

/// Length of the window in seconds.
pub const WINDOW_SECS: u64 = 60;

/// Latencies above this (microseconds) are recorded as this: a minute-long fsync is already
/// a dead disk.
const MAX_US: u64 = 60_000_000;

fn new_hist() -> Histogram<u32> {
    Histogram::new_with_bounds(1, MAX_US, 1).expect("valid histogram bounds")
}

struct Slot {
    second: u64,
    hist: Histogram<u32>,
}

/// Latencies observed in the last [`WINDOW_SECS`] seconds.
pub struct RecentLatency {
    origin: Instant,
    slots: Mutex<Vec<Slot>>,
}

/// What a window holds at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RecentSummary {
    /// Observations in the window.
    pub count: u64,
    /// The 99th percentile (zero when `count` is zero).
    pub p99: Duration,
}

impl Default for RecentLatency {
    fn default() -> Self {
        Self::new()
    }
}

impl RecentLatency {
    pub fn new() -> Self {
        RecentLatency {
            origin: Instant::now(),
            slots: Mutex::new(Vec::new()),
        }
    }

    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_secs()
    }

    pub fn observe(&self, d: Duration) {
        self.observe_at(Instant::now(), d)
    }

    /// Records `d` as observed at `at`.
    pub fn observe_at(&self, at: Instant, d: Duration) {
        let sec = self.second(at);
        let us = (d.as_micros() as u64).clamp(1, MAX_US);
        let mut slots = self.slots.lock_or_recover();
        if slots.is_empty() {
            // Allocated on first use: members whose WAL never syncs pay nothing.
            slots.extend((0..WINDOW_SECS).map(|_| Slot {
                second: u64::MAX,
                hist: new_hist(),
            }));
        }
        let slot = &mut slots[(sec % WINDOW_SECS) as usize];
        if slot.second != sec {
            slot.second = sec;
            slot.hist.reset();
        }
        slot.hist.saturating_record(us);
    }

    pub fn summary(&self) -> RecentSummary {
        self.summary_at(Instant::now())
    }

    /// The observations of the [`WINDOW_SECS`] seconds up to and including `at`'s second.
    pub fn summary_at(&self, at: Instant) -> RecentSummary {
        let now = self.second(at);
        let mut merged = new_hist();
        let slots = self.slots.lock_or_recover();
        for s in slots.iter() {
            if s.second <= now && now - s.second < WINDOW_SECS {
                // Same bounds on both sides: adding cannot fail.
                let _ = merged.add(&s.hist);
            }
        }
        drop(slots);
        if merged.is_empty() {
            return RecentSummary::default();
        }
        RecentSummary {
            count: merged.len(),
            p99: Duration::from_micros(merged.value_at_quantile(0.99)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Asserts `d` is within HDR's 1-digit precision of `want`.
    fn near(d: Duration, want: Duration) {
        let (d, w) = (d.as_secs_f64(), want.as_secs_f64());
        assert!((d - w).abs() <= w * 0.07, "{d} s is not about {w} s");
    }

    #[test]
    fn empty_window_reports_nothing() {
        let r = RecentLatency::new();
        assert_eq!(r.summary(), RecentSummary::default());
    }

    #[test]
    fn p99_of_the_last_minute() {
        let r = RecentLatency::new();
        let t0 = r.origin;
        // 990 fast syncs and 10 slow ones spread over 10 s: p99 is a fast one, and one more
        // slow sync makes the 99th percentile slow.
        for i in 0..1000u64 {
            let d = if i % 100 == 0 { ms(200) } else { ms(2) };
            r.observe_at(t0 + Duration::from_millis(i * 10), d);
        }
        let s = r.summary_at(t0 + Duration::from_secs(10));
        assert_eq!(s.count, 1000);
        near(s.p99, ms(2));
        for _ in 0..2 {
            r.observe_at(t0 + Duration::from_secs(10), ms(200));
        }
        near(r.summary_at(t0 + Duration::from_secs(10)).p99, ms(200));
    }

    #[test]
    fn old_seconds_leave_the_window() {
        let r = RecentLatency::new();
        let t0 = r.origin;
        r.observe_at(t0, ms(500));
        r.observe_at(t0 + Duration::from_secs(30), ms(1));
        // At 59 s both are in the window (seconds 0..=59).
        let s = r.summary_at(t0 + Duration::from_secs(59));
        assert_eq!(s.count, 2);
        near(s.p99, ms(500));
        // At 60 s second 0 has left it, though nothing reused its slot yet.
        let s = r.summary_at(t0 + Duration::from_secs(60));
        assert_eq!(s.count, 1);
        near(s.p99, ms(1));
        // Second 60 reuses second 0's slot, which resets it.
        r.observe_at(t0 + Duration::from_secs(60), ms(3));
        let s = r.summary_at(t0 + Duration::from_secs(60));
        assert_eq!(s.count, 2);
        near(s.p99, ms(3));
        // Idle for over a minute: empty again.
        assert_eq!(
            r.summary_at(t0 + Duration::from_secs(200)),
            RecentSummary::default()
        );
    }

    #[test]
    fn extreme_latencies_are_clamped_not_lost() {
        let r = RecentLatency::new();
        r.observe_at(r.origin, Duration::ZERO);
        r.observe_at(r.origin, Duration::from_secs(3600));
        let s = r.summary_at(r.origin);
        assert_eq!(s.count, 2);
        near(s.p99, Duration::from_micros(MAX_US));
    }
}
