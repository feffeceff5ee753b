//! Recording clients: KV operations through any member, with timeouts, into a
//! [`Recorder`]; watch streams into [`WatchHistory`]s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvd::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::request_op::Request;
use kvd::proto::etcdserverpb::response_op::Response;
use kvd::proto::etcdserverpb::watch_client::WatchClient;
use kvd::proto::etcdserverpb::watch_request::RequestUnion;
use kvd::proto::etcdserverpb::{
    Compare as PbCompare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    WatchCreateRequest, WatchRequest,
};
use kvd::proto::mvccpb::{event::EventType, KeyValue};
use kvd_testkit::linearizability::watch::{EventKind, WatchEvent, WatchHistory};
use kvd_testkit::linearizability::{Compare, Input, Kv, Outcome, Output, Recorder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::{Channel, Endpoint};

pub const PREFIX: &str = "chaos/";
pub const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// Where clients send requests: every member slot's URL (through its client proxy in the
/// chaos run) and which slots are members right now. Membership steps update the live set;
/// a client picks among live slots for each operation.
#[derive(Clone)]
pub struct Targets {
    urls: Arc<Vec<String>>,
    live: Arc<Mutex<Vec<usize>>>,
}

impl Targets {
    pub fn new(urls: Vec<String>, live: &[usize]) -> Targets {
        Targets {
            urls: Arc::new(urls),
            live: Arc::new(Mutex::new(live.to_vec())),
        }
    }

    pub fn set_live(&self, live: &[usize]) {
        *self.live.lock().unwrap() = live.to_vec();
    }

    pub fn live(&self) -> Vec<usize> {
        self.live.lock().unwrap().clone()
    }

    pub fn url(&self, slot: usize) -> &str {
        &self.urls[slot]
    }

    pub fn slots(&self) -> usize {
        self.urls.len()
    }
}

/// A channel that connects lazily and reconnects after the member restarts.
pub fn lazy_channel(url: &str) -> Channel {
    Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy()
}

fn kv_of(kv: &KeyValue) -> Kv {
    Kv {
        value: kv.value.clone(),
        mod_revision: kv.mod_revision,
    }
}

/// Runs one operation on `client`, records it, and returns its outcome.
pub async fn run_op(
    rec: &Recorder,
    id: u64,
    client: &mut KvClient<Channel>,
    key: &str,
    input: Input,
    serializable: bool,
) -> Outcome {
    let call = rec.now();
    let k = key.as_bytes().to_vec();
    let fut = async {
        Ok::<Output, tonic::Status>(match &input {
            Input::Put { value } => {
                let r = client
                    .put(PutRequest {
                        key: k.clone(),
                        value: value.clone(),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                Output::Put {
                    revision: r.header.unwrap().revision,
                }
            }
            Input::Get => {
                let r = client
                    .range(RangeRequest {
                        key: k.clone(),
                        serializable,
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                Output::Get {
                    kv: r.kvs.first().map(kv_of),
                }
            }
            Input::Delete => {
                let r = client
                    .delete_range(DeleteRangeRequest {
                        key: k.clone(),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                Output::Delete {
                    deleted: r.deleted > 0,
                    revision: r.header.unwrap().revision,
                }
            }
            Input::Cas { compare, value } => {
                let (target, union) = match compare {
                    Compare::Value(v) => (CompareTarget::Value, TargetUnion::Value(v.clone())),
                    Compare::ModRevision(r) => (CompareTarget::Mod, TargetUnion::ModRevision(*r)),
                };
                let r = client
                    .txn(TxnRequest {
                        compare: vec![PbCompare {
                            result: CompareResult::Equal as i32,
                            target: target as i32,
                            key: k.clone(),
                            target_union: Some(union),
                            ..Default::default()
                        }],
                        success: vec![RequestOp {
                            request: Some(Request::RequestPut(PutRequest {
                                key: k.clone(),
                                value: value.clone(),
                                ..Default::default()
                            })),
                        }],
                        failure: vec![RequestOp {
                            request: Some(Request::RequestRange(RangeRequest {
                                key: k.clone(),
                                ..Default::default()
                            })),
                        }],
                    })
                    .await?
                    .into_inner();
                let current = match r.responses.first().and_then(|o| o.response.as_ref()) {
                    Some(Response::ResponseRange(rr)) => rr.kvs.first().map(kv_of),
                    _ => None,
                };
                Output::Cas {
                    succeeded: r.succeeded,
                    revision: r.header.unwrap().revision,
                    current,
                }
            }
        })
    };
    let outcome = match tokio::time::timeout(OP_TIMEOUT, fut).await {
        Ok(Ok(out)) => Outcome::Ok(out),
        // A read has no effect either way; a write that erred may still commit.
        _ if !input.is_write() => Outcome::Failed,
        _ => Outcome::Unknown,
    };
    rec.record(id, &k, input, call, outcome.clone());
    outcome
}

/// One client: random operations on `keys` through random live members until `stop`.
pub async fn client_loop(
    rec: Recorder,
    id: u64,
    seed: u64,
    targets: Targets,
    keys: usize,
    stop: Arc<AtomicBool>,
) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut clients: Vec<KvClient<Channel>> = (0..targets.slots())
        .map(|s| KvClient::new(lazy_channel(targets.url(s))))
        .collect();
    let mut last_seen: Vec<Option<Kv>> = vec![None; keys];
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let live = targets.live();
        let m = live[rng.gen_range(0..live.len())];
        let ki = rng.gen_range(0..keys);
        let key = format!("{PREFIX}{ki}");
        let value = format!("c{id}-{n}").into_bytes();
        let input = match rng.gen_range(0..100) {
            0..=34 => Input::Put { value },
            35..=69 => Input::Get,
            70..=79 => Input::Delete,
            _ => Input::Cas {
                compare: match &last_seen[ki] {
                    Some(kv) if rng.gen_bool(0.5) => Compare::ModRevision(kv.mod_revision),
                    Some(kv) => Compare::Value(kv.value.clone()),
                    None => Compare::ModRevision(0),
                },
                value,
            },
        };
        let out = run_op(&rec, id, &mut clients[m], &key, input, false).await;
        match out {
            Outcome::Ok(Output::Get { kv }) => last_seen[ki] = kv,
            Outcome::Ok(Output::Cas {
                succeeded: false,
                current,
                ..
            }) => last_seen[ki] = current,
            Outcome::Ok(_) => {}
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        n += 1;
    }
    n
}

/// Watches the whole prefix with prev_kv, from `start_revision`, until the stream ends, no
/// event arrives for `idle`, or `stop` is set; returns what it saw.
pub async fn watch_session(
    url: &str,
    name: String,
    start_revision: i64,
    idle: Duration,
    stop: Arc<AtomicBool>,
) -> WatchHistory {
    let mut h = WatchHistory {
        name,
        prefix: PREFIX.as_bytes().to_vec(),
        start_revision,
        prev_kv: true,
        events: Vec::new(),
        complete_through: start_revision - 1,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: PREFIX.into(),
            range_end: prefix_end(PREFIX),
            start_revision,
            prev_kv: true,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let Ok(Ok(resp)) = tokio::time::timeout(
        OP_TIMEOUT,
        WatchClient::new(lazy_channel(url)).watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await
    else {
        return h;
    };
    let mut stream = resp.into_inner();
    while !stop.load(Ordering::Relaxed) {
        let msg = match tokio::time::timeout(idle, stream.message()).await {
            Ok(Ok(Some(m))) => m,
            _ => break,
        };
        if msg.canceled {
            break;
        }
        for e in msg.events {
            let kv = e.kv.unwrap_or_default();
            h.complete_through = h.complete_through.max(kv.mod_revision);
            h.events.push(WatchEvent {
                key: kv.key,
                kind: if e.r#type == EventType::Delete as i32 {
                    EventKind::Delete
                } else {
                    EventKind::Put
                },
                value: kv.value,
                mod_revision: kv.mod_revision,
                prev: e.prev_kv.as_ref().map(kv_of),
            });
        }
    }
    drop(tx);
    h
}

/// A watcher that survives member faults: on a broken or idle stream it resumes from the next
/// revision on another member. Each session is its own history.
pub async fn watch_loop(
    targets: Targets,
    id: usize,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<Vec<WatchHistory>>>,
) {
    let mut next = 1;
    let mut session = 0;
    while !stop.load(Ordering::Relaxed) {
        let live = targets.live();
        let url = targets.url(live[(id + session) % live.len()]);
        let name = format!("watcher {id} session {session} on {url} from {next}");
        let h = watch_session(url, name, next, Duration::from_secs(4), stop.clone()).await;
        next = next.max(h.complete_through + 1);
        if h.events.is_empty() {
            // Member down or nothing written: do not spin.
            tokio::time::sleep(Duration::from_millis(200)).await;
        } else {
            out.lock().unwrap().push(h);
        }
        session += 1;
    }
}

pub fn prefix_end(p: &str) -> Vec<u8> {
    let mut e = p.as_bytes().to_vec();
    *e.last_mut().unwrap() += 1;
    e
}
