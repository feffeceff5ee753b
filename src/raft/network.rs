//! Peer network client: openraft's RPCs over tonic to other members.
//!
//! One tonic `Channel` per peer URL is built once and shared by every connection openraft
//! creates (replication, heartbeat, snapshot), so no RPC pays for a TCP/HTTP2 handshake.
//! Appends are pipelined over one bidirectional stream per replication session (openraft's
//! default `stream_append` would be stop-and-wait).
//!
//! [`Links`] records, per target, when the current run of successful RPCs began: this member's
//! view of which peers are *active*, which etcd's strict reconfiguration check relies on. Any
//! failed RPC to a target ends its run, so a peer counts as active only after it has answered
//! every RPC for the whole health interval. Besides openraft's RPCs, every member probes every
//! peer (`super::prober`), so the view does not depend on being the leader.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

use super::log_store::encode;
use super::types::{Member, NodeId, Snapshot, TypeConfig, Vote};
use crate::proto::kvdpb::peer_client::PeerClient;
use crate::proto::kvdpb::{RaftBlob, SnapshotChunk};

pub use super::limits::MAX_PEER_MESSAGE;
use super::limits::SNAPSHOT_CHUNK;

/// Fault testing only: `peerURL=dialURL,...`. This member dials `dialURL` whenever it would
/// dial `peerURL`, so a test can put a fault-injecting proxy on each member-to-member link
/// (peer URLs live in the replicated membership and are the same on every member).
pub const PEER_DIAL_OVERRIDE_ENV: &str = "KVD_TEST_PEER_DIAL_OVERRIDE";

/// Shared cache of channels, keyed by peer URL.
#[derive(Clone, Default)]
pub struct Channels {
    inner: Arc<Mutex<HashMap<String, Channel>>>,
    dial_override: Arc<HashMap<String, String>>,
}

impl Channels {
    /// Channels that honour [`PEER_DIAL_OVERRIDE_ENV`] if it is set.
    pub fn from_env() -> Result<Channels, String> {
        let Ok(spec) = std::env::var(PEER_DIAL_OVERRIDE_ENV) else {
            return Ok(Channels::default());
        };
        let mut m = HashMap::new();
        for pair in spec.split(',').filter(|p| !p.is_empty()) {
            let (from, to) = pair.split_once('=').ok_or_else(|| {
                format!("{PEER_DIAL_OVERRIDE_ENV}: expected peerURL=dialURL, got {pair:?}")
            })?;
            m.insert(from.to_string(), to.to_string());
        }
        tracing::warn!(
            overrides = m.len(),
            "{PEER_DIAL_OVERRIDE_ENV} set: peer dials redirected (fault testing only)"
        );
        Ok(Channels {
            dial_override: Arc::new(m),
            ..Default::default()
        })
    }

    /// A (lazily connecting) channel to `url`, reused across calls.
    pub fn get(&self, url: &str) -> Result<Channel, tonic::transport::Error> {
        let mut m = self.inner.lock().unwrap();
        if let Some(c) = m.get(url) {
            return Ok(c.clone());
        }
        let dial = self.dial_override.get(url).map_or(url, |s| s.as_str());
        let ch = Endpoint::from_shared(dial.to_string())?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_lazy();
        m.insert(url.to_string(), ch.clone());
        Ok(ch)
    }

    /// A peer client for `member` (its first peer URL).
    pub fn peer(&self, member: &Member) -> Result<PeerClient<Channel>, String> {
        let url = member.peer_urls.first().ok_or("member has no peer URL")?;
        let ch = self
            .get(url)
            .map_err(|e| format!("bad peer URL {url}: {e}"))?;
        Ok(PeerClient::new(ch)
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE))
    }
}

/// A link with no successful RPC for this long is down even if no RPC has failed yet (a
/// replication stream can hang rather than fail). Heartbeats keep a healthy link far fresher.
const LINK_STALE: Duration = Duration::from_secs(2);

#[derive(Clone, Copy)]
struct Link {
    /// Start of the current run of successful RPCs; `None` after a failure.
    up_since: Option<Instant>,
    last_ok: Instant,
}

/// Per-target link health as seen by this member's outgoing RPCs.
#[derive(Clone, Default)]
pub struct Links {
    inner: Arc<Mutex<HashMap<NodeId, Link>>>,
}

impl Links {
    fn ok(&self, target: NodeId) {
        let now = Instant::now();
        let mut m = self.inner.lock().unwrap();
        let l = m.entry(target).or_insert(Link {
            up_since: None,
            last_ok: now,
        });
        if l.up_since.is_none() {
            l.up_since = Some(now);
        }
        l.last_ok = now;
    }

    fn failed(&self, target: NodeId) {
        if let Some(l) = self.inner.lock().unwrap().get_mut(&target) {
            l.up_since = None;
        }
    }

