//! Fault injection for real clusters: a fault-injecting TCP proxy on every member-to-member
//! link, and a cluster wrapper that routes peer traffic through them
//! (`KVD_TEST_PEER_DIAL_OVERRIDE`) and kills, pauses, partitions and delays members.
//!
//! Proxy P(x,y) listens on its own port and forwards to member y's peer port; member x dials
//! y's peer URL through it. Changing a link between passing and dropping closes the link's
//! open connections, so a healed link starts from fresh HTTP/2 connections rather than from a
//! byte stream with a hole in it (what a real partition followed by a TCP reset looks like).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvd::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use kvd::proto::etcdserverpb::StatusRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::{try_channel, Cluster};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkMode {
    Pass,
    /// Blackhole: connections are accepted, nothing is forwarded either way.
    Drop,
    /// Bytes from the dialing member are lost; replies (if any) still flow.
    DropRequests,
    /// Every chunk is delivered this much later.
    Delay(Duration),
}

impl LinkMode {
    fn drops(self) -> (bool, bool) {
        match self {
            LinkMode::Drop => (true, true),
            LinkMode::DropRequests => (true, false),
            _ => (false, false),
        }
    }
}

/// A TCP proxy with a switchable fault mode. Runs until dropped.
pub struct Proxy {
    pub port: u16,
    mode: Arc<Mutex<LinkMode>>,
    /// Bumped when existing connections must close.
    epoch: watch::Sender<u64>,
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
        let (epoch, _) = watch::channel(0u64);
        let (m, e) = (mode.clone(), epoch.clone());
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                tokio::spawn(serve(sock, upstream_port, m.clone(), e.subscribe()));
            }
        });
        Proxy {
            port,
            mode,
            epoch,
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
        if old.drops() != mode.drops() {
            self.epoch.send_modify(|e| *e += 1);
        }
    }
}

async fn serve(
    client: TcpStream,
    upstream_port: u16,
    mode: Arc<Mutex<LinkMode>>,
    mut epoch: watch::Receiver<u64>,
) {
    let start = *epoch.borrow_and_update();
    let closed = async move {
        while *epoch.borrow_and_update() == start {
            if epoch.changed().await.is_err() {
                break;
            }
        }
    };
    if *mode.lock().unwrap() == LinkMode::Drop {
        // Blackhole: hold the connection, swallow what arrives, until the mode changes.
        let (mut r, _w) = client.into_split();
        let swallow = async move {
            let mut buf = vec![0u8; 16 << 10];
            while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
        };
        tokio::select! { _ = swallow => {}, _ = closed => {} }
        return;
    }
    let Ok(Ok(upstream)) = tokio::time::timeout(
        Duration::from_secs(1),
        TcpStream::connect(("127.0.0.1", upstream_port)),
    )
    .await
    else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let fwd = pump(cr, uw, mode.clone(), true);
    let back = pump(ur, cw, mode, false);
    tokio::select! { _ = fwd => {}, _ = back => {}, _ = closed => {} }
}

/// Copies one direction, applying the link's current mode to each chunk.
async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
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

/// A cluster whose member-to-member links all go through [`Proxy`]s.
pub struct ProxiedCluster {
    pub c: Cluster,
    /// (from, to) -> the proxy `from` dials `to` through.
    pub links: HashMap<(usize, usize), Proxy>,
}

impl ProxiedCluster {
    /// Starts `n` members (with `extra` flags each) and waits for a leader.
    pub async fn start(n: usize, extra: &[&str]) -> ProxiedCluster {
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
        for i in 0..n {
            c.new_member(&format!("m{i}"));
        }
        c.initial_cluster = c
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let mut links = HashMap::new();
        for x in 0..n {
            for y in 0..n {
                if x != y {
                    links.insert((x, y), Proxy::start(c.members[y].peer_port).await);
                }
            }
        }
        let mut pc = ProxiedCluster { c, links };
        for i in 0..n {
            pc.restart(i);
        }
        pc.c.wait_for_leader(Duration::from_secs(20)).await;
        pc
    }

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
        vec![(kvd::raft::network::PEER_DIAL_OVERRIDE_ENV.to_string(), map)]
    }

    /// (Re)starts member `i` with its links routed through the proxies.
    pub fn restart(&mut self, i: usize) {
        let env = self.env_for(i);
        self.c.spawn_env(i, &env);
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

    pub fn heal(&self) {
        self.set_all_links(LinkMode::Pass);
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
