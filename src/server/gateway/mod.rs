//! etcd's JSON gateway (grpc-gateway v1, as etcd 3.4 serves it) and its plain HTTP endpoints,
//! on the client port beside gRPC.
//!
//! `POST /v3/<service>/<call>` with a JSON request body answers the call's response as JSON;
//! `/v3/watch`, `/v3/lease/keepalive` and `/v3/election/observe` stream `{"result": ...}`
//! chunks. `/v3beta/...` is an alias, as in etcd 3.4. `GET /version` answers as etcd's, with
//! kvd's own `kvd` and `kvdLogFormat` after etcd's fields; the health endpoints (`/health`,
//! `/livez`, `/readyz`) are [`crate::server::observe::health`]'s, and all of them carry etcd's
//! permissive CORS headers.
//!
//! Invariants:
//! - Every call goes through the same tonic servers as gRPC ([`call`]), so semantics, limits
//!   and errors are the gRPC ones; the gateway only translates JSON.
//! - The paths are etcd's (rpc.proto's `google.api.http` bindings), including the
//!   `/v3/kv/lease/...` aliases etcd keeps for older clients.
//! - No body is held past the gateway's limit ([`json::BodyLimit`], twice the transport's
//!   message limit): a unary body, or one message of a streamed body (with the whitespace
//!   before it), that passes it is refused with the transport's status as soon as it does,
//!   and the connection closes after the answer; a streamed body is scanned once, a byte at a
//!   time, for the end of each message.

mod call;
pub mod json;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRef, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, MethodRouter};
use axum::Router;

use super::api::auth::AuthService;
use super::api::cluster::ClusterService;
use super::api::election::ElectionService;
use super::api::kv::KvService;
use super::api::learner::LearnerGuard;
use super::api::lease::LeaseService;
use super::api::lock::LockService;
use super::api::maintenance::MaintenanceService;
use super::api::oversize::EtcdSizeError;
use super::api::watches::WatchService;
use super::version::ETCD_VERSION;
use crate::proto::etcdserverpb::auth_client::AuthClient;
use crate::proto::etcdserverpb::auth_server::AuthServer;
use crate::proto::etcdserverpb::cluster_client::ClusterClient;
use crate::proto::etcdserverpb::cluster_server::ClusterServer;
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::kv_server::KvServer;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::lease_server::LeaseServer;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::proto::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::proto::etcdserverpb::watch_client::WatchClient;
use crate::proto::etcdserverpb::watch_server::WatchServer;
use crate::proto::v3electionpb::election_client::ElectionClient;
use crate::proto::v3electionpb::election_server::ElectionServer;
use crate::proto::v3lockpb::lock_client::LockClient;
use crate::proto::v3lockpb::lock_server::LockServer;
use crate::raft::RaftNode;

/// The member's client-facing gRPC servers, which the gRPC routes and the gateway share.
#[derive(Clone)]
pub struct Services {
    pub kv: LearnerGuard<KvServer<KvService>>,
    pub watch: LearnerGuard<WatchServer<WatchService>>,
    pub lease: LearnerGuard<LeaseServer<LeaseService>>,
    pub cluster: LearnerGuard<ClusterServer<ClusterService>>,
    pub maintenance: LearnerGuard<MaintenanceServer<MaintenanceService>>,
    pub lock: LearnerGuard<LockServer<LockService>>,
    pub election: LearnerGuard<ElectionServer<ElectionService>>,
    pub auth: LearnerGuard<AuthServer<AuthService>>,
    /// The servers' message limit, for etcd's status when a request is above it.
    pub max_msg: usize,
}

type InProcess<S> = EtcdSizeError<LearnerGuard<S>>;

/// In-process clients of [`Services`]. Responses may be as large as the servers allow to
/// encode, so the clients decode without tonic's 4 MiB default limit. A request above the
/// servers' limit gets etcd's status, as on the gRPC port.
impl Services {
    fn sized<S>(&self, s: &LearnerGuard<S>) -> InProcess<S>
    where
        LearnerGuard<S>: Clone,
    {
        EtcdSizeError::new(s.clone(), self.max_msg)
    }
    fn kv(&self) -> KvClient<InProcess<KvServer<KvService>>> {
        KvClient::new(self.sized(&self.kv)).max_decoding_message_size(usize::MAX)
    }
    fn watch(&self) -> WatchClient<InProcess<WatchServer<WatchService>>> {
        WatchClient::new(self.sized(&self.watch)).max_decoding_message_size(usize::MAX)
    }
    fn lease(&self) -> LeaseClient<InProcess<LeaseServer<LeaseService>>> {
        LeaseClient::new(self.sized(&self.lease)).max_decoding_message_size(usize::MAX)
    }
    fn cluster(&self) -> ClusterClient<InProcess<ClusterServer<ClusterService>>> {
        ClusterClient::new(self.sized(&self.cluster)).max_decoding_message_size(usize::MAX)
    }
    fn maintenance(&self) -> MaintenanceClient<InProcess<MaintenanceServer<MaintenanceService>>> {
        MaintenanceClient::new(self.sized(&self.maintenance)).max_decoding_message_size(usize::MAX)
    }
    fn auth(&self) -> AuthClient<InProcess<AuthServer<AuthService>>> {
        AuthClient::new(self.sized(&self.auth))
    }
    fn lock(&self) -> LockClient<InProcess<LockServer<LockService>>> {
        LockClient::new(self.sized(&self.lock)).max_decoding_message_size(usize::MAX)
    }
    fn election(&self) -> ElectionClient<InProcess<ElectionServer<ElectionService>>> {
        ElectionClient::new(self.sized(&self.election)).max_decoding_message_size(usize::MAX)
    }
}