    /// Records the outcome of one exchange with `target`.
    pub fn record<T, E>(&self, target: NodeId, r: &Result<T, E>) {
        match r {
            Ok(_) => self.ok(target),
            Err(_) => self.failed(target),
        }
    }

    /// When the current uninterrupted run of successful RPCs to `target` began, if it is up.
    pub fn active_since(&self, target: NodeId) -> Option<Instant> {
        let m = self.inner.lock().unwrap();
        let l = m.get(&target)?;
        if l.last_ok.elapsed() > LINK_STALE {
            return None;
        }
        l.up_since
    }

    /// Whether `target` has been reachable without interruption for at least `interval`.
    pub fn active_for(&self, target: NodeId, interval: Duration) -> bool {
        self.active_since(target)
            .is_some_and(|t| t.elapsed() >= interval)
    }
}

#[derive(Clone)]
pub struct NetworkFactory {
    pub channels: Channels,
    pub links: Links,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerConnection {
        PeerConnection {
            target,
            client: self.channels.peer(node),
            links: self.links.clone(),
        }
    }
}

pub struct PeerConnection {
    target: NodeId,
    client: Result<PeerClient<Channel>, String>,
    links: Links,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

fn unreachable(e: impl std::fmt::Display) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&Msg(e.to_string())))
}

fn status_err(s: tonic::Status) -> RPCError<TypeConfig> {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            unreachable(s.message())
        }
        _ => RPCError::Network(NetworkError::new(&Msg(format!(
            "{}: {}",
            s.code(),
            s.message()
        )))),
    }
}

fn blob<T: serde::Serialize>(v: &T) -> RaftBlob {
    RaftBlob { data: encode(v) }
}

fn unblob<T: DeserializeOwned>(b: RaftBlob) -> Result<T, RPCError<TypeConfig>> {
    bincode::deserialize(&b.data)
        .map_err(|e| RPCError::Network(NetworkError::new(&Msg(format!("bad peer reply: {e}")))))
}

impl PeerConnection {
    fn client(&self) -> Result<PeerClient<Channel>, RPCError<TypeConfig>> {
        self.client.clone().map_err(unreachable)
    }

    async fn unary<F, Fut>(
        &self,
        option: &RPCOption,
        call: F,
    ) -> Result<RaftBlob, RPCError<TypeConfig>>
    where
        F: FnOnce(PeerClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<RaftBlob>, tonic::Status>>,
    {
        let client = self.client()?;
        let r = match tokio::time::timeout(option.hard_ttl(), call(client)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(status_err(s)),
            Err(_) => Err(unreachable(format!("peer {:x}: timed out", self.target))),
        };
        self.links.record(self.target, &r);
        r
    }
}

impl RaftNetworkV2<TypeConfig> for PeerConnection {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let b = blob(&rpc);
        unblob(
            self.unary(&option, |mut c| async move { c.append(b).await })
                .await?,
        )
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        _option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        Box::pin(async move {
            let mut client = self.client()?;
            let resp = client.stream_append(input.map(|r| blob(&r))).await;
            self.links.record(self.target, &resp);
            let resp = resp.map_err(status_err)?;
            let (links, target) = (self.links.clone(), self.target);
            let out = resp.into_inner().map(move |item| {
                links.record(target, &item);
                match item {
                    Ok(b) => unblob::<StreamAppendResult<TypeConfig>>(b),
                    Err(s) => Err(status_err(s)),
                }
            });
            Ok(Box::pin(out) as BoxStream<'s, _>)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let b = blob(&rpc);
        unblob(
            self.unary(&option, |mut c| async move { c.vote(b).await })
                .await?,
        )
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let b = blob(&rpc);
        unblob(
            self.unary(&option, |mut c| async move { c.pre_vote(b).await })
                .await?,
        )
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let mut client = self
            .client
            .clone()
            .map_err(|e| StreamingError::Unreachable(Unreachable::new(&Msg(e))))?;
        let header = encode(&(vote, snapshot.meta.clone()));
        let data = snapshot.snapshot;
        let mut chunks = vec![SnapshotChunk {
            header,
            data: Vec::new(),
        }];
        chunks.extend(data.chunks(SNAPSHOT_CHUNK).map(|c| SnapshotChunk {
            header: Vec::new(),
            data: c.to_vec(),
        }));
        let send = client.install_snapshot(futures::stream::iter(chunks));
        let resp = tokio::select! {
            r = send => r,
            closed = cancel => return Err(StreamingError::Closed(closed)),
        };
        self.links.record(self.target, &resp);
        let resp = resp.map_err(|s| {
            StreamingError::Unreachable(Unreachable::new(&Msg(s.message().to_string())))
        })?;
        bincode::deserialize(&resp.into_inner().data)
            .map_err(|e| StreamingError::Unreachable(Unreachable::new(&Msg(e.to_string()))))
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let b = blob(&req);
        unblob(
            self.unary(&option, |mut c| async move { c.transfer_leader(b).await })
                .await?,
        )
    }
}
