//! [`Wal::write_here`]: written on the caller's thread when the WAL is idle, queued behind
//! the flusher otherwise, and the same refusals as a queued write.

use std::sync::{mpsc, Arc};
use std::thread::{self, ThreadId};
use std::time::Duration;

use super::tests::{dir, entry};
use super::*;

fn open(fs: &SimFs) -> Wal {
    Wal::open_with_fs(Arc::new(fs.clone()), &dir(), WalOptions::default())
        .unwrap()
        .0
}

/// Writes `records` with `write_here`; the callback's thread and result, once it ran.
fn here(wal: &Wal, records: Vec<Record>) -> mpsc::Receiver<(ThreadId, bool)> {
    let (tx, rx) = mpsc::channel();
    wal.write_here(
        records,
        Box::new(move |r| tx.send((thread::current().id(), r.is_ok())).unwrap()),
    );
    rx
}

#[test]
fn an_idle_wal_writes_and_answers_on_the_callers_thread() {
    let fs = SimFs::new();
    let wal = open(&fs);
    let rx = here(&wal, vec![entry(1, 10)]);
    // Already answered: nothing was left for the flusher to do.
    assert_eq!(rx.try_recv().unwrap(), (thread::current().id(), true));
    assert_eq!(wal.stats().fsyncs, 1);
    drop(wal);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
    fs.crash(&mut rng);
    let got = Wal::open_with_fs(Arc::new(fs.clone()), &dir(), WalOptions::default())
        .unwrap()
        .1;
    assert_eq!(got, vec![entry(1, 10)], "synced before it was acknowledged");
}

#[test]
fn a_busy_wal_queues_in_order_behind_the_batch_in_flight() {
    let fs = SimFs::new();
    fs.set_sync_delay(Some(Duration::from_millis(50)));
    let wal = open(&fs);
    let (tx, rx) = mpsc::channel();
    let first = tx.clone();
    wal.submit(
        vec![entry(1, 10)],
        Box::new(move |r| first.send((1, r.is_ok())).unwrap()),
    );
    // Whether the flusher has taken the first batch yet or not, this one must wait for it.
    wal.write_here(
        vec![entry(2, 10)],
        Box::new(move |r| tx.send((2, r.is_ok())).unwrap()),
    );
    assert_eq!(rx.recv().unwrap(), (1, true));
    assert_eq!(rx.recv().unwrap(), (2, true));
    drop(wal);
    let got = Wal::open_with_fs(Arc::new(fs.clone()), &dir(), WalOptions::default())
        .unwrap()
        .1;
    assert_eq!(got, vec![entry(1, 10), entry(2, 10)]);
}

#[test]
fn refusals_are_those_of_a_queued_write() {
    let fs = SimFs::new();
    let wal = open(&fs);
    let huge = Record::Entry {
        index: 1,
        data: vec![0; format::MAX_PAYLOAD + 1],
    };
    let (tx, rx) = mpsc::channel();
    wal.write_here(vec![huge], Box::new(move |r| tx.send(r).unwrap()));
    assert!(matches!(
        rx.recv().unwrap(),
        Err(WalError::RecordTooLarge { .. })
    ));
    // Still usable: an oversized record is the caller's mistake.
    assert!(here(&wal, vec![entry(1, 10)]).recv().unwrap().1);
    // A failed fsync poisons the WAL for in-place writes too.
    fs.fail_once_after(1);
    assert!(!here(&wal, vec![entry(2, 10)]).recv().unwrap().1);
    let (tx, rx) = mpsc::channel();
    wal.write_here(vec![entry(3, 10)], Box::new(move |r| tx.send(r).unwrap()));
    assert!(matches!(rx.recv().unwrap(), Err(WalError::Poisoned(_))));
    wal.close();
    let (tx, rx) = mpsc::channel();
    wal.write_here(vec![entry(3, 10)], Box::new(move |r| tx.send(r).unwrap()));
    assert!(matches!(rx.recv().unwrap(), Err(WalError::Closed)));
}

#[test]
fn the_last_fsync_is_reported() {
    let fs = SimFs::new();
    let wal = open(&fs);
    assert_eq!(wal.last_fsync(), Duration::ZERO);
    fs.set_sync_delay(Some(Duration::from_millis(5)));
    wal.write_sync(vec![entry(1, 10)]).unwrap();
    assert!(wal.last_fsync() >= Duration::from_millis(5));
}
