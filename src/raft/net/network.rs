//! Peer network client: openraft's RPCs over tonic to other members.
//!
//! One tonic `Channel` per peer URL is built once and shared by every connection openraft
//! creates (replication, heartbeat), so no RPC pays for a TCP/HTTP2 handshake. A snapshot
//! send opens a connection of its own on a low-priority thread (`snapshot_link`).
//! Appends are pipelined over one bidirectional stream per replication session (openraft's
//! default `stream_append` would be stop-and-wait).
//!
//! Every RPC's outcome goes to [`Links`] (per-peer health, and the only place that logs a peer
//! going away and coming back). Besides openraft's RPCs, every member probes every peer
//! (the prober, beside the node), so that view does not depend on being the leader.
//!
//! Invariants (pacing, so that a down peer costs the leader next to nothing; see
//! docs/decisions/0012-paced-peer-retries.md):
//! - openraft retries a replication stream as soon as opening it fails, and its own backoff
//!   only applies once the request stream is polled, which tonic does only after connecting.
//!   So a connection that cannot be opened is paced here: `stream_append` and `full_snapshot`
//!   return a failure only after waiting [`Retry::delay`] (growing to [`RETRY_MAX`]), or
//!   until any RPC to that peer succeeds, whichever comes first.
//! - Heartbeats are not slowed by this: openraft cuts each heartbeat off after one heartbeat
//!   interval and sends the next on schedule, so a returning peer is seen within about one
//!   heartbeat (or one probe), which ends every wait at once and catch-up starts.
//! - Errors are classified by type ([`PeerFailure`]), never by text.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

use crate::proto::kvdpb::peer_client::PeerClient;
use crate::proto::kvdpb::RaftBlob;
use crate::raft::codec::encode;
use crate::raft::net::commit_hold::{CommitHold, CommitWaits, COMMIT_HOLD};
use crate::raft::net::links::Links;
use crate::raft::net::peer_error::PeerFailure;
use crate::raft::sm::snapshot_data::Snapshot;
use crate::raft::types::{Member, NodeId, TypeConfig, Vote};
use crate::sync::LockExt;

pub use crate::raft::limits::MAX_PEER_MESSAGE;

