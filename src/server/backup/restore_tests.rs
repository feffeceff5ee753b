//! A restore streams the history: a content error found part way stops it with nothing left.

use prost::Message;

use super::*;
use crate::bbolt::Writer;
use crate::mvcc::etcd::format::{lease_to_etcd, rev_key};
use crate::mvcc::Revision;
use crate::proto::mvccpb::KeyValue;

/// An etcd backup (no hash trailer) of `n` puts, the last one attached to lease 9, which the
/// lease bucket holds only if `with_lease`.
fn backup(path: &Path, n: i64, with_lease: bool) {
    let mut w = Writer::create(path).unwrap();
    w.bucket(KEY_BUCKET).unwrap();
    for main in 2..2 + n {
        let kv = KeyValue {
            key: format!("k{main:06}").into_bytes(),
            create_revision: main,
            mod_revision: main,
            version: 1,
            value: vec![b'v'; 100],
            lease: if main == 1 + n { 9 } else { 0 },
        };
        let k = rev_key(Revision { main, sub: 0 }, false);
        w.put(&k, &kv.encode_to_vec()).unwrap();
    }
    w.bucket(LEASE_BUCKET).unwrap();
    if with_lease {
        let (k, v) = lease_to_etcd(9, 60);
        w.put(&k, &v).unwrap();
    }
    w.bucket(META_BUCKET).unwrap();
    w.finish(7).unwrap();
}

fn options(file: &Path, data_dir: &Path) -> RestoreOptions {
    RestoreOptions {
        file: file.to_path_buf(),
        name: "m1".into(),
        initial_cluster: "m1=http://127.0.0.1:2380".into(),
        initial_cluster_token: "t".into(),
        initial_advertise_peer_urls: "http://127.0.0.1:2380".into(),
        data_dir: data_dir.to_path_buf(),
        wal_dir: None,
        skip_hash_check: true,
    }
}

#[test]
fn a_streamed_restore_keeps_every_record_and_stops_cleanly_on_bad_content() {
    let d = tempfile::tempdir().unwrap();
    let good = d.path().join("good.db");
    backup(&good, 5000, true);
    let data = d.path().join("data");
    let r = restore(&options(&good, &data)).unwrap();
    assert_eq!((r.keys, r.revision), (5000, 5001));
    assert!(data.join("member").is_dir());

    // The missing lease is found only after the whole history has streamed.
    let bad = d.path().join("bad.db");
    backup(&bad, 5000, false);
    let data = d.path().join("data2");
    match restore(&options(&bad, &data)) {
        Err(BackupError::Content { source, .. }) => {
            assert!(source.to_string().contains("lease 9"), "{source}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!data.exists());
    assert!(!part_dir(&data).exists());
}

/// `--wal-dir`: refused when it exists (etcdctl's words), before anything is written;
/// otherwise made empty and named for the restored member.
#[test]
fn a_restore_with_a_wal_dir_makes_it_empty_and_names_it() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("b.db");
    backup(&file, 10, true);
    let taken = d.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    let mut o = options(&file, &d.path().join("data1"));
    o.wal_dir = Some(taken.clone());
    let e = restore(&o).unwrap_err();
    assert_eq!(e.to_string(), format!("wal-dir {taken:?} exists"));
    assert!(!d.path().join("data1").exists());

    let wal = d.path().join("wal");
    o.wal_dir = Some(wal.clone());
    let r = restore(&o).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["member"]);
    assert_eq!(
        std::fs::read_to_string(wal.join("member")).unwrap(),
        format!("{:x} {:x}\n", r.cluster_id, r.member_id)
    );
}

/// The hash is checked beside the restore, not before it: a wrong hash over good content is
/// found after the history was written, and a damaged file reports its hash (as etcdctl,
/// which checks it first) ahead of the content's error; both leave nothing.
#[test]
fn a_wrong_hash_is_reported_first_and_leaves_nothing() {
    use sha2::{Digest, Sha256};
    let d = tempfile::tempdir().unwrap();
    let plain = d.path().join("plain.db");
    backup(&plain, 3000, true);
    let body = std::fs::read(&plain).unwrap();
    let with = |body: &[u8], trailer: &[u8]| {
        let f = d.path().join(format!("b{}.db", trailer[0]));
        std::fs::write(&f, [body, trailer].concat()).unwrap();
        f
    };
    let sum: [u8; TRAILER_LEN] = Sha256::digest(&body).into();
    let checked = |file: &Path, data: &Path| {
        let mut o = options(file, data);
        o.skip_hash_check = false;
        restore(&o)
    };

    let data = d.path().join("ok");
    let r = checked(&with(&body, &sum), &data).unwrap();
    assert_eq!(r.keys, 3000);

    let mut wrong = sum;
    wrong[0] ^= 1;
    let data = d.path().join("wrong-hash");
    assert!(matches!(
        checked(&with(&body, &wrong), &data),
        Err(BackupError::HashMismatch { .. })
    ));
    assert!(!data.exists());
    assert!(!part_dir(&data).exists());

    // Every page of the history zeroed: the content does not decode, the hash wins.
    let mut damaged = body.clone();
    let half = damaged.len() / 2;
    damaged[4096..half].fill(0);
    let data = d.path().join("damaged");
    let mut trailer = sum;
    trailer[0] = trailer[0].wrapping_add(2);
    match checked(&with(&damaged, &trailer), &data) {
        Err(BackupError::HashMismatch { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(!data.exists());
    assert!(!part_dir(&data).exists());
    // The content error itself, without the hash.
    let mut o = options(&with(&damaged, &trailer), &d.path().join("skipped"));
    o.skip_hash_check = true;
    assert!(restore(&o).is_err());
}
