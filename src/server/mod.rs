//! The kvd server: opens a member's storage, starts Raft, and serves the etcd v3 API to
//! clients and the peer protocol to other members until told to stop.
//!
//! Data dir layout (like etcd's `member/`):
//! ```text
//! <data-dir>/member/member.json  identity: format version, member id, cluster id, name
//! <data-dir>/member/wal/         write-ahead log segments (the source of truth)
//! <data-dir>/member/sm/db/       sled: MVCC key space + apply metadata (rebuilt from WAL)
//! <data-dir>/member/sm/snap/     Raft snapshot files
//! ```

pub mod cluster;
pub mod context;
pub mod error;
pub mod gateway;
pub mod identity;
pub mod kv;
pub mod learner;
pub mod lease;
pub mod maintenance;
pub mod membership;
pub mod oversize;
pub mod watch_hub;
pub mod watches;

use openraft::async_runtime::WatchReceiver;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::SnapshotPolicy;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::Routes;

use crate::config::Config;
use crate::proto::etcdserverpb::cluster_server::ClusterServer;
use crate::proto::etcdserverpb::kv_server::KvServer;
use crate::proto::etcdserverpb::lease_server::LeaseServer;
use crate::proto::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::proto::etcdserverpb::watch_server::WatchServer;
use crate::proto::kvdpb::peer_server::PeerServer;
use crate::proto::kvdpb::{internal_request, InternalRequest, MemberAttributes};
use crate::raft::links::Links;
use crate::raft::log_store::LogStore;
use crate::raft::network::{Channels, NetworkFactory, MAX_PEER_MESSAGE};
use crate::raft::peer_service::PeerService;
use crate::raft::state_machine::StateMachine;
use crate::raft::{Member, Raft, RaftNode};
use context::ServerCtx;
use learner::LearnerGuard;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Config(String),
    #[error("listen tcp {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open data dir: {0}")]
    Storage(#[from] crate::raft::StoreError),
    #[error("raft: {0}")]
    Raft(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs a member until `shutdown` resolves, then stops gracefully (a leader hands leadership
/// over first).
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    let member_dir = cfg.data_dir.join("member");
    // The data dir and member/ may be new (first start): their entries must be durable
    // before anything inside them is trusted to be.
    crate::wal::create_dir_durable(&crate::wal::RealFs, &member_dir)?;
    let channels = Channels::from_env().map_err(ServerError::Raft)?;
    let (ident, fresh) = identity::load_or_create(&cfg, &member_dir, &channels).await?;
    tracing::info!(
        name = %cfg.name,
        member_id = %format!("{:x}", ident.member_id),
        cluster_id = %format!("{:x}", ident.cluster_id),
        data_dir = %cfg.data_dir.display(),
        "starting member"
    );

    // Bind first so a port clash is a clear error before any state changes.
    let mut peer_listeners = Vec::new();
    for a in &cfg.listen_peer {
        peer_listeners.push(bind(*a).await?);
    }
    let mut client_listeners = Vec::new();
    for a in &cfg.listen_client {
        client_listeners.push(bind(*a).await?);
    }

    let mut metrics_listeners = Vec::new();
    for a in &cfg.listen_metrics {
        metrics_listeners.push(bind(*a).await?);
    }

    let log = LogStore::open_on(&member_dir.join("wal"), &cfg.wal)?;
    let sm = StateMachine::open(&member_dir.join("sm"))?;
    sm.roll_back_if_ahead_of(log.last_index())?;
    let raft_cfg = openraft::Config {
        cluster_name: cfg.initial_cluster_token.clone(),
        heartbeat_interval: cfg.heartbeat.as_millis() as u64,
        // openraft's follower waits out a leader lease of `election_timeout_max` after the
        // leader's last message, then a further random `min..max` before it campaigns, and
        // grants votes only once its own lease has run out. etcd campaigns after a random
        // [E, 2E) of silence and grants once E has passed. With max = E and min = E/4 (more
        // than a heartbeat, as openraft requires, since E >= 5 heartbeats), kvd campaigns
        // after [1.25E, 2E) and grants after E. With min = E and max = 2E a frozen leader
        // left the cluster without one for 3.1-3.8 s, against etcd's 1.0-2.0
        // (benches/compare/failover.sh).
        election_timeout_min: cfg.election_timeout.as_millis() as u64 / 4,
        election_timeout_max: cfg.election_timeout.as_millis() as u64,
        enable_pre_vote: Some(true),
        // A restarted leader must win a new election. openraft's default lets it resume in
        // its old term, which is unsafe with our log store: the leader replicates entries
        // before its own fsync (to overlap the two), so after kill -9 it can come back
        // without entries its followers hold and write different ones at the same
        // (term, index), which followers take as already present. Found by tests/chaos.rs
        // (members diverged and acknowledged writes were lost).
        enable_leader_restore: Some(false),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_count),
        max_in_snapshot_log_to_keep: cfg.snapshot_catchup_entries,
        install_snapshot_timeout: 10_000,
        ..Default::default()
    }
    .validate()
    .map_err(|e| ServerError::Raft(e.to_string()))?;
    let links = Links::default();
    let network = NetworkFactory {
        channels: channels.clone(),
        links: links.clone(),
    };
    let raft = Raft::new(
        ident.member_id,
        Arc::new(raft_cfg),
        network,
        log.clone(),
        sm.clone(),
    )
    .await
    .map_err(|e| ServerError::Raft(e.to_string()))?;
    let node = RaftNode {
        id: ident.member_id,
        raft: raft.clone(),
        sm,
        log,
        channels,
        leader_contact: Arc::new(std::sync::Mutex::new(std::time::Instant::now())),
        election_timeout: cfg.election_timeout,
        reads: Default::default(),
    };

    if fresh && cfg.initial_cluster_state == crate::config::ClusterState::New {
        let members: BTreeMap<u64, Member> = ident
            .initial_members
            .iter()
            .map(|(id, urls)| {
                (
                    *id,
                    Member {
                        peer_urls: urls.clone(),
                    },
                )
            })
            .collect();
        // Not awaited before serving: openraft answers only once the first entry is
        // flushed, and a member whose peer server is not up yet cannot take part in what
        // follows (a test cluster once never saw its third member come up).
        let raft = raft.clone();
        tokio::spawn(async move {
            if let Err(e) = raft.initialize(members).await {
                // Every member of a new cluster initializes with the same config; a member
                // that already heard from a leader refuses, which is fine.
                tracing::debug!("initialize: {e}");
            }
        });
    }

    let reconfig = Arc::new(membership::Reconfig::new(
        node.clone(),
        links.clone(),
        ident.cluster_id,
        cfg.initial_cluster_token.clone(),
    ));
    let (removed_tx, removed_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let mut tasks = Vec::new();
    for l in peer_listeners {
        let svc = PeerServer::new(PeerService {
            node: node.clone(),
            cluster_id: ident.cluster_id,
            reconfig: reconfig.clone(),
            removed: removed_tx.clone(),
        })
        .max_decoding_message_size(MAX_PEER_MESSAGE)
        .max_encoding_message_size(MAX_PEER_MESSAGE);
        let fut = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming(l), stopped(stop_rx.clone()));
        tasks.push(tokio::spawn(fut));
    }
    let ctx = ServerCtx {
        node: node.clone(),
        cluster_id: ident.cluster_id,
        max_request_bytes: cfg.max_request_bytes,
        max_txn_ops: cfg.max_txn_ops,
        reconfig,
    };
    // etcd lets the transport accept max-request-bytes plus 512 KiB of gRPC overhead, and
    // checks the request itself against max-request-bytes.
    let max_msg = cfg.max_request_bytes + 512 * 1024;
    let services = gateway::Services {
        max_msg,
        kv: LearnerGuard::new(
            KvServer::new(kv::KvService { ctx: ctx.clone() })
                .max_decoding_message_size(max_msg)
                .max_encoding_message_size(usize::MAX),
            node.clone(),
        ),
        watch: LearnerGuard::new(
            WatchServer::new(watches::WatchService::new(
                ctx.clone(),
                cfg.watch_progress_notify_interval,
            ))
            .max_decoding_message_size(max_msg)
            .max_encoding_message_size(usize::MAX),
            node.clone(),
        ),
        lease: LearnerGuard::new(
            LeaseServer::new(lease::LeaseService { ctx: ctx.clone() })
                .max_decoding_message_size(max_msg),
            node.clone(),
        ),
        cluster: LearnerGuard::new(
            ClusterServer::new(cluster::ClusterService { ctx: ctx.clone() })
                .max_decoding_message_size(max_msg),
            node.clone(),
        ),
        maintenance: LearnerGuard::new(
            MaintenanceServer::new(maintenance::MaintenanceService {
                ctx: ctx.clone(),
                db_dir: member_dir.join("sm").join("db"),
            })
            .max_decoding_message_size(max_msg),
            node.clone(),
        ),
    };
    for l in client_listeners {
        let fut = tonic::transport::Server::builder()
            // HTTP/1.1 for the JSON gateway; gRPC stays on HTTP/2 (hyper tells them apart by
            // the HTTP/2 preface), as etcd multiplexes both on its client port.
            .accept_http1(true)
            .add_routes(client_routes(&services, &node, max_msg))
            .serve_with_incoming_shutdown(incoming(l), stopped(stop_rx.clone()));
        tasks.push(tokio::spawn(fut));
    }

    let mut aux = Vec::new();
    if !metrics_listeners.is_empty() {
        let scrape = crate::metrics::Scrape::new(node.clone(), member_dir.join("sm").join("db"));
        aux.push(tokio::spawn(scrape.clone().watch_leader()));
        for l in metrics_listeners {
            let fut = crate::metrics::serve(l, scrape.clone(), stopped(stop_rx.clone()));
            aux.push(tokio::spawn(async move {
                if let Err(e) = fut.await {
                    tracing::warn!("metrics listener: {e}");
                }
            }));
        }
    }

    let lessor = tokio::spawn(lease::lessor_duties(node.clone()));
    let prober = tokio::spawn(crate::raft::prober::run(
        node.clone(),
        links,
        ident.cluster_id,
        removed_tx.clone(),
    ));
    let publisher = tokio::spawn(publish(
        node.clone(),
        cfg.name.clone(),
        cfg.advertise_client_urls.clone(),
    ));
    tracing::info!("ready to serve client requests");

    let removed = membership::removed(
        node.clone(),
        ident.initial_members.contains_key(&node.id),
        removed_rx,
    );
    let mut failed = None;
    tokio::select! {
        _ = shutdown => {}
        why = raft_stopped(raft.clone()) => {
            tracing::error!(error = %why, "raft stopped on a storage error; the member exits");
            failed = Some(why);
        }
        _ = removed => {
            tracing::warn!(
                "the member has been permanently removed from the cluster; \
                 its data dir must be removed before it can join again"
            );
            // Let the reply to the request that removed this member reach its client.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    drop(removed_tx);
    tracing::info!("stopping member");
    publisher.abort();
    lessor.abort();
    prober.abort();
    hand_over_leadership(&node).await;
    let _ = stop_tx.send(true);
    let _ = raft.shutdown().await;
    if let Err(e) = node.log.flush_committed().await {
        tracing::warn!("could not persist the committed index: {e}");
    }
    // Not needed for safety (the log has every applied entry), but a restart then replays
    // nothing that was already applied.
    if let Err(e) = node.sm.shared.mvcc.flush() {
        tracing::warn!("could not write applied state to the state-machine database: {e}");
    }
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
    }
    for t in aux {
        // The leader watcher only ends with the node, and a scrape in flight need not finish.
        t.abort();
    }
    match failed {
        Some(why) => Err(ServerError::Raft(why)),
        None => Ok(()),
    }
}

/// Resolves when Raft stops without being asked to: openraft stops on a storage error (a WAL
/// write or fsync, the state-machine database), and a member that cannot persist must not
/// keep answering as if it could. etcd exits in the same cases.
async fn raft_stopped(raft: Raft) -> String {
    // The sender lives in openraft's core task: `changed` fails once the core has ended.
    let mut rx = raft.server_metrics();
    while rx.changed().await.is_ok() {}
    match &raft.metrics().borrow_watched().running_state {
        Err(e) => e.to_string(),
        Ok(()) => "raft stopped".to_string(),
    }
}

/// A client listener's routes: the etcd gRPC services (counted by the gRPC metrics), the JSON
/// gateway and its plain endpoints, and a fallback that answers gRPC calls to unknown methods
/// with `Unimplemented` and anything else with 404.
fn client_routes(services: &gateway::Services, node: &RaftNode, max_msg: usize) -> Routes {
    let grpc = Routes::new(services.kv.clone())
        .add_service(services.watch.clone())
        .add_service(services.lease.clone())
        .add_service(services.cluster.clone())
        .add_service(services.maintenance.clone())
        .into_axum_router()
        .layer(tower::layer::layer_fn(move |s| {
            oversize::EtcdSizeError::new(s, max_msg)
        }))
        .layer(crate::metrics::GrpcMetricsLayer);
    Routes::from(
        grpc.merge(gateway::router(services.clone(), node.clone(), max_msg))
            .fallback(gateway::not_found),
    )
}

/// Accepted connections with Nagle's algorithm off. Small gRPC responses (append acks,
/// reads) otherwise wait for the peer's delayed ACK, tens of milliseconds each; tonic sets
/// TCP_NODELAY only on listeners it binds itself.
fn incoming(l: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true))
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen { addr, source })
}