/// Shared cache of channels, keyed by peer URL.
///
/// `https://` peer URLs are dialed with `tls` (this member's peer client certificate and the
/// peer CA); without it they are refused, never dialed in plain text.
#[derive(Clone, Default)]
pub struct Channels {
    inner: Arc<Mutex<HashMap<String, Channel>>>,
    dial_override: Arc<HashMap<String, String>>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Channels {
    /// This member's channels. Builds with the `testkit` feature also honour the fault tests'
    /// dial overrides (`crate::raft::net::dial_override`); release builds have no such path.
    pub fn for_member() -> Result<Channels, String> {
        #[cfg(feature = "testkit")]
        let dial_override = Arc::new(crate::raft::net::dial_override::from_env()?);
        #[cfg(not(feature = "testkit"))]
        let dial_override = Arc::default();
        Ok(Channels {
            dial_override,
            ..Default::default()
        })
    }

    /// These channels dial `https://` peer URLs with `tls`.
    pub fn with_tls(self, tls: Option<Arc<rustls::ClientConfig>>) -> Channels {
        Channels { tls, ..self }
    }

    /// Whether this member can dial `url`'s scheme (`https` needs peer TLS).
    pub fn can_dial(&self, url: &str) -> bool {
        match url.split_once("://") {
            Some((s, _)) if s.eq_ignore_ascii_case("http") => true,
            Some((s, _)) if s.eq_ignore_ascii_case("https") => self.tls.is_some(),
            _ => false,
        }
    }

    /// A (lazily connecting) channel to `url`, reused across calls.
    pub fn get(&self, url: &str) -> Result<Channel, String> {
        let mut m = self.inner.lock_or_recover();
        if let Some(c) = m.get(url) {
            return Ok(c.clone());
        }
        let ch = self.dial(url)?.open();
        m.insert(url.to_string(), ch.clone());
        Ok(ch)
    }

    /// How to open a new connection to `url`, not shared with anything else.
    pub fn dial(&self, url: &str) -> Result<PeerDial, String> {
        if !self.can_dial(url) {
            return Err(format!(
                "cannot dial peer URL {url}: its scheme needs peer TLS, which this member lacks"
            ));
        }
        let dial = self.dial_override.get(url).map_or(url, |s| s.as_str());
        let endpoint = Endpoint::from_shared(dial.to_string())
            .map_err(|e| format!("bad peer URL {url}: {e}"))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let tls = match &self.tls {
            Some(config)
                if url
                    .get(..8)
                    .is_some_and(|s| s.eq_ignore_ascii_case("https://")) =>
            {
                // The certificate is checked against the membership's URL; the bytes go to
                // the override's address when a test proxies the link.
                let (_, name) = crate::raft::net::dial::target(url)?;
                let (addr, _) = crate::raft::net::dial::target(dial)?;
                Some(crate::raft::net::dial::TlsDial {
                    config: config.clone(),
                    addr,
                    name,
                })
            }
            _ => None,
        };
        Ok(PeerDial { endpoint, tls })
    }

    /// A peer client for `member` (its first peer URL).
    pub fn peer(&self, member: &Member) -> Result<PeerClient<Channel>, String> {
        Ok(peer_client(self.get(first_url(member)?)?))
    }
}

fn first_url(member: &Member) -> Result<&str, String> {
    member
        .peer_urls
        .first()
        .map(String::as_str)
        .ok_or_else(|| "member has no peer URL".to_string())
}

/// A peer client on `ch`, with the peer messages' size limits.
pub fn peer_client(ch: Channel) -> PeerClient<Channel> {
    PeerClient::new(ch)
        .max_decoding_message_size(MAX_PEER_MESSAGE)
        .max_encoding_message_size(MAX_PEER_MESSAGE)
}

/// How to connect to one peer URL ([`Channels::dial`]).
#[derive(Clone)]
pub struct PeerDial {
    endpoint: Endpoint,
    tls: Option<crate::raft::net::dial::TlsDial>,
}

impl PeerDial {
    /// A channel that connects on first use. Its worker task is spawned on the current
    /// runtime, which then carries the connection's traffic.
    pub fn open(self) -> Channel {
        match self.tls {
            Some(tls) => self.endpoint.connect_with_connector_lazy(tls),
            None => self.endpoint.connect_lazy(),
        }
    }
}

#[derive(Clone)]
pub struct NetworkFactory {
    pub channels: Channels,
    pub links: Links,
    /// Commits a follower waits for: sent at once, not held (see `commit_hold`).
    pub commit_waits: CommitWaits,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerConnection {
        PeerConnection {
            target,
            client: self.channels.peer(node),
            snapshot_dial: first_url(node).and_then(|url| self.channels.dial(url)),
            links: self.links.clone(),
            retry: Retry::default(),
            commit_waits: self.commit_waits.clone(),
            sent_bytes: crate::metrics::PEER_SENT_BYTES.peer(target),
        }
    }
}

/// First wait after a failed attempt to open a stream to a peer; it doubles per failure.
const RETRY_MIN: Duration = Duration::from_millis(50);
/// Longest wait between attempts; also bounds how late a leadership change is noticed by a
/// replication task that is waiting.
pub const RETRY_MAX: Duration = Duration::from_secs(1);

/// Consecutive failures of one connection (one openraft replication task, heartbeat worker or
/// snapshot sender).
#[derive(Default)]
struct Retry {
    failures: u32,
}

impl Retry {
    fn delay(&mut self) -> Duration {
        let d = RETRY_MIN
            .saturating_mul(1 << self.failures.min(10))
            .min(RETRY_MAX);
        self.failures += 1;
        d
    }
}

pub struct PeerConnection {
    target: NodeId,
    client: Result<PeerClient<Channel>, String>,
    /// Snapshots go over a connection of their own (`snapshot_link`).
    snapshot_dial: Result<PeerDial, String>,
    links: Links,
    retry: Retry,
    commit_waits: CommitWaits,
    /// This peer's `etcd_network_peer_sent_bytes_total`, resolved once.
    sent_bytes: prometheus::IntCounter,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

fn unreachable(e: impl std::fmt::Display) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&Msg(e.to_string())))
}

/// openraft's `Unreachable` (it backs off) for failures to reach the peer, `NetworkError`
/// for what the peer answered.
fn status_err(s: tonic::Status) -> RPCError<TypeConfig> {
    let f = PeerFailure::of_status(&s);
    let msg = Msg(format!("{f}: {}", s.message()));
    if f.is_transport() {
        RPCError::Unreachable(Unreachable::new(&msg))
    } else {
        RPCError::Network(NetworkError::new(&msg))
    }
}

/// An append (what carries the leader's heartbeats) that did not reach its follower.
fn heartbeat_failed() {
    crate::metrics::HEARTBEAT_SEND_FAILURES.inc()
}

