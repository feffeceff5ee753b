//! kvbench: a load generator for etcd-compatible endpoints, after etcd's `benchmark` tool.
//! It speaks only the public etcd v3 API, so the same command measures kvd and a real etcd.
//!
//! Invariants:
//! - Exactly `--total` requests are issued (fewer only if the run is interrupted), shared by
//!   `--clients` tasks that multiplex over `--conns` gRPC connections (client `c` uses
//!   connection `c % conns`, connection `i` dials endpoint `i % endpoints`).
//! - Latency is measured per request from just before the call to its response, in
//!   microseconds, including time queued on a busy connection; with `--rate` the request
//!   is due at `start + i / rate`, and a late request is measured from when it was sent
//!   (closed-loop, like etcd's tool), not from when it was due.
//! - Failed requests are counted and left out of the latency histogram.

mod conns;
mod fsync;
mod keys;
mod list;
mod ops;
mod report;
mod runner;
mod watch;

use clap::{Args, Parser, Subcommand};

// The load tool shares the machine with the members it measures: every microsecond it spends
// per request is one they do not get. glibc's allocator was about a tenth of its CPU at 256
// clients (docs/benchmarks.md, "The client dispatch").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "kvbench",
    version,
    about = "Benchmark an etcd-compatible endpoint (kvd or etcd)"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Comma-separated gRPC endpoints (http://host:port or host:port).
    #[arg(long, global = true, default_value = "127.0.0.1:2379")]
    pub endpoints: String,
    /// Number of gRPC connections.
    #[arg(long, global = true, default_value_t = 1)]
    pub conns: usize,
    /// Number of concurrent clients (tasks).
    #[arg(long, global = true, default_value_t = 1)]
    pub clients: usize,
    /// Total number of requests.
    #[arg(long, global = true, default_value_t = 10000)]
    pub total: u64,
    /// Maximum requests per second (0 = unlimited).
    #[arg(long, global = true, default_value_t = 0.0)]
    pub rate: f64,
    /// Print the summary as JSON on stdout (no progress bar).
    #[arg(long, global = true)]
    pub json: bool,
    /// Per-request timeout in seconds.
    #[arg(long, global = true, default_value_t = 10.0)]
    pub timeout: f64,
    /// Verify https endpoints with this CA bundle (as etcd's benchmark --cacert).
    #[arg(long, global = true)]
    pub cacert: Option<std::path::PathBuf>,
    /// Client certificate for https endpoints.
    #[arg(long, global = true, requires = "key")]
    pub cert: Option<std::path::PathBuf>,
    /// Client certificate's key.
    #[arg(long, global = true, requires = "cert")]
    pub key: Option<std::path::PathBuf>,
    /// put, range, txn-put: also write every successful request to this file, in the order
    /// they started: its start (microseconds since the run began) and its latency
    /// (microseconds), tab-separated. For finding when the slow ones happen; the summary is the
    /// same either way.
    #[arg(long, global = true)]
    pub latency_log: Option<std::path::PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct KeyArgs {
    /// Key size in bytes.
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// Number of distinct keys written.
    #[arg(long, default_value_t = 1)]
    pub key_space_size: u64,
    /// Write keys 0, 1, 2, ... (mod key-space-size) instead of random ones.
    #[arg(long)]
    pub sequential_keys: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Put keys.
    Put(KeyArgs),
    /// Range over a key or [key, end).
    Range {
        // Not "key": the global TLS flag `--key` owns that id, and clap panics on the clash.
        #[arg(id = "range_key", value_name = "KEY")]
        key: String,
        end: Option<String>,
        /// l: linearizable, s: serializable.
        #[arg(long, default_value = "l")]
        consistency: String,
        /// Maximum number of keys returned (0 = no limit).
        #[arg(long, default_value_t = 0)]
        limit: i64,
        /// KEY and END are hex-encoded bytes (the keys `put` writes are binary numbers).
        #[arg(long)]
        hex: bool,
    },
    /// Transactions of --txn-ops puts each.
    TxnPut {
        #[command(flatten)]
        keys: KeyArgs,
        /// Puts per transaction.
        #[arg(long, default_value_t = 1)]
        txn_ops: usize,
    },
    /// Delay from each put's response to each watcher receiving its event (etcd's
    /// `benchmark watch-latency`), optionally with stalled watchers and a no-watcher baseline.
    WatchLatency(watch::WatchArgs),
    /// A full paginated listing of the key space, pages pinned to the first page's revision
    /// (as Kubernetes' API server lists); reports its time.
    List {
        /// Keys per page (the API server's default is 500).
        #[arg(long, default_value_t = 500)]
        page: i64,
        /// l: linearizable, s: serializable.
        #[arg(long, default_value = "l")]
        consistency: String,
    },
    /// Local disk check: sequential 2300-byte writes, each fdatasynced (etcd's fio guidance).
    Fsync {
        /// Directory to write the test file in (put it on the disk the data dir will use).
        #[arg(long, default_value = ".")]
        dir: std::path::PathBuf,
        /// Number of write+fdatasync iterations.
        #[arg(long, default_value_t = kvd::wal::diskcheck::DEFAULT_COUNT)]
        count: u64,
        /// Bytes per write.
        #[arg(long, default_value_t = kvd::wal::diskcheck::DEFAULT_SIZE)]
        size: usize,
    },
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Fsync { dir, count, size } => fsync::run(&dir, count, size, cli.global.json),
        cmd => {
            let watch = matches!(cmd, Cmd::WatchLatency(_));
            let rt = if watch {
                // Its latencies were measured on tokio's defaults; kept comparable.
                tokio::runtime::Runtime::new()
            } else if cli.global.clients == 1 {
                // One client's requests form a chain: a second thread only adds a hand-off
                // per request (a wake-up of the other worker) to what is measured, and takes
                // CPU from the members (docs/benchmarks.md, "A follower writes in place").
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
            } else {
                many_clients_runtime()
            }
            .expect("tokio runtime");
            rt.block_on(run_net(cli.global, cmd))
        }
    };
    if let Err(e) = res {
        eprintln!("kvbench: {e:#}");
        std::process::exit(1);
    }
}

