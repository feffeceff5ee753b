//! Client and peer TLS against real kvd processes: mutual TLS between members and with
//! clients, what the handshake refuses (no certificate, another CA, expired, revoked, a peer
//! CN that is not allowed), on both ports, certificate rotation without restart, the JSON
//! gateway and /health over https, etcdctl with certificates, auto TLS (and client-cert-auth
//! refused with it), https peer URLs a member cannot dial, and an IP address as SNI.

mod common;

use std::process::Command;
use std::time::Duration;

use common::tls::{self, Leaf, Pki};
use common::{get, put, Cluster};
use kvd::proto::etcdserverpb::cluster_client::ClusterClient;
use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::{MemberAddRequest, MemberListRequest};

fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "5"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_with_peer_and_client_mtls() {
    let c = Cluster::start_tls(3, true, |_| Vec::new()).await;
    let mut kv0 = c.kv(0).await;
    put(&mut kv0, "tls-key", "v1").await.unwrap();
    // Another member reads it back (linearizable: through the leader over peer TLS).
    let mut kv2 = c.kv(2).await;
    assert_eq!(
        get(&mut kv2, "tls-key").await.unwrap().as_deref(),
        Some("v1")
    );
    let members = c
        .cluster(1)
        .await
        .member_list(MemberListRequest::default())
        .await
        .unwrap()
        .into_inner()
        .members;
    assert_eq!(members.len(), 3);
    for m in &members {
        assert!(m.peer_ur_ls[0].starts_with("https://"), "{m:?}");
        assert!(m.client_ur_ls[0].starts_with("https://"), "{m:?}");
    }
    // A member that is cut off and comes back catches up over TLS.
    let mut c = c;
    c.kill(2);
    put(&mut kv0, "tls-key", "v2").await.unwrap();
    c.spawn(2);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(kv) = common::local_get(&c, 2, "tls-key").await {
            if kv.value == b"v2" {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "member 2 did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_refuses_bad_client_certificates() {
    let shared = tls::pki();
    let crl_dir = tempfile::tempdir().unwrap();
    let revoked = shared.pki.issue("revoked", Leaf::new("mallory", 7_000_001));
    let crl = shared
        .pki
        .crl(&format!("crl-{}", std::process::id()), &[revoked.serial]);
    let crl_arg = format!("--client-crl-file={}", crl.display());
    let c = Cluster::start_tls(1, true, move |_| vec![crl_arg.clone()]).await;
    let url = c.members[0].client_url();
    let ca = &shared.pki.ca_file;

    // The harness's certificate works.
    tls::handshake(&url, tls::harness_client()).await.unwrap();
    // No certificate.
    let e = tls::handshake(&url, tls::client_config(ca, None)).await;
    assert!(e.is_err(), "a client without a certificate was let in");
    // A certificate from another CA.
    let other = Pki::new(crl_dir.path(), "other-ca");
    let foreign = other.issue("foreign", Leaf::new("root", 9));
    let e = tls::handshake(&url, tls::client_config(ca, Some(&foreign))).await;
    assert!(e.is_err(), "a certificate of another CA was let in");
    // Expired.
    let mut leaf = Leaf::new("root", 7_000_002);
    leaf.expired = true;
    let expired = shared.pki.issue("expired", leaf);
    let e = tls::handshake(&url, tls::client_config(ca, Some(&expired))).await;
    assert!(e.is_err(), "an expired certificate was let in");
    // Revoked by the CRL.
    let e = tls::handshake(&url, tls::client_config(ca, Some(&revoked))).await;
    assert!(e.is_err(), "a revoked certificate was let in");
    // A gRPC client without a certificate gets no answer.
    let r = tls::tls_channel(&url, tls::client_config(ca, None)).await;
    if let Ok(ch) = r {
        assert!(put(&mut KvClient::new(ch), "k", "v").await.is_err());
    }
    // The server verifies as the client expects: a client trusting another CA refuses it.
    let e = tls::handshake(
        &url,
        tls::client_config(&other.ca_file, Some(&shared.client)),
    )
    .await;
    assert!(e.is_err());
    // Plain text on the https port is no way in either.
    let ch = common::try_channel(&url.replace("https://", "http://")).await;
    if let Ok(ch) = ch {
        assert!(put(&mut KvClient::new(ch), "k", "v").await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_cn_is_not_allowed_is_refused() {
    let shared = tls::pki();
    let c = Cluster::start_tls(1, false, |_| vec!["--peer-cert-allowed-cn=m0".to_string()]).await;
    let url = c.members[0].peer_url();
    let ca = &shared.pki.ca_file;
    let good = shared.pki.issue("peer-good", Leaf::new("m0", 7_000_010));
    let bad = shared
        .pki
        .issue("peer-bad", Leaf::new("intruder", 7_000_011));
    tls::handshake(&url, tls::client_config(ca, Some(&good)))
        .await
        .unwrap();
    assert!(tls::handshake(&url, tls::client_config(ca, Some(&bad)))
        .await
        .is_err());
    // Without a certificate at all.
    assert!(tls::handshake(&url, tls::client_config(ca, None))
        .await
        .is_err());
    // A member with peer TLS takes an https peer URL in member add.
    let r = c
        .cluster(0)
        .await
        .member_add(MemberAddRequest {
            peer_ur_ls: vec!["https://127.0.0.1:3".into()],
            is_learner: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.member.unwrap().peer_ur_ls, vec!["https://127.0.0.1:3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_certificate_files_serve_new_connections_without_restart() {
    let shared = tls::pki();
    let c = Cluster::start_tls(1, true, |_| Vec::new()).await;
    let m = &c.members[0];
    let url = m.client_url();
    let first = tls::handshake(&url, tls::harness_client()).await.unwrap();
    assert_eq!(tls::serial_of(&first), u64::from(m.peer_port));
    // The same files, a new certificate (as a rotation tool replaces them).
    let file = format!("{}-{}", m.name, m.peer_port);
    shared.pki.issue(&file, Leaf::new(&m.name, 7_100_000));
    let second = tls::handshake(&url, tls::harness_client()).await.unwrap();
    assert_eq!(tls::serial_of(&second), 7_100_000);
    // A broken file keeps the last good certificate in use.
    std::fs::write(shared.pki.dir.join(format!("{file}.pem")), "garbage").unwrap();
    let third = tls::handshake(&url, tls::harness_client()).await.unwrap();
    assert_eq!(tls::serial_of(&third), 7_100_000);
    let mut kv = c.kv(0).await;
    put(&mut kv, "after-rotation", "ok").await.unwrap();
    assert!(c.log_of(0).contains("cannot reload TLS certificate"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_gateway_health_and_etcdctl() {
    let shared = tls::pki();
    let c = Cluster::start_tls(1, true, |_| Vec::new()).await;
    let url = c.members[0].client_url();
    let (ca, cert, key) = (
        shared.pki.ca_file.display().to_string(),
        shared.client.cert.display().to_string(),
        shared.client.key.display().to_string(),
    );
    let tls_args = ["--cacert", &ca, "--cert", &cert, "--key", &key];
    let (ok, out) = curl(&[&tls_args[..], &[&format!("{url}/health")]].concat());
    assert!(ok && out.contains("\"health\":\"true\""), "{out}");
    let (ok, out) = curl(&[&tls_args[..], &[&format!("{url}/version")]].concat());
    assert!(ok && out.contains("etcdserver"), "{out}");
    let (ok, out) = curl(
        &[
            &tls_args[..],
            &[
                "-X",
                "POST",
                "-d",
                r#"{"key":"Zm9v","value":"YmFy"}"#,
                &format!("{url}/v3/kv/put"),
            ],
        ]
        .concat(),
    );
    assert!(ok && out.contains("revision"), "{out}");
    // Without a client certificate the handshake fails.
    let (ok, _) = curl(&["--cacert", &ca, &format!("{url}/health")]);
    assert!(!ok);

    let etcdctl = |args: &[&str]| {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                &url,
                "--cacert",
                &ca,
                "--cert",
                &cert,
                "--key",
                &key,
            ])
            .args(["--dial-timeout", "3s", "--command-timeout", "5s"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = etcdctl(&["put", "ctl", "yes"]);
    assert!(ok && out.trim() == "OK", "{out}");
    let (ok, out) = etcdctl(&["get", "ctl", "--print-value-only"]);
    assert!(ok && out.trim() == "yes", "{out}");
    let (ok, out) = etcdctl(&["get", "foo", "--print-value-only"]);
    assert!(ok && out.trim() == "bar", "{out}");
    let (ok, out) = etcdctl(&["endpoint", "health"]);
    assert!(ok && out.contains("is healthy"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_tls_generates_a_certificate_in_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (cp, pp, plain) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    let data = dir.path().join("auto.kvd");
    let log = std::fs::File::create(dir.path().join("auto.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvd"))
        .args([
            "--name=auto",
            &format!("--data-dir={}", data.display()),
            &format!("--listen-client-urls=https://127.0.0.1:{cp},http://127.0.0.1:{plain}"),
            &format!("--advertise-client-urls=https://127.0.0.1:{cp}"),
            &format!("--listen-peer-urls=https://127.0.0.1:{pp}"),
            &format!("--initial-advertise-peer-urls=https://127.0.0.1:{pp}"),
            &format!("--initial-cluster=auto=https://127.0.0.1:{pp}"),
            "--auto-tls",
            "--peer-auto-tls",
        ])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let health = format!("https://127.0.0.1:{cp}/health");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let out = loop {
        let (ok, out) = curl(&["-k", &health]);
        if ok && out.contains("true") {
            break out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no health over auto TLS: {out}\n{}",
            std::fs::read_to_string(dir.path().join("auto.log")).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(out.contains("\"health\":\"true\""));
    assert!(data.join("fixtures/client/cert.pem").exists());
    assert!(data.join("fixtures/client/key.pem").exists());
    assert!(data.join("fixtures/peer/cert.pem").exists());
    // The plain listener next to it answers in plain text.
    let (ok, out) = curl(&[&format!("http://127.0.0.1:{plain}/health")]);
    assert!(ok && out.contains("true"), "{out}");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_peer_urls_without_peer_tls_are_refused() {
    // At start.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvd"))
        .args([
            "--name=x",
            &format!("--data-dir={}", dir.path().join("d").display()),
            "--listen-peer-urls=http://127.0.0.1:1",
            "--initial-advertise-peer-urls=http://127.0.0.1:1",
            "--initial-cluster=x=http://127.0.0.1:1,y=https://127.0.0.1:2",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no peer TLS is configured"), "{err}");
    // At member add, on a plain-text cluster.
    let c = Cluster::start(1).await;
    let mut cl: ClusterClient<_> = c.cluster(0).await;
    let e = cl
        .member_add(MemberAddRequest {
            peer_ur_ls: vec!["https://127.0.0.1:2".into()],
            is_learner: true,
        })
        .await
        .unwrap_err();
    assert_eq!(e.message(), "etcdserver: given member URLs are invalid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_versions_and_cipher_suites_by_etcd_names() {
    let shared = tls::pki();
    let c = Cluster::start_tls(1, true, |_| vec!["--tls-min-version=TLS1.3".to_string()]).await;
    let url = c.members[0].client_url();
    let ca = &shared.pki.ca_file;
    let v12 = tls::client_config_versions(ca, Some(&shared.client), &[&rustls::version::TLS12]);
    assert!(
        tls::handshake(&url, v12).await.is_err(),
        "TLS1.2 below the minimum was accepted"
    );
    let v13 = tls::client_config_versions(ca, Some(&shared.client), &[&rustls::version::TLS13]);
    tls::handshake(&url, v13).await.unwrap();

    // Unknown names stop the member at start, with etcd's messages.
    for (flag, msg) in [
        (
            "--cipher-suites=TLS_NOPE",
            "unexpected TLS cipher suite \"TLS_NOPE\"",
        ),
        (
            "--tls-max-version=TLS1.9",
            "unexpected TLS version \"TLS1.9\"",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = common::single_member(&dir.path().join("d"), "v")
            .arg(flag)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(msg), "{err}");
    }
}

/// Runs kvd with `args` and the given TLS listen URLs; its exit status and stderr, or `None`
/// if it was still running after a few seconds (it started instead of refusing).
fn refused_at_start(args: &[String]) -> Option<(std::process::ExitStatus, String)> {
    let dir = tempfile::tempdir().unwrap();
    let err_file = dir.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvd"))
        .arg(format!("--data-dir={}", dir.path().join("d").display()))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some((status, std::fs::read_to_string(&err_file).unwrap()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    None
}

/// A self-signed auto-TLS certificate names no CA, so client-cert-auth could not be enforced:
/// the member refuses to start and says what to configure, on the peer and the client side.
#[test]
fn client_cert_auth_with_auto_tls_is_refused_at_start() {
    let (cp, pp) = (common::free_port(), common::free_port());
    let peer = format!("https://127.0.0.1:{pp}");
    let base = |client_scheme: &str| {
        vec![
            "--name=a".to_string(),
            format!("--listen-client-urls={client_scheme}://127.0.0.1:{cp}"),
            format!("--advertise-client-urls={client_scheme}://127.0.0.1:{cp}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=a={peer}"),
            "--peer-auto-tls".to_string(),
        ]
    };
    for (extra, scheme, msg) in [
        (
            vec!["--peer-client-cert-auth"],
            "http",
            "--peer-client-cert-auth cannot be enforced with --peer-auto-tls",
        ),
        (
            vec!["--auto-tls", "--client-cert-auth"],
            "https",
            "--client-cert-auth cannot be enforced with --auto-tls",
        ),
    ] {
        let mut args = base(scheme);
        args.extend(extra.iter().map(|s| s.to_string()));
        let (status, err) = refused_at_start(&args)
            .unwrap_or_else(|| panic!("kvd {extra:?} started instead of refusing"));
        assert!(!status.success());
        assert!(err.contains(msg), "{err}");
        assert!(err.contains("trusted-ca-file"), "{err}");
    }
}

/// With a real CA and client-cert-auth, a client without a certificate and one with a
/// certificate from another CA are refused on both ports, over gRPC's HTTP/2 and over
/// HTTP/1.1 (the JSON gateway and /health share the client port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ports_refuse_a_missing_or_foreign_client_certificate() {
    let shared = tls::pki();
    let c = Cluster::start_tls(1, true, |_| Vec::new()).await;
    let ca = &shared.pki.ca_file;
    let dir = tempfile::tempdir().unwrap();
    let other = Pki::new(dir.path(), "other-ca");
    let foreign = other.issue("foreign", Leaf::new("m0", 11));
    for url in [c.members[0].client_url(), c.members[0].peer_url()] {
        tls::handshake(&url, tls::harness_client()).await.unwrap();
        let e = tls::handshake(&url, tls::client_config(ca, None)).await;
        assert!(
            e.is_err(),
            "{url}: a client without a certificate was let in"
        );
        let e = tls::handshake(&url, tls::client_config(ca, Some(&foreign))).await;
        assert!(e.is_err(), "{url}: a certificate of another CA was let in");
        let ca = ca.display().to_string();
        for path in ["/health", "/members", "/v3/kv/range"] {
            let (ok, out) = curl(&["--cacert", &ca, &format!("{url}{path}")]);
            assert!(!ok, "{url}{path} without a certificate: {out}");
            let (ok, out) = curl(&[
                "--cacert",
                &ca,
                "--cert",
                &foreign.cert.display().to_string(),
                "--key",
                &foreign.key.display().to_string(),
                &format!("{url}{path}"),
            ]);
            assert!(!ok, "{url}{path} with another CA's certificate: {out}");
        }
    }
}

/// Clients such as Node's etcd3 send the server's IP address as SNI; rustls ignores it with a
/// warning per connection, which kvd keeps out of its log (etcd says nothing either). The
/// connection itself works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_address_as_sni_is_served_without_a_warning() {
    let shared = tls::pki();
    let c = Cluster::start_tls(1, true, |_| Vec::new()).await;
    let port = c.members[0].client_port.to_string();
    let mut child = Command::new("openssl")
        .args(["s_client", "-quiet"])
        .args(["-connect", &format!("127.0.0.1:{port}")])
        // Sent as the SNI host name, as those clients do.
        .args(["-servername", "127.0.0.1", "-alpn", "http/1.1"])
        .arg("-CAfile")
        .arg(&shared.pki.ca_file)
        .arg("-cert")
        .arg(&shared.client.cert)
        .arg("-key")
        .arg(&shared.client.key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    // -quiet keeps the connection open after stdin ends, until the server closes it.
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        body.contains("\"health\":\"true\""),
        "{body}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = c.log_of(0);
    assert!(!log.contains("Illegal SNI"), "{log}");
    // Real TLS failures are still reported.
    let e = tls::handshake(
        &c.members[0].client_url(),
        tls::client_config(&shared.pki.ca_file, None),
    )
    .await;
    assert!(e.is_err());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !c.log_of(0).contains("rejected connection from") {
        assert!(std::time::Instant::now() < deadline, "{}", c.log_of(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
