//! The gateway's wire format: etcd's grpc-gateway v1 JSON (`JSONPb{OrigName: true}`).
//!
//! Messages themselves are (de)serialized by the pbjson-generated impls in [`crate::proto`]
//! (proto field names, 64-bit integers as strings, bytes as base64, enums by name, zero values
//! left out; numbers and enum numbers accepted on input). This module adds what grpc-gateway
//! wraps around them: request bodies, the `{"result": ...}` stream chunks and both error
//! shapes, each checked against a real etcd 3.4.
//!
//! Invariants:
//! - A request body holds one JSON object per message; whitespace between objects is ignored,
//!   and a unary request ignores anything after its first object (Go's `json.Decoder` does).
//!   An empty unary body is the empty request.
//! - Errors carry the gRPC status that the service returned, unchanged: the gateway invents
//!   no error text, except for bodies it cannot decode (invalid argument, as grpc-gateway).

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Code, Status};

/// `HTTPStatusFromCode` of the grpc-gateway v1 that etcd 3.4 builds with (checked against
/// etcd 3.4: FailedPrecondition is 412 there; later grpc-gateway releases answer 400).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Aborted => StatusCode::CONFLICT,
        Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A unary call's error body: `{"error": msg, "message": msg, "code": N}` (fields in etcd's
/// order).
#[derive(Serialize)]
struct UnaryError<'a> {
    error: &'a str,
    message: &'a str,
    code: i32,
}

/// A stream's error chunk: `{"error": {"grpc_code": N, "http_code": N, "message": ...,
/// "http_status": ...}}`.
#[derive(Serialize)]
struct StreamError<'a> {
    error: StreamErrorBody<'a>,
}

#[derive(Serialize)]
struct StreamErrorBody<'a> {
    grpc_code: i32,
    http_code: u16,
    message: &'a str,
    http_status: &'a str,
}

/// A stream's message chunk: `{"result": message}`.
#[derive(Serialize)]
struct Chunk<'a, T> {
    result: &'a T,
}

fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = (status, body.into()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The unary error response for a gRPC status.
pub fn unary_error(s: &Status) -> Response {
    let body = serde_json::to_vec(&UnaryError {
        error: s.message(),
        message: s.message(),
        code: s.code() as i32,
    })
    .unwrap_or_default();
    json_response(http_status(s.code()), body)
}

/// A successful unary response.
pub fn message<T: Serialize>(m: &T) -> Response {
    match serde_json::to_vec(m) {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(e) => unary_error(&Status::internal(e.to_string())),
    }
}

/// One `{"result": ...}` chunk of a stream, newline-terminated as grpc-gateway delimits them.
pub fn result_chunk<T: Serialize>(m: &T) -> Bytes {
    let mut v = serde_json::to_vec(&Chunk { result: m }).unwrap_or_default();
    v.push(b'\n');
    v.into()
}

/// The error chunk that ends a stream (grpc-gateway writes no delimiter after it).
pub fn error_chunk(s: &Status) -> Bytes {
    let http = http_status(s.code());
    serde_json::to_vec(&StreamError {
        error: StreamErrorBody {
            grpc_code: s.code() as i32,
            http_code: http.as_u16(),
            message: s.message(),
            http_status: http.canonical_reason().unwrap_or(""),
        },
    })
    .unwrap_or_default()
    .into()
}

/// The response for a stream that fails before its first message: the error's HTTP status
/// and the error chunk.
pub fn stream_failed(s: &Status) -> Response {
    json_response(http_status(s.code()), error_chunk(s))
}

/// A streamed response: HTTP 200 and chunks as they come.
pub fn stream_response<S>(chunks: S) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    json_response(
        StatusCode::OK,
        Body::from_stream(chunks.map(Ok::<_, std::convert::Infallible>)),
    )
}

/// Decodes a unary request body: the first JSON object, or the default message when the body
/// is empty.
pub fn decode_unary<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let mut it = serde_json::Deserializer::from_slice(body).into_iter::<T>();
    match it.next() {
        Some(Ok(m)) => Ok(m),
        Some(Err(e)) => Err(Status::invalid_argument(e.to_string())),
        None => Ok(T::default()),
    }
}

/// Decodes a request body that carries a stream of JSON messages, as they arrive.
pub struct MessageStream<B> {
    body: B,
    buf: Vec<u8>,
    body_done: bool,
}

