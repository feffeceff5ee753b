//! Long, deferrable work (building a snapshot, encoding one for a follower, writing a received
//! one) on its own thread at a lower CPU priority.
//!
//! Every member takes its snapshot at about the same log index, so copying and encoding the
//! state (seconds for a large history) competes for the CPU with the applies and the WAL on
//! all of them at once. A snapshot can wait; writes cannot (see
//! docs/decisions/0002-snapshot-copy-off-the-apply-path.md).
//!
//! A dedicated thread, not tokio's blocking pool: Linux lets an unprivileged thread lower its
//! priority but not raise it back, and a pooled thread would keep the lower priority for
//! whatever it runs next.

use std::io;

/// The nice value of the thread (0 is normal, 19 the lowest priority): when the CPU is busy
/// it gets about a tenth of what a normal thread gets, and all of it when the CPU is idle.
const NICE: libc::c_int = 10;

/// Runs `f` on a new thread named `name` at nice [`NICE`], and waits for its result without
/// blocking the runtime.
pub async fn run<R, F>(name: &str, f: F) -> io::Result<R>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    spawn(name, f)?
        .await
        .map_err(|_| io::Error::other(format!("the {name} thread panicked")))
}

/// Starts `f` on a new thread named `name` at nice [`NICE`] (threads it starts inherit the
/// priority); its result arrives on the returned receiver, which closes without one if `f`
/// panics. Dropping the receiver does not stop `f`.
pub fn spawn<R, F>(name: &str, f: F) -> io::Result<tokio::sync::oneshot::Receiver<R>>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            lower_priority();
            let _ = tx.send(f());
        })?;
    Ok(rx)
}

fn lower_priority() {
    // SAFETY: gettid and setpriority only read their integer arguments; they change the
    // calling thread's scheduling priority and nothing in this process's memory.
    let rc = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, NICE)
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "lowering a thread's priority");
    }
}
