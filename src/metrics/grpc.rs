//! gRPC server metrics as go-grpc-prometheus (which etcd uses) names them:
//! `grpc_server_started_total`, `grpc_server_handled_total` (with `grpc_code`),
//! `grpc_server_msg_received_total`, `grpc_server_msg_sent_total` and, with `--metrics
//! extensive`, `grpc_server_handling_seconds`, each labelled `grpc_type`, `grpc_service`,
//! `grpc_method`. Counted by the client port's dispatch ([`Handled`]).
//!
//! Invariants:
//! - Every method the client port serves has its series from the start, every code
//!   included, as etcd's `grpc_prometheus.Register` pre-initialises them: a rate over a
//!   method that has not been called yet is 0, not absent.
//! - The table of methods is built once and never changes, so counting a call is a hash
//!   lookup and atomic adds on handles resolved at start: no lock, no label formatting.
//!   A method outside the table (an unknown name under a served service) is not counted, as
//!   go-grpc-prometheus does not count calls that reach no registered handler.
//! - The code is read from the response head: tonic sends a handler's error as a
//!   trailers-only response (`grpc-status` in the headers), and a response without it in the
//!   head is counted as `OK`. For unary RPCs that is exact; a streaming RPC is counted when
//!   its response starts.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Instant;

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts};

/// Go's `codes.Code.String()` for codes 0..=16, which is what etcd's label values are.
pub const CODE_NAMES: [&str; 17] = [
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

/// How a method streams, as go-grpc-prometheus' `grpc_type` label names it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GrpcType {
    Unary,
    ServerStream,
    BidiStream,
}

impl GrpcType {
    fn label(self) -> &'static str {
        match self {
            GrpcType::Unary => "unary",
            GrpcType::ServerStream => "server_stream",
            GrpcType::BidiStream => "bidi_stream",
        }
    }
}

use GrpcType::{BidiStream, ServerStream, Unary};

/// Every method the client port serves: etcd's v3 services, and the Lock and Election
/// services that etcd's client port serves too.
const METHODS: &[(&str, &[(&str, GrpcType)])] = &[
    (
        "etcdserverpb.KV",
        &[
            ("Range", Unary),
            ("Put", Unary),
            ("DeleteRange", Unary),
            ("Txn", Unary),
            ("Compact", Unary),
        ],
    ),
    ("etcdserverpb.Watch", &[("Watch", BidiStream)]),
    (
        "etcdserverpb.Lease",
        &[
            ("LeaseGrant", Unary),
            ("LeaseRevoke", Unary),
            ("LeaseKeepAlive", BidiStream),
            ("LeaseTimeToLive", Unary),
            ("LeaseLeases", Unary),
        ],
    ),
    (
        "etcdserverpb.Cluster",
        &[
            ("MemberAdd", Unary),
            ("MemberRemove", Unary),
            ("MemberUpdate", Unary),
            ("MemberList", Unary),
            ("MemberPromote", Unary),
        ],
    ),
    (
        "etcdserverpb.Maintenance",
        &[
            ("Alarm", Unary),
            ("Status", Unary),
            ("Defragment", Unary),
            ("Hash", Unary),
            ("HashKV", Unary),
            ("Snapshot", ServerStream),
            ("MoveLeader", Unary),
            ("Downgrade", Unary),
        ],
    ),
    (
        "etcdserverpb.Auth",
        &[
            ("AuthEnable", Unary),
            ("AuthDisable", Unary),
            ("AuthStatus", Unary),
            ("Authenticate", Unary),
            ("UserAdd", Unary),
            ("UserGet", Unary),
            ("UserList", Unary),
            ("UserDelete", Unary),
            ("UserChangePassword", Unary),
            ("UserGrantRole", Unary),
            ("UserRevokeRole", Unary),
            ("RoleAdd", Unary),
            ("RoleGet", Unary),
            ("RoleList", Unary),
            ("RoleDelete", Unary),
            ("RoleGrantPermission", Unary),
            ("RoleRevokePermission", Unary),
        ],
    ),
    ("v3lockpb.Lock", &[("Lock", Unary), ("Unlock", Unary)]),
    (
        "v3electionpb.Election",
        &[
            ("Campaign", Unary),
            ("Proclaim", Unary),
            ("Leader", Unary),
            ("Observe", ServerStream),
            ("Resign", Unary),
        ],
    ),
];

/// go-grpc-prometheus' default handling-time buckets (Prometheus' `DefBuckets`).
pub const HANDLING_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