impl<B, E> MessageStream<B>
where
    B: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    pub fn new(body: B) -> Self {
        MessageStream {
            body,
            buf: Vec::new(),
            body_done: false,
        }
    }

    /// The next message; `None` once the body ends cleanly. An error ends the stream.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Option<Result<T, String>> {
        loop {
            let mut it = serde_json::Deserializer::from_slice(&self.buf).into_iter::<T>();
            match it.next() {
                Some(Ok(m)) => {
                    let used = it.byte_offset();
                    self.buf.drain(..used);
                    return Some(Ok(m));
                }
                // Half a message so far: wait for the rest.
                Some(Err(e)) if e.is_eof() && !self.body_done => {}
                Some(Err(e)) if e.is_eof() => return Some(Err("unexpected EOF".into())),
                Some(Err(e)) => return Some(Err(e.to_string())),
                None if self.body_done => return None,
                // Only whitespace so far.
                None => self.buf.clear(),
            }
            match self.body.next().await {
                Some(Ok(b)) => self.buf.extend_from_slice(&b),
                Some(Err(e)) => return Some(Err(e.to_string())),
                None => self.body_done = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
    use crate::proto::etcdserverpb::{
        Compare, RangeRequest, RangeResponse, ResponseHeader, TxnRequest, WatchRequest,
    };
    use crate::proto::mvccpb::KeyValue;

    #[test]
    fn messages_use_etcd_field_names_strings_for_int64_and_base64() {
        let r = RangeResponse {
            header: Some(ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 3,
                raft_term: 4,
            }),
            kvs: vec![KeyValue {
                key: b"foo".to_vec(),
                create_revision: 2,
                mod_revision: 3,
                version: 1,
                value: b"bar".to_vec(),
                lease: 0,
            }],
            more: false,
            count: 1,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"header":{"cluster_id":"1","member_id":"2","revision":"3","raft_term":"4"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"1","value":"YmFy"}],"count":"1"}"#
        );
    }

    #[test]
    fn enums_by_name_or_number_and_int64_as_string_or_number() {
        let by_name: TxnRequest = decode_unary(
            br#"{"compare":[{"key":"Zm9v","target":"MOD","result":"EQUAL","mod_revision":"2"}]}"#,
        )
        .unwrap();
        let by_number: TxnRequest =
            decode_unary(br#"{"compare":[{"key":"Zm9v","target":2,"result":0,"mod_revision":2}]}"#)
                .unwrap();
        let want = Compare {
            key: b"foo".to_vec(),
            target: CompareTarget::Mod as i32,
            result: CompareResult::Equal as i32,
            target_union: Some(TargetUnion::ModRevision(2)),
            range_end: vec![],
        };
        assert_eq!(by_name.compare, vec![want.clone()]);
        assert_eq!(by_number.compare, vec![want]);
    }

    #[test]
    fn unary_body_empty_trailing_and_invalid() {
        let r: RangeRequest = decode_unary(b"  ").unwrap();
        assert_eq!(r, RangeRequest::default());
        let r: RangeRequest = decode_unary(br#"{"key":"YQ==","nope":1} {"x":1}"#).unwrap();
        assert_eq!(r.key, b"a");
        let e = decode_unary::<RangeRequest>(b"garbage").unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(decode_unary::<RangeRequest>(br#"{"key":"!!"}"#).is_err());
    }

    #[test]
    fn error_shapes_are_grpc_gateways() {
        let s = Status::out_of_range("etcdserver: mvcc: required revision has been compacted");
        assert_eq!(http_status(s.code()), StatusCode::BAD_REQUEST);
        let s = Status::failed_precondition("etcdserver: lease already exists");
        assert_eq!(http_status(s.code()), StatusCode::PRECONDITION_FAILED);
        assert_eq!(
            &error_chunk(&Status::unavailable("etcdserver: no leader"))[..],
            br#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}"#
        );
    }

    #[tokio::test]
    async fn message_stream_splits_objects_across_chunks() {
        let parts: Vec<Result<Bytes, std::convert::Infallible>> = vec![
            Ok(Bytes::from_static(
                br#"{"create_request":{"key":"YQ=="}}{"progress"#,
            )),
            Ok(Bytes::from_static(b"_request\":{}}\n  ")),
            Ok(Bytes::from_static(b"\n")),
        ];
        let mut s = MessageStream::new(futures::stream::iter(parts));
        let a: WatchRequest = s.next().await.unwrap().unwrap();
        assert!(a.request_union.is_some());
        let b: WatchRequest = s.next().await.unwrap().unwrap();
        assert!(b.request_union.is_some());
        assert!(s.next::<WatchRequest>().await.is_none());

        let parts: Vec<Result<Bytes, std::convert::Infallible>> =
            vec![Ok(Bytes::from_static(br#"{"create_request":"#))];
        let mut s = MessageStream::new(futures::stream::iter(parts));
        assert!(s.next::<WatchRequest>().await.unwrap().is_err());
    }

    /// Bodies as a hostile client sends them: random bytes, deeply nested JSON, and valid
    /// requests with bytes changed. Decoding answers or refuses; it never panics or
    /// overflows the stack (serde_json stops at 128 levels of nesting).
    mod fuzz {
        use super::*;
        use crate::proto::etcdserverpb::{LeaseGrantRequest, PutRequest};

        fn decode_all(body: &[u8]) {
            let _ = decode_unary::<TxnRequest>(body);
            let _ = decode_unary::<RangeRequest>(body);
            let _ = decode_unary::<PutRequest>(body);
            let _ = decode_unary::<WatchRequest>(body);
            let _ = decode_unary::<LeaseGrantRequest>(body);
        }

        #[test]
        fn deeply_nested_json_is_refused() {
            for open in ["[", "{\"a\":", "{\"success\":[{\"request_txn\":"] {
                let body = open.repeat(100_000);
                assert!(decode_unary::<TxnRequest>(body.as_bytes()).is_err());
                decode_all(body.as_bytes());
            }
        }

        const VALID: &str = r#"{"compare":[{"key":"Zm9v","target":"MOD","result":"EQUAL","mod_revision":"2"}],
            "success":[{"request_put":{"key":"Zm9v","value":"YmF6"}},{"request_txn":{"success":[{"request_range":{"key":"YQ==","limit":"3"}}]}}],
            "failure":[{"request_delete_range":{"key":"Zm9v","range_end":"AA=="}}]}"#;

        proptest::proptest! {
            #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
            #[test]
            fn random_bodies_decode_or_fail_cleanly(body in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
                decode_all(&body);
            }

            #[test]
            fn mutated_requests_decode_or_fail_cleanly(
                flips in proptest::collection::vec((proptest::num::usize::ANY, proptest::num::u8::ANY), 1..6),
            ) {
                let mut body = VALID.as_bytes().to_vec();
                for (at, b) in flips {
                    let n = body.len();
                    body[at % n] = b;
                }
                decode_all(&body);
            }
        }

        #[test]
        fn the_valid_request_decodes() {
            let t = decode_unary::<TxnRequest>(VALID.as_bytes()).unwrap();
            assert_eq!(t.success.len(), 2);
        }
    }
}
