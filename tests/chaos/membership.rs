//! Membership changes as steps of the chaos schedule, while clients run: add a learner (a new
//! `kvd` started with the `--initial-cluster` the add printed) and promote it, or remove a
//! follower or the leader, keeping 3-5 voters.
//!
//! The member list (asked linearizably) is the truth; the harness's view (`pc.live`) is
//! reconciled with it before each step, because a change whose reply was lost (timeout, member
//! killed) may or may not have happened. etcd's refusals (unhealthy cluster, not enough started
//! members, learner not in sync, ...) and unavailability are expected outcomes: they are
//! counted by message, never fatal. A removed member's process is stopped.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvd::proto::etcdserverpb::cluster_client::ClusterClient;
use kvd::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberListRequest, MemberPromoteRequest, MemberRemoveRequest,
};
use rand::rngs::StdRng;
use rand::Rng;
use tonic::Status;

use crate::common::faults::ProxiedCluster;
use crate::workload::{lazy_channel, Targets};

/// The most voters the schedule grows to, and the fewest it shrinks to.
pub const MAX_VOTERS: usize = 5;
pub const MIN_VOTERS: usize = 3;
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a step keeps asking to promote a learner that is catching up.
const PROMOTE_FOR: Duration = Duration::from_secs(10);

/// What membership requests did: changes applied, by kind, and requests that did not
/// succeed, by etcd message (or "no answer").
#[derive(Debug, Default)]
pub struct Outcomes {
    pub applied: BTreeMap<&'static str, usize>,
    pub refused: BTreeMap<String, usize>,
}

impl Outcomes {
    fn applied(&mut self, what: &'static str) {
        *self.applied.entry(what).or_default() += 1;
    }

    pub fn add(&mut self, other: &Outcomes) {
        for (k, v) in &other.applied {
            *self.applied.entry(k).or_default() += v;
        }
        for (k, v) in &other.refused {
            *self.refused.entry(k.clone()).or_default() += v;
        }
    }

    /// Refusals a chaos run must not produce.
    pub fn unexpected(&self) -> Vec<&str> {
        self.refused
            .keys()
            .map(|k| k.as_str())
            .filter(|k| !expected(k))
            .collect()
    }
}

/// Refusals and unavailability a chaos run must tolerate; anything else fails the run.
const EXPECTED: &[&str] = &[
    "etcdserver: unhealthy cluster",
    "etcdserver: re-configuration failed due to not enough started members",
    "etcdserver: can only promote a learner member which is in sync with leader",
    "etcdserver: too many learner members in cluster",
    "etcdserver: no leader",
    "etcdserver: not leader",
    "etcdserver: leader changed",
    "etcdserver: request timed out",
    "etcdserver: server stopped",
];

/// Whether a failed membership request is an outcome chaos may produce: one of etcd's
/// refusals, or no answer (timeout, connection error; the change may still happen).
fn expected(key: &str) -> bool {
    EXPECTED.contains(&key) || key.starts_with("no answer")
}

fn note(out: &mut Outcomes, e: &Status) -> String {
    let key = if e.message().starts_with("etcdserver:") {
        e.message().to_string()
    } else {
        // Transport failures carry varying detail; their code is what matters.
        format!("no answer ({:?})", e.code())
    };
    *out.refused.entry(key.clone()).or_default() += 1;
    key
}

/// Refusals that say the change was not made and may be allowed later (etcd checks these
/// before proposing anything): worth asking again.
const DEFINITE: &[&str] = &[
    "etcdserver: unhealthy cluster",
    "etcdserver: re-configuration failed due to not enough started members",
    "etcdserver: can only promote a learner member which is in sync with leader",
    "etcdserver: no leader",
];

