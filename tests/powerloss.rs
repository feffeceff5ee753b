//! Whole-node power loss, in process: three members, each the real `server::run`
//! (real gRPC sockets between them and to the clients) on its own thread and tokio runtime,
//! with its WAL on its own [`SimFs`]. Clients write unique keys through every member; at a
//! seeded random failpoint (the n-th WAL write, fsync, create, rename or unlink of one member)
//! one, two or all three members lose power together; each restarts from its crashed image;
//! then every acknowledged write must be on every member, at the revision it was
//! acknowledged with, and the members must agree on every revision.
//!
//! # What a power loss does to a member
//!
//! - **WAL** (`member/wal`, on the SimFs): from the failpoint on every mutating op fails (the
//!   machine does no more I/O), the member is stopped, then `SimFs::crash` keeps only what
//!   the model allows: synced bytes survive, each unsynced 4 KiB page independently keeps its
//!   new content, its old content, or becomes zeros/garbage, a grown file is cut at a random
//!   length, unsynced directory entries (segment creates and unlinks) independently survive or
//!   vanish. Segments are 16 KiB here, so rotation and purge-driven unlinks happen.
//! - **sled** (`member/sm/db`, real files: sled does not go through the WAL's fs interface):
//!   per crash, one of two extremes, chosen by the seed. *Wiped*: the directory is deleted, the
//!   oldest state sled could come back with short of a broken disk: nothing since its last
//!   explicit flush. *Kept*: sled as the stopped member left it (sled flushes on close), i.e.
//!   every batch it applied, even ones applied from log entries the WAL had not synced yet:
//!   the newest state a background flush could have reached (openraft then purges the log up
//!   to the applied entry). States in between (a background flush part way) are not modelled;
//!   sled's own crash consistency is assumed (it is at a batch boundary: one transaction per
//!   applied batch).
//!   kvd keeps no copy of its store as a snapshot: a snapshot point flushes sled, and only
//!   then may the log below it be purged, so sled's state at its last explicit flush is the
//!   oldest a member can restart from once its log was purged. A wiped sled is that state only
//!   while nothing was ever flushed, so sled is wiped only in runs that never snapshot, and
//!   only until the member's sled was kept once: a kept sled was flushed (on close), and a
//!   member restarted on it reports its applied state as its snapshot (record 0029), below
//!   which openraft may purge the log. In the other runs it is always kept.
//! - **Snapshot files** (`member/sm/snap`, real files, not routed through the SimFs): only a
//!   received snapshot is a file, until it is loaded; assumed to survive once renamed into
//!   place (the unit tests `power_loss_tests` of `raft::sm::snapshot_file`, `raft::sm::engine_dir` and
//!   `server::backup::restore` crash those files, the engine switch and a restore on a SimFs). Half of the runs use a small `--snapshot-count` so snapshot points, log purges and
//!   snapshot sends and installs happen; the others never snapshot.
//! - **Identity** (`member/member.json`): written once at bootstrap, before any crash.
//!
//! "Stopping" a crashed member goes through `run`'s normal stop path, but with its WAL refusing
//! all I/O the only effects that could reach storage are on sled, which the sled model
//! overrides. The surviving members keep running; their clients keep writing until the crashed
//! members are down, so writes are in flight at the crash.
//!
//! # What is checked after each restart
//!
//! Writers are stopped, then (up to 60 s; 15 s in the no-fsync test) every member is read with a linearizable range of
//! the whole key space until all three answer at the same revision R. Then: the three listings
//! are identical; their mod revisions are exactly 2..=R (each write creates a new key, nothing
//! is deleted, so the listing is the full history and a hole means a revision whose write
//! vanished); and every write acknowledged in any life so far is there with its value and the
//! revision its client was told. Writes that failed or timed out may or may not be there.
//!
//! Runs print `powerloss: seed N`; `KVD_POWERLOSS_SEED=N` replays the same choices (members,
//! failpoint indexes, crash images, sled model); thread timing still varies between runs.
//! `KVD_POWERLOSS_LIVES` sets the number of crashes (the `#[ignore]` long form's default is 60).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Parser;
use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::{PutRequest, RangeRequest};
use kvd::proto::mvccpb::KeyValue;
use kvd::server::config::Flags;
use kvd::server::ServerError;
use kvd::wal::{SimFs, WalBackend, WalOptions};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tonic::transport::{Channel, Endpoint};

