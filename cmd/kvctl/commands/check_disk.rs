//! `check disk` (kvctl only; etcdctl has no such command): the local disk's write + fdatasync
//! latency, measured by [`kvd::wal::diskcheck`] exactly as `kvbench fsync` does, judged by etcd's
//! guidance for WAL fsync (p99 < 10 ms). Exits 1 when the disk is too slow, like `check perf`
//! on FAIL, so scripts can gate on it.
use crate::cli::CheckDiskArgs;
use crate::commands::Ctx;
use crate::error::{CliError, EXIT_BAD_FEATURE, EXIT_ERROR};
use crate::output::Format;

pub async fn disk(ctx: &Ctx, a: CheckDiskArgs) -> Result<i32, CliError> {
    let format = ctx.printer.format;
    if !matches!(format, Format::Simple | Format::Json) {
        return Err(CliError::new(
            EXIT_BAD_FEATURE,
            format!("{} not supported as output format", format.name()),
        ));
    }
    if a.count == 0 {
        return Err(CliError::bad_args("--count must be positive"));
    }
    // Thousands of blocking fdatasyncs: off the async workers.
    let r = tokio::task::spawn_blocking(move || kvd::wal::diskcheck::run(&a.dir, a.count, a.size))
        .await
        .map_err(|e| CliError::new(EXIT_ERROR, e.to_string()))?
        .map_err(|e| CliError::new(EXIT_ERROR, e.to_string()))?;
    if format == Format::Json {
        println!("{}", r.to_json());
    } else {
        print!("{}", r.to_text());
    }
    Ok(if r.ok() { 0 } else { EXIT_ERROR })
}