fn blob<T: serde::Serialize>(v: &T) -> RaftBlob {
    RaftBlob {
        data: encode(v).into(),
    }
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
        match tokio::time::timeout(option.hard_ttl(), call(client)).await {
            Ok(r) => {
                self.links.record(self.target, &r);
                r.map(|r| r.into_inner()).map_err(status_err)
            }
            Err(_) => {
                self.links.failed(self.target, PeerFailure::Timeout);
                Err(unreachable(format!("peer {:x}: timed out", self.target)))
            }
        }
    }

    /// Called when a stream to the peer could not be opened: waits before the failure is
    /// returned (and openraft tries again), unless the peer answers something meanwhile.
    async fn pace(&mut self) {
        let d = self.retry.delay();
        self.links.wait_up(self.target, d).await;
    }
}

impl RaftNetworkV2<TypeConfig> for PeerConnection {
    type SnapshotData = crate::raft::sm::snapshot_data::SnapshotData;

    /// openraft's own backoff, applied once a stream is open (a peer that answers but accepts
    /// nothing, or a stream that broke). It starts short because it is also paid once by the
    /// first request after a down peer returns; opening streams is paced by `pace`.
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new((0..).map(|i: u32| {
            Duration::from_millis(10)
                .saturating_mul(1 << i.min(7))
                .min(RETRY_MAX)
        })))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let b = blob(&rpc);
        self.sent_bytes.inc_by(b.data.len() as u64);
        let r = self.unary(&option, |mut c| async move { c.append(b).await });
        unblob(r.await.inspect_err(|_| heartbeat_failed())?)
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
            let mut client = match self.client() {
                Ok(c) => c,
                Err(e) => {
                    self.links.failed(self.target, PeerFailure::BadAddress);
                    self.pace().await;
                    return Err(e);
                }
            };
            let input = CommitHold::new(input, COMMIT_HOLD, &self.commit_waits);
            let sent = self.sent_bytes.clone();
            let resp = client
                .stream_append(input.map(move |r| {
                    let b = blob(&r);
                    sent.inc_by(b.data.len() as u64);
                    b
                }))
                .await;
            self.links.record(self.target, &resp);
            let resp = match resp {
                Ok(r) => {
                    self.retry = Retry::default();
                    r
                }
                Err(s) => {
                    heartbeat_failed();
                    self.pace().await;
                    return Err(status_err(s));
                }
            };
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
        let dial = match self.snapshot_dial.clone() {
            Ok(d) => d,
            Err(e) => {
                self.links.failed(self.target, PeerFailure::BadAddress);
                self.pace().await;
                return Err(StreamingError::Unreachable(Unreachable::new(&Msg(e))));
            }
        };
        // Streamed a chunk at a time (see `snapshot_stream`), on a connection and a thread of
        // its own (`snapshot_link`).
        let header = encode(&(vote, snapshot.meta.clone()));
        let (chunks, read_failure) =
            crate::raft::net::snapshot_stream::chunks(header, snapshot.snapshot);
        let started = std::time::Instant::now();
        let send = crate::raft::net::snapshot_link::install_snapshot(dial, chunks);
        let resp = tokio::select! {
            r = send => r,
            closed = cancel => return Err(StreamingError::Closed(closed)),
        };
        self.links.record(self.target, &resp);
        let read_failed = read_failure.lock_or_recover().take();
        let sent_whole = resp.is_ok() && read_failed.is_none();
        if sent_whole {
            crate::metrics::count_peer(&crate::metrics::SNAPSHOT_SEND_SUCCESS, self.target);
            crate::metrics::SNAPSHOT_SEND_SECONDS.observe(self.target, started.elapsed());
            crate::metrics::BACKEND_SNAPSHOT_SECONDS.observe(started.elapsed());
        } else {
            crate::metrics::count_peer(&crate::metrics::SNAPSHOT_SEND_FAILURES, self.target);
        }
        if let Some(e) = read_failed {
            // The receiver refused the short file; the next send takes a new snapshot.
            return Err(StreamingError::Unreachable(Unreachable::new(&Msg(
                format!("reading the snapshot file: {e}"),
            ))));
        }
        let resp = match resp {
            Ok(r) => {
                self.retry = Retry::default();
                r
            }
            Err(s) => {
                let f = PeerFailure::of_status(&s);
                self.pace().await;
                return Err(StreamingError::Unreachable(Unreachable::new(&Msg(
                    format!("{f}: {}", s.message()),
                ))));
            }
        };
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
