//! `check perf`: etcdctl 3.4's write-performance check, with its workloads, pass criteria,
//! output and exit codes.
//!
//! A workload is `clients` connections putting random 256-byte keys (under `--prefix`) with
//! 1 KiB values, paced to `limit` puts per second for 60 s. It passes when the throughput of
//! successful puts is above 90% of the limit, the slowest put took at most 0.5 s, the
//! standard deviation of put latency is at most 0.1 s, and no put failed. The keys are deleted
//! afterwards (the check refuses to start when the prefix already has keys, so it never
//! deletes anything it did not write).
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kvd::proto::etcdserverpb::{
    CompactionRequest, DefragmentRequest, DeleteRangeRequest, PutRequest, RangeRequest,
};
use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;

use crate::cli::CheckPerfArgs;
use crate::client::{with_deadline, Conn};
use crate::commands::Ctx;
use crate::error::{status_message, CliError, EXIT_BAD_FEATURE, EXIT_ERROR, EXIT_INVALID_INPUT};
use crate::gofmt::quote;
use crate::ops::prefix_end;
use crate::progress;

/// One of etcdctl's workloads (`checkPerfCfgMap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Puts per second.
    pub limit: u32,
    /// Concurrent clients, each with its own connection.
    pub clients: usize,
    pub duration: Duration,
}

/// The workload named `name` (etcdctl's names and aliases).
pub fn load(name: &str) -> Option<Load> {
    let (limit, clients) = match name {
        "s" | "small" => (150, 50),
        "m" | "medium" => (1000, 200),
        "l" | "large" => (8000, 500),
        "xl" | "xLarge" => (15000, 1000),
        _ => return None,
    };
    Some(Load {
        limit,
        clients,
        duration: Duration::from_secs(60),
    })
}

const KEY_SIZE: usize = 256;
const VALUE_SIZE: usize = 1024;
/// How long the cleanup delete, compaction and each defragmentation may take (etcdctl's).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Paces events at `limit` per second without catching up after a stall, like
/// golang.org/x/time/rate with a burst of 1 (etcdctl's limiter). The one difference: up to
/// [`Pacer::SLACK`] of missed events may be made up at once, because tokio's timer has
/// millisecond resolution and a strict burst of 1 could not go beyond 1000 events per second.
struct Pacer {
    period: Duration,
    next: Instant,
}

impl Pacer {
    const SLACK: Duration = Duration::from_millis(2);

    fn new(limit: u32) -> Self {
        Pacer {
            period: Duration::from_secs(1) / limit,
            next: Instant::now(),
        }
    }

    /// Waits for the next event's turn; false (without waiting) when it would come after `end`.
    async fn wait(&mut self, end: Instant) -> bool {
        let now = Instant::now();
        let floor = now.checked_sub(Self::SLACK.max(self.period)).unwrap_or(now);
        self.next = self.next.max(floor);
        if self.next > end {
            return false;
        }
        tokio::time::sleep_until(self.next).await;
        self.next += self.period;
        true
    }
}

/// etcdctl's statistics of a run (its `report.Stats`): successful puts only.
#[derive(Debug, Default, PartialEq)]
pub struct Stats {
    pub rps: f64,
    pub slowest: f64,
    pub stddev: f64,
    /// Failed puts by error message.
    pub errors: BTreeMap<String, u64>,
}

impl Stats {
    /// `lats` in seconds; `total` is the time from the first put's start to the last one's end.
    pub fn new(lats: &[f64], total: Duration, errors: BTreeMap<String, u64>) -> Stats {
        let n = lats.len() as f64;
        // As in Go, an empty run gives NaN for the mean and deviation.
        let mean = lats.iter().sum::<f64>() / n;
        let var = lats.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / n;
        Stats {
            rps: n / total.as_secs_f64(),
            slowest: lats.iter().copied().fold(0.0, f64::max),
            stddev: var.sqrt(),
            errors,
        }
    }

    /// etcdctl's verdict lines, and whether the run passed.
    pub fn verdict(&self, limit: u32) -> (String, bool) {
        let mut out = String::new();
        let mut ok = true;
        if !self.errors.is_empty() {
            out += "FAIL: too many errors\n";
            for (e, n) in &self.errors {
                out += &format!("FAIL: ERROR({e}) -> {n}\n");
            }
            ok = false;
        }
        // Go's int(s.RPS)+1.
        let writes = self.rps as i64 + 1;
        if self.rps / limit as f64 <= 0.9 {
            out += &format!("FAIL: Throughput too low: {writes} writes/s\n");
            ok = false;
        } else {
            out += &format!("PASS: Throughput is {writes} writes/s\n");
        }
        if self.slowest > 0.5 {
            out += &format!("Slowest request took too long: {:.6}s\n", self.slowest);
            ok = false;
        } else {
            out += &format!("PASS: Slowest request took {:.6}s\n", self.slowest);
        }
        if self.stddev > 0.1 {
            out += &format!("Stddev too high: {:.6}s\n", self.stddev);
            ok = false;
        } else {
            out += &format!("PASS: Stddev is {:.6}s\n", self.stddev);
        }
        out += if ok { "PASS\n" } else { "FAIL\n" };
        (out, ok)
    }
}

