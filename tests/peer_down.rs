//! A member that is down must cost the leader next to nothing: bounded CPU and log volume
//! while it stays down, and a quick catch-up once it is back.

mod common;

use std::time::{Duration, Instant};

use common::faults::{LinkMode, ProxiedCluster};
use common::{put, Cluster};
use kvd::proto::etcdserverpb::RangeRequest;

/// How long the leader is watched while the member is down.
const WINDOW: Duration = Duration::from_secs(10);
/// Log growth allowed over `WINDOW`: a few reports, not a line per retry
/// (docs/decisions/0012-paced-peer-retries.md).
const MAX_LOG_GROWTH: u64 = 4096;
/// CPU allowed over `WINDOW`, as a fraction of one core (debug build).
const MAX_CPU: f64 = 0.20;
/// Failed RPCs to the down member per second allowed: heartbeats (10/s), probes (2/s) and
/// paced replication retries; an unpaced retry loop is far above it
/// (docs/decisions/0012-paced-peer-retries.md).
const MAX_FAILURES_PER_SEC: f64 = 25.0;

/// Plain HTTP/1.0 GET of a member's metrics (no client crate needed).
async fn metrics(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    buf
}

/// This member's failed RPCs to any peer so far.
async fn peer_failures(port: u16) -> f64 {
    metrics(port)
        .await
        .lines()
        .filter(|l| l.starts_with("etcd_network_peer_sent_failures_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

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
    eprintln!(
        "{what}: leader cpu {:.1}% of a core, log +{grown} bytes",
        cpu * 100.0
    );
    assert!(
        grown <= MAX_LOG_GROWTH,
        "{what}: leader log grew {grown} bytes in {WINDOW:?}; tail:\n{tail}"
    );
    assert!(
        cpu <= MAX_CPU,
        "{what}: leader used {:.0}% of a core in {WINDOW:?}; tail:\n{tail}",
        cpu * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_follower_costs_the_leader_little_and_catches_up_at_once() {
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let mut c = Cluster::start_custom(3, false, |i| {
        vec![format!(
            "--listen-metrics-urls=http://127.0.0.1:{}",
            ports[i]
        )]
    })
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = (leader + 1) % 3;
    let mut kv = c.kv(leader).await;
    put(&mut kv, "before", "1").await.unwrap();

    c.kill(f);
    // The first failures are reported (once); the window starts after them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log_path = c.members[leader].log.clone();
    let (failed0, t0) = (peer_failures(ports[leader]).await, Instant::now());
    leader_stays_quiet(
        "killed follower",
        c.members[leader].pid(),
        &log_path,
        || c.log_of(leader),
    )
    .await;
    let rate = (peer_failures(ports[leader]).await - failed0) / t0.elapsed().as_secs_f64();
    eprintln!("killed follower: {rate:.1} failed RPCs/s to it");
    assert!(
        rate > 0.0 && rate <= MAX_FAILURES_PER_SEC,
        "the leader retried the down member {rate:.1} times a second"
    );

    // The cluster keeps a quorum and takes writes meanwhile.
    for i in 0..20 {
        put(&mut kv, &format!("during{i}"), "x").await.unwrap();
    }
    let log = c.log_of(leader);
    assert!(
        log.matches("peer stopped answering").count() >= 1,
        "the leader says which peer is gone and why:\n{log}"
    );

    // Back: it is seen within a heartbeat or a probe, and catch-up starts at once. Timed from
    // the member's "ready" line (its own start-up, slow in a loaded debug build, is not what
    // is judged) to a local (serializable) read seeing the last write.
    c.spawn(f);
    let ready = "ready to serve client requests";
    let up = Instant::now();
    while c.log_of(f).matches(ready).count() < 2 {
        assert!(
            up.elapsed() < Duration::from_secs(30),
            "member did not start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = Instant::now();
    let mut fkv = c.kv(f).await;
    loop {
        let r = fkv
            .range(RangeRequest {
                key: b"during19".to_vec(),
                serializable: true,
                ..Default::default()
            })
            .await;
        if r.is_ok_and(|r| !r.into_inner().kvs.is_empty()) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "restarted member not caught up {:?} after it was ready\n{}",
            t.elapsed(),
            c.log_of(f)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("caught up {:?} after it was ready", t.elapsed());
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
