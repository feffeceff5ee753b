//! Fault injection for real clusters: a fault-injecting TCP proxy on every member-to-member
//! link and in front of every member's client port, and a cluster wrapper that routes peer
//! traffic through them (`KVD_TEST_PEER_DIAL_OVERRIDE`) and kills, pauses, partitions and
//! delays members, cuts clients off from them, and adds and retires members at run time.
//!
//! Proxy P(x,y) listens on its own port and forwards to member y's peer port; member x dials
//! y's peer URL through it. Proxy C(y) forwards to member y's client port; clients that should
//! see client-side faults dial it instead of y. Changing a proxy between passing and dropping
//! closes its open connections, so a healed link starts from fresh HTTP/2 connections rather
//! than from a byte stream with a hole in it (what a real partition followed by a TCP reset
//! looks like). Entering [`LinkMode::Drop`] closes open connections too; entering the other
//! dropping modes ([`LinkMode::Hang`], one-way drops) does not: open connections lose bytes
//! silently, so requests already on them hang (or take effect with their replies lost) until
//! the caller's timeout, as behind a real partition.
//!
//! Member slots: [`ProxiedCluster::start_with_spares`] prepares slots for members added later
//! (ports, proxies, dial overrides), because a member reads its dial overrides only at start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvd::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use kvd::proto::etcdserverpb::StatusRequest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::{try_channel, Cluster};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkMode {
    Pass,
    /// Blackhole: connections are accepted, nothing is forwarded either way; open connections
    /// are closed when this mode is entered.
    Drop,
    /// Blackhole that keeps open connections open: their bytes vanish both ways (requests on
    /// them hang), new connections are accepted and swallowed.
    Hang,
    /// Bytes from the dialing side are lost; replies (if any) still flow. Open connections
    /// stay open.
    DropRequests,
    /// Bytes to the dialing side are lost: requests arrive (and may take effect), their
    /// replies never do. Open connections stay open.
    DropReplies,
    /// Every chunk is delivered this much later.
    Delay(Duration),
}

impl LinkMode {
    /// (drop what the dialing side sends, drop what it receives).
    fn drops(self) -> (bool, bool) {
        match self {
            LinkMode::Drop | LinkMode::Hang => (true, true),
            LinkMode::DropRequests => (true, false),
            LinkMode::DropReplies => (false, true),
            _ => (false, false),
        }
    }
}

/// Tells a proxy's open connections to close: `reset` closes them with a TCP RST.
#[derive(Clone, Copy, Default)]
struct Close {
    epoch: u64,
    reset: bool,
}

/// A TCP proxy with a switchable fault mode. Runs until dropped.
pub struct Proxy {
    pub port: u16,
    mode: Arc<Mutex<LinkMode>>,
    /// Bumped when existing connections must close.
    close: watch::Sender<Close>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(Mutex::new(LinkMode::Pass));
        let (close, _) = watch::channel(Close::default());
        let (m, e) = (mode.clone(), close.clone());
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                tokio::spawn(serve(sock, upstream_port, m.clone(), e.subscribe()));
            }
        });
        Proxy {
            port,
            mode,
            close,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn mode(&self) -> LinkMode {
        *self.mode.lock().unwrap()
    }

    pub fn set(&self, mode: LinkMode) {
        let old = std::mem::replace(&mut *self.mode.lock().unwrap(), mode);
        // Drop closes what is open; the other dropping modes leave open connections open, to
        // lose their bytes silently (a one-way cut or a partition does not close anything).
        // Leaving a dropping mode closes connections: their byte streams have holes.
        let entering_silent_cut = old.drops() == (false, false) && mode != LinkMode::Drop;
        if old.drops() != mode.drops() && !entering_silent_cut {
            self.close_all(false);
        }
    }

    /// Resets every open connection (TCP RST to both ends); new connections are served as
    /// the mode says.
    pub fn reset(&self) {
        self.close_all(true);
    }

    fn close_all(&self, reset: bool) {
        self.close.send_modify(|c| {
            c.epoch += 1;
            c.reset = reset;
        });
    }
}

