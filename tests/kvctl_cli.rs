//! kvctl behaviour that needs no server: argument checks, txn input errors and timeouts, with
//! etcdctl 3.4's messages and exit codes. Output against a live server is covered by
//! tests/etcdctl_diff.
use std::io::Write;
use std::process::{Command, Stdio};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn kvctl(args: &[&str], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvctl"))
        // Nothing listens on port 1: commands that get past their checks fail with a timeout.
        .args(["--endpoints=127.0.0.1:1", "--command-timeout=300ms"])
        .args(args)
        .env_remove("ETCDCTL_ENDPOINTS")
        .env_remove("ETCDCTL_WRITE_OUT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvctl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn argument_errors() {
    let r = kvctl(&["get"], "");
    assert_eq!(r.code, 128);
    assert_eq!(
        r.stderr,
        "Error: get command needs one argument as key and an optional argument as range_end\n"
    );
    let r = kvctl(&["put", "k"], "");
    assert_eq!(r.code, 128);
    assert_eq!(
        r.stderr,
        "Error: put command needs 1 argument and input from stdin or 2 arguments\n"
    );
    let r = kvctl(&["get", "k", "--order=up"], "");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (4, "Error: bad sort order up\n")
    );
    let r = kvctl(&["compaction"], "");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (128, "Error: compaction command needs 1 argument\n")
    );
    let r = kvctl(&["get", "k", "--nope"], "");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (
            1,
            "Error: unknown flag: --nope\n\nError: unknown flag: --nope\n"
        )
    );
}

#[test]
fn txn_input_errors() {
    let r = kvctl(&["txn"], "value(\"a\") = \"1\"\n\nput a 2\n");
    assert_eq!((r.code, r.stderr.as_str()), (3, "Error: EOF\n"));
    let r = kvctl(&["txn"], "nope\n\n\n\n");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (3, "Error: malformed comparison: nope\n")
    );
    let r = kvctl(&["txn", "-i"], "\nwatch a\n\n\n");
    assert_eq!(r.code, 3);
    assert_eq!(r.stdout, "compares:\nsuccess requests (get, put, del):\n");
    assert_eq!(r.stderr, "Error: invalid txn request: watch a\n");
}

#[test]
fn unreachable_cluster() {
    let r = kvctl(&["put", "k", "v"], "");
    assert_eq!(
        (r.code, r.stderr.as_str(), r.stdout.as_str()),
        (1, "Error: context deadline exceeded\n", "")
    );
    let r = kvctl(&["endpoint", "health", "-w", "json"], "");
    assert_eq!(r.code, 1);
    assert!(
        r.stdout
            .starts_with("[{\"endpoint\":\"127.0.0.1:1\",\"health\":false,\"took\":\""),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .ends_with("\",\"error\":\"context deadline exceeded\"}]\n"),
        "{}",
        r.stdout
    );
    assert_eq!(r.stderr, "Error: unhealthy cluster\n");
}
