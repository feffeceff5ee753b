//! Snapshot sends on a connection of their own, driven by a runtime on a thread at a lower
//! CPU priority (`kvd-snap-net`, nice 10, as the snapshot's encoder).
//!
//! A snapshot of a large store is gigabytes that h2 frames, copies and writes to the socket.
//! On the peer channel shared with replication that work ran on the member's async workers
//! (one thread on a 2-core machine), between its client requests. Here it runs on the
//! low-priority thread instead, so the leader's puts go first; the connection is also the
//! only one the snapshot's bytes travel on, as etcd sends snapshots over a connection of
//! their own.
//!
//! Invariants:
//! - Each send opens its own connection (lazily, from the peer's [`PeerDial`]) inside the
//!   snapshot runtime, so the channel's worker, h2's connection task and the task streaming
//!   the request body all run there; the connection closes when the send ends.
//! - Dropping the future returned by [`install_snapshot`] (openraft cancelled the send)
//!   aborts the send on the snapshot runtime.
//! - If the runtime's thread cannot be started, sends run on the caller's runtime, as they
//!   did before this existed, with one warning.

use std::future::Future;
use std::sync::OnceLock;

use futures::Stream;
use tokio::runtime::Handle;

use crate::proto::kvdpb::{RaftBlob, SnapshotChunk};
use crate::raft::net::network::{peer_client, PeerDial};
use crate::raft::sm::background;

/// The snapshot runtime, started on first use; `None` if its thread could not be started.
static RUNTIME: OnceLock<Option<Handle>> = OnceLock::new();

fn runtime() -> Option<Handle> {
    RUNTIME.get_or_init(start).clone()
}

fn start() -> Option<Handle> {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = background::spawn("kvd-snap-net", move || {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => {
                let _ = tx.send(Ok(rt.handle().clone()));
                // Serves the sends for as long as the process lives.
                rt.block_on(std::future::pending::<()>())
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    });
    let handle = match started {
        Ok(_) => rx
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the thread ended"))),
        Err(e) => Err(e),
    };
    handle
        .inspect_err(|e| {
            tracing::warn!(
                error = %e,
                "could not start the snapshot sender's thread; snapshots are sent from the \
                 server's own threads"
            )
        })
        .ok()
}

/// Sends `chunks` to the peer `dial` reaches, as `PeerClient::install_snapshot`.
pub fn install_snapshot<S>(
    dial: PeerDial,
    chunks: S,
) -> impl Future<Output = Result<tonic::Response<RaftBlob>, tonic::Status>> + Send
where
    S: Stream<Item = SnapshotChunk> + Send + 'static,
{
    let send = async move { peer_client(dial.open()).install_snapshot(chunks).await };
    async move {
        match run_on(runtime(), send).await {
            Ok(r) => r,
            Err(e) => Err(tonic::Status::internal(format!(
                "the snapshot send failed: {e}"
            ))),
        }
    }
}

/// Runs `task` on `rt`, aborting it there if this future is dropped; on the caller's runtime
/// when there is no `rt` (its thread could not be started).
async fn run_on<F>(rt: Option<Handle>, task: F) -> Result<F::Output, tokio::task::JoinError>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let Some(rt) = rt else {
        return Ok(task.await);
    };
    let mut task = AbortOnDrop(rt.spawn(task));
    (&mut task.0).await
}

/// A task on the snapshot runtime that is aborted if its waiter goes away.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    /// The runtime's thread is the one the module doc names, at the lower priority.
    #[tokio::test]
    async fn sends_run_on_a_low_priority_thread() {
        let rt = super::runtime().expect("the snapshot runtime starts");
        let (name, nice) = rt
            .spawn(async {
                let name = std::thread::current().name().map(str::to_string);
                // SAFETY: reads the calling thread's priority; changes nothing.
                let nice = unsafe {
                    let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                    libc::getpriority(libc::PRIO_PROCESS, tid)
                };
                (name, nice)
            })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("kvd-snap-net"));
        // At least 10: a process already running at a lower priority keeps its own.
        assert!(nice >= 10, "nice {nice}");
    }

    /// Without the snapshot runtime (its thread could not start) a send runs to its end on
    /// the caller's runtime; with it, on the runtime's thread.
    #[tokio::test]
    async fn without_its_thread_a_send_runs_on_the_callers_runtime() {
        let here = std::thread::current().id();
        let thread = || async { std::thread::current().id() };
        let ran_on = super::run_on(None, thread()).await.expect("the send ends");
        assert_eq!(ran_on, here);
        let ran_on = super::run_on(super::runtime(), thread())
            .await
            .expect("the send ends");
        assert_ne!(ran_on, here);
    }

    /// A send whose waiter went away (openraft cancelled it) stops on the snapshot runtime.
    #[tokio::test]
    async fn a_dropped_send_is_aborted() {
        let rt = super::runtime().expect("the snapshot runtime starts");
        let (held, gone) = tokio::sync::oneshot::channel::<()>();
        let task = super::AbortOnDrop(rt.spawn(async move {
            let _held = held;
            std::future::pending::<()>().await
        }));
        drop(task);
        let waited = tokio::time::timeout(std::time::Duration::from_secs(10), gone).await;
        assert!(matches!(waited, Ok(Err(_))), "the task still runs");
    }
}
