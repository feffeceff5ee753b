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

#[test]
fn auth_argument_errors() {
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["auth", "enable", "x"],
            128,
            "auth enable command does not accept any arguments",
        ),
        (
            &["auth", "disable", "x"],
            128,
            "auth disable command does not accept any arguments",
        ),
        (
            &["user", "add"],
            128,
            "user add command requires user name as its argument",
        ),
        (&["user", "add", ":pw"], 128, "empty user name is not allowed"),
        (
            &["user", "grant-role", "u"],
            128,
            "user grant command requires user name and role name as its argument",
        ),
        (
            &["user", "revoke-role", "u"],
            128,
            "user revoke-role requires user name and role name as its argument",
        ),
        (&["user", "list", "x"], 128, "user list command requires no arguments"),
        (
            &["role", "get"],
            128,
            "role get command requires role name as its argument",
        ),
        (
            &["role", "grant-permission", "r", "read"],
            128,
            "role grant command requires role name, permission type, and key [endkey] as its argument",
        ),
        (
            &["role", "grant-permission", "r", "admin", "k"],
            128,
            "invalid permission type: admin",
        ),
        (
            &["role", "grant-permission", "r", "read", "k", "--prefix", "--from-key"],
            128,
            "--from-key and --prefix flags are mutually exclusive",
        ),
        (
            &["role", "grant-permission", "r", "read", "k", "z", "--from-key"],
            128,
            "unexpected endkey argument with --from-key flag",
        ),
        (
            &["role", "revoke-permission", "r"],
            128,
            "role revoke-permission command requires role name and key [endkey] as its argument",
        ),
    ];
    for (args, code, msg) in cases {
        let r = kvctl(args, "");
        assert_eq!(
            (r.code, r.stderr.as_str()),
            (*code, format!("Error: {msg}\n").as_str()),
            "{args:?}"
        );
    }
}

#[test]
fn passwords_from_stdin() {
    // A new user's password is asked twice; different answers end the command before it
    // connects.
    let r = kvctl(&["user", "add", "alice"], "one\ntwo\n");
    assert_eq!(r.code, 128);
    assert_eq!(
        r.stdout,
        "Password of alice: \nType password of alice again for confirmation: \n"
    );
    assert_eq!(r.stderr, "Error: given passwords are different\n");
    let r = kvctl(&["user", "passwd", "alice"], "\n");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (128, "Error: empty password\n")
    );
    // --user without a password asks for it, then connects and authenticates within the dial
    // timeout; failing that is a connection error (exit code 2).
    let r = kvctl(
        &["--user", "alice", "--dial-timeout=300ms", "user", "list"],
        "pw\n",
    );
    assert_eq!(r.stdout, "Password: \n");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (2, "Error: context deadline exceeded\n")
    );
    // An empty password means no authentication (clientv3 needs both): a plain request.
    let r = kvctl(&["--user", "alice", "get", "k"], "\n");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (1, "Error: context deadline exceeded\n")
    );
}

#[test]
fn tls_flag_errors() {
    let r = kvctl(&["--key", "/nonexistent/k.pem", "get", "k"], "");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (
            128,
            "Error: KeyFile and CertFile must both be present[key: /nonexistent/k.pem, cert: ]\n"
        )
    );
    let r = kvctl(&["--cacert", "/nonexistent/ca.pem", "get", "k"], "");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (
            128,
            "Error: open /nonexistent/ca.pem: no such file or directory\n"
        )
    );
}
