//! `kvbench watch-latency`, after etcd's `benchmark watch-latency`: `--watchers` watchers over
//! `--streams` watch streams over `--conns` connections, then `--put-total` puts; reports the
//! put summary and the delay from each put's response to each watcher receiving its event.
//!
//! Watcher `w` watches key `w % key-space-size` and put `i` writes key `i % key-space-size`,
//! so every put is seen by the same number of watchers (with the default key space of 1, all
//! watchers watch the one key, as in etcd's tool).
//!
//! Extras for the many-watchers test: `--stalled-watchers K` opens K more streams, on their
//! own connection, each watching every benchmark key, whose responses are never read (the
//! server's sends block once the HTTP/2 windows fill); `--baseline` runs the same puts again
//! after every watch stream is closed, so one run reports throughput with and without
//! watchers; `--rss-pid` samples a local member's resident memory just before and after the
//! watches open (first, so that freed put buffers do not hide the watches' memory) and at
//! the end.
//!
//! Invariants:
//! - A put's latency is measured from just before the call to its response; an event's
//!   latency from that response to the event's arrival (0 if the event came first).
//! - Every live watcher must receive exactly the events of the puts on its key: the
//!   summary reports events expected and received, and missing or extra events fail the run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget};
use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::watch_client::WatchClient;
use kvd::proto::etcdserverpb::watch_request::RequestUnion;
use kvd::proto::etcdserverpb::{PutRequest, WatchCreateRequest, WatchRequest, WatchResponse};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use crate::keys::KeyGen;
use crate::report::Summary;
use crate::runner::{new_histogram, note_error, RunResult};
use crate::{conns, Global, KeyArgs};

#[derive(clap::Args, Debug, Clone)]
pub struct WatchArgs {
    #[command(flatten)]
    pub keys: KeyArgs,
    /// Live watchers (each one a watch on one key).
    #[arg(long, default_value_t = 100)]
    pub watchers: usize,
    /// Watch streams the watchers are spread over (round robin).
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Number of puts.
    #[arg(long, default_value_t = 1000)]
    pub put_total: u64,
    /// Puts per second (0 = as fast as --clients allow).
    #[arg(long, default_value_t = 100.0)]
    pub put_rate: f64,
    /// Connections the put clients share.
    #[arg(long, default_value_t = 1)]
    pub put_conns: usize,
    /// Extra watch streams whose client never reads, each watching every benchmark key.
    #[arg(long, default_value_t = 0)]
    pub stalled_watchers: usize,
    /// Run the same puts again once every watch stream is closed, and report both.
    #[arg(long)]
    pub baseline: bool,
    /// pid of the (local) member watched: report its RSS before/after opening the watches.
    #[arg(long)]
    pub rss_pid: Option<u32>,
    /// Seconds to wait for the last events after the last put.
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout: f64,
}

fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kb = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .context("no VmRSS line")?;
    Ok(kb * 1024)
}

/// Puts made in one phase: latency histogram plus, per put, its revision and completion time.
struct Puts {
    result: RunResult,
    done: HashMap<i64, (Instant, u64)>,
}

async fn run_puts(g: &Global, a: &WatchArgs, keys: &KeyGen, label: &str) -> anyhow::Result<Puts> {
    let mut pg = g.clone();
    pg.conns = a.put_conns;
    let channels = conns::connect(&pg).await?;
    let value = crate::ops::random_value(a.keys.val_size);
    let next = Arc::new(AtomicU64::new(0));
    let pb = if g.json {
        ProgressBar::hidden()
    } else {
        let pb = ProgressBar::with_draw_target(Some(a.put_total), ProgressDrawTarget::stderr());
        pb.set_message(label.to_string());
        pb
    };
    let timeout = Duration::from_secs_f64(g.timeout);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..g.clients {
        let mut client = KvClient::new(channels[c % channels.len()].clone());
        let (next, pb, keys, value) = (next.clone(), pb.clone(), keys.clone(), value.clone());
        let (total, rate) = (a.put_total, a.put_rate);
        tasks.push(tokio::spawn(async move {
            let mut hist = new_histogram();
            let (mut errors, mut samples, mut done) = (0u64, Vec::new(), Vec::new());
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                if rate > 0.0 {
                    let due = start + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                let req = PutRequest {
                    key: keys.key(i),
                    value: value.clone(),
                    ..Default::default()
                };
                let t0 = Instant::now();
                match tokio::time::timeout(timeout, client.put(req)).await {
                    Ok(Ok(r)) => {
                        let t1 = Instant::now();
                        hist.saturating_record((t1 - t0).as_micros().max(1) as u64);
                        let rev = r.into_inner().header.map_or(0, |h| h.revision);
                        done.push((rev, (t1, i % keys.space())));
                    }
                    Ok(Err(s)) => {
                        note_error(&mut errors, &mut samples, || {
                            format!("{:?}: {}", s.code(), s.message())
                        });
                    }
                    Err(_) => {
                        note_error(&mut errors, &mut samples, || {
                            format!("timed out after {timeout:?}")
                        });
                    }
                }
                pb.inc(1);
            }
            (hist, errors, samples, done)
        }));
    }
    let mut hist = new_histogram();
    let (mut errors, mut error_samples, mut done) = (0, Vec::new(), HashMap::new());
    for t in tasks {
        let (h, e, s, d) = t.await?;
        hist.add(&h)?;
        errors += e;
        error_samples.extend(s.into_iter().take(5 - error_samples.len().min(5)));
        done.extend(d);
    }
    let elapsed = start.elapsed();
    pb.finish_and_clear();
    Ok(Puts {
        result: RunResult {
            hist,
            errors,
            error_samples,
            elapsed,
        },
        done,
    })
}

