//! Backups: `snapshot save` from a serving member while writes go on, `snapshot status`,
//! `snapshot restore` into a new three-member cluster that serves every key at every revision
//! the backup holds (with its leases and compaction), refusal of damaged files, and refusal to
//! start on an etcd data dir. Against a real etcd (both directions) in `etcd_interop`, which
//! needs etcd on PATH and is `--ignored`.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::Cluster;
use kvd::proto::etcdserverpb::lease_client::LeaseClient;
use kvd::proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseTimeToLiveRequest,
    MemberAddRequest, MemberListRequest, PutRequest, RangeRequest,
};
use kvd::proto::mvccpb::KeyValue;

fn kvctl(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kvctl"))
        .args(args)
        .output()
        .expect("run kvctl")
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "kvctl failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Every key at revision `rev` (0 = current).
async fn all_at(url: &str, rev: i64) -> Result<Vec<KeyValue>, tonic::Status> {
    let mut kv = kvd::proto::etcdserverpb::kv_client::KvClient::new(common::channel(url).await);
    let r = kv
        .range(RangeRequest {
            key: vec![0],
            range_end: vec![0],
            revision: rev,
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().kvs)
}

/// A history with overwrites, a delete, a lease with a key on it and a compaction.
/// Returns (lease id, compacted revision).
async fn write_history(url: &str) -> (i64, i64) {
    let ch = common::channel(url).await;
    let mut kv = kvd::proto::etcdserverpb::kv_client::KvClient::new(ch.clone());
    for i in 0..60 {
        common::put(&mut kv, &format!("k{:02}", i % 15), &format!("v{i}"))
            .await
            .unwrap();
    }
    kv.delete_range(DeleteRangeRequest {
        key: b"k03".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    let lease = LeaseClient::new(ch)
        .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
        .await
        .unwrap()
        .into_inner()
        .id;
    kv.put(PutRequest {
        key: b"leased".to_vec(),
        value: vec![7; 20_000],
        lease,
        ..Default::default()
    })
    .await
    .unwrap();
    let compacted = 30;
    kv.compact(CompactionRequest {
        revision: compacted,
        physical: true,
    })
    .await
    .unwrap();
    for i in 0..5 {
        common::put(&mut kv, &format!("after{i}"), "x")
            .await
            .unwrap();
    }
    (lease, compacted)
}

/// Restores `file` into three data dirs under `dir` and starts them as a new cluster.
async fn restored_cluster(file: &Path) -> Cluster {
    let mut c = Cluster::unstarted(tempfile::tempdir().unwrap(), "r", 3, |_| Vec::new());
    for m in &c.members {
        ok(&kvctl(&[
            "snapshot",
            "restore",
            file.to_str().unwrap(),
            "--name",
            &m.name,
            "--initial-cluster",
            &c.initial_cluster,
            "--initial-cluster-token",
            "test-cluster",
            "--initial-advertise-peer-urls",
            &m.peer_url(),
            "--data-dir",
            m.data_dir.to_str().unwrap(),
        ]));
    }
    for i in 0..3 {
        c.spawn(i);
    }
    c.wait_for_leader(Duration::from_secs(30)).await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_into_a_new_cluster_with_every_revision_lease_and_compaction() {
    let src = Cluster::start(1).await;
    let url = src.members[0].client_url();
    let (lease, compacted) = write_history(&url).await;

    // Save while another client keeps writing.
    let writer_url = url.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let writer = tokio::spawn(async move {
        let mut kv =
            kvd::proto::etcdserverpb::kv_client::KvClient::new(common::channel(&writer_url).await);
        let mut n = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            common::put(&mut kv, &format!("during{}", n % 20), "w")
                .await
                .unwrap();
            n += 1;
        }
        n
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let file = src.dir.path().join("backup.db");
    let f = file.to_str().unwrap().to_string();
    let saved =
        tokio::task::spawn_blocking(move || kvctl(&["--endpoints", &url, "snapshot", "save", &f]))
            .await
            .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert_eq!(
        ok(&saved),
        format!("Snapshot saved at {}\n", file.display())
    );
    assert!(writes > 0, "writes went on during the save");
    assert!(!Path::new(&format!("{}.part", file.display())).exists());

    let status = ok(&kvctl(&[
        "snapshot",
        "status",
        file.to_str().unwrap(),
        "-w",
        "json",
    ]));
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    let rev = st["revision"].as_i64().unwrap();
    assert!(rev > 66, "{status}");
    assert_eq!(
        st["totalSize"].as_u64().unwrap() + 32,
        std::fs::metadata(&file).unwrap().len()
    );

    let dst = restored_cluster(&file).await;
    let new_url = dst.members[1].client_url();
    // The backup is a point in time between the writes: everything up to its revision
    // reads the same on both clusters, from the compaction on.
    let src_url = src.members[0].client_url();
    for r in compacted..=rev {
        assert_eq!(
            all_at(&src_url, r).await.unwrap(),
            all_at(&new_url, r).await.unwrap(),
            "at revision {r}"
        );
    }
    let err = all_at(&new_url, compacted - 1).await.unwrap_err();
    assert_eq!(
        err.message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    let future = all_at(&new_url, rev + 1).await.unwrap_err();
    assert_eq!(
        future.message(),
        "etcdserver: mvcc: required revision is a future revision"
    );

    let ttl = LeaseClient::new(common::channel(&new_url).await)
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: lease,
            keys: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ttl.granted_ttl, 600);
    assert_eq!(ttl.keys, vec![b"leased".to_vec()]);

    let mut kv = dst.kv(0).await;
    assert_eq!(common::put(&mut kv, "new", "1").await.unwrap(), rev + 1);

    let members = dst
        .cluster(2)
        .await
        .member_list(MemberListRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(members.members.len(), 3);
    let old_id = src.status(0).await.header.unwrap().member_id;
    assert!(members.members.iter().all(|m| m.id != old_id));

    // A member added later gets the restored data: the log below the restore is purged, so
    // it can only arrive by snapshot.
    let mut dst = dst;
    let n = dst.new_member("r3");
    // A new cluster's links count as active after 5 s (etcd's reconfiguration check).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let added = loop {
        let r = dst
            .cluster(0)
            .await
            .member_add(MemberAddRequest {
                peer_ur_ls: vec![dst.members[n].peer_url()],
                is_learner: true,
            })
            .await;
        match r {
            Ok(r) => break r.into_inner(),
            Err(e)
                if e.message() == "etcdserver: unhealthy cluster"
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            Err(e) => panic!("member add: {e:?}"),
        }
    };
    dst.members[n].join = Some(common::initial_cluster_for(&added, "r3"));
    dst.spawn(n);
    let learner_url = dst.members[n].client_url();
    let want = all_at(&new_url, rev).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut kv =
            kvd::proto::etcdserverpb::kv_client::KvClient::new(common::channel(&learner_url).await);
        let got = kv
            .range(RangeRequest {
                key: vec![0],
                range_end: vec![0],
                revision: rev,
                serializable: true,
                ..Default::default()
            })
            .await;
        match got {
            Ok(r) if r.get_ref().kvs == want => break,
            _ if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            other => panic!(
                "the added member never served the restored data: {other:?}\n{}",
                dst.log_of(n)
            ),
        }
    }
}

#[test]
fn damaged_backups_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let restore = |file: &Path, data: &Path, skip: bool| {
        let mut args = vec![
            "snapshot",
            "restore",
            file.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ];
        if skip {
            args.push("--skip-hash-check");
        }
        kvctl(&args)
    };
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // Not a database at all, with and without a trailer-sized tail.
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![b'x'; 4096]).unwrap();
    let data = dir.path().join("d1");
    let o = restore(&junk, &data, false);
    assert!(!o.status.success());
    assert!(
        err(&o).contains("snapshot missing hash but --skip-hash-check=false"),
        "{}",
        err(&o)
    );
    let o = restore(&junk, &data, true);
    assert!(!o.status.success());
    assert!(
        err(&o).contains("not a valid snapshot database"),
        "{}",
        err(&o)
    );
    assert!(!data.exists());
    assert!(!dir.path().join("d1.restoring").exists());

    let o = kvctl(&["snapshot", "status", junk.to_str().unwrap()]);
    assert!(!o.status.success());

    let missing = kvctl(&["snapshot", "status", "/nonexistent/x.db"]);
    assert_eq!(
        err(&missing),
        "Error: stat /nonexistent/x.db: no such file or directory\n"
    );

    let o = kvctl(&["snapshot", "restore"]);
    assert_eq!(o.status.code(), Some(128));
    assert_eq!(
        err(&o),
        "Error: snapshot restore requires exactly one argument\n"
    );

    // An existing data dir is refused with etcdctl's words.
    std::fs::create_dir(&data).unwrap();
    let o = restore(&junk, &data, true);
    assert_eq!(
        err(&o),
        format!("Error: data-dir {:?} exists\n", data.display().to_string())
    );
}

#[test]
fn kvd_refuses_to_start_on_an_etcd_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("etcd-data");
    std::fs::create_dir_all(data.join("member/snap")).unwrap();
    std::fs::write(data.join("member/snap/db"), b"bolt").unwrap();
    let out = common::single_member(&data, "e").output().expect("run kvd");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is an etcd data dir"), "{stderr}");
    assert!(stderr.contains("kvctl snapshot restore"), "{stderr}");
    assert!(!data.join("member/member.json").exists());
}
