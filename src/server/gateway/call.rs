//! Running one gateway request as a gRPC call on this member's own services.
//!
//! Like etcd's gateway, which is a gRPC client of its own member, the gateway calls the same
//! tonic servers that serve the client port, in process (no socket, but the same request
//! limits, handlers and statuses), so a JSON request and a gRPC request cannot behave
//! differently.
//!
//! Bidirectional stream calls follow grpc-gateway v1: the first request message is decoded before the call
//! starts (a body that does not decode fails the request as a whole); later messages are
//! forwarded as they arrive and the end of the body half-closes the request stream. The
//! response is streamed as `{"result": ...}` chunks; a call that fails before its first
//! message answers with the error's HTTP status, one that fails later appends an error chunk.

use std::future::Future;

use axum::body::{Body, Bytes};
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::Response;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::{Code, Status, Streaming};

use super::json::{self, BodyError, BodyLimit};
use crate::server::api::client_cert::{ClientCert, TlsPeer};

/// What the gateway passes on of an HTTP request: its headers, and the verified client
/// certificate of its TLS connection (set only with `--client-cert-auth`).
pub struct Incoming {
    pub headers: HeaderMap,
    pub cert: Option<ClientCert>,
}

impl<S: Send + Sync> FromRequestParts<S> for Incoming {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // The client listener's connection info, as a gRPC request sees it.
        let cert = parts
            .extensions
            .get::<TlsPeer>()
            .and_then(|p| p.client_cert.clone());
        Ok(Incoming {
            headers: parts.headers.clone(),
            cert,
        })
    }
}

/// A unary call's request body, read whole but refused as soon as it passes the gateway's
/// [`BodyLimit`] (as the transport would refuse the message), so no body is buffered past it.
pub struct JsonBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody
where
    BodyLimit: FromRef<S>,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        json::read_body(req.into_body(), BodyLimit::from_ref(state))
            .await
            .map(JsonBody)
            .map_err(|s| json::unary_error(&s))
    }
}

/// grpc-gateway forwards `Grpc-Metadata-<name>` headers as gRPC metadata `<name>` (e.g.
/// `Grpc-Metadata-hasleader: true` asks for etcd's require-leader mode), and `Authorization`
/// as `authorization` (where etcd looks for a gateway client's auth token). Without one, the
/// call carries the client certificate, whose CN auth takes as the user, as on the gRPC path.
fn request_with_metadata<T>(inc: &Incoming, msg: T) -> tonic::Request<T> {
    let headers = &inc.headers;
    let mut req = tonic::Request::new(msg);
    if let Some(v) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| MetadataValue::try_from(v.as_bytes()).ok())
    {
        req.metadata_mut().insert("authorization", v);
    } else if let Some(cert) = &inc.cert {
        req.extensions_mut().insert(cert.clone());
    }
    for (name, value) in headers {
        let Some(md) = name.as_str().strip_prefix("grpc-metadata-") else {
            continue;
        };
        if let (Ok(k), Ok(v)) = (
            MetadataKey::from_bytes(md.as_bytes()),
            MetadataValue::try_from(value.as_bytes()),
        ) {
            req.metadata_mut().append(k, v);
        }
    }
    req
}

/// A unary call: decode the body, call, encode the response or the error.
pub async fn unary<Req, Resp, F, Fut>(inc: &Incoming, body: &Bytes, call: F) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let msg = match json::decode_unary::<Req>(body) {
        Ok(m) => m,
        Err(s) => return json::unary_error(&s),
    };
    match call(request_with_metadata(inc, msg)).await {
        Ok(r) => json::message(r.get_ref()),
        Err(s) => json::unary_error(&s),
    }
}

