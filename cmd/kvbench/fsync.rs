//! `kvbench fsync`: is this disk fast enough for a WAL? Sequential `--size`-byte appends, each
//! followed by fdatasync, as etcd's fio recipe does; judged by etcd's guidance that the 99th
//! percentile of WAL fsync latency stay below 10 ms.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use crate::report::PERCENTILES;
use crate::runner::new_histogram;

/// etcd's documented limit for the p99 of `etcd_disk_wal_fsync_duration_seconds`.
const GUIDANCE_P99_MS: f64 = 10.0;

pub fn run(dir: &Path, count: u64, size: usize, as_json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(count > 0, "--count must be positive");
    let path = dir.join(format!("kvbench-fsync-{}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    // Remove the file however the loop ends.
    struct Cleanup<'a>(&'a Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _cleanup = Cleanup(&path);
    let buf = vec![0x5au8; size];
    let mut h = new_histogram();
    let start = Instant::now();
    for _ in 0..count {
        let t0 = Instant::now();
        f.write_all(&buf)?;
        f.sync_data()?;
        h.saturating_record(t0.elapsed().as_micros().max(1) as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    let ms = |q: f64| h.value_at_percentile(q) as f64 / 1000.0;
    let p99 = ms(99.0);
    let ok = p99 < GUIDANCE_P99_MS;
    if as_json {
        let mut lat = serde_json::Map::new();
        for (name, q) in PERCENTILES {
            lat.insert(name.into(), json!(ms(q)));
        }
        lat.insert("max".into(), json!(h.max() as f64 / 1000.0));
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "op": "fsync",
                "dir": dir.display().to_string(),
                "count": count,
                "size": size,
                "seconds": secs,
                "syncs_per_sec": count as f64 / secs,
                "latency_ms": lat,
                "guidance_p99_ms": GUIDANCE_P99_MS,
                "ok": ok,
            }))?
        );
        return Ok(());
    }
    println!(
        "fsync test in {}: {count} x {size}-byte write + fdatasync, {:.2} s, {:.0} syncs/s",
        dir.display(),
        secs,
        count as f64 / secs
    );
    for (name, q) in PERCENTILES {
        println!("  {name:>6}: {:.3} ms", ms(q));
    }
    println!("  {:>6}: {:.3} ms", "max", h.max() as f64 / 1000.0);
    if ok {
        println!("OK: p99 {p99:.3} ms < {GUIDANCE_P99_MS} ms (etcd's guidance for WAL fsync)");
    } else {
        println!(
            "SLOW: p99 {p99:.3} ms >= {GUIDANCE_P99_MS} ms (etcd's guidance for WAL fsync); expect slow commits and leader elections"
        );
    }
    Ok(())
}
