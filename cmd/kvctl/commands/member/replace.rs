//! `kvctl member replace OLD --name NEW --peer-urls URLS`: etcd's "add the new member first,
//! then remove the old one" as one command. It adds NEW as a learner, prints the settings NEW
//! must start with, waits for NEW to catch up and promotes it, then removes OLD.
//!
//! Invariants:
//! - Never takes a step that can cost quorum. Before the add, before every promote attempt and
//!   before the removal, every member is asked for its Status at its own client URLs; a step
//!   is taken only when every voter other than OLD answers (OLD may be down: the step does not
//!   need it). A learner never counts towards quorum, so adding one, or removing OLD once NEW
//!   votes, leaves at least as many answering voters as before. The servers' own strict
//!   reconfiguration checks still apply on top of this one.
//! - Resumable: every run starts from the member list, not from memory. NEW is found by name
//!   or by its peer URLs (a learner that has not started yet has no name): a learner skips the
//!   add, a voter skips the promotion too, and with OLD gone and NEW a voter there is nothing
//!   left to do. A run killed at any point can therefore be run again as it was.
//! - Only standard etcd v3 RPCs (MemberList, MemberAdd, MemberPromote, MemberRemove, Status),
//!   so it works against etcd 3.4 as well.
//! - One exception to "add first": etcd 3.4 adds a learner only while every voter is connected,
//!   so with OLD down it refuses the add ("unhealthy cluster"). Then, and only when OLD did not
//!   answer, OLD is removed first: a voter that is down is not part of the quorum that serves,
//!   so removing it leaves the same voters answering and the same number of failures tolerated.
use std::time::Duration;

use futures::future::join_all;
use kvd::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberListRequest, MemberPromoteRequest, MemberRemoveRequest,
    StatusResponse,
};
use tokio::time::Instant;

use super::{parse_hex_u64, peer_urls, start_settings};
use crate::cli::MemberReplaceArgs;
use crate::client::{with_deadline, Conn};
use crate::commands::endpoint::status_of;
use crate::commands::Ctx;
use crate::error::{status_message, CliError, EtcdError, EXIT_ERROR};

/// How long one member has to answer Status in a safety check: long enough for a loaded
/// member, short enough that a dead one does not stall every step.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between promote attempts (and progress lines) while NEW catches up.
const POLL: Duration = Duration::from_secs(2);
/// How long a change refused as "not ready yet" is retried: twice etcd's (and kvd's) 5 s
/// health interval, with a margin.
const NOT_READY_PATIENCE: Duration = Duration::from_secs(12);

/// A member as the operator knows it: its name if it has one, with its id.
fn label(m: &Member) -> String {
    if m.id == 0 {
        m.name.clone()
    } else if m.name.is_empty() {
        format!("{:x} (not started yet)", m.id)
    } else {
        format!("{} ({:x})", m.name, m.id)
    }
}

fn same_urls(a: &[String], b: &[String]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort();
    b.sort();
    a == b
}

/// The member list, from the first endpoint that answers.
async fn list(ctx: &Ctx, endpoints: &[String]) -> Result<Vec<Member>, CliError> {
    let deadline = ctx.deadline();
    with_deadline(deadline, async {
        let conn = Conn::connect(endpoints, ctx.dial()?, deadline).await?;
        Ok(conn
            .cluster()
            .member_list(MemberListRequest { linearizable: true })
            .await?
            .into_inner()
            .members)
    })
    .await
}

/// OLD as given: a member name first (names are what operators see), else a hex id.
fn resolve_old<'a>(members: &'a [Member], arg: &str) -> Result<Option<&'a Member>, CliError> {
    let named: Vec<&Member> = members.iter().filter(|m| m.name == arg).collect();
    if named.len() > 1 {
        return Err(CliError::new(
            EXIT_ERROR,
            format!(
                "{} members are named {arg}: give the hex ID instead",
                named.len()
            ),
        ));
    }
    if let Some(m) = named.first() {
        return Ok(Some(m));
    }
    Ok(parse_hex_u64(arg)
        .ok()
        .and_then(|id| members.iter().find(|m| m.id == id)))
}

