//! `watch`: etcdctl 3.4's watch command, plain and interactive (`-i`).
//!
//! Like clientv3, all watches of one command share one gRPC stream opened with
//! `hasleader=true`, created responses are not printed, and a progress response (watch id -1)
//! is delivered to every active watch, so it is printed once per watch.
use std::collections::{BTreeSet, VecDeque};
use std::os::unix::ffi::OsStrExt;

use clap::Parser;
use kvd::proto::etcdserverpb::watch_client::WatchClient;
use kvd::proto::etcdserverpb::watch_request::RequestUnion;
use kvd::proto::etcdserverpb::{
    WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::cli::{WatchArgs, WatchLine};
use crate::commands::{emit, Ctx};
use crate::error::{status_message, CliError, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_INVALID_INPUT};
use crate::ops::prefix_end;

/// etcdctl's `getWatchChan` options as a create request.
fn create_request(a: &WatchArgs) -> Result<WatchCreateRequest, CliError> {
    let (key, range_end) = match a.args.as_slice() {
        [k] => (k.as_bytes().to_vec(), Vec::new()),
        [_, _] if a.prefix => {
            return Err(CliError::bad_args(
                "`range_end` and `--prefix` are mutually exclusive",
            ))
        }
        [k, e] => (k.as_bytes().to_vec(), e.as_bytes().to_vec()),
        _ => return Err(CliError::bad_args("bad number of arguments")),
    };
    let (key, range_end) = match (a.prefix, key.is_empty()) {
        // clientv3's WithPrefix on "" watches every key.
        (true, true) => (vec![0], vec![0]),
        (true, false) => {
            let end = prefix_end(&key);
            (key, end)
        }
        (false, _) => (key, range_end),
    };
    Ok(WatchCreateRequest {
        key,
        range_end,
        start_revision: a.rev,
        prev_kv: a.prev_kv,
        progress_notify: a.progress_notify,
        ..Default::default()
    })
}

fn request(r: RequestUnion) -> WatchRequest {
    WatchRequest {
        request_union: Some(r),
    }
}

/// clientv3's `WatchResponse.Err()` text for a canceled response.
fn cancel_error(r: &WatchResponse) -> String {
    if r.compact_revision != 0 {
        "etcdserver: mvcc: required revision has been compacted".into()
    } else if !r.cancel_reason.is_empty() {
        status_message(&tonic::Status::failed_precondition(r.cancel_reason.clone()))
    } else {
        "etcdserver: mvcc: required revision is a future revision".into()
    }
}

/// The shared stream and the watches on it.
struct Session {
    tx: mpsc::Sender<WatchRequest>,
    rx: Streaming<WatchResponse>,
    /// Create requests sent and not yet answered, in order (the server answers in order).
    pending: VecDeque<()>,
    active: BTreeSet<i64>,
}

impl Session {
    /// Opens the stream with `first` as its first request: grpc-go servers send the response
    /// headers only with the first response, so the call would not return before a request.
    async fn open(ctx: &Ctx, first: RequestUnion) -> Result<Session, CliError> {
        let conn = ctx.connect(ctx.deadline()).await?;
        let (tx, rx) = mpsc::channel(16);
        let mut pending = VecDeque::new();
        if matches!(first, RequestUnion::CreateRequest(_)) {
            pending.push_back(());
        }
        tx.try_send(request(first))
            .map_err(|_| CliError::new(EXIT_ERROR, "watch stream closed"))?;
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        req.metadata_mut().insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
        let rx = WatchClient::new(conn.channel)
            .max_decoding_message_size(i32::MAX as usize)
            .watch(req)
            .await?
            .into_inner();
        Ok(Session {
            tx,
            rx,
            pending,
            active: BTreeSet::new(),
        })
    }

    async fn send(&mut self, r: RequestUnion) -> Result<(), CliError> {
        if matches!(r, RequestUnion::CreateRequest(_)) {
            self.pending.push_back(());
        }
        self.tx
            .send(request(r))
            .await
            .map_err(|_| CliError::new(EXIT_ERROR, "watch stream closed"))
    }

    /// Prints one response like etcdctl's `printWatchCh` does for each watch it reaches.
    fn print(&mut self, ctx: &Ctx, r: WatchResponse) {
        if r.created {
            self.pending.pop_front();
            if r.canceled && !r.cancel_reason.is_empty() {
                // clientv3's addSubstream: a watch refused at creation closes with the
                // server's reason as it is (a full gRPC status text for permission denied).
                eprintln!("watch was canceled ({})", r.cancel_reason);
            } else if r.canceled {
                eprintln!("watch was canceled ({})", cancel_error(&r));
            } else {
                self.active.insert(r.watch_id);
            }
            return;
        }
        let is_progress = r.events.is_empty()
            && !r.canceled
            && r.compact_revision == 0
            && r.header.as_ref().is_some_and(|h| h.revision != 0);
        let copies = if r.watch_id == -1 {
            self.active.len()
        } else if self.active.contains(&r.watch_id) {
            1
        } else {
            0
        };
        for _ in 0..copies {
            if r.canceled {
                eprintln!("watch was canceled ({})", cancel_error(&r));
            }
            if is_progress {
                println!(
                    "progress notify: {}",
                    r.header.as_ref().map_or(0, |h| h.revision)
                );
            }
            emit(&ctx.printer.watch(&r));
        }
        if r.canceled {
            self.active.remove(&r.watch_id);
        }
    }

    fn done(&self) -> bool {
        self.active.is_empty() && self.pending.is_empty()
    }
}

pub async fn watch(ctx: &Ctx, a: WatchArgs) -> Result<i32, CliError> {
    ctx.printer.check_watch()?;
    if a.interactive {
        return interactive(ctx, a).await;
    }
    let create = create_request(&a)?;
    let mut s = Session::open(ctx, RequestUnion::CreateRequest(create)).await?;
    loop {
        match s.rx.message().await {
            Ok(Some(r)) => {
                s.print(ctx, r);
                if s.done() {
                    break;
                }
            }
            Ok(None) => break,
            Err(st) => {
                eprintln!("watch was canceled ({})", status_message(&st));
                break;
            }
        }
    }
    Err(CliError::new(
        EXIT_INTERRUPTED,
        "watch is canceled by the server",
    ))
}

/// etcdctl's `argify`, without quoting: the words of a line.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

async fn interactive(ctx: &Ctx, base: WatchArgs) -> Result<i32, CliError> {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut session: Option<Session> = None;
    loop {
        let msg = async {
            match session.as_mut() {
                Some(s) => s.rx.message().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            line = lines.next_line() => {
                let line = match line {
                    Ok(Some(l)) => l,
                    Ok(None) => {
                        return Err(CliError::new(
                            EXIT_INVALID_INPUT,
                            "Error reading watch request line: EOF",
                        ))
                    }
                    Err(e) => {
                        return Err(CliError::new(
                            EXIT_INVALID_INPUT,
                            format!("Error reading watch request line: {e}"),
                        ))
                    }
                };
                let args = words(&line);
                let Some(cmd) = args.first() else {
                    eprintln!("Invalid command: {line} (watch and progress supported)");
                    continue;
                };
                let req = match cmd.as_str() {
                    "watch" if args.len() < 2 => {
                        eprintln!("Invalid command {line} (command type or key is not provided)");
                        continue;
                    }
                    "watch" => {
                        let parsed = WatchLine::try_parse_from(&args[1..])
                            .map_err(|e| CliError::bad_args(e.kind().to_string()))?;
                        let mut a = parsed.args;
                        // Flags given on the command line apply to every watch.
                        a.prefix |= base.prefix;
                        a.prev_kv |= base.prev_kv;
                        a.progress_notify |= base.progress_notify;
                        if a.rev == 0 {
                            a.rev = base.rev;
                        }
                        match create_request(&a) {
                            Ok(c) => RequestUnion::CreateRequest(c),
                            Err(e) => {
                                eprintln!("Invalid command {line} ({})", e.msg);
                                continue;
                            }
                        }
                    }
                    "progress" => RequestUnion::ProgressRequest(WatchProgressRequest {}),
                    _ => {
                        eprintln!("Invalid command {line} (only support watch)");
                        continue;
                    }
                };
                match session.as_mut() {
                    Some(s) => s.send(req).await?,
                    None => session = Some(Session::open(ctx, req).await?),
                }
            }
            m = msg => match m {
                Ok(Some(r)) => {
                    if let Some(s) = session.as_mut() {
                        s.print(ctx, r);
                    }
                }
                Ok(None) => session = None,
                Err(st) => {
                    if let Some(s) = &session {
                        for _ in &s.active {
                            eprintln!("watch was canceled ({})", status_message(&st));
                        }
                    }
                    session = None;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> WatchArgs {
        WatchLine::try_parse_from(a).unwrap().args
    }

    #[test]
    fn create_requests_follow_clientv3_options() {
        let c = create_request(&args(&["--prefix", "--rev=3", "--prev-kv", "ab"])).unwrap();
        assert_eq!((c.key, c.range_end), (b"ab".to_vec(), b"ac".to_vec()));
        assert_eq!((c.start_revision, c.prev_kv), (3, true));
        let c = create_request(&args(&["--prefix", ""])).unwrap();
        assert_eq!((c.key, c.range_end), (vec![0], vec![0]));
        let c = create_request(&args(&["a", "b"])).unwrap();
        assert_eq!((c.key, c.range_end), (b"a".to_vec(), b"b".to_vec()));
        assert!(create_request(&args(&["--prefix", "a", "b"]))
            .unwrap_err()
            .msg
            .contains("mutually exclusive"));
        assert!(create_request(&args(&[])).is_err());
    }
}
