//! The member as a client of itself: the few KV and lease operations that etcd's server-side
//! recipes (the Lock and Election services) make through etcd's Go client, done in process on
//! [`ServerCtx`], plus waiting for history events without polling.
//!
//! etcd builds v3lock and v3election on clientv3's `concurrency` package, talking to its own
//! member over gRPC. kvd runs the same steps here instead: every write is validated exactly
//! as the KV service validates it before it is proposed, and every read is linearizable (a
//! read-index round, then the local store), as clientv3's default `Get` is.
//!
//! Invariants:
//! - Nothing is proposed that the KV or Lease service would refuse: the backend quota (which
//!   raises NOSPACE, as etcd's quota layer does for its own client's calls) and
//!   `mvcc::check_*` come first.
//! - Waiting for events never polls: waiters follow a watch hub of their own (one for the
//!   member's recipes, see [`crate::server::api::watch_hub`], running only while someone waits), which
//!   reads each applied batch's events from the store once; a waiter costs nothing while
//!   nothing is written and, per write, a filter over that write's events. Only a waiter
//!   behind the hub reads the store, from its cursor.
//! - Every future here is cancel-safe: dropping it (a client that went away) stops the wait
//!   and leaves nothing behind; the recipes decide what to clean up ([`CleanupOnDrop`]).

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::broadcast;
use tonic::Status;

use crate::auth::AuthInfo;
use crate::mvcc::{self, MvccError};
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::{
    compare, request_op, Compare, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest,
    PutRequest, RangeRequest, RangeResponse, RequestOp, ResponseHeader, TxnRequest, TxnResponse,
};
use crate::proto::mvccpb::event::EventType;
use crate::proto::mvccpb::Event;
use crate::server::api::request_path::{self, Caller};
use crate::server::api::watch_hub::Hub;
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;
use crate::sync::LockExt;

/// The TTL of the lease a session grants when the request names none (clientv3
/// concurrency's `defaultSessionTTL`).
pub const SESSION_TTL: i64 = 60;

/// How a Lock or Election call fails. etcd's recipe services return their client's errors and
/// the recipes' own as plain Go errors, which gRPC answers with code `Unknown` and the error's
/// text (checked against etcd 3.4.23: a missing lease is `Unknown` "etcdserver: requested
/// lease not found", not `NotFound`). So every variant, a wrapped [`ApiError`] too, becomes an
/// `Unknown` status with its etcd message.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RecipeError {
    /// A KV or lease operation of the recipe failed.
    #[error(transparent)]
    Client(#[from] ApiError),
    /// concurrency's `ErrElectionNotLeader`: the leader key presented is not the current one.
    #[error("election: not leader")]
    NotLeader,
    /// concurrency's `ErrElectionNoLeader`: nobody campaigns in the election.
    #[error("election: no leader")]
    NoLeader,
    /// v3election's `ErrMissingLeaderKey`: Proclaim or Resign without a leader key.
    #[error("\"leader\" field must be provided")]
    MissingLeaderKey,
    /// concurrency's `ErrSessionExpired` (etcd 3.5's Mutex): the waiter's own key was deleted
    /// (its lease expired or was revoked) before the lock came to it.
    #[error("mutex: session is expired")]
    SessionExpired,
}

impl From<MvccError> for RecipeError {
    fn from(e: MvccError) -> Self {
        RecipeError::Client(ApiError::Mvcc(e))
    }
}

impl From<RecipeError> for Status {
    fn from(e: RecipeError) -> Status {
        Status::unknown(e.to_string())
    }
}

/// The end of the range of every key that starts with `prefix` (clientv3's
/// `GetPrefixRangeEnd`): the prefix with its last byte below 0xff incremented and the rest
/// cut; `\0` (every key) when there is no such byte.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A session's key under `prefix`: the prefix followed by the lease id in lower-case hex, as
/// Go's `%x` prints an int64 (a sign, then the magnitude).
pub fn session_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    let mut k = prefix.to_vec();
    k.extend_from_slice(hex.as_bytes());
    k
}

/// `key`'s create revision compared with `rev`.
pub fn create_revision_is(key: &[u8], rev: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Create as i32,
        key: key.to_vec(),
        target_union: Some(compare::TargetUnion::CreateRevision(rev)),
        ..Default::default()
    }
}

pub fn put_op(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
            ..Default::default()
        })),
    }
}

pub fn get_op(r: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(r)),
    }
}

pub fn delete_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            },
        )),
    }
}

