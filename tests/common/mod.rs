//! Cluster test harness: real `kvd` processes on free loopback ports, each with its own data
//! dir, which tests can kill (-9), stop gracefully, pause (SIGSTOP) and restart, on this
//! tree's `kvd` or, per member, on another build (the rolling-upgrade test).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvd::proto::etcdserverpb::cluster_client::ClusterClient;
use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use kvd::proto::etcdserverpb::{
    MemberAddResponse, PutRequest, RangeRequest, StatusRequest, StatusResponse,
};
use kvd::proto::mvccpb::KeyValue;
use tonic::transport::Channel;

pub mod engine;
pub mod faults;
pub mod tls;

/// A loopback port for a member to listen on. Ports come from below the kernel's ephemeral
/// range (32768+ on Linux), so no outgoing connection of another member can take one between
/// here and the member's bind (that raced when many clusters ran at once: a member never came
/// up). A per-process counter keeps tests of one binary from getting the same port; the
/// process id spreads concurrent binaries apart.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `kvd` for a one-member cluster named `name` with its data dir at `data_dir`, on free ports,
/// its output not yet directed: for tests of how the binary starts or refuses to.
pub fn single_member(data_dir: &Path, name: &str) -> Command {
    let (cp, pp) = (free_port(), free_port());
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvd"));
    c.args([
        "--name",
        name,
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--listen-client-urls",
        &format!("http://127.0.0.1:{cp}"),
        "--advertise-client-urls",
        &format!("http://127.0.0.1:{cp}"),
        "--listen-peer-urls",
        &format!("http://127.0.0.1:{pp}"),
        "--initial-advertise-peer-urls",
        &format!("http://127.0.0.1:{pp}"),
        "--initial-cluster",
        &format!("{name}=http://127.0.0.1:{pp}"),
    ]);
    c
}

pub struct MemberProc {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
    /// For a member added at run time: `--initial-cluster` as `member add` printed it, and
    /// `--initial-cluster-state existing`.
    pub join: Option<String>,
    /// Extra command-line arguments, passed as-is after the standard flags.
    pub extra_args: Vec<String>,
    /// `http` or `https` (a TLS cluster, see [`Cluster::start_tls`]).
    pub client_scheme: &'static str,
    pub peer_scheme: &'static str,
    /// The `kvd` binary the member's next start runs; `None` is this tree's.
    pub bin: Option<PathBuf>,
}

impl MemberProc {
    pub fn client_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.client_scheme, self.client_port)
    }
    pub fn peer_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.peer_scheme, self.peer_port)
    }
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub members: Vec<MemberProc>,
    pub initial_cluster: String,
    pub use_env: bool,
    /// Extra `kvd` flags for every member (e.g. a small `--snapshot-count`).
    pub extra_args: Vec<String>,
}

impl Cluster {
    /// Starts `n` members with etcd's flags and waits until a leader serves writes.
    pub async fn start(n: usize) -> Cluster {
        Self::start_with(n, false).await
    }

    /// Like `start`, but configures members through `ETCD_*` environment variables.
    pub async fn start_with(n: usize, use_env: bool) -> Cluster {
        Self::start_opts(n, use_env, &[]).await
    }

    /// Starts `n` members with the same extra flags.
    pub async fn start_opts(n: usize, use_env: bool, extra_args: &[&str]) -> Cluster {
        let extra: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        Self::start_custom(n, use_env, move |_| extra.clone()).await
    }

    /// Like `start_with`, with `extra(i)` appended to member `i`'s command line.
    pub async fn start_custom(
        n: usize,
        use_env: bool,
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        Self::start_custom_in(tempfile::tempdir().unwrap(), n, use_env, extra).await
    }

    /// Starts `n` members with data dirs in memory (`/dev/shm`, else the usual temp dir): for
    /// tests that judge throughput or latency, where a slow shared disk would decide the result.
    pub async fn start_in_memory(n: usize) -> Cluster {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        Self::start_custom_in(dir, n, false, |_| Vec::new()).await
    }

    /// Like `start_custom`, with the members' data dirs and logs in `dir`.
    pub async fn start_custom_in(
        dir: tempfile::TempDir,
        n: usize,
        use_env: bool,
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        let mut c = Self::unstarted(dir, "m", n, extra);
        c.use_env = use_env;
        for i in 0..n {
            c.spawn(i);
        }
        c.wait_for_leader(Duration::from_secs(20)).await;
        c
    }

