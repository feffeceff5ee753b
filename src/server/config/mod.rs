//! Typed, validated configuration. Flag names mirror etcd's, and every flag can also come from
//! the matching `ETCD_*` environment variable (`--initial-cluster` <- `ETCD_INITIAL_CLUSTER`),
//! so scripts written for etcd start kvd unchanged.

pub mod compat;
pub mod env;
pub mod file;
pub(crate) mod gates;
pub(crate) mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Flags as given on the command line / environment (before validation).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kvd",
    version = super::version::long(),
    about = "An etcd-compatible, Raft-replicated key-value store"
)]
pub struct Flags {
    /// Path to a YAML configuration file (etcd's keys); with it, other flags and ETCD_*
    /// variables are ignored.
    #[arg(long, env = "ETCD_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    pub name: String,
    /// Path to the data directory (default: ${name}.kvd).
    #[arg(long, env = "ETCD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Path to a dedicated WAL directory (default: the data dir's member/wal).
    #[arg(long, env = "ETCD_WAL_DIR")]
    pub wal_dir: Option<PathBuf>,
    /// List of URLs to listen on for client traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_CLIENT_URLS",
        default_value = "http://127.0.0.1:2379"
    )]
    pub listen_client_urls: String,
    /// List of this member's client URLs to advertise to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_ADVERTISE_CLIENT_URLS",
        default_value = "http://127.0.0.1:2379"
    )]
    pub advertise_client_urls: String,
    /// List of URLs to listen on for peer traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_PEER_URLS",
        default_value = "http://127.0.0.1:2380"
    )]
    pub listen_peer_urls: String,
    /// List of this member's peer URLs to advertise to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://127.0.0.1:2380"
    )]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping: name=peerURL,...
    #[arg(long, env = "ETCD_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// Initial cluster state ('new' or 'existing').
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_STATE", default_value = "new")]
    pub initial_cluster_state: String,
    /// Initial cluster token for the cluster during bootstrap.
    #[arg(
        long,
        env = "ETCD_INITIAL_CLUSTER_TOKEN",
        default_value = "etcd-cluster"
    )]
    pub initial_cluster_token: String,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, env = "ETCD_HEARTBEAT_INTERVAL", default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, env = "ETCD_ELECTION_TIMEOUT", default_value_t = 1000)]
    pub election_timeout: u64,
    /// Number of committed transactions to trigger a snapshot to disk.
    #[arg(long, env = "ETCD_SNAPSHOT_COUNT", default_value_t = 100_000)]
    pub snapshot_count: u64,
    /// Number of entries a slow follower can catch up on after a snapshot (older entries are
    /// purged, so a follower further behind gets the snapshot).
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_SNAPSHOT_CATCHUP_ENTRIES",
        default_value_t = 5000
    )]
    pub experimental_snapshot_catchup_entries: u64,
    /// Maximum client request size in bytes the server will accept.
    #[arg(long, env = "ETCD_MAX_REQUEST_BYTES", default_value_t = 1572864)]
    pub max_request_bytes: usize,
    /// Maximum number of operations permitted in a transaction.
    #[arg(long, env = "ETCD_MAX_TXN_OPS", default_value_t = 128)]
    pub max_txn_ops: usize,
    /// Set level of detail for exported metrics: basic or extensive (adds the gRPC
    /// handling-time histogram, grpc_server_handling_seconds).
    #[arg(long, env = "ETCD_METRICS", default_value = "basic",
          value_parser = ["basic", "extensive"])]
    pub metrics: String,
    /// List of URLs to serve /metrics and /health on (plain HTTP); empty: off.
    #[arg(long, env = "ETCD_LISTEN_METRICS_URLS", default_value = "")]
    pub listen_metrics_urls: String,
    /// Log level: debug, info, warn, error (etcd's panic and fatal mean error).
    #[arg(long, env = "ETCD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Deprecated in etcd 3.5: debug-level logging (use --log-level=debug).
    #[arg(long, env = "ETCD_DEBUG", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub debug: bool,
    /// etcd's logger: capnslog (plain text lines, etcd 3.4's default) or zap (JSON lines).
    #[arg(long, env = "ETCD_LOGGER", default_value = "capnslog")]
    pub logger: String,
    /// The same choice by name: text (etcd 3.6: console) or json (wins over --logger).
    #[arg(long, env = "KVD_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Where logs go: default or stderr, or stdout (one of them; files are not supported).
    #[arg(long, env = "ETCD_LOG_OUTPUTS", default_value = "default")]
    pub log_outputs: String,
    /// Duration of periodic watch progress notifications (Go duration, e.g. 10m, 5s, 100ms).
    #[arg(long, env = "ETCD_WATCH_PROGRESS_NOTIFY_INTERVAL")]
    pub watch_progress_notify_interval: Option<String>,
    /// etcd 3.4/3.5 name of --watch-progress-notify-interval.
    #[arg(long, env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL")]
    pub experimental_watch_progress_notify_interval: Option<String>,
    /// Threads that serve clients and peers and run Raft (kvd only; etcd's GOMAXPROCS).
    /// 0: half the CPUs, at least one.
    #[arg(long, env = "KVD_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    // Quota, alarms and corruption checks
    /// Raise a NOSPACE alarm when the backend database would exceed this many bytes (0: etcd's
    /// default of 2 GiB; negative: no quota).
    #[arg(
        long,
        env = "ETCD_QUOTA_BACKEND_BYTES",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub quota_backend_bytes: i64,
    /// Compare this member's HashKV with its peers' before serving clients; refuse to start on
    /// a mismatch.
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub experimental_initial_corrupt_check: Option<bool>,
    /// Interval of the leader's corruption check pass (Go duration; 0: off).
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME",
        default_value = "0s"
    )]
    pub experimental_corrupt_check_time: String,
    // Compaction, defragment and force-new-cluster
    /// Interpret --auto-compaction-retention as 'periodic' (a duration) or 'revision' (a count).
    #[arg(long, env = "ETCD_AUTO_COMPACTION_MODE", default_value = "periodic")]
    pub auto_compaction_mode: String,
    /// Auto compaction retention: periodic mode a Go duration or a number of hours, revision
    /// mode a number of revisions; 0 disables auto compaction.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,
    /// Force to create a new one-member cluster from this member's data (quorum-loss recovery).
    #[arg(
        long,
        env = "ETCD_FORCE_NEW_CLUSTER",
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true"
    )]
    pub force_new_cluster: bool,

    // Memory budget
    /// Bytes of decoded pages the storage engine keeps in memory (kvd only; etcd's bbolt
    /// relies on the OS page cache). Pages beyond it are read back from the data files.
    #[arg(
        long,
        env = "KVD_EXPERIMENTAL_BACKEND_CACHE_BYTES",
        default_value_t = crate::mvcc::EngineOptions::DEFAULT_CACHE_BYTES
    )]
    pub experimental_backend_cache_bytes: u64,
    /// Bytes of the newest Raft log entries kept in memory (kvd only). Older entries, until
    /// the next snapshot purges them, are read back from the WAL when a lagging follower or a
    /// slow apply needs them.
    #[arg(
        long,
        env = "KVD_EXPERIMENTAL_RAFT_LOG_CACHE_BYTES",
        default_value_t = crate::raft::limits::LOG_CACHE_BYTES as u64
    )]
    pub experimental_raft_log_cache_bytes: u64,
    // Authentication
    /// Auth token kind: `simple`, or `jwt,pub-key=...,priv-key=...,sign-method=RS256[,ttl=5m]`.
    #[arg(long, env = "ETCD_AUTH_TOKEN", default_value = "simple")]
    pub auth_token: String,
    /// Lifetime of a simple token in seconds (renewed on each use).
    #[arg(long, env = "ETCD_AUTH_TOKEN_TTL", default_value_t = 300)]
    pub auth_token_ttl: u64,
    /// bcrypt cost of password hashes (4 to 31).
    #[arg(long, env = "ETCD_BCRYPT_COST", default_value_t = 10)]
    pub bcrypt_cost: u32,

    // TLS for clients and peers: see config_tls.rs.
    #[command(flatten)]
    pub tls: super::config::tls::TlsFlags,
    // kubeadm's etcd command line and etcd 3.6's names
    /// etcd 3.6's feature gates, Name=bool,... (InitialCorruptCheck is
    /// --experimental-initial-corrupt-check; etcd's other gates have no effect in kvd).
    #[arg(long, env = "ETCD_FEATURE_GATES", default_value = "")]
    pub feature_gates: String,
    /// etcd 3.6 name of --experimental-corrupt-check-time.
    #[arg(long, env = "ETCD_CORRUPT_CHECK_TIME")]
    pub corrupt_check_time: Option<String>,
    /// etcd 3.6 name of --experimental-snapshot-catchup-entries.
    #[arg(long, env = "ETCD_SNAPSHOT_CATCHUP_ENTRIES")]
    pub snapshot_catchup_entries: Option<u64>,
}

