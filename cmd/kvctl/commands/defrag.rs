//! `defrag [--cluster]`: each endpoint in turn (etcdctl's order and lines), exit 1 if any
//! failed.
use kvd::proto::etcdserverpb::DefragmentRequest;

use crate::cli::DefragArgs;
use crate::client::with_deadline;
use crate::commands::endpoint::{connect_one, endpoints};
use crate::commands::Ctx;
use crate::error::{CliError, EXIT_BAD_CONNECTION, EXIT_ERROR};

pub async fn defrag(ctx: &Ctx, a: DefragArgs) -> Result<i32, CliError> {
    let mut failures = 0;
    for ep in endpoints(ctx, a.cluster).await? {
        let deadline = ctx.deadline();
        let r = with_deadline(deadline, async {
            let conn = connect_one(&ep, ctx.dial()?, deadline).await?;
            conn.maintenance().defragment(DefragmentRequest {}).await?;
            Ok(())
        })
        .await;
        match r {
            Ok(()) => println!("Finished defragmenting etcd member[{ep}]"),
            // One client for all endpoints in etcdctl: failing to authenticate ends it.
            Err(e) if e.code == EXIT_BAD_CONNECTION => return Err(e),
            Err(e) => {
                failures += 1;
                eprintln!("Failed to defragment etcd member[{ep}] ({})", e.msg);
            }
        }
    }
    Ok(if failures == 0 { 0 } else { EXIT_ERROR })
}
