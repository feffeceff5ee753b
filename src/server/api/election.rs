//! etcd's Election service (v3election): clientv3 concurrency's `Election`, run by the member
//! for the client.
//!
//! A candidate's key is `name/<lease in hex>` with its proposed value, on its lease. The
//! candidate whose key under `name/` was created first leads; Campaign returns once every
//! older key is gone. A leadership is named by its `LeaderKey` (key and create revision):
//! Proclaim and Resign act only while that very key exists (a key deleted and created again
//! is another leadership).
//!
//! As etcd (checked against 3.4.23 and its source):
//! - lease 0 in Campaign or Proclaim grants a 60 s lease that nobody keeps alive (etcd's
//!   session is orphaned); kvd does not grant one for Resign, where etcd's grant is unused;
//! - every error is `Unknown` with etcd's text ([`RecipeError`]);
//! - a campaigner whose client goes away while it waits resigns (its key is deleted); one
//!   whose wait fails otherwise leaves its key, as etcd does;
//! - Observe sends the current leader (waiting for one if there is none), then every new value
//!   of the leader's key, and after the key is deleted the next leader; it ends quietly (no
//!   error) if its reads fail, e.g. on history compacted under it.

use std::collections::VecDeque;
use std::pin::Pin;

use futures::Stream;
use tonic::{Request, Response, Status};

use crate::proto::etcdserverpb::response_op::Response as OpResponse;
use crate::proto::etcdserverpb::{RangeRequest, TxnRequest, TxnResponse};
use crate::proto::mvccpb::event::EventType;
use crate::proto::mvccpb::KeyValue;
use crate::proto::v3electionpb::election_server::Election;
use crate::proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use crate::server::api::local_client::{
    by_create, create_revision_is, delete_op, get_op, prefix_end, put_op, session_key,
    CleanupOnDrop, LocalClient, RecipeError, SESSION_TTL,
};

pub struct ElectionService {
    client: LocalClient,
}

fn election_prefix(name: &[u8]) -> Vec<u8> {
    let mut p = name.to_vec();
    p.push(b'/');
    p
}

/// The keys a txn's `i`-th operation (a range) read.
fn range_kvs(resp: &TxnResponse, i: usize) -> Vec<KeyValue> {
    match resp.responses.get(i).and_then(|r| r.response.as_ref()) {
        Some(OpResponse::ResponseRange(r)) => r.kvs.clone(),
        _ => Vec::new(),
    }
}

/// Deletes the leader key if it is still the leadership created at `rev`.
fn resign_txn(key: &[u8], rev: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![create_revision_is(key, rev)],
        success: vec![delete_op(key)],
        failure: vec![],
    }
}

impl ElectionService {
    pub fn new(client: LocalClient) -> Self {
        ElectionService { client }
    }

    /// The lease a session on `lease` uses: a fresh 60 s one for 0.
    async fn session_lease(&self, lease: i64) -> Result<i64, RecipeError> {
        Ok(match lease {
            0 => self.client.grant(SESSION_TTL).await?,
            l => l,
        })
    }

    async fn proclaim_txn(
        &self,
        key: &[u8],
        rev: i64,
        lease: i64,
        value: &[u8],
    ) -> Result<TxnResponse, RecipeError> {
        let resp = self
            .client
            .txn(TxnRequest {
                compare: vec![create_revision_is(key, rev)],
                success: vec![put_op(key, value, lease)],
                failure: vec![],
            })
            .await?;
        if !resp.succeeded {
            return Err(RecipeError::NotLeader);
        }
        Ok(resp)
    }

    async fn campaign(&self, r: CampaignRequest) -> Result<CampaignResponse, RecipeError> {
        let c = &self.client;
        let lease = self.session_lease(r.lease).await?;
        let prefix = election_prefix(&r.name);
        let key = session_key(&prefix, lease);
        let mine = get_op(RangeRequest {
            key: key.clone(),
            ..Default::default()
        });
        let resp = c
            .txn(TxnRequest {
                compare: vec![create_revision_is(&key, 0)],
                success: vec![put_op(&key, &r.value, lease)],
                failure: vec![mine],
            })
            .await?;
        let mut rev = resp.header.map_or(0, |h| h.revision);
        if !resp.succeeded {
            // This session campaigns already: keep its place, with the new value.
            if let Some(kv) = range_kvs(&resp, 0).into_iter().next() {
                rev = kv.create_revision;
                if kv.value != r.value {
                    if let Err(e) = self.proclaim_txn(&key, rev, lease, &r.value).await {
                        let _ = c.txn(resign_txn(&key, rev)).await;
                        return Err(e);
                    }
                }
            }
        }
        // A client that goes away while waiting resigns; any other failed wait keeps the key.
        let cleanup = CleanupOnDrop::new(c, resign_txn(&key, rev));
        let waited = c.wait_deletes(&prefix, rev - 1).await;
        cleanup.disarm();
        waited?;
        Ok(CampaignResponse {
            header: resp.header,
            leader: Some(LeaderKey {
                name: r.name,
                key,
                rev,
                lease,
            }),
        })
    }

