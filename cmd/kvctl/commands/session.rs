//! What `lock` and `elect` share with clientv3's concurrency `Session`: a lease kept alive
//! (renewed every third of its TTL) until the process ends, and the wait for SIGINT/SIGTERM.

use kvd::proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{with_deadline, Conn};
use crate::commands::Ctx;
use crate::error::CliError;

/// A lease kept alive by a background task; `done` fires when it can no longer be (the lease
/// expired or was revoked, or the keep-alive stream broke).
pub struct Session {
    pub lease: i64,
    pub done: oneshot::Receiver<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Session {
    /// Grants a lease of `ttl` seconds and starts keeping it alive.
    pub async fn open(ctx: &Ctx, conn: &Conn, ttl: i64) -> Result<Session, CliError> {
        let deadline = ctx.deadline();
        let mut leases = conn.lease();
        let lease = with_deadline(deadline, async {
            Ok(leases
                .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                .await?
                .into_inner()
                .id)
        })
        .await?;
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.send(LeaseKeepAliveRequest { id: lease }).await;
        let mut stream = leases
            .lease_keep_alive(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let (done_tx, done) = oneshot::channel();
        let task = tokio::spawn(async move {
            loop {
                let ttl = match stream.message().await {
                    Ok(Some(r)) if r.ttl > 0 => r.ttl,
                    _ => break,
                };
                let pause = std::time::Duration::from_secs((ttl / 3).max(1) as u64);
                tokio::time::sleep(pause).await;
                if tx.send(LeaseKeepAliveRequest { id: lease }).await.is_err() {
                    break;
                }
            }
            let _ = done_tx.send(());
        });
        Ok(Session { lease, done, task })
    }
}

/// Resolves on SIGINT or SIGTERM (etcdctl's lock and elect end on either).
pub async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}
