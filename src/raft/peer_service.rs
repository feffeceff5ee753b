//! Server side of the peer protocol: hands openraft's RPCs to the local Raft node, and serves
//! the leader's half of forwarded writes, read-index requests and membership changes.
//!
//! Lease expiry answers and membership checks are the server layer's: the peer service reaches
//! them through [`LeaderDuties`], which the server implements and hands in, so this layer
//! never names the one above it.

use openraft::async_runtime::WatchReceiver;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status, Streaming};

use crate::proto::etcdserverpb::{
    HashKvRequest, HashKvResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, ResponseHeader,
};
use crate::proto::kvdpb::peer_server::Peer;
use crate::proto::kvdpb::{
    membership_request, membership_response, ForwardManyRequest, ForwardOutcome, ForwardRequest,
    ForwardResponse, MemberInfoRequest, MemberInfoResponse, MembershipRequest, MembershipResponse,
    ProbeRequest, ProbeResponse, RaftBlob, ReadIndexRequest, ReadIndexResponse, RemovedRequest,
    RemovedResponse, SnapshotChunk,
};
use crate::raft::codec::encode;
use crate::raft::node::RaftNode;
use crate::raft::sm::snapshot_data::Snapshot;
use crate::raft::types::{SnapshotMeta, Vote};

/// What only the leader answers for its followers, beyond Raft itself: lease keep-alives and
/// time-to-live queries (the leader alone tracks expiry) and membership changes (checked
/// against the current configuration before they are proposed).
#[tonic::async_trait]
pub trait LeaderDuties: Send + Sync + 'static {
    /// A keep-alive forwarded by a follower; FailedPrecondition when this member is not the
    /// lease primary.
    fn keep_alive(&self, id: i64) -> Result<LeaseKeepAliveResponse, Status>;
    /// A time-to-live query forwarded by a follower; FailedPrecondition as for keep-alives.
    fn time_to_live(&self, req: &LeaseTimeToLiveRequest)
        -> Result<LeaseTimeToLiveResponse, Status>;
    /// A membership change forwarded by a follower.
    async fn reconfigure(
        &self,
        req: membership_request::Request,
    ) -> Result<membership_response::Response, Status>;
}

pub struct PeerService {
    pub node: RaftNode,
    pub cluster_id: u64,
    pub duties: std::sync::Arc<dyn LeaderDuties>,
    /// Set when the leader tells this member it has been removed.
    pub removed: tokio::sync::watch::Sender<bool>,
}

fn unblob<T: DeserializeOwned>(b: &[u8]) -> Result<T, Status> {
    bincode::deserialize(b).map_err(|e| Status::invalid_argument(format!("bad peer message: {e}")))
}

fn blob<T: serde::Serialize>(v: &T) -> Response<RaftBlob> {
    Response::new(RaftBlob {
        data: encode(v).into(),
    })
}

fn fatal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

type BlobStream = Pin<Box<dyn Stream<Item = Result<RaftBlob, Status>> + Send>>;

impl PeerService {
    /// Refuses a Raft RPC while this member stops, before it reaches openraft.
    fn live(&self) -> Result<(), Status> {
        if self.node.is_stopping() {
            return Err(crate::raft::net::peer_error::stopping());
        }
        Ok(())
    }

    /// Runs a call into openraft unless this member starts to stop first
    /// ([`RaftNode::unless_stopping`]); then answers "stopping", as to calls that arrive after.
    async fn until_stop<T>(&self, call: impl std::future::Future<Output = T>) -> Result<T, Status> {
        self.node
            .unless_stopping(call)
            .await
            .ok_or_else(crate::raft::net::peer_error::stopping)
    }

