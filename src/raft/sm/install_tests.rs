//! Snapshot install under crashes and races: a crash at any step of an install leaves a
//! state that reopening turns into the snapshot's (or the one before the install), an
//! undecodable snapshot never becomes the newest file, and reads during an install see the
//! old state or the new one, never a mix.

use std::collections::BTreeSet;
use std::path::Path;

use openraft::storage::RaftStateMachine;

use super::*;
use crate::mvcc::failpoint::crash_after;
use crate::proto::etcdserverpb::{LeaseGrantRequest, PutRequest, RangeRequest};
use crate::raft::sm::snapshot_file_install::SnapshotFile;
use crate::raft::types::Membership;

fn lid(index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(2, 1, index)
}

fn membership(ids: &[NodeId], at: u64) -> StoredMembership {
    let voters: BTreeSet<NodeId> = ids.iter().copied().collect();
    StoredMembership::new(
        Some(lid(at)),
        Membership::new_with_defaults(vec![voters.clone()], voters),
    )
}

/// Puts `keys` keys under `prefix` (every third one under lease `lease`), overwrites every
/// second one, and records `index` as applied with `members` as the membership.
fn fill(sm: &StateMachine, prefix: &str, keys: usize, lease: i64, index: u64, members: &[NodeId]) {
    let mut reqs = vec![WriteRequest::LeaseGrant(LeaseGrantRequest {
        id: lease,
        ttl: 60 + lease,
    })];
    let put = |i: usize, v: &str| {
        WriteRequest::Put(PutRequest {
            key: format!("{prefix}{i:05}").into_bytes(),
            value: format!("{v}{i}").into_bytes(),
            lease: if i.is_multiple_of(3) { lease } else { 0 },
            ..Default::default()
        })
    };
    reqs.extend((0..keys).map(|i| put(i, "v")));
    reqs.extend((0..keys).step_by(2).map(|i| put(i, "w")));
    let meta = vec![
        (META_LAST_APPLIED.to_vec(), Some(encode(&Some(lid(index))))),
        (
            META_MEMBERSHIP.to_vec(),
            Some(encode(&membership(members, index - 1))),
        ),
    ];
    for r in sm.shared.mvcc.apply(&reqs, &meta).unwrap() {
        r.unwrap();
    }
    sm.shared.mvcc.flush().unwrap();
}

/// Everything a member serves from its state machine.
#[derive(Debug, PartialEq)]
struct Observed {
    revision: i64,
    kvs: Vec<crate::proto::mvccpb::KeyValue>,
    leases: Vec<(i64, i64)>,
    applied: Option<LogId>,
    membership: StoredMembership,
    /// Every tree entry, so nothing else differs either.
    items: Vec<(String, Vec<u8>, Vec<u8>)>,
}

fn all_keys() -> RangeRequest {
    RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    }
}