/// etcdctl's key: the prefix and 256 bytes starting with the varint of a random i63.
fn random_key(prefix: &[u8], buf: &mut [u8; KEY_SIZE]) -> Vec<u8> {
    let x: i64 = rand::random::<i64>() & i64::MAX;
    // Go's binary.PutVarint: zig-zag, then a uvarint over the start of the buffer (the rest
    // keeps what earlier keys left there, as in etcdctl).
    let mut w: &mut [u8] = &mut buf[..];
    prost::encoding::encode_varint((x as u64) << 1, &mut w);
    let mut k = prefix.to_vec();
    k.extend_from_slice(buf);
    k
}

/// `clients` connections, each to the endpoints in a different rotation so that the load
/// spreads over them (clientv3 balances each client's requests over all endpoints).
async fn connect_all(ctx: &Ctx, clients: usize) -> Result<Vec<Conn>, CliError> {
    let eps = &ctx.global.endpoints;
    let deadline = ctx.deadline();
    // One after the other, as etcdctl makes its clients: with --user each one authenticates
    // (a bcrypt check on the server) within its own dial timeout.
    let mut conns = Vec::with_capacity(clients);
    for i in 0..clients {
        let mut mine = eps.clone();
        mine.rotate_left(i % eps.len().max(1));
        conns.push(Conn::connect(&mine, ctx.dial()?, deadline).await?);
    }
    Ok(conns)
}

/// Puts paced at `limit` per second for `duration` over `conns`; the statistics.
async fn run_load(conns: &[Conn], limit: u32, duration: Duration, prefix: &[u8]) -> Stats {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(conns.len());
    let rx = Arc::new(Mutex::new(rx));
    let start = Instant::now();
    let workers: Vec<_> = conns
        .iter()
        .map(|c| {
            let mut kv = c.kv();
            let rx = rx.clone();
            tokio::spawn(async move {
                let value = vec![0u8; VALUE_SIZE];
                let mut lats = Vec::new();
                let mut errors = BTreeMap::<String, u64>::new();
                loop {
                    let key = rx.lock().await.recv().await;
                    let Some(key) = key else { break };
                    let t = Instant::now();
                    let req = PutRequest {
                        key,
                        value: value.clone(),
                        ..Default::default()
                    };
                    match kv.put(req).await {
                        Ok(_) => lats.push(t.elapsed().as_secs_f64()),
                        Err(s) => *errors.entry(status_message(&s)).or_default() += 1,
                    }
                }
                (lats, errors)
            })
        })
        .collect();
    let end = start + duration;
    let mut pacer = Pacer::new(limit);
    let mut buf = [0u8; KEY_SIZE];
    while pacer.wait(end).await {
        if tx.send(random_key(prefix, &mut buf)).await.is_err() {
            break;
        }
    }
    drop(tx);
    let mut lats = Vec::new();
    let mut errors = BTreeMap::new();
    for w in workers {
        match w.await {
            Ok((l, e)) => {
                lats.extend(l);
                for (k, n) in e {
                    *errors.entry(k).or_default() += n;
                }
            }
            Err(e) => *errors.entry(e.to_string()).or_default() += 1,
        }
    }
    Stats::new(&lats, start.elapsed(), errors)
}

