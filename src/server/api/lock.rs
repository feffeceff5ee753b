//! etcd's Lock service (v3lock): clientv3 concurrency's `Mutex`, run by the member for the
//! client, on the request's lease.
//!
//! Lock(name, lease): the waiter's key is `name/<lease in hex>`, put with the lease if it
//! does not exist yet (a session that already holds or waits reuses its key). The waiter
//! whose key under `name/` has the smallest create revision holds the lock; the others wait
//! until every key under `name/` created before theirs is deleted (unlocked, or its lease
//! expired or revoked). Unlock(key) deletes the key.
//!
//! As etcd (checked against 3.4.23 and its source):
//! - lease 0 grants a 60 s lease that nobody keeps alive (etcd's session is orphaned), so such
//!   a lock ends after a minute unless unlocked;
//! - a lease that does not exist fails the put: `Unknown` "etcdserver: requested lease not
//!   found" (every error of this service is `Unknown`, see [`RecipeError`]);
//! - a waiter that fails or whose client goes away while it waits has its key deleted (the
//!   Mutex unlocks when its wait fails), so it never takes the lock for nobody;
//! - as etcd 3.5's Mutex, once the wait ends the key is read again: if it is gone (the lease
//!   ran out while waiting) the call fails with "mutex: session is expired" instead of
//!   answering a lock nobody holds (3.4 answered success). The header is that read's.

use tonic::{Request, Response, Status};

use crate::proto::etcdserverpb::{RangeRequest, TxnRequest};
use crate::proto::v3lockpb::lock_server::Lock;
use crate::proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use crate::server::api::local_client::{
    by_create, create_revision_is, delete_op, get_op, put_op, session_key, CleanupOnDrop,
    LocalClient, RecipeError, SESSION_TTL,
};

pub struct LockService {
    client: LocalClient,
}

impl LockService {
    pub fn new(client: LocalClient) -> Self {
        LockService { client }
    }

    async fn lock(c: &LocalClient, r: LockRequest) -> Result<LockResponse, RecipeError> {
        let lease = match r.lease {
            0 => c.grant(SESSION_TTL).await?,
            l => l,
        };
        let mut prefix = r.name;
        prefix.push(b'/');
        let key = session_key(&prefix, lease);
        let owner = get_op(by_create(&prefix, true, 0));
        let mine = get_op(RangeRequest {
            key: key.clone(),
            ..Default::default()
        });
        let resp = c
            .txn(TxnRequest {
                compare: vec![create_revision_is(&key, 0)],
                success: vec![put_op(&key, b"", lease), owner.clone()],
                failure: vec![mine, owner],
            })
            .await?;
        let header_rev = resp.header.map_or(0, |h| h.revision);
        let range_kvs = |i: usize| match resp.responses.get(i).and_then(|r| r.response.as_ref()) {
            Some(crate::proto::etcdserverpb::response_op::Response::ResponseRange(r)) => {
                r.kvs.clone()
            }
            _ => Vec::new(),
        };
        let my_rev = if resp.succeeded {
            header_rev
        } else {
            range_kvs(0)
                .first()
                .map_or(header_rev, |kv| kv.create_revision)
        };
        let holder = range_kvs(1);
        if holder.first().is_none_or(|kv| kv.create_revision == my_rev) {
            return Ok(LockResponse {
                header: resp.header,
                key,
            });
        }

        // From here on, a failed or abandoned wait deletes the key, as the Mutex does.
        let cleanup = CleanupOnDrop::new(
            c,
            TxnRequest {
                success: vec![delete_op(&key)],
                ..Default::default()
            },
        );
        c.wait_deletes(&prefix, my_rev - 1).await?;
        let now = c
            .range(RangeRequest {
                key: key.clone(),
                ..Default::default()
            })
            .await?;
        // The wait is over (a failed read above still deletes the key, as the Mutex does): the
        // key is held, or already gone.
        cleanup.disarm();
        if now.kvs.is_empty() {
            return Err(RecipeError::SessionExpired);
        }
        Ok(LockResponse {
            header: now.header,
            key,
        })
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let c = self.client.for_request(&req).await?;
        Ok(Response::new(Self::lock(&c, req.into_inner()).await?))
    }

    async fn unlock(
        &self,
        req: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let c = self.client.for_request(&req).await?;
        let d = c
            .delete(&req.into_inner().key)
            .await
            .map_err(RecipeError::from)?;
        Ok(Response::new(UnlockResponse { header: d.header }))
    }
}