/// NEW, if an earlier run (or the operator) already added it: by name once it has started,
/// by its peer URLs before.
fn find_new<'a>(
    members: &'a [Member],
    name: &str,
    urls: &[String],
) -> Result<Option<&'a Member>, CliError> {
    if let Some(m) = members.iter().find(|m| m.name == name) {
        if !same_urls(&m.peer_ur_ls, urls) {
            return Err(CliError::new(
                EXIT_ERROR,
                format!(
                    "a member named {name} already exists with peer URLs {}, not {}: pick \
                     another --name, or give its peer URLs to continue with it",
                    m.peer_ur_ls.join(","),
                    urls.join(",")
                ),
            ));
        }
        return Ok(Some(m));
    }
    if let Some(m) = members
        .iter()
        .find(|m| m.peer_ur_ls.iter().any(|u| urls.contains(u)))
    {
        if !m.name.is_empty() || !same_urls(&m.peer_ur_ls, urls) {
            return Err(CliError::new(
                EXIT_ERROR,
                format!(
                    "member {} already uses peer URLs {}: give the new member other peer URLs",
                    label(m),
                    m.peer_ur_ls.join(",")
                ),
            ));
        }
        return Ok(Some(m));
    }
    Ok(None)
}

/// Every member's Status, asked at once.
async fn statuses(ctx: &Ctx, members: &[Member]) -> Vec<Result<StatusResponse, String>> {
    join_all(members.iter().map(|m| async move {
        match status_of(ctx, m, CHECK_TIMEOUT).await {
            // A member answers with its own id: a URL that reached another one is no answer.
            Ok(s) if s.header.as_ref().is_some_and(|h| h.member_id != m.id) => {
                Err("its client URL is served by another member".to_string())
            }
            r => r,
        }
    }))
    .await
}

/// The voters other than `old` that do not answer, with why.
fn unanswered(
    members: &[Member],
    answers: &[Result<StatusResponse, String>],
    old: u64,
) -> Vec<String> {
    members
        .iter()
        .zip(answers)
        .filter(|(m, _)| !m.is_learner && m.id != old)
        .filter_map(|(m, a)| a.as_ref().err().map(|e| format!("{}: {e}", label(m))))
        .collect()
}

/// The safety check before a step: refuses it unless every voter other than OLD answers.
/// Returns whether OLD answered.
async fn guard(ctx: &Ctx, members: &[Member], old: &Member, step: &str) -> Result<bool, CliError> {
    let answers = statuses(ctx, members).await;
    let down = unanswered(members, &answers, old.id);
    if !down.is_empty() {
        return Err(CliError::new(
            EXIT_ERROR,
            format!(
                "refusing to {step}: voter {} does not answer, and with {} down as well the \
                 step could cost quorum. Bring it back (or replace it first), check with \
                 `kvctl endpoint diagnose`, then run this command again: it continues where it \
                 stopped",
                down.join("; voter "),
                label(old)
            ),
        ));
    }
    let old_answers = members
        .iter()
        .zip(&answers)
        .any(|(m, a)| m.id == old.id && a.is_ok());
    Ok(old_answers)
}

/// The endpoints for membership changes: the voters other than OLD (so that removing OLD is
/// not asked of OLD itself), then `--endpoints`.
fn change_endpoints(ctx: &Ctx, members: &[Member], old: u64) -> Vec<String> {
    let mut eps: Vec<String> = members
        .iter()
        .filter(|m| !m.is_learner && m.id != old)
        .flat_map(|m| m.client_ur_ls.iter().cloned())
        .collect();
    for e in &ctx.global.endpoints {
        if !eps.contains(e) {
            eps.push(e.clone());
        }
    }
    eps
}

async fn add_learner(
    ctx: &Ctx,
    eps: &[String],
    urls: &[String],
) -> Result<kvd::proto::etcdserverpb::MemberAddResponse, tonic::Status> {
    let deadline = ctx.deadline();
    let conn = Conn::connect(eps, ctx.dial().map_err(cli_status)?, deadline)
        .await
        .map_err(cli_status)?;
    let r = tokio::time::timeout_at(
        deadline,
        conn.cluster().member_add(MemberAddRequest {
            peer_ur_ls: urls.to_vec(),
            is_learner: true,
        }),
    )
    .await
    .map_err(|_| tonic::Status::deadline_exceeded("context deadline exceeded"))??;
    Ok(r.into_inner())
}

/// A kvctl-side failure (connecting, credentials) as a status, so that every failure of one
/// RPC is handled in one place.
fn cli_status(e: CliError) -> tonic::Status {
    tonic::Status::unavailable(e.msg)
}

