//! `member list/add/remove/update/promote` and `move-leader`, with etcdctl 3.4's argument
//! checks, messages and (simple) output, and kvctl's own `member replace` ([`replace`]).
mod replace;

pub use replace::replace;

use kvd::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberListRequest, MemberPromoteRequest, MemberRemoveRequest,
    MemberUpdateRequest, MoveLeaderRequest, StatusRequest,
};

use crate::cli::{MemberAddArgs, MemberIdArgs, MemberUpdateArgs, MoveLeaderArgs};
use crate::client::{with_deadline, Conn};
use crate::commands::{emit, Ctx};
use crate::error::{CliError, EXIT_BAD_FEATURE};
use crate::output::{Format, Output};

pub async fn list(ctx: &Ctx) -> Result<i32, CliError> {
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn
            .cluster()
            .member_list(MemberListRequest {
                linearizable: false,
            })
            .await?
            .into_inner())
    })
    .await?;
    emit(&ctx.printer.member_list(&resp)?);
    Ok(0)
}

/// Go's `strconv.ParseUint(s, 16, 64)` error text.
fn parse_hex_u64(s: &str) -> Result<u64, String> {
    let q = crate::gofmt::quote(s.as_bytes());
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("strconv.ParseUint: parsing {q}: invalid syntax"));
    }
    u64::from_str_radix(s, 16)
        .map_err(|_| format!("strconv.ParseUint: parsing {q}: value out of range"))
}

fn member_id(args: &[String]) -> Result<u64, CliError> {
    if args.len() != 1 {
        return Err(CliError::bad_args("member ID is not provided"));
    }
    parse_hex_u64(&args[0])
        .map_err(|e| CliError::bad_args(format!("bad member ID arg ({e}), expecting ID in Hex")))
}

fn peer_urls(flag: &str) -> Vec<String> {
    if flag.is_empty() {
        return vec![];
    }
    flag.split(',').map(str::to_string).collect()
}

/// etcdctl prints membership changes in the simple format (and raw protobuf); its JSON and
/// fields printers for them are not reproduced.
fn print<M: prost::Message>(ctx: &Ctx, simple: String, m: &M) -> Result<(), CliError> {
    let out = match ctx.printer.format {
        Format::Simple => simple.into_bytes(),
        Format::Protobuf => m.encode_to_vec(),
        f => {
            return Err(CliError::new(
                EXIT_BAD_FEATURE,
                format!("{} not supported as output format", f.name()),
            ))
        }
    };
    emit(&Output::out(out));
    Ok(())
}

pub async fn add(ctx: &Ctx, a: MemberAddArgs) -> Result<i32, CliError> {
    let Some(name) = a.args.first().cloned() else {
        return Err(CliError::bad_args("member name not provided"));
    };
    if a.args.len() > 1 {
        let mut ev = String::from("too many arguments");
        for s in &a.args {
            if s.to_lowercase().starts_with("http") {
                ev += &format!(", did you mean --peer-urls={s}");
            }
        }
        return Err(CliError::bad_args(ev));
    }
    let urls = peer_urls(&a.peer_urls);
    if urls.is_empty() {
        return Err(CliError::bad_args("member peer urls not provided"));
    }
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn
            .cluster()
            .member_add(MemberAddRequest {
                peer_ur_ls: urls.clone(),
                is_learner: a.learner,
            })
            .await?
            .into_inner())
    })
    .await?;
    let member = resp.member.clone().unwrap_or_default();
    let cluster_id = resp.header.as_ref().map_or(0, |h| h.cluster_id);
    // etcdctl 3.4 prints the same line for a learner; `member list` shows it is one.
    let mut out = format!(
        "Member {:16x} added to cluster {cluster_id:16x}\n",
        member.id
    );
    out += "\n";
    out += &start_settings(&name, &member, &resp.members);
    print(ctx, out, &resp)?;
    Ok(0)
}