fn observe(sm: &StateMachine) -> Observed {
    let mvcc = &sm.shared.mvcc;
    Observed {
        revision: mvcc.current_revision(),
        kvs: mvcc.range(&all_keys()).unwrap().kvs,
        leases: mvcc.leases().unwrap(),
        applied: sm.last_applied().unwrap(),
        membership: sm.membership().unwrap(),
        items: mvcc.dump().collect::<Result<_, _>>().unwrap(),
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A snapshot of a store with `keys` keys (lease 7, applied index 100, members 1-3), and what
/// a member serves with it installed. The snapshot's file (the bytes a leader sends) lives in
/// `d/sent`.
async fn source_snapshot(d: &Path, keys: usize) -> (Source, Observed) {
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(d).unwrap();
    fill(&sm, "s/", keys, 7, 100, &[1, 2, 3]);
    let seen = observe(&sm);
    assert_eq!(seen.leases, vec![(7, 67)]);
    (save(&mut sm, &d.join("sent")).await, seen)
}

/// The current snapshot of `sm`, as a leader sends it, saved as a file in `dir`.
async fn save(sm: &mut StateMachine, dir: &Path) -> Source {
    let snap = sm.get_current_snapshot().await.unwrap().unwrap();
    let SnapshotData::Live(live) = snap.snapshot else {
        panic!("a member's current snapshot is read from its engine");
    };
    std::fs::create_dir_all(dir).unwrap();
    let dir = dir.to_path_buf();
    let path = tokio::task::spawn_blocking(move || {
        live.write_file(&crate::wal::real_fs(), &dir)
            .unwrap()
            .publish()
    })
    .await
    .unwrap()
    .unwrap();
    Source {
        meta: snap.meta,
        path,
    }
}

/// A built snapshot, by its file.
struct Source {
    meta: SnapshotMeta,
    path: std::path::PathBuf,
}

impl Source {
    /// The snapshot as a file opened from disk.
    fn file(&self) -> SnapshotData {
        SnapshotData::File(SnapshotFile::open(&self.path).unwrap().1)
    }
}

/// A closed member state-machine dir holding other keys (lease 9, applied index 50, members
/// 1-2), snapshotted (flushed, no file), and what it serves.
async fn template(dir: &Path, keys: usize) -> Observed {
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(dir).unwrap();
    fill(&sm, "t/", keys, 9, 50, &[1, 2]);
    let saves = crate::metrics::SNAP_FSYNC_SECONDS.count();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(newest_snapshot_index(dir), 0, "a build writes no file");
    assert!(
        crate::metrics::SNAP_FSYNC_SECONDS.count() > saves,
        "the engine flush at a snapshot point is etcd_snap_fsync_duration_seconds"
    );
    observe(&sm)
}

fn newest_snapshot_index(dir: &Path) -> u64 {
    snapshot_file::latest(&crate::wal::RealFs, &dir.join("snap"))
        .unwrap()
        .and_then(|(m, _)| m.last_log_id)
        .map_or(0, |l| l.index)
}

/// Crashes an install after each of its steps (every tree write, every marker, the file),
/// with the engine flushed up to that point, reopens the state machine from the same directory,
/// and requires the snapshot's state or the previous one: every key, revision, lease,
/// last-applied index and membership.
#[tokio::test]
async fn a_crash_at_any_step_of_an_install_is_repaired_on_reopen() {
    let src = tempfile::tempdir().unwrap();
    let (snap, want) = source_snapshot(src.path(), 12).await;
    let tpl = tempfile::tempdir().unwrap();
    let before = template(tpl.path(), 5).await;
    let mut crashes = 0;
    for n in 1..500 {
        let work = tempfile::tempdir().unwrap();
        copy_dir(tpl.path(), work.path());
        let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(work.path()).unwrap();
        crash_after(Some(n));
        let res = sm.install_snapshot(&snap.meta, snap.file()).await;
        crash_after(None);
        if res.is_ok() {
            assert_eq!(observe(&sm), want, "installed without a crash");
            // sled's flush alone leaves files and directory entries unsynced.
            let steps = crate::raft::sm::engine_dir::steps(work.path());
            assert_eq!(
                steps[steps.len().saturating_sub(2)..],
                ["engine synced", "snapshot files removed"],
                "the received file is removed only after the engine was synced"
            );
            break;
        }
        crashes += 1;
        drop(sm);
        let sm = crate::raft::sm::state_machine::apply_tests::reopen(work.path())
            .unwrap_or_else(|e| panic!("crash at step {n}: reopen failed: {e}"));
        let got = observe(&sm);
        assert!(
            got == want || got == before,
            "crash at step {n}: reopened state is neither the snapshot nor the previous \
             state:\n{got:#?}"
        );
        if newest_snapshot_index(work.path()) == 100 {
            assert_eq!(
                got, want,
                "crash at step {n}: the snapshot file is the newest"
            );
        }
    }
    eprintln!("install crashed and was repaired at each of {crashes} steps");
    assert!(crashes >= 6, "only {crashes} crash points");
}

/// A snapshot that does not decode is refused before it is written: it never becomes the
/// newest snapshot file, which the member would try to reinstall (and fail on) at every start.
#[tokio::test]
async fn an_undecodable_snapshot_is_refused_and_never_becomes_the_newest_file() {
    let d = tempfile::tempdir().unwrap();
    let before = template(d.path(), 5).await;
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    let meta = SnapshotMeta {
        last_log_id: Some(lid(100)),
        last_membership: membership(&[1, 2, 3], 99),
    };
    let mut garbage = sm.receive_snapshot().unwrap();
    garbage.append(b"not a snapshot payload").unwrap();
    let garbage = SnapshotData::File(garbage.finish().unwrap());
    let res = sm.install_snapshot(&meta, garbage).await;
    assert!(res.is_err(), "garbage was installed");
    let left: Vec<_> = std::fs::read_dir(d.path().join("snap"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "the refused file is left behind: {left:?}");
    assert_eq!(observe(&sm), before);
    drop(sm);
    let sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path())
        .expect("reopen after a refused snapshot");
    assert_eq!(observe(&sm), before);
}

/// Range reads through the state machine while a snapshot is installed see every old key or
/// every new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_during_an_install_see_the_old_state_or_the_new_one() {
    let src = tempfile::tempdir().unwrap();
    let (snap, want) = source_snapshot(src.path(), 3000).await;
    let d = tempfile::tempdir().unwrap();
    let before = template(d.path(), 200).await;
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (sm, done) = (sm.clone(), done.clone());
        let (old, new) = (before.kvs.clone(), want.kvs.clone());
        tokio::spawn(async move {
            let (mut reads, mut mixed) = (0u32, 0u32);
            // Bounded: the install takes well under a minute.
            while !done.load(std::sync::atomic::Ordering::SeqCst) && reads < 1_000_000 {
                let kvs = match sm.range(&all_keys()).await {
                    Ok(r) => r.kvs,
                    Err(_) => Vec::new(),
                };
                reads += 1;
                if kvs != old && kvs != new {
                    mixed += 1;
                }
                tokio::task::yield_now().await;
            }
            (reads, mixed)
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let t0 = std::time::Instant::now();
    sm.install_snapshot(&snap.meta, snap.file()).await.unwrap();
    let took = t0.elapsed();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (reads, mixed) = reader.await.unwrap();
    eprintln!("{reads} reads, {mixed} mixed; the install took {took:?}");
    assert!(reads > 0);
    assert_eq!(
        mixed, 0,
        "{mixed} of {reads} reads saw a half-installed store"
    );
    assert_eq!(observe(&sm), want);
}

/// `snap` as a receiver gets it from a leader: through `snapshot_stream::receive` into an
/// engine generation of `sm`'s own, in chunks of `chunk` bytes, the byte at `damage` (if any)
/// flipped and the stream cut after `cut` bytes (if given).
async fn receive_bytes(
    sm: &StateMachine,
    snap: &Source,
    chunk: usize,
    damage: Option<usize>,
    cut: Option<usize>,
) -> Result<SnapshotData, tonic::Status> {
    let mut bytes = std::fs::read(&snap.path).unwrap();
    if let Some(at) = damage {
        bytes[at] ^= 0xff;
    }
    if let Some(n) = cut {
        bytes.truncate(n);
    }
    let chunks: Vec<_> = bytes
        .chunks(chunk)
        .map(|c| {
            Ok(crate::proto::kvdpb::SnapshotChunk {
                header: bytes::Bytes::new(),
                data: bytes::Bytes::copy_from_slice(c),
            })
        })
        .collect();
    let stager = sm.stage_snapshot(&snap.meta).unwrap();
    let staged = crate::raft::net::snapshot_stream::receive(
        stager,
        bytes::Bytes::new(),
        futures::stream::iter(chunks),
    )
    .await?;
    Ok(SnapshotData::Staged(Box::new(staged)))
}

async fn receive(sm: &StateMachine, snap: &Source) -> SnapshotData {
    receive_bytes(sm, snap, 64 << 10, None, None).await.unwrap()
}

/// The engine generation directories under `dir`, by name.
fn generations(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n == "db" || n.starts_with("db.") && n != "db.current")
        .collect();
    v.sort();
    v
}

/// Waits (up to 10 s) until the generations under `dir` are `want`: a replaced or discarded
/// one is removed once its engine has closed.
async fn settle_generations(dir: &Path, want: &[&str]) {
    for _ in 0..200 {
        if generations(dir) == want {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(generations(dir), want);
}

/// A received snapshot goes into a new engine generation as it arrives, and the install
/// switches to it: no snapshot file is written or read, the old generation goes, and the
/// state is the snapshot's, also after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_received_snapshot_is_staged_in_a_new_generation_and_switched_to() {
    let src = tempfile::tempdir().unwrap();
    let (snap, want) = source_snapshot(src.path(), 3000).await;
    let d = tempfile::tempdir().unwrap();
    template(d.path(), 20).await;
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    let snap_dir = d.path().join("snap");
    let read = || snapshot_file::tests::bytes_read_in(&snap_dir);
    let before = read();

    let staged = receive(&sm, &snap).await;
    assert_eq!(generations(d.path()), ["db", "db.1"], "staged aside");
    assert_eq!(observe(&sm).kvs.len(), 20, "not installed yet");
    sm.install_snapshot(&snap.meta, staged).await.unwrap();
    assert_eq!(observe(&sm), want);
    assert_eq!(sm.db_dir(), d.path().join("db.1"));
    assert!(
        !sm.shared.mvcc.engine().writes_back(),
        "installed, the staged engine waits for its writes as the store's do"
    );
    assert_eq!(read() - before, 0, "no snapshot file read");
    assert_eq!(newest_snapshot_index(d.path()), 0, "no snapshot file kept");
    settle_generations(d.path(), &["db.1"]).await;

    // Writes go on, on the new generation, and a restart finds the snapshot's state.
    fill(&sm, "after/", 5, 11, 200, &[1, 2, 3]);
    let after = observe(&sm);
    drop(sm);
    let sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    assert_eq!(observe(&sm), after);
}

/// A received snapshot that is damaged, cut short, or not the one announced is refused while
/// it is received: the state stays as it was, its generation is removed, and nothing is left
/// for a restart to trip on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_short_received_snapshot_is_refused_and_its_generation_removed() {
    let src = tempfile::tempdir().unwrap();
    let (snap, _) = source_snapshot(src.path(), 300).await;
    let len = std::fs::metadata(&snap.path).unwrap().len() as usize;
    let d = tempfile::tempdir().unwrap();
    let before = template(d.path(), 20).await;
    let sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();

    let cases = [
        ("a flipped byte", Some(len / 2), None),
        ("a flipped checksum", Some(len - 1), None),
        ("cut short", None, Some(len - 100)),
        ("cut after the header", None, Some(40)),
    ];
    for (what, damage, cut) in cases {
        let e = receive_bytes(&sm, &snap, 4096, damage, cut)
            .await
            .expect_err(what);
        assert_eq!(e.code(), tonic::Code::Aborted, "{what}: {e}");
        assert_eq!(observe(&sm), before, "{what}");
        settle_generations(d.path(), &["db"]).await;
    }
    // Announced as another snapshot than the one it holds.
    let other = Source {
        meta: SnapshotMeta {
            last_log_id: Some(lid(101)),
            ..snap.meta.clone()
        },
        path: snap.path.clone(),
    };
    let e = receive_bytes(&sm, &other, 4096, None, None)
        .await
        .expect_err("another meta");
    assert!(e.message().contains("sent as that of"), "{e}");
    settle_generations(d.path(), &["db"]).await;

    drop(sm);
    let sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    assert_eq!(observe(&sm), before);
}

/// A member that stops (or crashes) with a snapshot staged and not installed restarts on its
/// old state; the staged generation is removed at the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_snapshot_not_installed_is_gone_after_a_restart() {
    let src = tempfile::tempdir().unwrap();
    let (snap, _) = source_snapshot(src.path(), 300).await;
    let d = tempfile::tempdir().unwrap();
    let before = template(d.path(), 20).await;
    let sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    let staged = receive(&sm, &snap).await;
    // As after a crash: the staged engine is closed without its drop's clean-up.
    std::mem::forget(staged);
    drop(sm);
    let sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    assert_eq!(observe(&sm), before);
    assert_eq!(generations(d.path()), ["db"]);
}

/// The switch to a staged generation fails after the pointer's rename (its fsync): neither
/// generation is removed, writes are refused, and a restart serves the generation the
/// pointer names, whole: the snapshot's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_switch_to_a_staged_snapshot_refuses_writes_and_a_restart_is_whole() {
    let src = tempfile::tempdir().unwrap();
    let (snap, want) = source_snapshot(src.path(), 300).await;
    let d = tempfile::tempdir().unwrap();
    template(d.path(), 20).await;
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    let staged = receive(&sm, &snap).await;
    crate::raft::sm::engine_dir::fail_sync_after_rename(d.path());
    let e = sm.install_snapshot(&snap.meta, staged).await.unwrap_err();
    assert!(
        e.to_string().contains("uncertain") || e.to_string().contains("switch"),
        "{e}"
    );
    let nothing = futures::stream::iter(Vec::<
        Result<openraft::storage::EntryResponder<crate::raft::types::TypeConfig>, std::io::Error>,
    >::new());
    assert!(sm.apply(nothing).await.is_err(), "writes refused");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(generations(d.path()), ["db", "db.1"], "both kept");
    drop(sm);
    let sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    assert_eq!(observe(&sm), want);
    assert_eq!(generations(d.path()), ["db.1"]);
}

