//! Chaos tests: clients run put/get/delete/compare-and-set through every member while a seeded
//! random schedule kills (-9), pauses, partitions and slows members, cuts clients off from
//! members, and adds, promotes and removes members; then the recorded history
//! is checked for linearizability, watch streams for order/gaps/prev_kv, and every member's
//! full watch history for every acknowledged write. Every run prints its seed;
//! `KVD_CHAOS_SEED=N` replays a schedule, `KVD_CHAOS_SECS=N` sets the fault phase's length.
//! See docs/testing.md.

mod common;
#[path = "chaos/membership.rs"]
mod membership;
#[path = "chaos/schedule.rs"]
mod schedule;
#[path = "chaos/workload.rs"]
mod workload;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::faults::{LinkMode, ProxiedCluster};
use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::RangeRequest;
use kvd_testkit::linearizability::watch::check_watches;
use kvd_testkit::linearizability::{check_history, CheckOptions, Input, Outcome, Output, Recorder};
use rand::rngs::StdRng;
use rand::SeedableRng;
use workload::{client_loop, lazy_channel, run_op, watch_loop, watch_session, Targets, PREFIX};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number"))
    })
}

/// Summary of one chaos run.
#[derive(Debug, Default)]
struct RunStats {
    operations: usize,
    unknown: usize,
    faults: usize,
    watch_events: usize,
    by_kind: BTreeMap<&'static str, usize>,
    membership: membership::Outcomes,
}

impl RunStats {
    fn add(&mut self, s: &RunStats) {
        self.operations += s.operations;
        self.unknown += s.unknown;
        self.faults += s.faults;
        self.watch_events += s.watch_events;
        for (k, v) in &s.by_kind {
            *self.by_kind.entry(k).or_default() += v;
        }
        self.membership.add(&s.membership);
    }

    fn summary(&self) -> String {
        format!(
            "faults by kind: {:?}; membership changes applied: {:?}; membership requests refused: {:?}",
            self.by_kind, self.membership.applied, self.membership.refused
        )
    }
}

/// Member slots prepared for members added during a run of `secs` (a membership step adds
/// at most one; the schedule stops adding when they run out).
fn spares_for(secs: u64) -> usize {
    (secs as usize / 8).clamp(3, 12)
}

async fn chaos_run(seed: u64, secs: u64, clients: u64, keys: usize) -> RunStats {
    chaos_run_with(seed, secs, clients, keys, false).await
}