    async fn leader(&self, name: &[u8]) -> Result<LeaderResponse, RecipeError> {
        let resp = self
            .client
            .range(by_create(&election_prefix(name), true, 0))
            .await?;
        let kv = resp.kvs.into_iter().next().ok_or(RecipeError::NoLeader)?;
        Ok(LeaderResponse {
            header: resp.header,
            kv: Some(kv),
        })
    }
}

/// Where an observer is: looking for the leader, or following the leader key's changes.
enum Phase {
    Find,
    Follow { key: Vec<u8>, from: i64 },
    Done,
}

/// One Observe stream's state (concurrency's `observe` loop).
struct Observer {
    client: LocalClient,
    prefix: Vec<u8>,
    phase: Phase,
    ready: VecDeque<LeaderResponse>,
}

impl Observer {
    fn response(&self, revision: i64, kv: KeyValue) -> LeaderResponse {
        LeaderResponse {
            header: self.client.ctx.header(revision),
            kv: Some(kv),
        }
    }

    /// The next leader response; `None` ends the stream.
    async fn next(&mut self) -> Option<LeaderResponse> {
        loop {
            if let Some(r) = self.ready.pop_front() {
                return Some(r);
            }
            match self.step().await {
                Ok(()) => {}
                Err(e) => {
                    tracing::debug!("election observe ends: {e}");
                    self.phase = Phase::Done;
                }
            }
            if matches!(self.phase, Phase::Done) && self.ready.is_empty() {
                return None;
            }
        }
    }

    /// Advances by one read or wait, queueing what it finds.
    async fn step(&mut self) -> Result<(), RecipeError> {
        let c = self.client.clone();
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Done => {}
            Phase::Find => {
                let resp = c.range(by_create(&self.prefix, true, 0)).await?;
                let (rev, kv) = match resp.kvs.into_iter().next() {
                    Some(kv) => (resp.header.map_or(0, |h| h.revision), kv),
                    None => {
                        // Nobody campaigns: the first key put under the prefix leads.
                        let mut from = resp.header.map_or(0, |h| h.revision);
                        let end = prefix_end(&self.prefix);
                        let kv = loop {
                            let events = c.next_events(&self.prefix, &end, &mut from).await?;
                            let put = events
                                .into_iter()
                                .find(|e| e.r#type == EventType::Put as i32)
                                .and_then(|e| e.kv);
                            if let Some(kv) = put {
                                break kv;
                            }
                        };
                        (kv.mod_revision, kv)
                    }
                };
                self.phase = Phase::Follow {
                    key: kv.key.clone(),
                    from: rev + 1,
                };
                let r = self.response(rev, kv);
                self.ready.push_back(r);
            }
            Phase::Follow { key, mut from } => {
                let events = c.next_events(&key, b"", &mut from).await?;
                self.phase = Phase::Follow {
                    key: key.clone(),
                    from,
                };
                for e in events {
                    let Some(kv) = e.kv else { continue };
                    if e.r#type == EventType::Delete as i32 {
                        // The leader is gone: look for the next one.
                        self.phase = Phase::Find;
                        break;
                    }
                    let r = self.response(kv.mod_revision, kv);
                    self.ready.push_back(r);
                }
            }
        }
        Ok(())
    }
}

type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let svc = ElectionService::new(self.client.for_request(&req).await?);
        Ok(Response::new(svc.campaign(req.into_inner()).await?))
    }

    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let svc = ElectionService::new(self.client.for_request(&req).await?);
        let r = req.into_inner();
        let leader = r.leader.ok_or(RecipeError::MissingLeaderKey)?;
        let lease = svc.session_lease(leader.lease).await?;
        let resp = svc
            .proclaim_txn(&leader.key, leader.rev, lease, &r.value)
            .await?;
        Ok(Response::new(ProclaimResponse {
            header: resp.header,
        }))
    }

    async fn leader(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let svc = ElectionService::new(self.client.for_request(&req).await?);
        Ok(Response::new(svc.leader(&req.into_inner().name).await?))
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let observer = Observer {
            client: self.client.for_request(&req).await?,
            prefix: election_prefix(&req.into_inner().name),
            phase: Phase::Find,
            ready: VecDeque::new(),
        };
        // Polled by the response stream: a client that goes away drops the observer, and with
        // it any wait in progress.
        let stream = futures::stream::unfold(observer, |mut o| async move {
            o.next().await.map(|r| (Ok(r), o))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn resign(
        &self,
        req: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let c = self.client.for_request(&req).await?;
        let leader = req
            .into_inner()
            .leader
            .ok_or(RecipeError::MissingLeaderKey)?;
        let resp = c
            .txn(resign_txn(&leader.key, leader.rev))
            .await
            .map_err(RecipeError::from)?;
        Ok(Response::new(ResignResponse {
            header: resp.header,
        }))
    }
}