// kubeadm's etcd command line
/// kvd's whole command line: [`Flags`] and the etcd flags accepted without effect
/// ([`super::config::compat`]). Parse with this, then read [`Flags`] from the matches.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Flags::command().args(super::config::compat::args())
}

// Quota, alarms and corruption checks
/// etcd's default backend quota (`DefaultQuotaBytes`), used for `--quota-backend-bytes 0`.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Above this quota etcd warns that performance may degrade (`MaxQuotaBytes`).
pub const MAX_QUOTA_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// etcd's default watch progress notification interval.
pub const DEFAULT_WATCH_PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterState {
    New,
    Existing,
}

/// Validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub data_dir: PathBuf,
    /// `--wal-dir`: the WAL's directory when not the data dir's `member/wal`.
    pub wal_dir: Option<PathBuf>,
    pub listen_client: Vec<SocketAddr>,
    pub advertise_client_urls: Vec<String>,
    pub listen_peer: Vec<SocketAddr>,
    /// Where to serve `/metrics` and `/health`; empty when metrics are off.
    pub listen_metrics: Vec<SocketAddr>,
    /// `--metrics extensive`: record and serve `grpc_server_handling_seconds`.
    pub metrics_extensive: bool,
    pub advertise_peer_urls: Vec<String>,
    /// name -> peer URLs.
    pub initial_cluster: BTreeMap<String, Vec<String>>,
    pub initial_cluster_state: ClusterState,
    pub initial_cluster_token: String,
    pub heartbeat: Duration,
    pub election_timeout: Duration,
    pub snapshot_count: u64,
    pub snapshot_catchup_entries: u64,
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    pub log: LogConfig,
    pub watch_progress_notify_interval: Duration,
    /// Async worker threads (resolved: never 0). See [`default_worker_threads`].
    pub worker_threads: usize,
    // Quota, alarms and corruption checks
    /// The backend quota in bytes (0 resolved to etcd's 2 GiB default); `None`: no quota.
    pub quota_backend_bytes: Option<u64>,
    /// Check HashKV against the peers before serving clients.
    pub initial_corrupt_check: bool,
    /// Interval of the leader's periodic corruption check; zero: off.
    pub corrupt_check_time: Duration,
    /// Not a flag: where the WAL lives. Always the default (real files, fdatasync) from flags;
    /// in-process power-loss tests put a simulated file system here.
    pub wal: crate::wal::WalBackend,

    // Compaction, defragment and force-new-cluster
    /// `--auto-compaction-*`; `None` when the retention is 0 (off, etcd's default).
    pub auto_compaction: Option<AutoCompaction>,
    /// `--force-new-cluster`: start as the only voter of this member's cluster.
    pub force_new_cluster: bool,

    // TLS for clients and peers
    /// Certificates, versions and which listeners speak TLS.
    pub tls: super::config::tls::TlsConfig,
    // kubeadm's etcd command line
    /// Settings accepted without effect (etcd feature gates kvd does not have) or deprecated
    /// (`--debug`), one message each, for the binary to log once at start.
    pub without_effect: Vec<String>,
    // Memory budget
    /// How the storage engine is opened (`--experimental-backend-cache-bytes`).
    pub engine: crate::mvcc::EngineOptions,
    /// `--experimental-raft-log-cache-bytes`.
    pub raft_log_cache_bytes: usize,
    // Authentication
    pub auth: AuthConfig,
}