/// `chaos_run`; with `peer_tls` the members speak mutual TLS to each other.
async fn chaos_run_with(
    seed: u64,
    secs: u64,
    clients: u64,
    keys: usize,
    peer_tls: bool,
) -> RunStats {
    eprintln!("chaos: seed {seed} ({secs} s of faults); replay with KVD_CHAOS_SEED={seed}");
    let t0 = Instant::now();
    let mut pc = ProxiedCluster::start_with_spares_tls(3, spares_for(secs), &[], peer_tls).await;
    // Clients reach members through the client proxies, so client faults apply to them.
    let targets = Targets::new(
        (0..pc.n()).map(|i| pc.proxied_client_url(i)).collect(),
        &pc.live,
    );
    let rec = Recorder::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for id in 0..clients {
        tasks.push(tokio::spawn(client_loop(
            rec.clone(),
            id,
            seed.wrapping_mul(1000).wrapping_add(id),
            targets.clone(),
            keys,
            stop.clone(),
        )));
    }
    let watches = Arc::new(Mutex::new(Vec::new()));
    let watchers: Vec<_> = (0..2)
        .map(|id| {
            tokio::spawn(watch_loop(
                targets.clone(),
                id,
                stop.clone(),
                watches.clone(),
            ))
        })
        .collect();

    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = schedule::run(&mut pc, &mut rng, Duration::from_secs(secs), &targets).await;

    eprintln!("chaos: faults over at {:.1}s", t0.elapsed().as_secs_f32());
    schedule::recover(&mut pc, &targets, &mut faults.membership).await;
    eprintln!("chaos: recovered at {:.1}s", t0.elapsed().as_secs_f32());
    // Let clients see the healed cluster briefly, then stop them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    for w in watchers {
        w.await.unwrap();
    }
    // The remaining members, read directly (every proxy passes again anyway).
    let urls: Vec<(usize, String)> = pc
        .live
        .iter()
        .map(|&i| (i, pc.c.members[i].client_url()))
        .collect();

    // Final linearizable reads of every key on every member: part of the history.
    for (i, url) in &urls {
        let mut c = KvClient::new(lazy_channel(url));
        for k in 0..keys {
            let key = format!("{PREFIX}{k}");
            let deadline = Instant::now() + Duration::from_secs(30);
            while !matches!(
                run_op(&rec, 1000 + *i as u64, &mut c, &key, Input::Get, false).await,
                Outcome::Ok(_)
            ) {
                assert!(Instant::now() < deadline, "member {i} cannot serve a read");
            }
        }
    }

    // Each member's whole history, from revision 1, must hold every acknowledged write.
    // Read concurrently: each replay ends only after its idle timeout.
    let mut all_watches = watches.lock().unwrap().clone();
    let histories = urls.iter().map(|(i, url)| async move {
        let mut c = KvClient::new(lazy_channel(url));
        let rev = c
            .range(RangeRequest {
                key: PREFIX.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .revision;
        let mut h = watch_session(
            url,
            format!("final history of m{i} through {rev}"),
            1,
            Duration::from_secs(2),
            Arc::new(AtomicBool::new(false)),
        )
        .await;
        h.complete_through = rev;
        h
    });
    all_watches.extend(futures::future::join_all(histories).await);

    eprintln!(
        "chaos: final reads done at {:.1}s",
        t0.elapsed().as_secs_f32()
    );
    let ops = rec.operations();
    let report = check_history(&ops, &CheckOptions::default());
    let watch_report = check_watches(&ops, &all_watches);
    eprintln!("chaos: checked at {:.1}s", t0.elapsed().as_secs_f32());
    let stats = RunStats {
        operations: ops.len(),
        unknown: ops.iter().filter(|o| o.outcome == Outcome::Unknown).count(),
        faults: faults.log.len(),
        watch_events: watch_report.events,
        by_kind: faults.by_kind(),
        membership: std::mem::take(&mut faults.membership),
    };
    let acked_writes = ops
        .iter()
        .filter(|o| o.input.is_write() && matches!(o.outcome, Outcome::Ok(_)))
        .count();
    eprintln!(
        "chaos: seed {seed}: {} ops ({acked_writes} acknowledged writes, {} unknown), {} faults; members at the end: {:?}",
        stats.operations, stats.unknown, stats.faults, pc.live
    );
    eprintln!("chaos: seed {seed}: {}", stats.summary());
    eprintln!("chaos: linearizability: {report}");
    eprintln!(
        "chaos: watches: {} streams, {} events, {} problems",
        watch_report.watches,
        watch_report.events,
        watch_report.problems.len()
    );
    if !report.is_ok() || !watch_report.problems.is_empty() {
        dump(seed, &ops, &all_watches);
    }
    assert!(
        acked_writes > 50,
        "too few writes acknowledged to mean anything"
    );
    assert!(report.is_ok(), "seed {seed}: not linearizable:\n{report}");
    assert!(
        stats.membership.unexpected().is_empty(),
        "seed {seed}: unexpected membership errors: {:?}",
        stats.membership.unexpected()
    );
    assert!(
        watch_report.problems.is_empty(),
        "seed {seed}: watch problems:\n{}",
        watch_report.problems.join("\n")
    );
    stats
}

/// Writes a failing run's history and watch streams to the temp dir for inspection.
fn dump(
    seed: u64,
    ops: &[kvd_testkit::linearizability::Operation],
    watches: &[kvd_testkit::linearizability::watch::WatchHistory],
) {
    use std::fmt::Write;
    let mut s = String::new();
    let mut sorted: Vec<_> = ops.iter().collect();
    sorted.sort_by_key(|o| o.call);
    for o in sorted {
        let _ = writeln!(s, "{} {o}", String::from_utf8_lossy(&o.key));
    }
    for w in watches {
        let _ = writeln!(s, "== {} (through {})", w.name, w.complete_through);
        for e in &w.events {
            let _ = writeln!(
                s,
                "{} {} {:?} {:?} prev {:?}",
                e.mod_revision,
                String::from_utf8_lossy(&e.key),
                e.kind,
                String::from_utf8_lossy(&e.value),
                e.prev
            );
        }
    }
    let path = std::env::temp_dir().join(format!("kvd-chaos-{seed}.txt"));
    std::fs::write(&path, s).unwrap();
    eprintln!(
        "chaos: history and watch streams written to {}",
        path.display()
    );
}

fn seed() -> u64 {
    env_u64("KVD_CHAOS_SEED").unwrap_or_else(rand::random)
}

/// Part of `cargo test`: about 40 s on two cores (25 s of faults).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short() {
    let secs = env_u64("KVD_CHAOS_SECS").unwrap_or(25);
    chaos_run(seed(), secs, 6, 4).await;
}

