//! A restore streams the history: a content error found part way stops it with nothing left.

use prost::Message;

use super::*;
use crate::bbolt::Writer;
use crate::mvcc::etcd_format::{lease_to_etcd, rev_key};
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