async fn serve(
    mut client: TcpStream,
    upstream_port: u16,
    mode: Arc<Mutex<LinkMode>>,
    mut close: watch::Receiver<Close>,
) {
    let start = close.borrow_and_update().epoch;
    // Resolves with `reset` once the connection must close.
    let closed = async move {
        loop {
            let c = *close.borrow_and_update();
            if c.epoch != start {
                return c.reset;
            }
            if close.changed().await.is_err() {
                return false;
            }
        }
    };
    if matches!(*mode.lock().unwrap(), LinkMode::Drop | LinkMode::Hang) {
        // Blackhole: hold the connection, swallow what arrives, until the mode changes.
        let (mut r, _w) = client.split();
        let swallow = async move {
            let mut buf = vec![0u8; 16 << 10];
            while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
        };
        let reset = tokio::select! { _ = swallow => false, r = closed => r };
        if reset {
            let _ = client.set_zero_linger();
        }
        return;
    }
    let Ok(Ok(mut upstream)) = tokio::time::timeout(
        Duration::from_secs(1),
        TcpStream::connect(("127.0.0.1", upstream_port)),
    )
    .await
    else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    let reset = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        let fwd = pump(cr, uw, mode.clone(), true);
        let back = pump(ur, cw, mode, false);
        tokio::select! { _ = fwd => false, _ = back => false, r = closed => r }
    };
    if reset {
        // SO_LINGER 0: closing sends RST instead of FIN, to both ends.
        let _ = client.set_zero_linger();
        let _ = upstream.set_zero_linger();
    }
}

/// Copies one direction, applying the link's current mode to each chunk.
async fn pump(
    mut r: impl AsyncRead + Unpin,
    mut w: impl AsyncWrite + Unpin,
    mode: Arc<Mutex<LinkMode>>,
    forward: bool,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if w.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let m = *mode.lock().unwrap();
            let (drop_fwd, drop_back) = m.drops();
            if (forward && drop_fwd) || (!forward && drop_back) {
                continue;
            }
            let delay = match m {
                LinkMode::Delay(d) => d,
                _ => Duration::ZERO,
            };
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    tokio::join!(reader, writer);
}

/// A cluster whose member-to-member links all go through [`Proxy`]s, with a [`Proxy`] in front
/// of every member's client port.
pub struct ProxiedCluster {
    pub c: Cluster,
    /// (from, to) -> the proxy `from` dials `to` through.
    pub links: HashMap<(usize, usize), Proxy>,
    /// Slot i -> the proxy in front of member i's client port.
    pub client_proxies: Vec<Proxy>,
    /// Slots of the current members (started, not retired), in the order they joined.
    pub live: Vec<usize>,
}

impl ProxiedCluster {
    /// Starts `n` members (with `extra` flags each) and waits for a leader.
    pub async fn start(n: usize, extra: &[&str]) -> ProxiedCluster {
        Self::start_with_spares(n, 0, extra).await
    }

    /// Like [`start`](Self::start), with `spares` more slots (`m{n}`, `m{n+1}`, ...) for
    /// members added at run time ([`join`](Self::join)): their ports, proxies and every
    /// member's dial overrides for them exist from the start.
    pub async fn start_with_spares(n: usize, spares: usize, extra: &[&str]) -> ProxiedCluster {
        Self::start_with_spares_tls(n, spares, extra, false).await
    }

    /// Like [`start_with_spares`](Self::start_with_spares); with `peer_tls` every member
    /// speaks mutual TLS to its peers (through the same TCP proxies).
    pub async fn start_with_spares_tls(
        n: usize,
        spares: usize,
        extra: &[&str],
        peer_tls: bool,
    ) -> ProxiedCluster {
        let mut c = Cluster {
            // KVD_KEEP_DIRS keeps data dirs and member logs for post-mortems.
            dir: tempfile::Builder::new()
                .prefix("kvd-chaos-")
                .disable_cleanup(std::env::var_os("KVD_KEEP_DIRS").is_some())
                .tempdir()
                .unwrap(),
            members: Vec::new(),
            initial_cluster: String::new(),
            use_env: false,
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
        };
        let slots = n + spares;
        for i in 0..slots {
            c.new_member(&format!("m{i}"));
            if peer_tls {
                c.make_tls(i, false);
            }
        }
        c.initial_cluster = c.members[..n]
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let mut links = HashMap::new();
        for x in 0..slots {
            for y in 0..slots {
                if x != y {
                    links.insert((x, y), Proxy::start(c.members[y].peer_port).await);
                }
            }
        }
        let mut client_proxies = Vec::new();
        for m in &c.members {
            client_proxies.push(Proxy::start(m.client_port).await);
        }
        let mut pc = ProxiedCluster {
            c,
            links,
            client_proxies,
            live: (0..n).collect(),
        };
        for i in 0..n {
            pc.restart(i);
        }
        pc.c.wait_for_leader(Duration::from_secs(20)).await;
        pc
    }

    /// Number of member slots (started or not).
    pub fn n(&self) -> usize {
        self.c.members.len()
    }

