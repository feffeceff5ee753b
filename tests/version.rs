//! Which build a member is, as operators and upgrade tooling read it: `kvd --version`,
//! `kvctl version`, `/version` on the client port and the `kvd_build_info` metric, from the
//! built binaries and a real member; and the release records (Cargo.toml, releases.tsv,
//! CHANGELOG.md) naming the same release.

mod common;

use std::path::Path;
use std::process::Command;

use common::{free_port, http_get, Cluster};
use kvd::raft::log_format::LOG_FORMAT;
use kvd::server::version::ETCD_VERSION;
use kvd::server::version::{COMMIT, VERSION};

fn run(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(out.status.success(), "{bin} {args:?}: {out:?}");
    assert!(out.stderr.is_empty(), "{bin} {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// HEAD's commit as build.rs names it, if build.rs took the commit from git (not from the
/// builder's `KVD_COMMIT`, nor "unknown" outside a repository).
fn git_head() -> Option<String> {
    if env!("KVD_COMMIT_FROM") != "git" {
        return None;
    }
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8(out.stdout).unwrap().trim().to_string())
}

#[test]
fn kvd_version_names_release_commit_log_format_and_etcd_api() {
    let line = format!(
        "kvd {VERSION} (commit {COMMIT}, log format {LOG_FORMAT}, etcd API {ETCD_VERSION})\n"
    );
    assert_eq!(run(env!("CARGO_BIN_EXE_kvd"), &["--version"]), line);
    assert_eq!(run(env!("CARGO_BIN_EXE_kvd"), &["-V"]), line);
    assert_eq!(VERSION, "0.2.0");
    assert_eq!(LOG_FORMAT, 3);
    match git_head() {
        // build.rs watches HEAD and its branch: a commit since the last build must have
        // rebuilt the binary with the new one.
        Some(head) => assert_eq!(COMMIT, head),
        None => assert!(!COMMIT.is_empty() && !COMMIT.contains(char::is_whitespace)),
    }
}

#[test]
fn kvctl_version_is_etcdctls_and_names_kvd_only_when_asked() {
    let etcdctl = "etcdctl version: 3.4.23\nAPI version: 3.4\n";
    let kvctl = env!("CARGO_BIN_EXE_kvctl");
    assert_eq!(run(kvctl, &["version"]), etcdctl);
    assert_eq!(
        run(kvctl, &["version", "--kvd"]),
        format!(
            "{etcdctl}kvd version: {VERSION} (commit {COMMIT}, log format {LOG_FORMAT}, \
             etcd API {ETCD_VERSION})\n"
        )
    );
}

/// Cargo.toml's version is this tree's line of releases.tsv (commit "-", the newest) and has
/// its CHANGELOG.md section; releases.tsv is in version order (docs/releases.md).
#[test]
fn release_records_name_this_release() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tsv = std::fs::read_to_string(root.join("releases.tsv")).unwrap();
    let rows: Vec<Vec<&str>> = tsv
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split('\t').collect())
        .collect();
    assert!(rows.iter().all(|r| r.len() == 4), "{rows:?}");
    let semver = |v: &str| -> Vec<u64> { v.split('.').map(|n| n.parse().unwrap()).collect() };
    for pair in rows.windows(2) {
        assert!(semver(pair[0][0]) < semver(pair[1][0]), "{pair:?}");
        let formats: Vec<u32> = pair.iter().map(|r| r[2].parse().unwrap()).collect();
        assert!(formats[0] <= formats[1], "log formats only grow: {pair:?}");
    }
    let this = rows.last().unwrap();
    assert_eq!(
        this[0], VERSION,
        "releases.tsv's newest line is this tree's"
    );
    assert_eq!(
        this[1], "-",
        "this tree's commit is recorded once it is released"
    );
    assert_eq!(this[2], LOG_FORMAT.to_string());
    for r in &rows[..rows.len() - 1] {
        assert!(
            r[1].len() == 40 && r[1].bytes().all(|b| b.is_ascii_hexdigit()),
            "a released build names its full commit: {r:?}"
        );
    }
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap();
    assert!(
        changelog.contains(&format!("\n## [{VERSION}]")),
        "CHANGELOG.md has no section for {VERSION}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_endpoint_and_build_info_metric_name_the_build() {
    let metrics = free_port();
    let c = Cluster::start_custom(1, false, |_| {
        vec![format!("--listen-metrics-urls=http://127.0.0.1:{metrics}")]
    })
    .await;
    let client = c.members[0].client_port;

    let (code, body) = http_get(client, "/version").await;
    assert_eq!(code, 200, "{body}");
    // etcd's fields first and unchanged (clients gate on them), then kvd's.
    assert_eq!(
        body,
        format!(
            r#"{{"etcdserver":"{ETCD_VERSION}","etcdcluster":"3.5.0","kvd":"{VERSION}","kvdLogFormat":{LOG_FORMAT}}}"#
        )
    );
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kvd"], "0.2.0");
    assert_eq!(v["kvdLogFormat"], 3);

    // Maintenance.Status keeps reporting the etcd version.
    assert_eq!(c.status(0).await.version, ETCD_VERSION);

    let sample = format!(
        "kvd_build_info{{commit=\"{COMMIT}\",log_format=\"{LOG_FORMAT}\",version=\"{VERSION}\"}} 1\n"
    );
    for port in [metrics, client] {
        let (code, body) = http_get(port, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            body.contains(&format!("# TYPE kvd_build_info gauge\n{sample}")),
            "port {port}:\n{body}"
        );
    }

    // A lone member raises the cluster's log format to its own soon after it leads.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, body) = http_get(metrics, "/metrics").await;
        assert!(body.contains("\nkvd_apply_stopped 0\n"), "{body}");
        if body.contains(&format!("\nkvd_cluster_log_format {LOG_FORMAT}\n")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cluster's log format never reached {LOG_FORMAT}:\n{body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