// Authentication
/// `--auth-token`, `--auth-token-ttl`, `--bcrypt-cost`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    pub token_ttl: Duration,
    pub bcrypt_cost: u32,
    /// `--auth-token jwt,...`: the JWT provider, its keys loaded and checked; `None` for
    /// simple tokens.
    pub jwt: Option<std::sync::Arc<crate::auth::token_jwt::JwtTokens>>,
}

impl AuthConfig {
    /// etcd's NewTokenProvider: `simple`, or `jwt` with its options (keys are read here, so
    /// a member with unusable keys does not start, as etcd's does not).
    fn parse(token: &str, ttl: u64, bcrypt_cost: u32) -> Result<AuthConfig, ConfigError> {
        let mut parts = token.split(',');
        let kind = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        let jwt = match kind {
            "simple" => None,
            "jwt" => {
                let parse_ttl =
                    |t: &str| parse_go_duration("auth-token ttl", t).map_err(|e| e.to_string());
                let t = crate::auth::token_jwt::JwtTokens::from_options(&rest, parse_ttl)
                    .map_err(|e| ConfigError(format!("--auth-token: {e}")))?;
                Some(std::sync::Arc::new(t))
            }
            _ => {
                return Err(ConfigError(format!(
                    "--auth-token: auth: invalid auth options (unknown token type {kind:?}, \
                     want simple or jwt)"
                )))
            }
        };
        // bcrypt's own bounds (etcd checks them too).
        if !(4..=31).contains(&bcrypt_cost) {
            return Err(ConfigError(format!(
                "--bcrypt-cost: {bcrypt_cost} is outside [4, 31]"
            )));
        }
        Ok(AuthConfig {
            token_ttl: Duration::from_secs(ttl.max(1)),
            bcrypt_cost,
            jwt,
        })
    }
}

// Compaction, defragment and force-new-cluster
/// What `--auto-compaction-mode` and `--auto-compaction-retention` ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep the history of the last `retention` (etcd's `periodic`).
    Periodic(Duration),
    /// Keep the last `retention` revisions, checked every 5 minutes (etcd's `revision`).
    Revision(i64),
}

impl AutoCompaction {
    /// etcd 3.4's parsing (`embed` and `v3compactor.New`): a non-negative integer is hours in
    /// periodic mode and revisions in revision mode; anything else must be a Go duration (in
    /// revision mode etcd then takes its nanoseconds as the revision count, and so does kvd).
    /// A zero retention turns auto compaction off.
    pub fn parse(mode: &str, retention: &str) -> Result<Option<AutoCompaction>, ConfigError> {
        let periodic = match mode {
            "periodic" => true,
            "revision" => false,
            m => return err(format!("unknown auto-compaction-mode {m:?}")),
        };
        let parsed = match retention.parse::<i64>() {
            Ok(n) if n >= 0 => {
                if periodic {
                    AutoCompaction::Periodic(Duration::from_secs(n as u64 * 3600))
                } else {
                    AutoCompaction::Revision(n)
                }
            }
            _ => {
                let d = parse_retention_duration(retention)?;
                if periodic {
                    AutoCompaction::Periodic(d)
                } else {
                    AutoCompaction::Revision(d.as_nanos().min(i64::MAX as u128) as i64)
                }
            }
        };
        Ok(match parsed {
            AutoCompaction::Periodic(d) if d.is_zero() => None,
            AutoCompaction::Revision(0) => None,
            a => Some(a),
        })
    }
}

/// A Go duration for `--auto-compaction-retention`, with Go's messages for a number without a
/// unit. Negative durations (Go accepts them, and etcd then compacts on every tick) are refused.
fn parse_retention_duration(s: &str) -> Result<Duration, ConfigError> {
    let bad = |why: &str| {
        ConfigError(format!(
            "error parsing CompactionRetention: time: {why} {s:?}"
        ))
    };
    let unsigned = s.strip_prefix(['-', '+']).unwrap_or(s);
    let number = unsigned.chars().all(|c| c.is_ascii_digit() || c == '.')
        && unsigned.chars().any(|c| c.is_ascii_digit());
    if number && unsigned != "0" {
        return Err(bad("missing unit in duration"));
    }
    if s.starts_with('-') {
        return if parse_go_duration("auto-compaction-retention", unsigned).is_ok() {
            Err(ConfigError(format!(
                "error parsing CompactionRetention: negative retention {s:?}"
            )))
        } else {
            Err(bad("invalid duration"))
        };
    }
    parse_go_duration("auto-compaction-retention", s).map_err(|_| bad("invalid duration"))
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (no colour unless the output is a terminal).
    Text,
    /// One JSON object per line with etcd's (zap's) keys: level, ts, caller, msg.
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOutput {
    Stderr,
    Stdout,
}

/// How the server logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// A tracing level: debug, info, warn or error.
    pub level: &'static str,
    pub format: LogFormat,
    pub output: LogOutput,
}

