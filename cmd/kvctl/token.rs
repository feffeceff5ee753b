//! Authentication tokens, sent as clientv3 sends them: gRPC metadata key `token` on every
//! request of a connection whose `--user` has a password.
//!
//! Invariants:
//! - No token is sent without `--user` and a password (a client certificate alone identifies
//!   the user by its CN), and none while the server reports auth as disabled.
//! - `Authenticate` itself goes over the bare channel, never with a token.
//! - A unary request answered with `invalid auth token`, `user name is empty` or `revision of
//!   auth store is old` is re-authenticated and sent once more, as clientv3's retry
//!   interceptor does. Bidirectional streams (Watch, LeaseKeepAlive) are not replayed: their
//!   request body is open-ended.
use std::sync::{Arc, RwLock};

use axum::body::HttpBody;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use http::HeaderValue;
use kvd::proto::etcdserverpb::{auth_client::AuthClient, AuthenticateRequest};
use tonic::body::Body;
use tonic::codegen::{Service, StdError};
use tonic::transport::Channel;

use crate::error::EtcdError;

/// gRPC metadata key of the token (`rpctypes.TokenFieldNameGRPC`).
const TOKEN_KEY: &str = "token";

/// Methods whose request is a client stream, which cannot be buffered for a retry.
const STREAMING: &[&str] = &[
    "/etcdserverpb.Watch/Watch",
    "/etcdserverpb.Lease/LeaseKeepAlive",
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

/// Reads a unary request body completely (a few bytes to a few MiB: etcd's request limit).
async fn collect(mut body: Body) -> Result<Bytes, StdError> {
    let mut buf = BytesMut::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        if let Ok(data) = frame?.into_data() {
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// Whether a trailers-only error response asks for a fresh token.
fn needs_new_token(resp: &http::Response<Body>) -> bool {
    match tonic::Status::from_header_map(resp.headers()) {
        Some(s) if s.code() != tonic::Code::Ok => matches!(
            EtcdError::of(&s),
            Some(EtcdError::InvalidAuthToken | EtcdError::UserEmpty | EtcdError::AuthOldRevision)
        ),
        _ => false,
    }
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
            let body = collect(body).await?;
            let first = http::Request::from_parts(
                parts.clone(),
                Body::new(axum::body::Body::from(body.clone())),
            );
            let resp = inner.call(with_token(first, &creds)).await?;
            if !needs_new_token(&resp) {
                return Ok(resp);
            }
            if creds.authenticate(inner.clone()).await.is_err() {
                return Ok(resp);
            }
            let second = http::Request::from_parts(parts, Body::new(axum::body::Body::from(body)));
            let mut again = inner.clone();
            std::future::poll_fn(|cx| again.poll_ready(cx)).await?;
            Ok(again.call(with_token(second, &creds)).await?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trailers_only(code: tonic::Code, msg: &str) -> http::Response<Body> {
        let mut resp = http::Response::new(Body::empty());
        let status = tonic::Status::new(code, msg);
        status.add_header(resp.headers_mut()).unwrap();
        resp
    }

    #[test]
    fn refresh_on_token_errors_only() {
        let r = trailers_only(
            tonic::Code::Unauthenticated,
            "etcdserver: invalid auth token",
        );
        assert!(needs_new_token(&r));
        let r = trailers_only(
            tonic::Code::InvalidArgument,
            "etcdserver: user name is empty",
        );
        assert!(needs_new_token(&r));
        let r = trailers_only(
            tonic::Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        assert!(!needs_new_token(&r));
        assert!(!needs_new_token(&http::Response::new(Body::empty())));
    }
}