    /// Refuses a forwarded write or read index while this member stops, as "not leader":
    /// nothing was proposed, so the follower may send it to the next leader.
    fn leading(&self) -> Result<(), Status> {
        if self.node.is_stopping() {
            return Err(crate::raft::net::peer_error::not_leader());
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append(&self, req: Request<RaftBlob>) -> Result<Response<RaftBlob>, Status> {
        self.live()?;
        let rpc = unblob(&req.into_inner().data)?;
        self.node.touch_leader();
        let r = self
            .until_stop(self.node.raft.append_entries(rpc))
            .await?
            .map_err(fatal)?;
        Ok(blob(&r))
    }

    type StreamAppendStream = BlobStream;

    async fn stream_append(
        &self,
        req: Request<Streaming<RaftBlob>>,
    ) -> Result<Response<Self::StreamAppendStream>, Status> {
        self.live()?;
        // A message that does not decode ends the stream; the leader then starts a new one.
        let node = self.node.clone();
        let open = self.node.stream_opened();
        // Ends when this member starts to stop, so openraft finishes the stream before its
        // core goes away.
        // Appends come from the leader: its byte counter is resolved once per stream.
        use crate::metrics::PEER_RECEIVED_BYTES;
        let mut from: Option<prometheus::IntCounter> = None;
        let input = req
            .into_inner()
            .take_until(self.node.when_stopping())
            .take_while(|r| futures::future::ready(r.is_ok()))
            .filter_map(move |r| {
                node.touch_leader();
                if from.is_none() {
                    from = node.status().leader.map(|l| PEER_RECEIVED_BYTES.peer(l));
                }
                if let (Ok(b), Some(c)) = (&r, &from) {
                    c.inc_by(b.data.len() as u64);
                }
                async move { r.ok().and_then(|b| bincode::deserialize(&b.data).ok()) }
            });
        let out = self.node.raft.stream_append(Box::pin(input)).map(move |r| {
            // Owned by the stream, so it counts as open for as long as it exists.
            let _open = &open;
            match r {
                Ok(res) => Ok(RaftBlob {
                    data: encode(&res).into(),
                }),
                Err(e) => Err(fatal(e)),
            }
        });
        Ok(Response::new(Box::pin(out)))
    }

    async fn vote(&self, req: Request<RaftBlob>) -> Result<Response<RaftBlob>, Status> {
        self.live()?;
        let rpc = unblob(&req.into_inner().data)?;
        let r = self
            .until_stop(self.node.raft.vote(rpc))
            .await?
            .map_err(fatal)?;
        Ok(blob(&r))
    }

    async fn pre_vote(&self, req: Request<RaftBlob>) -> Result<Response<RaftBlob>, Status> {
        self.live()?;
        let rpc = unblob(&req.into_inner().data)?;
        let r = self
            .until_stop(self.node.raft.pre_vote(rpc))
            .await?
            .map_err(fatal)?;
        Ok(blob(&r))
    }

    async fn transfer_leader(&self, req: Request<RaftBlob>) -> Result<Response<RaftBlob>, Status> {
        self.live()?;
        let rpc = unblob(&req.into_inner().data)?;
        let r = self
            .until_stop(self.node.raft.handle_transfer_leader(rpc))
            .await?
            .map_err(fatal)?;
        Ok(blob(&r))
    }

    async fn install_snapshot(
        &self,
        req: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftBlob>, Status> {
        self.live()?;
        let started = std::time::Instant::now();
        let mut stream = req.into_inner();
        let first = stream
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))??;
        let (vote, meta): (Vote, SnapshotMeta) = unblob(&first.header)?;
        let from = vote.leader_id().node_id;
        let installed = async {
            // Into an engine generation of its own as it arrives; switched to at the install.
            let stager = self.node.sm.stage_snapshot(&meta).map_err(fatal)?;
            let staged =
                crate::raft::net::snapshot_stream::receive(stager, first.data, stream).await?;
            let snapshot = Snapshot {
                meta,
                snapshot: crate::raft::sm::snapshot_data::SnapshotData::Staged(Box::new(staged)),
            };
            self.until_stop(self.node.raft.install_full_snapshot(vote, snapshot))
                .await?
                .map_err(fatal)
        }
        .await;
        use crate::metrics::{
            count_peer, SNAPSHOT_RECEIVE_FAILURES, SNAPSHOT_RECEIVE_SECONDS,
            SNAPSHOT_RECEIVE_SUCCESS,
        };
        match installed {
            Ok(r) => {
                count_peer(&SNAPSHOT_RECEIVE_SUCCESS, from);
                SNAPSHOT_RECEIVE_SECONDS.observe(from, started.elapsed());
                Ok(blob(&r))
            }
            Err(e) => {
                count_peer(&SNAPSHOT_RECEIVE_FAILURES, from);
                Err(e)
            }
        }
    }

    async fn forward(
        &self,
        req: Request<ForwardRequest>,
    ) -> Result<Response<ForwardResponse>, Status> {
        self.leading()?;
        let inner = req
            .into_inner()
            .request
            .ok_or_else(|| Status::invalid_argument("missing request"))?;
        let waiting = self.node.commit_waits.forwarding();
        let (resp, log_index) = self.node.propose_forwarded(inner).await?;
        waiting.answered(log_index);
        Ok(Response::new(ForwardResponse {
            response: Some(resp),
            log_index,
        }))
    }

    type ForwardManyStream = Pin<Box<dyn Stream<Item = Result<ForwardOutcome, Status>> + Send>>;

    async fn forward_many(
        &self,
        req: Request<ForwardManyRequest>,
    ) -> Result<Response<Self::ForwardManyStream>, Status> {
        self.leading()?;
        let reqs = req.into_inner().requests;
        // Until the last outcome is out: no commit is held meanwhile (`commit_hold`).
        let mut waiting = self.node.commit_waits.forwarding();
        let results = self.node.propose_forwarded_many(reqs).await?;
        let outcomes = results.map(move |r| {
            Ok(match r {
                Ok((response, log_index)) => {
                    waiting.note(log_index);
                    ForwardOutcome {
                        applied: Some(ForwardResponse {
                            response: Some(response),
                            log_index,
                        }),
                        ..Default::default()
                    }
                }
                Err(s) => ForwardOutcome {
                    applied: None,
                    code: s.code() as i32,
                    message: s.message().to_string(),
                    kind: crate::raft::net::peer_error::kind_of(&s) as i32,
                },
            })
        });
        Ok(Response::new(Box::pin(outcomes)))
    }

    async fn read_index(
        &self,
        _req: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        self.leading()?;
        let read_index = self.node.local_read_index().await?;
        // The asking member serves the read once it has applied this far.
        self.node.commit_waits.wait_for(read_index);
        Ok(Response::new(ReadIndexResponse {
            read_index,
            term: self.node.term(),
        }))
    }

    async fn member_info(
        &self,
        req: Request<MemberInfoRequest>,
    ) -> Result<Response<MemberInfoResponse>, Status> {
        let urls = req.into_inner().peer_urls;
        let m = self.node.raft.metrics();
        let m = m.borrow_watched();
        let found = m
            .membership_config
            .membership()
            .nodes()
            .find(|(_, n)| n.peer_urls.iter().any(|u| urls.contains(u)))
            .map(|(id, _)| *id);
        Ok(Response::new(MemberInfoResponse {
            member_id: found.unwrap_or(0),
            cluster_id: self.cluster_id,
            found: found.is_some(),
        }))
    }

    async fn membership(
        &self,
        req: Request<MembershipRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let inner = req
            .into_inner()
            .request
            .ok_or_else(|| Status::invalid_argument("missing request"))?;
        // A member list sent next to the forwarding member reads that member's own state.
        let _waiting = self.node.commit_waits.forwarding();
        let response = self.duties.reconfigure(inner).await?;
        Ok(Response::new(MembershipResponse {
            response: Some(response),
        }))
    }

    async fn removed(
        &self,
        req: Request<RemovedRequest>,
    ) -> Result<Response<RemovedResponse>, Status> {
        let r = req.into_inner();
        if r.cluster_id != self.cluster_id || r.member_id != self.node.id {
            return Err(Status::invalid_argument(
                "removal notice for another member",
            ));
        }
        let _ = self.removed.send(true);
        Ok(Response::new(RemovedResponse {}))
    }

    async fn probe(&self, req: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        let r = req.into_inner();
        if r.cluster_id != self.cluster_id {
            return Err(Status::failed_precondition("cluster ID mismatch"));
        }
        let removed = self.node.sm.is_removed(r.member_id).map_err(fatal)?;
        Ok(Response::new(ProbeResponse {
            removed,
            log_format: crate::raft::log_format::LOG_FORMAT,
        }))
    }

    async fn lease_keep_alive(
        &self,
        req: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        self.duties
            .keep_alive(req.into_inner().id)
            .map(Response::new)
    }

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        self.duties
            .time_to_live(&req.into_inner())
            .map(Response::new)
    }

    async fn hash_kv(
        &self,
        req: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        let rev = req.into_inner().revision;
        let store = self.node.sm.store().clone();
        // Reads the whole history up to `rev`: off the async workers.
        let h = tokio::task::spawn_blocking(move || store.hash_kv(rev))
            .await
            .map_err(fatal)?
            .map_err(|e| {
                let code = match e {
                    crate::mvcc::MvccError::Compacted | crate::mvcc::MvccError::FutureRev => {
                        tonic::Code::OutOfRange
                    }
                    _ => tonic::Code::Unknown,
                };
                crate::raft::net::peer_error::status_of_kind(code, e.to_string(), e.kind())
            })?;
        Ok(Response::new(HashKvResponse {
            header: Some(ResponseHeader {
                cluster_id: self.cluster_id,
                member_id: self.node.id,
                revision: h.current,
                raft_term: self.node.term(),
            }),
            hash: h.hash,
            compact_revision: h.compacted,
            hash_revision: h.revision,
        }))
    }
}