/// The settings a member added as `member` (named `name` by the operator) starts with, in
/// etcdctl's `ETCD_*=` form; `members` is the membership including it.
pub(crate) fn start_settings(name: &str, member: &Member, members: &[Member]) -> String {
    // Its name is not known to the cluster until it publishes, so the one given here stands
    // in for it.
    let conf: Vec<String> = members
        .iter()
        .flat_map(|m| {
            let n = if m.id == member.id { name } else { &m.name };
            m.peer_ur_ls
                .iter()
                .map(move |u| format!("{n}={u}"))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut out = format!("ETCD_NAME={}\n", go_quote(name));
    out += &format!("ETCD_INITIAL_CLUSTER={}\n", go_quote(&conf.join(",")));
    out += &format!(
        "ETCD_INITIAL_ADVERTISE_PEER_URLS={}\n",
        go_quote(&member.peer_ur_ls.join(","))
    );
    out += "ETCD_INITIAL_CLUSTER_STATE=\"existing\"\n";
    out
}

fn go_quote(s: &str) -> String {
    crate::gofmt::quote(s.as_bytes())
}

pub async fn remove(ctx: &Ctx, a: MemberIdArgs) -> Result<i32, CliError> {
    let id = member_id(&a.args)?;
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn
            .cluster()
            .member_remove(MemberRemoveRequest { id })
            .await?
            .into_inner())
    })
    .await?;
    let cid = resp.header.as_ref().map_or(0, |h| h.cluster_id);
    print(
        ctx,
        format!("Member {id:16x} removed from cluster {cid:16x}\n"),
        &resp,
    )?;
    Ok(0)
}

pub async fn update(ctx: &Ctx, a: MemberUpdateArgs) -> Result<i32, CliError> {
    let id = member_id(&a.args)?;
    let urls = peer_urls(&a.peer_urls);
    if urls.is_empty() {
        return Err(CliError::bad_args("member peer urls not provided"));
    }
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn
            .cluster()
            .member_update(MemberUpdateRequest {
                id,
                peer_ur_ls: urls.clone(),
            })
            .await?
            .into_inner())
    })
    .await?;
    let cid = resp.header.as_ref().map_or(0, |h| h.cluster_id);
    print(
        ctx,
        format!("Member {id:16x} updated in cluster {cid:16x}\n"),
        &resp,
    )?;
    Ok(0)
}

pub async fn promote(ctx: &Ctx, a: MemberIdArgs) -> Result<i32, CliError> {
    let id = member_id(&a.args)?;
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn
            .cluster()
            .member_promote(MemberPromoteRequest { id })
            .await?
            .into_inner())
    })
    .await?;
    let cid = resp.header.as_ref().map_or(0, |h| h.cluster_id);
    print(
        ctx,
        format!("Member {id:16x} promoted in cluster {cid:16x}\n"),
        &resp,
    )?;
    Ok(0)
}

/// `move-leader`: like etcdctl, finds the leader among `--endpoints` (MoveLeader is served by
/// the leader only) and asks it to hand over.
pub async fn move_leader(ctx: &Ctx, a: MoveLeaderArgs) -> Result<i32, CliError> {
    if a.args.len() != 1 {
        return Err(CliError::bad_args("move-leader command needs 1 argument"));
    }
    let target = parse_hex_u64(&a.args[0]).map_err(CliError::bad_args)?;
    let deadline = ctx.deadline();
    let (leader, resp) = with_deadline(deadline, async {
        let mut found: Option<(Conn, u64)> = None;
        for ep in &ctx.global.endpoints {
            let conn = Conn::connect(std::slice::from_ref(ep), ctx.dial()?, deadline).await?;
            let st = conn
                .maintenance()
                .status(StatusRequest {})
                .await?
                .into_inner();
            if st.header.as_ref().is_some_and(|h| h.member_id == st.leader) {
                found = Some((conn, st.leader));
                break;
            }
        }
        let Some((conn, leader)) = found else {
            return Err(CliError::bad_args(format!(
                "no leader endpoint given at [{}]",
                ctx.global.endpoints.join(" ")
            )));
        };
        let resp = conn
            .maintenance()
            .move_leader(MoveLeaderRequest { target_id: target })
            .await?
            .into_inner();
        Ok((leader, resp))
    })
    .await?;
    print(
        ctx,
        format!("Leadership transferred from {leader:x} to {target:x}\n"),
        &resp,
    )?;
    Ok(0)
}
