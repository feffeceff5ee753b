//! Is this disk fast enough for a WAL? Sequential fixed-size appends to a fresh file, each
//! followed by fdatasync, as etcd's fio recipe does; judged by etcd's guidance that the 99th
//! percentile of WAL fsync latency stay below 10 ms.
//!
//! One measurement for both `kvbench fsync` and `kvctl check disk`, so their numbers are
//! comparable. The test file is created exclusively (never clobbers anything) and removed
//! however the measurement ends.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde_json::json;

/// etcd's documented limit for the p99 of `etcd_disk_wal_fsync_duration_seconds`.
pub const GUIDANCE_P99_MS: f64 = 10.0;

/// Bytes per write by default: the size etcd's fio recipe uses (a typical WAL entry batch).
pub const DEFAULT_SIZE: usize = 2300;

/// Writes by default: enough for a stable p99 (10 samples above it) in a few seconds.
pub const DEFAULT_COUNT: u64 = 1000;

/// The percentiles reported, in order.
pub const PERCENTILES: [(&str, f64); 4] =
    [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9)];

/// The result of one run.
pub struct DiskReport {
    pub dir: PathBuf,
    pub count: u64,
    pub size: usize,
    pub seconds: f64,
    /// Latency of each write + fdatasync, in microseconds.
    pub latency_us: Histogram<u64>,
}

/// Runs `count` write + fdatasync rounds of `size` bytes in a new file under `dir`.
pub fn run(dir: &Path, count: u64, size: usize) -> std::io::Result<DiskReport> {
    if count == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the write count must be positive",
        ));
    }
    let path = dir.join(format!("kvd-diskcheck-{}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("create {}: {e}", path.display())))?;
    // Remove the file however the loop ends.
    struct Cleanup<'a>(&'a Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _cleanup = Cleanup(&path);
    let buf = vec![0x5au8; size];
    // 1 us .. 1 h at 3 significant digits: exact enough for any p99 a disk can produce.
    let mut h = Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
    let start = Instant::now();
    for _ in 0..count {
        let t0 = Instant::now();
        f.write_all(&buf)?;
        f.sync_data()?;
        h.saturating_record(t0.elapsed().as_micros().max(1) as u64);
    }
    Ok(DiskReport {
        dir: dir.to_path_buf(),
        count,
        size,
        seconds: start.elapsed().as_secs_f64(),
        latency_us: h,
    })
}

impl DiskReport {
    /// The latency at percentile `q` (0..=100), in milliseconds.
    pub fn ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_percentile(q) as f64 / 1000.0
    }

    pub fn max_ms(&self) -> f64 {
        self.latency_us.max() as f64 / 1000.0
    }

    pub fn syncs_per_sec(&self) -> f64 {
        self.count as f64 / self.seconds
    }

    /// Whether the p99 meets etcd's guidance.
    pub fn ok(&self) -> bool {
        self.ms(99.0) < GUIDANCE_P99_MS
    }

    /// The human-readable report: parameters, percentiles, then an `OK:` or `SLOW:` verdict.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "fsync test in {}: {} x {}-byte write + fdatasync, {:.2} s, {:.0} syncs/s\n",
            self.dir.display(),
            self.count,
            self.size,
            self.seconds,
            self.syncs_per_sec()
        );
        for (name, q) in PERCENTILES {
            s += &format!("  {name:>6}: {:.3} ms\n", self.ms(q));
        }
        s += &format!("  {:>6}: {:.3} ms\n", "max", self.max_ms());
        let p99 = self.ms(99.0);
        if self.ok() {
            s += &format!(
                "OK: p99 {p99:.3} ms < {GUIDANCE_P99_MS} ms (etcd's guidance for WAL fsync)\n"
            );
        } else {
            s += &format!(
                "SLOW: p99 {p99:.3} ms >= {GUIDANCE_P99_MS} ms (etcd's guidance for WAL fsync); expect slow commits and leader elections\n"
            );
        }
        s
    }

    /// The same report as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let mut lat = serde_json::Map::new();
        for (name, q) in PERCENTILES {
            lat.insert(name.into(), json!(self.ms(q)));
        }
        lat.insert("max".into(), json!(self.max_ms()));
        json!({
            "op": "fsync",
            "dir": self.dir.display().to_string(),
            "count": self.count,
            "size": self.size,
            "seconds": self.seconds,
            "syncs_per_sec": self.syncs_per_sec(),
            "latency_ms": lat,
            "guidance_p99_ms": GUIDANCE_P99_MS,
            "ok": self.ok(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_and_removes_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let r = run(dir.path(), 20, 512).unwrap();
        assert_eq!(r.latency_us.len(), 20);
        assert!(r.ms(50.0) > 0.0 && r.ms(50.0) <= r.max_ms());
        assert!(r.to_text().contains("20 x 512-byte write + fdatasync"));
        assert_eq!(r.to_json()["count"], 20);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn zero_count_and_missing_dir_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(run(dir.path(), 0, 512).is_err());
        let err = run(&dir.path().join("missing"), 1, 512).err().unwrap();
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
