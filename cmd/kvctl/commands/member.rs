//! `member list`. `member add/remove/update/promote` belong here too.
use kvd::proto::etcdserverpb::MemberListRequest;

use crate::client::with_deadline;
use crate::commands::{emit, Ctx};
use crate::error::CliError;

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
