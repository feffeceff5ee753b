//! The commit hold: which requests reach the wire, and when.

use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use openraft::entry::RaftEntry;
use openraft::testing::log_id;
use tokio::time::Instant;

use crate::raft::net::commit_hold::{CommitHold, CommitWaits};
use crate::raft::types::{Command, Entry, TypeConfig, Vote};
use openraft::raft::AppendEntriesRequest;

const HOLD: Duration = Duration::from_millis(2);

/// A request after `prev` (index), carrying `n` entries and the commit index `commit`.
fn req(prev: u64, n: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
    let id = |i| log_id::<TypeConfig>(1, 1, i);
    AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: Some(id(prev)),
        leader_commit: Some(id(commit)),
        entries: (prev + 1..=prev + n)
            .map(|i| Entry::new_normal(id(i), Command(Bytes::from_static(b"x"))))
            .collect(),
    }
}

fn wire(r: &AppendEntriesRequest<TypeConfig>) -> (Option<u64>, usize, Option<u64>) {
    (
        r.prev_log_id.map(|l| l.index),
        r.entries.len(),
        r.leader_commit.map(|l| l.index),
    )
}

type Sender = mpsc::UnboundedSender<AppendEntriesRequest<TypeConfig>>;
type Held = CommitHold<mpsc::UnboundedReceiver<AppendEntriesRequest<TypeConfig>>>;

/// A hold over a stream the test feeds through the returned sender.
fn hold(waits: &CommitWaits) -> (Sender, Held) {
    let (tx, rx) = mpsc::unbounded();
    (tx, CommitHold::new(rx, HOLD, waits))
}

/// The next request, which must be ready without waiting.
fn at_once<S>(s: &mut CommitHold<S>) -> (Option<u64>, usize, Option<u64>)
where
    S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    let got = s.next().now_or_never().flatten();
    wire(&got.expect("sent without waiting"))
}

fn assert_held(s: &mut Held) {
    assert!(s.next().now_or_never().is_none(), "held");
}

#[tokio::test(start_paused = true)]
async fn a_request_with_entries_goes_at_once() {
    let (tx, mut s) = hold(&CommitWaits::default());
    tx.unbounded_send(req(5, 2, 5)).unwrap();
    assert_eq!(at_once(&mut s), (Some(5), 2, Some(5)));
}

