//! Passwords: `--user`/`--password` as etcdctl 3.4 reads them, and the prompts of
//! `speakeasy.Ask` (prompt on stdout, the line read from stdin with echo off when stdin is a
//! terminal, then a newline on stdout).
use std::io::{BufRead, Write};

use crate::error::{CliError, EXIT_BAD_ARGS, EXIT_ERROR};

/// Splits `--user name:password` (or `--user name --password pw`); a missing password is
/// asked for. `None` when no user is given. A pair with an empty part is returned as is (the
/// caller drops it: clientv3 authenticates only with both).
pub fn credentials(user: &str, password: &str) -> Result<Option<(String, String)>, CliError> {
    if user.is_empty() {
        return Ok(None);
    }
    if !password.is_empty() {
        return Ok(Some((user.to_string(), password.to_string())));
    }
    match user.split_once(':') {
        Some((u, p)) => Ok(Some((u.to_string(), p.to_string()))),
        None => {
            let p = ask("Password: ").map_err(|e| CliError::new(EXIT_ERROR, e.to_string()))?;
            Ok(Some((user.to_string(), p)))
        }
    }
}

/// `readPasswordInteractive` of `user add` and `user passwd`: asked twice, must match and be
/// non-empty (exit code 128 otherwise).
pub fn ask_new(name: &str) -> Result<String, CliError> {
    let failed = |e: std::io::Error| CliError::bad_args(format!("failed to ask password: {e}"));
    let p1 = ask(&format!("Password of {name}: ")).map_err(failed)?;
    if p1.is_empty() {
        return Err(CliError::new(EXIT_BAD_ARGS, "empty password"));
    }
    let p2 = ask(&format!("Type password of {name} again for confirmation: ")).map_err(failed)?;
    if p1 != p2 {
        return Err(CliError::new(
            EXIT_BAD_ARGS,
            "given passwords are different",
        ));
    }
    Ok(p1)
}

/// `fmt.Scanf("%s", &password)` of `--interactive=false`: the first word of stdin's first
/// line, empty if there is none.
pub fn scan_word() -> String {
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    line.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Turns terminal echo off for its lifetime (a no-op when stdin is not a terminal).
struct NoEcho(Option<libc::termios>);

impl NoEcho {
    fn new() -> NoEcho {
        // SAFETY: termios is plain data; tcgetattr/tcsetattr only read and write it, and fail
        // harmlessly when fd 0 is not a terminal.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::isatty(0) != 1 || libc::tcgetattr(0, &mut t) != 0 {
                return NoEcho(None);
            }
            let saved = t;
            t.c_lflag &= !libc::ECHO;
            libc::tcsetattr(0, libc::TCSANOW, &t);
            NoEcho(Some(saved))
        }
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            // SAFETY: restores the settings read in `new`.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, t);
            }
        }
    }
}

/// Writes `prompt`, reads a line without echo, and ends the prompt's line.
pub fn ask(prompt: &str) -> std::io::Result<String> {
    let mut out = std::io::stdout().lock();
    out.write_all(prompt.as_bytes())?;
    out.flush()?;
    let mut line = String::new();
    {
        let _guard = NoEcho::new();
        std::io::stdin().lock().read_line(&mut line)?;
    }
    out.write_all(b"\n")?;
    out.flush()?;
    let line = line.strip_suffix('\n').unwrap_or(&line);
    Ok(line.strip_suffix('\r').unwrap_or(line).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_flag_forms() {
        assert_eq!(credentials("", "x").unwrap(), None);
        assert_eq!(
            credentials("root:pw:x", "").unwrap(),
            Some(("root".into(), "pw:x".into()))
        );
        assert_eq!(
            credentials("root:pw", "other").unwrap(),
            Some(("root:pw".into(), "other".into()))
        );
    }
}