/// etcd's publish: once started, a member records its name and client URLs through the log so
/// every member lists them. Retried until it succeeds (it needs a leader).
async fn publish(node: RaftNode, name: String, client_urls: Vec<String>) {
    let req = InternalRequest {
        request: Some(internal_request::Request::Publish(MemberAttributes {
            member_id: node.id,
            name,
            client_urls,
        })),
    };
    loop {
        match node.propose(req.clone()).await {
            Ok(_) => {
                tracing::info!("published member attributes");
                return;
            }
            Err(e) => {
                tracing::debug!("publish: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// A leader that stops transfers leadership to another voter first, so the cluster does not
/// wait an election timeout (etcd does the same on graceful stop).
async fn hand_over_leadership(node: &RaftNode) {
    let m = node.raft.metrics().borrow_watched().clone();
    if m.current_leader != Some(node.id) {
        return;
    }
    let Some(to) = m
        .membership_config
        .membership()
        .voter_ids()
        .find(|v| *v != node.id)
    else {
        return;
    };
    tracing::info!(to = %format!("{to:x}"), "transferring leadership before stopping");
    if node.raft.trigger().transfer_leader(to).await.is_err() {
        return;
    }
    let mut rx = node.raft.metrics();
    let _ = tokio::time::timeout(
        Duration::from_secs(3),
        rx.wait_until(|m: &openraft::RaftMetrics<crate::raft::TypeConfig>| {
            m.current_leader.is_some_and(|l| l != node.id)
        }),
    )
    .await;
}