#[tokio::test(start_paused = true)]
async fn a_commit_is_carried_by_the_next_write_and_not_sent_alone() {
    let (tx, mut s) = hold(&CommitWaits::default());
    tx.unbounded_send(req(7, 0, 7)).unwrap();
    assert_held(&mut s);
    tokio::time::advance(HOLD / 2).await;
    tx.unbounded_send(req(7, 1, 7)).unwrap();
    let got = s.next().await.unwrap();
    assert_eq!(wire(&got), (Some(7), 1, Some(7)));
    // Nothing else follows: the held request was dropped.
    tokio::time::advance(HOLD * 2).await;
    assert!(s.next().now_or_never().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_commit_no_write_follows_goes_after_the_hold() {
    let (tx, mut s) = hold(&CommitWaits::default());
    tx.unbounded_send(req(7, 0, 7)).unwrap();
    let start = Instant::now();
    let got = s.next().await.unwrap();
    assert_eq!(wire(&got), (Some(7), 0, Some(7)));
    assert_eq!(start.elapsed(), HOLD);
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn a_newer_commit_replaces_the_held_one_without_extending_the_hold() {
    let (tx, mut s) = hold(&CommitWaits::default());
    let start = Instant::now();
    tx.unbounded_send(req(7, 0, 6)).unwrap();
    assert!(s.next().now_or_never().is_none());
    tokio::time::advance(HOLD / 2).await;
    tx.unbounded_send(req(7, 0, 7)).unwrap();
    let got = s.next().await.unwrap();
    assert_eq!(wire(&got), (Some(7), 0, Some(7)));
    assert_eq!(start.elapsed(), HOLD);
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn the_last_request_of_a_stream_is_not_held() {
    // A heartbeat or a probe: one entry-less request, then the stream ends.
    let mut s = CommitHold::new(
        futures::stream::iter([req(3, 0, 3)]),
        HOLD,
        &CommitWaits::default(),
    );
    assert_eq!(at_once(&mut s), (Some(3), 0, Some(3)));
    assert!(s.next().now_or_never().expect("ended").is_none());
}

#[tokio::test(start_paused = true)]
async fn the_hold_restarts_for_each_commit_after_a_write() {
    let (tx, mut s) = hold(&CommitWaits::default());
    tx.unbounded_send(req(1, 0, 1)).unwrap();
    assert_eq!(wire(&s.next().await.unwrap()), (Some(1), 0, Some(1)));
    tokio::time::advance(HOLD * 10).await;
    tx.unbounded_send(req(1, 1, 1)).unwrap();
    assert_eq!(wire(&s.next().await.unwrap()), (Some(1), 1, Some(1)));
    let start = Instant::now();
    tx.unbounded_send(req(2, 0, 2)).unwrap();
    assert_eq!(wire(&s.next().await.unwrap()), (Some(2), 0, Some(2)));
    assert_eq!(start.elapsed(), HOLD);
}

#[tokio::test(start_paused = true)]
async fn a_commit_a_follower_waits_for_is_not_held() {
    let waits = CommitWaits::default();
    let (tx, mut s) = hold(&waits);
    // A held commit goes as soon as a follower waits for it (a forwarded write answered).
    tx.unbounded_send(req(7, 0, 7)).unwrap();
    assert_held(&mut s);
    let start = Instant::now();
    let (got, _) = tokio::join!(s.next(), async { waits.wait_for(7) });
    assert_eq!(wire(&got.unwrap()), (Some(7), 0, Some(7)));
    assert_eq!(start.elapsed(), Duration::ZERO);
    // A wait recorded before the commit reaches the stream: not held at all.
    waits.wait_for(8);
    tx.unbounded_send(req(8, 0, 8)).unwrap();
    assert_eq!(at_once(&mut s), (Some(8), 0, Some(8)));
    // Once a request carried the awaited index, commits are held again.
    tx.unbounded_send(req(9, 0, 9)).unwrap();
    assert_held(&mut s);
}

#[tokio::test(start_paused = true)]
async fn nothing_is_held_while_a_forwarded_write_is_in_flight() {
    let waits = CommitWaits::default();
    let (tx, mut s) = hold(&waits);
    let fwd = waits.forwarding();
    tx.unbounded_send(req(7, 0, 7)).unwrap();
    assert_eq!(at_once(&mut s), (Some(7), 0, Some(7)));
    // Answered after its commit was sent: later commits are held again.
    fwd.answered(7);
    tx.unbounded_send(req(8, 0, 8)).unwrap();
    assert_held(&mut s);
}

#[tokio::test(start_paused = true)]
async fn a_forwarded_write_answered_before_its_commit_was_sent_releases_it() {
    let waits = CommitWaits::default();
    let (tx, mut s) = hold(&waits);
    // The commit was held before the write was seen as forwarded (a race on the leader).
    tx.unbounded_send(req(7, 0, 7)).unwrap();
    assert_held(&mut s);
    let start = Instant::now();
    let (got, _) = tokio::join!(s.next(), async { waits.forwarding().answered(7) });
    assert_eq!(wire(&got.unwrap()), (Some(7), 0, Some(7)));
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_forwarded_write_that_failed_no_longer_prevents_the_hold() {
    let waits = CommitWaits::default();
    let (tx, mut s) = hold(&waits);
    // The proposal failed (not leader, timeout): the guard is dropped without an index.
    drop(waits.forwarding());
    tx.unbounded_send(req(7, 0, 7)).unwrap();
    assert_held(&mut s);
}
