//! `lock <lockname> [exec-command arg1 arg2 ...]`: etcdctl 3.4's lock, through the Lock
//! service on a session lease of `--ttl` seconds. Without a command it prints the lock key (as
//! `get` prints it) and holds the lock until SIGINT/SIGTERM, then unlocks; with one it runs the
//! command with `ETCD_LOCK_KEY` and `ETCD_LOCK_REV` set, unlocks when it exits, and fails as
//! etcdctl does if the command fails (`exit status N`).

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use kvd::proto::etcdserverpb::RangeRequest;
use kvd::proto::v3lockpb::lock_client::LockClient;
use kvd::proto::v3lockpb::{LockRequest, UnlockRequest};

use super::session::{interrupted, Session};
use super::{emit, Ctx};
use crate::cli::LockArgs;
use crate::error::{CliError, EXIT_BAD_ARGS, EXIT_ERROR};

pub async fn lock(ctx: &Ctx, a: LockArgs) -> Result<i32, CliError> {
    let Some((name, cmd)) = a.args.split_first() else {
        return Err(CliError::new(
            EXIT_BAD_ARGS,
            "lock takes a lock name argument and an optional command to execute",
        ));
    };
    let name = name.as_encoded_bytes().to_vec();
    let deadline = ctx.deadline();
    let conn = crate::client::with_deadline(deadline, ctx.connect(deadline)).await?;
    let mut session = Session::open(ctx, &conn, a.ttl).await?;
    let mut locks = LockClient::new(conn.channel.clone());
    let req = LockRequest {
        name,
        lease: session.lease,
    };
    let held = tokio::select! {
        r = locks.lock(req) => r?.into_inner(),
        _ = interrupted() => return Err(CliError::new(EXIT_ERROR, "context canceled")),
    };
    let unlock = |mut locks: LockClient<_>, key: Vec<u8>| async move {
        locks.unlock(UnlockRequest { key }).await.map(|_| ())
    };

    if !cmd.is_empty() {
        let rev = held.header.map_or(0, |h| h.revision);
        let ran = run(cmd, &held.key, rev).await;
        let unlocked = unlock(locks, held.key).await;
        ran?;
        unlocked?;
        return Ok(0);
    }

    let got = conn
        .kv()
        .range(RangeRequest {
            key: held.key.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    if got.kvs.is_empty() {
        return Err(CliError::new(EXIT_ERROR, "lock lost on init"));
    }
    emit(&ctx.printer.get(&got, false)?);
    tokio::select! {
        _ = interrupted() => {
            unlock(locks, held.key).await?;
            Ok(0)
        }
        _ = &mut session.done => Err(CliError::new(EXIT_ERROR, "session expired")),
    }
}

/// Runs the command as Go's `exec.Command(...).Run()` would, with its error texts.
async fn run(cmd: &[OsString], key: &[u8], rev: i64) -> Result<(), CliError> {
    let err = |m: String| CliError::new(EXIT_ERROR, m);
    let prog = look_path(&cmd[0]).map_err(err)?;
    let status = tokio::process::Command::new(&prog)
        .args(&cmd[1..])
        .env("ETCD_LOCK_KEY", std::ffi::OsStr::from_bytes(key))
        .env("ETCD_LOCK_REV", rev.to_string())
        .status()
        .await
        .map_err(|e| err(format!("fork/exec {}: {}", prog.display(), go_errno(&e))))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(n) => Err(err(format!("exit status {n}"))),
        None => Err(err("signal: killed".into())),
    }
}

/// Go's `exec.LookPath`: a name with a slash is used as is, otherwise searched in `$PATH`.
fn look_path(name: &OsString) -> Result<PathBuf, String> {
    if name.as_encoded_bytes().contains(&b'/') {
        return Ok(PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if is_executable(&p) {
            return Ok(p);
        }
    }
    Err(format!(
        "exec: \"{}\": executable file not found in $PATH",
        name.to_string_lossy()
    ))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// An OS error as Go's syscall package prints it ("no such file or directory").
fn go_errno(e: &std::io::Error) -> String {
    let s = e.to_string();
    let s = s.split(" (os error").next().unwrap_or(&s).to_string();
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_gos() {
        let e = std::io::Error::from_raw_os_error(2);
        assert_eq!(go_errno(&e), "no such file or directory");
        assert_eq!(
            look_path(&OsString::from("no-such-program-kvctl")).unwrap_err(),
            "exec: \"no-such-program-kvctl\": executable file not found in $PATH"
        );
    }
}