    /// `n` members named `<prefix>0..` with their data dirs and logs in `dir`, none started
    /// (a test may prepare their data dirs first).
    pub fn unstarted(
        dir: tempfile::TempDir,
        prefix: &str,
        n: usize,
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        let members: Vec<MemberProc> = (0..n)
            .map(|i| MemberProc {
                name: format!("{prefix}{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.path().join(format!("{prefix}{i}.kvd")),
                log: dir.path().join(format!("{prefix}{i}.log")),
                child: None,
                join: None,
                extra_args: extra(i),
                client_scheme: "http",
                peer_scheme: "http",
                bin: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        Cluster {
            dir,
            members,
            initial_cluster,
            use_env: false,
            extra_args: Vec::new(),
        }
    }

    /// Starts `n` members speaking TLS: peers always (mutual TLS with the test binary's shared
    /// CA, see [`tls::pki`]), clients too when `client_tls` (`--client-cert-auth`); every
    /// member has its own certificate (CN = its name). `extra(i)` as in `start_custom`.
    pub async fn start_tls(
        n: usize,
        client_tls: bool,
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        let mut c = Self::unstarted_tls(tempfile::tempdir().unwrap(), "m", n, client_tls, extra);
        for i in 0..n {
            c.spawn(i);
        }
        c.wait_for_leader(Duration::from_secs(20)).await;
        c
    }

    /// Like `unstarted`, for a TLS cluster as [`Cluster::start_tls`] starts it.
    pub fn unstarted_tls(
        dir: tempfile::TempDir,
        prefix: &str,
        n: usize,
        client_tls: bool,
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Cluster {
        let mut c = Self::unstarted(dir, prefix, n, extra);
        for i in 0..n {
            c.make_tls(i, client_tls);
        }
        c.initial_cluster = c
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        c
    }

    /// Gives member `i` its certificate and TLS flags (before it is started).
    pub fn make_tls(&mut self, i: usize, client_tls: bool) {
        let shared = tls::pki();
        let m = &mut self.members[i];
        let cert = shared.pki.issue(
            &format!("{}-{}", m.name, m.peer_port),
            tls::Leaf::new(&m.name, u64::from(m.peer_port)),
        );
        let (c, k, ca) = (
            cert.cert.display().to_string(),
            cert.key.display().to_string(),
            shared.pki.ca_file.display().to_string(),
        );
        m.peer_scheme = "https";
        let mut args = vec![
            format!("--peer-cert-file={c}"),
            format!("--peer-key-file={k}"),
            format!("--peer-trusted-ca-file={ca}"),
            "--peer-client-cert-auth".to_string(),
        ];
        if client_tls {
            m.client_scheme = "https";
            args.extend([
                format!("--cert-file={c}"),
                format!("--key-file={k}"),
                format!("--trusted-ca-file={ca}"),
                "--client-cert-auth".to_string(),
            ]);
        }
        m.extra_args.splice(0..0, args);
    }

    pub fn spawn(&mut self, i: usize) {
        self.spawn_env(i, &[]);
    }

    /// Like `spawn`, with extra environment variables for the member's process.
    pub fn spawn_env(&mut self, i: usize, env: &[(String, String)]) {
        let m = &self.members[i];
        let args: Vec<(&str, String)> = vec![
            ("name", m.name.clone()),
            ("data-dir", m.data_dir.display().to_string()),
            ("listen-client-urls", m.client_url()),
            ("advertise-client-urls", m.client_url()),
            ("listen-peer-urls", m.peer_url()),
            ("initial-advertise-peer-urls", m.peer_url()),
            (
                "initial-cluster",
                m.join.clone().unwrap_or(self.initial_cluster.clone()),
            ),
            (
                "initial-cluster-state",
                if m.join.is_some() { "existing" } else { "new" }.into(),
            ),
            ("initial-cluster-token", "test-cluster".into()),
        ];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .unwrap();
        let bin = m
            .bin
            .clone()
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kvd")));
        let mut cmd = Command::new(bin);
        for (k, v) in args {
            if self.use_env {
                cmd.env(format!("ETCD_{}", k.to_uppercase().replace('-', "_")), v);
            } else {
                cmd.arg(format!("--{k}={v}"));
            }
        }
        cmd.args(&self.extra_args);
        cmd.args(&m.extra_args);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        // No KVD_LOG: members log with kvd's default filter, which the log-volume tests judge.
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = cmd.spawn().expect("spawn kvd");
        self.members[i].child = Some(child);
    }

    /// Prepares (does not start) a member to be added at run time; returns its index.
    pub fn new_member(&mut self, name: &str) -> usize {
        let dir = self.dir.path();
        self.members.push(MemberProc {
            name: name.to_string(),
            client_port: free_port(),
            peer_port: free_port(),
            data_dir: dir.join(format!("{name}.kvd")),
            log: dir.join(format!("{name}.log")),
            child: None,
            join: None,
            extra_args: Vec::new(),
            client_scheme: "http",
            peer_scheme: "http",
            bin: None,
        });
        self.members.len() - 1
    }

    pub async fn cluster(&self, i: usize) -> ClusterClient<Channel> {
        ClusterClient::new(channel(&self.members[i].client_url()).await)
    }

    /// Waits for member `i`'s process to exit on its own.
    pub fn wait_exit(&mut self, i: usize, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let c = self.members[i].child.as_mut()?;
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                self.members[i].child = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, i: usize, sig: i32) {
        unsafe {
            libc::kill(self.members[i].pid(), sig);
        }
    }

    /// kill -9 of every member, then all restart on their data dirs (a whole-cluster crash).
    pub fn kill_all_and_restart(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        for i in 0..self.members.len() {
            self.spawn(i);
        }
    }

    /// kill -9.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for exit (graceful stop).
    pub fn stop(&mut self, i: usize) -> std::process::ExitStatus {
        self.signal(i, libc::SIGTERM);
        let mut c = self.members[i].child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("member {i} did not stop on SIGTERM\n{}", self.log_of(i));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops member `i` gracefully (SIGTERM, waits for exit) and starts it again on its data
    /// dir with the binary `bin` (an upgrade or a downgrade of one member). Its log gets a line
    /// saying so, to tell the two processes' output apart. Returns how the old process exited.
    pub fn restart_on(&mut self, i: usize, bin: &Path) -> std::process::ExitStatus {
        use std::io::Write;
        let st = self.stop(i);
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.members[i].log)
        {
            let _ = writeln!(
                f,
                "=== test harness: stopped ({st}); starting {}",
                bin.display()
            );
        }
        self.members[i].bin = Some(bin.to_path_buf());
        self.spawn(i);
        st
    }

    pub fn log_of(&self, i: usize) -> String {
        std::fs::read_to_string(&self.members[i].log).unwrap_or_default()
    }

    pub async fn kv(&self, i: usize) -> KvClient<Channel> {
        KvClient::new(channel(&self.members[i].client_url()).await)
    }

    pub async fn maintenance(&self, i: usize) -> MaintenanceClient<Channel> {
        MaintenanceClient::new(channel(&self.members[i].client_url()).await)
    }

    /// Member `i`'s Maintenance.Status answer (panics if it fails).
    /// The active alarms as member `i` lists them: (member id, alarm type).
    pub async fn alarms(&self, i: usize) -> Vec<(u64, i32)> {
        let r = self
            .maintenance(i)
            .await
            .alarm(kvd::proto::etcdserverpb::AlarmRequest::default())
            .await
            .unwrap()
            .into_inner();
        r.alarms.iter().map(|a| (a.member_id, a.alarm)).collect()
    }

    pub async fn status(&self, i: usize) -> StatusResponse {
        self.maintenance(i)
            .await
            .status(StatusRequest {})
            .await
            .unwrap()
            .into_inner()
    }

    /// Index of the member every running member agrees is leader.
    pub async fn leader(&self) -> Option<usize> {
        let mut seen = None;
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let Ok(Ok(ch)) =
                tokio::time::timeout(Duration::from_millis(500), try_channel(&m.client_url()))
                    .await
            else {
                return None;
            };
            let Ok(Ok(st)) = tokio::time::timeout(
                Duration::from_millis(500),
                MaintenanceClient::new(ch).status(StatusRequest {}),
            )
            .await
            else {
                return None;
            };
            let st = st.into_inner();
            if st.leader == 0 || seen.is_some_and(|l| l != st.leader) {
                return None;
            }
            seen = Some(st.leader);
            let _ = i;
        }
        let leader_id = seen?;
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let mut c = self.maintenance(i).await;
            if let Ok(st) = c.status(StatusRequest {}).await {
                if st.into_inner().header.unwrap().member_id == leader_id {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Waits until member `i` (plain HTTP) has applied the cluster log format this build
    /// writes. The leader raises it once it has heard every member; a member stopped before
    /// that keeps the cluster at the oldest format while it is down, and requests that need a
    /// newer one (auth changes, alarms) are refused meanwhile, so a test that stops a member
    /// right after the start waits for this first.
    pub async fn wait_for_log_format(&self, i: usize, timeout: Duration) {
        let want = format!(
            "\nkvd_cluster_log_format {}\n",
            kvd::raft::log_format::LOG_FORMAT
        );
        let deadline = Instant::now() + timeout;
        loop {
            let (_, body) = http_get(self.members[i].client_port, "/metrics").await;
            if body.contains(&want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "member {i} never applied the cluster log format {}",
                kvd::raft::log_format::LOG_FORMAT
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_for_leader(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader().await {
                return l;
            }
            if Instant::now() > deadline {
                let logs: String = (0..self.members.len())
                    .map(|i| format!("--- m{i}\n{}", self.log_of(i)))
                    .collect();
                panic!("no leader within {timeout:?}\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A connected channel; `https://` URLs with the harness's client certificate.
pub async fn try_channel(url: &str) -> Result<Channel, tonic::transport::Error> {
    if url.starts_with("https://") {
        return tls::tls_channel(url, tls::harness_client()).await;
    }
    Channel::from_shared(url.to_string())
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
}

pub async fn channel(url: &str) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match try_channel(url).await {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("connect {url}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

pub async fn put(c: &mut KvClient<Channel>, k: &str, v: &str) -> Result<i64, tonic::Status> {
    let r = c
        .put(PutRequest {
            key: k.into(),
            value: v.into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().header.unwrap().revision)
}

pub async fn get(c: &mut KvClient<Channel>, k: &str) -> Result<Option<String>, tonic::Status> {
    let r = c
        .range(RangeRequest {
            key: k.into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner()
        .kvs
        .first()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
}

/// `--initial-cluster` for a member added as `name`, from the `member add` response (as
/// etcdctl prints it for the new member).
pub fn initial_cluster_for(resp: &MemberAddResponse, name: &str) -> String {
    let new_id = resp.member.as_ref().unwrap().id;
    resp.members
        .iter()
        .flat_map(|m| {
            let n = if m.id == new_id { name } else { &m.name };
            m.peer_ur_ls.iter().map(move |u| format!("{n}={u}"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Key `k` as member `i` holds it (a serializable read: no leader needed).
pub async fn local_get(c: &Cluster, i: usize, k: &str) -> Option<KeyValue> {
    serializable_get(&mut c.kv(i).await, k).await
}

/// Key `k` as the member behind `kv` holds it, on a connection the caller keeps.
pub async fn serializable_get(kv: &mut KvClient<Channel>, k: &str) -> Option<KeyValue> {
    let r = kv
        .range(RangeRequest {
            key: k.into(),
            serializable: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    r.kvs.into_iter().next()
}

/// One plain HTTP/1.0 request (no client crate: the exact bytes matter to some tests):
/// the status code, the head (status line and headers) and the body.
pub async fn http_request(
    method: &str,
    host: &str,
    port: u16,
    path: &str,
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((host, port)).await.unwrap();
    s.write_all(format!("{method} {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, head.to_string(), body.to_string())
}

/// A plain HTTP/1.0 GET of `path` on 127.0.0.1:`port`: the status code and the body.
pub async fn http_get(port: u16, path: &str) -> (u16, String) {
    let (code, _, body) = http_request("GET", "127.0.0.1", port, path).await;
    (code, body)
}

/// Opens a watch on member `i` and waits for its creation; the stream stays open until the
/// returned sender is dropped.
pub async fn open_watch(
    c: &Cluster,
    i: usize,
) -> tokio::sync::mpsc::Sender<kvd::proto::etcdserverpb::WatchRequest> {
    use kvd::proto::etcdserverpb::watch_client::WatchClient;
    use kvd::proto::etcdserverpb::{watch_request::RequestUnion, WatchCreateRequest, WatchRequest};
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let ch = channel(&c.members[i].client_url()).await;
    let mut w = WatchClient::new(ch)
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    w.message().await.unwrap().unwrap();
    // The response stream is kept reading in the background so the member never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = w.message().await {} });
    tx
}