const LABELS: [&str; 3] = ["grpc_type", "grpc_service", "grpc_method"];

struct Families {
    started: IntCounterVec,
    handled: IntCounterVec,
    received: IntCounterVec,
    sent: IntCounterVec,
    seconds: HistogramVec,
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| {
    let counter = |name: &str, help: &str, labels: &[&str]| {
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid options")
    };
    let mut with_code = LABELS.to_vec();
    with_code.push("grpc_code");
    Families {
        started: counter(
            "grpc_server_started_total",
            "Total number of RPCs started on the server.",
            &LABELS,
        ),
        handled: counter(
            "grpc_server_handled_total",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            &with_code,
        ),
        received: counter(
            "grpc_server_msg_received_total",
            "Total number of RPC stream messages received on the server.",
            &LABELS,
        ),
        sent: counter(
            "grpc_server_msg_sent_total",
            "Total number of gRPC stream messages sent by the server.",
            &LABELS,
        ),
        seconds: HistogramVec::new(
            HistogramOpts::new(
                "grpc_server_handling_seconds",
                "Histogram of response latency (seconds) of gRPC that had been \
                 application-level handled by the server.",
            )
            .buckets(HANDLING_BUCKETS.to_vec()),
            &LABELS,
        )
        .expect("valid options"),
    }
});

/// `etcd_server_client_requests_total{type, client_api_version}`: etcd counts each call by
/// whether it is unary and by the `client-api-version` its client sends. The versions etcd's
/// clients send are resolved once; any other value counts as `unknown`.
static CLIENT_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "etcd_server_client_requests_total",
            "The total number of client requests per client version.",
        ),
        &["type", "client_api_version"],
    )
    .expect("valid options")
});

const CLIENT_VERSIONS: [&str; 8] = ["3.0", "3.1", "3.2", "3.3", "3.4", "3.5", "3.6", "unknown"];

/// [unary, stream] x [`CLIENT_VERSIONS`].
static CLIENT_REQUEST_SERIES: LazyLock<[[IntCounter; 8]; 2]> = LazyLock::new(|| {
    ["unary", "stream"].map(|t| CLIENT_VERSIONS.map(|v| CLIENT_REQUESTS.with_label_values(&[t, v])))
});

fn count_client_request(stream: bool, version: Option<&[u8]>) {
    let i = version
        .and_then(|v| CLIENT_VERSIONS.iter().position(|k| k.as_bytes() == v))
        .unwrap_or(CLIENT_VERSIONS.len() - 1);
    CLIENT_REQUEST_SERIES[stream as usize][i].inc();
}

/// One method's series, resolved once.
struct Method {
    kind: GrpcType,
    started: IntCounter,
    handled: [IntCounter; 17],
    received: IntCounter,
    sent: IntCounter,
    seconds: Histogram,
}

/// Request path (`/service/method`) -> its series.
static TABLE: LazyLock<HashMap<String, Method>> = LazyLock::new(|| {
    let f = &*FAMILIES;
    let mut t = HashMap::new();
    for (service, methods) in METHODS {
        for (method, kind) in *methods {
            let l = [kind.label(), service, method];
            let handled =
                CODE_NAMES.map(|code| f.handled.with_label_values(&[l[0], l[1], l[2], code]));
            let m = Method {
                kind: *kind,
                started: f.started.with_label_values(&l),
                handled,
                received: f.received.with_label_values(&l),
                sent: f.sent.with_label_values(&l),
                seconds: f.seconds.with_label_values(&l),
            };
            t.insert(format!("/{service}/{method}"), m);
        }
    }
    t
});

/// Registers the families, with every method's series already in them.
pub(super) fn register(reg: &dyn Fn(Box<dyn prometheus::core::Collector>)) {
    LazyLock::force(&TABLE);
    LazyLock::force(&CLIENT_REQUEST_SERIES);
    reg(Box::new(CLIENT_REQUESTS.clone()));
    let f = &*FAMILIES;
    reg(Box::new(f.started.clone()));
    reg(Box::new(f.handled.clone()));
    reg(Box::new(f.received.clone()));
    reg(Box::new(f.sent.clone()));
    reg(Box::new(f.seconds.clone()));
}

/// The index into [`CODE_NAMES`] of a `grpc-status` value.
fn code_index(c: &[u8]) -> usize {
    std::str::from_utf8(c)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|i| *i < CODE_NAMES.len())
        .unwrap_or(UNKNOWN)
}