/// When each event arrived, by revision.
type Arrivals = Arc<Mutex<Vec<(i64, Instant)>>>;

/// One watch stream the benchmark reads: the arrival of every event, by revision.
struct LiveStream {
    arrivals: Arrivals,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Keeps the request side open.
    _tx: mpsc::Sender<WatchRequest>,
}

/// Opens a stream and creates `creates` on it, returning once every create is confirmed.
async fn open_stream(
    ch: Channel,
    creates: Vec<WatchCreateRequest>,
) -> anyhow::Result<(mpsc::Sender<WatchRequest>, Streaming<WatchResponse>)> {
    let n = creates.len();
    let (tx, rx) = mpsc::channel(n.max(1));
    for c in creates {
        tx.send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(c)),
        })
        .await?;
    }
    let mut inbound = WatchClient::new(ch)
        .max_decoding_message_size(usize::MAX)
        .watch(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut created = 0;
    while created < n {
        let r = inbound.message().await?.context("watch stream ended")?;
        anyhow::ensure!(!r.canceled, "watch canceled: {}", r.cancel_reason);
        if r.created {
            created += 1;
        }
    }
    Ok((tx, inbound))
}

fn spawn_reader(
    mut inbound: Streaming<WatchResponse>,
    received: Arc<AtomicU64>,
) -> (Arrivals, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let a = arrivals.clone();
    let task = tokio::spawn(async move {
        while let Some(r) = inbound.message().await? {
            anyhow::ensure!(!r.canceled, "watch canceled: {}", r.cancel_reason);
            let now = Instant::now();
            let mut a = a.lock().expect("arrivals lock");
            for e in &r.events {
                a.push((e.kv.as_ref().map_or(0, |kv| kv.mod_revision), now));
            }
            received.fetch_add(r.events.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    });
    (arrivals, task)
}

pub async fn run(g: Global, a: WatchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.streams > 0, "--streams must be positive");
    anyhow::ensure!(a.put_conns > 0, "--put-conns must be positive");
    let mut ka = a.keys.clone();
    ka.sequential_keys = true;
    let keys = KeyGen::new(&ka)?;

    let rss_before = a.rss_pid.map(rss_bytes).transpose()?;
    let channels = conns::connect(&g).await?;
    let received = Arc::new(AtomicU64::new(0));
    let opened = Instant::now();
    let mut streams = Vec::new();
    let mut opening = Vec::new();
    for s in 0..a.streams {
        let creates: Vec<WatchCreateRequest> = (s..a.watchers)
            .step_by(a.streams)
            .map(|w| WatchCreateRequest {
                key: keys.key(w as u64),
                ..Default::default()
            })
            .collect();
        let ch = channels[s % channels.len()].clone();
        opening.push(tokio::spawn(open_stream(ch, creates)));
    }
    for o in opening {
        let (tx, inbound) = o.await??;
        let (arrivals, task) = spawn_reader(inbound, received.clone());
        streams.push(LiveStream {
            arrivals,
            task,
            _tx: tx,
        });
    }
    // The stalled streams: created, then never read again.
    let mut stalled = Vec::new();
    if a.stalled_watchers > 0 {
        let mut sg = g.clone();
        sg.conns = 1;
        let ch = conns::connect(&sg).await?.remove(0);
        let first = keys.key(0);
        for _ in 0..a.stalled_watchers {
            let all = WatchCreateRequest {
                key: first.clone(),
                range_end: vec![0], // from the first benchmark key on
                ..Default::default()
            };
            stalled.push(open_stream(ch.clone(), vec![all]).await?);
        }
    }
    let open_secs = opened.elapsed().as_secs_f64();
    // Let allocations settle before sampling memory.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = a.rss_pid.map(rss_bytes).transpose()?;

    let puts = run_puts(&g, &a, &keys, "puts").await?;

    // Watchers per key, to know how many events to wait for.
    let space = keys.space();
    let per_key = |k: u64| {
        let n = a.watchers as u64;
        n / space + u64::from(k < n % space)
    };
    let expected: u64 = puts.done.values().map(|(_, k)| per_key(*k)).sum();
    let deadline = Instant::now() + Duration::from_secs_f64(a.drain_timeout);
    while received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A little longer so duplicates, if any, show up in the count.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got = received.load(Ordering::Relaxed);

    let mut hist: Histogram<u64> = new_histogram();
    let mut unknown = 0u64;
    for s in &streams {
        if s.task.is_finished() {
            anyhow::bail!("a watch stream ended early");
        }
        for (rev, at) in s.arrivals.lock().expect("arrivals lock").iter() {
            match puts.done.get(rev) {
                Some((done, _)) => {
                    hist.saturating_record(at.saturating_duration_since(*done).as_micros() as u64)
                }
                None => unknown += 1,
            }
        }
    }
    for s in &streams {
        s.task.abort();
    }
    drop(streams);
    drop(stalled);
    let baseline = if a.baseline {
        // Give the member a moment to tear the streams down.
        tokio::time::sleep(Duration::from_secs(1)).await;
        Some(run_puts(&g, &a, &keys, "puts without watchers").await?)
    } else {
        None
    };
    let rss_end = a.rss_pid.map(rss_bytes).transpose()?;

    let watch = Summary {
        op: format!("watch events ({} watchers)", a.watchers),
        clients: a.watchers,
        conns: g.conns,
        ok: hist.len(),
        errors: expected.saturating_sub(got),
        error_samples: Vec::new(),
        seconds: puts.result.elapsed.as_secs_f64(),
        hist: hist.clone(),
    };
    let put = Summary::new(
        format!(
            "put ({} watchers, {} stalled)",
            a.watchers, a.stalled_watchers
        ),
        &g,
        &puts.result,
    );
    let base = baseline
        .as_ref()
        .map(|b| Summary::new("put (no watchers)".into(), &g, &b.result));
    let ratio = base.as_ref().map(|b| put.qps() / b.qps().max(1e-9));
    let rss_delta = rss_before.zip(rss_after).map(|(b, a)| a as i64 - b as i64);
    let total_watches = (a.watchers + a.stalled_watchers).max(1) as f64;
    let per_watch = rss_delta.map(|d| d as f64 / total_watches);

    if g.json {
        let v = json!({
            "watchers": a.watchers,
            "streams": a.streams,
            "stalled_watchers": a.stalled_watchers,
            "watch_open_seconds": open_secs,
            "events_expected": expected,
            "events_received": got,
            "events_unknown_revision": unknown,
            "put": put.to_json(),
            "baseline_put": base.as_ref().map(Summary::to_json),
            "put_qps_ratio": ratio,
            "watch": watch.to_json(),
            "rss_before_bytes": rss_before,
            "rss_after_bytes": rss_after,
            "rss_bytes_per_watch": per_watch,
            "rss_end_bytes": rss_end,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        if let Some(b) = &base {
            print!("{}", b.to_text());
        }
        print!("{}", put.to_text());
        if let Some(r) = ratio {
            println!("\nPut throughput with watchers / without: {r:.3}");
        }
        print!("{}", watch.to_text());
        println!(
            "\nWatchers: {} on {} streams (+{} stalled), opened in {open_secs:.2} s",
            a.watchers, a.streams, a.stalled_watchers
        );
        println!("Events: {got} received, {expected} expected");
        if let (Some(b), Some(a2), Some(p)) = (rss_before, rss_after, per_watch) {
            println!(
                "Member RSS: {:.1} MiB before, {:.1} MiB after opening the watches ({p:.0} bytes per watch)",
                b as f64 / 1048576.0,
                a2 as f64 / 1048576.0
            );
        }
    }
    anyhow::ensure!(
        got == expected && unknown == 0,
        "watchers received {got} events ({unknown} for unknown revisions), expected {expected}"
    );
    Ok(())
}
