//! kubeadm's etcd static pod starts kvd unchanged: the argv kubeadm 1.30-1.33 and 1.34 write
//! into /etc/kubernetes/manifests/etcd.yaml (cmd/kubeadm/app/phases/etcd/local.go,
//! `getEtcdCommand`: its default arguments, sorted by name, for a first control-plane node),
//! with `etcd` replaced by the `kvd` binary.
//!
//! kubeadm listens for clients on 127.0.0.1 and the node's address; 127.0.0.2 stands in for
//! the node's address here. The manifest's TLS flags are a separate case
//! ([`kubeadm_manifest_with_tls`]); the others run with http URLs and without them.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::free_port;
use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::watch_client::WatchClient;
use kvd::proto::etcdserverpb::watch_request::RequestUnion;
use kvd::proto::etcdserverpb::{PutRequest, RangeRequest, WatchCreateRequest, WatchRequest};

/// The warning kvd logs for a flag it accepts without effect.
const NO_EFFECT: &str = "is accepted for etcd compatibility and has no effect";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kubeadm {
    /// 1.30-1.33, and 1.34 with an etcd image older than 3.6: the `experimental-` names.
    V1_30,
    /// 1.34 with etcd 3.6: the feature gate and the non-experimental name.
    V1_34,
}

/// Where one member listens.
struct Ports {
    client: u16,
    peer: u16,
    metrics: u16,
}

impl Ports {
    fn new() -> Ports {
        Ports {
            client: free_port(),
            peer: free_port(),
            metrics: free_port(),
        }
    }
}

/// kubeadm's argv (without `etcd`) for node `node`, in kubeadm's (sorted) order. `scheme` is
/// `https` in the real manifest; `tls` adds the certificate flags from `pki`.
fn manifest(v: Kubeadm, node: &str, data: &Path, p: &Ports, tls: Option<&Path>) -> Vec<String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let (ip, local) = ("127.0.0.2", "127.0.0.1");
    let client = |h: &str| format!("{scheme}://{h}:{}", p.client);
    let peer = format!("{scheme}://{ip}:{}", p.peer);
    let pki = |f: &str| tls.map(|d| d.join(f).display().to_string());
    let mut args: Vec<(&str, Option<String>)> = vec![
        ("advertise-client-urls", Some(client(ip))),
        ("cert-file", pki("server.crt")),
        ("client-cert-auth", tls.map(|_| "true".into())),
        ("data-dir", Some(data.display().to_string())),
    ];
    if v == Kubeadm::V1_30 {
        args.push(("experimental-initial-corrupt-check", Some("true".into())));
        args.push((
            "experimental-watch-progress-notify-interval",
            Some("5s".into()),
        ));
    } else {
        args.push(("feature-gates", Some("InitialCorruptCheck=true".into())));
    }
    args.extend([
        ("initial-advertise-peer-urls", Some(peer.clone())),
        ("initial-cluster", Some(format!("{node}={peer}"))),
        ("key-file", pki("server.key")),
        (
            "listen-client-urls",
            Some(format!("{},{}", client(local), client(ip))),
        ),
        (
            "listen-metrics-urls",
            Some(format!("http://{local}:{}", p.metrics)),
        ),
        ("listen-peer-urls", Some(peer)),
        ("name", Some(node.into())),
        ("peer-cert-file", pki("peer.crt")),
        ("peer-client-cert-auth", tls.map(|_| "true".into())),
        ("peer-key-file", pki("peer.key")),
        ("peer-trusted-ca-file", pki("ca.crt")),
        ("snapshot-count", Some("10000".into())),
        ("trusted-ca-file", pki("ca.crt")),
    ]);
    if v == Kubeadm::V1_34 {
        args.push(("watch-progress-notify-interval", Some("5s".into())));
    }
    args.into_iter()
        .filter_map(|(k, v)| Some(format!("--{k}={}", v?)))
        .collect()
}

