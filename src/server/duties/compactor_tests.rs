//! The compactors' schedules on tokio's paused clock: hours of etcd's schedule in
//! milliseconds, against a member whose revision grows with time.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::*;

/// A member whose revision is `1 + per_sec * seconds since start`; records every compaction
/// as (seconds since start, revision). The first `fail_first` compactions fail.
#[derive(Clone)]
struct Fake {
    start: Instant,
    per_sec: i64,
    leads: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<(u64, i64)>>>,
    fail_first: Arc<AtomicUsize>,
}

impl Fake {
    fn new(per_sec: i64) -> Fake {
        Fake {
            start: Instant::now(),
            per_sec,
            leads: Arc::new(AtomicBool::new(true)),
            calls: Arc::default(),
            fail_first: Arc::default(),
        }
    }

    fn calls(&self) -> Vec<(u64, i64)> {
        self.calls.lock().unwrap().clone()
    }
}

impl Target for Fake {
    fn rev(&self) -> i64 {
        1 + self.per_sec * self.start.elapsed().as_secs() as i64
    }

    fn leads(&self) -> bool {
        self.leads.load(Ordering::SeqCst)
    }

    async fn compact(&self, rev: i64) -> Result<(), ApiError> {
        self.calls
            .lock()
            .unwrap()
            .push((self.start.elapsed().as_secs(), rev));
        if self
            .fail_first
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ApiError::Timeout);
        }
        Ok(())
    }
}

/// Runs `fut` for `secs` seconds of (paused) time.
async fn run_for(secs: u64, fut: impl Future<Output = ()>) {
    let _ = tokio::time::timeout(Duration::from_secs(secs) + Duration::from_millis(1), fut).await;
}

#[tokio::test(start_paused = true)]
async fn periodic_compacts_to_the_revision_seen_one_retention_ago() {
    let f = Fake::new(1);
    run_for(35, run_periodic(f.clone(), Duration::from_secs(10))).await;
    // Samples every second; the window holds 11, so its oldest is from 10 samples back. The
    // first compaction waits the whole retention (at 10 s: the sample of 0 s, revision 1).
    assert_eq!(f.calls(), [(10, 1), (20, 10), (30, 20)]);
}

#[tokio::test(start_paused = true)]
async fn periodic_over_an_hour_compacts_hourly_after_the_first_retention() {
    let f = Fake::new(1);
    run_for(
        4 * 3600 + 60,
        run_periodic(f.clone(), Duration::from_secs(2 * 3600)),
    )
    .await;
    // Retention 2 h: samples every 6 min, a window of 21 (2 h). First at 2 h, then hourly,
    // each at the revision seen 2 h earlier.
    assert_eq!(
        f.calls(),
        [(7200, 1), (10800, 1 + 3600 - 360), (14400, 1 + 7200 - 360)]
    );
}

#[tokio::test(start_paused = true)]
async fn periodic_retries_a_failure_on_the_next_sample() {
    let f = Fake::new(1);
    f.fail_first.store(1, Ordering::SeqCst);
    run_for(25, run_periodic(f.clone(), Duration::from_secs(10))).await;
    // The failed compaction's window had not moved past 0 s yet, nor had the retry's.
    assert_eq!(f.calls(), [(10, 1), (11, 1), (21, 11)]);
}

#[tokio::test(start_paused = true)]
async fn followers_do_not_compact_and_a_new_leader_starts_at_once() {
    let f = Fake::new(1);
    f.leads.store(false, Ordering::SeqCst);
    let leads = f.leads.clone();
    let flip = async move {
        tokio::time::sleep(Duration::from_millis(24_500)).await;
        leads.store(true, Ordering::SeqCst);
        std::future::pending::<()>().await
    };
    run_for(32, async {
        tokio::join!(run_periodic(f.clone(), Duration::from_secs(10)), flip);
    })
    .await;
    // Paused until 24.5 s; the window kept sampling meanwhile (etcd's does too), so the first
    // check as leader compacts at the revision seen 10 samples before.
    assert_eq!(f.calls(), [(25, 15)]);
}

#[tokio::test(start_paused = true)]
async fn revision_mode_keeps_the_last_n_every_interval_and_skips_repeats() {
    let f = Fake::new(10);
    run_for(
        16 * 60,
        run_revision(f.clone(), 100, Duration::from_secs(5 * 60)),
    )
    .await;
    assert_eq!(
        f.calls(),
        [(300, 3001 - 100), (600, 6001 - 100), (900, 9001 - 100)]
    );

    // Nothing written since: the same revision is not compacted again.
    let idle = Fake::new(0);
    run_for(
        20 * 60,
        run_revision(idle.clone(), 0, Duration::from_secs(5 * 60)),
    )
    .await;
    assert_eq!(idle.calls(), [(300, 1)]);

    // Fewer revisions than the retention: nothing to compact.
    let young = Fake::new(0);
    run_for(11 * 60, run_revision(young.clone(), 5, REVISION_INTERVAL)).await;
    assert_eq!(young.calls(), []);
}

#[test]
fn durations_print_as_go_prints_them() {
    for (d, s) in [
        (Duration::from_secs(2), "2s"),
        (Duration::from_secs(3600), "1h0m0s"),
        (Duration::from_secs(5400), "1h30m0s"),
        (Duration::from_secs(90), "1m30s"),
        (Duration::from_millis(200), "200ms"),
        (Duration::from_millis(1500), "1.5s"),
        (Duration::from_secs(360), "6m0s"),
        (Duration::ZERO, "0s"),
    ] {
        assert_eq!(go_duration(d), s);
    }
}
