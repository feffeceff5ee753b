//! Rolling upgrade: a 3-member cluster running an old build is upgraded one member at a time to
//! this tree's `kvd` while clients keep writing, and must end with every member holding the
//! same data and every acknowledged write.
//!
//! The old build comes from `tests/upgrade/build_old.sh` (`KVD_OLD_BIN`); `tests/upgrade/ci.sh`
//! builds the previous release and runs this test. It is `#[ignore]`: it needs that build.
//!
//! What it does: 3 members on the old binary; recorded writes (several versions per key, some
//! keys deleted), a compaction, a long lease with keys; writers on unique keys through every
//! member, each acknowledgement recorded with its revision. Then each member in turn is stopped
//! with SIGTERM and restarted on its data dir with the new binary, and waited for until it has
//! caught up. After the first, while the other two still run the old build, the upgraded member
//! is made leader and short leases, a key on each, expire: the new leader revokes them, with
//! whatever log entries it proposes, and the old members must apply the revokes as it does.
//!
//! What it checks, once all members report the same revision, each member read on its own
//! endpoint with serializable reads at that revision:
//! - every key has the same create_revision, mod_revision, version, lease and value everywhere;
//! - HashKV at that revision is the same everywhere;
//! - every acknowledged write is there, at its revision (writers never reuse a key);
//! - the recorded writes' final state, the long lease's keys, and no short lease key is left;
//! - (upgrading to this tree) while old members remain, the upgraded ones report the old
//!   build's cluster log format (`KVD_OLD_LOG_FORMAT`, which ci.sh takes from releases.tsv),
//!   and once all are upgraded every member reports this tree's within 30 s.
//!
//! Every problem is listed (key, member, revisions) before the test fails; the members are
//! killed when it ends either way.
//!
//! Environment: `KVD_OLD_BIN` (required), `KVD_NEW_BIN` (default: this tree's kvd; lets the
//! test run between two old builds), `KVD_UPGRADE_WRITES` (recorded writes, 5000),
//! `KVD_UPGRADE_CLIENTS` (writers, 16), `KVD_UPGRADE_LEASES` (short leases, 30),
//! `KVD_UPGRADE_KEEP=1` (keep the data dirs and logs, and print where), `KVD_OLD_LOG_FORMAT`
//! (the old build's log format, from releases.tsv).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Cluster;
use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::lease_client::LeaseClient;
use kvd::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use kvd::proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, HashKvRequest, LeaseGrantRequest,
    LeaseTimeToLiveRequest, MoveLeaderRequest, PutRequest, RangeRequest, StatusRequest,
};
use kvd::proto::mvccpb::KeyValue;
use kvd::raft::log_format::LOG_FORMAT;
use tonic::transport::{Channel, Endpoint};

/// The harness passes no `--election-timeout`: members run with etcd's default.
const ELECTION_TIMEOUT: Duration = Duration::from_millis(1000);
/// Versions written to each recorded key; every `DELETE_EVERY`th key is deleted afterwards.
const VERSIONS: usize = 5;
const DELETE_EVERY: usize = 50;
const LONG_LEASE_TTL: i64 = 3600;
const LONG_LEASE_KEYS: usize = 10;
/// A writer's put, a status poll: a member that takes longer is as good as down for them.
const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// Calls that must not fail on a slow machine: recorded writes (not retried: a retry of a put
/// that applied would add a version), full reads and HashKV (a debug build, other builds on
/// the same cores).
const SLOW_RPC_TIMEOUT: Duration = Duration::from_secs(60);
/// Load after each upgrade step before the next, so that each mixed phase sees writes.
const MIXED_LOAD: Duration = Duration::from_secs(2);

fn env_num(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

fn lazy_channel(url: &str, timeout: Duration) -> Channel {
    Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .timeout(timeout)
        .connect_lazy()
}

fn show(v: &[u8]) -> String {
    let s = String::from_utf8_lossy(v);
    if s.len() > 40 {
        format!("{:?}...", &s[..40])
    } else {
        format!("{s:?}")
    }
}

/// A key as one member holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    create: i64,
    modified: i64,
    version: i64,
    lease: i64,
    value: Vec<u8>,
}

