//! Serving, the middle stage of [`crate::server::run`]: the peer protocol, the client services and
//! their JSON gateway, the metrics listener, and the member's background duties (lease
//! expiry, peer probes, publishing its attributes).
//!
//! Invariants:
//! - Every server stops accepting when the shared stop signal is raised; background duties
//!   are aborted by [`Serving::stop_background`] before Raft shuts down, so none of them
//!   proposes into a stopping node.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::Routes;

use crate::proto::etcdserverpb::auth_server::AuthServer;
use crate::proto::etcdserverpb::cluster_server::ClusterServer;
use crate::proto::etcdserverpb::kv_server::KvServer;
use crate::proto::etcdserverpb::lease_server::LeaseServer;
use crate::proto::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::proto::etcdserverpb::watch_server::WatchServer;
use crate::proto::kvdpb::peer_server::PeerServer;
use crate::proto::kvdpb::{internal_request, InternalRequest, MemberAttributes};
use crate::proto::v3electionpb::election_server::ElectionServer;
use crate::proto::v3lockpb::lock_server::LockServer;
use crate::raft::net::links::Links;
use crate::raft::net::network::MAX_PEER_MESSAGE;
use crate::raft::peer_service::{LeaderDuties, PeerService};
use crate::raft::RaftNode;
use crate::server::api::client_dispatch::ClientDispatch;
use crate::server::api::cluster;
use crate::server::api::election;
use crate::server::api::kv;
use crate::server::api::learner::LearnerGuard;
use crate::server::api::lease;
use crate::server::api::local_client;
use crate::server::api::lock;
use crate::server::api::maintenance;
use crate::server::api::watches;
use crate::server::config::Config;
use crate::server::context::ServerCtx;
use crate::server::duties::compactor;
use crate::server::duties::leader_duties;
use crate::server::gateway;
use crate::server::lifecycle::start::{Listeners, MemberDir};
use crate::server::membership;
use crate::server::observe;
use crate::server::tls::acceptor;

/// What a serving member runs, to be stopped in order.
pub struct Serving {
    /// Peer and client servers: they finish their connections after the stop signal.
    pub servers: Vec<JoinHandle<Result<(), tonic::transport::Error>>>,
    /// Metrics listeners and the leader watcher: aborted at the end.
    pub aux: Vec<JoinHandle<()>>,
    /// Lease expiry, peer probes, publishing: aborted before Raft shuts down.
    background: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    /// Raised when the leader tells this member it has been removed; held here so that the
    /// removal watch never sees every sender gone while the member serves.
    _removed_tx: watch::Sender<bool>,
    pub removed_rx: watch::Receiver<bool>,
}

impl Serving {
    pub fn stop_background(&self) {
        for t in &self.background {
            t.abort();
        }
    }

    /// Tells every server to stop accepting.
    pub fn stop_servers(&self) {
        let _ = self.stop.send(true);
    }
}

/// Resolves when the stop signal is raised.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Starts every server and background duty of the member.
pub fn serve(
    cfg: &Config,
    member: &MemberDir,
    node: &RaftNode,
    links: Links,
    listeners: Listeners,
) -> Serving {
    let cluster_id = member.ident.cluster_id;
    let reconfig = Arc::new(membership::Reconfig::new(
        node.clone(),
        links.clone(),
        cluster_id,
        cfg.initial_cluster_token.clone(),
    ));
    let (removed_tx, removed_rx) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);

    let mut servers = peer_servers(
        cfg,
        member,
        node,
        &reconfig,
        &removed_tx,
        listeners.peer,
        &stop_rx,
    );
    let ctx = server_ctx(cfg, node, cluster_id, reconfig);
    // etcd lets the transport accept max-request-bytes plus 512 KiB of gRPC overhead, and
    // checks the request itself against max-request-bytes.
    let max_msg = cfg.max_request_bytes + 512 * 1024;
    let services = client_services(cfg, member, &ctx, max_msg);
    crate::metrics::set_extensive(cfg.metrics_extensive);
    let scrape = observe::Scrape::new(node.clone(), cfg.quota_backend_bytes);
    let mut aux = vec![tokio::spawn(scrape.clone().watch_leader())];
    servers.extend(client_servers(
        cfg,
        member,
        node,
        &services,
        &scrape,
        listeners.client,
        &stop_rx,
    ));
    aux.extend(metrics_listeners(listeners.metrics, &scrape, &stop_rx));
    let background = background_duties(cfg, &ctx, links, &removed_tx);
    tracing::info!("ready to serve client requests");
    Serving {
        servers,
        aux,
        background,
        stop,
        _removed_tx: removed_tx,
        removed_rx,
    }
}

