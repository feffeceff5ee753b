//! `txn [-i]`: reads the transaction from stdin in etcdctl's format.
use std::io::{BufRead, Write};

use kvd::proto::etcdserverpb::TxnRequest;

use crate::cli::TxnArgs;
use crate::client::{check_send_size, with_deadline};
use crate::commands::{emit, Ctx};
use crate::error::CliError;
use crate::txn_parse::{read_compares, read_ops};

fn prompt(interactive: bool, s: &str) {
    if interactive {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{s}");
        let _ = out.flush();
    }
}

/// Reads the three sections of a txn, printing etcdctl's prompts in interactive mode.
pub fn read_txn(r: &mut dyn BufRead, interactive: bool) -> Result<TxnRequest, CliError> {
    prompt(interactive, "compares:");
    let compare = read_compares(r)?;
    prompt(interactive, "success requests (get, put, del):");
    let success = read_ops(r)?;
    prompt(interactive, "failure requests (get, put, del):");
    let failure = read_ops(r)?;
    Ok(TxnRequest {
        compare,
        success,
        failure,
    })
}

pub async fn txn(ctx: &Ctx, a: TxnArgs) -> Result<i32, CliError> {
    if !a.args.is_empty() {
        return Err(CliError::bad_args("txn command does not accept argument"));
    }
    let stdin = std::io::stdin();
    let req = read_txn(&mut stdin.lock(), a.interactive)?;
    check_send_size(&req)?;
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn.kv().txn(req).await?.into_inner())
    })
    .await?;
    emit(&ctx.printer.txn(&resp)?);
    Ok(0)
}