/// The short run with peer links over mutual TLS (the proxies cut and delay TLS bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short_peer_tls() {
    let secs = env_u64("KVD_CHAOS_SECS").unwrap_or(15);
    chaos_run_with(seed(), secs, 6, 4, true).await;
}

/// The long run: `cargo test --release --test chaos -- --ignored --nocapture`;
/// `KVD_CHAOS_RUNS` runs of `KVD_CHAOS_SECS` (default 5 x 120 s), seeds printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn chaos_long() {
    let secs = env_u64("KVD_CHAOS_SECS").unwrap_or(120);
    let runs = env_u64("KVD_CHAOS_RUNS").unwrap_or(5);
    let first = seed();
    let mut total = RunStats::default();
    for r in 0..runs {
        let s = chaos_run(first.wrapping_add(r), secs, 8, 6).await;
        total.add(&s);
    }
    eprintln!(
        "chaos long: {runs} runs from seed {first}: {} operations checked ({} unknown), {} faults, {} watch events, anomalies: 0",
        total.operations, total.unknown, total.faults, total.watch_events
    );
    eprintln!("chaos long: {}", total.summary());
}

/// The suite can fail: serializable reads (no read index) from a leader cut off from the
/// majority return a value the majority has already overwritten, and the checker says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checker_flags_stale_serializable_read_from_isolated_leader() {
    let pc = ProxiedCluster::start(3, &[]).await;
    let old = pc.c.wait_for_leader(Duration::from_secs(20)).await;
    let rec = Recorder::default();
    let key = format!("{PREFIX}stale");
    let mut at_old = KvClient::new(lazy_channel(&pc.c.members[old].client_url()));
    let other = (old + 1) % 3;
    let mut at_other = KvClient::new(lazy_channel(&pc.c.members[other].client_url()));
    let first = run_op(&rec, 0, &mut at_old, &key, put("v1"), false).await;
    assert!(matches!(first, Outcome::Ok(_)), "{first:?}");

    pc.isolate(old);
    // The majority elects a new leader and takes the write.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(
        run_op(&rec, 1, &mut at_other, &key, put("v2"), false).await,
        Outcome::Ok(_)
    ) {
        assert!(Instant::now() < deadline, "majority never took the write");
    }
    let stale = run_op(&rec, 2, &mut at_old, &key, Input::Get, true).await;
    let Outcome::Ok(Output::Get { kv: Some(kv) }) = &stale else {
        panic!("serializable read on the old leader: {stale:?}");
    };
    assert_eq!(kv.value, b"v1", "the isolated member cannot have v2");
    // A linearizable read on the isolated member must not return v1 (it fails instead).
    let lin = run_op(&rec, 3, &mut at_old, &key, Input::Get, false).await;
    assert!(
        !matches!(&lin, Outcome::Ok(Output::Get { kv: Some(kv) }) if kv.value == b"v1"),
        "linearizable read returned the stale value: {lin:?}"
    );
    pc.heal();

    let report = check_history(&rec.operations(), &CheckOptions::default());
    eprintln!("{report}");
    assert_eq!(report.anomalies.len(), 1, "{report}");
    let a = &report.anomalies[0];
    assert_eq!(
        a.culprit.client, 2,
        "the serializable read is the culprit: {report}"
    );
    assert!(a.kind.contains("stale"), "{report}");
}

fn put(v: &str) -> Input {
    Input::Put {
        value: v.as_bytes().to_vec(),
    }
}

