//! `compaction REV [--physical]`.
use kvd::proto::etcdserverpb::CompactionRequest;

use crate::cli::CompactionArgs;
use crate::client::with_deadline;
use crate::commands::Ctx;
use crate::error::{CliError, EXIT_ERROR};
use crate::gofmt::quote;

pub async fn compaction(ctx: &Ctx, a: CompactionArgs) -> Result<i32, CliError> {
    if a.args.len() != 1 {
        return Err(CliError::bad_args("compaction command needs 1 argument"));
    }
    let arg = &a.args[0];
    let revision: i64 = arg.parse().map_err(|e: std::num::ParseIntError| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                "value out of range"
            }
            _ => "invalid syntax",
        };
        CliError::new(
            EXIT_ERROR,
            format!("strconv.ParseInt: parsing {}: {why}", quote(arg.as_bytes())),
        )
    })?;
    let deadline = ctx.deadline();
    with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        conn.kv()
            .compact(CompactionRequest {
                revision,
                physical: a.physical,
            })
            .await?;
        Ok(())
    })
    .await?;
    println!("compacted revision {revision}");
    Ok(0)
}
