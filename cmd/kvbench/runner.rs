//! Drives `--clients` tasks until `--total` requests are done, recording latencies.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvd::proto::etcdserverpb::kv_client::KvClient;
use tonic::transport::Channel;

use crate::ops::Op;
use crate::Global;

/// Latencies are recorded in microseconds, 1 us .. 1 h at 3 significant digits.
/// Counts a failed request and keeps the first few messages for the summary.
pub fn note_error(errors: &mut u64, samples: &mut Vec<String>, msg: impl FnOnce() -> String) {
    *errors += 1;
    if samples.len() < 3 {
        samples.push(msg());
    }
}

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

pub struct RunResult {
    pub hist: Histogram<u64>,
    pub errors: u64,
    /// First few distinct error messages, for the summary.
    pub error_samples: Vec<String>,
    pub elapsed: Duration,
}

/// Writes `(start us, latency us)` pairs, sorted by start, one per line.
fn write_log(path: &std::path::Path, mut log: Vec<(u64, u64)>) -> anyhow::Result<()> {
    use std::io::Write;
    log.sort_unstable();
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (start, us) in log {
        writeln!(w, "{start}\t{us}")?;
    }
    w.flush()?;
    Ok(())
}

pub async fn run(g: &Global, channels: Vec<Channel>, op: Op) -> anyhow::Result<RunResult> {
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let pb = if g.json {
        ProgressBar::hidden()
    } else {
        let pb = ProgressBar::with_draw_target(Some(g.total), ProgressDrawTarget::stderr());
        pb.set_style(
            ProgressStyle::with_template(
                "{bar:40.cyan/blue} {pos}/{len} [{elapsed_precise}] {per_sec} eta {eta}",
            )
            .expect("valid template"),
        );
        pb
    };
    let timeout = Duration::from_secs_f64(g.timeout);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(g.clients);
    for c in 0..g.clients {
        let mut client = KvClient::new(channels[c % channels.len()].clone())
            .max_decoding_message_size(usize::MAX);
        let (op, next, pb) = (op.clone(), next.clone(), pb.clone());
        let (total, rate) = (g.total, g.rate);
        let logging = g.latency_log.is_some();
        tasks.push(tokio::spawn(async move {
            let mut hist = new_histogram();
            let mut log = Vec::new();
            let mut errors = 0u64;
            let mut samples = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                if rate > 0.0 {
                    tokio::time::sleep_until(
                        (start + Duration::from_secs_f64(i as f64 / rate)).into(),
                    )
                    .await;
                }
                let t0 = Instant::now();
                match tokio::time::timeout(timeout, op.call(&mut client, i)).await {
                    Ok(Ok(())) => {
                        let us = t0.elapsed().as_micros().max(1) as u64;
                        hist.saturating_record(us);
                        if logging {
                            log.push(((t0 - start).as_micros() as u64, us));
                        }
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
            (hist, errors, samples, log)
        }));
    }
    let mut hist = new_histogram();
    let mut errors = 0;
    let mut error_samples: Vec<String> = Vec::new();
    let mut log = Vec::new();
    for t in tasks {
        let (h, e, s, l) = t.await?;
        hist.add(&h)?;
        log.extend(l);
        errors += e;
        for m in s {
            if error_samples.len() < 5 && !error_samples.contains(&m) {
                error_samples.push(m);
            }
        }
    }
    let elapsed = start.elapsed();
    pb.finish_and_clear();
    if let Some(path) = &g.latency_log {
        write_log(path, log)?;
    }
    Ok(RunResult {
        hist,
        errors,
        error_samples,
        elapsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latency_log_is_in_start_order_one_request_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lat");
        // As merged from two clients: each in order, the two interleaved.
        write_log(
            &path,
            vec![(10, 700), (900, 650), (400, 2_500), (1_500, 800)],
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "10\t700\n400\t2500\n900\t650\n1500\t800\n"
        );
    }
}
