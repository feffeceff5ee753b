//! `alarm list` and `alarm disarm`, as etcdctl (clientv3's `AlarmList`, `AlarmDisarm`).
use kvd::proto::etcdserverpb::alarm_request::AlarmAction;
use kvd::proto::etcdserverpb::{AlarmRequest, AlarmResponse};

use crate::cli::AlarmNoArgs;
use crate::client::with_deadline;
use crate::commands::{emit, Ctx};
use crate::error::CliError;

pub async fn list(ctx: &Ctx, a: AlarmNoArgs) -> Result<i32, CliError> {
    if !a.args.is_empty() {
        return Err(CliError::bad_args(
            "alarm list command accepts no arguments",
        ));
    }
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn
            .maintenance()
            .alarm(AlarmRequest::default())
            .await?
            .into_inner())
    })
    .await?;
    emit(&ctx.printer.alarm(&resp)?);
    Ok(0)
}

/// Lists the alarms, then deactivates each; prints what was deactivated (without a header,
/// as clientv3 assembles it).
pub async fn disarm(ctx: &Ctx, a: AlarmNoArgs) -> Result<i32, CliError> {
    if !a.args.is_empty() {
        return Err(CliError::bad_args(
            "alarm disarm command accepts no arguments",
        ));
    }
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        let listed = conn
            .maintenance()
            .alarm(AlarmRequest::default())
            .await?
            .into_inner();
        let mut out = AlarmResponse::default();
        for m in listed.alarms {
            let r = conn
                .maintenance()
                .alarm(AlarmRequest {
                    action: AlarmAction::Deactivate as i32,
                    member_id: m.member_id,
                    alarm: m.alarm,
                })
                .await?
                .into_inner();
            out.alarms.extend(r.alarms);
        }
        Ok(out)
    })
    .await?;
    emit(&ctx.printer.alarm(&resp)?);
    Ok(0)
}