async fn remove(ctx: &Ctx, eps: &[String], id: u64) -> Result<(), tonic::Status> {
    let deadline = ctx.deadline();
    let conn = Conn::connect(eps, ctx.dial().map_err(cli_status)?, deadline)
        .await
        .map_err(cli_status)?;
    let r = tokio::time::timeout_at(
        deadline,
        conn.cluster().member_remove(MemberRemoveRequest { id }),
    )
    .await
    .map_err(|_| tonic::Status::deadline_exceeded("context deadline exceeded"))?;
    match r {
        Ok(_) => Ok(()),
        // Removed by an earlier attempt whose answer was lost.
        Err(s) if EtcdError::of(&s) == Some(EtcdError::MemberNotFound) => Ok(()),
        Err(s) => Err(s),
    }
}

/// Whether the servers refused a change only because the cluster is not ready for it yet:
/// a member connected for less than their health interval (every member right after a start
/// or a restart), or one that has not published its name yet. Both pass within seconds.
fn not_ready(s: &tonic::Status) -> bool {
    matches!(
        EtcdError::of(s),
        Some(EtcdError::Unhealthy | EtcdError::NotEnoughStartedMembers)
    )
}

/// Runs the change `f`, again while the servers refuse it as [`not_ready`], for up to
/// [`NOT_READY_PATIENCE`]. Our own check has found every voter it needs answering, so such a
/// refusal is about connections a few seconds old, not about members that are gone.
async fn change<T, F, Fut>(what: &str, mut f: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let until = Instant::now() + NOT_READY_PATIENCE;
    loop {
        match f().await {
            Err(s) if not_ready(&s) && Instant::now() + POLL < until => {
                eprintln!(
                    "{what}: the cluster is not ready for it yet ({}), retrying",
                    status_message(&s)
                );
                tokio::time::sleep(POLL).await;
            }
            r => return r,
        }
    }
}

async fn promote(ctx: &Ctx, eps: &[String], id: u64) -> Result<(), tonic::Status> {
    let deadline = ctx.deadline();
    let conn = Conn::connect(eps, ctx.dial().map_err(cli_status)?, deadline)
        .await
        .map_err(cli_status)?;
    tokio::time::timeout_at(
        deadline,
        conn.cluster().member_promote(MemberPromoteRequest { id }),
    )
    .await
    .map_err(|_| tonic::Status::deadline_exceeded("context deadline exceeded"))??;
    Ok(())
}

/// Whether a refused promote is worth retrying while NEW starts and catches up.
fn promote_retriable(s: &tonic::Status) -> bool {
    match EtcdError::of(s) {
        // The learner's log is still behind the leader's.
        Some(EtcdError::LearnerNotReady) => true,
        // The learner has not published its name yet (etcd counts it as started only then).
        Some(EtcdError::NotEnoughStartedMembers) => true,
        // The learner has not been connected for the servers' health interval yet.
        Some(EtcdError::Unhealthy) => true,
        // A leader change or a timeout while asking: the next attempt tells.
        _ => matches!(
            s.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
        ),
    }
}

/// One progress line while waiting for NEW: its applied index against the leader's committed
/// index once it answers at a client URL it has published.
fn progress(
    name: &str,
    new: &Member,
    members: &[Member],
    answers: &[Result<StatusResponse, String>],
) -> String {
    let leader_committed = answers.iter().flatten().find_map(|s| {
        s.header
            .as_ref()
            .filter(|h| h.member_id == s.leader && s.leader != 0)
            .map(|_| s.raft_index)
    });
    let learner = members
        .iter()
        .zip(answers)
        .find(|(m, _)| m.id == new.id)
        .and_then(|(m, a)| (!m.client_ur_ls.is_empty()).then_some(a));
    match (learner, leader_committed) {
        (Some(Ok(s)), Some(c)) => format!(
            "{name}: applied index {} of the leader's committed {c}",
            s.raft_applied_index
        ),
        (Some(Ok(s)), None) => format!(
            "{name}: applied index {} (no leader answers)",
            s.raft_applied_index
        ),
        (Some(Err(e)), _) => format!("{name} does not answer: {e}"),
        (None, _) => format!("waiting for {name} to start"),
    }
}

