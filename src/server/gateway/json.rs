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
use bytes::BytesMut;
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

/// How large a request body (or one message of a streamed body) may be: `max_body` bytes of
/// JSON, refused with grpc-go's status for a message above `max_msg`, the transport's limit.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit {
    pub max_body: usize,
    pub max_msg: usize,
}

impl BodyLimit {
    /// The refusal of `found` bytes: what the transport answers to a message above its limit.
    pub fn refuse(&self, found: usize) -> Status {
        crate::server::api::oversize::too_large(found as u64, self.max_msg as u64)
    }
}

/// Finds where one top-level JSON value ends in a growing buffer, keeping its state between
/// chunks, so that each byte is looked at once however the value is split. It checks only
/// nesting and strings: the decoder judges the value once it is complete.
#[derive(Debug, Default)]
struct Scanner {
    /// How far the buffer has been looked at.
    pos: usize,
    /// The value's first byte has been seen.
    started: bool,
    /// Open `{` and `[` (not told apart: a mismatch is the decoder's to find).
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// A number, literal or stray byte at the top level: it ends at the next delimiter.
    scalar: bool,
}

fn json_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Scanner {
    /// The end (exclusive) of the value in `buf`, once it is all there.
    fn scan(&mut self, buf: &[u8]) -> Option<usize> {
        while self.pos < buf.len() {
            let b = buf[self.pos];
            if self.in_string {
                self.pos += 1;
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        return Some(self.pos);
                    }
                }
                continue;
            }
            if self.scalar {
                if json_whitespace(b) || b"{}[],:\"".contains(&b) {
                    return Some(self.pos);
                }
                self.pos += 1;
                continue;
            }
            self.pos += 1;
            if !self.started {
                if json_whitespace(b) {
                    continue;
                }
                self.started = true;
                match b {
                    b'{' | b'[' => self.depth = 1,
                    b'"' => self.in_string = true,
                    // A stray delimiter: a value of its own, for the decoder to refuse.
                    b'}' | b']' | b',' | b':' => return Some(self.pos),
                    _ => self.scalar = true,
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Some(self.pos);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// Decodes a request body that carries a stream of JSON messages, as they arrive.
///
/// Invariant: at most `limit.max_body` bytes (plus one chunk) are held: the bytes since the
/// previous message, including the whitespace before the next one. More than that without a
/// complete message ends the stream with the limit's refusal.
pub struct MessageStream<B> {
    body: B,
    /// What arrived after the previous message.
    buf: BytesMut,
    scanner: Scanner,
    body_done: bool,
    limit: BodyLimit,
}

impl<B, E> MessageStream<B>
where
    B: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    pub fn new(body: B, limit: BodyLimit) -> Self {
        MessageStream {
            body,
            buf: BytesMut::new(),
            scanner: Scanner::default(),
            body_done: false,
            limit,
        }
    }

    /// The next message; `None` once the body ends cleanly. An error ends the stream.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Option<Result<T, BodyError>> {
        loop {
            if let Some(end) = self.scanner.scan(&self.buf) {
                if end > self.limit.max_body {
                    return Some(Err(BodyError::TooLarge(self.limit.refuse(end))));
                }
                let value = self.buf.split_to(end);
                self.scanner = Scanner::default();
                return Some(
                    serde_json::from_slice(&value).map_err(|e| BodyError::Invalid(e.to_string())),
                );
            }
            if self.buf.len() > self.limit.max_body {
                return Some(Err(BodyError::TooLarge(self.limit.refuse(self.buf.len()))));
            }
            if self.body_done {
                if !self.scanner.started {
                    return None;
                }
                if self.scanner.scalar {
                    // A top-level scalar ends with the body.
                    let value = std::mem::take(&mut self.buf);
                    self.scanner = Scanner::default();
                    return Some(
                        serde_json::from_slice(&value)
                            .map_err(|e| BodyError::Invalid(e.to_string())),
                    );
                }
                return Some(Err(BodyError::Invalid("unexpected EOF".into())));
            }
            match self.body.next().await {
                Some(Ok(b)) => self.buf.extend_from_slice(&b),
                Some(Err(e)) => return Some(Err(BodyError::Invalid(e.to_string()))),
                None => self.body_done = true,
            }
        }
    }

    /// Reads and drops what is left of the body, up to [`drain`]'s bounds.
    pub async fn drain(&mut self) {
        drain(&mut self.body).await
    }
}

/// Why a streamed request body yields no further message.
#[derive(Debug)]
pub enum BodyError {
    /// Not a JSON message of the call's type, cut short, or the body failed to arrive.
    Invalid(String),
    /// Too many bytes without a complete message: the status to answer.
    TooLarge(Status),
}

/// How much of a refused body is read and dropped before the answer.
const DRAIN_BYTES: usize = 64 << 20;
/// How long a refused body is read and dropped before the answer.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_millis(500);

/// Reads and drops a refused body before it is answered, up to a bound of bytes and of time:
/// a client still writing when the connection closes sees a broken pipe, not the answer; a
/// client that writes on and on must not hold the connection (the connection is closed after
/// the answer anyway).
pub async fn drain<B, E>(body: &mut B)
where
    B: Stream<Item = Result<Bytes, E>> + Unpin,
{
    let read = async {
        let mut drained = 0usize;
        while drained < DRAIN_BYTES {
            match body.next().await {
                Some(Ok(chunk)) => drained += chunk.len(),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, read).await;
}

/// Reads a whole request body of at most `limit.max_body` bytes. A larger one is refused
/// (drained within bounds first) as soon as it passes the limit, with the limit's status.
pub async fn read_body(body: Body, limit: BodyLimit) -> Result<Bytes, Status> {
    let mut body = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Status::invalid_argument(e.to_string()))?;
        let found = buf.len() + chunk.len();
        if found > limit.max_body {
            drain(&mut body).await;
            return Err(limit.refuse(found));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
    use crate::proto::etcdserverpb::{
        Compare, RangeRequest, RangeResponse, ResponseHeader, TxnRequest, WatchRequest,
    };
    use crate::proto::mvccpb::KeyValue;
    use std::convert::Infallible;

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

    const LIMIT: BodyLimit = BodyLimit {
        max_body: 1000,
        max_msg: 500,
    };

    fn chunks(parts: &[&'static [u8]]) -> impl Stream<Item = Result<Bytes, Infallible>> + Unpin {
        let parts: Vec<_> = parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        futures::stream::iter(parts)
    }

    #[tokio::test]
    async fn message_stream_splits_objects_across_chunks() {
        let mut s = MessageStream::new(
            chunks(&[
                br#"{"create_request":{"key":"YQ=="}}{"progress"#,
                b"_request\":{}}\n  ",
                b"\n",
            ]),
            LIMIT,
        );
        let a: WatchRequest = s.next().await.unwrap().unwrap();
        assert!(a.request_union.is_some());
        let b: WatchRequest = s.next().await.unwrap().unwrap();
        assert!(b.request_union.is_some());
        assert!(s.next::<WatchRequest>().await.is_none());

        let mut s = MessageStream::new(chunks(&[br#"{"create_request":"#]), LIMIT);
        assert!(matches!(
            s.next::<WatchRequest>().await,
            Some(Err(BodyError::Invalid(_)))
        ));
    }

    /// Braces and quotes inside strings, escaped quotes and a split escape do not end a
    /// message early or late, a byte at a time or all at once.
    #[tokio::test]
    async fn message_stream_finds_ends_inside_strings_and_escapes() {
        let body: &'static [u8] =
            br#" {"create_request":{"key":"YQ==","filters":["NOPUT"],"x":"}{[\"\\"}} {"progress_request":{}}"#;
        for split in [1, body.len()] {
            let parts: Vec<&'static [u8]> = body.chunks(split).collect();
            let mut s = MessageStream::new(chunks(&parts), LIMIT);
            let a: WatchRequest = s.next().await.unwrap().unwrap();
            assert!(a.request_union.is_some(), "split {split}");
            let b: WatchRequest = s.next().await.unwrap().unwrap();
            assert!(b.request_union.is_some());
            assert!(s.next::<WatchRequest>().await.is_none());
        }
    }

    /// Not objects: the decoder refuses them once they are complete, the last one when the
    /// body ends.
    #[tokio::test]
    async fn message_stream_refuses_values_that_are_not_messages() {
        for body in [&b"]"[..], b"12 {}", b"\"s\"", b"[1,2]", b"nul"] {
            let mut s = MessageStream::new(chunks(&[body]), LIMIT);
            assert!(
                matches!(
                    s.next::<WatchRequest>().await,
                    Some(Err(BodyError::Invalid(_)))
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    /// More than the limit without a complete message is refused with the transport's
    /// status, however it arrives: one unfinished message, whitespace, or a complete message
    /// in one chunk. A message at the limit is not.
    #[tokio::test]
    async fn message_stream_refuses_a_message_past_the_limit() {
        let open: &'static [u8] = br#"{"create_request":{"key":""#;
        let filler: &'static [u8] = &[b'A'; 100];
        let mut parts = vec![open];
        parts.extend(std::iter::repeat_n(filler, 20));
        let mut s = MessageStream::new(chunks(&parts), LIMIT);
        match s.next::<WatchRequest>().await {
            Some(Err(BodyError::TooLarge(st))) => {
                assert_eq!(st.code(), Code::ResourceExhausted);
                assert!(st.message().ends_with(" vs. 500)"), "{}", st.message());
            }
            _ => panic!("not refused"),
        }
        // The stream stopped reading once past the limit.
        assert!(s.buf.len() <= LIMIT.max_body + filler.len());

        let spaces: &'static [u8] = &[b' '; 600];
        let mut s = MessageStream::new(chunks(&[spaces, spaces, b"{}"]), LIMIT);
        assert!(matches!(
            s.next::<WatchRequest>().await,
            Some(Err(BodyError::TooLarge(_)))
        ));

        let big = format!(r#"{{"create_request":{{"key":"{}"}}}}"#, "A".repeat(1000));
        let big: &'static [u8] = Box::leak(big.into_bytes().into_boxed_slice());
        let mut s = MessageStream::new(chunks(&[big]), LIMIT);
        assert!(matches!(
            s.next::<WatchRequest>().await,
            Some(Err(BodyError::TooLarge(_)))
        ));

        let key = "A".repeat(LIMIT.max_body - r#"{"create_request":{"key":""}}"#.len());
        let at = format!(r#"{{"create_request":{{"key":"{key}"}}}}"#);
        assert_eq!(at.len(), LIMIT.max_body);
        let at: &'static [u8] = Box::leak(at.into_bytes().into_boxed_slice());
        let mut s = MessageStream::new(chunks(&[at, b"{}"]), LIMIT);
        assert!(s.next::<WatchRequest>().await.unwrap().is_ok());
        assert!(s.next::<WatchRequest>().await.unwrap().is_ok());
        assert!(s.next::<WatchRequest>().await.is_none());
    }

    /// Each byte is scanned once: a message split into a byte per chunk costs what it costs in
    /// one chunk (the scanner's position only moves forward, and never past the buffer).
    #[test]
    fn scanner_resumes_where_it_stopped() {
        let body = br#"{"a":"}\"","b":[{"c":1}]} "#;
        let mut sc = Scanner::default();
        let mut steps = 0;
        let mut end = None;
        for n in 1..=body.len() {
            let before = sc.pos;
            end = sc.scan(&body[..n]);
            steps += sc.pos - before;
            if end.is_some() {
                break;
            }
        }
        assert_eq!(end, Some(body.len() - 1));
        assert_eq!(steps, body.len() - 1);
    }

    #[tokio::test]
    async fn read_body_refuses_past_the_limit() {
        let ok = Body::from_stream(chunks(&[&[b' '; 600], &[b' '; 400]]));
        assert_eq!(read_body(ok, LIMIT).await.unwrap().len(), 1000);
        let over = Body::from_stream(chunks(&[&[b' '; 600], &[b' '; 401]]));
        let st = read_body(over, LIMIT).await.unwrap_err();
        assert_eq!(st.code(), Code::ResourceExhausted);
        assert_eq!(
            st.message(),
            "grpc: received message larger than max (1001 vs. 500)"
        );
        // An endless body is refused too, once past the limit.
        let endless =
            futures::stream::repeat_with(|| Ok::<_, Infallible>(Bytes::from_static(b"  ")));
        let st = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            read_body(Body::from_stream(endless), LIMIT),
        )
        .await
        .expect("refused in time")
        .unwrap_err();
        assert_eq!(st.code(), Code::ResourceExhausted);
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