/// A snapshot file this process did not check (opened from disk) is read through before it
/// is installed: a damaged one is refused and leaves the state and the newest file as they
/// were; the same file undamaged installs.
#[tokio::test]
async fn a_damaged_snapshot_opened_from_disk_is_refused() {
    let src = tempfile::tempdir().unwrap();
    let (snap, want) = source_snapshot(src.path(), 300).await;
    let d = tempfile::tempdir().unwrap();
    let before = template(d.path(), 20).await;
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();

    let whole = std::fs::read(&snap.path).unwrap();
    let mut damaged = whole.clone();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0xff;
    std::fs::write(&snap.path, &damaged).unwrap();
    let e = sm
        .install_snapshot(&snap.meta, snap.file())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    assert_eq!(observe(&sm), before);
    assert_eq!(newest_snapshot_index(d.path()), 0);

    std::fs::write(&snap.path, &whole).unwrap();
    sm.install_snapshot(&snap.meta, snap.file()).await.unwrap();
    assert_eq!(observe(&sm), want);
}

/// The time to receive and install a large snapshot (about 100 MiB: 96 Ki keys of 1 KiB),
/// staged into a new generation as it arrives, and written to a file first then loaded (as
/// before staging). A measurement, not a check:
/// `cargo test --release --lib install_time_of_a_large -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn install_time_of_a_large_received_snapshot() {
    let src = tempfile::tempdir().unwrap();
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(src.path()).unwrap();
    let value = vec![b'v'; 1024];
    for batch in 0..96u64 {
        let reqs: Vec<_> = (0..1024u64)
            .map(|i| {
                WriteRequest::Put(PutRequest {
                    key: format!("big/{:08}", batch * 1024 + i).into_bytes(),
                    value: value.clone(),
                    ..Default::default()
                })
            })
            .collect();
        let meta = vec![(
            META_LAST_APPLIED.to_vec(),
            Some(encode(&Some(lid(100 + batch)))),
        )];
        for r in sm.shared.mvcc.apply(&reqs, &meta).unwrap() {
            r.unwrap();
        }
    }
    sm.shared.mvcc.flush().unwrap();
    let snap = save(&mut sm, &src.path().join("sent")).await;
    let len = std::fs::metadata(&snap.path).unwrap().len();
    for staged in [false, true, false, true] {
        let d = tempfile::tempdir().unwrap();
        let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
        let t0 = std::time::Instant::now();
        let file = if staged {
            receive(&sm, &snap).await
        } else {
            let mut inc = sm.receive_snapshot().unwrap();
            inc.append(&std::fs::read(&snap.path).unwrap()).unwrap();
            SnapshotData::File(inc.finish().unwrap())
        };
        let received = t0.elapsed();
        sm.install_snapshot(&snap.meta, file).await.unwrap();
        eprintln!(
            "{len} bytes, staged as received: {staged}: received in {received:?}, installed {:?} later",
            t0.elapsed() - received
        );
    }
}