/// The key under `prefix` created first (`first`) or last, at most `max_create_rev` if not 0
/// (clientv3's `WithFirstCreate` / `WithLastCreate` with `WithMaxCreateRev`).
pub fn by_create(prefix: &[u8], first: bool, max_create_rev: i64) -> RangeRequest {
    let order = if first {
        SortOrder::Ascend
    } else {
        SortOrder::Descend
    };
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: order as i32,
        sort_target: SortTarget::Create as i32,
        max_create_revision: max_create_rev,
        ..Default::default()
    }
}

/// The in-process client of one member, shared by the Lock and Election services. Each call
/// runs as its caller ([`LocalClient::for_request`]), as etcd's recipe servers forward the
/// caller's context (and with it the token) to their client.
#[derive(Clone)]
pub struct LocalClient {
    pub ctx: ServerCtx,
    /// Who the recipe acts for: checked on every read here and carried by every write to the
    /// apply's checks. `None` (anonymous) is refused with auth enabled, as etcd refuses it.
    caller: Option<AuthInfo>,
    /// The recipes' own watch hub, which reads each applied batch's events once for all
    /// waiters. It runs only while someone waits (a hub reads every write, so one kept for
    /// nobody would cost every write a store read): started by the first waiter, it stops
    /// once the last one has let go of it.
    hub: Arc<Mutex<Weak<Hub>>>,
}

impl LocalClient {
    pub fn new(ctx: ServerCtx) -> Self {
        LocalClient {
            ctx,
            caller: None,
            hub: Arc::new(Mutex::new(Weak::new())),
        }
    }

    /// The running hub, or a new one.
    fn hub(&self) -> Arc<Hub> {
        let mut h = self.hub.lock_or_recover();
        if let Some(hub) = h.upgrade() {
            return hub;
        }
        let hub = Hub::start(&self.ctx);
        *h = Arc::downgrade(&hub);
        hub
    }

    /// etcd's require-leader mode (`hasleader=true` metadata), checked as etcd's interceptor
    /// checks it for every service: before the call, with the KV service's status (not a
    /// recipe error).
    pub fn require_leader(&self, md: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        Ok(self.ctx.check_leader(md)?)
    }

    /// This client acting for the caller of `req`, after etcd's require-leader check (with the
    /// KV service's status, as etcd's interceptor answers it). A bad token fails as the
    /// recipe's client would fail: an `Unknown` recipe error with etcd's text.
    pub async fn for_request<T>(&self, req: &tonic::Request<T>) -> Result<LocalClient, Status> {
        self.require_leader(req.metadata())?;
        let caller = self
            .ctx
            .auth_info(req.metadata(), req.extensions())
            .await
            .map_err(RecipeError::from)?;
        Ok(LocalClient {
            caller,
            ..self.clone()
        })
    }

    /// etcd's read check of `[key, range_end)` for the caller (a no-op with auth disabled).
    fn check_read(&self, key: &[u8], range_end: &[u8]) -> Result<(), ApiError> {
        let auth = self.ctx.node.auth();
        Ok(auth.check_op(self.caller.as_ref(), key, range_end, false)?)
    }