#[derive(Clone)]
struct Gateway {
    services: Services,
    limit: json::BodyLimit,
}

impl FromRef<Arc<Gateway>> for json::BodyLimit {
    fn from_ref(g: &Arc<Gateway>) -> Self {
        g.limit
    }
}

type Route = MethodRouter<Arc<Gateway>>;

/// A unary call `$client.$method` at `POST`.
macro_rules! unary {
    ($client:ident, $method:ident) => {
        post(
            |State(g): State<Arc<Gateway>>, h: call::Incoming, b: call::JsonBody| async move {
                call::unary(&h, &b.0, |r| async move {
                    g.services.$client().$method(r).await
                })
                .await
            },
        )
    };
}

/// A bidirectional stream call `$client.$method` at `POST`.
macro_rules! bidi {
    ($client:ident, $method:ident) => {
        post(
            |State(g): State<Arc<Gateway>>, h: call::Incoming, b: Body| async move {
                let limit = g.limit;
                call::bidi(&h, b, limit, |r| async move {
                    g.services.$client().$method(r).await
                })
                .await
            },
        )
    };
}

/// A server-streaming call `$client.$method` at `POST` (one request, a stream of responses).
macro_rules! server_stream {
    ($client:ident, $method:ident) => {
        post(
            |State(g): State<Arc<Gateway>>, h: call::Incoming, b: call::JsonBody| async move {
                call::server_stream(&h, &b.0, |r| async move {
                    g.services.$client().$method(r).await
                })
                .await
            },
        )
    };
}

/// Maintenance.Status without kvd's extension fields (numbers 1001+): etcd's gateway has no
/// such fields, and a JSON client may decode strictly.
fn status() -> Route {
    post(
        |State(g): State<Arc<Gateway>>, h: call::Incoming, b: call::JsonBody| async move {
            call::unary(&h, &b.0, |r| async move {
                let mut resp = g.services.maintenance().status(r).await?;
                let s = resp.get_mut();
                s.kvd_recent_wal_fsyncs = 0;
                s.kvd_recent_wal_fsync_p99_us = 0;
                s.kvd_peers.clear();
                Ok(resp)
            })
            .await
        },
    )
}

/// etcd 3.4's gateway paths, relative to the `/v3` (or `/v3beta`) prefix.
fn calls() -> Vec<(&'static str, Route)> {
    vec![
        ("/kv/range", unary!(kv, range)),
        ("/kv/put", unary!(kv, put)),
        ("/kv/deleterange", unary!(kv, delete_range)),
        ("/kv/txn", unary!(kv, txn)),
        ("/kv/compaction", unary!(kv, compact)),
        ("/watch", bidi!(watch, watch)),
        ("/lease/grant", unary!(lease, lease_grant)),
        ("/lease/revoke", unary!(lease, lease_revoke)),
        ("/kv/lease/revoke", unary!(lease, lease_revoke)),
        ("/lease/keepalive", bidi!(lease, lease_keep_alive)),
        ("/lease/timetolive", unary!(lease, lease_time_to_live)),
        ("/kv/lease/timetolive", unary!(lease, lease_time_to_live)),
        ("/lease/leases", unary!(lease, lease_leases)),
        ("/kv/lease/leases", unary!(lease, lease_leases)),
        ("/cluster/member/add", unary!(cluster, member_add)),
        ("/cluster/member/remove", unary!(cluster, member_remove)),
        ("/cluster/member/update", unary!(cluster, member_update)),
        ("/cluster/member/list", unary!(cluster, member_list)),
        ("/cluster/member/promote", unary!(cluster, member_promote)),
        ("/maintenance/alarm", unary!(maintenance, alarm)),
        ("/maintenance/status", status()),
        ("/maintenance/defragment", unary!(maintenance, defragment)),
        ("/maintenance/hash", unary!(maintenance, hash)),
        ("/maintenance/hashkv", unary!(maintenance, hash_kv)),
        (
            "/maintenance/transfer-leadership",
            unary!(maintenance, move_leader),
        ),
        ("/auth/enable", unary!(auth, auth_enable)),
        ("/auth/disable", unary!(auth, auth_disable)),
        ("/auth/status", unary!(auth, auth_status)),
        ("/auth/authenticate", unary!(auth, authenticate)),
        ("/auth/user/add", unary!(auth, user_add)),
        ("/auth/user/get", unary!(auth, user_get)),
        ("/auth/user/list", unary!(auth, user_list)),
        ("/auth/user/delete", unary!(auth, user_delete)),
        ("/auth/user/changepw", unary!(auth, user_change_password)),
        ("/auth/user/grant", unary!(auth, user_grant_role)),
        ("/auth/user/revoke", unary!(auth, user_revoke_role)),
        ("/auth/role/add", unary!(auth, role_add)),
        ("/auth/role/get", unary!(auth, role_get)),
        ("/auth/role/list", unary!(auth, role_list)),
        ("/auth/role/delete", unary!(auth, role_delete)),
        ("/auth/role/grant", unary!(auth, role_grant_permission)),
        ("/auth/role/revoke", unary!(auth, role_revoke_permission)),
        // v3lock.proto's and v3election.proto's bindings.
        ("/lock/lock", unary!(lock, lock)),
        ("/lock/unlock", unary!(lock, unlock)),
        ("/election/campaign", unary!(election, campaign)),
        ("/election/proclaim", unary!(election, proclaim)),
        ("/election/leader", unary!(election, leader)),
        ("/election/observe", server_stream!(election, observe)),
        ("/election/resign", unary!(election, resign)),
    ]
}