impl LogConfig {
    fn new(
        level: &str,
        logger: &str,
        format: Option<&str>,
        outputs: &str,
    ) -> Result<LogConfig, ConfigError> {
        let level = match level {
            "debug" => "debug",
            "info" => "info",
            "warn" => "warn",
            "error" | "dpanic" | "panic" | "fatal" => "error",
            l => return err(format!("--log-level: unknown level {l:?}")),
        };
        let format = match (format, logger) {
            // etcd 3.6's --log-format calls the text form "console".
            (Some("text" | "console"), _) | (None, "capnslog") => LogFormat::Text,
            (Some("json"), _) | (None, "zap") => LogFormat::Json,
            (Some(f), _) => {
                return err(format!(
                    "--log-format: expected text, console or json, got {f:?}"
                ))
            }
            (None, l) => return err(format!("--logger: expected capnslog or zap, got {l:?}")),
        };
        let output = match outputs {
            "default" | "stderr" => LogOutput::Stderr,
            "stdout" => LogOutput::Stdout,
            o => {
                return err(format!(
                    "--log-outputs: only one of default, stderr, stdout is supported, got {o:?}"
                ))
            }
        };
        Ok(LogConfig {
            level,
            format,
            output,
        })
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// `--initial-cluster` as name -> peer URLs, checked as etcd checks it: `name` is listed
/// with exactly `advertise_peer_urls`, and no peer URL is listed twice. Unset, it is the
/// member alone.
pub fn parse_initial_cluster(
    name: &str,
    initial_cluster: Option<&str>,
    advertise_peer_urls: &[String],
) -> Result<BTreeMap<String, Vec<String>>, ConfigError> {
    let ic = initial_cluster.map(str::to_string).unwrap_or_else(|| {
        format!(
            "{}={}",
            name,
            advertise_peer_urls.join(&format!(",{}=", name))
        )
    });
    let mut initial_cluster: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for part in ic.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (n, u) = part.split_once('=').ok_or_else(|| {
            ConfigError(format!("--initial-cluster: {part:?} is not name=peerURL"))
        })?;
        url_addr("initial-cluster", u)?;
        initial_cluster
            .entry(n.to_string())
            .or_default()
            .push(u.to_string());
    }
    let Some(mine) = initial_cluster.get(name) else {
        return err(format!(
            "couldn't find local name {:?} in the initial cluster configuration",
            name
        ));
    };
    let (mut a, mut b) = (mine.clone(), advertise_peer_urls.to_vec());
    a.sort();
    b.sort();
    if a != b {
        return err(format!(
            "--initial-cluster has {}={} but missing from --initial-advertise-peer-urls={} (\"{}\"(resolved from {:?}) != \"{}\"(resolved from {:?}))",
            name,
            mine.join(","),
            advertise_peer_urls.join(","),
            b.join(","),
            advertise_peer_urls,
            a.join(","),
            mine
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for u in initial_cluster.values().flatten() {
        if !seen.insert(u) {
            return err(format!("--initial-cluster: peer URL {u} is listed twice"));
        }
    }
    Ok(initial_cluster)
}

pub(crate) fn split_urls(flag: &str, s: &str) -> Result<Vec<String>, ConfigError> {
    let v: Vec<String> = s
        .split(',')
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .collect();
    if v.is_empty() {
        return err(format!("--{flag} must not be empty"));
    }
    for u in &v {
        url_addr(flag, u)?;
    }
    Ok(v)
}

/// host:port of an http(s) URL (etcd accepts `http://host:port` and `https://host:port`;
/// whether TLS is configured for an https URL is checked in config_tls.rs). The metrics
/// listener is plain HTTP only.
fn url_addr(flag: &str, u: &str) -> Result<String, ConfigError> {
    let parsed =
        url::Url::parse(u).map_err(|e| ConfigError(format!("--{flag}: invalid URL {u:?}: {e}")))?;
    match parsed.scheme() {
        "http" => {}
        "https" if flag != "listen-metrics-urls" => {}
        "https" | "unixs" => return err(format!("--{flag}: {u:?}: TLS is not supported")),
        s => {
            return err(format!(
                "--{flag}: URL scheme must be http, got {s:?} in {u:?}"
            ))
        }
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| ConfigError(format!("--{flag}: {u:?} has no host")))?;
    let port = parsed
        .port()
        .ok_or_else(|| ConfigError(format!("--{flag}: {u:?} has no port")))?;
    Ok(format!("{host}:{port}"))
}

fn resolve(flag: &str, u: &str) -> Result<SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs;
    let hp = url_addr(flag, u)?;
    hp.to_socket_addrs()
        .map_err(|e| ConfigError(format!("--{flag}: cannot resolve {hp}: {e}")))?
        .next()
        .ok_or_else(|| ConfigError(format!("--{flag}: cannot resolve {hp}")))
}

impl Flags {
    pub fn validate(self) -> Result<Config, ConfigError> {
        self.check_name_and_request_size()?;
        let data_dir = self
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("{}.kvd", self.name)));
        let urls = self.urls()?;
        let (initial_cluster_state, initial_cluster) = self.cluster(&urls.advertise_peer)?;
        // TLS for clients and peers
        let tls = self.tls.validate(
            &urls.listen_client,
            &urls.listen_peer,
            &initial_cluster
                .values()
                .flatten()
                .chain(&urls.advertise_peer)
                .cloned()
                .collect::<Vec<_>>(),
        )?;
        self.check_raft_timing_and_txn_ops()?;
        let watch_progress_notify_interval = self.watch_progress_notify_interval()?;
        let (gates, initial_corrupt_check, corrupt_check_time) = self.corruption_checks()?;
        self.check_memory_budget()?;
        let log = self.log_config()?;
        let without_effect = self.without_effect(gates.without_effect);
        Ok(Config {
            name: self.name,
            data_dir,
            // etcd treats an empty --wal-dir as not given.
            wal_dir: self.wal_dir.filter(|d| !d.as_os_str().is_empty()),
            listen_client: urls.listen_client_addrs,
            advertise_client_urls: urls.advertise_client,
            listen_peer: urls.listen_peer_addrs,
            listen_metrics: urls.listen_metrics_addrs,
            metrics_extensive: self.metrics == "extensive",
            advertise_peer_urls: urls.advertise_peer,
            initial_cluster,
            initial_cluster_state,
            initial_cluster_token: self.initial_cluster_token,
            heartbeat: Duration::from_millis(self.heartbeat_interval),
            election_timeout: Duration::from_millis(self.election_timeout),
            snapshot_count: self.snapshot_count,
            snapshot_catchup_entries: self
                .snapshot_catchup_entries
                .unwrap_or(self.experimental_snapshot_catchup_entries),
            max_request_bytes: self.max_request_bytes,
            max_txn_ops: self.max_txn_ops,
            log,
            watch_progress_notify_interval,
            worker_threads: match self.worker_threads {
                0 => default_worker_threads(),
                n => n,
            },
            // Quota, alarms and corruption checks
            quota_backend_bytes: match self.quota_backend_bytes {
                q if q < 0 => None,
                0 => Some(DEFAULT_QUOTA_BYTES),
                q => Some(q as u64),
            },
            initial_corrupt_check,
            corrupt_check_time,
            wal: Default::default(),
            // Compaction, defragment and force-new-cluster
            auto_compaction: AutoCompaction::parse(
                &self.auto_compaction_mode,
                &self.auto_compaction_retention,
            )?,
            force_new_cluster: self.force_new_cluster,
            tls,
            without_effect,
            // Memory budget
            engine: crate::mvcc::EngineOptions {
                cache_bytes: self.experimental_backend_cache_bytes,
            },
            raft_log_cache_bytes: usize::try_from(self.experimental_raft_log_cache_bytes)
                .unwrap_or(usize::MAX),
            // Authentication
            auth: AuthConfig::parse(&self.auth_token, self.auth_token_ttl, self.bcrypt_cost)?,
        })
    }

    /// Refuses an empty member name and a request size no WAL record or peer message can hold.
    fn check_name_and_request_size(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return err("--name must not be empty");
        }
        let max_req = crate::raft::limits::MAX_REQUEST_BYTES;
        if self.max_request_bytes > max_req {
            return err(format!(
                "--max-request-bytes {} is above the maximum {max_req}: one request must fit \
                 in a WAL record and a peer message",
                self.max_request_bytes
            ));
        }
        Ok(())
    }

