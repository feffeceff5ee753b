//! The `ETCD_*` environment as etcd 3.4 reads it, through the real `kvd` binary: a variable
//! that its flag also sets on the command line stops the start (etcd's message, exit 1); a
//! variable no flag reads is logged once with its value, and the member starts.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::single_member;

/// `kvd` for a one-member cluster in `dir`, its log piped.
fn kvd(dir: &std::path::Path, name: &str) -> Command {
    let mut c = single_member(&dir.join("m"), name);
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

#[test]
fn a_variable_shadowed_by_its_flag_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = kvd(dir.path(), "m")
        .env("ETCD_NAME", "other")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "conflicting environment variable \"ETCD_NAME\" is shadowed by corresponding \
             command-line flag (either unset environment variable or disable flag)"
        ),
        "{err}"
    );
    assert!(!dir.path().join("m").exists(), "nothing created");
}

#[test]
fn a_variable_no_flag_reads_is_logged_and_the_member_starts() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = kvd(dir.path(), "m")
        .env("ETCD_NO_SUCH_FLAG", "bar")
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut warned, mut ready) = (0, false);
    let mut seen = Vec::new();
    while Instant::now() < deadline && !(warned > 0 && ready) {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            warned +=
                line.contains("unrecognized environment variable ETCD_NO_SUCH_FLAG=bar") as u32;
            ready |= line.contains("ready to serve client requests");
            seen.push(line);
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(warned, 1, "logged once:\n{}", seen.join("\n"));
    assert!(ready, "the member started:\n{}", seen.join("\n"));
}

/// A flag kvd accepts without effect reads its variable like any other: the variable and the
/// flag together stop the start, and the variable alone is that flag's (one warning, not an
/// unrecognized variable).
#[test]
fn an_ignored_flags_variable_is_its_flags() {
    let dir = tempfile::tempdir().unwrap();
    let out = kvd(dir.path(), "m")
        .arg("--max-wals=5")
        .env("ETCD_MAX_WALS", "5")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("conflicting environment variable \"ETCD_MAX_WALS\" is shadowed"),
        "{err}"
    );
}

/// With `--logger=zap`, the warning is etcd 3.5's: the message, and the variable as a field.
#[test]
fn an_unrecognized_variable_is_a_field_in_json_logs() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = kvd(dir.path(), "m")
        .arg("--logger=zap")
        .env("ETCD_NO_SUCH_FLAG", "bar")
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let found = loop {
        if Instant::now() > deadline {
            break false;
        }
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            let hit = line.contains(r#""msg":"unrecognized environment variable""#)
                && line.contains(r#""environment-variable":"ETCD_NO_SUCH_FLAG=bar""#);
            seen.push(line);
            if hit {
                break true;
            }
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(found, "{}", seen.join("\n"));
}