const PREFIX: &str = "pl/";

#[derive(Clone)]
struct RunOpts {
    unsafe_no_fsync: bool,
    /// Probability that a crashed member's sled is kept (else wiped).
    sled_keep: f64,
    /// Crash all three members every time (else 1, 2 or 3 at random).
    crash_all: bool,
    /// How long the members get to agree on one revision after a restart.
    converge: Duration,
}

struct Node {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    fs: SimFs,
    running: Option<(tokio::sync::oneshot::Sender<()>, MemberThread)>,
}

/// The thread a member runs on; it ends with `server::run`'s result.
type MemberThread = JoinHandle<Result<(), ServerError>>;

/// How a member's thread ended.
enum Exit {
    Stopped,
    /// Raft stopped on a storage error and the member exited, as etcd does.
    OnStorageError(String),
    Failed(String),
    Panicked,
}

impl Exit {
    fn of(joined: std::thread::Result<Result<(), ServerError>>) -> Exit {
        match joined {
            Ok(Ok(())) => Exit::Stopped,
            Ok(Err(e @ ServerError::RaftStopped(_))) => Exit::OnStorageError(e.to_string()),
            Ok(Err(e)) => Exit::Failed(e.to_string()),
            Err(_) => Exit::Panicked,
        }
    }

    fn describe(&self, i: usize) -> String {
        match self {
            Exit::Stopped => format!("m{i} stopped"),
            Exit::OnStorageError(e) => format!("m{i} exited on a storage error: {e}"),
            Exit::Failed(e) => format!("m{i} exited with an error: {e}"),
            Exit::Panicked => format!("m{i} panicked"),
        }
    }
}

