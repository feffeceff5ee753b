//! `make-mirror`: etcdctl's live copy of a key range into another cluster, the way to move a
//! running etcd's keys into kvd (or back) with a short cut-over.
//!
//! As etcdctl 3.4-3.6 (`make_mirror_command.go`, `clientv3/mirror`):
//! - the keys under `--prefix` are read at one revision R (pages of 1,000, each served at R)
//!   and written to the destination; then every change after R comes from a watch that starts
//!   at R+1, and the events of one source revision are applied in one destination txn (split
//!   only past `--max-txn-ops`), so the destination never shows part of a source txn smaller
//!   than that. `--rev N` skips the copy and watches from N;
//! - keys are rewritten from `--prefix` to `--dest-prefix` (default: the same prefix;
//!   `--no-dest-prefix`: none). Leases are not copied: keys are put without one;
//! - the number of keys and events copied so far is printed every 30 seconds; the command runs
//!   until it is interrupted or fails, and a compacted source revision ends it with etcd's
//!   error.
//!
//! Differences, on purpose:
//! - the first copy is written in txns of up to `--max-txn-ops` puts and 1 MiB, not one put
//!   per key: the destination ends in the same state (the copy is of one revision, there is no
//!   intermediate state to keep), in a fraction of the round trips and fsyncs;
//! - the watch asks for a leader (`hasleader`), and when its stream fails or is cancelled for
//!   want of one, it is reopened on the next source endpoint from the revision after the last
//!   one applied (clientv3 reconnects a watch the same way), so a source member that stops does
//!   not end the mirror. A destination that fails ends it, as in etcdctl.
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvd::proto::etcdserverpb::request_op::Request;
use kvd::proto::etcdserverpb::watch_client::WatchClient;
use kvd::proto::etcdserverpb::watch_request::RequestUnion;
use kvd::proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest,
    WatchRequest,
};
use kvd::proto::mvccpb::event::EventType;
use kvd::proto::mvccpb::Event;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::cli::MakeMirrorArgs;
use crate::client::{Conn, Dial};
use crate::commands::Ctx;
use crate::error::{status_message, CliError, EXIT_ERROR};
use crate::ops::prefix_end;
use crate::tls::TlsSettings;

/// Keys per page of the first copy (clientv3/mirror's `batchLimit`).
const PAGE: i64 = 1000;
/// Bytes of keys and values per destination txn of the first copy, well under etcd's default
/// `--max-request-bytes` (1.5 MiB).
const TXN_BYTES: usize = 1 << 20;
/// How often the count is printed (etcdctl's period).
const REPORT: Duration = Duration::from_secs(30);
/// Pause before reopening a failed source watch.
const RETRY: Duration = Duration::from_millis(500);

const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

/// Where keys go: `--prefix` replaced by the destination prefix.
struct Rewrite {
    from: Vec<u8>,
    to: Vec<u8>,
}

impl Rewrite {
    fn key(&self, key: &[u8]) -> Vec<u8> {
        let rest = key.strip_prefix(self.from.as_slice()).unwrap_or(key);
        [self.to.as_slice(), rest].concat()
    }
}

