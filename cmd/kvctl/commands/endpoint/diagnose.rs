//! `kvctl endpoint diagnose`: asks every member it can reach, then says whether the cluster is
//! healthy, degraded or has lost quorum, and what to do (see [`super::verdict`]).
//!
//! The member list comes from every `--endpoints` entry that answers (serializable, so a
//! member without a leader still answers); each listed member is then asked for its Status at
//! its own client URLs, all at once, each within the command timeout. Against etcd the same
//! works without kvd's extensions (peer views and fsync p99 are then left out).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use kvd::proto::etcdserverpb::{Member, MemberListRequest, StatusRequest, StatusResponse};
use tokio::time::Instant;

use super::verdict::{report, verdict, Answer, MemberState, Verdict};
use super::{connect_one, Ctx};
use crate::client::with_deadline;
use crate::error::{CliError, EXIT_ERROR};

/// The members every answering endpoint lists, by id.
async fn members(ctx: &Ctx) -> Result<BTreeMap<u64, Member>, CliError> {
    let dial = ctx.dial()?;
    let lists = join_all(ctx.global.endpoints.iter().map(|ep| async move {
        let deadline = ctx.deadline();
        with_deadline(deadline, async {
            let conn = connect_one(ep, dial, deadline).await?;
            Ok(conn
                .cluster()
                .member_list(MemberListRequest {
                    linearizable: false,
                })
                .await?
                .into_inner()
                .members)
        })
        .await
    }))
    .await;
    let mut out = BTreeMap::new();
    let mut last_err = None;
    for l in lists {
        match l {
            Ok(ms) => {
                for m in ms {
                    // A member that has not published its name yet is listed without it by
                    // some members: keep the fullest entry.
                    let e = out.entry(m.id).or_insert_with(|| m.clone());
                    if e.name.is_empty() {
                        *e = m;
                    }
                }
            }
            Err(e) => last_err = Some(e),
        }
    }
    if out.is_empty() {
        return Err(CliError::new(
            EXIT_ERROR,
            format!(
                "no endpoint answered a member list ({}): check --endpoints, or start a member",
                last_err.map_or_else(|| "no endpoints".to_string(), |e| e.msg)
            ),
        ));
    }
    Ok(out)
}

/// Member `m`'s Status, from the first of its client URLs that answers, each tried within
/// `timeout`.
pub(crate) async fn status_of(
    ctx: &Ctx,
    m: &Member,
    timeout: Duration,
) -> Result<StatusResponse, String> {
    let dial = ctx.dial().map_err(|e| e.msg)?;
    let mut last = "it has no client URL (not started yet?)".to_string();
    for url in &m.client_ur_ls {
        let deadline = Instant::now() + timeout;
        let r = with_deadline(deadline, async {
            let conn = connect_one(url, dial, deadline).await?;
            Ok(conn
                .maintenance()
                .status(StatusRequest {})
                .await?
                .into_inner())
        })
        .await;
        match r {
            Ok(s) => return Ok(s),
            Err(e) => last = e.msg,
        }
    }
    Err(last)
}

fn answer(s: StatusResponse) -> Answer {
    Answer {
        leader: s.leader,
        term: s.raft_term,
        committed: s.raft_index,
        applied: s.raft_applied_index,
        errors: s.errors,
        fsync_p99_us: s.kvd_recent_wal_fsync_p99_us,
        peers: s
            .kvd_peers
            .iter()
            .map(|p| {
                (
                    p.id,
                    p.reachable,
                    (!p.never_contacted).then_some(p.last_contact_ms),
                )
            })
            .collect(),
    }
}

pub async fn diagnose(ctx: &Ctx) -> Result<i32, CliError> {
    let listed = members(ctx).await?;
    let timeout = ctx.global.command_timeout;
    let answers = join_all(listed.values().map(|m| status_of(ctx, m, timeout))).await;
    let states: Vec<MemberState> = listed
        .into_values()
        .zip(answers)
        .map(|(m, r)| {
            let (status, error) = match r {
                // A member answers with its own id: a URL that reached another one is no answer.
                Ok(s) if s.header.as_ref().is_none_or(|h| h.member_id == m.id) => {
                    (Some(answer(s)), None)
                }
                Ok(_) => (
                    None,
                    Some("its client URL is served by another member".into()),
                ),
                Err(e) => (None, Some(e)),
            };
            MemberState {
                id: m.id,
                name: m.name,
                peer_urls: m.peer_ur_ls,
                client_urls: m.client_ur_ls,
                learner: m.is_learner,
                status,
                error,
            }
        })
        .collect();
    let v = verdict(&states);
    print!("{}", report(&states, &v));
    Ok(match v {
        Verdict::Healthy => 0,
        Verdict::Degraded { .. } | Verdict::QuorumLost { .. } => EXIT_ERROR,
    })
}
