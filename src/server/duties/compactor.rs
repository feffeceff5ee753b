//! Auto compaction (`--auto-compaction-mode`, `--auto-compaction-retention`), with the
//! semantics of etcd 3.4's `v3compactor`.
//!
//! Every member runs the compactor; it acts only while the member leads (etcd pauses it on
//! followers), and it compacts through the ordinary Compact proposal, so every member applies
//! the same compaction at the same log index.
//!
//! - **periodic** (retention `P`): the current revision is sampled every `min(P, 1h) / 10`
//!   (the retry interval) into a window of the last `P / retry + 1` samples; the oldest sample
//!   is the revision seen about `P` ago. The first compaction waits `P` after start, later
//!   ones `min(P, 1h)` after the last success; in between, a check that finds it too early
//!   does nothing. A failed compaction is retried on the next sample, with the window moved on.
//! - **revision** (retention `N`): every 5 minutes, compact at `current - N`, unless that is
//!   not positive or is what the last success compacted at.
//!
//! "required revision has been compacted" counts as success (someone compacted further
//! already), as in etcd. Each run logs "Starting auto-compaction at revision R (retention: ..)"
//! and "Finished auto-compaction at revision R" (etcd 3.4's capnslog lines); a tick that does
//! nothing logs nothing.
//!
//! The clock is tokio's, so the schedule is tested with a paused clock instead of sleeping
//! minutes (`compactor_tests`).

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::mvcc::MvccError;
use crate::proto::etcdserverpb::CompactionRequest;
use crate::proto::kvdpb::{internal_request, InternalRequest};
use crate::server::config::AutoCompaction;
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;

/// etcd's period of the revision compactor (`revInterval`).
pub const REVISION_INTERVAL: Duration = Duration::from_secs(5 * 60);

const HOUR: Duration = Duration::from_secs(3600);

/// What the compactor needs of its member.
pub(crate) trait Target: Send + Sync + 'static {
    /// The member's current revision (etcd's `RevGetter`: the local store's).
    fn rev(&self) -> i64;
    /// Whether the member leads now (the compactor is paused otherwise).
    fn leads(&self) -> bool;
    /// Compacts at `rev` as a client's Compact would (not physical).
    fn compact(&self, rev: i64) -> impl Future<Output = Result<(), ApiError>> + Send;
}

/// The compactor of a serving member.
pub(crate) struct Member(pub ServerCtx);

impl Target for Member {
    fn rev(&self) -> i64 {
        self.0.current_revision()
    }

    fn leads(&self) -> bool {
        self.0.node.is_leader()
    }

    async fn compact(&self, rev: i64) -> Result<(), ApiError> {
        let req = InternalRequest {
            request: Some(internal_request::Request::Compaction(CompactionRequest {
                revision: rev,
                physical: false,
            })),
            ..Default::default()
        };
        self.0.propose(req).await.map(|_| ())
    }
}

/// Runs the compactor `mode` asks for, forever (the caller aborts it on stop).
pub(crate) async fn run(target: impl Target, mode: AutoCompaction) {
    match mode {
        AutoCompaction::Periodic(p) => run_periodic(target, p).await,
        AutoCompaction::Revision(n) => run_revision(target, n, REVISION_INTERVAL).await,
    }
}

/// Whether a compaction's outcome counts as done: compacted now, or already compacted further.
fn succeeded(res: &Result<(), ApiError>) -> bool {
    matches!(res, Ok(()) | Err(ApiError::Mvcc(MvccError::Compacted)))
}

/// etcd 3.4's periodic compactor (see the module doc).
pub(crate) async fn run_periodic(target: impl Target, period: Duration) {
    let compact_interval = period.min(HOUR);
    // At least a millisecond: a zero interval would spin (etcd refuses nothing here, but a
    // retention under 10 ns makes no sense).
    let retry = (compact_interval / 10).max(Duration::from_millis(1));
    let retentions = (period.as_nanos() / retry.as_nanos()) as usize + 1;
    let mut revs: VecDeque<i64> = VecDeque::with_capacity(retentions + 1);
    let mut last_success = Instant::now();
    let mut base = period;
    loop {
        revs.push_back(target.rev());
        if revs.len() > retentions {
            // revs[0] is the revision seen `period` ago.
            revs.pop_front();
        }
        tokio::time::sleep(retry).await;
        if !target.leads() || last_success.elapsed() < base {
            continue;
        }
        // The first compaction waits the whole retention; later ones the compact interval.
        base = compact_interval;
        let rev = revs[0];
        tracing::info!(
            "Starting auto-compaction at revision {rev} (retention: {})",
            go_duration(period)
        );
        let res = target.compact(rev).await;
        if succeeded(&res) {
            tracing::info!("Finished auto-compaction at revision {rev}");
            last_success = Instant::now();
        } else if let Err(e) = res {
            tracing::warn!("Failed auto-compaction at revision {rev} ({e})");
            tracing::warn!("Retry after {}", go_duration(retry));
        }
    }
}

/// etcd 3.4's revision compactor, checking every `interval` (etcd: 5 minutes).
pub(crate) async fn run_revision(target: impl Target, retention: i64, interval: Duration) {
    let mut prev = 0;
    loop {
        tokio::time::sleep(interval).await;
        if !target.leads() {
            continue;
        }
        let rev = target.rev().saturating_sub(retention);
        if rev <= 0 || rev == prev {
            continue;
        }
        tracing::info!(
            "Starting auto-compaction at revision {rev} (retention: {retention} revisions)"
        );
        let res = target.compact(rev).await;
        if succeeded(&res) {
            prev = rev;
            tracing::info!("Finished auto-compaction at revision {rev}");
        } else if let Err(e) = res {
            tracing::warn!("Failed auto-compaction at revision {rev} ({e})");
            tracing::warn!("Retry after {}", go_duration(interval));
        }
    }
}

/// A duration as Go's `time.Duration.String` writes it ("2s", "1h0m0s", "500ms"), as etcd's
/// log lines show the retention.
pub fn go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000_000_000 {
        let (div, unit) = match ns {
            n if n < 1_000 => (1, "ns"),
            n if n < 1_000_000 => (1_000, "µs"),
            _ => (1_000_000, "ms"),
        };
        return format!("{}{unit}", frac(ns, div));
    }
    let secs = ns / 1_000_000_000;
    let (h, m) = (secs / 3600, (secs % 3600) / 60);
    let s = frac(ns % 60_000_000_000, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

/// `n / div` with the fraction Go prints (trailing zeros dropped).
fn frac(n: u128, div: u128) -> String {
    let (whole, rest) = (n / div, n % div);
    if rest == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let digits = format!("{rest:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
#[path = "compactor_tests.rs"]
mod compactor_tests;
