//! etcd's health endpoints, served on the client port and on `--listen-metrics-urls`:
//! - `GET /health`: etcd 3.4's answer (`{"health":"true"}`, or `{"health":"false"}` with 503)
//!   with its checks in its order: an active alarm not named by `?exclude=<ALARM>`, then no
//!   leader, then a linearizable read within a second. etcd 3.5's `?serializable=true` skips the
//!   leader check and reads locally, so it tells whether this process serves, not the cluster.
//! - `GET /livez` and `GET /readyz`: etcd 3.5.11's check registry (kubeadm's probes). `livez`
//!   runs `serializable_read`; `readyz` runs `data_corruption`, `serializable_read`,
//!   `linearizable_read` and `non_learner`. `?exclude=<check>` (repeatable) leaves checks out
//!   (an unknown name is logged, not refused); `?verbose` lists each check's result before
//!   `ok`; a failure answers 503 with every check's line. `/livez/<check>` and
//!   `/readyz/<check>` run one check.
//!
//! Invariants:
//! - Probes never write: reads only, so probing a member without quorum leaves its log alone.
//! - The answers are etcd's byte for byte (bodies, status codes, `Allow` on 405), except that
//!   checks run in the fixed order above where etcd's order follows Go's map iteration.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;

use crate::proto::etcdserverpb::{AlarmType, RangeRequest};
use crate::raft::RaftNode;
use crate::server::error::ApiError;

/// The routes, for the client port's and the metrics listener's routers.
pub fn router<S: Clone + Send + Sync + 'static>(node: RaftNode) -> Router<S> {
    Router::new()
        .route("/health", any(health))
        .route("/livez", any(livez))
        .route("/livez/{check}", any(livez_one))
        .route("/readyz", any(readyz))
        .route("/readyz/{check}", any(readyz_one))
        .with_state(node)
}

/// One check of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// No CORRUPT alarm is active.
    DataCorruption,
    /// A local (serializable) read succeeds.
    SerializableRead,
    /// A linearizable read succeeds: a quorum confirms the leader's commit index.
    LinearizableRead,
    /// This member is a voter.
    NonLearner,
}