/// The gateway's routes, to be merged with the gRPC routes on a client listener.
/// `max_msg` is the gRPC transport's message limit. A body, or one message of a streamed
/// body, may be twice that: JSON carries bytes as base64 (4/3 larger) plus field names and
/// quotes, and a message the transport refuses is best refused there, with its exact size.
/// A body larger than that is refused as soon as it passes the bound (before it is read, when
/// its length is announced), with the same status; no body is buffered past it.
pub fn router(services: Services, node: RaftNode, max_msg: usize) -> Router {
    let limit = json::BodyLimit {
        max_body: 2 * max_msg,
        max_msg,
    };
    let mut r = Router::new();
    for prefix in ["/v3", "/v3beta"] {
        for (path, route) in calls() {
            // grpc-gateway answers other methods on a known path with a plain-text 405.
            r = r.route(
                &format!("{prefix}{path}"),
                route.fallback(method_not_allowed),
            );
        }
        r = r.route(&format!("{prefix}/{{*rest}}"), any(unknown_call));
    }
    r.route("/version", get(version))
        .merge(crate::server::observe::health::router(node.clone()))
        .layer(axum::middleware::from_fn(move |req, next| {
            refuse_oversized(req, next, limit)
        }))
        .layer(axum::middleware::from_fn(cors))
        .with_state(Arc::new(Gateway { services, limit }))
}

/// etcd's gateway hands any body to its gRPC client, whose transport refuses a message
/// over the limit with 429 and grpc-go's ResourceExhausted; a body announced above the
/// limit gets that answer here, with the body's own length standing in for the message's.
async fn refuse_oversized(
    req: axum::extract::Request,
    next: axum::middleware::Next,
    limit: json::BodyLimit,
) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match announced {
        Some(len) if len > limit.max_body as u64 => {
            json::drain(&mut req.into_body().into_data_stream()).await;
            json::unary_error(&crate::server::api::oversize::too_large(
                len,
                limit.max_msg as u64,
            ))
        }
        _ => next.run(req).await,
    }
}

/// etcd's default CORS handling of its HTTP endpoints: every answer allows any origin, and a
/// preflight `OPTIONS` is answered 200 without reaching the handler.
async fn cors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut resp = if req.method() == axum::http::Method::OPTIONS {
        StatusCode::OK.into_response()
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("accept, content-type, authorization"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    resp
}

fn plain(status: StatusCode, body: &'static str) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

async fn method_not_allowed() -> Response {
    plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n")
}

/// Anything no route takes: a gRPC call to an unknown method is `Unimplemented` (as tonic
/// answers), any other request Go's plain 404.
pub async fn not_found(req: axum::extract::Request) -> Response {
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        let (parts, ()) = tonic::Status::unimplemented("")
            .into_http::<()>()
            .into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    plain(StatusCode::NOT_FOUND, "404 page not found\n")
}

async fn unknown_call() -> Response {
    plain(StatusCode::NOT_FOUND, "Not Found\n")
}

/// etcd's cluster version: the major.minor the members agree on, as "X.Y.0".
fn cluster_version() -> String {
    let mut parts = ETCD_VERSION.splitn(3, '.');
    let major = parts.next().unwrap_or("3");
    let minor = parts.next().unwrap_or("0");
    format!("{major}.{minor}.0")
}

/// `GET /version`'s body: etcd's fields in etcd's order, which clients read as etcd's, then
/// kvd's release and the newest log format this member applies.
#[derive(serde::Serialize)]
struct Versions {
    etcdserver: &'static str,
    etcdcluster: String,
    kvd: &'static str,
    #[serde(rename = "kvdLogFormat")]
    kvd_log_format: u32,
}

async fn version() -> Response {
    json::message(&Versions {
        etcdserver: ETCD_VERSION,
        etcdcluster: cluster_version(),
        kvd: super::version::VERSION,
        kvd_log_format: super::version::LOG_FORMAT,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_version_is_major_minor_zero() {
        assert_eq!(cluster_version(), "3.5.0");
        assert!(ETCD_VERSION.starts_with("3.5."));
    }
}
