//! The forwarder against a fake leader on a real socket: batching, each request's own answer,
//! the fallback for a leader without `ForwardMany`, a batch cut short and a bad leader URL.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::proto::etcdserverpb::{
    HashKvRequest, HashKvResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use crate::proto::kvdpb::peer_server::{Peer, PeerServer};
use crate::proto::kvdpb::ErrorCode;
use crate::proto::kvdpb::{
    ForwardOutcome, InternalResponse, MemberInfoRequest, MemberInfoResponse, MembershipRequest,
    MembershipResponse, ProbeRequest, ProbeResponse, RaftBlob, ReadIndexRequest, ReadIndexResponse,
    RemovedRequest, RemovedResponse, SnapshotChunk,
};
use crate::raft::net::peer_error::kind_of;

/// A leader that answers each request with its `auth_revision` as the log index, so a caller
/// can tell its own answer from another's.
#[derive(Default)]
struct FakeLeader {
    /// `ForwardMany` answers UNIMPLEMENTED, as a kvd from before it does.
    no_many: AtomicBool,
    /// A `ForwardMany` stream ends after this many outcomes.
    cut_after: Option<usize>,
    /// Calls wait while this is false.
    gate: Option<tokio::sync::watch::Receiver<bool>>,
    forwards: AtomicUsize,
    many_calls: AtomicUsize,
    many_requests: AtomicUsize,
}

impl FakeLeader {
    async fn wait_gate(&self) {
        if let Some(g) = &self.gate {
            let mut g = g.clone();
            let _ = g.wait_for(|open| *open).await;
        }
    }
}

fn applied(req: &InternalRequest) -> ForwardResponse {
    ForwardResponse {
        response: Some(InternalResponse::default()),
        log_index: req.auth_revision,
    }
}

type Blobs = Pin<Box<dyn Stream<Item = Result<RaftBlob, Status>> + Send>>;
type Outcomes = Pin<Box<dyn Stream<Item = Result<ForwardOutcome, Status>> + Send>>;

fn none<T>() -> Result<T, Status> {
    Err(Status::unimplemented("not in the fake"))
}

#[tonic::async_trait]
impl Peer for Arc<FakeLeader> {
    async fn forward(
        &self,
        req: Request<ForwardRequest>,
    ) -> Result<Response<ForwardResponse>, Status> {
        self.forwards.fetch_add(1, SeqCst);
        self.wait_gate().await;
        Ok(Response::new(applied(&req.into_inner().request.unwrap())))
    }

    type ForwardManyStream = Outcomes;

    async fn forward_many(
        &self,
        req: Request<ForwardManyRequest>,
    ) -> Result<Response<Outcomes>, Status> {
        self.many_calls.fetch_add(1, SeqCst);
        if self.no_many.load(SeqCst) {
            return Err(Status::unimplemented("unknown method ForwardMany"));
        }
        let reqs = req.into_inner().requests;
        self.many_requests.fetch_add(reqs.len(), SeqCst);
        self.wait_gate().await;
        let n = self.cut_after.unwrap_or(reqs.len());
        let outcomes: Vec<_> = reqs
            .iter()
            .take(n)
            .map(|r| {
                Ok(ForwardOutcome {
                    applied: Some(applied(r)),
                    ..Default::default()
                })
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(outcomes))))
    }

    async fn append(&self, _: Request<RaftBlob>) -> Result<Response<RaftBlob>, Status> {
        none()
    }
    type StreamAppendStream = Blobs;
    async fn stream_append(
        &self,
        _: Request<Streaming<RaftBlob>>,
    ) -> Result<Response<Blobs>, Status> {
        none()
    }
    async fn vote(&self, _: Request<RaftBlob>) -> Result<Response<RaftBlob>, Status> {
        none()
    }
    async fn pre_vote(&self, _: Request<RaftBlob>) -> Result<Response<RaftBlob>, Status> {
        none()
    }
    async fn transfer_leader(&self, _: Request<RaftBlob>) -> Result<Response<RaftBlob>, Status> {
        none()
    }
    async fn install_snapshot(
        &self,
        _: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftBlob>, Status> {
        none()
    }
    async fn read_index(
        &self,
        _: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        none()
    }
    async fn member_info(
        &self,
        _: Request<MemberInfoRequest>,
    ) -> Result<Response<MemberInfoResponse>, Status> {
        none()
    }
    async fn membership(
        &self,
        _: Request<MembershipRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        none()
    }
    async fn removed(
        &self,
        _: Request<RemovedRequest>,
    ) -> Result<Response<RemovedResponse>, Status> {
        none()
    }
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        none()
    }
    async fn lease_keep_alive(
        &self,
        _: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        none()
    }
    async fn lease_time_to_live(
        &self,
        _: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        none()
    }
    async fn hash_kv(&self, _: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        none()
    }
}

