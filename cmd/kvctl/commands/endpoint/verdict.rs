//! The verdict of `endpoint diagnose`, from what each member answered: healthy, degraded (and
//! how many more losses the cluster survives), or quorum lost (who must come back, or which
//! survivor to rebuild from and how).
//!
//! Pure: it reads the members' answers and decides; the command gathers them and prints.
//! Invariants:
//! - Only voters count towards quorum (learners neither vote nor count), quorum being a
//!   majority of the voters of the configuration the members report.
//! - "Quorum lost" is said only when fewer than a quorum of voters answer. A quorum that
//!   answers without a leader (an election under way, members that cannot reach each other)
//!   is degraded, never a reason to rebuild.
//! - The member to rebuild from is the answering voter with the highest committed index (then
//!   applied index): it holds every entry any survivor committed.

use std::fmt::Write as _;

/// One member as the cluster's configuration lists it, with its answer to Status.
#[derive(Debug, Clone, Default)]
pub struct MemberState {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub learner: bool,
    /// Its Status answer, if it gave one.
    pub status: Option<Answer>,
    /// Why it did not answer.
    pub error: Option<String>,
}

/// What a member said about itself and its peers.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// The leader it knows (0: none).
    pub leader: u64,
    pub term: u64,
    pub committed: u64,
    pub applied: u64,
    /// Its alarms and "no leader", as etcd lists them in `errors`.
    pub errors: Vec<String>,
    /// WAL fsync p99 over the last minute, microseconds (kvd only; 0 when unknown).
    pub fsync_p99_us: u64,
    /// Its view of its peers: (id, reachable, milliseconds since last contact or None).
    pub peers: Vec<(u64, bool, Option<u64>)>,
}

/// The cluster's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    /// Quorum holds; `down` members did not answer and the cluster survives `tolerance` more
    /// voter losses (0: one more loss costs quorum).
    Degraded {
        down: Vec<u64>,
        tolerance: usize,
        reasons: Vec<String>,
    },
    /// Fewer than a quorum of voters answer.
    QuorumLost {
        missing: Vec<u64>,
        /// How many of the missing voters must come back.
        must_return: usize,
        /// The survivor to rebuild from if they cannot.
        rebuild_from: Option<u64>,
    },
}

fn voters(members: &[MemberState]) -> impl Iterator<Item = &MemberState> {
    members.iter().filter(|m| !m.learner)
}

/// A majority of `n` voters.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Decides the verdict from every member's state.
pub fn verdict(members: &[MemberState]) -> Verdict {
    let n = voters(members).count();
    let q = quorum(n);
    let up: Vec<&MemberState> = voters(members).filter(|m| m.status.is_some()).collect();
    if up.len() < q {
        let missing: Vec<u64> = voters(members)
            .filter(|m| m.status.is_none())
            .map(|m| m.id)
            .collect();
        let rebuild_from = up
            .iter()
            .max_by_key(|m| {
                let a = m.status.as_ref().expect("answered");
                (a.committed, a.applied)
            })
            .map(|m| m.id);
        return Verdict::QuorumLost {
            missing,
            must_return: q.saturating_sub(up.len()),
            rebuild_from,
        };
    }
    let down: Vec<u64> = members
        .iter()
        .filter(|m| m.status.is_none())
        .map(|m| m.id)
        .collect();
    let mut reasons = Vec::new();
    let leader = leader(&up);
    // Voters that answer this tool but not the leader: cut off by a partition, they count as
    // lost for quorum even though they are up.
    let cut_off: Vec<&MemberState> = match leader {
        Some(l) => up
            .iter()
            .copied()
            .filter(|m| m.id != l.id && !l.reaches(m.id))
            .collect(),
        None => Vec::new(),
    };
    match leader {
        None => reasons.push(
            "no answering member is the leader: an election is under way, or the voters cannot \
             reach each other (run this again in a few seconds)"
                .to_string(),
        ),
        Some(l) => {
            for m in &cut_off {
                reasons.push(format!(
                    "{} is cut off from the leader {}: it answers this tool but not its peers (a \
                     network partition, or its peer port blocked); it counts as lost for quorum",
                    m.name, l.name
                ));
            }
            let term = l.status.as_ref().map_or(0, |a| a.term);
            for m in &up {
                let a = m.status.as_ref().expect("answered");
                if m.id != l.id && a.leader == m.id {
                    reasons.push(format!(
                        "{} still claims leadership at term {}, superseded by {} at term {term}",
                        m.name, a.term, l.name
                    ));
                }
            }
        }
    }
    for m in members {
        let Some(a) = &m.status else { continue };
        for e in &a.errors {
            reasons.push(format!("{}: {e}", m.name));
        }
        for (peer, reachable, _) in &a.peers {
            if !reachable && !down.contains(peer) {
                reasons.push(format!(
                    "{} cannot reach {} (which answers this tool)",
                    m.name,
                    name_of(members, *peer)
                ));
            }
        }
    }
    let connected = up.len() - cut_off.len();
    if down.is_empty() && reasons.is_empty() {
        return Verdict::Healthy;
    }
    Verdict::Degraded {
        down,
        tolerance: connected.saturating_sub(q),
        reasons,
    }
}

