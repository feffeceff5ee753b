//! The seeded fault schedule: one fault at a time, held for a random while, then undone.
//! The same seed gives the same sequence of fault kinds and timings (which member is the
//! leader at each step depends on the run).

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::Rng;

use crate::common::faults::{LinkMode, ProxiedCluster};

async fn sleep_ms(rng: &mut StdRng, lo: u64, hi: u64) {
    tokio::time::sleep(Duration::from_millis(rng.gen_range(lo..hi))).await;
}

/// The leader (or, if none is claimed right now, a random member).
async fn target(pc: &ProxiedCluster, rng: &mut StdRng) -> usize {
    match pc.claimed_leader().await {
        Some(l) => l,
        None => rng.gen_range(0..pc.n()),
    }
}

/// Injects faults for `len`; returns what it did, in order.
pub async fn run(pc: &mut ProxiedCluster, rng: &mut StdRng, len: Duration) -> Vec<String> {
    let start = Instant::now();
    let mut log = Vec::new();
    while start.elapsed() < len {
        sleep_ms(rng, 500, 2000).await;
        let t = start.elapsed().as_secs_f32();
        let what = match rng.gen_range(0..7) {
            0 => {
                let l = target(pc, rng).await;
                pc.kill9(l);
                sleep_ms(rng, 500, 3000).await;
                pc.restart(l);
                format!("kill -9 leader m{l}")
            }
            1 => {
                let i = rng.gen_range(0..pc.n());
                pc.kill9(i);
                sleep_ms(rng, 500, 3000).await;
                pc.restart(i);
                format!("kill -9 m{i}")
            }
            2 => {
                for i in 0..pc.n() {
                    pc.kill9(i);
                }
                sleep_ms(rng, 200, 1500).await;
                for i in 0..pc.n() {
                    pc.restart(i);
                }
                "kill -9 all".to_string()
            }
            3 => {
                let l = target(pc, rng).await;
                pc.pause(l);
                sleep_ms(rng, 1000, 4000).await;
                pc.resume(l);
                format!("SIGSTOP leader m{l}")
            }
            4 => {
                let l = target(pc, rng).await;
                pc.isolate(l);
                sleep_ms(rng, 2000, 5000).await;
                pc.heal();
                format!("isolate leader m{l}")
            }
            5 => {
                let from = rng.gen_range(0..pc.n());
                let to = (from + rng.gen_range(1..pc.n())) % pc.n();
                pc.set_link(from, to, LinkMode::DropRequests);
                sleep_ms(rng, 2000, 5000).await;
                pc.heal();
                format!("one-way drop m{from}->m{to}")
            }
            _ => {
                let d = Duration::from_millis(rng.gen_range(20..200));
                pc.set_all_links(LinkMode::Delay(d));
                sleep_ms(rng, 2000, 5000).await;
                pc.heal();
                format!("latency {d:?} on every link")
            }
        };
        eprintln!("chaos: t={t:.1}s {what}");
        log.push(what);
        // Let the cluster settle a little so faults do not all land during one election.
        let _ = tokio::time::timeout(Duration::from_secs(5), wait_leader(pc)).await;
    }
    log
}

async fn wait_leader(pc: &ProxiedCluster) {
    while pc.claimed_leader().await.is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Undoes everything: links heal, paused members resume, dead ones restart; waits for a leader.
pub async fn recover(pc: &mut ProxiedCluster) {
    pc.heal();
    for i in 0..pc.n() {
        if pc.running(i) {
            pc.resume(i);
        } else {
            pc.restart(i);
        }
    }
    pc.c.wait_for_leader(Duration::from_secs(30)).await;
}
