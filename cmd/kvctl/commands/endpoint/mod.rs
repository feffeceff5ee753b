//! `endpoint status`, `endpoint health` and `endpoint hashkv`, optionally for every member
//! (`--cluster`), and kvctl's own `endpoint diagnose`.

mod diagnose;
mod verdict;

pub use diagnose::diagnose;
pub(crate) use diagnose::status_of;
use std::time::Duration;

use kvd::proto::etcdserverpb::{HashKvRequest, MemberListRequest, RangeRequest, StatusRequest};
use tokio::time::Instant;

use crate::cli::{HashKvArgs, StatusArgs};
use crate::client::Dial;
use crate::token::AuthChannel;
use kvd::proto::etcdserverpb::maintenance_client::MaintenanceClient;

use crate::client::{with_deadline, Conn};
use crate::commands::{emit, Ctx};
use crate::error::{CliError, EXIT_BAD_CONNECTION, EXIT_ERROR};
use crate::output::EpHealth;

/// The endpoints to check: the `--endpoints` as given, or with `--cluster` every member's
/// client URLs.
pub(crate) async fn endpoints(ctx: &Ctx, cluster: bool) -> Result<Vec<String>, CliError> {
    if !cluster {
        return Ok(ctx.global.endpoints.clone());
    }
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
    .await
    .map_err(|e| {
        CliError::new(
            EXIT_ERROR,
            format!(
                "failed to fetch endpoints from etcd cluster member list: {}",
                e.msg
            ),
        )
    })?;
    Ok(resp
        .members
        .into_iter()
        .flat_map(|m| m.client_ur_ls)
        .collect())
}

pub(crate) async fn connect_one(
    ep: &str,
    dial: &Dial,
    deadline: Instant,
) -> Result<Conn, CliError> {
    Conn::connect(&[ep.to_string()], dial, deadline).await
}

/// Calls `call` on the Maintenance service of each endpoint in turn, each with its own
/// command deadline; returns every endpoint with its answer or error.
async fn each_maintenance<T, F, Fut>(
    ctx: &Ctx,
    cluster: bool,
    call: F,
) -> Result<Vec<(String, Result<T, CliError>)>, CliError>
where
    F: Fn(MaintenanceClient<AuthChannel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut out = Vec::new();
    for ep in endpoints(ctx, cluster).await? {
        let deadline = ctx.deadline();
        let r = with_deadline(deadline, async {
            let conn = connect_one(&ep, ctx.dial()?, deadline).await?;
            Ok(call(conn.maintenance()).await?.into_inner())
        })
        .await;
        // etcdctl makes one client for all endpoints: failing to authenticate ends the
        // command (exit code 2) instead of marking one endpoint as failed.
        if let Err(e) = &r {
            if e.code == EXIT_BAD_CONNECTION {
                return Err(e.clone());
            }
        }
        out.push((ep, r));
    }
    Ok(out)
}

pub async fn status(ctx: &Ctx, cluster: bool, a: StatusArgs) -> Result<i32, CliError> {
    let mut list = Vec::new();
    let mut failed = false;
    let answers = each_maintenance(ctx, cluster, |mut m| async move {
        m.status(StatusRequest {}).await
    })
    .await?;
    for (ep, r) in answers {
        match r {
            Ok(s) => list.push((ep, s)),
            Err(e) => {
                failed = true;
                eprintln!("Failed to get the status of endpoint {ep} ({})", e.msg);
            }
        }
    }
    emit(&ctx.printer.endpoint_status(&list, a.fsync)?);
    Ok(if failed { EXIT_ERROR } else { 0 })
}

async fn check_health(ep: String, dial: Dial, timeout: Duration) -> EpHealth {
    let start = Instant::now();
    let deadline = start + timeout;
    let r = with_deadline(deadline, async {
        let conn = connect_one(&ep, &dial, deadline).await?;
        let req = RangeRequest {
            key: b"health".to_vec(),
            ..Default::default()
        };
        conn.kv().range(req).await?;
        Ok(())
    })
    .await;
    let took = start.elapsed();
    match r {
        // Permission denied still proves that the request went through consensus.
        Err(e) if e.msg != "etcdserver: permission denied" => EpHealth {
            ep,
            health: false,
            took,
            error: e.msg,
        },
        _ => EpHealth {
            ep,
            health: true,
            took,
            error: String::new(),
        },
    }
}

pub async fn health(ctx: &Ctx, cluster: bool) -> Result<i32, CliError> {
    let eps = endpoints(ctx, cluster).await?;
    let dial = ctx.dial()?;
    // Like etcdctl, results are listed in the order the checks finish.
    let mut checks: futures::stream::FuturesUnordered<_> = eps
        .into_iter()
        .map(|ep| tokio::spawn(check_health(ep, dial.clone(), ctx.global.command_timeout)))
        .collect();
    let mut list = Vec::new();
    while let Some(h) = futures::StreamExt::next(&mut checks).await {
        list.push(h.map_err(|e| CliError::new(EXIT_ERROR, e.to_string()))?);
    }
    emit(&ctx.printer.endpoint_health(&list)?);
    if list.iter().any(|h| !h.error.is_empty()) {
        return Err(CliError::new(EXIT_ERROR, "unhealthy cluster"));
    }
    Ok(0)
}

/// etcdctl's `endpoint hashkv`: each endpoint's HashKV at `--rev`; a failure is reported on
/// stderr and, after the others are printed, ends the command with the last error.
pub async fn hashkv(ctx: &Ctx, cluster: bool, a: HashKvArgs) -> Result<i32, CliError> {
    let mut list = Vec::new();
    let mut last_err = None;
    let revision = a.rev;
    let answers = each_maintenance(ctx, cluster, |mut m| async move {
        m.hash_kv(HashKvRequest { revision }).await
    })
    .await?;
    for (ep, r) in answers {
        match r {
            Ok(h) => list.push((ep, h)),
            Err(e) => {
                eprintln!("Failed to get the hash of endpoint {ep} ({})", e.msg);
                last_err = Some(e);
            }
        }
    }
    emit(&ctx.printer.endpoint_hashkv(&list)?);
    match last_err {
        Some(e) => Err(CliError::new(EXIT_ERROR, e.msg)),
        None => Ok(0),
    }
}
