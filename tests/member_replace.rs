//! `kvctl member replace` on real processes: a dead member of three and a live one of five
//! replaced (the new member started with the settings the command prints), the refusal when
//! another voter is down, a run killed after the add and run again, and the same command
//! against a real etcd 3.4 cluster (old member dead, and alive) when `etcd` is installed.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{channel, get, put, Cluster};
use kvd::proto::etcdserverpb::cluster_client::ClusterClient;
use kvd::proto::etcdserverpb::{Member, MemberListRequest};

/// A `kvctl member replace` run, its stdout read line by line as it comes.
struct Replace {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: String,
    stderr: std::path::PathBuf,
}

impl Replace {
    fn start(dir: &Path, endpoints: &[String], old: &str, new: &str, peer_url: &str) -> Replace {
        let stderr = dir.join(format!("kvctl-{new}-{}.err", common::free_port()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvctl"))
            .args(["--endpoints", &endpoints.join(",")])
            .args(["--dial-timeout", "1s", "--command-timeout", "5s"])
            .args(["member", "replace", old, "--name", new])
            .args(["--peer-urls", peer_url, "--wait-timeout", "90s"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Replace {
            child,
            lines,
            stdout: String::new(),
            stderr,
        }
    }

    fn output(&self) -> String {
        format!(
            "--- stdout\n{}--- stderr\n{}",
            self.stdout,
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Reads stdout until the start settings are printed; returns ETCD_INITIAL_CLUSTER.
    fn settings(&mut self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut initial = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.stdout += &l;
                    self.stdout.push('\n');
                    if let Some(v) = l.strip_prefix("ETCD_INITIAL_CLUSTER=") {
                        initial = Some(v.trim_matches('"').to_string());
                    }
                    if l.starts_with("ETCD_INITIAL_CLUSTER_STATE=") {
                        return initial.expect("ETCD_INITIAL_CLUSTER before the state");
                    }
                }
                Err(_) => panic!("no start settings within {timeout:?}\n{}", self.output()),
            }
        }
    }

    /// Waits for the command to end; returns its exit code.
    fn wait(&mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(500)) {
                    self.stdout += &l;
                    self.stdout.push('\n');
                }
                return st.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("kvctl still running after {timeout:?}\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Replace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn endpoints(c: &Cluster) -> Vec<String> {
    c.members.iter().map(|m| m.client_url()).collect()
}

async fn members_at(url: &str) -> Vec<Member> {
    ClusterClient::new(channel(url).await)
        .member_list(MemberListRequest { linearizable: true })
        .await
        .unwrap()
        .into_inner()
        .members
}

/// Waits until the cluster `url` belongs to lists exactly `want` voters, all named (NEW has
/// published its name), and no learner.
async fn assert_voters(url: &str, mut want: Vec<String>) {
    want.sort();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ms = members_at(url).await;
        let mut names: Vec<String> = ms.iter().map(|m| m.name.clone()).collect();
        names.sort();
        if names == want && ms.iter().all(|m| !m.is_learner) {
            return;
        }
        assert!(Instant::now() < deadline, "want {want:?}, have {ms:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes keys through the leader for the new member to catch up on.
async fn write_keys(c: &Cluster) {
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let mut kv = c.kv(leader).await;
    for i in 0..20 {
        put(&mut kv, &format!("k{i}"), &format!("v{i}"))
            .await
            .unwrap();
    }
}

/// A member other than the leader (so that no election slows the test down).
async fn follower(c: &Cluster, not: &[usize]) -> usize {
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    (0..c.members.len())
        .find(|i| *i != leader && !not.contains(i))
        .unwrap()
}

/// Replaces member `old` of `c` with a new member named `new`, started once the command has
/// printed its settings; returns the new member's index and the command's output.
async fn replace(c: &mut Cluster, old: usize, new: &str) -> (usize, String) {
    let n = c.new_member(new);
    let mut r = Replace::start(
        c.path(),
        &endpoints(c),
        &c.members[old].name.clone(),
        new,
        &c.members[n].peer_url(),
    );
    c.members[n].join = Some(r.settings(Duration::from_secs(30)));
    c.spawn(n);
    let rc = r.wait(Duration::from_secs(90));
    assert_eq!(rc, 0, "{}\n--- new member\n{}", r.output(), c.log_of(n));
    // What an operator sees, for `--nocapture`.
    eprintln!("{}", r.output());
    (n, r.output())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_dead_one_replaced() {
    let mut c = Cluster::start(3).await;
    write_keys(&c).await;
    let old = follower(&c, &[]).await;
    let old_name = c.members[old].name.clone();
    c.kill(old);

    let (n, out) = replace(&mut c, old, "m3").await;
    assert!(
        out.contains("Start m3 now, with an empty data dir"),
        "{out}"
    );
    assert!(out.contains(&format!("Replaced {old_name} (")), "{out}");
    let mut want: Vec<String> = (0..3)
        .filter(|i| *i != old)
        .map(|i| c.members[i].name.clone())
        .collect();
    want.push("m3".into());
    assert_voters(&c.members[n].client_url(), want).await;
    let mut kv = c.kv(n).await;
    assert_eq!(get(&mut kv, "k19").await.unwrap().as_deref(), Some("v19"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_live_one_replaced() {
    let mut c = Cluster::start(5).await;
    write_keys(&c).await;
    let old = follower(&c, &[]).await;
    let (n, out) = replace(&mut c, old, "m5").await;
    assert!(out.contains("promoted"), "{out}");
    // The removed member learns of its removal and exits on its own.
    assert!(
        c.wait_exit(old, Duration::from_secs(20)).is_some(),
        "{}",
        c.log_of(old)
    );
    let mut want: Vec<String> = (0..5)
        .filter(|i| *i != old)
        .map(|i| c.members[i].name.clone())
        .collect();
    want.push("m5".into());
    assert_voters(&c.members[n].client_url(), want).await;
    let mut kv = c.kv(n).await;
    assert_eq!(get(&mut kv, "k0").await.unwrap().as_deref(), Some("v0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_while_another_voter_is_down() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let before = members_at(&c.members[leader].client_url()).await;
    let dead = follower(&c, &[]).await;
    let old = follower(&c, &[dead]).await;
    c.kill(dead);

    let n = c.new_member("m3");
    let mut r = Replace::start(
        c.path(),
        &endpoints(&c),
        &c.members[old].name.clone(),
        "m3",
        &c.members[n].peer_url(),
    );
    let rc = r.wait(Duration::from_secs(30));
    let out = r.output();
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("refusing to add m3 as a learner")
            && out.contains(&format!("voter {} (", c.members[dead].name)),
        "{out}"
    );
    let after = members_at(&c.members[leader].client_url()).await;
    assert_eq!(before, after, "the member list changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_after_the_add_then_run_again() {
    let mut c = Cluster::start(3).await;
    write_keys(&c).await;
    let old = follower(&c, &[]).await;
    let old_name = c.members[old].name.clone();
    c.kill(old);

    let n = c.new_member("m3");
    let peer = c.members[n].peer_url();
    let mut first = Replace::start(c.path(), &endpoints(&c), &old_name, "m3", &peer);
    let join = first.settings(Duration::from_secs(30));
    // Killed while it waits for the new member, which has not started.
    drop(first);

    c.members[n].join = Some(join);
    c.spawn(n);
    let mut again = Replace::start(c.path(), &endpoints(&c), &old_name, "m3", &peer);
    let rc = again.wait(Duration::from_secs(90));
    let out = again.output();
    assert_eq!(rc, 0, "{out}\n--- new member\n{}", c.log_of(n));
    assert!(
        out.contains("is already a learner: skipping the add"),
        "{out}"
    );
    let mut want: Vec<String> = (0..3)
        .filter(|i| *i != old)
        .map(|i| c.members[i].name.clone())
        .collect();
    want.push("m3".into());
    assert_voters(&c.members[n].client_url(), want).await;

    // A third run finds nothing left to do.
    let mut done = Replace::start(c.path(), &endpoints(&c), &old_name, "m3", &peer);
    assert_eq!(done.wait(Duration::from_secs(30)), 0, "{}", done.output());
    assert!(
        done.output().contains("already replaced"),
        "{}",
        done.output()
    );
}

/// One etcd process of [`etcd_replace`].
struct Etcd {
    name: String,
    client: String,
    peer: String,
    child: Option<Child>,
}

impl Etcd {
    fn new(name: &str) -> Etcd {
        Etcd {
            name: name.into(),
            client: format!("http://127.0.0.1:{}", common::free_port()),
            peer: format!("http://127.0.0.1:{}", common::free_port()),
            child: None,
        }
    }

    fn spawn(&mut self, dir: &Path, initial_cluster: &str, state: &str) {
        let log = std::fs::File::create(dir.join(format!("{}.log", self.name))).unwrap();
        let child = Command::new("etcd")
            .args(["--name", &self.name])
            .arg(format!("--data-dir={}", dir.join(&self.name).display()))
            .args(["--listen-client-urls", &self.client])
            .args(["--advertise-client-urls", &self.client])
            .args(["--listen-peer-urls", &self.peer])
            .args(["--initial-advertise-peer-urls", &self.peer])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "replace-test"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// etcd 3.4 adds a learner only while every voter is connected: with the old member dead the
/// command removes it first (its output says so), with it alive it adds first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_three_members_dead_one_replaced() {
    etcd_replace("etcd_three_members_dead_one_replaced", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_three_members_live_one_replaced() {
    etcd_replace("etcd_three_members_live_one_replaced", false).await;
}

async fn etcd_replace(test: &str, kill_old: bool) {
    if Command::new("etcd").arg("--version").output().is_err() {
        eprintln!("SKIPPED {test}: no `etcd` on PATH (apt-get install -y etcd-server etcd-client)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut es: Vec<Etcd> = (0..3).map(|i| Etcd::new(&format!("e{i}"))).collect();
    let initial = es
        .iter()
        .map(|e| format!("{}={}", e.name, e.peer))
        .collect::<Vec<_>>()
        .join(",");
    for e in &mut es {
        e.spawn(dir.path(), &initial, "new");
    }
    // Served writes, and every member connected for etcd's 5 s health interval, which its
    // strict reconfiguration check wants before a change.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Ok(ch)) =
            tokio::time::timeout(Duration::from_secs(1), common::try_channel(&es[0].client)).await
        {
            let mut kv = kvd::proto::etcdserverpb::kv_client::KvClient::new(ch);
            if put(&mut kv, "k", "v").await.is_ok() {
                break;
            }
        }
        assert!(Instant::now() < deadline, "etcd cluster did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    if kill_old {
        es[2].kill();
    }

    let mut new = Etcd::new("e3");
    let eps: Vec<String> = es.iter().map(|e| e.client.clone()).collect();
    let mut r = Replace::start(dir.path(), &eps, "e2", "e3", &new.peer);
    let join = r.settings(Duration::from_secs(30));
    new.spawn(dir.path(), &join, "existing");
    let rc = r.wait(Duration::from_secs(90));
    let log = std::fs::read_to_string(dir.path().join("e3.log")).unwrap_or_default();
    assert_eq!(rc, 0, "{}\n--- e3\n{log}", r.output());
    eprintln!("{}", r.output());
    assert_eq!(
        r.output().contains("removing e2 (") && r.output().contains(") first"),
        kill_old,
        "{}",
        r.output()
    );
    if !kill_old {
        // The removed member learns of its removal and exits on its own.
        let deadline = Instant::now() + Duration::from_secs(20);
        while es[2].child.as_mut().unwrap().try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "e2 still runs after its removal");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_voters(&new.client, vec!["e0".into(), "e1".into(), "e3".into()]).await;
    let mut kv = kvd::proto::etcdserverpb::kv_client::KvClient::new(channel(&new.client).await);
    // e2 may have led: the read may meet the election that follows its removal.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match get(&mut kv, "k").await {
            Ok(v) => {
                assert_eq!(v.as_deref(), Some("v"));
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
