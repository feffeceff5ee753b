//! Times one increment of each crate's counters and histograms, single-threaded, and prints a
//! sample of each crate's text exposition. Numbers are ns per operation.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const N: u64 = 20_000_000;

fn time(name: &str, mut f: impl FnMut()) {
    for _ in 0..N / 10 { f(); }
    let t = Instant::now();
    for _ in 0..N { f(); }
    println!("{name:60} {:6.2} ns/op", t.elapsed().as_nanos() as f64 / N as f64);
}

fn main() {
    // Baseline: the hand-written relaxed atomic kvd had.
    let a = AtomicU64::new(0);
    time("AtomicU64::fetch_add (baseline)", || { black_box(&a).fetch_add(1, Ordering::Relaxed); });

    // prometheus (tikv)
    let c = prometheus::IntCounter::new("c", "h").unwrap();
    time("prometheus IntCounter::inc", || black_box(&c).inc());
    let v = prometheus::IntCounterVec::new(prometheus::Opts::new("v", "h"), &["grpc_type", "grpc_service", "grpc_method", "grpc_code"]).unwrap();
    let child = v.with_label_values(&["unary", "etcdserverpb.KV", "Put", "OK"]);
    time("prometheus IntCounterVec child (pre-resolved) inc", || black_box(&child).inc());
    time("prometheus IntCounterVec with_label_values(4).inc", || v.with_label_values(black_box(&["unary", "etcdserverpb.KV", "Put", "OK"])).inc());
    let h = prometheus::Histogram::with_opts(prometheus::HistogramOpts::new("h", "h").buckets(prometheus::exponential_buckets(0.001, 2.0, 14).unwrap())).unwrap();
    time("prometheus Histogram::observe (14 buckets)", || black_box(&h).observe(black_box(0.003)));

    // prometheus-client
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
    let pc: Counter = Counter::default();
    time("prometheus-client Counter::inc", || { black_box(&pc).inc(); });
    type L = Vec<(&'static str, &'static str)>;
    let fam: Family<L, Counter> = Family::default();
    let labels: L = vec![("grpc_type", "unary"), ("grpc_service", "etcdserverpb.KV"), ("grpc_method", "Put"), ("grpc_code", "OK")];
    let pchild = fam.get_or_create(&labels).clone();
    time("prometheus-client Family child (pre-resolved, cloned) inc", || { black_box(&pchild).inc(); });
    time("prometheus-client Family get_or_create(4).inc", || { fam.get_or_create(black_box(&labels)).inc(); });
    let ph = Histogram::new(exponential_buckets(0.001, 2.0, 14));
    time("prometheus-client Histogram::observe (14 buckets)", || black_box(&ph).observe(black_box(0.003)));

    // kvd's per-call gRPC accounting: before (RwLock read + map lookup + one atomic add) and
    // after (immutable map lookup + four pre-resolved counters: started, received, handled, sent).
    {
        use std::collections::HashMap;
        use std::sync::RwLock;
        let old: RwLock<HashMap<String, [AtomicU64; 17]>> = RwLock::new(HashMap::new());
        old.write().unwrap().insert("/etcdserverpb.KV/Put".into(), Default::default());
        time("kvd before: per call (RwLock read, lookup, 1 atomic)", || {
            let t = old.read().unwrap();
            t.get(black_box("/etcdserverpb.KV/Put")).unwrap()[0].fetch_add(1, Ordering::Relaxed);
        });
        let l = ["unary", "etcdserverpb.KV", "Put"];
        let started = prometheus::IntCounterVec::new(prometheus::Opts::new("s", "h"), &["a","b","c"]).unwrap();
        let handled = prometheus::IntCounterVec::new(prometheus::Opts::new("hd", "h"), &["a","b","c","d"]).unwrap();
        struct M { s: prometheus::IntCounter, r: prometheus::IntCounter, h: [prometheus::IntCounter; 17], o: prometheus::IntCounter }
        let mut new: HashMap<String, M> = HashMap::new();
        new.insert("/etcdserverpb.KV/Put".into(), M {
            s: started.with_label_values(&l), r: started.with_label_values(&["x","y","z"]),
            h: std::array::from_fn(|i| handled.with_label_values(&[l[0], l[1], l[2], &i.to_string()])),
            o: started.with_label_values(&["x","y","w"]),
        });
        time("kvd after: per call (lookup, 4 pre-resolved IntCounters)", || {
            let m = new.get(black_box("/etcdserverpb.KV/Put")).unwrap();
            m.s.inc(); m.r.inc(); m.h[0].inc(); m.o.inc();
        });
        let hist = prometheus::Histogram::with_opts(prometheus::HistogramOpts::new("hs", "h").buckets(vec![0.005,0.01,0.025,0.05,0.1,0.25,0.5,1.0,2.5,5.0,10.0])).unwrap();
        time("kvd after, extensive: + Instant::now, elapsed, observe", || {
            let t = Instant::now();
            let m = new.get(black_box("/etcdserverpb.KV/Put")).unwrap();
            m.s.inc(); m.r.inc(); m.h[0].inc(); m.o.inc();
            hist.observe(t.elapsed().as_secs_f64());
        });
    }

    // Exposition samples.
    let r = prometheus::Registry::new();
    r.register(Box::new(v.clone())).unwrap();
    r.register(Box::new(h.clone())).unwrap();
    let mut out = String::new();
    prometheus::TextEncoder::new().encode_utf8(&r.gather(), &mut out).unwrap();
    println!("---- prometheus text\n{}", &out[..out.len().min(600)]);
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register("grpc_server_handled", "Total number of RPCs completed on the server, regardless of success or failure.", fam.clone());
    reg.register("h", "h", ph.clone());
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, &reg).unwrap();
    println!("---- prometheus-client text\n{}", &s[..s.len().min(900)]);
}
