//! etcd's status for a request larger than the transport accepts.
//!
//! A request above `--max-request-bytes` + 512 KiB never reaches a handler: tonic's decoder
//! refuses it with `OutOfRange` (and a message of its own). grpc-go, and so etcd, answers
//! `ResourceExhausted` "grpc: received message larger than max (N vs. M)", and clients (etcd's
//! among them) treat the two codes differently. A [`SizeCheck`] reads the length prefix of
//! each gRPC message in the request body as it passes to tonic; when one is above the limit,
//! the `OutOfRange` status in a trailers-only response head is tonic's refusal of it, and
//! becomes grpc-go's. Every other response is left alone. (Requests between
//! `--max-request-bytes` and the transport limit reach the handler and get "etcdserver:
//! request is too large", as in etcd.)

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::{Code, Status};

/// grpc-go's status for a message of `found` bytes over a transport limit of `limit`.
pub fn too_large(found: u64, limit: u64) -> Status {
    Status::new(
        Code::ResourceExhausted,
        format!("grpc: received message larger than max ({found} vs. {limit})"),
    )
}

/// Reads the 5-byte prefixes (compressed flag, big-endian length) of the gRPC messages in a
/// request body, chunk by chunk, and records the length of the first one above `limit`.
pub struct Frames {
    limit: u64,
    prefix: [u8; 5],
    have: usize,
    /// Bytes of the current message still to pass.
    skip: u64,
    found: Arc<AtomicU64>,
    /// Counts each message's start (`grpc_server_msg_received_total` of a bidirectional
    /// stream).
    received: Option<prometheus::IntCounter>,
}

impl Frames {
    fn new(limit: usize, found: Arc<AtomicU64>) -> Self {
        Frames {
            limit: limit as u64,
            prefix: [0; 5],
            have: 0,
            skip: 0,
            found,
            received: None,
        }
    }

    fn observe(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(data.len() as u64) as usize;
                self.skip -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                self.have = 0;
                if let Some(c) = &self.received {
                    c.inc();
                }
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]) as u64;
                self.skip = len;
                if len > self.limit {
                    let _ =
                        self.found
                            .compare_exchange(0, len, Ordering::Relaxed, Ordering::Relaxed);
                }
            }
        }
    }
}

/// A request body whose gRPC message lengths are read as it passes (see [`Frames`]).
pub struct Watched<B> {
    inner: B,
    frames: Frames,
}

impl<B> http_body::Body for Watched<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            crate::metrics::CLIENT_GRPC_RECEIVED_BYTES.inc_by(data.len() as u64);
            self.frames.observe(data);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// One request's check: its body is [`SizeCheck::watch`]ed on the way in, and its response
/// head [`SizeCheck::rewrite`]n on the way out.
pub struct SizeCheck {
    found: Arc<AtomicU64>,
    limit: usize,
}

impl SizeCheck {
    pub fn new(limit: usize) -> Self {
        SizeCheck {
            found: Arc::new(AtomicU64::new(0)),
            limit,
        }
    }

    pub fn watch<B>(&self, body: B) -> Watched<B> {
        self.watch_counting(body, None)
    }

    /// [`Self::watch`], counting each message of the body in `received`.
    pub fn watch_counting<B>(
        &self,
        body: B,
        received: Option<prometheus::IntCounter>,
    ) -> Watched<B> {
        let mut frames = Frames::new(self.limit, self.found.clone());
        frames.received = received;
        Watched {
            inner: body,
            frames,
        }
    }

    /// Turns tonic's refusal of a message above the limit in `headers` into grpc-go's.
    pub fn rewrite(&self, headers: &mut http::HeaderMap) {
        rewrite(
            headers,
            self.found.load(Ordering::Relaxed),
            self.limit as u64,
        );
    }
}

/// Turns tonic's refusal of a message above `limit` into grpc-go's status (see the module
/// docs). Wraps the JSON gateway's in-process clients; the client port's gRPC calls get the
/// same check in [`crate::server::api::client_dispatch`].
#[derive(Clone)]
pub struct EtcdSizeError<S> {
    inner: S,
    limit: usize,
}

impl<S> EtcdSizeError<S> {
    pub fn new(inner: S, limit: usize) -> Self {
        EtcdSizeError { inner, limit }
    }
}

impl<S, B, R> tower::Service<http::Request<B>> for EtcdSizeError<S>
where
    S: tower::Service<http::Request<Watched<B>>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let check = SizeCheck::new(self.limit);
        let call = self.inner.call(req.map(|b| check.watch(b)));
        Box::pin(async move {
            let mut res = call.await?;
            check.rewrite(res.headers_mut());
            Ok(res)
        })
    }
}

/// Rewrites `headers` in place if they carry tonic's refusal of a message of `found` bytes
/// (0: none was over the limit).
fn rewrite(headers: &mut http::HeaderMap, found: u64, limit: u64) {
    if found == 0 {
        return;
    }
    match Status::from_header_map(headers) {
        // Only grpc-status and grpc-message change; a failure to encode leaves tonic's status.
        Some(s) if s.code() == Code::OutOfRange => {
            let _ = too_large(found, limit).add_header(headers);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: u32) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&len.to_be_bytes());
        v
    }

    #[test]
    fn lengths_are_read_across_chunks_and_messages() {
        let found = Arc::new(AtomicU64::new(0));
        let mut f = Frames::new(100, found.clone());
        let mut body = frame(10);
        body.extend_from_slice(&[7; 10]);
        body.extend(frame(3_000_010));
        body.extend_from_slice(&[7; 50]);
        for chunk in body.chunks(3) {
            f.observe(chunk);
        }
        assert_eq!(found.load(Ordering::Relaxed), 3_000_010);

        let found = Arc::new(AtomicU64::new(0));
        let mut f = Frames::new(100, found.clone());
        let mut body = frame(100);
        body.extend_from_slice(&[0xff; 100]);
        body.extend(frame(5));
        f.observe(&body);
        assert_eq!(found.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn tonics_refusal_becomes_grpc_go_resource_exhausted() {
        let mut h = http::HeaderMap::new();
        Status::out_of_range("whatever tonic says")
            .add_header(&mut h)
            .unwrap();
        rewrite(&mut h, 3000010, 2097152);
        let s = Status::from_header_map(&h).unwrap();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            s.message(),
            "grpc: received message larger than max (3000010 vs. 2097152)"
        );
    }

    #[test]
    fn other_statuses_are_left_alone() {
        let cases = [
            // No message over the limit: a handler's OutOfRange.
            (
                Status::out_of_range("etcdserver: mvcc: required revision is a future revision"),
                0,
            ),
            (
                Status::invalid_argument("etcdserver: request is too large"),
                0,
            ),
            (Status::invalid_argument("x"), 3000010),
        ];
        for (s, found) in cases {
            let mut h = http::HeaderMap::new();
            s.add_header(&mut h).unwrap();
            let before = h.clone();
            rewrite(&mut h, found, 2097152);
            assert_eq!(h, before);
        }
        let mut empty = http::HeaderMap::new();
        rewrite(&mut empty, 3000010, 2097152);
        assert!(empty.is_empty());
    }
}