    /// The listen and advertise URLs, and the addresses the listeners bind.
    fn urls(&self) -> Result<Urls, ConfigError> {
        let listen_client = split_urls("listen-client-urls", &self.listen_client_urls)?;
        let listen_peer = split_urls("listen-peer-urls", &self.listen_peer_urls)?;
        let listen_client_addrs = listen_client
            .iter()
            .map(|u| resolve("listen-client-urls", u))
            .collect::<Result<_, _>>()?;
        let listen_peer_addrs = listen_peer
            .iter()
            .map(|u| resolve("listen-peer-urls", u))
            .collect::<Result<_, _>>()?;
        let listen_metrics_addrs = if self.listen_metrics_urls.trim().is_empty() {
            Vec::new()
        } else {
            // kubeadm's etcd command line: kubeadm's metrics URL is plain http.
            if let Some(u) = self
                .listen_metrics_urls
                .split(',')
                .map(str::trim)
                .find(|u| u.starts_with("https://"))
            {
                return err(format!(
                    "--listen-metrics-urls: {u:?}: https is not supported for the metrics \
                     listener; use an http:// URL (kubeadm's manifest does)"
                ));
            }
            split_urls("listen-metrics-urls", &self.listen_metrics_urls)?
                .iter()
                .map(|u| resolve("listen-metrics-urls", u))
                .collect::<Result<_, _>>()?
        };
        let advertise_client = split_urls("advertise-client-urls", &self.advertise_client_urls)?;
        let advertise_peer = split_urls(
            "initial-advertise-peer-urls",
            &self.initial_advertise_peer_urls,
        )?;
        Ok(Urls {
            listen_client,
            listen_peer,
            listen_client_addrs,
            listen_peer_addrs,
            listen_metrics_addrs,
            advertise_client,
            advertise_peer,
        })
    }

    /// Whether the member starts a new cluster or joins one, and the initial members' URLs.
    fn cluster(
        &self,
        advertise_peer_urls: &[String],
    ) -> Result<(ClusterState, BTreeMap<String, Vec<String>>), ConfigError> {
        let initial_cluster_state = match self.initial_cluster_state.as_str() {
            "new" => ClusterState::New,
            "existing" => ClusterState::Existing,
            s => {
                return err(format!(
                    "--initial-cluster-state must be 'new' or 'existing', got {s:?}"
                ))
            }
        };
        let initial_cluster = parse_initial_cluster(
            &self.name,
            self.initial_cluster.as_deref(),
            advertise_peer_urls,
        )?;
        Ok((initial_cluster_state, initial_cluster))
    }

    /// Refuses an election timeout Raft cannot keep stable and a zero txn-ops limit.
    fn check_raft_timing_and_txn_ops(&self) -> Result<(), ConfigError> {
        if self.heartbeat_interval == 0 || self.election_timeout < 5 * self.heartbeat_interval {
            return err(format!(
                "--election-timeout[{}ms] should be at least 5 times as --heartbeat-interval[{}ms]",
                self.election_timeout, self.heartbeat_interval
            ));
        }
        if self.max_txn_ops == 0 {
            return err("--max-txn-ops must be positive");
        }
        Ok(())
    }