impl Node {
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

struct Sim {
    _dir: tempfile::TempDir,
    nodes: Vec<Node>,
    initial_cluster: String,
    wal: WalOptions,
    snapshot_count: u64,
}

impl Sim {
    fn new(wal: WalOptions, snapshot_count: u64) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<Node> = (0..3)
            .map(|i| Node {
                name: format!("m{i}"),
                client_port: common::free_port(),
                peer_port: common::free_port(),
                data_dir: dir.path().join(format!("m{i}.kvd")),
                fs: SimFs::new(),
                running: None,
            })
            .collect();
        let initial_cluster = nodes
            .iter()
            .map(|n| format!("{}=http://127.0.0.1:{}", n.name, n.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        Sim {
            _dir: dir,
            nodes,
            initial_cluster,
            wal,
            snapshot_count,
        }
    }

    /// Starts member `i` in process: `server::run` on its own thread and runtime (as if it were
    /// its own process), its WAL on its SimFs.
    fn start(&mut self, i: usize) {
        let n = &self.nodes[i];
        wait_until_sled_unlocked(&n.data_dir);
        let client = n.client_url();
        let peer = format!("http://127.0.0.1:{}", n.peer_port);
        let flags = Flags::try_parse_from([
            "kvd".to_string(),
            format!("--name={}", n.name),
            format!("--data-dir={}", n.data_dir.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster={}", self.initial_cluster),
            "--initial-cluster-token=powerloss".into(),
            "--heartbeat-interval=50".into(),
            "--election-timeout=500".into(),
            format!("--snapshot-count={}", self.snapshot_count),
            format!(
                "--experimental-snapshot-catchup-entries={}",
                self.snapshot_count / 2
            ),
        ])
        .unwrap();
        let mut cfg = flags.validate().unwrap();
        cfg.wal = WalBackend {
            fs: Some(Arc::new(n.fs.clone())),
            options: self.wal.clone(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let h = std::thread::Builder::new()
            .name(format!("member-{}", n.name))
            .spawn(move || {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(kvd::server::run(cfg, async move {
                    let _ = rx.await;
                }))
            })
            .unwrap();
        self.nodes[i].running = Some((tx, h));
    }

    fn signal_stop(&mut self, i: usize) -> Option<MemberThread> {
        let (tx, h) = self.nodes[i].running.take()?;
        let _ = tx.send(());
        Some(h)
    }

    /// Waits for a member's thread (and with it its runtime, sled and WAL) to end.
    async fn join(&self, i: usize, h: MemberThread) -> Result<Exit, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !h.is_finished() {
            if Instant::now() > deadline {
                return Err(format!("m{i} did not stop within 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Exit::of(h.join()))
    }

    /// How the members that stopped on their own ended (a member that refuses to start, e.g.
    /// on a WAL it finds corrupt, exits with that error).
    fn exits(&mut self) -> Vec<(usize, Exit)> {
        let mut out = Vec::new();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if n.running.as_ref().is_some_and(|(_, h)| h.is_finished()) {
                let (_, h) = n.running.take().unwrap();
                out.push((i, Exit::of(h.join())));
            }
        }
        out
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::client_url).collect()
    }
}

/// Waits (up to 10 s) until no one holds the lock on a member's state-machine database. A
/// member restarted in this process can otherwise find its previous life's lock still held:
/// sled releases it only when its IO pool has finished the dropped database's last writes,
/// a moment after the member's thread has ended. A separate process never sees this, as the
/// lock dies with the process.
fn wait_until_sled_unlocked(data_dir: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let path = data_dir.join("member/sm/db/db");
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Ok(f) = std::fs::File::open(&path) {
        // SAFETY: flock on a descriptor this function owns; released when `f` closes.
        let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if locked || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn client(url: &str) -> KvClient<Channel> {
    let ch = Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(3))
        .connect_lazy();
    KvClient::new(ch)
}

#[derive(Debug, Clone)]
struct Acked {
    key: String,
    value: String,
    rev: i64,
}

/// Counts for the report, so a vacuous run (nothing written, no crash point reached) shows.
#[derive(Debug, Default)]
struct Report {
    lives: u64,
    /// Crashes by the WAL op the failpoint fired on ("timer": it did not fire within 10 s).
    crash_points: BTreeMap<String, u64>,
    members_crashed: u64,
    whole_cluster_crashes: u64,
    sled_wiped: u64,
    sled_kept: u64,
    acked: u64,
    failed_writes: u64,
    /// Acknowledged-write checks done (each acknowledged write is checked after every later
    /// restart).
    ack_checks: u64,
    final_revision: i64,
    /// Members that stopped on their own on the WAL failure before being stopped.
    storage_exits: u64,
}

async fn writer(
    urls: Vec<String>,
    name: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut clients: Vec<_> = urls.iter().map(|u| client(u)).collect();
    let mut failed = 0;
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let key = format!("{PREFIX}{name}/{seq:06}");
        let value = format!("{seed}-{seq}");
        let m = rng.gen_range(0..clients.len());
        let req = PutRequest {
            key: key.clone().into(),
            value: value.clone().into(),
            ..Default::default()
        };
        match clients[m].put(req).await {
            Ok(r) => acked.lock().unwrap().push(Acked {
                key,
                value,
                rev: r.into_inner().header.unwrap().revision,
            }),
            Err(_) => {
                failed += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    failed
}

/// One member's linearizable (or serializable) view of the whole key space.
async fn listing(url: &str, serializable: bool) -> Result<(i64, Vec<KeyValue>), String> {
    let mut c = client(url);
    let r = c
        .range(RangeRequest {
            key: PREFIX.into(),
            range_end: "pl0".into(),
            serializable,
            ..Default::default()
        })
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner();
    Ok((r.header.unwrap().revision, r.kvs))
}

/// The check after a restart (see the module doc).
async fn check(
    urls: &[String],
    acked: &[Acked],
    converge: Duration,
    report: &mut Report,
) -> Result<(), String> {
    let deadline = Instant::now() + converge;
    let mut views: Vec<Result<(i64, Vec<KeyValue>), String>>;
    let converged = loop {
        views = Vec::new();
        for u in urls {
            views.push(listing(u, false).await);
        }
        let revs: BTreeSet<i64> = views.iter().flatten().map(|v| v.0).collect();
        if views.iter().all(Result::is_ok) && revs.len() == 1 {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if !converged {
        // Still report lost writes where a member answers at all.
        for (i, u) in urls.iter().enumerate() {
            if views[i].is_err() {
                views[i] = listing(u, true).await;
            }
        }
    }
    for (i, v) in views.iter().enumerate() {
        let Ok((_, kvs)) = v else { continue };
        let have: BTreeMap<&[u8], &KeyValue> = kvs.iter().map(|kv| (&kv.key[..], kv)).collect();
        for a in acked {
            report.ack_checks += 1;
            match have.get(a.key.as_bytes()) {
                Some(kv) if kv.value == a.value.as_bytes() && kv.mod_revision == a.rev => {}
                found => {
                    return Err(format!(
                        "lost acknowledged write on m{i}: {}={} at revision {}; member has {:?}",
                        a.key,
                        a.value,
                        a.rev,
                        found.map(|kv| (String::from_utf8_lossy(&kv.value), kv.mod_revision))
                    ))
                }
            }
        }
    }
    if !converged {
        let summary: Vec<String> = views
            .iter()
            .map(|v| match v {
                Ok((rev, kvs)) => format!("revision {rev}, {} keys", kvs.len()),
                Err(e) => e.clone(),
            })
            .collect();
        return Err(format!(
            "members did not converge within {converge:?}: {summary:?}"
        ));
    }
    let views: Vec<(i64, Vec<KeyValue>)> = views.into_iter().map(Result::unwrap).collect();
    for (i, v) in views.iter().enumerate().skip(1) {
        if v.1 != views[0].1 {
            let diff =
                v.1.iter()
                    .zip(&views[0].1)
                    .find(|(a, b)| a != b)
                    .map(|(a, b)| format!("m{i} {a:?} vs m0 {b:?}"));
            return Err(format!(
                "members disagree at revision {}: m0 has {} keys, m{i} {}; first difference: {diff:?}",
                v.0,
                views[0].1.len(),
                v.1.len()
            ));
        }
    }
    let (rev, kvs) = &views[0];
    let mut revs: Vec<i64> = kvs.iter().map(|kv| kv.mod_revision).collect();
    revs.sort_unstable();
    let expected: Vec<i64> = (2..=*rev).collect();
    if revs != expected {
        let missing: Vec<i64> = expected
            .iter()
            .filter(|r| revs.binary_search(r).is_err())
            .copied()
            .take(10)
            .collect();
        // A revision taken by no surviving key was overwritten: the same put applied twice.
        let twice: Vec<String> = kvs
            .iter()
            .filter(|kv| kv.version != 1)
            .map(|kv| {
                format!(
                    "{} (version {}, created at {}, modified at {})",
                    String::from_utf8_lossy(&kv.key),
                    kv.version,
                    kv.create_revision,
                    kv.mod_revision
                )
            })
            .collect();
        return Err(format!(
            "history at revision {rev} is not one write per revision: missing {missing:?}, \
             {} writes; keys written more than once: {twice:?}",
            revs.len()
        ));
    }
    report.final_revision = *rev;
    Ok(())
}

/// One seeded run of `lives` power losses.
async fn power_loss_run(seed: u64, lives: u64, opts: RunOpts) -> (Report, Result<(), String>) {
    let mut report = Report::default();
    let res = run_inner(seed, lives, &opts, &mut report).await;
    (report, res)
}

async fn run_inner(
    seed: u64,
    lives: u64,
    opts: &RunOpts,
    report: &mut Report,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let snapshot_count = if rng.gen_bool(0.5) { 40 } else { 100_000 };
    let wal = WalOptions {
        segment_size: 16 << 10,
        unsafe_no_fsync: opts.unsafe_no_fsync,
        ..Default::default()
    };
    eprintln!("powerloss: seed {seed} (snapshot-count {snapshot_count})");
    let mut sim = Sim::new(wal, snapshot_count);
    for i in 0..3 {
        sim.start(i);
    }
    // See the module doc, sled: a wipe is a state sled can come back in only if the log was
    // never purged below a flush (with fsync off nothing is a state it can come back in: that
    // test wipes).
    let opts = &RunOpts {
        sled_keep: if snapshot_count < 100_000 && !opts.unsafe_no_fsync {
            1.0
        } else {
            opts.sled_keep
        },
        ..opts.clone()
    };
    let res = lives_loop(&mut sim, &mut rng, lives, opts, report).await;
    for i in 0..3 {
        if let Some(h) = sim.signal_stop(i) {
            let _ = sim.join(i, h).await;
        }
    }
    res
}

async fn lives_loop(
    sim: &mut Sim,
    rng: &mut StdRng,
    lives: u64,
    opts: &RunOpts,
    report: &mut Report,
) -> Result<(), String> {
    let acked = Arc::new(Mutex::new(Vec::<Acked>::new()));
    // Members whose sled was kept at a crash: it was flushed (see the module doc, sled).
    let mut flushed = [false; 3];
    check(&sim.urls(), &[], opts.converge, report)
        .await
        .map_err(|e| format!("initial cluster: {e}"))?;
    for life in 0..lives {
        let fail = |e: String| format!("life {life}: {e}");
        // Writers, through every member.
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                tokio::spawn(writer(
                    sim.urls(),
                    format!("{life:03}-{w}"),
                    rng.gen(),
                    stop.clone(),
                    acked.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..400))).await;

        // Which members lose power, and at which of the first one's WAL ops.
        let mut members = vec![0, 1, 2];
        members.shuffle(rng);
        let k = if opts.crash_all {
            3
        } else {
            rng.gen_range(1..=3)
        };
        members.truncate(k);
        let trigger = members[0];
        let fs = sim.nodes[trigger].fs.clone();
        fs.fail_after(rng.gen_range(0..300));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fs.failpoint_tripped() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let point = fs.tripped_on().unwrap_or("timer").to_string();
        for &m in &members {
            sim.nodes[m].fs.fail_after(0);
        }
        *report.crash_points.entry(point).or_default() += 1;
        report.members_crashed += k as u64;
        report.whole_cluster_crashes += (k == 3) as u64;

        let handles: Vec<_> = members
            .iter()
            .map(|&m| (m, sim.signal_stop(m).expect("running")))
            .collect();
        for (m, h) in handles {
            // A member whose WAL failed may already have exited on the storage error (as etcd
            // does); that is the power going out a little later, not a failure of the test.
            match sim.join(m, h).await {
                Ok(Exit::Stopped) => {}
                Ok(Exit::OnStorageError(_)) => report.storage_exits += 1,
                Ok(other) => return Err(fail(other.describe(m))),
                Err(e) => return Err(fail(e)),
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            report.failed_writes += w.await.unwrap();
        }

        // Power comes back.
        for &m in &members {
            sim.nodes[m].fs.crash(rng);
            let db = sim.nodes[m].data_dir.join("member/sm/db");
            // Drawn even when the answer is forced, so a seed replays the same draws.
            let keep = rng.gen_bool(opts.sled_keep) || flushed[m];
            flushed[m] |= keep;
            if keep {
                report.sled_kept += 1;
            } else {
                std::fs::remove_dir_all(&db).map_err(|e| fail(format!("wipe sled: {e}")))?;
                report.sled_wiped += 1;
            }
            sim.start(m);
        }
        let acked_now = acked.lock().unwrap().clone();
        report.acked = acked_now.len() as u64;
        report.lives += 1;
        if let Err(e) = check(&sim.urls(), &acked_now, opts.converge, report).await {
            return Err(fail(format!(
                "after crashing {members:?} at {:?}: {e}; member exits: {:?}",
                report.crash_points,
                sim.exits()
                    .iter()
                    .map(|(i, e)| e.describe(*i))
                    .collect::<Vec<_>>()
            )));
        }
    }
    Ok(())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

fn seed() -> u64 {
    env_u64("KVD_POWERLOSS_SEED").unwrap_or_else(rand::random)
}

async fn run_and_assert(lives: u64) {
    let seed = seed();
    let opts = RunOpts {
        unsafe_no_fsync: false,
        sled_keep: 0.5,
        crash_all: false,
        converge: Duration::from_secs(60),
    };
    let (report, res) = power_loss_run(seed, lives, opts).await;
    eprintln!("powerloss: seed {seed}: {report:?}");
    if let Err(e) = res {
        panic!("power-loss run failed (replay with KVD_POWERLOSS_SEED={seed}): {e}");
    }
    assert_eq!(report.lives, lives);
    assert!(report.acked > 0, "nothing was acknowledged: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_node_power_loss_keeps_acknowledged_writes() {
    run_and_assert(env_u64("KVD_POWERLOSS_LIVES").unwrap_or(6)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn whole_node_power_loss_long() {
    run_and_assert(env_u64("KVD_POWERLOSS_LIVES").unwrap_or(60)).await;
}

/// A member whose WAL cannot be written stops serving and exits with the storage error, as
/// etcd does, instead of staying up with Raft stopped; the other two members go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_exits_when_its_wal_fails() {
    let wal = WalOptions {
        segment_size: 16 << 10,
        unsafe_no_fsync: false,
        ..Default::default()
    };
    let mut sim = Sim::new(wal, 100_000);
    for i in 0..3 {
        sim.start(i);
    }
    let urls = sim.urls();
    let put = |url: String, key: String| async move {
        let req = PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        client(&url).put(req).await
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while put(urls[0].clone(), "first".into()).await.is_err() {
        assert!(Instant::now() < deadline, "no leader within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sim.nodes[1].fs.fail_after(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    let exit = loop {
        n += 1;
        let _ = put(urls[n % 3].clone(), format!("k{n}")).await;
        if let Some(e) = sim.exits().pop() {
            break e;
        }
        assert!(Instant::now() < deadline, "m1 still runs with a failed WAL");
    };
    assert!(
        matches!(exit, (1, Exit::OnStorageError(_))),
        "{}",
        exit.1.describe(exit.0)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while put(urls[0].clone(), "after".into()).await.is_err()
        && put(urls[2].clone(), "after".into()).await.is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the two healthy members stopped serving"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in [0, 2] {
        let h = sim.signal_stop(i).expect("running");
        let exit = sim.join(i, h).await.unwrap();
        assert!(matches!(exit, Exit::Stopped), "{}", exit.describe(i));
    }
}

/// The check can fail: with `unsafe_no_fsync` a member acknowledges appends that never reach
/// the disk, so when every member loses power (and sled comes back at its last flush) writes
/// the clients were told about are gone, and the check must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_node_check_catches_acks_without_fsync() {
    let seed = seed();
    let opts = RunOpts {
        unsafe_no_fsync: true,
        sled_keep: 0.0,
        crash_all: true,
        // The members often cannot even elect a leader again (their logs are gone); the loss
        // is then reported from their serializable views.
        converge: Duration::from_secs(15),
    };
    let (report, res) = power_loss_run(seed, 3, opts).await;
    eprintln!("powerloss (no fsync): seed {seed}: {report:?}: {res:?}");
    let e = res
        .expect_err("a cluster that never fsyncs lost nothing after 3 whole-cluster power losses");
    // Caught in any of three ways: writes the clients were told about are gone; the members
    // find garbage where acknowledged records should be and refuse to start (naming file and
    // offset); or a member's log kept a purge record that was never synced while its state
    // machine (never flushed, so wiped) is empty, and openraft refuses to start it because the
    // entries it would re-apply are purged (seen once in a full `cargo test`, timing-dependent).
    assert!(
        e.contains("lost acknowledged write")
            || e.contains("wal corrupt")
            || e.contains("Cannot re-apply logs"),
        "seed {seed}: {e}"
    );
}
