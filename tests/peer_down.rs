//! A member that is down must cost the leader next to nothing: bounded CPU and log volume
//! while it stays down, and a quick catch-up once it is back (issue 17).

mod common;

use std::time::{Duration, Instant};

use common::faults::{LinkMode, ProxiedCluster};
use common::{get, put, Cluster};

/// How long the leader is watched while the member is down.
const WINDOW: Duration = Duration::from_secs(10);
/// Log growth allowed over `WINDOW`: a few reports, not a line per retry (it was megabytes).
const MAX_LOG_GROWTH: u64 = 4096;
/// CPU allowed over `WINDOW`, as a fraction of one core (debug build; it was a full core).
const MAX_CPU: f64 = 0.20;

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5), so 11 and 12 after the state field.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn log_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Watches the leader for `WINDOW` and fails on too much CPU or log.
async fn leader_stays_quiet(
    what: &str,
    pid: i32,
    log: &std::path::Path,
    full_log: impl Fn() -> String,
) {
    let (cpu0, len0, t0) = (cpu_seconds(pid), log_len(log), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let cpu = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();
    let grown = log_len(log) - len0;
    let log = full_log();
    let tail = &log[log.len().saturating_sub(4000)..];
    assert!(
        grown <= MAX_LOG_GROWTH,
        "{what}: leader log grew {grown} bytes in {WINDOW:?}; tail:\n{tail}"
    );
    assert!(
        cpu <= MAX_CPU,
        "{what}: leader used {:.0}% of a core in {WINDOW:?}; tail:\n{tail}",
        cpu * 100.0
    );
    eprintln!(
        "{what}: leader cpu {:.1}% of a core, log +{grown} bytes",
        cpu * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_follower_costs_the_leader_little_and_catches_up_at_once() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = (leader + 1) % 3;
    let mut kv = c.kv(leader).await;
    put(&mut kv, "before", "1").await.unwrap();

    c.kill(f);
    // The first failures are reported (once); the window starts after them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log_path = c.members[leader].log.clone();
    leader_stays_quiet(
        "killed follower",
        c.members[leader].pid(),
        &log_path,
        || c.log_of(leader),
    )
    .await;

    // The cluster keeps a quorum and takes writes meanwhile.
    for i in 0..20 {
        put(&mut kv, &format!("during{i}"), "x").await.unwrap();
    }
    let log = c.log_of(leader);
    assert!(
        log.matches("peer stopped answering").count() >= 1,
        "the leader says which peer is gone and why:\n{log}"
    );

    // Back: it is seen within a heartbeat or a probe, and catch-up starts at once.
    c.spawn(f);
    let mut fkv = common::try_channel(&c.members[f].client_url()).await;
    let up = Instant::now();
    while fkv.is_err() {
        assert!(
            up.elapsed() < Duration::from_secs(20),
            "member did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        fkv = common::try_channel(&c.members[f].client_url()).await;
    }
    let mut fkv = kvd::proto::etcdserverpb::kv_client::KvClient::new(fkv.unwrap());
    let t = Instant::now();
    loop {
        if let Ok(Some(v)) = get(&mut fkv, "during19").await {
            assert_eq!(v, "x");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "restarted member not caught up after {:?}\n{}",
            t.elapsed(),
            c.log_of(f)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("caught up {:?} after its client port answered", t.elapsed());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        c.log_of(leader).contains("peer is answering again"),
        "{}",
        c.log_of(leader)
    );
}

/// The same with packets to the member dropped (a partition): connects hang instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_follower_costs_the_leader_little() {
    let c = ProxiedCluster::start(3, &[]).await;
    let leader = c.c.wait_for_leader(Duration::from_secs(10)).await;
    let f = (leader + 1) % 3;
    c.set_link(leader, f, LinkMode::Drop);
    c.set_link((leader + 2) % 3, f, LinkMode::Drop);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log_path = c.c.members[leader].log.clone();
    leader_stays_quiet(
        "partitioned follower",
        c.c.members[leader].pid(),
        &log_path,
        || c.c.log_of(leader),
    )
    .await;
    c.heal();
}