impl Held {
    fn of(kv: &KeyValue) -> Held {
        Held {
            create: kv.create_revision,
            modified: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
            value: kv.value.clone(),
        }
    }
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "create {} mod {} version {} lease {:x} value {}",
            self.create,
            self.modified,
            self.version,
            self.lease,
            show(&self.value)
        )
    }
}

/// What a key must look like at the end, from the writes acknowledged on it.
#[derive(Debug, Clone)]
struct Expected {
    create: i64,
    modified: i64,
    version: i64,
    value: String,
    deleted: bool,
}

struct Run {
    c: Cluster,
    urls: Vec<String>,
    new_bin: PathBuf,
    /// What happened, in order; printed with the verdict.
    story: Vec<String>,
    problems: Vec<String>,
}

impl Run {
    fn note(&mut self, s: String) {
        eprintln!("upgrade: {s}");
        self.story.push(s);
    }

    fn bin_of(&self, i: usize) -> &'static str {
        match &self.c.members[i].bin {
            Some(b) if *b == self.new_bin => "new",
            _ => "old",
        }
    }

    fn maintenance(&self, i: usize) -> MaintenanceClient<Channel> {
        MaintenanceClient::new(lazy_channel(&self.urls[i], RPC_TIMEOUT))
    }

    fn kv(&self, i: usize) -> KvClient<Channel> {
        KvClient::new(lazy_channel(&self.urls[i], SLOW_RPC_TIMEOUT))
    }

    fn lease(&self, i: usize) -> LeaseClient<Channel> {
        LeaseClient::new(lazy_channel(&self.urls[i], SLOW_RPC_TIMEOUT))
    }

    async fn member_id(&self, i: usize) -> u64 {
        let st = self.maintenance(i).status(StatusRequest {}).await.unwrap();
        st.into_inner().header.unwrap().member_id
    }

    /// (revision, leader) as member `i` reports them, if it answers.
    async fn status(&self, i: usize) -> Option<(i64, u64)> {
        let st = self.maintenance(i).status(StatusRequest {}).await.ok()?;
        let st = st.into_inner();
        Some((st.header?.revision, st.leader))
    }

    /// (revision, raft applied index) of member `i`, if it answers.
    async fn progress(&self, i: usize) -> Option<(i64, u64)> {
        let st = self.maintenance(i).status(StatusRequest {}).await.ok()?;
        let st = st.into_inner();
        Some((st.header?.revision, st.raft_applied_index))
    }

    fn log_tails(&self) -> String {
        (0..self.c.members.len())
            .map(|i| {
                let log = self.c.log_of(i);
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(25)..].join("\n");
                format!("--- m{i} log, last lines:\n{tail}\n")
            })
            .collect()
    }

    /// Waits until member `i` answers with a leader and has applied at least the revision the
    /// leader had when it started answering (so it has caught up on what it missed).
    async fn wait_caught_up(&self, i: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let target = loop {
            if self.status(i).await.is_some_and(|(_, l)| l != 0) {
                if let Some(l) = self.c.leader().await {
                    if let Some((rev, _)) = self.status(l).await {
                        break rev;
                    }
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "m{i} did not come up with a leader within {timeout:?}\n{}",
                    self.log_tails()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        loop {
            if self.status(i).await.is_some_and(|(r, _)| r >= target) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "m{i} did not catch up to revision {target} within {timeout:?}\n{}",
                    self.log_tails()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGTERM, restart on the new binary, wait until caught up.
    async fn upgrade(&mut self, i: usize) {
        let t = Instant::now();
        let new_bin = self.new_bin.clone();
        let st = self.c.restart_on(i, &new_bin);
        self.wait_caught_up(i, Duration::from_secs(90)).await;
        self.note(format!(
            "m{i} upgraded (old process exited: {st}), caught up after {:.1}s",
            t.elapsed().as_secs_f64()
        ));
    }

    /// The cluster log format member `i` reports on `/metrics` (`None` from builds before
    /// 0.2.0, which have no such metric, or when it does not answer).
    async fn cluster_format(&self, i: usize) -> Option<u32> {
        let port = self.c.members[i].client_port;
        let (code, body) = tokio::time::timeout(RPC_TIMEOUT, common::http_get(port, "/metrics"))
            .await
            .ok()?;
        if code != 200 {
            return None;
        }
        body.lines()
            .find_map(|l| l.strip_prefix("kvd_cluster_log_format "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The upgraded members (`upgraded`) while others still run the old build: each must
    /// report the old build's format (`KVD_OLD_LOG_FORMAT`) or, when that is not given, one
    /// older than this tree's; a cluster format above what an old member applies would let
    /// entries it cannot apply into the log.
    async fn check_mixed_format(&mut self, upgraded: &[usize]) {
        let old: Option<u32> = std::env::var("KVD_OLD_LOG_FORMAT")
            .ok()
            .and_then(|v| v.parse().ok());
        for &i in upgraded {
            let f = self.cluster_format(i).await;
            let ok = match (f, old) {
                (Some(f), Some(old)) => f == old,
                (Some(f), None) => f < LOG_FORMAT,
                (None, _) => false,
            };
            if ok {
                self.note(format!(
                    "m{i} reports cluster log format {f:?} while old members remain"
                ));
            } else {
                self.problems.push(format!(
                    "m{i} reports cluster log format {f:?} while old members remain (expected \
                     {}; this tree applies {LOG_FORMAT})",
                    old.map_or("an older one".to_string(), |o| o.to_string())
                ));
            }
        }
    }

    /// Once every member runs this tree: every member reports the cluster format raised to
    /// this tree's within 30 s.
    async fn check_raised_format(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut seen = Vec::new();
            for i in 0..3 {
                seen.push(self.cluster_format(i).await);
            }
            if seen.iter().all(|f| *f == Some(LOG_FORMAT)) {
                self.note(format!(
                    "every member reports cluster log format {LOG_FORMAT}"
                ));
                return;
            }
            if Instant::now() >= deadline {
                self.problems.push(format!(
                    "30 s after the last upgrade the members report cluster log formats \
                     {seen:?}, not {LOG_FORMAT}"
                ));
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Makes member `target` leader (MoveLeader through the current leader).
    async fn make_leader(&self, target: usize) -> Result<(), String> {
        let id = self.member_id(target).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.c.leader().await {
                Some(l) if l == target => return Ok(()),
                Some(l) => {
                    let r = self
                        .maintenance(l)
                        .move_leader(MoveLeaderRequest { target_id: id })
                        .await;
                    if let Err(e) = r {
                        eprintln!("upgrade: move-leader m{l} -> m{target}: {e}");
                    }
                }
                None => {}
            }
            if Instant::now() > deadline {
                return Err(format!("m{target} did not become leader within 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// With `leader` (an upgraded member) leading, grants `n` leases of the minimum TTL with a
    /// key each and waits until the leader has revoked them all. `Err` if leadership left it
    /// meanwhile (the revokes were then not all its own).
    async fn expire_short_leases(
        &mut self,
        leader: usize,
        round: usize,
        n: usize,
    ) -> Result<Vec<String>, String> {
        self.make_leader(leader).await?;
        let ttl = kvd::raft::sm::lessor::min_ttl(ELECTION_TIMEOUT);
        let mut lease = self.lease(leader);
        let mut kv = self.kv(leader);
        let mut ids = Vec::new();
        let mut keys = Vec::new();
        for j in 0..n {
            let g = lease
                .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                .await
                .map_err(|e| format!("lease grant on m{leader}: {e}"))?
                .into_inner();
            assert_eq!(
                g.ttl, ttl,
                "the leader granted TTL {} for a request of the minimum, {ttl}",
                g.ttl
            );
            let key = format!("short/{round}/{j}");
            kv.put(PutRequest {
                key: key.clone().into(),
                value: format!("lease {:x}", g.id).into(),
                lease: g.id,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("put {key} on m{leader}: {e}"))?;
            ids.push(g.id);
            keys.push(key);
        }
        let granted = Instant::now();
        // Expiry, then etcd's retry interval for a revoke that failed, then slack for load.
        let deadline = granted + Duration::from_secs(ttl as u64 + 3 + 30);
        let mut left: BTreeSet<i64> = ids.iter().copied().collect();
        while !left.is_empty() {
            for id in left.clone() {
                let r = lease
                    .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
                    .await;
                if r.is_ok_and(|r| r.into_inner().ttl == -1) {
                    left.remove(&id);
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} of {n} short leases not revoked {:?} after they were granted",
                    left.len(),
                    granted.elapsed()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let now = self.c.leader().await;
        if now != Some(leader) {
            return Err(format!(
                "leadership moved from m{leader} to {now:?} while the short leases expired"
            ));
        }
        self.note(format!(
            "round {round}: {n} leases of TTL {ttl}s granted on m{leader} (new, leader) were \
             revoked by it {:.1}s later",
            granted.elapsed().as_secs_f64()
        ));
        Ok(keys)
    }

    /// How many of `keys` each member holds once it has applied the leader's current
    /// revision: shows a divergence right where it happens.
    async fn count_on_each(&mut self, what: &str, keys: &[String]) {
        let target = match self.c.leader().await {
            Some(l) => self.status(l).await.map_or(0, |s| s.0),
            None => 0,
        };
        let mut line = format!("{what}:");
        for i in 0..self.c.members.len() {
            let deadline = Instant::now() + Duration::from_secs(20);
            while self.status(i).await.is_none_or(|(r, _)| r < target) {
                if Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let mut kv = self.kv(i);
            let mut held = 0;
            for k in keys {
                if let Ok(Some(_)) = get_serializable(&mut kv, k).await {
                    held += 1;
                }
            }
            line += &format!(" m{i} ({}) holds {held}", self.bin_of(i));
        }
        self.note(line);
    }
}

async fn get_serializable(
    kv: &mut KvClient<Channel>,
    key: &str,
) -> Result<Option<KeyValue>, tonic::Status> {
    let r = kv
        .range(RangeRequest {
            key: key.into(),
            serializable: true,
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().kvs.into_iter().next())
}

/// Every key member `url` holds at `rev`, from its own state (serializable), page by page.
async fn all_keys(url: &str, rev: i64) -> Result<BTreeMap<Vec<u8>, Held>, tonic::Status> {
    let mut kv =
        KvClient::new(lazy_channel(url, SLOW_RPC_TIMEOUT)).max_decoding_message_size(64 << 20);
    let mut out = BTreeMap::new();
    let mut from = vec![0u8];
    loop {
        let r = kv
            .range(RangeRequest {
                key: from.clone(),
                range_end: vec![0],
                limit: 2000,
                revision: rev,
                serializable: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        for k in &r.kvs {
            out.insert(k.key.clone(), Held::of(k));
        }
        match (r.more, r.kvs.last()) {
            (true, Some(last)) => {
                from = last.key.clone();
                from.push(0);
            }
            _ => return Ok(out),
        }
    }
}

/// The recorded writes: `writes` puts over `writes / VERSIONS` keys, `clients` at a time (each
/// key written by one task, in order), then every `DELETE_EVERY`th key deleted.
async fn recorded_writes(
    urls: &[String],
    writes: usize,
    clients: usize,
) -> BTreeMap<String, Expected> {
    let nkeys = (writes / VERSIONS).max(1);
    let tasks: Vec<_> = (0..clients)
        .map(|t| {
            let mut kv = KvClient::new(lazy_channel(&urls[t % urls.len()], SLOW_RPC_TIMEOUT));
            tokio::spawn(async move {
                let mut mine: BTreeMap<String, Expected> = BTreeMap::new();
                for v in 0..VERSIONS {
                    for k in (t..nkeys).step_by(clients) {
                        let key = format!("pre/{k:06}");
                        let value = format!("pre {k} v{v}");
                        let r = kv
                            .put(PutRequest {
                                key: key.clone().into(),
                                value: value.clone().into(),
                                ..Default::default()
                            })
                            .await
                            .unwrap_or_else(|e| panic!("recorded write {key}: {e}"));
                        let rev = r.into_inner().header.unwrap().revision;
                        let e = mine.entry(key).or_insert(Expected {
                            create: rev,
                            modified: rev,
                            version: 0,
                            value: String::new(),
                            deleted: false,
                        });
                        e.modified = rev;
                        e.version += 1;
                        e.value = value;
                    }
                }
                for k in (t..nkeys)
                    .step_by(clients)
                    .filter(|k| k % DELETE_EVERY == 0)
                {
                    let key = format!("pre/{k:06}");
                    let r = kv
                        .delete_range(DeleteRangeRequest {
                            key: key.clone().into(),
                            ..Default::default()
                        })
                        .await
                        .unwrap_or_else(|e| panic!("recorded delete {key}: {e}"));
                    assert_eq!(r.into_inner().deleted, 1, "delete of {key}");
                    mine.get_mut(&key).unwrap().deleted = true;
                }
                mine
            })
        })
        .collect();
    let mut all = BTreeMap::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// A writer: unique keys `w/<id>/<n>`, each put sent to the next member in turn; an
/// acknowledged put is recorded as (key, value, revision). A put that fails or times out may
/// have applied or not: it is not recorded, and its key never used again.
fn spawn_writer(
    id: usize,
    urls: Vec<String>,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(String, String, i64)>>>,
    failed: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut clients: Vec<_> = urls
            .iter()
            .map(|u| KvClient::new(lazy_channel(u, RPC_TIMEOUT)))
            .collect();
        let mut n = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("w/{id:02}/{n:06}");
            let value = format!("writer {id} put {n}");
            let c = &mut clients[(id + n) % urls.len()];
            let put = c.put(PutRequest {
                key: key.clone().into(),
                value: value.clone().into(),
                ..Default::default()
            });
            match tokio::time::timeout(RPC_TIMEOUT, put).await {
                Ok(Ok(r)) => {
                    let rev = r.into_inner().header.unwrap().revision;
                    acked.lock().unwrap().push((key, value, rev));
                }
                _ => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            n += 1;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs an old build: run through tests/upgrade/ci.sh, or set KVD_OLD_BIN"]
async fn rolling_upgrade_under_load_keeps_members_identical() {
    let Some(old_bin) = std::env::var_os("KVD_OLD_BIN").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED: KVD_OLD_BIN is not set. Build an old release first: \
             eval \"$(tests/upgrade/build_old.sh 0.1.0)\" (or run tests/upgrade/ci.sh)"
        );
        return;
    };
    assert!(
        old_bin.is_file(),
        "KVD_OLD_BIN={} is no file",
        old_bin.display()
    );
    let new_bin = std::env::var_os("KVD_NEW_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kvd")));
    let writes = env_num("KVD_UPGRADE_WRITES", 5000);
    let clients = env_num("KVD_UPGRADE_CLIENTS", 16).max(1);
    let leases = env_num("KVD_UPGRADE_LEASES", 30);
    let started = Instant::now();

    let mut c = Cluster::unstarted(tempfile::tempdir().unwrap(), "m", 3, |_| Vec::new());
    for i in 0..3 {
        c.members[i].bin = Some(old_bin.clone());
        c.spawn(i);
    }
    c.wait_for_leader(Duration::from_secs(30)).await;
    let urls: Vec<String> = c.members.iter().map(|m| m.client_url()).collect();
    let mut run = Run {
        c,
        urls: urls.clone(),
        new_bin: new_bin.clone(),
        story: Vec::new(),
        problems: Vec::new(),
    };
    run.note(format!(
        "3 members on {}; upgrading to {}",
        old_bin.display(),
        new_bin.display()
    ));

    // The recorded history, a compaction in its middle, a long lease with keys.
    let first = run.status(0).await.unwrap().0;
    let mut expected = recorded_writes(&urls, writes, clients).await;
    let last = run.status(run.c.leader().await.unwrap()).await.unwrap().0;
    let compact_at = first + (last - first) / 2;
    run.kv(0)
        .compact(CompactionRequest {
            revision: compact_at,
            physical: true,
        })
        .await
        .unwrap();
    let long = run
        .lease(0)
        .lease_grant(LeaseGrantRequest {
            ttl: LONG_LEASE_TTL,
            id: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    let mut long_keys = Vec::new();
    for j in 0..LONG_LEASE_KEYS {
        let key = format!("long/{j}");
        let r = run
            .kv(j % 3)
            .put(PutRequest {
                key: key.clone().into(),
                value: b"held by the long lease".to_vec(),
                lease: long,
                ..Default::default()
            })
            .await
            .unwrap();
        let rev = r.into_inner().header.unwrap().revision;
        long_keys.push((key, rev));
    }
    run.note(format!(
        "{writes} recorded puts over {} keys (every {DELETE_EVERY}th deleted), revisions \
         {first}..{last}, compacted at {compact_at}; lease {long:x} (TTL {LONG_LEASE_TTL}s) \
         with {LONG_LEASE_KEYS} keys",
        expected.len()
    ));

    // Writers through every member, for the whole upgrade.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(String, String, i64)>>> = Arc::default();
    let failed: Arc<AtomicUsize> = Arc::default();
    let writers: Vec<_> = (0..clients)
        .map(|id| {
            spawn_writer(
                id,
                urls.clone(),
                stop.clone(),
                acked.clone(),
                failed.clone(),
            )
        })
        .collect();
    tokio::time::sleep(MIXED_LOAD).await;

    // Upgrade a follower first (as an operator would), the old leader last.
    let leader = run.c.leader().await.unwrap_or(0);
    let mut order: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    order.push(leader);
    run.upgrade(order[0]).await;
    tokio::time::sleep(MIXED_LOAD).await;

    // Mixed: the upgraded member leads two old ones while short leases expire.
    let mut short_keys = Vec::new();
    let mut led = false;
    for round in 0..3 {
        match run.expire_short_leases(order[0], round, leases).await {
            Ok(keys) => {
                run.count_on_each(
                    &format!("round {round}: the short lease keys, after the revokes applied"),
                    &keys,
                )
                .await;
                short_keys.extend(keys);
                led = true;
                break;
            }
            Err(e) => run.note(format!("round {round} of short leases did not count: {e}")),
        }
    }
    if !led {
        run.problems.push(format!(
            "the upgraded member m{} never kept leadership while short leases expired: the \
             mixed-version lease revoke was not exercised",
            order[0]
        ));
    }

    // Only when upgrading to this tree: another new build may know no cluster format.
    let to_this_tree = std::env::var_os("KVD_NEW_BIN").is_none();
    if to_this_tree {
        run.check_mixed_format(&order[..1]).await;
    }
    run.upgrade(order[1]).await;
    tokio::time::sleep(MIXED_LOAD).await;
    if to_this_tree {
        run.check_mixed_format(&order[..2]).await;
    }
    run.upgrade(order[2]).await;
    tokio::time::sleep(MIXED_LOAD).await;
    if to_this_tree {
        run.check_raised_format().await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    run.note(format!(
        "{} writers: {} puts acknowledged, {} failed or timed out (not checked)",
        clients,
        acked.len(),
        failed.load(Ordering::Relaxed)
    ));
    for (key, value, rev) in &acked {
        expected.insert(
            key.clone(),
            Expected {
                create: *rev,
                modified: *rev,
                version: 1,
                value: value.clone(),
                deleted: false,
            },
        );
    }

    // All members at one revision, or wherever they settle.
    let settled = settle(&run).await;
    let shown: Vec<String> = settled
        .iter()
        .enumerate()
        .map(|(i, (r, a))| format!("m{i} revision {r} (applied index {a})"))
        .collect();
    let agreed = settled.iter().all(|s| s.0 == settled[0].0);
    let rev = settled.iter().map(|s| s.0).min().unwrap();
    if agreed {
        run.note(format!("all members at one revision: {}", shown.join(", ")));
    } else {
        run.problems.push(format!(
            "members settled at different revisions: {}",
            shown.join(", ")
        ));
    }

    compare(
        &mut run,
        rev,
        agreed,
        &expected,
        long,
        &long_keys,
        &short_keys,
    )
    .await;

    let secs = started.elapsed().as_secs_f64();
    let kept = std::env::var_os("KVD_UPGRADE_KEEP").map(|_| {
        let dir = std::mem::replace(&mut run.c.dir, tempfile::tempdir().unwrap());
        dir.keep()
    });
    if let Some(k) = &kept {
        eprintln!("upgrade: data dirs and logs kept in {}", k.display());
    }
    if run.problems.is_empty() {
        eprintln!("upgrade: PASSED in {secs:.0}s: members identical, no acknowledged write lost");
        return;
    }
    // The whole story again: the panic message is what a test run shows of a failure.
    let mut report = format!(
        "rolling upgrade {} -> {} ({writes} writes, {clients} clients, {leases} leases, \
         {secs:.0}s)\n",
        old_bin.display(),
        new_bin.display()
    );
    for s in &run.story {
        report += &format!("  {s}\n");
    }
    if let Some(k) = &kept {
        report += &format!("  data dirs and logs kept in {}\n", k.display());
    }
    report += "FAILED:\n";
    for p in &run.problems {
        report += &format!("  {p}\n");
    }
    panic!("{report}");
}

/// Each member's (revision, applied index) once the writers have stopped: as soon as all
/// revisions agree, or else once no member's has moved for 5 s (members that diverged).
async fn settle(run: &Run) -> Vec<(i64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last: Vec<Option<(i64, u64)>> = Vec::new();
    let mut unchanged_since = Instant::now();
    loop {
        let mut now = Vec::new();
        for i in 0..run.urls.len() {
            now.push(run.progress(i).await);
        }
        if now.iter().all(|p| p.is_some()) {
            let now: Vec<(i64, u64)> = now.iter().map(|p| p.unwrap()).collect();
            if now.iter().all(|p| p.0 == now[0].0) {
                return now;
            }
        }
        if now != last {
            last = now;
            unchanged_since = Instant::now();
        } else if unchanged_since.elapsed() > Duration::from_secs(5)
            && last.iter().all(|p| p.is_some())
        {
            return last.into_iter().map(|p| p.unwrap()).collect();
        }
        if Instant::now() > deadline {
            panic!("members do not settle: {last:?}\n{}", run.log_tails());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Shows at most `max` of `lines` (in their order), then how many more there were.
fn capped(lines: Vec<String>, max: usize) -> Vec<String> {
    let more = lines.len().saturating_sub(max);
    let mut out: Vec<String> = lines.into_iter().take(max).collect();
    if more > 0 {
        out.push(format!("... and {more} more like the above"));
    }
    out
}

/// The end-state checks, each problem added to `run.problems`. With `agreed`, every member is
/// at `rev` and is read there; else each is read at its own revision and HashKV is taken at
/// `rev`, the lowest.
async fn compare(
    run: &mut Run,
    rev: i64,
    agreed: bool,
    expected: &BTreeMap<String, Expected>,
    long: i64,
    long_keys: &[(String, i64)],
    short_keys: &[String],
) {
    let n = run.urls.len();

    // HashKV at the common revision.
    let mut hashes = Vec::new();
    for i in 0..n {
        let h = MaintenanceClient::new(lazy_channel(&run.urls[i], SLOW_RPC_TIMEOUT))
            .hash_kv(HashKvRequest { revision: rev })
            .await
            .map(|r| {
                let r = r.into_inner();
                (r.hash, r.compact_revision)
            })
            .map_err(|e| e.to_string());
        hashes.push(h);
    }
    let shown: Vec<String> = hashes
        .iter()
        .enumerate()
        .map(|(i, h)| match h {
            Ok((h, c)) => format!("m{i} {h:#010x} (compacted at {c})"),
            Err(e) => format!("m{i} error: {e}"),
        })
        .collect();
    if hashes.iter().any(|h| h.is_err() || *h != hashes[0]) {
        run.problems.push(format!(
            "HashKV at revision {rev} differs: {}",
            shown.join(", ")
        ));
    } else {
        run.note(format!("HashKV at revision {rev}: {}", shown.join(", ")));
    }

    // Every key on every member.
    let read_at = if agreed { rev } else { 0 };
    let mut held: Vec<BTreeMap<Vec<u8>, Held>> = Vec::new();
    for i in 0..n {
        match all_keys(&run.urls[i], read_at).await {
            Ok(m) => held.push(m),
            Err(e) => {
                run.problems
                    .push(format!("m{i}: reading every key at {read_at}: {e}"));
                held.push(BTreeMap::new());
            }
        }
    }
    let union: BTreeSet<&Vec<u8>> = held.iter().flat_map(|m| m.keys()).collect();
    // (the lowest mod_revision any member has for the key, the report line): the first
    // divergence in revision order is where to start looking.
    let mut differing: Vec<(i64, String)> = Vec::new();
    for k in &union {
        let each: Vec<Option<&Held>> = held.iter().map(|m| m.get(*k)).collect();
        if each.iter().all(|h| *h == each[0]) {
            continue;
        }
        let first = each.iter().flatten().map(|h| h.modified).min().unwrap();
        let sides: Vec<String> = each
            .iter()
            .enumerate()
            .map(|(i, h)| match h {
                Some(h) => format!("m{i}: {h}"),
                None => format!("m{i}: absent"),
            })
            .collect();
        differing.push((
            first,
            format!("key {} differs: {}", show(k), sides.join("; ")),
        ));
    }
    run.note(format!(
        "{} keys compared on {n} members{}, {} differ",
        union.len(),
        if agreed {
            format!(" at revision {rev}")
        } else {
            " (each at its own revision)".to_string()
        },
        differing.len()
    ));
    differing.sort();
    run.problems
        .extend(capped(differing.into_iter().map(|d| d.1).collect(), 40));

    // Acknowledged writes and the recorded history's end state.
    for (i, m) in held.iter().enumerate() {
        let mut lost = Vec::new();
        for (key, e) in expected {
            let problem = match (m.get(key.as_bytes()), e.deleted) {
                (None, true) => None,
                (Some(h), true) => Some(format!("deleted, but held as {h}")),
                (None, false) => Some("absent".to_string()),
                (Some(h), false) => (h.create != e.create
                    || h.modified != e.modified
                    || h.version != e.version
                    || h.value != e.value.as_bytes())
                .then(|| format!("held as {h}")),
            };
            if let Some(p) = problem {
                lost.push(format!(
                    "acknowledged write missing or altered on m{i}: {key} = {:?} (create {} \
                     mod {} version {}{}): {p}",
                    e.value,
                    e.create,
                    e.modified,
                    e.version,
                    if e.deleted { ", then deleted" } else { "" }
                ));
            }
        }
        run.problems.extend(capped(lost, 10));
    }

    // The long lease's keys survive with it; every short lease's key is gone.
    for (key, put_rev) in long_keys {
        for (i, m) in held.iter().enumerate() {
            match m.get(key.as_bytes()) {
                Some(h) if h.lease == long && h.modified == *put_rev => {}
                other => run.problems.push(format!(
                    "m{i}: {key} (put at {put_rev} with lease {long:x}) is {}",
                    other.map_or("absent".to_string(), |h| h.to_string())
                )),
            }
        }
    }
    let leader = run.c.leader().await.unwrap_or(0);
    match run
        .lease(leader)
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: long,
            keys: true,
        })
        .await
    {
        Ok(r) => {
            let r = r.into_inner();
            if r.ttl <= 0 || r.keys.len() != long_keys.len() {
                run.problems.push(format!(
                    "lease {long:x} after the upgrade: TTL {} with {} keys, not alive with {}",
                    r.ttl,
                    r.keys.len(),
                    long_keys.len()
                ));
            }
        }
        Err(e) => run
            .problems
            .push(format!("lease {long:x}: time-to-live on the leader: {e}")),
    }
    for (i, m) in held.iter().enumerate() {
        let still: Vec<(&String, &Held)> = short_keys
            .iter()
            .filter_map(|k| m.get(k.as_bytes()).map(|h| (k, h)))
            .collect();
        if let Some((k, h)) = still.first() {
            run.problems.push(format!(
                "m{i} still holds {} of the {} short lease keys, whose leases the upgraded \
                 leader revoked (the first: {k}, {h})",
                still.len(),
                short_keys.len()
            ));
        }
    }
}
