//! etcd's `--config-file` on real `kvd` processes: a member configured by a YAML file alone
//! (TLS for clients and peers from its `*-transport-security` sections), with the command line
//! and `ETCD_*` variables ignored and named; a file etcd refuses is refused with etcd's message.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::tls::{harness_client, pki, tls_channel, Leaf};
use common::{free_port, get, put};
use kvd::proto::etcdserverpb::kv_client::KvClient;

fn kvd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvd"));
    c.env_remove("ETCD_CONFIG_FILE");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_runs_from_its_config_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let shared = pki();
    let server = shared
        .pki
        .issue("cfg-server", Leaf::new("cfg-server", 4001));
    let (cp, pp) = (free_port(), free_port());
    let data = dir.path().join("from-file");
    let file = dir.path().join("etcd.conf.yml");
    let yaml = format!(
        "# etcd's keys; a comment\n\
         name: cfg0\n\
         data-dir: {data}\n\
         listen-client-urls: https://127.0.0.1:{cp}\n\
         advertise-client-urls: https://127.0.0.1:{cp}\n\
         listen-peer-urls: https://127.0.0.1:{pp}\n\
         initial-advertise-peer-urls: https://127.0.0.1:{pp}\n\
         initial-cluster: cfg0=https://127.0.0.1:{pp}\n\
         initial-cluster-state: 'new'\n\
         snapshot-count: 10000\n\
         log-level: info\n\
         log-outputs: [stderr]\n\
         discovery:\n\
         proxy: 'off'\n\
         not-an-etcd-key: 1\n\
         client-transport-security:\n  cert-file: {cert}\n  key-file: {key}\n  \
         client-cert-auth: true\n  trusted-ca-file: {ca}\n\
         peer-transport-security:\n  cert-file: {cert}\n  key-file: {key}\n  \
         client-cert-auth: true\n  trusted-ca-file: {ca}\n",
        data = data.display(),
        cert = server.cert.display(),
        key = server.key.display(),
        ca = shared.pki.ca_file.display(),
    );
    std::fs::write(&file, yaml).unwrap();
    let ignored_dir = dir.path().join("from-command-line");
    let log = dir.path().join("kvd.log");
    let mut child = kvd()
        .arg(format!("--config-file={}", file.display()))
        .args(["--name", "wrong", "--data-dir"])
        .arg(&ignored_dir)
        // Would hide the info line below if it were read.
        .env("ETCD_LOG_LEVEL", "error")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();

    let url = format!("https://127.0.0.1:{cp}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut kv = loop {
        if let Ok(ch) = tls_channel(&url, harness_client()).await {
            let mut kv = KvClient::new(ch);
            if put(&mut kv, "from", "file").await.is_ok() {
                break kv;
            }
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "kvd exited: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(Instant::now() < deadline, "no TLS write in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(get(&mut kv, "from").await.unwrap().as_deref(), Some("file"));
    // Plain text is not served: the file's https URL is the only client URL.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{cp}"))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        assert!(put(&mut KvClient::new(ch), "k", "v").await.is_err());
    }
    child.kill().unwrap();
    child.wait().unwrap();

    assert!(data.join("member").is_dir(), "data in the file's data-dir");
    assert!(
        !ignored_dir.exists(),
        "the command line's --data-dir is ignored"
    );
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(out.contains("loaded server configuration"), "{out}");
    assert!(
        out.contains("ignored because --config-file is given: --name, --data-dir, ETCD_LOG_LEVEL"),
        "{out}"
    );
    assert!(out.contains("unknown key \"not-an-etcd-key\""), "{out}");
}

/// Runs kvd with `ETCD_CONFIG_FILE` set to a file holding `yaml`: its exit code and stderr.
fn refused_with_file(dir: &Path, yaml: &str) -> (Option<i32>, String) {
    let file = dir.join("bad.yml");
    std::fs::write(&file, yaml).unwrap();
    let out = kvd()
        .env("ETCD_CONFIG_FILE", &file)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_file_etcd_refuses_is_refused_with_etcds_message() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = refused_with_file(dir.path(), "name: a\nheartbeat-interval: \"100\"\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            "json: cannot unmarshal string into Go struct field \
             configYAML.heartbeat-interval of type uint"
        ),
        "{err}"
    );
    let (code, err) = refused_with_file(dir.path(), "discovery-srv: example.com\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--discovery-srv"), "{err}");
    let (code, err) = refused_with_file(dir.path(), "election-timeout: 10\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("election"), "{err}");

    let out = kvd()
        .arg("--config-file=/nonexistent/etcd.yml")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot read /nonexistent/etcd.yml"), "{err}");
    // Nothing was created by the refused starts.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
