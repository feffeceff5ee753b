//! `grpc_server_handled_total{grpc_service,grpc_method,grpc_code}` as a tower layer on the
//! client gRPC server.
//!
//! The code is read from the response head: tonic sends a handler's error as a
//! trailers-only response (`grpc-status` in the headers), and a response without it in the
//! head is counted as `OK`. For unary RPCs that is exact; a server-streaming RPC (snapshot)
//! is counted when its stream starts, so a stream that fails midway still counts as `OK`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::task::{Context, Poll};

/// Handled RPCs by (service, method, code), as `grpc_server_handled_total` exports them.
pub type Table = BTreeMap<(String, String, &'static str), u64>;

/// Go's `codes.Code.String()` for codes 0..=16, which is what etcd's label values are.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];
const UNKNOWN: usize = 2;
const UNAVAILABLE: usize = 14;

/// Methods counted at most: a client can call any method name under a served service, and
/// each would otherwise add a row for good.
const MAX_METHODS: usize = 256;

type Counts = [AtomicU64; 17];

/// Request path -> counts by code. Counting a call takes the read lock and one atomic add;
/// the write lock is taken once per method, on its first call. The counts live as long as
/// the process (at most [`MAX_METHODS`] of them), so they are leaked rather than shared.
type Methods = RwLock<HashMap<String, &'static Counts>>;

fn table() -> &'static Methods {
    static T: OnceLock<Methods> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// The handled-RPC counts so far.
pub fn snapshot() -> Table {
    let t = table().read().unwrap_or_else(|e| e.into_inner());
    let mut out = Table::new();
    for (path, counts) in t.iter() {
        let p = path.trim_start_matches('/');
        let (svc, method) = p.split_once('/').unwrap_or((p, ""));
        for (code, n) in CODE_NAMES.iter().zip(counts.iter()) {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                out.insert((svc.to_string(), method.to_string(), code), n);
            }
        }
    }
    out
}

/// The index into [`CODE_NAMES`] of a `grpc-status` value.
fn code_index(c: &[u8]) -> usize {
    std::str::from_utf8(c)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|i| *i < CODE_NAMES.len())
        .unwrap_or(UNKNOWN)
}

fn record(path: &str, code: usize) {
    record_in(table(), path, code)
}

fn record_in(table: &Methods, path: &str, code: usize) {
    let counts = table
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(path)
        .copied();
    let counts = match counts {
        Some(c) => c,
        None => {
            let mut t = table.write().unwrap_or_else(|e| e.into_inner());
            if t.len() >= MAX_METHODS && !t.contains_key(path) {
                return;
            }
            *t.entry(path.to_string())
                .or_insert_with(|| Box::leak(Box::default()))
        }
    };
    counts[code].fetch_add(1, Ordering::Relaxed);
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
        // The URI is moved into the inner service; its path is kept without a copy.
        let uri = req.uri().clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            let code = match &res {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .map_or(0, |v| code_index(v.as_bytes())),
                Err(_) => UNAVAILABLE,
            };
            record(uri.path(), code);
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_service_method_and_code() {
        record("/test.Svc/Counted", 0);
        record("/test.Svc/Counted", 0);
        record("/test.Svc/Counted", code_index(b"14"));
        let t = snapshot();
        let get = |code| t.get(&("test.Svc".to_string(), "Counted".to_string(), code));
        assert_eq!(get("OK"), Some(&2));
        assert_eq!(get("Unavailable"), Some(&1));
        assert_eq!(get("Internal"), None);
    }

    #[test]
    fn unparsable_codes_are_unknown() {
        for c in [&b"17"[..], b"-1", b"", b"x"] {
            assert_eq!(CODE_NAMES[code_index(c)], "Unknown", "{c:?}");
        }
        assert_eq!(CODE_NAMES[code_index(b"16")], "Unauthenticated");
    }

    #[test]
    fn the_number_of_methods_counted_is_bounded() {
        let t = Methods::default();
        for i in 0..MAX_METHODS + 10 {
            record_in(&t, &format!("/test.Bounded/M{i}"), 0);
        }
        record_in(&t, "/test.Bounded/M0", 0);
        let t = t.read().unwrap();
        assert_eq!(t.len(), MAX_METHODS);
        assert_eq!(t["/test.Bounded/M0"][0].load(Ordering::Relaxed), 2);
    }
}