/// Step 2: waits until NEW is promoted (promoting it as soon as the cluster accepts), or gives
/// up after `timeout`.
async fn wait_and_promote(
    ctx: &Ctx,
    name: &str,
    new: &Member,
    old: &Member,
    eps: &[String],
    timeout: Duration,
) -> Result<(), CliError> {
    let give_up = Instant::now() + timeout;
    let mut why;
    loop {
        match list(ctx, eps).await {
            Ok(members) => {
                let answers = statuses(ctx, &members).await;
                let Some(now_new) = members.iter().find(|m| m.id == new.id) else {
                    return Err(CliError::new(
                        EXIT_ERROR,
                        format!(
                            "{name} ({:x}) is no longer a member: someone removed it; run this \
                             command again to add it anew (with an empty data dir)",
                            new.id
                        ),
                    ));
                };
                if !now_new.is_learner {
                    // Promoted by an attempt whose answer was lost, or by the operator.
                    return Ok(());
                }
                let line = progress(name, now_new, &members, &answers);
                eprintln!("{line}");
                why = line;
                let down = unanswered(&members, &answers, old.id);
                if !down.is_empty() {
                    why = format!(
                        "not promoting {name} while voter {} does not answer",
                        down.join("; voter ")
                    );
                    eprintln!("{why}");
                } else {
                    match promote(ctx, eps, new.id).await {
                        Ok(()) => return Ok(()),
                        Err(s) if EtcdError::of(&s) == Some(EtcdError::NotLearner) => return Ok(()),
                        Err(s) if promote_retriable(&s) => {}
                        Err(s) => return Err(s.into()),
                    }
                }
            }
            Err(e) => {
                why = format!("the member list is not available: {}", e.msg);
                eprintln!("{why}");
            }
        }
        if Instant::now() + POLL >= give_up {
            return Err(CliError::new(
                EXIT_ERROR,
                format!(
                    "gave up waiting for {name} ({:x}) after {timeout:?} (last: {why}). It stays \
                     a learner, which costs the cluster nothing: start it (empty data dir, the \
                     settings printed above) if it is not running, then run this same command \
                     again to continue",
                    new.id
                ),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

pub async fn replace(ctx: &Ctx, a: MemberReplaceArgs) -> Result<i32, CliError> {
    let [old_arg] = a.args.as_slice() else {
        return Err(CliError::bad_args(
            "expected one argument: the name or hex ID of the member to replace",
        ));
    };
    let name = a.name.as_str();
    if name.is_empty() {
        return Err(CliError::bad_args("the new member's --name not provided"));
    }
    let urls = peer_urls(&a.peer_urls);
    if urls.is_empty() {
        return Err(CliError::bad_args("member peer urls not provided"));
    }

    let members = list(ctx, &ctx.global.endpoints).await?;
    let new = find_new(&members, name, &urls)?.cloned();
    let old = match (resolve_old(&members, old_arg)?, &new) {
        (Some(o), Some(n)) if o.id == n.id => {
            return Err(CliError::bad_args(format!(
                "{old_arg} is the new member itself: give the member to replace"
            )))
        }
        (Some(o), _) => o.clone(),
        (None, Some(n)) if !n.is_learner => {
            println!(
                "{old_arg} is already replaced: {} is a voter and {old_arg} is no longer a member",
                label(n)
            );
            return Ok(0);
        }
        // An earlier run removed OLD first (see the module doc) and was interrupted after
        // adding NEW: what is left is the promotion. Nothing is excluded from the checks.
        (None, Some(_)) => Member {
            id: 0,
            name: old_arg.clone(),
            ..Default::default()
        },
        (None, None) => {
            let names: Vec<String> = members.iter().map(label).collect();
            return Err(CliError::new(
                EXIT_ERROR,
                format!(
                    "member {old_arg} not found (members: {}). If an earlier run removed it \
                     (it does so first only when the cluster refuses a learner while the old \
                     member is down), add the new one with `kvctl member add {name} \
                     --peer-urls={} --learner` and promote it",
                    names.join(", "),
                    urls.join(",")
                ),
            ));
        }
    };
    let eps = change_endpoints(ctx, &members, old.id);

    // Step 1: NEW as a learner.
    let new = match new {
        Some(n) if n.is_learner => {
            println!(
                "{name} ({:x}) is already a learner: skipping the add. It starts with:\n\n{}",
                n.id,
                start_settings(name, &n, &members)
            );
            n
        }
        Some(n) => {
            println!(
                "{name} ({:x}) is already a voter: skipping the add and the promotion",
                n.id
            );
            n
        }
        None => {
            let step = format!("add {name} as a learner");
            let old_answers = guard(ctx, &members, &old, &step).await?;
            let add = || change(&step, || add_learner(ctx, &eps, &urls));
            let resp = match add().await {
                Ok(r) => r,
                // etcd 3.4 adds a learner only while every voter is connected: with OLD down
                // that never passes (see the module doc).
                Err(s) if EtcdError::of(&s) == Some(EtcdError::Unhealthy) && !old_answers => {
                    println!(
                        "The cluster refuses a learner while {} is down (etcd 3.4 wants every \
                         voter connected): removing {} first, which changes nothing for the \
                         voters that serve",
                        label(&old),
                        label(&old)
                    );
                    change(&format!("remove {}", label(&old)), || {
                        remove(ctx, &eps, old.id)
                    })
                    .await?;
                    add().await?
                }
                Err(s) => return Err(s.into()),
            };
            let member = resp.member.clone().unwrap_or_default();
            let cid = resp.header.as_ref().map_or(0, |h| h.cluster_id);
            let then = if resp.members.iter().any(|m| m.id == old.id) {
                format!(", then removes {}", label(&old))
            } else {
                String::new()
            };
            println!(
                "Member {:16x} added as a learner to cluster {cid:16x}\n\n{}\nStart {name} now, \
                 with an empty data dir and these settings. This command waits for it to catch \
                 up and promotes it{then}.",
                member.id,
                start_settings(name, &member, &resp.members),
            );
            member
        }
    };

    // Step 2: NEW votes.
    if new.is_learner {
        wait_and_promote(ctx, name, &new, &old, &eps, a.wait_timeout).await?;
        println!("Member {:16x} ({name}) promoted", new.id);
    }

    // Step 3: OLD goes.
    let members = list(ctx, &eps).await?;
    if members.iter().any(|m| m.id == old.id) {
        let step = format!("remove {}", label(&old));
        guard(ctx, &members, &old, &step).await?;
        change(&step, || remove(ctx, &eps, old.id)).await?;
        println!("Member {:16x} ({}) removed", old.id, old.name);
    }

    let members = list(ctx, &eps).await?;
    let voters: Vec<String> = members
        .iter()
        .filter(|m| !m.is_learner)
        .map(label)
        .collect();
    println!(
        "Replaced {} with {name} ({:x}). Voters now: {}. If {} still runs, it exits on its own \
         once it learns of its removal; never restart it on its old data dir.",
        label(&old),
        new.id,
        voters.join(", "),
        old.name
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: u64, name: &str, url: &str, learner: bool) -> Member {
        Member {
            id,
            name: name.into(),
            peer_ur_ls: vec![url.into()],
            client_ur_ls: vec![],
            is_learner: learner,
        }
    }

    #[test]
    fn old_by_name_then_by_id() {
        let ms = [
            m(0xab, "a", "http://a", false),
            m(0xcd, "ab", "http://b", false),
        ];
        assert_eq!(resolve_old(&ms, "ab").unwrap().unwrap().id, 0xcd);
        assert_eq!(resolve_old(&ms, "cd").unwrap().unwrap().id, 0xcd);
        assert!(resolve_old(&ms, "zz").unwrap().is_none());
    }

    #[test]
    fn new_by_name_or_by_urls_before_it_starts() {
        let u = vec!["http://n".to_string()];
        let ms = [m(1, "a", "http://a", false), m(2, "", "http://n", true)];
        assert_eq!(find_new(&ms, "n", &u).unwrap().unwrap().id, 2);
        let ms = [m(1, "a", "http://a", false), m(2, "n", "http://n", false)];
        assert_eq!(find_new(&ms, "n", &u).unwrap().unwrap().id, 2);
        // Its name with other URLs, or its URLs under another name: refused, not guessed.
        assert!(find_new(&ms, "n", &["http://x".to_string()]).is_err());
        assert!(find_new(&ms, "other", &u).is_err());
        assert!(find_new(&ms, "z", &["http://z".to_string()])
            .unwrap()
            .is_none());
    }

    #[test]
    fn retries_only_while_the_learner_catches_up() {
        let s = tonic::Status::failed_precondition(
            "etcdserver: can only promote a learner member which is in sync with leader",
        );
        assert!(promote_retriable(&s));
        let s = tonic::Status::failed_precondition("etcdserver: can only promote a learner member");
        assert!(!promote_retriable(&s));
        let s = tonic::Status::not_found("etcdserver: member not found");
        assert!(!promote_retriable(&s));
    }
}
