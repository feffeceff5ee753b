//! The run summary: etcd-benchmark-style text (with a latency histogram) or JSON.

use std::fmt::Write;

use hdrhistogram::Histogram;
use serde_json::json;

use crate::runner::RunResult;
use crate::Global;

pub struct Summary {
    pub op: String,
    pub clients: usize,
    pub conns: usize,
    pub ok: u64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub seconds: f64,
    pub hist: Histogram<u64>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

pub use kvd::wal::diskcheck::PERCENTILES;

/// `n` equal-width buckets from min to max latency (like etcd's tool): (upper bound us, count).
pub fn buckets(h: &Histogram<u64>, n: usize) -> Vec<(u64, u64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let (lo, hi) = (h.min(), h.max());
    let width = ((hi - lo) / n as u64).max(1);
    let mut out: Vec<(u64, u64)> = (1..=n as u64).map(|k| (lo + k * width, 0)).collect();
    if let Some(last) = out.last_mut() {
        last.0 = last.0.max(hi);
    }
    for v in h.iter_recorded() {
        let k = (((v.value_iterated_to().saturating_sub(lo)) / width) as usize).min(n - 1);
        out[k].1 += v.count_at_value();
    }
    out
}

/// A histogram with a single empty summary value for an all-errors run.
fn p(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        ms(h.value_at_percentile(q))
    }
}

impl Summary {
    pub fn new(op: String, g: &Global, r: &RunResult) -> Self {
        Summary {
            op,
            clients: g.clients,
            conns: g.conns,
            ok: r.hist.len(),
            errors: r.errors,
            error_samples: r.error_samples.clone(),
            seconds: r.elapsed.as_secs_f64(),
            hist: r.hist.clone(),
        }
    }

    pub fn qps(&self) -> f64 {
        self.ok as f64 / self.seconds.max(1e-9)
    }

    pub fn to_json(&self) -> serde_json::Value {
        let h = &self.hist;
        let mut lat = serde_json::Map::new();
        for (name, q) in PERCENTILES {
            lat.insert(name.to_string(), json!(p(h, q)));
        }
        lat.insert(
            "min".into(),
            json!(if h.is_empty() { 0.0 } else { ms(h.min()) }),
        );
        lat.insert(
            "max".into(),
            json!(if h.is_empty() { 0.0 } else { ms(h.max()) }),
        );
        lat.insert("mean".into(), json!(h.mean() / 1000.0));
        lat.insert("stddev".into(), json!(h.stdev() / 1000.0));
        json!({
            "op": self.op,
            "clients": self.clients,
            "conns": self.conns,
            "requests": self.ok + self.errors,
            "ok": self.ok,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "seconds": self.seconds,
            "qps": self.qps(),
            "latency_ms": lat,
            "histogram": buckets(h, 10).iter().map(|(le, c)| json!({"le_ms": ms(*le), "count": c})).collect::<Vec<_>>(),
        })
    }

    pub fn to_text(&self) -> String {
        let h = &self.hist;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\nSummary ({}, {} clients, {} conns):",
            self.op, self.clients, self.conns
        );
        let _ = writeln!(s, "  Total:\t{:.4} secs.", self.seconds);
        let _ = writeln!(s, "  Requests:\t{} ok, {} failed", self.ok, self.errors);
        if !h.is_empty() {
            let _ = writeln!(s, "  Slowest:\t{:.4} ms.", ms(h.max()));
            let _ = writeln!(s, "  Fastest:\t{:.4} ms.", ms(h.min()));
            let _ = writeln!(s, "  Average:\t{:.4} ms.", h.mean() / 1000.0);
            let _ = writeln!(s, "  Stddev:\t{:.4} ms.", h.stdev() / 1000.0);
        }
        let _ = writeln!(s, "  Requests/sec:\t{:.2}", self.qps());
        for m in &self.error_samples {
            let _ = writeln!(s, "  error: {m}");
        }
        if h.is_empty() {
            return s;
        }
        let _ = writeln!(s, "\nResponse time histogram (ms):");
        let b = buckets(h, 10);
        let most = b.iter().map(|(_, c)| *c).max().unwrap_or(1).max(1);
        for (le, c) in &b {
            let bar = "∎".repeat((c * 40 / most) as usize);
            let _ = writeln!(s, "  {:>10.3} [{c}]\t|{bar}", ms(*le));
        }
        let _ = writeln!(s, "\nLatency distribution:");
        for (name, q) in PERCENTILES {
            let _ = writeln!(s, "  {name:>6} in {:.4} ms.", p(h, q));
        }
        let _ = writeln!(s, "  {:>6} in {:.4} ms.", "max", ms(h.max()));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_sample() {
        let mut h = crate::runner::new_histogram();
        for v in [100, 150, 900, 1000, 5000] {
            h.record(v).unwrap();
        }
        let b = buckets(&h, 10);
        assert_eq!(b.len(), 10);
        assert_eq!(b.iter().map(|(_, c)| c).sum::<u64>(), 5);
        assert!(b.last().unwrap().0 >= h.max());
    }
}
