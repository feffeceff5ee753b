//! A minimal writer for the Prometheus text exposition format (version 0.0.4).
//!
//! Every family gets its `# HELP` and `# TYPE` lines before its samples, and a family is
//! written at most once per scrape (callers own that), as the format requires.

use std::fmt::Write;

use super::histogram::HistogramSnapshot;
use super::peer_histogram::PeerSeries;
use super::DISK_BUCKETS;

pub struct TextWriter {
    out: String,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(l: &[(&str, &str)]) -> String {
    if l.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = l
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)` spelling for the values we emit: integers
/// without a fraction, `+Inf` for infinity.
fn num(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

impl Default for TextWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl TextWriter {
    pub fn new() -> Self {
        TextWriter { out: String::new() }
    }

    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    pub fn counter(&mut self, name: &str, help: &str, v: f64) {
        self.header(name, help, "counter");
        let _ = writeln!(self.out, "{name} {}", num(v));
    }

    pub fn gauge(&mut self, name: &str, help: &str, v: f64) {
        self.header(name, help, "gauge");
        let _ = writeln!(self.out, "{name} {}", num(v));
    }

    /// A counter family with one sample per label set.
    pub fn counter_vec<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, f64)>,
    ) {
        self.labelled(name, help, "counter", samples);
    }

    /// A gauge family with one sample per label set (an info metric is one sample of 1).
    pub fn gauge_vec<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, f64)>,
    ) {
        self.labelled(name, help, "gauge", samples);
    }

    fn labelled<'a>(
        &mut self,
        name: &str,
        help: &str,
        kind: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, f64)>,
    ) {
        self.header(name, help, kind);
        for (l, v) in samples {
            let _ = writeln!(self.out, "{name}{} {}", labels(&l), num(v));
        }
    }

    /// A histogram over etcd's disk buckets ([`DISK_BUCKETS`]).
    pub fn histogram(&mut self, name: &str, help: &str, h: &HistogramSnapshot) {
        self.header(name, help, "histogram");
        for (bound, c) in DISK_BUCKETS.iter().zip(h.buckets) {
            let _ = writeln!(self.out, "{name}_bucket{{le=\"{bound}\"}} {c}");
        }
        let _ = writeln!(self.out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(self.out, "{name}_sum {}", num(h.sum_seconds));
        let _ = writeln!(self.out, "{name}_count {}", h.count);
    }

    /// A histogram family with one series per peer, labelled `label` (the peer's id in hex,
    /// as etcd spells member ids), over `bounds`.
    pub fn histogram_vec(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        bounds: &[f64],
        series: &[PeerSeries],
    ) {
        self.header(name, help, "histogram");
        for s in series {
            let peer = format!("{label}=\"{:x}\"", s.peer);
            for (bound, c) in bounds.iter().zip(&s.buckets) {
                let _ = writeln!(self.out, "{name}_bucket{{{peer},le=\"{bound}\"}} {c}");
            }
            let _ = writeln!(self.out, "{name}_bucket{{{peer},le=\"+Inf\"}} {}", s.count);
            let _ = writeln!(self.out, "{name}_sum{{{peer}}} {}", num(s.sum_seconds));
            let _ = writeln!(self.out, "{name}_count{{{peer}}} {}", s.count);
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_exposition_is_well_formed() {
        let mut w = TextWriter::new();
        let h = HistogramSnapshot {
            buckets: [1; 14],
            count: 2,
            sum_seconds: 0.5,
        };
        w.histogram("x_seconds", "help", &h);
        w.counter_vec("y_total", "h", vec![(vec![("a", "q\"x")], 3.0)]);
        w.gauge_vec("i_info", "h", vec![(vec![("a", "1"), ("b", "2")], 1.0)]);
        let s = w.finish();
        assert!(s.contains("# TYPE x_seconds histogram\n"));
        assert!(s.contains("x_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(s.contains("x_seconds_bucket{le=\"8.192\"} 1\n"));
        assert!(s.contains("x_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(s.contains("x_seconds_sum 0.5\nx_seconds_count 2\n"));
        assert!(s.contains("y_total{a=\"q\\\"x\"} 3\n"));
        assert!(s.contains("# TYPE i_info gauge\ni_info{a=\"1\",b=\"2\"} 1\n"));
    }

    #[test]
    fn labelled_histogram_exposition_is_well_formed() {
        let mut w = TextWriter::new();
        let series = [PeerSeries {
            peer: 0xab,
            buckets: vec![1, 2],
            count: 3,
            sum_seconds: 0.25,
        }];
        w.histogram_vec("z_seconds", "help", "To", &[0.1, 0.2], &series);
        let s = w.finish();
        assert!(s.contains("# TYPE z_seconds histogram\n"));
        assert!(s.contains("z_seconds_bucket{To=\"ab\",le=\"0.1\"} 1\n"));
        assert!(s.contains("z_seconds_bucket{To=\"ab\",le=\"0.2\"} 2\n"));
        assert!(s.contains("z_seconds_bucket{To=\"ab\",le=\"+Inf\"} 3\n"));
        assert!(s.contains("z_seconds_sum{To=\"ab\"} 0.25\nz_seconds_count{To=\"ab\"} 3\n"));
    }
}