pub async fn make_mirror(ctx: &Ctx, a: MakeMirrorArgs) -> Result<i32, CliError> {
    if a.destination.len() != 1 {
        return Err(CliError::bad_args(
            "make-mirror takes one destination argument",
        ));
    }
    if a.no_dest_prefix && !a.dest_prefix.is_empty() {
        return Err(CliError::bad_args(
            "`--dest-prefix` and `--no-dest-prefix` cannot be set at the same time, choose one",
        ));
    }
    let to = match (a.no_dest_prefix, a.dest_prefix.is_empty()) {
        (true, _) => String::new(),
        (false, true) => a.prefix.clone(),
        (false, false) => a.dest_prefix.clone(),
    };
    let rewrite = Rewrite {
        from: a.prefix.as_bytes().to_vec(),
        to: to.into_bytes(),
    };
    let max_ops = a.max_txn_ops.max(1) as usize;
    let dest_dial = Dial {
        dial_timeout: ctx.global.dial_timeout,
        tls: TlsSettings::from_files(
            &a.dest_cert,
            &a.dest_key,
            &a.dest_cacert,
            a.dest_insecure_transport,
            false,
        )?,
        auth: crate::password::credentials(&a.dest_user, &a.dest_password)?
            .filter(|(u, p)| !u.is_empty() && !p.is_empty()),
    };
    let dest = Conn::connect(&a.destination, &dest_dial, ctx.deadline()).await?;
    let src = ctx.connect(ctx.deadline()).await?;

    let total = Arc::new(AtomicI64::new(0));
    let report = {
        let total = total.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REPORT).await;
                println!("{}", total.load(Ordering::Relaxed));
            }
        })
    };
    let (key, range_end) = if a.prefix.is_empty() {
        // Every key: from the smallest one to the end.
        (vec![0], vec![0])
    } else {
        let k = a.prefix.as_bytes().to_vec();
        let end = prefix_end(&k);
        (k, end)
    };
    let mut m = Mirror {
        dest,
        rewrite,
        max_ops,
        total,
    };
    let result = async {
        let start = (a.rev - 1).max(0);
        let rev = if start == 0 {
            m.copy(&src, &key, &range_end).await?
        } else {
            start
        };
        m.follow(ctx, src, &key, &range_end, rev + 1).await
    }
    .await;
    report.abort();
    result
}

struct Mirror {
    dest: Conn,
    rewrite: Rewrite,
    max_ops: usize,
    total: Arc<AtomicI64>,
}

