//! `grpc_server_handled_total{grpc_service,grpc_method,grpc_code}` as a tower layer on the
//! client gRPC server.
//!
//! The code is read from the response head: tonic sends a handler's error as a
//! trailers-only response (`grpc-status` in the headers), and a response without it in the
//! head is counted as `OK`. For unary RPCs that is exact; a server-streaming RPC (snapshot)
//! is counted when its stream starts, so a stream that fails midway still counts as `OK`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll};

type Table = BTreeMap<(String, String, &'static str), u64>;

fn table() -> &'static Mutex<Table> {
    static T: OnceLock<Mutex<Table>> = OnceLock::new();
    T.get_or_init(Default::default)
}

pub(super) fn snapshot() -> Table {
    table().lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Go's `codes.Code.String()`, which is what etcd's label values are.
fn code_name(c: &[u8]) -> &'static str {
    match c {
        b"0" => "OK",
        b"1" => "Canceled",
        b"2" => "Unknown",
        b"3" => "InvalidArgument",
        b"4" => "DeadlineExceeded",
        b"5" => "NotFound",
        b"6" => "AlreadyExists",
        b"7" => "PermissionDenied",
        b"8" => "ResourceExhausted",
        b"9" => "FailedPrecondition",
        b"10" => "Aborted",
        b"11" => "OutOfRange",
        b"12" => "Unimplemented",
        b"13" => "Internal",
        b"14" => "Unavailable",
        b"15" => "DataLoss",
        b"16" => "Unauthenticated",
        _ => "Unknown",
    }
}

fn record(path: &str, code: &'static str) {
    let p = path.trim_start_matches('/');
    let (svc, method) = p.split_once('/').unwrap_or((p, ""));
    let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
    *t.entry((svc.to_string(), method.to_string(), code))
        .or_insert(0) += 1;
}

#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMetricsLayer;

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner }
    }
}

#[derive(Debug, Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for GrpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().to_string();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            let code = match &res {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .map_or("OK", |v| code_name(v.as_bytes())),
                Err(_) => "Unavailable",
            };
            record(&path, code);
            res
        })
    }
}