/// Aborts the body-decoding task when the response is dropped (the client went away or the
/// response stream ended), so it does not wait on a body nobody needs any more.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A bidirectional stream call (Watch, LeaseKeepAlive). Each message of the body is held
/// to `limit`: a first message above it is refused as a unary body would be; a later one
/// ends the response with the refusal as its error chunk, which closes the connection.
pub async fn bidi<Req, Resp, F, Fut>(
    inc: &Incoming,
    body: Body,
    limit: BodyLimit,
    call: F,
) -> Response
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: FnOnce(tonic::Request<ReceiverStream<Req>>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Streaming<Resp>>, Status>>,
{
    let mut input = json::MessageStream::new(body.into_data_stream(), limit);
    let (tx, rx) = mpsc::channel::<Req>(16);
    match input.next::<Req>().await {
        Some(Ok(m)) => {
            let _ = tx.try_send(m);
        }
        // grpc-gateway passes the decoder's error on as is: code Unknown.
        Some(Err(BodyError::Invalid(e))) => {
            return json::unary_error(&Status::new(Code::Unknown, e))
        }
        Some(Err(BodyError::TooLarge(s))) => {
            input.drain().await;
            return json::unary_error(&s);
        }
        None => {}
    }
    let (refused_tx, refused) = oneshot::channel::<Status>();
    let forward = tokio::spawn(async move {
        loop {
            match input.next::<Req>().await {
                Some(Ok(m)) => {
                    if tx.send(m).await.is_err() {
                        return;
                    }
                }
                Some(Err(BodyError::TooLarge(s))) => {
                    input.drain().await;
                    let _ = refused_tx.send(s);
                    return;
                }
                // As in grpc-gateway, a message that does not decode ends the requests, not
                // the call: dropping tx half-closes the request stream, as the end of the
                // body does.
                Some(Err(BodyError::Invalid(_))) | None => return,
            }
        }
    });
    let guard = AbortOnDrop(forward);
    let mut out = match call(request_with_metadata(inc, ReceiverStream::new(rx))).await {
        Ok(r) => r.into_inner(),
        Err(s) => return json::stream_failed(&s),
    };
    let first = match out.message().await {
        Ok(Some(m)) => json::result_chunk(&m),
        Ok(None) => return json::stream_response(futures::stream::empty()),
        Err(s) => return json::stream_failed(&s),
    };
    let state = BidiOut {
        out,
        refused: Some(refused),
        _guard: guard,
    };
    let rest = futures::stream::unfold(Some(state), |state| async move {
        let mut st = state?;
        loop {
            tokio::select! {
                m = st.out.message() => {
                    return match m {
                        Ok(Some(m)) => Some((json::result_chunk(&m), Some(st))),
                        Ok(None) => None,
                        Err(s) => Some((json::error_chunk(&s), None)),
                    };
                }
                r = async { st.refused.as_mut().expect("enabled only while set").await },
                    if st.refused.is_some() =>
                {
                    match r {
                        Ok(s) => return Some((json::error_chunk(&s), None)),
                        // The body ended, or the requests did: the responses go on.
                        Err(_) => st.refused = None,
                    }
                }
            }
        }
    });
    json::stream_response(futures::stream::once(async move { first }).chain(rest))
}

/// A bidirectional call's response side: the responses, the request body's refusal (when
/// a message in it is too large), and the task that forwards the requests.
struct BidiOut<Resp> {
    out: Streaming<Resp>,
    refused: Option<oneshot::Receiver<Status>>,
    _guard: AbortOnDrop,
}

/// A server-streaming call (Election.Observe): the body is one request, as for a unary call;
/// the responses stream as a bidirectional call's do.
pub async fn server_stream<Req, Resp, F, Fut>(inc: &Incoming, body: &Bytes, call: F) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize + Send + 'static,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Streaming<Resp>>, Status>>,
{
    let msg = match json::decode_unary::<Req>(body) {
        Ok(m) => m,
        Err(s) => return json::unary_error(&s),
    };
    let mut out = match call(request_with_metadata(inc, msg)).await {
        Ok(r) => r.into_inner(),
        Err(s) => return json::stream_failed(&s),
    };
    let first = match out.message().await {
        Ok(Some(m)) => json::result_chunk(&m),
        Ok(None) => return json::stream_response(futures::stream::empty()),
        Err(s) => return json::stream_failed(&s),
    };
    let rest = futures::stream::unfold(Some(out), |state| async move {
        let mut out = state?;
        match out.message().await {
            Ok(Some(m)) => Some((json::result_chunk(&m), Some(out))),
            Ok(None) => None,
            Err(s) => Some((json::error_chunk(&s), None)),
        }
    });
    json::stream_response(futures::stream::once(async move { first }).chain(rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn grpc_metadata_headers_become_metadata() {
        let mut h = HeaderMap::new();
        h.insert("grpc-metadata-hasleader", HeaderValue::from_static("true"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        let mut inc = Incoming {
            headers: h,
            cert: Some(ClientCert {
                common_name: Some("alice".into()),
            }),
        };
        let r = request_with_metadata(&inc, ());
        assert_eq!(r.metadata().get("hasleader").unwrap(), "true");
        assert!(r.metadata().get("content-type").is_none());
        // No Authorization header: the certificate's CN names the caller.
        assert_eq!(
            crate::server::api::client_cert::common_name(r.extensions()).as_deref(),
            Some("alice")
        );
        // A token wins over the certificate, as on the gRPC path.
        inc.headers
            .insert("authorization", HeaderValue::from_static("tok"));
        let r = request_with_metadata(&inc, ());
        assert_eq!(r.metadata().get("authorization").unwrap(), "tok");
        assert!(r.extensions().get::<ClientCert>().is_none());
    }
}
