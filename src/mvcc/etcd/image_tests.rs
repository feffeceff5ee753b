//! A store exported in etcd's form and imported back reads the same at every revision.

use crate::mvcc::tests::{compact, del, put, temp_store};
use crate::mvcc::*;
use crate::proto::etcdserverpb::{LeaseGrantRequest, PutRequest, RangeRequest};
use crate::proto::mvccpb::KeyValue;

fn range_at(s: &MvccStore, rev: i64) -> Vec<KeyValue> {
    let r = s
        .range(&RangeRequest {
            key: vec![0],
            range_end: vec![0],
            revision: rev,
            ..Default::default()
        })
        .unwrap();
    r.kvs
}

#[test]
fn export_then_import_keeps_every_revision_lease_and_the_compaction() {
    let (_d1, _e1, a) = temp_store();
    let grant = WriteRequest::LeaseGrant(LeaseGrantRequest { id: 7, ttl: 90 });
    a.apply(&[grant], &[]).unwrap();
    for i in 0..20 {
        put(&a, &format!("k{}", i % 6), &format!("v{i}"));
    }
    let leased = WriteRequest::Put(PutRequest {
        key: b"leased".to_vec(),
        value: b"x".to_vec(),
        lease: 7,
        ..Default::default()
    });
    a.apply(&[leased], &[]).unwrap();
    del(&a, "k1", "");
    compact(&a, 12).unwrap();
    put(&a, "k2", "after");
    del(&a, "k3", "");

    let image = a.image().unwrap();
    let (rev, compacted) = (image.revision(), image.compacted().unwrap());
    assert_eq!((rev, compacted), (a.current_revision(), 12));
    let leases = image.etcd_leases().unwrap();
    let history: Vec<_> = image.etcd_history().collect::<Result<_, _>>().unwrap();
    assert!(history.windows(2).all(|w| w[0].0 < w[1].0));

    let (entries, current) = entries_from_etcd(history, leases, Some(compacted)).unwrap();
    assert_eq!(current, rev);
    let (_d2, _e2, b) = temp_store();
    b.load(entries, &[]).unwrap();
    assert_eq!(b.current_revision(), rev);
    assert_eq!(b.compacted_revision(), 12);
    assert_eq!(b.leases().unwrap(), vec![(7, 90)]);
    for r in 12..=rev {
        assert_eq!(range_at(&a, r), range_at(&b, r), "at revision {r}");
    }
    assert!(matches!(
        b.range(&RangeRequest {
            key: b"k".to_vec(),
            revision: 11,
            ..Default::default()
        }),
        Err(MvccError::Compacted)
    ));
}

#[test]
fn import_refuses_disorder_and_keys_on_missing_leases() {
    let (_d, _e, a) = temp_store();
    put(&a, "a", "1");
    put(&a, "b", "2");
    let history: Vec<_> = a
        .image()
        .unwrap()
        .etcd_history()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut reversed = history.clone();
    reversed.reverse();
    assert!(entries_from_etcd(reversed, vec![], None).is_err());
    assert!(entries_from_etcd(history, vec![], None).is_ok());

    let (_d, _e, l) = temp_store();
    let grant = WriteRequest::LeaseGrant(LeaseGrantRequest { id: 5, ttl: 30 });
    let leased = WriteRequest::Put(PutRequest {
        key: b"k".to_vec(),
        lease: 5,
        ..Default::default()
    });
    l.apply(&[grant, leased], &[]).unwrap();
    let history: Vec<_> = l
        .image()
        .unwrap()
        .etcd_history()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(entries_from_etcd(history, vec![], None).is_err());
}

#[test]
fn an_empty_store_imports_at_revision_one() {
    let (entries, current) = entries_from_etcd(vec![], vec![], None).unwrap();
    assert_eq!(current, 1);
    let (_d, _e, b) = temp_store();
    b.load(entries, &[]).unwrap();
    assert_eq!(b.current_revision(), 1);
}