    /// How often idle watchers get a progress notification, from the flag or its old name.
    fn watch_progress_notify_interval(&self) -> Result<Duration, ConfigError> {
        let interval = match (
            &self.watch_progress_notify_interval,
            &self.experimental_watch_progress_notify_interval,
        ) {
            (Some(s), _) => parse_go_duration("watch-progress-notify-interval", s)?,
            (None, Some(s)) => parse_go_duration("experimental-watch-progress-notify-interval", s)?,
            (None, None) => DEFAULT_WATCH_PROGRESS_NOTIFY_INTERVAL,
        };
        if interval.is_zero() {
            return err("--watch-progress-notify-interval must be positive");
        }
        Ok(interval)
    }

    /// The feature gates, and the corruption checks they and the flags ask for.
    fn corruption_checks(&self) -> Result<(gates::Gates, bool, Duration), ConfigError> {
        // kubeadm's etcd command line
        let gates = super::config::gates::parse(&self.feature_gates)?;
        let initial_corrupt_check = match (
            self.experimental_initial_corrupt_check,
            gates.initial_corrupt_check,
        ) {
            (Some(flag), Some(gate)) => {
                return err(format!(
                    "cannot specify both flags: --experimental-initial-corrupt-check={flag} and \
                     --feature-gates=InitialCorruptCheck={gate} at the same time, please just \
                     use --feature-gates=InitialCorruptCheck={gate}"
                ))
            }
            (Some(b), None) | (None, Some(b)) => b,
            (None, None) => false,
        };
        let corrupt_check_time = match &self.corrupt_check_time {
            Some(s) => parse_go_duration("corrupt-check-time", s)?,
            None => parse_go_duration(
                "experimental-corrupt-check-time",
                &self.experimental_corrupt_check_time,
            )?,
        };
        Ok((gates, initial_corrupt_check, corrupt_check_time))
    }

    /// Refuses a storage engine cache below the engine's minimum.
    fn check_memory_budget(&self) -> Result<(), ConfigError> {
        if self.experimental_backend_cache_bytes < crate::mvcc::EngineOptions::MIN_CACHE_BYTES {
            return err(format!(
                "--experimental-backend-cache-bytes must be at least {}",
                crate::mvcc::EngineOptions::MIN_CACHE_BYTES
            ));
        }
        Ok(())
    }

    /// The logger's level, format and outputs.
    fn log_config(&self) -> Result<LogConfig, ConfigError> {
        LogConfig::new(
            // etcd 3.4's capnslog logs at debug level with --debug, whatever --log-level.
            if self.debug { "debug" } else { &self.log_level },
            &self.logger,
            self.log_format.as_deref(),
            &self.log_outputs,
        )
    }

    /// The warnings for accepted flags and gates that change nothing.
    fn without_effect(&self, mut gates_without_effect: Vec<String>) -> Vec<String> {
        if self.debug {
            gates_without_effect.push(
                "--debug is deprecated (etcd 3.5 removed it): use --log-level=debug".to_string(),
            );
        }
        gates_without_effect
    }
}

/// The URL flags, split, with the addresses the listeners bind.
struct Urls {
    listen_client: Vec<String>,
    listen_peer: Vec<String>,
    listen_client_addrs: Vec<SocketAddr>,
    listen_peer_addrs: Vec<SocketAddr>,
    listen_metrics_addrs: Vec<SocketAddr>,
    advertise_client: Vec<String>,
    advertise_peer: Vec<String>,
}

/// Half the CPUs, at least one. The async workers are not all of kvd's threads: the WAL
/// flusher, the MVCC committer and sled's IO threads do the disk work beside them, and each
/// hand-off between two busy workers costs a wake-up on the write path (measurements in
/// docs/decisions/0007-worker-threads-half-the-cpus.md).
pub fn default_worker_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus / 2).max(1)
}

/// Parses a Go `time.Duration` ("10m", "1.5s", "100ms", "1h30m"); `flag` names it in errors.
pub fn parse_go_duration(flag: &str, s: &str) -> Result<Duration, ConfigError> {
    let bad = || ConfigError(format!("--{flag}: time: invalid duration {s:?}"));
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut nanos = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let num: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ns" => 1.0,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        nanos += num * unit;
        rest = &rest[u..];
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

/// etcd's member id: the first 8 bytes (big-endian) of sha1(sorted peer URLs ++ token [++ time]).
pub fn compute_member_id(peer_urls: &[String], token: &str, now_unix: Option<u64>) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let mut b = urls.concat().into_bytes();
    b.extend_from_slice(token.as_bytes());
    if let Some(t) = now_unix {
        b.extend_from_slice(&t.to_be_bytes());
    }
    let h = sha1_smol::Sha1::from(&b).digest().bytes();
    u64::from_be_bytes(h[..8].try_into().unwrap())
}

