//! Authentication tokens, sent as clientv3 sends them: gRPC metadata key `token` on every
//! request of a connection whose `--user` has a password.
//!
//! Invariants:
//! - No token is sent without `--user` and a password (a client certificate alone identifies
//!   the user by its CN), and none while the server reports auth as disabled.
//! - `Authenticate` itself goes over the bare channel, never with a token.
//! - A unary request answered with `invalid auth token`, `user name is empty` or `revision of
//!   auth store is old` is re-authenticated and sent once more, as clientv3's retry
//!   interceptor does; for that, unary requests and responses that carry a token are
//!   buffered. Streams (Watch, LeaseKeepAlive, Snapshot) are neither buffered nor replayed.
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::HeaderValue;
use http_body_util::{BodyExt, Full};
use kvd::proto::etcdserverpb::{auth_client::AuthClient, AuthenticateRequest};
use tonic::body::Body;
use tonic::codegen::{Service, StdError};
use tonic::transport::Channel;

use crate::error::EtcdError;

/// gRPC metadata key of the token (`rpctypes.TokenFieldNameGRPC`).
const TOKEN_KEY: &str = "token";

/// Methods with a streamed request or response, which are not buffered for a retry.
const STREAMING: &[&str] = &[
    "/etcdserverpb.Watch/Watch",
    "/etcdserverpb.Lease/LeaseKeepAlive",
    "/etcdserverpb.Maintenance/Snapshot",
];

/// A user's credentials and its current token.
pub struct Credentials {
    user: String,
    password: String,
    token: RwLock<Option<HeaderValue>>,
}

impl Credentials {
    pub fn new(user: String, password: String) -> Arc<Self> {
        Arc::new(Credentials {
            user,
            password,
            token: RwLock::new(None),
        })
    }

    fn current(&self) -> Option<HeaderValue> {
        self.token.read().map(|t| t.clone()).unwrap_or(None)
    }

    /// Calls `Auth.Authenticate` over `channel` and keeps the token; with auth disabled there
    /// is no token, as clientv3's `getToken` ignores `ErrAuthNotEnabled`.
    pub async fn authenticate(&self, channel: Channel) -> Result<(), tonic::Status> {
        let req = AuthenticateRequest {
            name: self.user.clone(),
            password: self.password.clone(),
        };
        let token = match AuthClient::new(channel).authenticate(req).await {
            Ok(r) => HeaderValue::from_str(&r.into_inner().token).ok(),
            Err(s) if EtcdError::of(&s) == Some(EtcdError::AuthNotEnabled) => None,
            Err(s) => return Err(s),
        };
        if let Ok(mut t) = self.token.write() {
            *t = token;
        }
        Ok(())
    }
}

/// A channel that adds the token to each request and refreshes it when the server rejects it.
#[derive(Clone)]
pub struct AuthChannel {
    inner: Channel,
    creds: Option<Arc<Credentials>>,
}

impl AuthChannel {
    pub fn new(inner: Channel, creds: Option<Arc<Credentials>>) -> Self {
        AuthChannel { inner, creds }
    }
}

fn with_token(mut req: http::Request<Body>, creds: &Credentials) -> http::Request<Body> {
    if let Some(t) = creds.current() {
        req.headers_mut().insert(TOKEN_KEY, t);
    }
    req
}

/// Reads a unary body completely: its data and its trailers.
async fn collect(body: Body) -> Result<(Bytes, Option<http::HeaderMap>), StdError> {
    let collected = body.collect().await.map_err(|e| -> StdError { e.into() })?;
    let trailers = collected.trailers().cloned();
    Ok((collected.to_bytes(), trailers))
}

/// A body that yields `data`, then `trailers`.
fn replay(data: Bytes, trailers: Option<http::HeaderMap>) -> Body {
    let body = Full::new(data).with_trailers(async move { trailers.map(Ok) });
    Body::new(body)
}

/// Whether an error status (trailers-only in the headers, or in the trailers: etcd's TLS port
/// answers through Go's HTTP server, which sends them apart) asks for a fresh token.
fn needs_new_token(headers: &http::HeaderMap, trailers: Option<&http::HeaderMap>) -> bool {
    let status = tonic::Status::from_header_map(headers)
        .or_else(|| trailers.and_then(tonic::Status::from_header_map));
    match status {
        Some(s) if s.code() != tonic::Code::Ok => matches!(
            EtcdError::of(&s),
            Some(EtcdError::InvalidAuthToken | EtcdError::UserEmpty | EtcdError::AuthOldRevision)
        ),
        _ => false,
    }
}

/// Sends a buffered unary request with the current token; the response comes back buffered.
async fn send(
    inner: &mut Channel,
    parts: &http::request::Parts,
    body: &Bytes,
    creds: &Credentials,
) -> Result<(http::response::Parts, Bytes, Option<http::HeaderMap>), StdError> {
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    let req = http::Request::from_parts(parts.clone(), Body::new(Full::new(body.clone())));
    let resp = inner.call(with_token(req, creds)).await?;
    let (rparts, rbody) = resp.into_parts();
    let (data, trailers) = collect(rbody).await?;
    Ok((rparts, data, trailers))
}

impl Service<http::Request<Body>> for AuthChannel {
    type Response = http::Response<Body>;
    type Error = StdError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The ready channel serves this call; the clone takes its place for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(creds) = self.creds.clone() else {
            return Box::pin(async move { inner.call(req).await.map_err(Into::into) });
        };
        if STREAMING.contains(&req.uri().path()) {
            let req = with_token(req, &creds);
            return Box::pin(async move { inner.call(req).await.map_err(Into::into) });
        }
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let (body, _) = collect(body).await?;
            let (rparts, data, trailers) = send(&mut inner, &parts, &body, &creds).await?;
            if !needs_new_token(&rparts.headers, trailers.as_ref())
                || creds.authenticate(inner.clone()).await.is_err()
            {
                return Ok(http::Response::from_parts(rparts, replay(data, trailers)));
            }
            let (rparts, data, trailers) = send(&mut inner, &parts, &body, &creds).await?;
            Ok(http::Response::from_parts(rparts, replay(data, trailers)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trailers_only(code: tonic::Code, msg: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        tonic::Status::new(code, msg).add_header(&mut h).unwrap();
        h
    }

    #[test]
    fn refresh_on_token_errors_only() {
        let empty = http::HeaderMap::new();
        let invalid = trailers_only(
            tonic::Code::Unauthenticated,
            "etcdserver: invalid auth token",
        );
        assert!(needs_new_token(&invalid, None));
        // etcd's TLS port sends the status in the trailers.
        assert!(needs_new_token(&empty, Some(&invalid)));
        let r = trailers_only(
            tonic::Code::InvalidArgument,
            "etcdserver: user name is empty",
        );
        assert!(needs_new_token(&r, None));
        let r = trailers_only(
            tonic::Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        assert!(!needs_new_token(&r, None));
        assert!(!needs_new_token(&empty, None));
    }
}