/// One peer-protocol server per peer listener, answering for the leader's duties when leader.
fn peer_servers(
    cfg: &Config,
    member: &MemberDir,
    node: &RaftNode,
    reconfig: &Arc<membership::Reconfig>,
    removed_tx: &watch::Sender<bool>,
    listeners: Vec<TcpListener>,
    stop_rx: &watch::Receiver<bool>,
) -> Vec<JoinHandle<Result<(), tonic::transport::Error>>> {
    let cluster_id = member.ident.cluster_id;
    let duties: Arc<dyn LeaderDuties> = Arc::new(leader_duties::ServerDuties {
        node: node.clone(),
        reconfig: reconfig.clone(),
    });
    let mut servers = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let svc = PeerServer::new(PeerService {
            node: node.clone(),
            cluster_id,
            duties: duties.clone(),
            removed: removed_tx.clone(),
        })
        .max_decoding_message_size(MAX_PEER_MESSAGE)
        .max_encoding_message_size(MAX_PEER_MESSAGE);
        let router = tonic::transport::Server::builder().add_service(svc);
        let stop = stopped(stop_rx.clone());
        servers.push(
            match tls_for(&cfg.tls.listen_peer_https, i, &member.tls.peer_server) {
                Some(tls) => tokio::spawn(
                    router.serve_with_incoming_shutdown(acceptor::incoming(l, tls, false), stop),
                ),
                None => tokio::spawn(router.serve_with_incoming_shutdown(incoming(l), stop)),
            },
        );
    }
    servers
}

/// What every client service shares: the node, the limits, quota, passwords and tokens.
fn server_ctx(
    cfg: &Config,
    node: &RaftNode,
    cluster_id: u64,
    reconfig: Arc<membership::Reconfig>,
) -> ServerCtx {
    let ctx = ServerCtx {
        node: node.clone(),
        cluster_id,
        max_request_bytes: cfg.max_request_bytes,
        max_txn_ops: cfg.max_txn_ops,
        reconfig,
        quota: Arc::new(crate::server::duties::quota::Quota::new(
            cfg.quota_backend_bytes,
            {
                let node = node.clone();
                move || node.db_dir()
            },
        )),
        passwords: Arc::new(crate::server::api::auth::Passwords::new(
            cfg.auth.bcrypt_cost,
        )),
        jwt: cfg.auth.jwt.clone(),
    };
    node.auth().tokens.set_ttl(cfg.auth.token_ttl);
    ctx
}

/// One client server per client listener, serving gRPC and the JSON gateway on one port.
fn client_servers(
    cfg: &Config,
    member: &MemberDir,
    node: &RaftNode,
    services: &gateway::Services,
    scrape: &observe::Scrape,
    listeners: Vec<TcpListener>,
    stop_rx: &watch::Receiver<bool>,
) -> Vec<JoinHandle<Result<(), tonic::transport::Error>>> {
    let mut servers = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        // HTTP/1.1 for the JSON gateway; gRPC stays on HTTP/2 (hyper tells them apart by the
        // HTTP/2 preface), as etcd multiplexes both on its client port.
        let server = tonic::transport::Server::builder().accept_http1(true);
        let dispatch = client_dispatch(services, node, scrape);
        let stop = stopped(stop_rx.clone());
        servers.push(
            match tls_for(&cfg.tls.listen_client_https, i, &member.tls.client_server) {
                Some(tls) => tokio::spawn(server.serve_with_incoming_shutdown(
                    dispatch,
                    acceptor::incoming(l, tls, member.tls.client_cert_auth),
                    stop,
                )),
                None => {
                    if member.tls.client_cert_auth {
                        // As etcd: the operator asked for this listener; say what it lacks.
                        tracing::warn!(
                            address = ?cfg.listen_client.get(i),
                            "plain-text client listener: --client-cert-auth does not apply to it"
                        );
                    }
                    tokio::spawn(server.serve_with_incoming_shutdown(dispatch, incoming(l), stop))
                }
            },
        );
    }
    servers
}