/// Sends `req()` until it succeeds, is refused in a way that may have had an effect (no
/// answer, timed out, ...: asking again could double it), or `budget` passes. Counts every
/// refusal; returns the value, or the last refusal and the number of tries.
async fn retrying<T, Fut>(
    out: &mut Outcomes,
    budget: Duration,
    mut req: impl FnMut() -> Fut,
) -> Result<(T, usize), (String, usize)>
where
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let deadline = Instant::now() + budget;
    let mut tries = 0;
    loop {
        tries += 1;
        match req().await {
            Ok(v) => return Ok((v, tries)),
            Err(e) => {
                let why = note(out, &e);
                if !DEFINITE.contains(&why.as_str()) || Instant::now() > deadline {
                    return Err((why, tries));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A cluster client on a running member (directly, not through its client proxy: the operator
/// is not the one being partitioned), rotating with `k`.
fn via(pc: &ProxiedCluster, k: usize) -> Option<(usize, ClusterClient<tonic::transport::Channel>)> {
    let running: Vec<usize> = pc.live.iter().copied().filter(|&i| pc.running(i)).collect();
    let i = *running.get(k % running.len().max(1))?;
    Some((
        i,
        ClusterClient::new(lazy_channel(&pc.c.members[i].client_url())),
    ))
}

async fn call<T>(
    f: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map(|r| r.into_inner()),
        Err(_) => Err(Status::deadline_exceeded("client timeout")),
    }
}

/// The member list, asked linearizably of any running member.
pub async fn member_list(pc: &ProxiedCluster) -> Option<Vec<Member>> {
    for k in 0..pc.live.len() {
        let (_, mut c) = via(pc, k)?;
        if let Ok(r) = call(c.member_list(MemberListRequest { linearizable: true })).await {
            return Some(r.members);
        }
    }
    None
}

fn slot_of(pc: &ProxiedCluster, m: &Member) -> usize {
    (0..pc.n())
        .find(|&i| m.peer_ur_ls.contains(&pc.c.members[i].peer_url()))
        .unwrap_or_else(|| panic!("member {m:?} is not one of the harness's slots"))
}

/// `--initial-cluster` for a joining member, from a member list that includes it.
fn initial_cluster(pc: &ProxiedCluster, members: &[Member]) -> String {
    members
        .iter()
        .map(|m| {
            let s = slot_of(pc, m);
            format!("{}={}", pc.c.members[s].name, pc.c.members[s].peer_url())
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Makes the harness agree with `members`: starts members whose add was applied although its
/// reply was lost, and retires live members that are no longer members. Returns what it did.
pub async fn reconcile(
    pc: &mut ProxiedCluster,
    members: &[Member],
    targets: &Targets,
) -> Vec<String> {
    let mut did = Vec::new();
    let slots: Vec<usize> = members.iter().map(|m| slot_of(pc, m)).collect();
    for &s in &slots {
        if !pc.live.contains(&s) {
            pc.join(s, initial_cluster(pc, members));
            did.push(format!("started m{s} (its add had no reply)"));
        }
    }
    for s in pc.live.clone() {
        if !slots.contains(&s) {
            let exited = pc.retire(s, Duration::from_secs(10)).await;
            did.push(format!(
                "retired m{s} (removed, exited on its own: {exited:?})"
            ));
        }
    }
    targets.set_live(&pc.live);
    did
}

/// One membership step; returns its fault kind and a description.
pub async fn step(
    pc: &mut ProxiedCluster,
    rng: &mut StdRng,
    targets: &Targets,
    out: &mut Outcomes,
) -> (&'static str, String) {
    let Some(members) = member_list(pc).await else {
        return ("membership: no member list", String::new());
    };
    let mut notes = reconcile(pc, &members, targets).await;
    let members = member_list(pc).await.unwrap_or(members);
    let voters = members.iter().filter(|m| !m.is_learner).count();
    let learner = members.iter().find(|m| m.is_learner).cloned();
    let (kind, what) = if let Some(l) = learner {
        let s = slot_of(pc, &l);
        let r = promote(pc, l.id, out).await;
        ("membership: promote learner", format!("promote m{s}: {r}"))
    } else if voters > MIN_VOTERS && (voters >= MAX_VOTERS || rng.gen_bool(0.5)) {
        remove(pc, rng, &members, targets, out).await
    } else if let Some(s) = pc.spare() {
        let r = add_and_promote(pc, s, targets, out).await;
        (
            "membership: add learner + promote",
            format!("add m{s}: {r}"),
        )
    } else {
        ("membership: no spare slot", String::new())
    };
    notes.insert(0, what);
    (kind, notes.join("; "))
}

/// Adds slot `s` as a learner, starts it, and promotes it once it has caught up.
async fn add_and_promote(
    pc: &mut ProxiedCluster,
    s: usize,
    targets: &Targets,
    out: &mut Outcomes,
) -> String {
    let Some((_, c)) = via(pc, s) else {
        return "no running member".into();
    };
    let peer_url = pc.c.members[s].peer_url();
    // Past etcd's 5 s health window: a link reset by an earlier fault counts as active again.
    let resp = retrying(out, Duration::from_secs(6), || {
        let mut c = c.clone();
        let peer_ur_ls = vec![peer_url.clone()];
        async move {
            call(c.member_add(MemberAddRequest {
                peer_ur_ls,
                is_learner: true,
            }))
            .await
        }
    })
    .await;
    let resp = match resp {
        Ok((r, _)) => r,
        Err((why, tries)) => return format!("add refused ({tries} tries): {why}"),
    };
    out.applied("add learner");
    let id = resp.member.as_ref().expect("added member").id;
    pc.join(s, initial_cluster(pc, &resp.members));
    targets.set_live(&pc.live);
    format!("added, started; {}", promote(pc, id, out).await)
}

/// Asks to promote learner `id` until it is allowed or [`PROMOTE_FOR`] passes.
pub async fn promote(pc: &ProxiedCluster, id: u64, out: &mut Outcomes) -> String {
    let Some((_, c)) = via(pc, 0) else {
        return "no running member".into();
    };
    let r = retrying(out, PROMOTE_FOR, || {
        let mut c = c.clone();
        async move { call(c.member_promote(MemberPromoteRequest { id })).await }
    })
    .await;
    match r {
        Ok((_, tries)) => {
            out.applied("promote");
            format!("promoted after {tries} tries")
        }
        Err((why, tries)) => format!("not promoted after {tries} tries ({why})"),
    }
}

/// Removes a voter: the leader half the time, else a follower; stops its process.
async fn remove(
    pc: &mut ProxiedCluster,
    rng: &mut StdRng,
    members: &[Member],
    targets: &Targets,
    out: &mut Outcomes,
) -> (&'static str, String) {
    let leader = pc.claimed_leader().await;
    let voters: Vec<usize> = members
        .iter()
        .filter(|m| !m.is_learner)
        .map(|m| slot_of(pc, m))
        .collect();
    let (kind, s) = match leader {
        Some(l) if voters.contains(&l) && rng.gen_bool(0.5) => ("membership: remove leader", l),
        _ => {
            let f: Vec<usize> = voters
                .iter()
                .copied()
                .filter(|&v| Some(v) != leader)
                .collect();
            ("membership: remove follower", f[rng.gen_range(0..f.len())])
        }
    };
    let id = members.iter().find(|m| slot_of(pc, m) == s).unwrap().id;
    // Ask another member, as an operator replacing `s` would.
    let others: Vec<usize> = pc
        .live
        .iter()
        .copied()
        .filter(|&i| i != s && pc.running(i))
        .collect();
    let Some(&o) = others.get(rng.gen_range(0..others.len().max(1))) else {
        return (kind, format!("m{s}: no other running member"));
    };
    let c = ClusterClient::new(lazy_channel(&pc.c.members[o].client_url()));
    let r = retrying(out, Duration::from_secs(6), || {
        let mut c = c.clone();
        async move { call(c.member_remove(MemberRemoveRequest { id })).await }
    })
    .await;
    match r {
        Ok(_) => {
            out.applied(if kind.ends_with("leader") {
                "remove leader"
            } else {
                "remove follower"
            });
            let exited = pc.retire(s, Duration::from_secs(10)).await;
            targets.set_live(&pc.live);
            (
                kind,
                format!("removed m{s} via m{o}; exited on its own: {exited:?}"),
            )
        }
        Err((why, tries)) => (kind, format!("remove m{s} refused ({tries} tries): {why}")),
    }
}