/// `/livez`'s checks.
pub const LIVEZ: &[Check] = &[Check::SerializableRead];
/// `/readyz`'s checks.
pub const READYZ: &[Check] = &[
    Check::DataCorruption,
    Check::SerializableRead,
    Check::LinearizableRead,
    Check::NonLearner,
];

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
            Check::NonLearner => "non_learner",
        }
    }

    /// Runs the check; the error is the text etcd puts after `failed: `.
    pub async fn run(self, node: &RaftNode) -> Result<(), String> {
        match self {
            Check::DataCorruption => {
                if node.alarms().is_active(AlarmType::Corrupt) {
                    Err("alarm activated: CORRUPT".into())
                } else {
                    Ok(())
                }
            }
            Check::SerializableRead => read(node, true, None).await,
            Check::LinearizableRead => read(node, false, None).await,
            Check::NonLearner => {
                if node.is_learner() {
                    Err("not supported for learner".into())
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// etcd's probe read: one key, keys only. A linearizable read first waits for a read index
/// (bounded by the node's request timeout, or by `limit`).
async fn read(node: &RaftNode, serializable: bool, limit: Option<Duration>) -> Result<(), String> {
    if !serializable {
        let barrier = node.read_barrier();
        let r = match limit {
            Some(d) => tokio::time::timeout(d, barrier)
                .await
                .unwrap_or(Err(crate::raft::ProposeError::Timeout)),
            None => barrier.await,
        };
        r.map_err(|e| ApiError::from(e).to_string())?;
    }
    let req = RangeRequest {
        key: b"health".to_vec(),
        keys_only: true,
        limit: 1,
        serializable,
        ..Default::default()
    };
    node.range(&req)
        .await
        .map(drop)
        .map_err(|e| ApiError::from(e).to_string())
}

/// The query's `(name, value)` pairs.
fn query(req: &Request) -> Vec<(String, String)> {
    url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The non-empty values of `name`, as etcd's `getQuerySet`.
fn query_set(q: &[(String, String)], name: &str) -> BTreeSet<String> {
    q.iter()
        .filter(|(k, v)| k == name && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect()
}

/// Go's `http.Error`: the text and a newline, as plain text that must not be sniffed.
fn go_error(status: StatusCode, text: &str) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

/// etcd answers every method but GET with 405 and `Allow: GET`.
fn method_not_allowed() -> Response {
    let mut r = go_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    r
}

/// etcd 3.4's `/health` with 3.5's `serializable`.
async fn health(State(node): State<RaftNode>, req: Request) -> Response {
    if req.method() != Method::GET {
        return method_not_allowed();
    }
    let q = query(&req);
    let excluded = query_set(&q, "exclude");
    let serializable = q.iter().any(|(k, v)| k == "serializable" && v == "true");
    let checked = health_check(&node, &excluded, serializable).await;
    match &checked {
        Ok(()) => crate::metrics::HEALTH_SUCCESS.inc(),
        Err(_) => crate::metrics::HEALTH_FAILURES.inc(),
    }
    match checked {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            )],
            r#"{"health":"true"}"#,
        )
            .into_response(),
        Err(why) => {
            tracing::warn!("/health error; {why}");
            go_error(StatusCode::SERVICE_UNAVAILABLE, r#"{"health":"false"}"#)
        }
    }
}

/// `/health`'s checks in etcd's order; the error says which failed, for the log.
pub async fn health_check(
    node: &RaftNode,
    excluded: &BTreeSet<String>,
    serializable: bool,
) -> Result<(), String> {
    for a in node.alarms().get(AlarmType::None as i32) {
        let name = AlarmType::try_from(a.alarm).map_or("UNKNOWN", |t| t.as_str_name());
        if !excluded.contains(name) {
            return Err(format!("alarm {name} is active"));
        }
    }
    if !serializable && !node.has_leader() {
        return Err("no leader".into());
    }
    // etcd 3.4 gives its quorum read one second.
    read(node, serializable, Some(Duration::from_secs(1)))
        .await
        .map_err(|e| format!("read failed: {e}"))
}

async fn livez(State(node): State<RaftNode>, req: Request) -> Response {
    registry(&node, req, "livez", LIVEZ, None).await
}

async fn readyz(State(node): State<RaftNode>, req: Request) -> Response {
    registry(&node, req, "readyz", READYZ, None).await
}

async fn livez_one(
    State(node): State<RaftNode>,
    Path(check): Path<String>,
    req: Request,
) -> Response {
    registry(&node, req, "livez", LIVEZ, Some(&check)).await
}

async fn readyz_one(
    State(node): State<RaftNode>,
    Path(check): Path<String>,
    req: Request,
) -> Response {
    registry(&node, req, "readyz", READYZ, Some(&check)).await
}

/// One registry's answer: all its checks but the excluded ones, or the one check `only`.
async fn registry(
    node: &RaftNode,
    req: Request,
    kind: &str,
    checks: &[Check],
    only: Option<&str>,
) -> Response {
    let run: Vec<Check> = match only {
        Some(name) => match checks.iter().find(|c| c.name() == name) {
            Some(c) => vec![*c],
            None => return go_error(StatusCode::NOT_FOUND, "404 page not found"),
        },
        None => checks.to_vec(),
    };
    if req.method() != Method::GET {
        return method_not_allowed();
    }
    let q = query(&req);
    let run = if only.is_none() {
        let mut excluded = query_set(&q, "exclude");
        let run = run
            .into_iter()
            .filter(|c| !excluded.remove(c.name()))
            .collect();
        if !excluded.is_empty() {
            let missing: Vec<String> = excluded.iter().map(|e| format!("{e:?}")).collect();
            tracing::warn!(
                "some health checks cannot be excluded: missing-health-checks {}",
                missing.join(",")
            );
        }
        run
    } else {
        run
    };
    let (ok, report) = run_checks(node, &run).await;
    if !ok {
        tracing::error!("Health check error: path /{kind} reason {report:?}");
        // The report ends with a newline, and http.Error adds one.
        return go_error(StatusCode::SERVICE_UNAVAILABLE, &report);
    }
    let verbose = q.iter().any(|(k, _)| k == "verbose");
    let body = if verbose {
        format!("{report}ok\n")
    } else {
        "ok\n".to_string()
    };
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

/// Runs `checks` one after the other: whether all passed, and etcd's report, one line each
/// (`[+]name ok` or `[-]name failed: why`).
pub async fn run_checks(node: &RaftNode, checks: &[Check]) -> (bool, String) {
    let mut ok = true;
    let mut report = String::new();
    for c in checks {
        match c.run(node).await {
            Ok(()) => report.push_str(&format!("[+]{} ok\n", c.name())),
            Err(e) => {
                ok = false;
                report.push_str(&format!("[-]{} failed: {e}\n", c.name()));
            }
        }
    }
    (ok, report)
}
