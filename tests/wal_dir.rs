//! `--wal-dir` (etcd's dedicated WAL directory) on real `kvd` processes: the log goes there and
//! survives restarts; a member started without the log it was built from (the flag dropped,
//! added, or pointed at another member's log, or the same log while it is in use) refuses to
//! start, and nothing it holds is changed by the attempt; a log without its name (written by an
//! earlier kvd) is adopted.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{get, put, single_member, Cluster};

/// Starts member 0 of `c` and waits until it serves writes.
async fn restart(c: &mut Cluster) {
    c.spawn(0);
    c.wait_for_leader(Duration::from_secs(20)).await;
}

/// Starts member 0 of `c`, which must refuse: returns its log.
fn refused(c: &mut Cluster) -> String {
    c.spawn(0);
    let st = c
        .wait_exit(0, Duration::from_secs(20))
        .expect("kvd should refuse to start");
    assert!(!st.success());
    c.log_of(0)
}

fn segments(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".wal"))
            .count()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_lives_in_the_wal_dir_and_a_member_refuses_any_other_log() {
    let wal = tempfile::tempdir().unwrap();
    let wal_arg = format!("--wal-dir={}", wal.path().display());
    let mut c = Cluster::start_opts(1, false, &[&wal_arg]).await;
    let mut kv = c.kv(0).await;
    let rev = put(&mut kv, "k", "v").await.unwrap();
    let member_dir = c.members[0].data_dir.join("member");
    assert!(segments(wal.path()) > 0, "segments in --wal-dir");
    assert!(!member_dir.join("wal").exists(), "nothing in member/wal");

    // The same member started again while it runs: the WAL directory is locked.
    let out = single_member(&c.members[0].data_dir, "m0")
        .arg(&wal_arg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("in use by another process"), "{err}");

    // A restart finds the write.
    c.stop(0);
    restart(&mut c).await;
    let mut kv = c.kv(0).await;
    assert_eq!(get(&mut kv, "k").await.unwrap().as_deref(), Some("v"));
    c.stop(0);

    // Without the flag the member would start on an empty log under its applied state.
    c.members[0].extra_args.clear();
    let log = refused(&mut c);
    assert!(log.contains("holds no log"), "{log}");

    // Another member's data dir given this WAL directory.
    let other = tempfile::tempdir().unwrap();
    let out = single_member(&other.path().join("d"), "x")
        .arg(&wal_arg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("belongs to cluster/member"), "{err}");

    // A directory of etcd's WAL segments.
    let etcd_wal = tempfile::tempdir().unwrap();
    std::fs::write(
        etcd_wal
            .path()
            .join("0000000000000000-0000000000000000.wal"),
        b"",
    )
    .unwrap();
    let out = single_member(&other.path().join("e"), "x")
        .arg(format!("--wal-dir={}", etcd_wal.path().display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("holds etcd's WAL"), "{err}");
    assert!(!etcd_wal.path().join("member").exists());

    // Moved back by hand (segments and all) into member/wal, the member starts on its log.
    std::fs::remove_dir_all(member_dir.join("wal")).unwrap();
    std::fs::create_dir(member_dir.join("wal")).unwrap();
    for e in std::fs::read_dir(wal.path()).unwrap() {
        let e = e.unwrap();
        std::fs::rename(e.path(), member_dir.join("wal").join(e.file_name())).unwrap();
    }
    // Without its `member` file, as a data dir of an earlier kvd: adopted and named.
    std::fs::remove_file(member_dir.join("wal/member")).unwrap();
    restart(&mut c).await;
    let mut kv = c.kv(0).await;
    assert_eq!(get(&mut kv, "k").await.unwrap().as_deref(), Some("v"));
    assert!(put(&mut kv, "k2", "v").await.unwrap() > rev);
    c.stop(0);
    assert!(member_dir.join("wal/member").exists());

    // --wal-dir added while the log is still in member/wal.
    let fresh = tempfile::tempdir().unwrap();
    c.members[0].extra_args = vec![format!("--wal-dir={}", fresh.path().display())];
    let log = refused(&mut c);
    assert!(log.contains("this member's log is in"), "{log}");
    assert_eq!(
        segments(fresh.path()),
        0,
        "nothing written to the new directory"
    );
}
