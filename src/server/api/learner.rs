//! What a learner serves: etcd 3.4 answers every client call on a learner with "etcdserver:
//! rpc not supported for learner" except `Maintenance.Status` and serializable
//! `KV.Range` (etcd's `isRPCSupportedForLearner`; every stream call is refused). A learner's
//! state may be far behind and it takes no part in quorum, so serving more would mislead.
//!
//! [`LearnerGuard`] wraps each gRPC service, so the gRPC port and the JSON gateway (an
//! in-process client of the same services) refuse alike. Range's serializable flag is in the
//! message, so the KV service checks that one itself ([`refuse_linearizable_range`]).

use std::convert::Infallible;
use std::task::{Context, Poll};

use futures::future::{ready, Either, Ready};
use tonic::server::NamedService;

use crate::raft::RaftNode;
use crate::server::error::ApiError;

/// Calls a learner answers (the rest of the decision for Range is in its handler).
const SERVED_BY_LEARNER: [&str; 2] = ["/etcdserverpb.Maintenance/Status", "/etcdserverpb.KV/Range"];

/// A tonic service that refuses calls a learner must not serve while this member is one.
#[derive(Clone)]
pub struct LearnerGuard<S> {
    inner: S,
    node: RaftNode,
}

impl<S> LearnerGuard<S> {
    pub fn new(inner: S, node: RaftNode) -> Self {
        LearnerGuard { inner, node }
    }
}

impl<S: NamedService> NamedService for LearnerGuard<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<B>> for LearnerGuard<S>
where
    S: tower::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Send,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Either<Ready<Result<Self::Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if !SERVED_BY_LEARNER.contains(&req.uri().path()) && self.node.is_learner() {
            let refused = tonic::Status::from(ApiError::NotSupportedForLearner).into_http();
            return Either::Left(ready(Ok(refused)));
        }
        Either::Right(self.inner.call(req))
    }
}

/// Range on a learner: serializable only.
pub fn refuse_linearizable_range(node: &RaftNode, serializable: bool) -> Result<(), ApiError> {
    if !serializable && node.is_learner() {
        return Err(ApiError::NotSupportedForLearner);
    }
    Ok(())
}