/// Many clients (put, txn-put, range) share each connection. With tokio's LIFO slot, a client
/// task that queues a request wakes its connection's task, which then runs at once and writes
/// that one request: a write syscall per request, the largest part of the tool's CPU. Without
/// the slot the clients woken together all queue theirs first and the connection writes them
/// in one call (as kvd does for its responses, docs/decisions/0006-tokio-lifo-slot-off.md;
/// this needs kvd's copy of h2 too, decision 0035). `KVBENCH_TOKIO_LIFO_SLOT=on` keeps the
/// slot, for A/B runs.
fn many_clients_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all();
    let lifo = std::env::var("KVBENCH_TOKIO_LIFO_SLOT").is_ok_and(|v| v == "on");
    #[cfg(tokio_unstable)]
    if !lifo {
        b.disable_lifo_slot();
    }
    #[cfg(not(tokio_unstable))]
    let _ = lifo;
    b.build()
}

async fn run_net(g: Global, cmd: Cmd) -> anyhow::Result<()> {
    if let Cmd::WatchLatency(a) = cmd {
        return watch::run(g, a).await;
    }
    let channels = conns::connect(&g).await?;
    if let Cmd::List { page, consistency } = cmd {
        let serializable = ops::serializable(&consistency)?;
        let ch = channels
            .into_iter()
            .next()
            .expect("at least one connection");
        return list::run(ch, page, serializable, g.json).await;
    }
    let op = match cmd {
        Cmd::Put(k) => ops::Op::put(&k)?,
        Cmd::TxnPut { keys, txn_ops } => ops::Op::txn_put(&keys, txn_ops)?,
        Cmd::Range {
            key,
            end,
            consistency,
            limit,
            hex,
        } => {
            let bytes = |s: String| {
                if hex {
                    ops::unhex(&s)
                } else {
                    Ok(s.into_bytes())
                }
            };
            ops::Op::range(
                bytes(key)?,
                end.map(bytes).transpose()?,
                &consistency,
                limit,
            )?
        }
        Cmd::Fsync { .. } | Cmd::WatchLatency(_) | Cmd::List { .. } => {
            unreachable!("handled above")
        }
    };
    let name = op.name();
    let r = runner::run(&g, channels, op).await?;
    let summary = report::Summary::new(name, &g, &r);
    if g.json {
        println!("{}", serde_json::to_string_pretty(&summary.to_json())?);
    } else {
        print!("{}", summary.to_text());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_keys_decode_and_bad_ones_are_refused() {
        assert_eq!(ops::unhex("00ff7A").unwrap(), vec![0, 255, 0x7a]);
        assert_eq!(ops::unhex("").unwrap(), Vec::<u8>::new());
        for bad in ["0", "0g", "é1"] {
            assert!(ops::unhex(bad).is_err(), "{bad}");
        }
    }

    /// `range KEY` beside the global TLS `--key`: the two once shared clap's id and every
    /// `kvbench range` panicked while parsing.
    #[test]
    fn range_key_and_the_tls_key_flag_parse_apart() {
        let cli = Cli::try_parse_from(["kvbench", "range", "k1", "--cert", "c", "--key", "t"])
            .expect("parses");
        match cli.cmd {
            Cmd::Range { key, .. } => assert_eq!(key, "k1"),
            _ => panic!("not range"),
        }
        assert_eq!(cli.global.key.as_deref(), Some(std::path::Path::new("t")));
        let cli = Cli::try_parse_from(["kvbench", "range", "k2", "k3"]).expect("parses");
        assert!(
            matches!(cli.cmd, Cmd::Range { key, end: Some(end), .. } if key == "k2" && end == "k3")
        );
    }
}