/// A member keeps no copy of its store as a snapshot: a build writes no file, the snapshot a
/// leader sends is its state when sent (newer than the last build), and a follower that
/// installed one keeps no file once the load is done. A file the engine is past (as a version
/// that kept snapshot files leaves) is removed when the state machine opens.
#[tokio::test]
async fn a_snapshot_is_the_current_state_and_no_file_is_kept() {
    let src = tempfile::tempdir().unwrap();
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(src.path()).unwrap();
    fill(&sm, "a/", 50, 7, 100, &[1, 2, 3]);
    let built = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(built.meta.last_log_id, Some(lid(100)));
    assert_eq!(
        newest_snapshot_index(src.path()),
        0,
        "a build writes no file"
    );
    fill(&sm, "b/", 30, 8, 140, &[1, 2, 3]);
    let want = observe(&sm);
    let sent = save(&mut sm, &src.path().join("sent")).await;
    assert_eq!(sent.meta.last_log_id, Some(lid(140)), "the state when sent");

    let d = tempfile::tempdir().unwrap();
    template(d.path(), 20).await;
    let mut follower = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    let file = receive(&follower, &sent).await;
    follower.install_snapshot(&sent.meta, file).await.unwrap();
    assert_eq!(observe(&follower), want);
    let left: Vec<_> = std::fs::read_dir(d.path().join("snap"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "files left after the install: {left:?}");
    drop(follower);
    assert_eq!(
        observe(&crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap()),
        want
    );

    // An older version's file, older than the engine: removed at open, the state untouched.
    std::fs::copy(
        &sent.path,
        d.path().join("snap").join("000000000000008c.snap"),
    )
    .unwrap();
    let reopened = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    assert_eq!(observe(&reopened), want);
    assert_eq!(newest_snapshot_index(d.path()), 0);
}

/// A defragmentation that starts while a snapshot is being sent waits for the send to end
/// without pausing applies (it does not hold the gate applies read), then runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_defragmentation_waits_for_a_send_without_pausing_applies() {
    let d = tempfile::tempdir().unwrap();
    let mut sm = crate::raft::sm::state_machine::apply_tests::reopen(d.path()).unwrap();
    fill(&sm, "a/", 40, 7, 100, &[1, 2, 3]);
    let want = observe(&sm);
    let sending = sm.get_current_snapshot().await.unwrap().unwrap();
    let defrag = tokio::spawn({
        let sm = sm.clone();
        async move { sm.defragment().await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!defrag.is_finished(), "the defragmentation did not wait");
    assert!(
        sm.shared.defrag_gate.try_read().is_ok(),
        "applies are paused while the send goes on"
    );
    drop(sending);
    let done = tokio::time::timeout(std::time::Duration::from_secs(20), defrag)
        .await
        .expect("the defragmentation ran once the send ended")
        .unwrap()
        .unwrap();
    assert!(done.records > 0);
    assert_eq!(observe(&sm), want);
    // Copied aside without a wait per write, the new engine waits for the disk once current.
    assert!(
        !sm.shared.mvcc.engine().writes_back(),
        "the defragmented engine still only starts its writeback"
    );
}
