//! The client port's dispatch. A gRPC call to one of etcd's services goes straight to its
//! tonic server, counted in `grpc_server_handled_total` and with etcd's status for an
//! oversized message ([`crate::server::api::oversize`]); anything else (the JSON gateway, `/metrics`,
//! unknown paths) goes to the axum router.
//!
//! The services are found by the first segment of the path, which is the gRPC service name:
//! an axum route per service would cost each call a path match, URL parameters, a clone of
//! the boxed route and three boxed bodies (docs/decisions/0033-client-dispatch.md).
//!
//! Invariants:
//! - Every path `/S/M` where `S` is one of the services' names reaches that service, whatever
//!   `M` (an unknown method gets the service's `Unimplemented`), as tonic's router does; any
//!   other path reaches the router.
//! - Each call to a service is counted once, when its response head is known.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::Either;
use tonic::server::NamedService;
use tonic::service::Routes;

use crate::metrics::GrpcHandled;
use crate::proto::etcdserverpb::auth_server::AuthServer;
use crate::proto::etcdserverpb::cluster_server::ClusterServer;
use crate::proto::etcdserverpb::kv_server::KvServer;
use crate::proto::etcdserverpb::lease_server::LeaseServer;
use crate::proto::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::proto::etcdserverpb::watch_server::WatchServer;
use crate::proto::v3electionpb::election_server::ElectionServer;
use crate::proto::v3lockpb::lock_server::LockServer;
use crate::server::api::auth::AuthService;
use crate::server::api::cluster::ClusterService;
use crate::server::api::election::ElectionService;
use crate::server::api::kv::KvService;
use crate::server::api::learner::LearnerGuard;
use crate::server::api::lease::LeaseService;
use crate::server::api::lock::LockService;
use crate::server::api::maintenance::MaintenanceService;
use crate::server::api::oversize::{SizeCheck, Watched};
use crate::server::api::watches::WatchService;
use crate::server::gateway::Services;

type Body = tonic::body::Body;
type Response = http::Response<Body>;

/// What a service's call returns: the same type for every service (tonic's servers box
/// their futures, and [`LearnerGuard`] answers a refusal at once).
type ServiceFuture =
    <LearnerGuard<KvServer<KvService>> as tower::Service<http::Request<Watched<Body>>>>::Future;

/// The services, by the name a gRPC path starts with.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Service {
    Kv,
    Watch,
    Lease,
    Cluster,
    Maintenance,
    Lock,
    Election,
    Auth,
}

impl Service {
    fn of(path: &str) -> Option<Service> {
        let (name, _method) = path.strip_prefix('/')?.split_once('/')?;
        Some(match name {
            KvServer::<KvService>::NAME => Service::Kv,
            WatchServer::<WatchService>::NAME => Service::Watch,
            LeaseServer::<LeaseService>::NAME => Service::Lease,
            ClusterServer::<ClusterService>::NAME => Service::Cluster,
            MaintenanceServer::<MaintenanceService>::NAME => Service::Maintenance,
            LockServer::<LockService>::NAME => Service::Lock,
            ElectionServer::<ElectionService>::NAME => Service::Election,
            AuthServer::<AuthService>::NAME => Service::Auth,
            _ => return None,
        })
    }
}

/// The client port's service: see the module docs.
#[derive(Clone)]
pub struct ClientDispatch {
    services: Services,
    rest: Routes,
}

impl ClientDispatch {
    pub fn new(services: Services, rest: Routes) -> Self {
        ClientDispatch {
            services,
            rest: rest.prepare(),
        }
    }

    fn call_service(&mut self, s: Service, req: http::Request<Watched<Body>>) -> ServiceFuture {
        use tower::Service as _;
        let v = &mut self.services;
        match s {
            Service::Kv => v.kv.call(req),
            Service::Watch => v.watch.call(req),
            Service::Lease => v.lease.call(req),
            Service::Cluster => v.cluster.call(req),
            Service::Maintenance => v.maintenance.call(req),
            Service::Lock => v.lock.call(req),
            Service::Election => v.election.call(req),
            Service::Auth => v.auth.call(req),
        }
    }
}

impl tower::Service<http::Request<Body>> for ClientDispatch {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<GrpcCall, <Routes as tower::Service<http::Request<Body>>>::Future>;

    /// Always ready: tonic's servers and axum's router are, so readiness is not tracked.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let Some(s) = Service::of(req.uri().path()) else {
            return Either::Right(self.rest.call(req));
        };
        let handled = GrpcHandled::start(req.uri().path(), req.headers());
        let check = SizeCheck::new(self.services.max_msg);
        let received = handled.stream_received();
        let inner = self.call_service(s, req.map(|b| check.watch_counting(b, received)));
        Either::Left(GrpcCall {
            inner,
            check,
            handled: Some(handled),
        })
    }
}

