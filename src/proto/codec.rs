//! The gRPC codec of every kvd service: prost's, with the nesting bound of [`super::depth`]
//! checked before a message is decoded (prost itself is built without a recursion limit).
//!
//! A request nested deeper than [`super::depth::REQUEST_LIMIT`] never reaches prost: a
//! `TxnRequest` gets etcd's answer for a txn beyond its operation budget (InvalidArgument,
//! "etcdserver: too many operations in txn request"), any other message the status a
//! malformed message gets.

use std::any::TypeId;
use std::marker::PhantomData;

use bytes::Buf;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use super::depth;
use super::etcdserverpb::TxnRequest;

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
        // tonic hands over one contiguous message; copy only if it ever is not.
        let bytes;
        let data: &[u8] = if buf.chunk().len() == buf.remaining() {
            buf.chunk()
        } else {
            bytes = buf.copy_to_bytes(buf.remaining());
            &bytes
        };
        if !depth::within(data, depth::REQUEST_LIMIT) {
            return Err(too_deep::<U>());
        }
        let msg = U::decode(data).map_err(|e| Status::internal(e.to_string()))?;
        let n = buf.remaining();
        buf.advance(n);
        Ok(Some(msg))
    }
}

fn too_deep<U: 'static>() -> Status {
    if TypeId::of::<U>() == TypeId::of::<TxnRequest>() {
        Status::invalid_argument(TOO_MANY_OPS)
    } else {
        Status::internal("failed to decode Protobuf message: nested too deeply")
    }
}
