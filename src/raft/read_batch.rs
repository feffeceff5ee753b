//! Coalescing of linearizable-read barriers, like etcd's `linearizableReadLoop`: concurrent
//! readers share one read-index round instead of one leader round trip each.
//!
//! Invariant: a reader is answered only by a round that *started after it joined the queue*
//! (a round takes the queue first, then asks for the read index), so the index it gets was
//! confirmed by a quorum after the read arrived, which is what linearizability needs.

use std::future::Future;
use std::sync::{Arc, Mutex};

use crate::sync::LockExt;

use tokio::sync::oneshot;

type Waiter<T, E> = oneshot::Sender<Result<T, E>>;

struct Queue<T, E> {
    waiters: Vec<Waiter<T, E>>,
    /// A round task is running (it drains the queue until it finds it empty).
    running: bool,
}

/// Runs `fetch` once per round for every caller of [`Coalescer::get`] queued before the round.
pub struct Coalescer<T, E> {
    queue: Arc<Mutex<Queue<T, E>>>,
}

impl<T, E> Default for Coalescer<T, E> {
    fn default() -> Self {
        Coalescer {
            queue: Arc::new(Mutex::new(Queue {
                waiters: Vec::new(),
                running: false,
            })),
        }
    }
}

impl<T, E> Clone for Coalescer<T, E> {
    fn clone(&self) -> Self {
        Coalescer {
            queue: self.queue.clone(),
        }
    }
}

impl<T, E> Coalescer<T, E>
where
    T: Clone + Send + 'static,
    E: Clone + Send + 'static,
{
    /// Joins the next round and returns its result. `fetch` is used only if this call has
    /// to start the round task; `gone` is returned if the task died (runtime shutdown).
    pub async fn get<F, Fut>(&self, fetch: F, gone: E) -> Result<T, E>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.queue.lock_or_recover();
            q.waiters.push(tx);
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            let queue = self.queue.clone();
            tokio::spawn(async move {
                loop {
                    let batch = {
                        let mut q = queue.lock_or_recover();
                        if q.waiters.is_empty() {
                            q.running = false;
                            return;
                        }
                        std::mem::take(&mut q.waiters)
                    };
                    let res = fetch().await;
                    for w in batch {
                        let _ = w.send(res.clone());
                    }
                }
            });
        }
        rx.await.unwrap_or(Err(gone))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// Many concurrent readers cost a few rounds, and nobody gets a round that started
    /// before it joined.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_share_rounds_that_start_after_they_join() {
        let c: Coalescer<u64, ()> = Coalescer::default();
        let rounds = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let c = c.clone();
            let rounds = rounds.clone();
            tasks.push(tokio::spawn(async move {
                let joined_after = rounds.load(Ordering::SeqCst);
                let got = c
                    .get(
                        move || {
                            let rounds = rounds.clone();
                            async move {
                                let n = rounds.fetch_add(1, Ordering::SeqCst) + 1;
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                Ok(n)
                            }
                        },
                        (),
                    )
                    .await
                    .unwrap();
                assert!(got > joined_after, "round {got} started before join");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let n = rounds.load(Ordering::SeqCst);
        assert!(n < 100, "{n} rounds for 200 readers: not coalesced");
    }

    #[tokio::test]
    async fn errors_reach_every_waiter_of_the_round() {
        let c: Coalescer<u64, &'static str> = Coalescer::default();
        let r = c.get(|| async { Err("no leader") }, "gone").await;
        assert_eq!(r, Err("no leader"));
        // The queue is usable again after a failed round.
        assert_eq!(c.get(|| async { Ok(7) }, "gone").await, Ok(7));
    }
}
