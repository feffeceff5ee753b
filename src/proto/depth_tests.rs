use prost::Message;

use super::*;
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{Compare, PutRequest, RequestOp, TxnRequest};
use crate::proto::kvdpb::{internal_request, InternalRequest};

/// A txn whose success branch holds a txn ... `levels` deep, with a put at the bottom.
pub(crate) fn nested_txn(levels: usize) -> TxnRequest {
    let mut op = RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })),
    };
    let level = |op: RequestOp| TxnRequest {
        compare: vec![Compare {
            key: b"k".to_vec(),
            ..Default::default()
        }],
        success: vec![op],
        failure: vec![],
    };
    if levels == 0 {
        return TxnRequest::default();
    }
    for _ in 1..levels {
        op = RequestOp {
            request: Some(Request::RequestTxn(level(op))),
        };
    }
    level(op)
}

#[test]
fn etcds_deepest_txn_is_within_the_request_bound_and_decodes() {
    let bytes = nested_txn(128).encode_to_vec();
    assert!(within(&bytes, REQUEST_LIMIT));
    assert!(max_depth(&bytes, usize::MAX) > 2 * 127);
    let deepest = (REQUEST_LIMIT - 2) / 2;
    assert!(within(&nested_txn(deepest).encode_to_vec(), REQUEST_LIMIT));
    // On a thread with a 2 MiB stack (tokio's workers' default), in a debug build too.
    let decoded = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || TxnRequest::decode(bytes.as_slice()).unwrap())
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(decoded, nested_txn(128));
}

#[test]
fn the_log_bound_covers_a_request_at_the_request_bound_wrapped_for_the_log() {
    let levels = (REQUEST_LIMIT - 2) / 2;
    let txn = nested_txn(levels);
    assert!(within(&txn.encode_to_vec(), REQUEST_LIMIT));
    let entry = InternalRequest {
        request: Some(internal_request::Request::Txn(txn)),
        ..Default::default()
    };
    assert!(within(&entry.encode_to_vec(), LOG_LIMIT));
}

#[test]
fn deeper_txns_are_refused() {
    assert!(!within(
        &nested_txn(REQUEST_LIMIT / 2 + 1).encode_to_vec(),
        REQUEST_LIMIT
    ));
    assert!(!within(&nested_txn_bytes(100_000), REQUEST_LIMIT));
}

/// The encoding of a txn nested `levels` deep, built without recursion (encoding or dropping
/// a `TxnRequest` that deep would overflow the stack).
pub(crate) fn nested_txn_bytes(levels: usize) -> Vec<u8> {
    let wrap = |field: u8, inner: &[u8]| {
        let mut out = vec![(field << 3) | 2];
        prost::encoding::encode_varint(inner.len() as u64, &mut out);
        out.extend_from_slice(inner);
        out
    };
    let mut txn = Vec::new();
    for _ in 0..levels {
        let op = wrap(4, &txn); // RequestOp.request_txn
        txn = wrap(2, &op); // TxnRequest.success
    }
    txn
}

#[test]
fn nested_groups_are_counted() {
    // Field 1, start group, a million times: 1 MiB that would recurse a million levels.
    let bytes = vec![0x0b_u8; 1 << 20];
    assert!(!within(&bytes, REQUEST_LIMIT));
    // Properly closed groups 10 deep are fine.
    let mut ok = vec![0x0b_u8; 10];
    ok.extend(std::iter::repeat_n(0x0c_u8, 10));
    assert_eq!(max_depth(&ok, usize::MAX), 10);
    // An end-group for a field that is not open is malformed: the scan stops there.
    assert_eq!(max_depth(&[0x0b, 0x14, 0x0b, 0x0b], usize::MAX), 1);
}

#[test]
fn a_deep_prefix_inside_a_malformed_payload_still_counts() {
    // A bytes field whose content starts as 400 nested groups and then turns malformed: prost
    // would recurse through the groups if the field were a message, so they count.
    let mut inner = vec![0x0b_u8; 400];
    inner.push(0xff);
    let mut msg = vec![0x0a];
    prost::encoding::encode_varint(inner.len() as u64, &mut msg);
    msg.extend(&inner);
    assert!(!within(&msg, REQUEST_LIMIT));
}

#[test]
fn plain_values_are_not_mistaken_for_deep_messages() {
    let put = PutRequest {
        key: vec![b'k'; 100],
        value: (0..200_000u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ..Default::default()
    };
    assert!(within(&put.encode_to_vec(), REQUEST_LIMIT));
    let text = PutRequest {
        key: b"k".to_vec(),
        value: "some text value ".repeat(10_000).into_bytes(),
        ..Default::default()
    };
    assert!(within(&text.encode_to_vec(), REQUEST_LIMIT));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    /// The scan never reports less than the real nesting of a nested txn, and never panics on
    /// arbitrary bytes.
    #[test]
    fn bound_is_an_upper_bound(levels in 0usize..160, junk in proptest::collection::vec(0u8.., 0..2000)) {
        let bytes = nested_txn(levels).encode_to_vec();
        let d = max_depth(&bytes, usize::MAX);
        proptest::prop_assert!(d + 1 >= 2 * levels);
        let _ = max_depth(&junk, REQUEST_LIMIT);
        let _ = within(&junk, 3);
    }
}