impl Mirror {
    /// Copies the range as of the source's current revision; returns that revision.
    async fn copy(&mut self, src: &Conn, key: &[u8], range_end: &[u8]) -> Result<i64, CliError> {
        let mut kv = src.kv();
        // The revision to copy at (clientv3/mirror asks for an arbitrary key to learn it).
        let rev = kv
            .range(RangeRequest {
                key: b"foo".to_vec(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .header
            .map_or(0, |h| h.revision);
        let mut from = key.to_vec();
        loop {
            let page = kv
                .range(RangeRequest {
                    key: from.clone(),
                    range_end: range_end.to_vec(),
                    limit: PAGE,
                    revision: rev,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let mut ops = Vec::new();
            let mut bytes = 0;
            for item in &page.kvs {
                let size = item.key.len() + item.value.len();
                // A key too large to share a txn goes alone (the source took it in one put).
                if ops.len() == self.max_ops || (!ops.is_empty() && bytes + size > TXN_BYTES) {
                    self.apply(std::mem::take(&mut ops)).await?;
                    bytes = 0;
                }
                bytes += size;
                ops.push(self.put(&item.key, &item.value));
            }
            self.apply(ops).await?;
            match page.kvs.last() {
                Some(last) if page.more => from = [last.key.as_slice(), &[0]].concat(),
                _ => return Ok(rev),
            }
        }
    }

    /// Applies every change from revision `next` on, until an error that reopening the watch
    /// cannot cure.
    async fn follow(
        &mut self,
        ctx: &Ctx,
        mut src: Conn,
        key: &[u8],
        range_end: &[u8],
        mut next: i64,
    ) -> Result<i32, CliError> {
        let mut endpoints = ctx.global.endpoints.clone();
        loop {
            match self.watch(&src, key, range_end, &mut next).await {
                Err(Stop::Fatal(e)) => return Err(e),
                Err(Stop::Retry) | Ok(()) => {}
            }
            // The next attempt starts with the next endpoint.
            endpoints.rotate_left(1);
            loop {
                tokio::time::sleep(RETRY).await;
                let dial = ctx.dial()?;
                if let Ok(c) = Conn::connect(&endpoints, dial, ctx.deadline()).await {
                    src = c;
                    break;
                }
            }
        }
    }

    /// One watch stream from `next`: applies its events and advances `next` past each
    /// revision applied.
    async fn watch(
        &mut self,
        src: &Conn,
        key: &[u8],
        range_end: &[u8],
        next: &mut i64,
    ) -> Result<(), Stop> {
        let (tx, rx) = mpsc::channel(1);
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: key.to_vec(),
                range_end: range_end.to_vec(),
                start_revision: *next,
                ..Default::default()
            })),
        };
        tx.try_send(create).map_err(|_| Stop::Retry)?;
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        req.metadata_mut().insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
        let mut stream = WatchClient::new(src.channel.clone())
            .max_decoding_message_size(i32::MAX as usize)
            .watch(req)
            .await
            .map_err(|_| Stop::Retry)?
            .into_inner();
        // Kept open: dropping the sender would end the stream.
        let _tx = tx;
        while let Some(resp) = stream.message().await.map_err(|_| Stop::Retry)? {
            if resp.compact_revision != 0 {
                return Err(Stop::Fatal(CliError::new(EXIT_ERROR, COMPACTED)));
            }
            if resp.canceled {
                // No leader on that member, or it is shutting down: another may serve.
                return Err(Stop::Retry);
            }
            for group in by_revision(&resp.events) {
                let rev = group[0].kv.as_ref().map_or(0, |kv| kv.mod_revision);
                let ops: Vec<RequestOp> = group.iter().filter_map(|e| self.op(e)).collect();
                for chunk in ops.chunks(self.max_ops) {
                    self.apply(chunk.to_vec()).await.map_err(Stop::Fatal)?;
                }
                *next = rev + 1;
            }
        }
        Ok(())
    }

    fn put(&self, key: &[u8], value: &[u8]) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: self.rewrite.key(key),
                value: value.to_vec(),
                ..Default::default()
            })),
        }
    }

    fn op(&self, e: &Event) -> Option<RequestOp> {
        let kv = e.kv.as_ref()?;
        Some(match EventType::try_from(e.r#type).ok()? {
            EventType::Put => self.put(&kv.key, &kv.value),
            EventType::Delete => RequestOp {
                request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                    key: self.rewrite.key(&kv.key),
                    ..Default::default()
                })),
            },
        })
    }

    /// Writes `ops` in one destination txn and counts them.
    async fn apply(&mut self, ops: Vec<RequestOp>) -> Result<(), CliError> {
        if ops.is_empty() {
            return Ok(());
        }
        let n = ops.len() as i64;
        self.dest
            .kv()
            .txn(TxnRequest {
                success: ops,
                ..Default::default()
            })
            .await
            .map_err(|s| CliError::new(EXIT_ERROR, status_message(&s)))?;
        self.total.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

/// Why a watch stream ended.
enum Stop {
    /// The source failed or gave up on this stream: reopen it.
    Retry,
    /// Reopening cannot help (compaction, a destination error).
    Fatal(CliError),
}

/// `events` split into runs of one revision each, in order.
fn by_revision(events: &[Event]) -> impl Iterator<Item = &[Event]> {
    events.chunk_by(|a, b| {
        a.kv.as_ref().map(|k| k.mod_revision) == b.kv.as_ref().map(|k| k.mod_revision)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_move_from_the_prefix_to_the_destination_prefix() {
        let r = Rewrite {
            from: b"/registry/".to_vec(),
            to: b"/old/".to_vec(),
        };
        assert_eq!(r.key(b"/registry/pods/a"), b"/old/pods/a");
        let none = Rewrite {
            from: Vec::new(),
            to: b"/copy".to_vec(),
        };
        assert_eq!(none.key(b"k"), b"/copyk");
        let strip = Rewrite {
            from: b"/a/".to_vec(),
            to: Vec::new(),
        };
        assert_eq!(strip.key(b"/a/b"), b"b");
    }

    #[test]
    fn events_are_grouped_by_revision() {
        let ev = |rev| Event {
            kv: Some(kvd::proto::mvccpb::KeyValue {
                mod_revision: rev,
                ..Default::default()
            }),
            ..Default::default()
        };
        let events = [ev(5), ev(5), ev(6), ev(8), ev(8), ev(8)];
        let sizes: Vec<usize> = by_revision(&events).map(<[Event]>::len).collect();
        assert_eq!(sizes, [2, 1, 3]);
    }
}