pub async fn perf(ctx: &Ctx, a: CheckPerfArgs) -> Result<i32, CliError> {
    let cfg = load(&a.load).ok_or_else(|| {
        CliError::new(EXIT_BAD_FEATURE, format!("unknown load option {}", a.load))
    })?;
    let duration = a.duration.unwrap_or(cfg.duration);
    let prefix = a.prefix.as_bytes();
    let conns = connect_all(ctx, cfg.clients).await?;
    let first = &conns[0];

    let existing = with_deadline(Instant::now() + cfg.duration, async {
        let req = RangeRequest {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            limit: 1,
            ..Default::default()
        };
        Ok(first.kv().range(req).await?.into_inner())
    })
    .await?;
    if !existing.kvs.is_empty() {
        return Err(CliError::new(
            EXIT_INVALID_INPUT,
            format!(
                "prefix {} has keys. Delete with etcdctl del --prefix {} first",
                quote(prefix),
                a.prefix
            ),
        ));
    }

    let secs = duration.as_secs_f64().ceil().max(1.0) as u64;
    let bar = tokio::spawn(progress::run(secs));
    let stats = run_load(&conns, cfg.limit, duration, prefix).await;
    let _ = bar.await;

    let deleted = with_deadline(Instant::now() + CLEANUP_TIMEOUT, async {
        let req = DeleteRangeRequest {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        };
        Ok(first.kv().delete_range(req).await?.into_inner())
    })
    .await?;
    if a.auto_compact {
        let rev = deleted.header.map(|h| h.revision).unwrap_or_default();
        println!("Compacting with revision {rev}");
        with_deadline(Instant::now() + CLEANUP_TIMEOUT, async {
            let req = CompactionRequest {
                revision: rev,
                physical: true,
            };
            first.kv().compact(req).await?;
            Ok(())
        })
        .await?;
        println!("Compacted with revision {rev}");
    }
    if a.auto_defrag {
        for ep in &ctx.global.endpoints {
            println!("Defragmenting {}", quote(ep.as_bytes()));
            let deadline = Instant::now() + CLEANUP_TIMEOUT;
            with_deadline(deadline, async {
                let conn = Conn::connect(std::slice::from_ref(ep), ctx.dial()?, deadline).await?;
                conn.maintenance().defragment(DefragmentRequest {}).await?;
                Ok(())
            })
            .await?;
            println!("Defragmented {}", quote(ep.as_bytes()));
        }
    }

    let (text, ok) = stats.verdict(cfg.limit);
    print!("{text}");
    Ok(if ok { 0 } else { EXIT_ERROR })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_etcdctls() {
        assert_eq!(load("s"), load("small"));
        assert_eq!(load("xl"), load("xLarge"));
        let xl = load("xl").unwrap();
        assert_eq!((xl.limit, xl.clients), (15000, 1000));
        assert_eq!(xl.duration, Duration::from_secs(60));
        assert_eq!(load("m").unwrap().limit, 1000);
        assert_eq!(load("l").unwrap().clients, 500);
        assert!(load("XL").is_none());
    }

    #[test]
    fn statistics_and_verdict() {
        let lats = [0.01, 0.03, 0.02, 0.02];
        let s = Stats::new(&lats, Duration::from_secs(2), BTreeMap::new());
        assert_eq!(s.rps, 2.0);
        assert_eq!(s.slowest, 0.03);
        assert!((s.stddev - 0.5f64.sqrt() / 100.0).abs() < 1e-12);
        let (text, ok) = s.verdict(2);
        assert!(ok);
        assert_eq!(
            text,
            "PASS: Throughput is 3 writes/s\nPASS: Slowest request took 0.030000s\nPASS: Stddev is 0.007071s\nPASS\n"
        );
        // 90% of the limit exactly is too low; one error fails the run.
        let s = Stats {
            rps: 135.0,
            slowest: 0.6,
            stddev: 0.2,
            errors: BTreeMap::from([("etcdserver: too many requests".to_string(), 2)]),
        };
        let (text, ok) = s.verdict(150);
        assert!(!ok);
        assert_eq!(
            text,
            "FAIL: too many errors\nFAIL: ERROR(etcdserver: too many requests) -> 2\nFAIL: Throughput too low: 136 writes/s\nSlowest request took too long: 0.600000s\nStddev too high: 0.200000s\nFAIL\n"
        );
    }

    #[test]
    fn keys_are_prefix_and_256_bytes() {
        let mut buf = [0u8; KEY_SIZE];
        let a = random_key(b"/p/", &mut buf);
        let b = random_key(b"/p/", &mut buf);
        assert_eq!(a.len(), 3 + KEY_SIZE);
        assert!(a.starts_with(b"/p/"));
        assert_ne!(a, b);
    }

    #[tokio::test(start_paused = true)]
    async fn pacer_keeps_the_rate_without_catching_up() {
        let mut p = Pacer::new(100);
        let start = Instant::now();
        let end = start + Duration::from_secs(1);
        let mut n = 0;
        while p.wait(end).await {
            n += 1;
        }
        assert_eq!(n, 101, "events at 0, 10 ms, ..., 1 s");
        // A 500 ms stall is not made up: the next second brings ~100 more, not ~150.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let end = Instant::now() + Duration::from_secs(1);
        let mut m = 0;
        while p.wait(end).await {
            m += 1;
        }
        assert!((100..=102).contains(&m), "{m}");
    }
}