/// Serves `fake` on a loopback port; returns the member to forward to.
async fn serve(fake: Arc<FakeLeader>) -> Member {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PeerServer::new(fake))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l)),
    );
    Member {
        peer_urls: vec![url],
    }
}

fn request(id: u64) -> InternalRequest {
    InternalRequest {
        auth_revision: id,
        ..Default::default()
    }
}

const SLOTS: u64 = MAX_CALLS as u64;

type Pending = tokio::task::JoinHandle<Result<ForwardResponse, ForwardError>>;

fn start(fwd: &Forwarder, leader: &Member, ids: std::ops::RangeInclusive<u64>) -> Vec<Pending> {
    ids.map(|id| {
        let (fwd, leader) = (fwd.clone(), leader.clone());
        tokio::spawn(async move { fwd.forward(&leader, request(id)).await })
    })
    .collect()
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

fn queued_len(fwd: &Forwarder, leader: &Member) -> usize {
    let lanes = fwd.lanes.lock().unwrap();
    lanes.get(&leader.peer_urls[0]).map_or(0, |l| l.queue.len())
}

/// Fills the lane's call slots with requests `first..` (held at the gate, one call each), then
/// queues `queued` more behind them. Returns the requests' tasks in id order.
async fn fill(
    fwd: &Forwarder,
    leader: &Member,
    fake: &FakeLeader,
    first: u64,
    queued: usize,
) -> Vec<Pending> {
    let mut pending = Vec::new();
    // One at a time, or a request could join the previous one's call.
    for id in first..first + SLOTS {
        let before = fake.forwards.load(SeqCst);
        pending.extend(start(fwd, leader, id..=id));
        until("the slot is calling", || {
            fake.forwards.load(SeqCst) == before + 1
        })
        .await;
    }
    let next = first + SLOTS;
    pending.extend(start(fwd, leader, next..=next + queued as u64 - 1));
    until("the rest are queued", || queued_len(fwd, leader) == queued).await;
    pending
}

fn gated() -> (tokio::sync::watch::Sender<bool>, FakeLeader) {
    let (open, gate) = tokio::sync::watch::channel(false);
    let fake = FakeLeader {
        gate: Some(gate),
        ..Default::default()
    };
    (open, fake)
}

#[tokio::test]
async fn requests_queued_behind_busy_calls_go_as_one_batch_each_answered_its_own() {
    let (open, fake) = gated();
    let fake = Arc::new(fake);
    let leader = serve(fake.clone()).await;
    let fwd = Forwarder::new(Channels::default());
    let pending = fill(&fwd, &leader, &fake, 1, 8).await;
    open.send(true).unwrap();
    for (id, p) in (1..).zip(pending) {
        let r = p.await.unwrap().expect("answered");
        assert_eq!(r.log_index, id, "request {id} got another's answer");
    }
    assert_eq!(fake.many_calls.load(SeqCst), 1);
    assert_eq!(fake.many_requests.load(SeqCst), 8);
    assert_eq!(fake.forwards.load(SeqCst), MAX_CALLS);
    // Idle again: the lane is gone.
    until("the lane is dropped", || {
        fwd.lanes.lock().unwrap().is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_leader_without_forward_many_gets_the_batch_back_as_not_leader_then_single_calls() {
    let (open, fake) = gated();
    let fake = Arc::new(FakeLeader {
        no_many: AtomicBool::new(true),
        ..fake
    });
    let leader = serve(fake.clone()).await;
    let fwd = Forwarder::new(Channels::default());
    let pending = fill(&fwd, &leader, &fake, 1, 4).await;
    open.send(true).unwrap();
    for (id, p) in (1..).zip(pending) {
        match p.await.unwrap() {
            Ok(r) if id <= SLOTS => assert_eq!(r.log_index, id),
            // Nothing was proposed: "not leader" sends each again.
            Err(ForwardError::Status(s)) if id > SLOTS => {
                assert_eq!(kind_of(&s), ErrorCode::NotLeader, "request {id}: {s:?}")
            }
            other => panic!("request {id}: {other:?}"),
        }
    }
    // The lane remembers, and now sends queued requests one call each.
    open.send(false).unwrap();
    let pending = fill(&fwd, &leader, &fake, 101, 3).await;
    open.send(true).unwrap();
    for (id, p) in (101..).zip(pending) {
        assert_eq!(p.await.unwrap().expect("answered").log_index, id);
    }
    assert_eq!(fake.forwards.load(SeqCst), 2 * MAX_CALLS + 3);
    assert_eq!(
        fake.many_calls.load(SeqCst),
        1,
        "asked for ForwardMany again"
    );
    // The leader is upgraded; once the lane asks again, it batches and forgets the old leader.
    fake.no_many.store(false, SeqCst);
    fwd.lanes
        .lock()
        .unwrap()
        .get_mut(&leader.peer_urls[0])
        .unwrap()
        .unary_since = Some(std::time::Instant::now() - RECHECK_MANY);
    open.send(false).unwrap();
    let pending = fill(&fwd, &leader, &fake, 201, 4).await;
    open.send(true).unwrap();
    for (id, p) in (201..).zip(pending) {
        assert_eq!(p.await.unwrap().expect("answered").log_index, id);
    }
    assert_eq!(fake.many_calls.load(SeqCst), 2);
    assert_eq!(fake.many_requests.load(SeqCst), 4);
    until("the lane is dropped", || {
        fwd.lanes.lock().unwrap().is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_batch_cut_short_leaves_the_rest_unknown_not_refused() {
    let (open, fake) = gated();
    let fake = Arc::new(FakeLeader {
        cut_after: Some(3),
        ..fake
    });
    let leader = serve(fake.clone()).await;
    let fwd = Forwarder::new(Channels::default());
    let pending = fill(&fwd, &leader, &fake, 1, 6).await;
    open.send(true).unwrap();
    for (id, p) in (1..).zip(pending) {
        match p.await.unwrap() {
            Ok(r) if id <= SLOTS + 3 => assert_eq!(r.log_index, id),
            // The leader may have applied these: a status that allows no resend.
            Err(ForwardError::Status(s)) if id > SLOTS + 3 => {
                assert_eq!(s.code(), tonic::Code::Cancelled, "request {id}");
                assert_ne!(kind_of(&s), ErrorCode::NotLeader);
            }
            other => panic!("request {id}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_leader_url_this_member_cannot_dial_fails_before_anything_is_queued() {
    // No peer TLS here, so an https:// leader cannot be dialled.
    let fwd = Forwarder::new(Channels::default());
    let leader = Member {
        peer_urls: vec!["https://127.0.0.1:1".into()],
    };
    match fwd.forward(&leader, request(1)).await {
        Err(ForwardError::BadLeaderUrl(e)) => assert!(e.contains("TLS"), "{e}"),
        other => panic!("{other:?}"),
    }
    let none = Member { peer_urls: vec![] };
    assert!(matches!(
        fwd.forward(&none, request(2)).await,
        Err(ForwardError::BadLeaderUrl(_))
    ));
    assert!(fwd.lanes.lock().unwrap().is_empty());
}