/// A running member and its log lines.
struct Member {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Member {
    fn start(args: &[String]) -> Member {
        Member::start_env(args, &[])
    }

    fn start_env(args: &[String], env: &[(&str, &str)]) -> Member {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvd"))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Member {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a log line containing `text`.
    fn wait_log(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.seen.iter().any(|l| l.contains(text)) {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in the log:\n{}",
                self.seen.join("\n")
            );
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(100)) {
                self.seen.push(l);
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                let rest: Vec<String> = self.lines.try_iter().collect();
                panic!(
                    "kvd exited ({s}):\n{}\n{}",
                    self.seen.join("\n"),
                    rest.join("\n")
                );
            }
        }
    }

    fn count(&mut self, text: &str) -> usize {
        self.seen.extend(self.lines.try_iter());
        self.seen.iter().filter(|l| l.contains(text)).count()
    }

    /// SIGTERM, as kubelet stops a static pod, and waits for the exit.
    fn stop(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // A failed assertion must not leave the member running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Plain HTTP/1.0 GET: (status code, body).
async fn http_get(host: &str, port: u16, path: &str) -> (u16, String) {
    let (code, _, body) = common::http_request("GET", host, port, path).await;
    (code, body)
}

/// What kubelet's probes and the API server see: the probes on the metrics URL (where kubeadm
/// points them) and the client port, and KV on both client addresses.
async fn serves_as_kubeadm_expects(p: &Ports) {
    for (host, port) in [
        ("127.0.0.1", p.metrics),
        ("127.0.0.1", p.client),
        ("127.0.0.2", p.client),
    ] {
        assert_eq!(http_get(host, port, "/livez").await, (200, "ok\n".into()));
        assert_eq!(http_get(host, port, "/readyz").await, (200, "ok\n".into()));
        assert_eq!(
            http_get(host, port, "/health").await,
            (200, r#"{"health":"true"}"#.into())
        );
    }
    let (code, metrics) = http_get("127.0.0.1", p.metrics, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("\netcd_server_has_leader 1\n"),
        "{metrics}"
    );
    let put = |host: &'static str| async move {
        let mut kv = KvClient::new(common::channel(&format!("http://{host}:{}", p.client)).await);
        kv.put(PutRequest {
            key: format!("/registry/{host}").into(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
        kv.range(RangeRequest {
            key: b"/registry/".to_vec(),
            range_end: b"/registry0".to_vec(),
            count_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .count
    };
    // Each address reads what the other wrote (the same keys again after a restart).
    put("127.0.0.1").await;
    assert_eq!(put("127.0.0.2").await, 2);
}

/// `--watch-progress-notify-interval=5s` is honoured: an idle watcher that asked for progress
/// hears within a few seconds (etcd's default interval is 10 minutes).
async fn progress_within(p: &Ports, within: Duration) {
    let ch = common::channel(&format!("http://127.0.0.1:{}", p.client)).await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"/idle".to_vec(),
            progress_notify: true,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut s = WatchClient::new(ch)
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let created = s.message().await.unwrap().unwrap();
    assert!(created.created, "{created:?}");
    let progress = tokio::time::timeout(within, s.message())
        .await
        .expect("a progress notification")
        .unwrap()
        .unwrap();
    assert!(
        progress.events.is_empty() && progress.header.is_some(),
        "{progress:?}"
    );
    drop(tx);
}

async fn kubeadm_manifest_starts_kvd(v: Kubeadm) {
    let dir = tempfile::tempdir().unwrap();
    let p = Ports::new();
    let args = manifest(v, "cp-1", &dir.path().join("etcd"), &p, None);
    let mut m = Member::start(&args);
    m.wait_log("ready to serve client requests");
    serves_as_kubeadm_expects(&p).await;
    progress_within(&p, Duration::from_secs(9)).await;
    assert_eq!(
        m.count(NO_EFFECT),
        0,
        "every flag is honoured:\n{}",
        m.seen.join("\n")
    );
    m.stop();

    // The static pod restarts: the initial corruption check runs before serving.
    let mut m = Member::start(&args);
    m.wait_log("starting initial corruption check");
    m.wait_log("ready to serve client requests");
    serves_as_kubeadm_expects(&p).await;
    m.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_1_30_manifest_starts_kvd() {
    kubeadm_manifest_starts_kvd(Kubeadm::V1_30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_1_34_manifest_starts_kvd() {
    kubeadm_manifest_starts_kvd(Kubeadm::V1_34).await;
}

/// `etcd.local.extraArgs` operators commonly add: the ones kvd honours stay quiet, the ones it
/// has no equivalent for are each named in one warning, also when given through `ETCD_*`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_args_without_effect_are_each_warned_about_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = Ports::new();
    let mut args = manifest(Kubeadm::V1_34, "cp-1", &dir.path().join("etcd"), &p, None);
    args.extend(
        [
            "--quota-backend-bytes=8589934592",
            "--auto-compaction-retention=8",
            "--max-snapshots=5",
            "--max-wals=5",
            "--experimental-enable-lease-checkpoint=true",
            "--pre-vote=true",
            "--enable-v2=false",
            "--feature-gates=InitialCorruptCheck=true,StopGRPCServiceOnDefrag=true",
        ]
        .map(String::from),
    );
    // The command line's --feature-gates replaces kubeadm's (Go: the last one wins; clap
    // refuses a repeat, so the test passes it once).
    args.retain(|a| a != "--feature-gates=InitialCorruptCheck=true");
    let mut m = Member::start_env(&args, &[("ETCD_ENABLE_PPROF", "true")]);
    m.wait_log("ready to serve client requests");
    serves_as_kubeadm_expects(&p).await;
    for named in [
        "--max-snapshots=5 ",
        "--max-wals=5 ",
        "--experimental-enable-lease-checkpoint=true ",
        "ETCD_ENABLE_PPROF=true (--enable-pprof) ",
        "--feature-gates=StopGRPCServiceOnDefrag=true ",
    ] {
        let line = format!("{named}{NO_EFFECT}");
        assert_eq!(m.count(&line), 1, "{line}:\n{}", m.seen.join("\n"));
    }
    // Set to what kvd does anyway, or honoured: no warning.
    assert_eq!(m.count(NO_EFFECT), 5, "{}", m.seen.join("\n"));
    // The variable is read by its flag, so it is not also "unrecognized".
    assert_eq!(m.count("unrecognized environment variable"), 0);
    m.stop();
}

/// kubeadm's TLS flags, as its manifest passes them: the member must start with every flag of
/// the real manifest and https URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_manifest_with_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    write_kubeadm_pki(&pki);
    let p = Ports::new();
    for v in [Kubeadm::V1_30, Kubeadm::V1_34] {
        let data = dir.path().join(format!("etcd-{}", v as u8));
        let args = manifest(v, "cp-1", &data, &p, Some(&pki));
        let mut m = Member::start(&args);
        m.wait_log("ready to serve client requests");
        // kubelet probes the plain-http metrics URL.
        for path in ["/livez", "/readyz"] {
            assert_eq!(
                http_get("127.0.0.1", p.metrics, path).await,
                (200, "ok\n".into())
            );
        }
        assert_eq!(m.count(NO_EFFECT), 0, "{}", m.seen.join("\n"));
        m.stop();
    }
}

/// kubeadm's etcd PKI: a CA, a server and a peer certificate (both for server and client
/// auth, for localhost and the node's addresses), as `kubeadm init phase certs etcd-*` writes
/// them.
fn write_kubeadm_pki(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair};
    std::fs::create_dir_all(dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "etcd-ca");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
    for name in ["server", "peer"] {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec![
            "localhost".to_string(),
            "cp-1".to_string(),
            "127.0.0.1".to_string(),
            "127.0.0.2".to_string(),
        ])
        .unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, "cp-1");
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}