/// etcd's cluster id: the first 8 bytes of sha1 over the sorted member ids (big-endian each).
pub fn compute_cluster_id(member_ids: &[u64]) -> u64 {
    let mut ids = member_ids.to_vec();
    ids.sort();
    let mut b = Vec::with_capacity(ids.len() * 8);
    for id in ids {
        b.extend_from_slice(&id.to_be_bytes());
    }
    let h = sha1_smol::Sha1::from(&b).digest().bytes();
    u64::from_be_bytes(h[..8].try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Result<Config, String> {
        let mut v = vec!["kvd"];
        v.extend_from_slice(args);
        Flags::try_parse_from(v)
            .map_err(|e| e.to_string())?
            .validate()
            .map_err(|e| e.0)
    }

    #[test]
    fn auto_compaction_flags_parse_as_etcd_3_4() {
        use AutoCompaction::*;
        let ac = |a: &[&str]| flags(a).map(|c| c.auto_compaction);
        assert_eq!(ac(&[]), Ok(None));
        assert_eq!(
            ac(&["--auto-compaction-retention", "1"]),
            Ok(Some(Periodic(Duration::from_secs(3600))))
        );
        assert_eq!(
            ac(&["--auto-compaction-retention=2s"]),
            Ok(Some(Periodic(Duration::from_secs(2))))
        );
        assert_eq!(
            ac(&["--auto-compaction-retention=90m"]),
            Ok(Some(Periodic(Duration::from_secs(5400))))
        );
        assert_eq!(
            ac(&[
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=1000"
            ]),
            Ok(Some(Revision(1000)))
        );
        assert_eq!(
            ac(&[
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=1ms"
            ]),
            Ok(Some(Revision(1_000_000)))
        );
        assert_eq!(ac(&["--auto-compaction-retention=0"]), Ok(None));
        assert_eq!(ac(&["--auto-compaction-retention=0s"]), Ok(None));
        assert_eq!(
            ac(&[
                "--auto-compaction-mode=foo",
                "--auto-compaction-retention=1"
            ]),
            Err("unknown auto-compaction-mode \"foo\"".into())
        );
        assert_eq!(
            ac(&["--auto-compaction-retention=abc"]),
            Err("error parsing CompactionRetention: time: invalid duration \"abc\"".into())
        );
        assert_eq!(
            ac(&["--auto-compaction-retention=-1"]),
            Err("error parsing CompactionRetention: time: missing unit in duration \"-1\"".into())
        );
        assert_eq!(
            ac(&[
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=1.5"
            ]),
            Err("error parsing CompactionRetention: time: missing unit in duration \"1.5\"".into())
        );
    }

    #[test]
    fn force_new_cluster_takes_go_bool_forms() {
        assert!(!flags(&[]).unwrap().force_new_cluster);
        assert!(flags(&["--force-new-cluster"]).unwrap().force_new_cluster);
        assert!(
            flags(&["--force-new-cluster=true"])
                .unwrap()
                .force_new_cluster
        );
        assert!(
            !flags(&["--force-new-cluster=false"])
                .unwrap()
                .force_new_cluster
        );
    }

    #[test]
    fn defaults_are_a_single_member_on_loopback() {
        let c = flags(&[]).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("default.kvd"));
        assert_eq!(c.listen_client, vec!["127.0.0.1:2379".parse().unwrap()]);
        assert_eq!(c.initial_cluster.len(), 1);
        assert_eq!(c.initial_cluster_state, ClusterState::New);
        assert!(c.listen_metrics.is_empty());
    }

    #[test]
    fn log_flags_follow_etcd() {
        let c = flags(&[]).unwrap();
        assert_eq!(
            c.log,
            LogConfig {
                level: "info",
                format: LogFormat::Text,
                output: LogOutput::Stderr
            }
        );
        let c = flags(&["--logger=zap", "--log-level=warn", "--log-outputs=stdout"]).unwrap();
        assert_eq!((c.log.format, c.log.level), (LogFormat::Json, "warn"));
        assert_eq!(c.log.output, LogOutput::Stdout);
        let c = flags(&["--logger=zap", "--log-format=text", "--log-level=fatal"]).unwrap();
        assert_eq!((c.log.format, c.log.level), (LogFormat::Text, "error"));
        assert!(flags(&["--log-level=loud"]).is_err());
        assert!(flags(&["--logger=glog"]).is_err());
        assert!(flags(&["--log-outputs=/var/log/kvd.log"]).is_err());
        // etcd 3.6's name for the text form, and etcd 3.4's deprecated --debug.
        let c = flags(&["--logger=zap", "--log-format=console"]).unwrap();
        assert_eq!(c.log.format, LogFormat::Text);
        let c = flags(&["--debug", "--log-level=warn"]).unwrap();
        assert_eq!(c.log.level, "debug");
        assert!(c.without_effect[0].contains("--debug is deprecated"));
    }

    // Quota, alarms and corruption checks
    #[test]
    fn quota_and_corruption_check_flags_follow_etcd() {
        let c = flags(&[]).unwrap();
        assert_eq!(c.quota_backend_bytes, Some(DEFAULT_QUOTA_BYTES));
        assert!(!c.initial_corrupt_check);
        assert!(c.corrupt_check_time.is_zero());
        let c = flags(&["--quota-backend-bytes", "-1"]).unwrap();
        assert_eq!(c.quota_backend_bytes, None);
        let c = flags(&[
            "--quota-backend-bytes=1048576",
            "--experimental-initial-corrupt-check",
            "--experimental-corrupt-check-time=2m",
        ])
        .unwrap();
        assert_eq!(c.quota_backend_bytes, Some(1 << 20));
        assert!(c.initial_corrupt_check);
        assert_eq!(c.corrupt_check_time, Duration::from_secs(120));
        let c = flags(&["--experimental-initial-corrupt-check=false"]).unwrap();
        assert!(!c.initial_corrupt_check);
        assert!(flags(&["--experimental-corrupt-check-time=often"]).is_err());
    }

    #[test]
    fn metrics_urls_are_parsed_like_client_urls() {
        let c = flags(&["--listen-metrics-urls", "http://127.0.0.1:2381"]).unwrap();
        assert_eq!(c.listen_metrics, vec!["127.0.0.1:2381".parse().unwrap()]);
        let e = flags(&["--listen-metrics-urls", "https://127.0.0.1:2381"]).unwrap_err();
        assert!(
            e.contains("https is not supported for the metrics listener"),
            "{e}"
        );
    }

    // kubeadm's etcd command line
    #[test]
    fn kubeadm_and_etcd_3_6_names_are_honoured() {
        let c = flags(&["--feature-gates=InitialCorruptCheck=true"]).unwrap();
        assert!(c.initial_corrupt_check);
        assert!(c.without_effect.is_empty());
        let c = flags(&["--corrupt-check-time=3m", "--snapshot-catchup-entries=7"]).unwrap();
        assert_eq!(c.corrupt_check_time, Duration::from_secs(180));
        assert_eq!(c.snapshot_catchup_entries, 7);
        let c = flags(&["--snapshot-count=10000"]).unwrap();
        assert_eq!(c.snapshot_count, 10000);
        let e = flags(&[
            "--experimental-initial-corrupt-check=true",
            "--feature-gates=InitialCorruptCheck=false",
        ])
        .unwrap_err();
        assert_eq!(
            e,
            "cannot specify both flags: --experimental-initial-corrupt-check=true and \
             --feature-gates=InitialCorruptCheck=false at the same time, please just use \
             --feature-gates=InitialCorruptCheck=false"
        );
        let c = flags(&["--feature-gates=StopGRPCServiceOnDefrag=true"]).unwrap();
        assert_eq!(c.without_effect.len(), 1);
        assert!(c.without_effect[0].contains("StopGRPCServiceOnDefrag"));
        assert!(flags(&["--feature-gates=NoSuchGate=true"]).is_err());
    }

    #[test]
    fn the_whole_command_line_takes_the_flags_kvd_ignores() {
        use clap::FromArgMatches;
        let m = command()
            .try_get_matches_from(["kvd", "--name=n", "--max-snapshots=5"])
            .unwrap();
        assert_eq!(Flags::from_arg_matches(&m).unwrap().name, "n");
        // (Another test sets an ignored flag's variable for a moment: look for this one.)
        let given = crate::server::config::compat::given(&m);
        assert!(
            given.iter().any(|g| g.given == "--max-snapshots=5"),
            "{given:?}"
        );
    }

    #[test]
    fn max_request_bytes_is_bounded_by_what_the_wal_and_peers_carry() {
        let max = crate::raft::limits::MAX_REQUEST_BYTES;
        let c = flags(&["--max-request-bytes", &max.to_string()]).unwrap();
        assert_eq!(c.max_request_bytes, max);
        let e = flags(&["--max-request-bytes", &(max + 1).to_string()]).unwrap_err();
        assert!(
            e.contains("--max-request-bytes") && e.contains("maximum"),
            "{e}"
        );
        // A limit above the WAL's record limit would let a request that no WAL record can
        // hold into the log (docs/decisions/0009-request-size-bounded-at-start.md).
        assert!(flags(&["--max-request-bytes", "200000000"]).is_err());
    }

    #[test]
    fn name_missing_from_initial_cluster_is_one_line_error() {
        let e = flags(&["--name", "x", "--initial-cluster", "a=http://127.0.0.1:1"]).unwrap_err();
        assert!(e.contains("couldn't find local name"), "{e}");
    }

    #[test]
    fn bad_cluster_state_and_urls_are_refused() {
        assert!(flags(&["--initial-cluster-state", "old"])
            .unwrap_err()
            .contains("'new' or 'existing'"));
        assert!(flags(&["--listen-client-urls", "127.0.0.1:2379"]).is_err());
        assert!(flags(&["--election-timeout", "100"])
            .unwrap_err()
            .contains("5 times"));
        assert!(flags(&["--no-such-flag"]).is_err());
    }

    #[test]
    fn watch_progress_interval_takes_go_durations_from_either_flag() {
        assert_eq!(
            flags(&[]).unwrap().watch_progress_notify_interval,
            Duration::from_secs(600)
        );
        let c = flags(&["--experimental-watch-progress-notify-interval=100ms"]).unwrap();
        assert_eq!(c.watch_progress_notify_interval, Duration::from_millis(100));
        let c = flags(&[
            "--watch-progress-notify-interval=1m30s",
            "--experimental-watch-progress-notify-interval=5s",
        ])
        .unwrap();
        assert_eq!(c.watch_progress_notify_interval, Duration::from_secs(90));
        assert!(flags(&["--watch-progress-notify-interval=10"])
            .unwrap_err()
            .contains("invalid duration"));
        assert!(flags(&["--watch-progress-notify-interval=0"]).is_err());
    }

    #[test]
    fn worker_threads_default_to_half_the_cpus() {
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert_eq!(flags(&[]).unwrap().worker_threads, (cpus / 2).max(1));
        assert_eq!(
            flags(&["--worker-threads=0"]).unwrap().worker_threads,
            (cpus / 2).max(1)
        );
        assert_eq!(flags(&["--worker-threads=3"]).unwrap().worker_threads, 3);
        assert!(flags(&["--worker-threads=-1"]).is_err());
    }

    #[test]
    fn member_ids_are_stable_and_distinct() {
        let a = compute_member_id(&["http://127.0.0.1:2380".into()], "etcd-cluster", None);
        let b = compute_member_id(&["http://127.0.0.1:2381".into()], "etcd-cluster", None);
        assert_ne!(a, b);
        assert_eq!(
            a,
            compute_member_id(&["http://127.0.0.1:2380".into()], "etcd-cluster", None)
        );
        assert_eq!(compute_cluster_id(&[a, b]), compute_cluster_id(&[b, a]));
    }

    // Memory budget
    #[test]
    fn backend_cache_bytes_is_bounded_and_validated() {
        let c = flags(&[]).unwrap();
        assert_eq!(c.engine, crate::mvcc::EngineOptions::default());
        assert_eq!(c.engine.cache_bytes, 64 << 20);
        let c = flags(&["--experimental-backend-cache-bytes=1048576"]).unwrap();
        assert_eq!(c.engine.cache_bytes, 1 << 20);
        // Below the minimum: refused at start, not a panic inside the engine.
        assert!(flags(&["--experimental-backend-cache-bytes=255"]).is_err());
        assert_eq!(c.raft_log_cache_bytes, crate::raft::limits::LOG_CACHE_BYTES);
        let c = flags(&["--experimental-raft-log-cache-bytes=0"]).unwrap();
        assert_eq!(c.raft_log_cache_bytes, 0);
        assert!(flags(&["--experimental-backend-cache-bytes=-1"]).is_err());
    }
}
