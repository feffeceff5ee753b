//! Compaction on real `kvd` processes: `--auto-compaction-*` (periodic with a short retention;
//! the revision mode's 5-minute schedule is unit-tested on a paused clock in
//! `server::compactor`), etcd's refusals of bad flag values, and `Compact` with `physical`,
//! which answers only once this member has deleted the compacted records.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, put, single_member, Cluster};
use kvd::proto::etcdserverpb::{CompactionRequest, RangeRequest};
use tonic::Code;

const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

async fn read_at(c: &Cluster, key: &str, rev: i64) -> Result<Vec<u8>, tonic::Status> {
    let r = c
        .kv(0)
        .await
        .range(RangeRequest {
            key: key.into(),
            revision: rev,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.kvs.first().map(|kv| kv.value.clone()).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_auto_compaction_compacts_what_is_older_than_the_retention() {
    let c = Cluster::start_opts(
        1,
        false,
        &[
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=2s",
        ],
    )
    .await;
    let started = Instant::now();
    let mut kv = c.kv(0).await;
    let first = put(&mut kv, "k", "old").await.unwrap();
    for i in 0..5 {
        put(&mut kv, "k", &format!("v{i}")).await.unwrap();
    }
    assert_eq!(read_at(&c, "k", first).await.unwrap(), b"old");

    // Compactions run every 2 s, each to the revision seen 2 s before: within a few seconds
    // the first write is compacted away, the newest revision is not.
    let deadline = Instant::now() + Duration::from_secs(20);
    let err = loop {
        match read_at(&c, "k", first).await {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "never compacted\n{}",
                    c.log_of(0)
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!((err.code(), err.message()), (Code::OutOfRange, COMPACTED));
    let last = put(&mut kv, "k", "new").await.unwrap();
    assert_eq!(read_at(&c, "k", last).await.unwrap(), b"new");

    // One pair of lines per compaction, nothing per 200 ms check.
    let log = c.log_of(0);
    let starts = log.matches("Starting auto-compaction at revision").count();
    let finishes = log.matches("Finished auto-compaction at revision").count();
    assert!(starts >= 1 && finishes >= 1, "{log}");
    let most = started.elapsed().as_secs() as usize / 2 + 1;
    assert!(
        starts <= most,
        "{starts} compactions in {:?}\n{log}",
        started.elapsed()
    );
    assert!(log.contains("(retention: 2s)"), "{log}");
}

/// `kvd` with the given auto-compaction flags: (exit status, output) if it exits within 5 s.
fn start_with(args: &[&str]) -> Option<(std::process::ExitStatus, String)> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let f = std::fs::File::create(&out).unwrap();
    let mut child = single_member(&dir.path().join("d"), "m")
        .args(args)
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().unwrap() {
            return Some((st, std::fs::read_to_string(&out).unwrap()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn bad_auto_compaction_flags_are_refused_with_etcds_messages() {
    for (args, msg) in [
        (
            &[
                "--auto-compaction-mode=foo",
                "--auto-compaction-retention=1",
            ][..],
            "unknown auto-compaction-mode \"foo\"",
        ),
        (
            &["--auto-compaction-retention=abc"][..],
            "error parsing CompactionRetention: time: invalid duration \"abc\"",
        ),
        (
            &[
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=1.5",
            ][..],
            "error parsing CompactionRetention: time: missing unit in duration \"1.5\"",
        ),
    ] {
        let (st, out) = start_with(args).expect("kvd should refuse to start");
        assert!(!st.success(), "{args:?}");
        assert!(out.contains(msg), "{args:?}: {out}");
    }
    // A valid revision mode starts (and keeps running).
    assert!(start_with(&[
        "--auto-compaction-mode=revision",
        "--auto-compaction-retention=1000"
    ])
    .is_none());
}

async fn compaction_keys_metric(port: u16) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let name = "etcd_debugging_mvcc_db_compaction_keys_total ";
    buf.lines()
        .find_map(|l| l.strip_prefix(name)?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{buf}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn physical_compaction_answers_once_the_records_are_deleted() {
    let port = free_port();
    let c = Cluster::start_opts(
        1,
        false,
        &[&format!("--listen-metrics-urls=http://127.0.0.1:{port}")],
    )
    .await;
    let mut kv = c.kv(0).await;
    let keys = 10;
    let writes = 600;
    for i in 0..writes {
        put(&mut kv, &format!("k{}", i % keys), "v").await.unwrap();
    }
    let at = put(&mut kv, "last", "v").await.unwrap();
    assert_eq!(compaction_keys_metric(port).await, 0.0);
    let resp = kv
        .compact(CompactionRequest {
            revision: at,
            physical: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.header.unwrap().revision, at);
    // Every overwritten revision is gone by the time the answer arrives.
    assert_eq!(
        compaction_keys_metric(port).await,
        f64::from(writes - keys),
        "physical compaction answered before its records were deleted"
    );
    let err = read_at(&c, "k1", at - 1).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::OutOfRange, COMPACTED));
    assert_eq!(read_at(&c, "k1", at).await.unwrap(), b"v");

    // Physical again at the same revision: etcd's "compacted" error, at once.
    let err = kv
        .compact(CompactionRequest {
            revision: at,
            physical: true,
        })
        .await
        .unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::OutOfRange, COMPACTED));
}