/// One call being handled: started with its request path, finished with its response, so
/// that the request need not be kept (or its URI copied) while the call runs.
pub struct Handled {
    method: Option<&'static Method>,
    /// When the call started; only timed with `--metrics extensive`.
    started: Option<Instant>,
}

impl Handled {
    /// A call to `path`, with the request's `headers` (for the client's API version).
    pub fn start(path: &str, headers: &http::HeaderMap) -> Self {
        let method = TABLE.get(path);
        if let Some(m) = method {
            let version = headers.get("client-api-version").map(|v| v.as_bytes());
            count_client_request(m.kind != Unary, version);
            m.started.inc();
            // A unary or server-streaming call's one request message: go-grpc-prometheus
            // counts it as received when the handler is called.
            if m.kind != BidiStream {
                m.received.inc();
            }
        }
        let started = (method.is_some() && super::extensive()).then(Instant::now);
        Handled { method, started }
    }

    /// Whether the call streams its responses: it is then finished when its response body
    /// ends ([`Handled::finish_status`]), not at its head.
    pub fn streams(&self) -> bool {
        self.method.is_some_and(|m| m.kind != Unary)
    }

    /// Counts the call under the code of its response head (`OK` without `grpc-status`).
    pub fn finish<B>(&self, res: &http::Response<B>) {
        self.finish_status(res.headers().get("grpc-status").map(|v| v.as_bytes()))
    }

    /// Counts the call under a `grpc-status` value (`OK` without one).
    pub fn finish_status(&self, status: Option<&[u8]>) {
        self.finish_code(status.map_or(0, code_index))
    }

    /// A response message of a streaming call, sent.
    pub fn sent_message(&self) {
        if let Some(m) = self.method {
            m.sent.inc();
        }
    }

    /// For a bidirectional stream, the counter of its received messages, to be increased by
    /// whoever reads the request body (the other kinds' one message is counted at start).
    pub fn stream_received(&self) -> Option<IntCounter> {
        self.method
            .filter(|m| m.kind == BidiStream)
            .map(|m| m.received.clone())
    }

    fn finish_code(&self, code: usize) {
        let Some(m) = self.method else { return };
        m.handled[code].inc();
        if code == 0 && m.kind == Unary {
            m.sent.inc();
        }
        if let Some(t) = self.started {
            m.seconds.observe(t.elapsed().as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handled(path: &str, code: &str) -> u64 {
        let (service, method) = path[1..].split_once('/').unwrap();
        let kind = TABLE[path].kind.label();
        FAMILIES
            .handled
            .with_label_values(&[kind, service, method, code])
            .get()
    }

    #[test]
    fn calls_are_counted_by_type_service_method_and_code() {
        let p = "/v3lockpb.Lock/Unlock";
        let (ok, unavailable) = (handled(p, "OK"), handled(p, "Unavailable"));
        let started = TABLE[p].started.get();
        Handled::start(p, &Default::default()).finish_code(0);
        Handled::start(p, &Default::default()).finish_code(0);
        Handled::start(p, &Default::default()).finish_code(code_index(b"14"));
        assert_eq!(handled(p, "OK"), ok + 2);
        assert_eq!(handled(p, "Unavailable"), unavailable + 1);
        assert_eq!(TABLE[p].started.get(), started + 3);
    }

    #[test]
    fn every_method_has_its_series_before_its_first_call() {
        let r = prometheus::Registry::new();
        register(&|c| r.register(c).unwrap());
        let families = r.gather();
        let handled = families
            .iter()
            .find(|f| f.name() == "grpc_server_handled_total")
            .unwrap();
        let n: usize = METHODS.iter().map(|(_, m)| m.len()).sum();
        assert_eq!(handled.get_metric().len(), n * CODE_NAMES.len());
        assert_eq!(
            TABLE["/etcdserverpb.Watch/Watch"].kind.label(),
            "bidi_stream"
        );
    }

    #[test]
    fn unknown_methods_are_not_counted() {
        let h = Handled::start("/etcdserverpb.KV/NoSuchMethod", &Default::default());
        assert!(h.method.is_none());
        h.finish_code(0);
    }

    #[test]
    fn unparsable_codes_are_unknown() {
        for c in [&b"17"[..], b"-1", b"", b"x"] {
            assert_eq!(CODE_NAMES[code_index(c)], "Unknown", "{c:?}");
        }
        assert_eq!(CODE_NAMES[code_index(b"16")], "Unauthenticated");
    }
}