    fn env_for(&self, i: usize) -> Vec<(String, String)> {
        let map = (0..self.n())
            .filter(|&y| y != i)
            .map(|y| {
                format!(
                    "{}={}",
                    self.c.members[y].peer_url(),
                    self.links[&(i, y)].url()
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        vec![(
            kvd::raft::net::dial_override::PEER_DIAL_OVERRIDE_ENV.to_string(),
            map,
        )]
    }

    /// (Re)starts member `i` with its links routed through the proxies.
    pub fn restart(&mut self, i: usize) {
        let env = self.env_for(i);
        self.c.spawn_env(i, &env);
    }

    /// Member `i`'s client URL through its client proxy.
    pub fn proxied_client_url(&self, i: usize) -> String {
        self.client_proxies[i].url()
    }

    /// A slot never started, for a member to add; `None` when all are used.
    pub fn spare(&self) -> Option<usize> {
        (0..self.n()).find(|&i| {
            !self.live.contains(&i)
                && self.c.members[i].child.is_none()
                && !self.c.members[i].data_dir.exists()
        })
    }

    /// Starts slot `i` as a member added at run time, with `--initial-cluster` as the add
    /// response (or the member list) gave it.
    pub fn join(&mut self, i: usize, initial_cluster: String) {
        self.c.members[i].join = Some(initial_cluster);
        self.restart(i);
        self.live.push(i);
    }

    /// Member `i` was removed from the cluster: it is no longer restarted or faulted. A
    /// removed member exits on its own; one still running after `grace` is killed (-9).
    /// Returns whether it exited on its own (`None`: it was not running).
    pub async fn retire(&mut self, i: usize, grace: Duration) -> Option<bool> {
        self.live.retain(|&x| x != i);
        if !self.running(i) {
            return None;
        }
        // A paused member cannot exit.
        self.resume(i);
        let deadline = Instant::now() + grace;
        let exited = loop {
            let child = self.c.members[i].child.as_mut().expect("running");
            if child.try_wait().unwrap().is_some() {
                self.c.members[i].child = None;
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        self.kill9(i);
        Some(exited)
    }

    pub fn running(&self, i: usize) -> bool {
        self.c.members[i].child.is_some()
    }

    pub fn kill9(&mut self, i: usize) {
        self.c.kill(i);
    }

    pub fn pause(&self, i: usize) {
        self.c.signal(i, libc::SIGSTOP);
    }

    pub fn resume(&self, i: usize) {
        self.c.signal(i, libc::SIGCONT);
    }

    pub fn set_link(&self, from: usize, to: usize, mode: LinkMode) {
        self.links[&(from, to)].set(mode);
    }

    /// Cuts `i` off from every other member, both ways.
    pub fn isolate(&self, i: usize) {
        for ((x, y), p) in &self.links {
            if *x == i || *y == i {
                p.set(LinkMode::Drop);
            }
        }
    }

    pub fn set_all_links(&self, mode: LinkMode) {
        for p in self.links.values() {
            p.set(mode);
        }
    }

    /// Every member-to-member link and every client proxy passes again.
    pub fn heal(&self) {
        self.set_all_links(LinkMode::Pass);
        self.set_all_clients(LinkMode::Pass);
    }

    /// Sets the proxy in front of member `i`'s client port.
    pub fn set_client(&self, i: usize, mode: LinkMode) {
        self.client_proxies[i].set(mode);
    }

    pub fn set_all_clients(&self, mode: LinkMode) {
        for p in &self.client_proxies {
            p.set(mode);
        }
    }

    /// Resets (TCP RST) every open client connection to member `i`.
    pub fn reset_clients(&self, i: usize) {
        self.client_proxies[i].reset();
    }

    /// A running member that says it is the leader, asked with short timeouts (a paused or
    /// isolated member may still claim it; that is fine for choosing whom to fault).
    pub async fn claimed_leader(&self) -> Option<usize> {
        for i in 0..self.n() {
            if !self.running(i) {
                continue;
            }
            let url = self.c.members[i].client_url();
            let Ok(Ok(ch)) =
                tokio::time::timeout(Duration::from_millis(300), try_channel(&url)).await
            else {
                continue;
            };
            let st = tokio::time::timeout(
                Duration::from_millis(500),
                MaintenanceClient::new(ch).status(StatusRequest {}),
            )
            .await;
            if let Ok(Ok(st)) = st {
                let st = st.into_inner();
                if st.leader != 0 && st.header.map(|h| h.member_id) == Some(st.leader) {
                    return Some(i);
                }
            }
        }
        None
    }
}
