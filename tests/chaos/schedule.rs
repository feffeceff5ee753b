//! The seeded fault schedule: one fault at a time, held for a random while, then undone.
//! The same seed gives the same sequence of fault kinds and timings (which member is the
//! leader at each step, and so which members the faults hit, depends on the run).
//!
//! Three families, drawn 4:3:3: member faults (kill -9, SIGSTOP,
//! member-to-member partitions and latency), client faults (the proxy in front of one member's
//! client port blackholes, drops one direction, resets connections or adds latency), and
//! membership steps (see `membership.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::Rng;

use crate::common::faults::{LinkMode, ProxiedCluster};
use crate::membership::{self, Outcomes};
use crate::workload::Targets;

/// What the schedule did: each fault's kind (for the summary) and description.
#[derive(Debug, Default)]
pub struct Faults {
    pub log: Vec<(&'static str, String)>,
    pub membership: Outcomes,
}

impl Faults {
    pub fn by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for (k, _) in &self.log {
            *m.entry(*k).or_default() += 1;
        }
        m
    }
}

async fn sleep_ms(rng: &mut StdRng, lo: u64, hi: u64) {
    tokio::time::sleep(Duration::from_millis(rng.gen_range(lo..hi))).await;
}

/// A random current member.
fn any(pc: &ProxiedCluster, rng: &mut StdRng) -> usize {
    pc.live[rng.gen_range(0..pc.live.len())]
}

/// The leader (or, if none is claimed right now, a random member).
async fn target(pc: &ProxiedCluster, rng: &mut StdRng) -> usize {
    match pc.claimed_leader().await {
        Some(l) if pc.live.contains(&l) => l,
        _ => any(pc, rng),
    }
}

/// Injects faults for `len`; returns what it did, in order.
pub async fn run(
    pc: &mut ProxiedCluster,
    rng: &mut StdRng,
    len: Duration,
    targets: &Targets,
) -> Faults {
    let start = Instant::now();
    let mut faults = Faults::default();
    while start.elapsed() < len {
        sleep_ms(rng, 500, 2000).await;
        let t = start.elapsed().as_secs_f32();
        let (kind, what) = match rng.gen_range(0..10) {
            0..=3 => member_fault(pc, rng).await,
            4..=6 => client_fault(pc, rng).await,
            _ => membership::step(pc, rng, targets, &mut faults.membership).await,
        };
        eprintln!("chaos: t={t:.1}s {kind}: {what}");
        faults.log.push((kind, what));
        // Let the cluster settle a little so faults do not all land during one election.
        let _ = tokio::time::timeout(Duration::from_secs(5), wait_leader(pc)).await;
    }
    faults
}

/// Kills, pauses, partitions or slows members (member-to-member links).
async fn member_fault(pc: &mut ProxiedCluster, rng: &mut StdRng) -> (&'static str, String) {
    match rng.gen_range(0..7) {
        0 => {
            let l = target(pc, rng).await;
            pc.kill9(l);
            sleep_ms(rng, 500, 3000).await;
            pc.restart(l);
            ("kill -9 leader", format!("m{l}"))
        }
        1 => {
            let i = any(pc, rng);
            pc.kill9(i);
            sleep_ms(rng, 500, 3000).await;
            pc.restart(i);
            ("kill -9 a member", format!("m{i}"))
        }
        2 => {
            let live = pc.live.clone();
            for &i in &live {
                pc.kill9(i);
            }
            sleep_ms(rng, 200, 1500).await;
            for &i in &live {
                pc.restart(i);
            }
            ("kill -9 all", format!("{live:?}"))
        }
        3 => {
            let l = target(pc, rng).await;
            pc.pause(l);
            sleep_ms(rng, 1000, 4000).await;
            pc.resume(l);
            ("SIGSTOP leader", format!("m{l}"))
        }
        4 => {
            let l = target(pc, rng).await;
            pc.isolate(l);
            sleep_ms(rng, 2000, 5000).await;
            pc.heal();
            ("isolate leader", format!("m{l}"))
        }
        5 => {
            let from = any(pc, rng);
            let to = loop {
                let to = any(pc, rng);
                if to != from {
                    break to;
                }
            };
            pc.set_link(from, to, LinkMode::DropRequests);
            sleep_ms(rng, 2000, 5000).await;
            pc.heal();
            ("one-way drop member->member", format!("m{from}->m{to}"))
        }
        _ => {
            let d = Duration::from_millis(rng.gen_range(20..200));
            pc.set_all_links(LinkMode::Delay(d));
            sleep_ms(rng, 2000, 5000).await;
            pc.heal();
            ("latency on every member link", format!("{d:?}"))
        }
    }
}

/// Faults between the clients and one member (the leader half the time), through the proxy
/// in front of its client port. Requests cut mid-flight time out: clients record writes among
/// them as unknown (maybe applied).
async fn client_fault(pc: &mut ProxiedCluster, rng: &mut StdRng) -> (&'static str, String) {
    let x = if rng.gen_bool(0.5) {
        target(pc, rng).await
    } else {
        any(pc, rng)
    };
    let (kind, what) = match rng.gen_range(0..5) {
        0 => {
            // Open connections go silent; requests on them hang until the client's timeout.
            pc.set_client(x, LinkMode::Hang);
            sleep_ms(rng, 2000, 5000).await;
            ("partition clients from member", format!("m{x}"))
        }
        1 => {
            pc.set_client(x, LinkMode::DropRequests);
            sleep_ms(rng, 2000, 5000).await;
            ("cut client->member one way", format!("m{x}"))
        }
        2 => {
            // Requests arrive and take effect; their replies are lost.
            pc.set_client(x, LinkMode::DropReplies);
            sleep_ms(rng, 2000, 5000).await;
            ("cut member->client one way", format!("m{x}"))
        }
        3 => {
            // Resets at random moments cut requests in flight.
            let n = rng.gen_range(3..10);
            for _ in 0..n {
                sleep_ms(rng, 100, 600).await;
                pc.reset_clients(x);
            }
            ("reset client connections", format!("m{x}, {n} times"))
        }
        _ => {
            let d = Duration::from_millis(rng.gen_range(20..400));
            pc.set_client(x, LinkMode::Delay(d));
            sleep_ms(rng, 2000, 5000).await;
            ("client latency to member", format!("m{x} {d:?}"))
        }
    };
    pc.heal();
    (kind, what)
}

async fn wait_leader(pc: &ProxiedCluster) {
    while pc.claimed_leader().await.is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Undoes everything: links heal, paused members resume, dead ones restart; waits for a
/// leader; then settles membership (a learner still waiting is promoted, the harness agrees
/// with the member list).
pub async fn recover(pc: &mut ProxiedCluster, targets: &Targets, out: &mut Outcomes) {
    pc.heal();
    for i in pc.live.clone() {
        if pc.running(i) {
            pc.resume(i);
        } else {
            pc.restart(i);
        }
    }
    pc.c.wait_for_leader(Duration::from_secs(30)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(members) = membership::member_list(pc).await {
            for note in membership::reconcile(pc, &members, targets).await {
                eprintln!("chaos: recovery: {note}");
            }
            match members.iter().find(|m| m.is_learner) {
                None => break,
                Some(l) => eprintln!(
                    "chaos: recovery: {}",
                    membership::promote(pc, l.id, out).await
                ),
            }
        }
        assert!(
            Instant::now() < deadline,
            "membership did not settle after the faults"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pc.c.wait_for_leader(Duration::from_secs(30)).await;
}