/// The leader among the answering voters: the one that says it leads, at the highest term
/// (a leader cut off from the others may go on saying so after they elected another).
fn leader<'a>(up: &[&'a MemberState]) -> Option<&'a MemberState> {
    up.iter()
        .copied()
        .filter(|m| {
            m.status
                .as_ref()
                .is_some_and(|a| a.leader == m.id && m.id != 0)
        })
        .max_by_key(|m| m.status.as_ref().map_or(0, |a| a.term))
}

impl MemberState {
    /// Whether this member reports `peer` reachable. A member that reports no view of its
    /// peers (etcd) is taken to reach them all.
    fn reaches(&self, peer: u64) -> bool {
        self.status
            .as_ref()
            .is_none_or(|a| a.peers.iter().find(|p| p.0 == peer).is_none_or(|p| p.1))
    }
}

/// A member's name, or its id in hex when it has none yet.
pub fn name_of(members: &[MemberState], id: u64) -> String {
    members
        .iter()
        .find(|m| m.id == id)
        .filter(|m| !m.name.is_empty())
        .map_or_else(|| format!("{id:x}"), |m| m.name.clone())
}

/// The report: one line per member, then the verdict and what to do.
pub fn report(members: &[MemberState], v: &Verdict) -> String {
    let mut out = String::new();
    for m in members {
        let role = if m.learner { "learner" } else { "voter" };
        match &m.status {
            Some(a) => {
                let leader = if a.leader == m.id {
                    "leader".to_string()
                } else if a.leader == 0 {
                    "no leader".to_string()
                } else {
                    format!("follows {}", name_of(members, a.leader))
                };
                let _ = write!(
                    out,
                    "{} ({:x}, {role}): up, {leader}, term {}, committed {}, applied {}",
                    m.name, m.id, a.term, a.committed, a.applied
                );
                if a.fsync_p99_us > 0 {
                    let _ = write!(out, ", WAL fsync p99 {:.1} ms", a.fsync_p99_us as f64 / 1e3);
                }
                let unreachable: Vec<String> = a
                    .peers
                    .iter()
                    .filter(|p| !p.1)
                    .map(|(id, _, ago)| match ago {
                        Some(ms) => format!(
                            "{} (last contact {:.1} s ago)",
                            name_of(members, *id),
                            *ms as f64 / 1e3
                        ),
                        None => format!("{} (never reached)", name_of(members, *id)),
                    })
                    .collect();
                if !unreachable.is_empty() {
                    let _ = write!(out, "; cannot reach {}", unreachable.join(", "));
                }
                for e in &a.errors {
                    let _ = write!(out, "; {e}");
                }
                out.push('\n');
            }
            None => {
                let _ = writeln!(
                    out,
                    "{} ({:x}, {role}): DOWN ({})",
                    m.name,
                    m.id,
                    m.error.as_deref().unwrap_or("no answer")
                );
            }
        }
    }
    out.push('\n');
    let n = voters(members).count();
    match v {
        Verdict::Healthy => {
            let _ = writeln!(
                out,
                "HEALTHY: all {} members answer and every member reaches every other; the \
                 cluster survives the loss of {} voter(s).",
                members.len(),
                n - quorum(n)
            );
        }
        Verdict::Degraded {
            down,
            tolerance,
            reasons,
        } => {
            let _ = write!(
                out,
                "DEGRADED: quorum holds ({} of {n} voters needed)",
                quorum(n)
            );
            if !down.is_empty() {
                let names: Vec<String> = down.iter().map(|id| name_of(members, *id)).collect();
                let _ = write!(out, "; down: {}", names.join(", "));
            }
            out.push('\n');
            for r in reasons {
                let _ = writeln!(out, "  - {r}");
            }
            if *tolerance == 0 {
                let _ = writeln!(
                    out,
                    "One more voter lost costs quorum: bring the down members back (or replace \
                     them) before any maintenance."
                );
            } else {
                let _ = writeln!(out, "The cluster survives {tolerance} more voter loss(es).");
            }
        }
        Verdict::QuorumLost {
            missing,
            must_return,
            rebuild_from,
        } => {
            let names: Vec<String> = missing.iter().map(|id| name_of(members, *id)).collect();
            let _ = writeln!(
                out,
                "QUORUM LOST: {} of {n} voters answer, {} are needed. Missing: {}.",
                n - missing.len(),
                quorum(n),
                names.join(", ")
            );
            if *must_return > 0 {
                let _ = writeln!(
                    out,
                    "Writes and linearizable reads fail until {must_return} of the missing \
                     voters come back with their data: start them again if you can."
                );
            }
            if let Some(id) = rebuild_from {
                let m = members.iter().find(|m| m.id == *id).expect("a member");
                let a = m.status.as_ref().expect("answered");
                let _ = writeln!(
                    out,
                    "\nIf they cannot come back, rebuild from {} (highest committed index, {}): \
                     stop every surviving member, then on {}:",
                    m.name, a.committed, m.name
                );
                let _ = writeln!(
                    out,
                    "  kvd --name {} --data-dir <its data dir> --force-new-cluster \
                     --listen-peer-urls {} --initial-advertise-peer-urls {} \
                     --listen-client-urls {} --advertise-client-urls {}",
                    m.name,
                    m.peer_urls.join(","),
                    m.peer_urls.join(","),
                    m.client_urls.join(","),
                    m.client_urls.join(",")
                );
                let ep = m.client_urls.first().cloned().unwrap_or_default();
                let _ = writeln!(
                    out,
                    "then add each other member back, one at a time, each started with an empty \
                     data dir and --initial-cluster-state existing:"
                );
                for o in members.iter().filter(|o| o.id != *id) {
                    let _ = writeln!(
                        out,
                        "  kvctl --endpoints {ep} member add {} --peer-urls={}",
                        o.name,
                        o.peer_urls.join(",")
                    );
                }
                let _ = writeln!(
                    out,
                    "What is lost: entries after index {} that only the missing members hold \
                     (writes they committed that no survivor has), and every member's data \
                     other than {}'s.",
                    a.committed, m.name
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, leader: Option<u64>, committed: u64) -> MemberState {
        MemberState {
            id,
            name: format!("m{id}"),
            peer_urls: vec![format!("http://127.0.0.1:{id}2380")],
            client_urls: vec![format!("http://127.0.0.1:{id}2379")],
            learner: false,
            status: leader.map(|l| Answer {
                leader: l,
                committed,
                applied: committed,
                ..Default::default()
            }),
            error: leader.is_none().then(|| "connection refused".into()),
        }
    }

    #[test]
    fn all_up_with_a_leader_is_healthy() {
        let ms = [
            member(1, Some(1), 9),
            member(2, Some(1), 9),
            member(3, Some(1), 9),
        ];
        assert_eq!(verdict(&ms), Verdict::Healthy);
    }

    #[test]
    fn one_of_three_down_is_degraded_with_no_tolerance_left() {
        let ms = [
            member(1, Some(1), 9),
            member(2, Some(1), 9),
            member(3, None, 0),
        ];
        assert_eq!(
            verdict(&ms),
            Verdict::Degraded {
                down: vec![3],
                tolerance: 0,
                reasons: vec![]
            }
        );
        let ms5 = [
            member(1, Some(1), 9),
            member(2, Some(1), 9),
            member(3, Some(1), 9),
            member(4, Some(1), 9),
            member(5, None, 0),
        ];
        assert!(matches!(
            verdict(&ms5),
            Verdict::Degraded { tolerance: 1, .. }
        ));
    }

    #[test]
    fn too_few_voters_is_quorum_lost_and_names_the_most_advanced_survivor() {
        let ms = [
            member(1, None, 0),
            member(2, Some(0), 7),
            member(3, Some(0), 9),
            member(4, None, 0),
            member(5, None, 0),
        ];
        assert_eq!(
            verdict(&ms),
            Verdict::QuorumLost {
                missing: vec![1, 4, 5],
                must_return: 1,
                rebuild_from: Some(3)
            }
        );
        let r = report(&ms, &verdict(&ms));
        assert!(r.contains("rebuild from m3"), "{r}");
        assert!(r.contains("--force-new-cluster"), "{r}");
        assert!(r.contains("member add m1"), "{r}");
    }

    #[test]
    fn learners_do_not_count_towards_quorum() {
        let mut l = member(4, None, 0);
        l.learner = true;
        let ms = [
            member(1, Some(1), 9),
            member(2, Some(1), 9),
            member(3, Some(1), 9),
            l,
        ];
        assert!(matches!(
            verdict(&ms),
            Verdict::Degraded { tolerance: 1, .. }
        ));
    }

    #[test]
    fn a_peer_one_member_cannot_reach_is_a_reason_to_call_it_degraded() {
        // m1 leads; the first reason is that m3 is cut off from it (see the next test).
        let mut ms = [
            member(1, Some(1), 9),
            member(2, Some(1), 9),
            member(3, Some(1), 9),
        ];
        ms[0].status.as_mut().unwrap().peers = vec![(2, true, Some(10)), (3, false, Some(4000))];
        match verdict(&ms) {
            Verdict::Degraded { down, reasons, .. } => {
                assert!(down.is_empty());
                assert_eq!(
                    reasons[1..],
                    ["m1 cannot reach m3 (which answers this tool)"]
                );
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_voter_cut_off_from_the_leader_counts_as_lost() {
        let mut ms = [
            member(1, Some(1), 9),
            member(2, Some(1), 9),
            member(3, Some(3), 5),
        ];
        ms[0].status.as_mut().unwrap().term = 4;
        ms[0].status.as_mut().unwrap().peers = vec![(2, true, Some(10)), (3, false, Some(4000))];
        ms[2].status.as_mut().unwrap().term = 3;
        ms[2].status.as_mut().unwrap().peers = vec![(1, false, None), (2, false, None)];
        match verdict(&ms) {
            Verdict::Degraded {
                down,
                tolerance,
                reasons,
            } => {
                assert!(down.is_empty());
                assert_eq!(tolerance, 0, "m3 answers but counts as lost");
                assert!(
                    reasons[0].starts_with("m3 is cut off from the leader m1"),
                    "{reasons:?}"
                );
                assert!(
                    reasons[1].starts_with("m3 still claims leadership at term 3"),
                    "{reasons:?}"
                );
            }
            v => panic!("{v:?}"),
        }
    }
}
