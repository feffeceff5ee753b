//! Operator tooling against real `kvd` processes: `kvctl check perf` (etcdctl's write check),
//! `kvctl check disk` (the local fsync measurement) and the recent WAL fsync p99 that
//! `kvctl endpoint status --fsync` shows.
mod common;

use std::path::Path;
use std::time::Duration;

use common::{put, Cluster};
use kvd::proto::etcdserverpb::{PutRequest, RangeRequest};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs kvctl to completion off the async workers.
async fn kvctl(args: Vec<String>) -> Run {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvctl"))
            .args(&args)
            .env_remove("ETCDCTL_ENDPOINTS")
            .env_remove("ETCDCTL_WRITE_OUT")
            .output()
            .expect("run kvctl");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Keys under `prefix` and the store's revision, read from member `i`.
async fn prefix_count(c: &Cluster, i: usize, prefix: &str) -> (i64, i64) {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let r = c
        .kv(i)
        .await
        .range(RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: end,
            count_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (r.count, r.header.unwrap().revision)
}

/// The number in a verdict line `<pass> <number><unit>` or `<fail> <number><unit>`, and
/// whether it is the pass form.
fn verdict_line(line: &str, pass: &str, fail: &str, unit: &str) -> (bool, f64) {
    let (ok, rest) = match (line.strip_prefix(pass), line.strip_prefix(fail)) {
        (Some(r), _) => (true, r),
        (_, Some(r)) => (false, r),
        _ => panic!("{line:?} is neither {pass:?} nor {fail:?}"),
    };
    let n = rest
        .strip_suffix(unit)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line:?}"));
    (ok, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_perf_paces_puts_judges_and_cleans_up() {
    // In memory, so that the disk is not what decides; the verdict still depends on how
    // loaded the machine is, so the test checks that it follows from the measured figures.
    let c = Cluster::start_in_memory(1).await;
    let ep = format!("--endpoints={}", c.members[0].client_url());
    let (_, rev0) = prefix_count(&c, 0, "/etcdctl-check-perf/").await;

    let r = kvctl(args(&[&ep, "check", "perf", "--duration=4s"])).await;
    assert_eq!(r.stderr, "", "stdout: {}", r.stdout);
    // The progress line, redrawn with \r and ended with the total time.
    assert!(r.stdout.starts_with("\r 0 / 4 "), "{:?}", r.stdout);
    let (progress, verdict) = r.stdout.split_once(" 4 / 4  100.00% 4s\n").unwrap();
    assert!(progress.contains("\r 2 / 4   50.00% 00m0"), "{progress:?}");

    // etcdctl's criteria for workload s (150 puts/s): throughput above 90% of it, slowest
    // put at most 0.5 s, deviation at most 0.1 s; PASS only when all three pass.
    let lines: Vec<&str> = verdict.lines().collect();
    assert_eq!(lines.len(), 4, "{verdict}");
    let (tp_ok, writes) = verdict_line(
        lines[0],
        "PASS: Throughput is ",
        "FAIL: Throughput too low: ",
        " writes/s",
    );
    // Go's int(rps)+1, so 136 may be either side of 90%.
    assert!(
        if tp_ok {
            writes >= 136.0
        } else {
            writes <= 136.0
        },
        "{verdict}"
    );
    // Paced: never above the limit; and the run did put something.
    assert!((20.0..=152.0).contains(&writes), "{verdict}");
    let (slow_ok, slowest) = verdict_line(
        lines[1],
        "PASS: Slowest request took ",
        "Slowest request took too long: ",
        "s",
    );
    assert_eq!(slow_ok, slowest <= 0.5, "{verdict}");
    assert!(slowest > 0.0, "{verdict}");
    let (dev_ok, stddev) = verdict_line(lines[2], "PASS: Stddev is ", "Stddev too high: ", "s");
    assert_eq!(dev_ok, stddev <= 0.1, "{verdict}");
    let pass = tp_ok && slow_ok && dev_ok;
    assert_eq!(lines[3], if pass { "PASS" } else { "FAIL" }, "{verdict}");
    assert_eq!(r.code, if pass { 0 } else { 1 }, "{verdict}");

    // Each put was a revision, the cleanup delete one more, and it left no key behind. The
    // throughput was counted over at least the 4 s of pacing, which allowed at most 601 puts
    // (one at 0 s, then every 1/150 s).
    let (left, rev1) = prefix_count(&c, 0, "/etcdctl-check-perf/").await;
    assert_eq!(left, 0);
    let puts = (rev1 - rev0 - 1) as f64;
    assert!(
        puts >= (writes - 1.0) * 3.9 && puts <= 601.0,
        "{puts} puts, {verdict}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_perf_refuses_a_prefix_with_keys_and_unknown_loads() {
    let c = Cluster::start(1).await;
    let ep = format!("--endpoints={}", c.members[0].client_url());
    let mut kv = c.kv(0).await;
    put(&mut kv, "/mine/a", "keep").await.unwrap();

    let r = kvctl(args(&[&ep, "check", "perf", "--prefix=/mine/"])).await;
    assert_eq!(r.code, 3);
    assert_eq!(
        r.stderr,
        "Error: prefix \"/mine/\" has keys. Delete with etcdctl del --prefix /mine/ first\n"
    );
    assert_eq!(r.stdout, "");
    assert_eq!(prefix_count(&c, 0, "/mine/").await.0, 1);

    let r = kvctl(args(&[&ep, "check", "perf", "--load=XL"])).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (4, "Error: unknown load option XL\n")
    );
}

/// Parses `  p99: 1.234 ms` lines.
fn ms_line(text: &str, name: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn check_disk_measures_a_directory_and_leaves_it_empty() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let r = kvctl(args(&["check", "disk", "--dir", &d, "--count", "50"])).await;
    assert_eq!(r.stderr, "");
    assert!(
        r.stdout.starts_with(&format!(
            "fsync test in {d}: 50 x 2300-byte write + fdatasync, "
        )),
        "{}",
        r.stdout
    );
    let p: Vec<f64> = ["p50", "p90", "p99", "p99.9", "max"]
        .iter()
        .map(|n| ms_line(&r.stdout, n))
        .collect();
    assert!(p[0] > 0.0, "{}", r.stdout);
    assert!(p.windows(2).all(|w| w[0] <= w[1]), "{}", r.stdout);
    // The verdict follows the measured p99, and so does the exit code.
    let verdict = r.stdout.lines().last().unwrap();
    if p[2] < 10.0 {
        assert!(verdict.starts_with("OK: p99 "), "{verdict}");
        assert_eq!(r.code, 0);
    } else {
        assert!(verdict.starts_with("SLOW: p99 "), "{verdict}");
        assert_eq!(r.code, 1);
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let r = kvctl(args(&[
        "check",
        "disk",
        "--dir",
        &d,
        "--count=20",
        "-w",
        "json",
    ]))
    .await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["count"], 20);
    assert_eq!(v["ok"], r.code == 0);

    let missing = Path::new(&d).join("missing").display().to_string();
    let r = kvctl(args(&["check", "disk", "--dir", &missing])).await;
    assert_eq!(r.code, 1);
    assert!(r.stderr.starts_with("Error: create "), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_status_shows_each_members_recent_fsync_p99() {
    let c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let eps: Vec<String> = c.members.iter().map(|m| m.client_url()).collect();
    let ep = format!("--endpoints={}", eps.join(","));
    let mut kv = c.kv(leader).await;
    for i in 0..30 {
        kv.put(PutRequest {
            key: format!("k{i}").into_bytes(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    }

    // Each member synced its WAL for those puts (followers too) and reports it over gRPC.
    for i in 0..3 {
        let s = c.status(i).await;
        assert!(s.kvd_recent_wal_fsyncs >= 30, "m{i}: {s:?}");
        assert!(s.kvd_recent_wal_fsync_p99_us > 0, "m{i}: {s:?}");
    }

    // etcdctl's table unless --fsync asks for the extra column.
    let plain = kvctl(args(&[&ep, "endpoint", "status", "-w", "table"])).await;
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    assert!(!plain.stdout.contains("FSYNC"), "{}", plain.stdout);
    let r = kvctl(args(&[&ep, "endpoint", "status", "-w", "table", "--fsync"])).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("| RECENT WAL FSYNC P99 |"),
        "{}",
        r.stdout
    );
    let rows: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("| http"))
        .collect();
    assert_eq!(rows.len(), 3, "{}", r.stdout);
    for row in rows {
        let cell = row.trim_end_matches('|').rsplit('|').next().unwrap().trim();
        // A Go duration such as 2.048ms; "-" would mean no fsyncs in the window.
        assert!(cell.ends_with('s') && cell != "0s", "{row}");
    }

    let r = kvctl(args(&[
        &ep, "endpoint", "status", "-w", "fields", "--fsync",
    ]))
    .await;
    let p99s: Vec<f64> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("\"RecentWalFsyncP99\" : "))
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(p99s.len(), 3, "{}", r.stdout);
    assert!(p99s.iter().all(|p| *p > 0.0), "{}", r.stdout);

    // The JSON gateway answers as etcd's would: no extension fields.
    let body = reqwest::Client::new()
        .post(format!("{}/v3/maintenance/status", eps[0]))
        .body("{}")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("\"raftIndex\""), "{body}");
    assert!(!body.contains("kvd_"), "{body}");
}