/// The held-out scenario: unique keys written through every member while the leader is
/// paused for seconds, then every member is killed (-9) at once and restarted; every
/// acknowledged write must be readable, linearizably, on every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_pause_then_kill_all_loses_no_acknowledged_write() {
    let seed = seed();
    eprintln!("held-out scenario: seed {seed}");
    let mut pc = ProxiedCluster::start(3, &[]).await;
    let urls: Vec<String> = pc.c.members.iter().map(|m| m.client_url()).collect();
    let acked: Arc<Mutex<Vec<(String, String, Instant)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let rec = Recorder::default();
    let writers: Vec<_> = (0..6u64)
        .map(|id| {
            let (urls, acked, stop, rec) = (urls.clone(), acked.clone(), stop.clone(), rec.clone());
            tokio::spawn(async move {
                let mut clients: Vec<_> = urls
                    .iter()
                    .map(|u| KvClient::new(lazy_channel(u)))
                    .collect();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("{PREFIX}u/{id}/{n}");
                    let value = format!("{seed}-{id}-{n}");
                    let c = &mut clients[(id as usize + n) % 3];
                    let out = run_op(&rec, id, c, &key, put(&value), false).await;
                    if matches!(out, Outcome::Ok(_)) {
                        acked.lock().unwrap().push((key, value, Instant::now()));
                    } else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    n += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = pc.c.wait_for_leader(Duration::from_secs(10)).await;
    let before_pause = acked.lock().unwrap().len();
    pc.pause(leader);
    let paused_at = Instant::now();
    eprintln!("paused leader m{leader} after {before_pause} acknowledged writes");
    // Long enough for an election and for clients stuck on the paused member to time out.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let during = acked.lock().unwrap().len() - before_pause;
    // Writers stuck on the paused member (or forwarding to it) wait out their 3 s timeout,
    // so the first acknowledgement after the pause bounds failover from above.
    let first = acked.lock().unwrap()[before_pause..]
        .iter()
        .map(|a| a.2.duration_since(paused_at))
        .min();
    eprintln!(
        "{during} writes acknowledged while the leader was paused, the first after {first:?}; \
         kill -9 all"
    );
    for i in 0..3 {
        pc.kill9(i);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        pc.restart(i);
    }
    pc.c.wait_for_leader(Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    if during == 0 {
        let logs: String = (0..3)
            .map(|i| format!("--- m{i}\n{}", pc.c.log_of(i)))
            .collect();
        panic!("the majority took no writes while the leader was paused\n{logs}");
    }
    eprintln!(
        "checking {} acknowledged writes on every member",
        acked.len()
    );
    for (i, url) in urls.iter().enumerate() {
        let mut c = KvClient::new(lazy_channel(url));
        for (key, value, _) in &acked {
            let deadline = Instant::now() + Duration::from_secs(20);
            let got = loop {
                match run_op(&rec, 100 + i as u64, &mut c, key, Input::Get, false).await {
                    Outcome::Ok(Output::Get { kv }) => break kv,
                    _ => assert!(Instant::now() < deadline, "m{i} cannot serve reads"),
                }
            };
            assert_eq!(
                got.map(|kv| String::from_utf8(kv.value).unwrap())
                    .as_deref(),
                Some(value.as_str()),
                "m{i} lost acknowledged write {key} (seed {seed})"
            );
        }
    }
    let report = check_history(&rec.operations(), &CheckOptions::default());
    assert!(report.is_ok(), "{report}");
}

/// A write whose reply is lost (the member's replies to the client are dropped) takes effect
/// but never returns: the client records it as unknown, never as failed, and the checker
/// accepts a later read of its value. A read cut the same way is failed (it had no effect).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_cut_mid_flight_is_recorded_unknown() {
    let pc = ProxiedCluster::start(3, &[]).await;
    let rec = Recorder::default();
    let key = format!("{PREFIX}cut");
    let mut cut = KvClient::new(lazy_channel(&pc.proxied_client_url(0)));
    let mut direct = KvClient::new(lazy_channel(&pc.c.members[1].client_url()));
    // Connect first, so the request (not the connection setup) is what gets cut.
    assert!(matches!(
        run_op(&rec, 0, &mut cut, &key, Input::Get, false).await,
        Outcome::Ok(_)
    ));
    pc.set_client(0, LinkMode::DropReplies);
    let w = run_op(&rec, 0, &mut cut, &key, put("lost-reply"), false).await;
    assert_eq!(w, Outcome::Unknown);
    let r = run_op(&rec, 0, &mut cut, &key, Input::Get, false).await;
    assert_eq!(r, Outcome::Failed);
    pc.heal();
    let got = run_op(&rec, 1, &mut direct, &key, Input::Get, false).await;
    let Outcome::Ok(Output::Get { kv: Some(kv) }) = &got else {
        panic!("the write whose reply was lost did not apply: {got:?}");
    };
    assert_eq!(kv.value, b"lost-reply");
    let report = check_history(&rec.operations(), &CheckOptions::default());
    assert!(report.is_ok(), "{report}");
}