    fn as_caller(&self) -> Caller<'_> {
        Caller::Resolved(self.caller.as_ref())
    }

    /// A transaction, exactly as the KV service runs it.
    pub async fn txn(&self, r: TxnRequest) -> Result<TxnResponse, ApiError> {
        request_path::txn(&self.ctx, self.as_caller(), r).await
    }

    /// A range read, exactly as the KV service runs it (linearizable unless asked otherwise).
    pub async fn range(&self, r: RangeRequest) -> Result<RangeResponse, ApiError> {
        request_path::range(&self.ctx, self.as_caller(), r).await
    }

    /// Deletes one key.
    pub async fn delete(&self, key: &[u8]) -> Result<DeleteRangeResponse, ApiError> {
        let r = DeleteRangeRequest {
            key: key.to_vec(),
            ..Default::default()
        };
        request_path::delete_range(&self.ctx, self.as_caller(), r).await
    }

    /// Grants a lease of `ttl` seconds under an id this member picks, exactly as the Lease
    /// service grants one, and answers the id.
    pub async fn grant(&self, ttl: i64) -> Result<i64, ApiError> {
        let r = LeaseGrantRequest { ttl, id: 0 };
        let g = request_path::lease_grant(&self.ctx, self.as_caller(), r).await?;
        Ok(g.id)
    }

    /// The events on `key` (`range_end` as in etcd) at revisions from `*from`, waiting until
    /// there is at least one; `*from` moves past what was read. Reads this member's applied
    /// history, as a watch on this member would: revisions before the hub's frontier from the
    /// store, the rest from the hub's batches (so a write costs a waiter a filter over that
    /// write's events, not a store read).
    pub async fn next_events(
        &self,
        key: &[u8],
        range_end: &[u8],
        from: &mut i64,
    ) -> Result<Vec<Event>, ApiError> {
        // As a watch: read permission on the range, checked when the wait starts.
        self.check_read(key, range_end)?;
        let sm = &self.ctx.node;
        let rev = |e: &Event| e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
        let wanted = |e: &Event| {
            e.kv.as_ref()
                .is_some_and(|kv| mvcc::range_contains(key, range_end, &kv.key))
        };
        let hub = self.hub();
        loop {
            let Some((frontier, mut rx)) = hub.subscribe() else {
                return Err(ApiError::Stopped);
            };
            if *from < frontier {
                let read = sm.events_since(*from, key, range_end, false, 0).await?;
                let events: Vec<Event> = read
                    .events
                    .into_iter()
                    .filter(|e| rev(e) < frontier)
                    .collect();
                *from = frontier;
                if !events.is_empty() {
                    return Ok(events);
                }
            }
            loop {
                let batch = match rx.recv().await {
                    Ok(b) => b,
                    // Fell behind the hub's buffer: catch up from the store.
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => return Err(ApiError::Stopped),
                };
                if batch.to <= *from {
                    continue;
                }
                if batch.lost {
                    // Compacted before the hub read it: the store says so.
                    sm.events_since(*from, key, range_end, false, 1).await?;
                }
                let events: Vec<Event> = batch
                    .events
                    .iter()
                    .filter(|e| rev(e) >= *from && wanted(e))
                    .cloned()
                    .collect();
                *from = batch.to;
                if !events.is_empty() {
                    return Ok(events);
                }
            }
        }
    }

    /// clientv3 concurrency's `waitDelete`: until `key` is deleted at a revision `>= rev`.
    pub async fn wait_delete(&self, key: &[u8], rev: i64) -> Result<(), ApiError> {
        let mut from = rev;
        loop {
            let events = self.next_events(key, b"", &mut from).await?;
            if events.iter().any(|e| e.r#type == EventType::Delete as i32) {
                return Ok(());
            }
        }
    }

    /// clientv3 concurrency's `waitDeletes`: until no key under `prefix` has a create revision
    /// `<= max_create_rev`, waiting on the newest such key each time. Answers the header of
    /// the (linearizable) read that found none.
    pub async fn wait_deletes(
        &self,
        prefix: &[u8],
        max_create_rev: i64,
    ) -> Result<Option<ResponseHeader>, ApiError> {
        loop {
            let resp = self.range(by_create(prefix, false, max_create_rev)).await?;
            let Some(kv) = resp.kvs.first() else {
                return Ok(resp.header);
            };
            let rev = resp.header.map_or(0, |h| h.revision);
            self.wait_delete(&kv.key, rev).await?;
        }
    }
}

/// What a recipe undoes when its call ends early: a dropped handler future (the client went
/// away) or an error return. Armed while the recipe waits; [`CleanupOnDrop::disarm`] once the
/// call succeeds. The undo runs as its own task, since a drop cannot wait.
pub struct CleanupOnDrop {
    client: LocalClient,
    undo: Option<TxnRequest>,
}

/// How long an undo may take before it is abandoned (the key's lease remains as a backstop).
const UNDO_TIMEOUT: Duration = Duration::from_secs(10);

impl CleanupOnDrop {
    pub fn new(client: &LocalClient, undo: TxnRequest) -> Self {
        CleanupOnDrop {
            client: client.clone(),
            undo: Some(undo),
        }
    }

    pub fn disarm(mut self) {
        self.undo = None;
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        let client = self.client.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            match tokio::time::timeout(UNDO_TIMEOUT, client.txn(undo)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::debug!("recipe cleanup: {e}"),
                Err(_) => tracing::debug!("recipe cleanup timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    #[test]
    fn session_keys_print_the_lease_as_go_does() {
        assert_eq!(
            session_key(b"m/", 0x694d805a644b4b1d),
            b"m/694d805a644b4b1d"
        );
        assert_eq!(session_key(b"m/", -1), b"m/-1");
    }

    #[test]
    fn recipe_errors_are_unknown_with_etcd_text() {
        let s = Status::from(RecipeError::Client(ApiError::Mvcc(
            MvccError::LeaseNotFound,
        )));
        assert_eq!(s.code(), tonic::Code::Unknown);
        assert_eq!(s.message(), "etcdserver: requested lease not found");
        let s = Status::from(RecipeError::NotLeader);
        assert_eq!(
            (s.code(), s.message()),
            (tonic::Code::Unknown, "election: not leader")
        );
    }
}
