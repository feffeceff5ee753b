//! `put`, `get` and `del`.
use crate::cli::{DelArgs, GetArgs, PutArgs};
use crate::client::{check_send_size, with_deadline};
use crate::commands::{emit, Ctx};
use crate::error::CliError;
use crate::ops;

pub async fn put(ctx: &Ctx, a: PutArgs) -> Result<i32, CliError> {
    let mut stdin = std::io::stdin();
    let req = ops::put_request(&a, Some(&mut stdin))?;
    check_send_size(&req)?;
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn.kv().put(req).await?.into_inner())
    })
    .await?;
    emit(&ctx.printer.put(&resp)?);
    Ok(0)
}

pub async fn get(ctx: &Ctx, a: GetArgs) -> Result<i32, CliError> {
    let req = ops::range_request(&a)?;
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn.kv().range(req).await?.into_inner())
    })
    .await?;
    let mut printer = ctx.printer;
    if a.print_value_only {
        printer.set_value_only()?;
    }
    emit(&printer.get(&resp, a.count_only)?);
    Ok(0)
}

pub async fn del(ctx: &Ctx, a: DelArgs) -> Result<i32, CliError> {
    let req = ops::delete_request(&a)?;
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn.kv().delete_range(req).await?.into_inner())
    })
    .await?;
    emit(&ctx.printer.del(&resp)?);
    Ok(0)
}
