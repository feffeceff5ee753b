//! The gRPC codec of every kvd service: prost's, with the nesting bound of [`super::depth`]
//! checked before a message is decoded (prost itself is built without a recursion limit).
//!
//! A request nested deeper than [`super::depth::REQUEST_LIMIT`] never reaches prost: a
//! `TxnRequest` gets etcd's answer for a txn beyond its operation budget (InvalidArgument,
//! "etcdserver: too many operations in txn request"), any other message the status a
//! malformed message gets. A member URL that is not UTF-8 gets etcd's "given member URLs are
//! invalid", not a decode failure.

use std::any::TypeId;
use std::marker::PhantomData;

use bytes::{Buf, Bytes};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use super::depth;
use super::etcdserverpb::{MemberAddRequest, MemberUpdateRequest, TxnRequest};

/// etcd's status for a txn whose nesting exceeds its operation budget.
const TOO_MANY_OPS: &str = "etcdserver: too many operations in txn request";

#[derive(Debug, Clone)]
pub struct KvdCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for KvdCodec<T, U> {
    fn default() -> Self {
        KvdCodec(PhantomData)
    }
}

impl<T, U> Codec for KvdCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = KvdEncoder<T>;
    type Decoder = KvdDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        KvdEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        KvdDecoder(PhantomData)
    }
}

#[derive(Debug)]
pub struct KvdEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for KvdEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // EncodeBuf grows as needed, so encoding cannot run out of space.
        item.encode(buf)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

#[derive(Debug)]
pub struct KvdDecoder<U>(PhantomData<U>);

impl<U: Message + Default + 'static> Decoder for KvdDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // tonic's buffer hands the message over without a copy (it splits it off). Decoding
        // from `Bytes` lets `bytes` fields built as `Bytes` (build.rs) slice it, and makes a
        // `Vec<u8>` field one copy: from a `&[u8]`, prost copies each such field twice.
        let data = buf.copy_to_bytes(buf.remaining());
        decode_request::<U>(data).map(Some)
    }
}

/// Decodes one request as every kvd service does: the nesting bound first, then prost.
pub fn decode_request<U: Message + Default + 'static>(data: Bytes) -> Result<U, Status> {
    if !depth::within(&data, depth::REQUEST_LIMIT) {
        return Err(too_deep::<U>());
    }
    U::decode(data.clone()).map_err(|e| undecodable::<U>(&data, e))
}

/// etcd's answer for a message that does not decode. Go does not check that proto3 strings
/// are UTF-8, so etcd sees a member URL that is not as an invalid URL; prost refuses the
/// whole message. Such a message decodes as [`LenientMemberAdd`] / [`LenientMemberUpdate`].
fn undecodable<U: 'static>(data: &[u8], e: prost::DecodeError) -> Status {
    let id = TypeId::of::<U>();
    let bad_urls = (id == TypeId::of::<MemberAddRequest>()
        && LenientMemberAdd::decode(data).is_ok())
        || (id == TypeId::of::<MemberUpdateRequest>() && LenientMemberUpdate::decode(data).is_ok());
    if bad_urls {
        Status::invalid_argument("etcdserver: given member URLs are invalid")
    } else {
        Status::internal(e.to_string())
    }
}

/// `MemberAddRequest` with its URLs as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct LenientMemberAdd {
    #[prost(bytes = "vec", repeated, tag = "1")]
    peer_urls: Vec<Vec<u8>>,
    #[prost(bool, tag = "2")]
    is_learner: bool,
}

/// `MemberUpdateRequest` with its URLs as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct LenientMemberUpdate {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(bytes = "vec", repeated, tag = "2")]
    peer_urls: Vec<Vec<u8>>,
}

fn too_deep<U: 'static>() -> Status {
    if TypeId::of::<U>() == TypeId::of::<TxnRequest>() {
        Status::invalid_argument(TOO_MANY_OPS)
    } else {
        Status::internal("failed to decode Protobuf message: nested too deeply")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::proto::etcdserverpb::{
        LeaseGrantRequest, PutRequest, RangeRequest, RequestOp, WatchRequest,
    };
    use crate::proto::kvdpb::{ForwardRequest, InternalRequest};

    fn decode_as<U: Message + Default + 'static>(data: &[u8]) -> Result<U, Status> {
        decode_request::<U>(Bytes::copy_from_slice(data))
    }

    /// Every request type the services decode, on the same bytes: none may panic or
    /// overflow the stack, whatever the bytes.
    fn decode_all(data: &[u8]) {
        let _ = decode_as::<TxnRequest>(data);
        let _ = decode_as::<RequestOp>(data);
        let _ = decode_as::<RangeRequest>(data);
        let _ = decode_as::<PutRequest>(data);
        let _ = decode_as::<WatchRequest>(data);
        let _ = decode_as::<LeaseGrantRequest>(data);
        let _ = decode_as::<MemberAddRequest>(data);
        let _ = decode_as::<ForwardRequest>(data);
        let _ = decode_as::<InternalRequest>(data);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
        /// Raw bytes, biased towards the tags that open messages and groups.
        #[test]
        fn any_bytes_decode_or_fail_cleanly(
            data in proptest::collection::vec(
                proptest::prop_oneof![proptest::num::u8::ANY, proptest::strategy::Just(0x0b_u8), proptest::strategy::Just(0x12_u8), proptest::strategy::Just(0x22_u8)],
                0..4096,
            )
        ) {
            decode_all(&data);
        }

        /// A deep valid txn with bytes changed at random places.
        #[test]
        fn mutated_deep_txns_decode_or_fail_cleanly(
            levels in 100usize..160,
            flips in proptest::collection::vec((proptest::num::usize::ANY, proptest::num::u8::ANY), 1..8),
        ) {
            let mut data = crate::proto::depth::tests::nested_txn_bytes(levels);
            for (at, b) in flips {
                let n = data.len();
                data[at % n] = b;
            }
            decode_all(&data);
        }
    }

    #[test]
    fn a_member_url_that_is_not_utf8_is_an_invalid_url() {
        // MemberAddRequest { peerURLs: ["\xff"] }
        let bad = [0x0a, 0x01, 0xff];
        for s in [
            decode_as::<MemberAddRequest>(&bad).unwrap_err(),
            decode_as::<MemberUpdateRequest>(&[0x08, 0x05, 0x12, 0x01, 0xff]).unwrap_err(),
        ] {
            assert_eq!(
                (s.code(), s.message()),
                (
                    tonic::Code::InvalidArgument,
                    "etcdserver: given member URLs are invalid"
                )
            );
        }
        // A truncated frame stays a decode failure.
        let s = decode_as::<MemberAddRequest>(&[0x0a, 0x05, b'h']).unwrap_err();
        assert_eq!(s.code(), tonic::Code::Internal);
        assert_eq!(
            too_deep::<TxnRequest>().message(),
            "etcdserver: too many operations in txn request"
        );
    }
}