/// One metrics server per metrics listener.
fn metrics_listeners(
    listeners: Vec<TcpListener>,
    scrape: &observe::Scrape,
    stop_rx: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut aux = Vec::new();
    for l in listeners {
        let fut = observe::serve(l, scrape.clone(), stopped(stop_rx.clone()));
        aux.push(tokio::spawn(async move {
            if let Err(e) = fut.await {
                tracing::warn!("metrics listener: {e}");
            }
        }));
    }
    aux
}

/// The member's duties beside serving: lease expiry, peer probes, publishing its attributes,
/// and the corruption checks and compactions the flags ask for.
fn background_duties(
    cfg: &Config,
    ctx: &ServerCtx,
    links: Links,
    removed_tx: &watch::Sender<bool>,
) -> Vec<JoinHandle<()>> {
    let node = &ctx.node;
    let mut background = vec![
        tokio::spawn(lease::lessor_duties(node.clone())),
        tokio::spawn(crate::raft::prober::run(
            node.clone(),
            links,
            ctx.cluster_id,
            removed_tx.clone(),
        )),
        tokio::spawn(publish(
            node.clone(),
            cfg.name.clone(),
            cfg.advertise_client_urls.clone(),
        )),
    ];
    if !cfg.corrupt_check_time.is_zero() {
        background.push(tokio::spawn(crate::server::duties::corrupt::monitor(
            node.clone(),
            cfg.corrupt_check_time,
        )));
    }
    if let Some(mode) = cfg.auto_compaction {
        background.push(tokio::spawn(compactor::run(
            compactor::Member(ctx.clone()),
            mode,
        )));
    }
    background
}

/// The etcd services, each refusing what a learner must not answer.
fn client_services(
    cfg: &Config,
    member: &MemberDir,
    ctx: &ServerCtx,
    max_msg: usize,
) -> gateway::Services {
    let node = &ctx.node;
    let recipes = local_client::LocalClient::new(ctx.clone());
    gateway::Services {
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
                backup_dir: member.backup_dir(),
            })
            .max_decoding_message_size(max_msg),
            node.clone(),
        ),
        lock: LearnerGuard::new(
            LockServer::new(lock::LockService::new(recipes.clone()))
                .max_decoding_message_size(max_msg),
            node.clone(),
        ),
        election: LearnerGuard::new(
            ElectionServer::new(election::ElectionService::new(recipes))
                .max_decoding_message_size(max_msg)
                .max_encoding_message_size(usize::MAX),
            node.clone(),
        ),
        auth: LearnerGuard::new(
            AuthServer::new(crate::server::api::auth::AuthService { ctx: ctx.clone() })
                .max_decoding_message_size(max_msg),
            node.clone(),
        ),
    }
}

/// A client listener's service: the etcd gRPC services, and a router with the JSON gateway and
/// its plain endpoints, `/metrics` (as etcd's client port), and a fallback that answers gRPC
/// calls to unknown services with `Unimplemented` and anything else with 404.
fn client_dispatch(
    services: &gateway::Services,
    node: &RaftNode,
    scrape: &observe::Scrape,
) -> ClientDispatch {
    let rest = gateway::router(services.clone(), node.clone(), services.max_msg)
        .merge(observe::metrics_router(scrape.clone()))
        .fallback(gateway::not_found);
    ClientDispatch::new(services.clone(), Routes::from(rest))
}

/// The TLS config for the `i`th listener of a kind: only `https://` listeners speak TLS (an
/// `http://` one next to them is plain, as in etcd).
fn tls_for(
    https: &[bool],
    i: usize,
    config: &Option<Arc<rustls::ServerConfig>>,
) -> Option<Arc<rustls::ServerConfig>> {
    if https.get(i).copied().unwrap_or(false) {
        config.clone()
    } else {
        None
    }
}

/// Accepted connections with Nagle's algorithm off. Small gRPC responses (append acks,
/// reads) otherwise wait for the peer's delayed ACK, tens of milliseconds each; tonic sets
/// TCP_NODELAY only on listeners it binds itself.
fn incoming(l: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true))
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
        ..Default::default()
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
