//! Metric families built at scrape time from values a member owns (its WAL, its Raft
//! progress), where Go's client would use a `GaugeFunc` or `CounterFunc`: the value is read
//! once per scrape instead of mirrored into a registered metric on every change.

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn labelled(mut m: Metric, labels: &[(&str, &str)]) -> Metric {
    let mut pairs: Vec<LabelPair> = labels
        .iter()
        .map(|(k, v)| {
            let mut p = LabelPair::default();
            p.set_name(k.to_string());
            p.set_value(v.to_string());
            p
        })
        .collect();
    pairs.sort_by(|a, b| a.name().cmp(b.name()));
    m.set_label(pairs);
    m
}

fn gauge_metric(v: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(v);
    Metric::from_gauge(g)
}

pub fn gauge(name: &str, help: &str, v: f64) -> MetricFamily {
    family(name, help, MetricType::GAUGE, vec![gauge_metric(v)])
}

/// A gauge with one labelled sample (an info metric is one sample of 1).
pub fn gauge_with(name: &str, help: &str, labels: &[(&str, &str)], v: f64) -> MetricFamily {
    let m = labelled(gauge_metric(v), labels);
    family(name, help, MetricType::GAUGE, vec![m])
}

pub fn counter(name: &str, help: &str, v: f64) -> MetricFamily {
    let mut c = Counter::default();
    c.set_value(v);
    let mut m = Metric::default();
    m.set_counter(c);
    family(name, help, MetricType::COUNTER, vec![m])
}

/// A histogram over `bounds`, from per-bound cumulative counts (`cumulative[k]` counts
/// observations `<= bounds[k]`; the `+Inf` bucket is `count`).
pub fn histogram(
    name: &str,
    help: &str,
    bounds: &[f64],
    cumulative: &[u64],
    count: u64,
    sum: f64,
) -> MetricFamily {
    let buckets = bounds
        .iter()
        .zip(cumulative)
        .map(|(b, c)| {
            let mut k = Bucket::default();
            k.set_upper_bound(*b);
            k.set_cumulative_count(*c);
            k
        })
        .collect();
    let mut h = Histogram::default();
    h.set_bucket(buckets);
    h.set_sample_count(count);
    h.set_sample_sum(sum);
    let mut m = Metric::default();
    m.set_histogram(h);
    family(name, help, MetricType::HISTOGRAM, vec![m])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: MetricFamily) -> String {
        let mut s = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&[f], &mut s)
            .unwrap();
        s
    }

    #[test]
    fn families_are_exposed_as_etcds_client_writes_them() {
        assert_eq!(
            text(gauge_with("i", "h", &[("b", "2"), ("a", "q\"x")], 1.0)),
            "# HELP i h\n# TYPE i gauge\ni{a=\"q\\\"x\",b=\"2\"} 1\n"
        );
        assert_eq!(
            text(counter("c_total", "h", 3.0)),
            "# HELP c_total h\n# TYPE c_total counter\nc_total 3\n"
        );
        let h = text(histogram(
            "x_seconds",
            "h",
            &[0.001, 8.192],
            &[1, 1],
            2,
            0.5,
        ));
        assert!(h.contains("# TYPE x_seconds histogram\n"));
        assert!(h.contains("x_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(h.contains("x_seconds_bucket{le=\"8.192\"} 1\n"));
        assert!(h.contains("x_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(h.contains("x_seconds_sum 0.5\nx_seconds_count 2\n"));
    }
}
