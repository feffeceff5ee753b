//! `kvbench fsync`: is this disk fast enough for a WAL? The measurement is the library's
//! [`kvd::wal::diskcheck`], shared with `kvctl check disk`.

use std::path::Path;

pub fn run(dir: &Path, count: u64, size: usize, as_json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(count > 0, "--count must be positive");
    let r = kvd::wal::diskcheck::run(dir, count, size)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&r.to_json())?);
    } else {
        print!("{}", r.to_text());
    }
    Ok(())
}