/// A call to one of the services, finished by counting it and rewriting an oversized
/// message's status.
pub struct GrpcCall {
    inner: ServiceFuture,
    check: SizeCheck,
    /// Taken when the response head is known.
    handled: Option<GrpcHandled>,
}

impl Future for GrpcCall {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Ok(mut res) = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        self.check.rewrite(res.headers_mut());
        let mut handled = self.handled.take();
        // A stream that answered with a trailers-only error is finished at its head too.
        let streams = res.headers().get("grpc-status").is_none()
            && handled.as_ref().is_some_and(|h| h.streams());
        if !streams {
            if let Some(h) = handled.take() {
                h.finish(&res);
            }
        }
        Poll::Ready(Ok(res.map(|b| {
            Body::new(Counted {
                inner: b,
                handled,
                messages: Messages::default(),
            })
        })))
    }
}

/// A response body that counts its bytes (`etcd_network_client_grpc_sent_bytes_total`) and,
/// for a streaming call, its messages, and finishes the call when the body ends: with the
/// trailers' `grpc-status`, or as `Canceled` when the body is dropped before its end (the
/// client went away).
struct Counted {
    inner: Body,
    handled: Option<GrpcHandled>,
    messages: Messages,
}

impl http_body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref() {
                    crate::metrics::CLIENT_GRPC_SENT_BYTES.inc_by(data.len() as u64);
                    if let Some(h) = &this.handled {
                        for _ in 0..this.messages.observe(data) {
                            h.sent_message();
                        }
                    }
                } else if let Some(t) = f.trailers_ref() {
                    if let Some(h) = this.handled.take() {
                        h.finish_status(t.get("grpc-status").map(|v| v.as_bytes()));
                    }
                }
            }
            Some(Err(_)) => {
                if let Some(h) = this.handled.take() {
                    h.finish_status(Some(b"2"));
                }
            }
            None => {
                if let Some(h) = this.handled.take() {
                    h.finish_status(None);
                }
            }
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

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(h) = self.handled.take() {
            h.finish_status(Some(b"1"));
        }
    }
}

/// Counts the gRPC messages in a body's data: each is a 5-byte prefix (compressed flag,
/// big-endian length) and its bytes, split across data frames anywhere.
#[derive(Default)]
struct Messages {
    /// Prefix bytes seen of the next message.
    prefix: [u8; 5],
    have: usize,
    /// Bytes of the current message still to come.
    rest: usize,
}

impl Messages {
    /// How many messages start in `data`.
    fn observe(&mut self, mut data: &[u8]) -> usize {
        let mut started = 0;
        while !data.is_empty() {
            if self.rest > 0 {
                let n = self.rest.min(data.len());
                self.rest -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                started += 1;
                self.have = 0;
                self.rest = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]) as usize;
            }
        }
        started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_counted_across_frames() {
        let mut m = Messages::default();
        // Two messages of 3 and 0 bytes in one frame, then one of 2 split inside its prefix.
        assert_eq!(m.observe(&[0, 0, 0, 0, 3, 1, 2, 3, 0, 0, 0, 0, 0]), 2);
        assert_eq!(m.observe(&[0, 0, 0]), 0);
        assert_eq!(m.observe(&[0, 2, 9]), 1);
        assert_eq!(m.observe(&[9, 0, 0, 0, 0, 1]), 1);
        assert_eq!(m.observe(&[7]), 0);
    }
}

#[cfg(test)]
mod dispatch_tests {
    use super::*;

    #[test]
    fn services_are_found_by_the_first_path_segment() {
        let found = [
            ("/etcdserverpb.KV/Range", Service::Kv),
            ("/etcdserverpb.KV/NoSuchMethod", Service::Kv),
            ("/v3lockpb.Lock/Lock", Service::Lock),
            ("/v3electionpb.Election/Campaign", Service::Election),
            ("/etcdserverpb.Maintenance/Status", Service::Maintenance),
        ];
        for (path, s) in found {
            assert_eq!(Service::of(path), Some(s), "{path}");
        }
        for other in [
            "/v3/kv/range",
            "/metrics",
            "/health",
            "/etcdserverpb.KV",
            "/etcdserverpb.Nope/Range",
            "etcdserverpb.KV/Range",
            "/",
            "",
        ] {
            assert_eq!(Service::of(other), None, "{other}");
        }
    }
}
