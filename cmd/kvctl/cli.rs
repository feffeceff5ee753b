//! Command line definitions. Flag names, defaults and environment variables follow etcdctl 3.4.
use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Parses a boolean the way Go's `strconv.ParseBool` does (cobra/pflag bool flags).
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "strconv.ParseBool: parsing {}: invalid syntax",
            crate::gofmt::quote(s.as_bytes())
        )),
    }
}

/// Parses an integer flag with Go's `strconv.ParseInt` error text.
pub fn parse_go_int(s: &str) -> Result<i64, String> {
    s.parse::<i64>().map_err(|e| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                "value out of range"
            }
            _ => "invalid syntax",
        };
        format!(
            "strconv.ParseInt: parsing {}: {why}",
            crate::gofmt::quote(s.as_bytes())
        )
    })
}

/// Parses a Go `time.Duration` string such as `5s`, `1.5s`, `500ms` or `1m30s`.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let err = || {
        format!(
            "time: invalid duration {}",
            crate::gofmt::quote(s.as_bytes())
        )
    };
    let mut rest = s;
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() || rest.starts_with('-') {
        return Err(err());
    }
    rest = rest.strip_prefix('+').unwrap_or(rest);
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if num_len == 0 {
            return Err(err());
        }
        let num: f64 = rest[..num_len].parse().map_err(|_| err())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += num * mult;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

#[derive(Parser, Debug)]
#[command(
    name = "kvctl",
    about = "A simple command line client for kvd (etcdctl 3.4 compatible)",
    disable_version_flag = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone)]
pub struct GlobalArgs {
    /// gRPC endpoints
    #[arg(
        long,
        global = true,
        env = "ETCDCTL_ENDPOINTS",
        default_value = "127.0.0.1:2379",
        value_delimiter = ','
    )]
    pub endpoints: Vec<String>,
    /// dial timeout for client connections
    #[arg(long, global = true, env = "ETCDCTL_DIAL_TIMEOUT", default_value = "2s", value_parser = parse_go_duration)]
    pub dial_timeout: Duration,
    /// timeout for short running command (excluding dial timeout)
    #[arg(long, global = true, env = "ETCDCTL_COMMAND_TIMEOUT", default_value = "5s", value_parser = parse_go_duration)]
    pub command_timeout: Duration,
    /// keepalive time for client connections (accepted for compatibility)
    #[arg(long, global = true, env = "ETCDCTL_KEEPALIVE_TIME", default_value = "2s", value_parser = parse_go_duration)]
    pub keepalive_time: Duration,
    /// keepalive timeout for client connections (accepted for compatibility)
    #[arg(long, global = true, env = "ETCDCTL_KEEPALIVE_TIMEOUT", default_value = "6s", value_parser = parse_go_duration)]
    pub keepalive_timeout: Duration,
    /// set the output format (fields, json, simple, table)
    #[arg(
        short = 'w',
        long,
        global = true,
        env = "ETCDCTL_WRITE_OUT",
        default_value = "simple"
    )]
    pub write_out: String,
    /// print byte strings as hex encoded strings
    #[arg(long, global = true, env = "ETCDCTL_HEX", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub hex: bool,
    /// enable client-side debug logging (accepted, no effect)
    #[arg(long, global = true, env = "ETCDCTL_DEBUG", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub debug: bool,
    /// disable transport security for client connections
    #[arg(long, global = true, env = "ETCDCTL_INSECURE_TRANSPORT", num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub insecure_transport: bool,
    /// skip server certificate verification (CAUTION: this option should be enabled only for
    /// testing purposes)
    #[arg(long, global = true, env = "ETCDCTL_INSECURE_SKIP_TLS_VERIFY", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub insecure_skip_tls_verify: bool,
    /// verify certificates of TLS-enabled secure servers using this CA bundle
    #[arg(long, global = true, env = "ETCDCTL_CACERT", default_value = "")]
    pub cacert: String,
    /// identify secure client using this TLS certificate file
    #[arg(long, global = true, env = "ETCDCTL_CERT", default_value = "")]
    pub cert: String,
    /// identify secure client using this TLS key file
    #[arg(long, global = true, env = "ETCDCTL_KEY", default_value = "")]
    pub key: String,
    /// username[:password] for authentication (prompt if password is not supplied)
    #[arg(long, global = true, env = "ETCDCTL_USER", default_value = "")]
    pub user: String,
    /// password for authentication (if this option is used, --user option shouldn't include
    /// password)
    #[arg(long, global = true, env = "ETCDCTL_PASSWORD", default_value = "")]
    pub password: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Puts the given key into the store
    Put(PutArgs),
    /// Gets the key or a range of keys
    Get(GetArgs),
    /// Removes the specified key or range of keys [key, range_end)
    Del(DelArgs),
    /// Txn processes all the requests in one transaction
    Txn(TxnArgs),
    /// Compacts the event history in etcd
    Compaction(CompactionArgs),
    /// Defragments the storage of the etcd members with given endpoints
    Defrag(DefragArgs),
    /// Endpoint related commands
    Endpoint(EndpointArgs),
    /// Alarm related commands
    Alarm(AlarmArgs),
    /// Membership related commands
    Member(MemberArgs),
    /// Watches events stream on keys or prefixes
    Watch(WatchArgs),
    /// Lease related commands
    Lease(LeaseArgs),
    /// Transfers leadership to another etcd cluster member.
    MoveLeader(MoveLeaderArgs),
    /// Manages etcd node snapshots
    Snapshot(SnapshotArgs),
    /// Acquires a named lock
    Lock(LockArgs),
    /// Observes and participates in leader election
    Elect(ElectArgs),
    /// commands for checking properties of the etcd cluster
    Check(CheckArgs),
    /// Enable or disable authentication
    Auth(AuthArgs),
    /// User related commands
    User(UserArgs),
    /// Role related commands
    Role(RoleArgs),
    /// Makes a mirror at the destination etcd cluster
    MakeMirror(MakeMirrorArgs),
    /// Prints the version of etcdctl
    Version(VersionArgs),
}

#[derive(Args, Debug, Clone)]
pub struct VersionArgs {
    /// also print the kvd release this kvctl belongs to (a line etcdctl does not have)
    #[arg(long)]
    pub kvd: bool,
}

#[derive(Args, Debug, Clone)]
pub struct MakeMirrorArgs {
    /// <destination>
    pub destination: Vec<String>,
    /// Key-value prefix to mirror
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Specify the kv revision to start to mirror (etcdctl 3.6; 0: copy the keys first)
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = parse_go_int)]
    pub rev: i64,
    /// Maximum number of operations permitted in a transaction during syncing updates
    #[arg(long, default_value_t = 128)]
    pub max_txn_ops: u32,
    /// destination prefix to mirror a prefix to a different prefix in the destination cluster
    #[arg(long, default_value = "")]
    pub dest_prefix: String,
    /// mirror key-values to the root of the destination cluster
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub no_dest_prefix: bool,
    /// Identify secure client using this TLS certificate file for the destination cluster
    #[arg(long, default_value = "")]
    pub dest_cert: String,
    /// Identify secure client using this TLS key file
    #[arg(long, default_value = "")]
    pub dest_key: String,
    /// Verify certificates of TLS enabled secure servers using this CA bundle
    #[arg(long, default_value = "")]
    pub dest_cacert: String,
    /// Disable transport security for client connections
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub dest_insecure_transport: bool,
    /// Destination username[:password] for authentication (prompt if password is not supplied)
    #[arg(long, default_value = "")]
    pub dest_user: String,
    /// Destination password for authentication (if this option is used, --user option shouldn't include password)
    #[arg(long, default_value = "")]
    pub dest_password: String,
}

#[derive(Args, Debug)]
pub struct AuthArgs {
    #[command(subcommand)]
    pub command: AuthCommand,
}

/// `auth` subcommands of etcdctl 3.4.23 (`auth status` came with 3.5).
#[derive(Subcommand, Debug)]
pub enum AuthCommand {
    /// Enables authentication
    Enable(NoArgs),
    /// Disables authentication
    Disable(NoArgs),
}

/// Positional arguments of a command that takes none (etcdctl checks their count itself).
#[derive(Args, Debug, Clone, Default)]
pub struct NoArgs {
    pub args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct UserArgs {
    #[command(subcommand)]
    pub command: UserCommand,
}

/// `user` subcommands, with etcdctl 3.4's arguments (counted by the commands, for etcdctl's
/// messages).
#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Adds a new user
    Add(UserAddArgs),
    /// Deletes a user
    Delete(NoArgs),
    /// Gets detailed information of a user
    Get(UserGetArgs),
    /// Lists all users
    List(NoArgs),
    /// Changes password of user
    Passwd(UserPasswdArgs),
    /// Grants a role to a user
    GrantRole(NoArgs),
    /// Revokes a role from a user
    RevokeRole(NoArgs),
}

#[derive(Args, Debug, Clone)]
pub struct UserAddArgs {
    /// <user name or user:password>
    pub args: Vec<String>,
    /// Read password from stdin instead of interactive terminal
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub interactive: bool,
    /// Supply password from the command line flag
    #[arg(long, default_value = "")]
    pub new_user_password: String,
    /// Create a user without password (CN based auth only)
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub no_password: bool,
}

#[derive(Args, Debug, Clone)]
pub struct UserGetArgs {
    /// <user name>
    pub args: Vec<String>,
    /// Show permissions of roles granted to the user
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub detail: bool,
}

#[derive(Args, Debug, Clone)]
pub struct UserPasswdArgs {
    /// <user name>
    pub args: Vec<String>,
    /// If true, read password from stdin instead of interactive terminal
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub interactive: bool,
}

#[derive(Args, Debug)]
pub struct RoleArgs {
    #[command(subcommand)]
    pub command: RoleCommand,
}

/// `role` subcommands, with etcdctl 3.4's arguments.
#[derive(Subcommand, Debug)]
pub enum RoleCommand {
    /// Adds a new role
    Add(NoArgs),
    /// Deletes a role
    Delete(NoArgs),
    /// Gets detailed information of a role
    Get(NoArgs),
    /// Lists all roles
    List(NoArgs),
    /// Grants a key to a role
    GrantPermission(RolePermArgs),
    /// Revokes a key from a role
    RevokePermission(RolePermArgs),
}

#[derive(Args, Debug, Clone, Default)]
pub struct RolePermArgs {
    /// <role name> [<permission type>] <key> [endkey]
    pub args: Vec<String>,
    /// the permission covers the keys with this prefix
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prefix: bool,
    /// the permission covers the keys greater than or equal to the given key using byte compare
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub from_key: bool,
}

#[derive(Args, Debug, Clone)]
pub struct LockArgs {
    /// <lockname> [exec-command arg1 arg2 ...]
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub args: Vec<OsString>,
    /// timeout for session
    #[arg(long, default_value = "10", value_parser = parse_go_int)]
    pub ttl: i64,
}

#[derive(Args, Debug, Clone)]
pub struct ElectArgs {
    /// <election-name> [proposal]
    pub args: Vec<String>,
    /// observation mode
    #[arg(short = 'l', long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub listen: bool,
}

#[derive(Args, Debug, Clone, Default)]
pub struct PutArgs {
    /// <key> [value]
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub args: Vec<OsString>,
    /// lease ID (in hexadecimal) to attach to the key
    #[arg(long, default_value = "0")]
    pub lease: String,
    /// return the previous key-value pair before modification
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prev_kv: bool,
    /// updates the key using its current value
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub ignore_value: bool,
    /// updates the key using its current lease
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub ignore_lease: bool,
}

#[derive(Args, Debug, Clone, Default)]
pub struct GetArgs {
    /// <key> [range_end]
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub args: Vec<OsString>,
    /// Linearizable(l) or Serializable(s)
    #[arg(long, default_value = "l")]
    pub consistency: String,
    /// Order of results; ASCEND or DESCEND (ASCEND by default)
    #[arg(long, default_value = "")]
    pub order: String,
    /// Sort target; CREATE, KEY, MODIFY, VALUE, or VERSION
    #[arg(long, default_value = "")]
    pub sort_by: String,
    /// Maximum number of results
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = parse_go_int)]
    pub limit: i64,
    /// Get keys with matching prefix
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prefix: bool,
    /// Get keys that are greater than or equal to the given key using byte compare
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub from_key: bool,
    /// Specify the kv revision
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = parse_go_int)]
    pub rev: i64,
    /// Get only the keys
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub keys_only: bool,
    /// Get only the count (extension: etcdctl 3.4 has no such flag)
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub count_only: bool,
    /// Only write values when using the "simple" output format
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub print_value_only: bool,
}

#[derive(Args, Debug, Clone, Default)]
pub struct DelArgs {
    /// <key> [range_end]
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub args: Vec<OsString>,
    /// delete keys with matching prefix
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prefix: bool,
    /// return deleted key-value pairs
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prev_kv: bool,
    /// delete keys that are greater than or equal to the given key using byte compare
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub from_key: bool,
}

#[derive(Args, Debug, Clone, Default)]
pub struct WatchArgs {
    /// [key or prefix] [range_end]
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub args: Vec<OsString>,
    /// Interactive mode
    #[arg(short = 'i', long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub interactive: bool,
    /// Watch on a prefix if prefix is set
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prefix: bool,
    /// Revision to start watching
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = parse_go_int)]
    pub rev: i64,
    /// get the previous key-value pair before the event happens
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prev_kv: bool,
    /// get periodic watch progress notification from server
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub progress_notify: bool,
}

/// One line of `watch -i`: `watch [flags] key [range_end]`.
#[derive(Parser, Debug)]
#[command(name = "watch", no_binary_name = true)]
pub struct WatchLine {
    #[command(flatten)]
    pub args: WatchArgs,
}

#[derive(Args, Debug, Clone)]
pub struct TxnArgs {
    /// Unexpected arguments are rejected like etcdctl does
    pub args: Vec<String>,
    /// Input transaction in interactive mode
    #[arg(short = 'i', long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub interactive: bool,
}

#[derive(Args, Debug, Clone)]
pub struct CompactionArgs {
    /// <revision>
    #[arg(allow_negative_numbers = true)]
    pub args: Vec<String>,
    /// Wait for the compaction to physically remove all old revisions
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub physical: bool,
}

#[derive(Args, Debug)]
pub struct DefragArgs {
    /// use all endpoints from the cluster member list
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub cluster: bool,
    /// Arguments etcdctl's defrag ignores.
    #[arg(hide = true)]
    pub ignored: Vec<String>,
}

#[derive(Args, Debug)]
pub struct EndpointArgs {
    /// use all endpoints from the cluster member list
    #[arg(long, global = true, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub cluster: bool,
    #[command(subcommand)]
    pub command: EndpointCommand,
}

#[derive(Subcommand, Debug)]
pub enum EndpointCommand {
    /// Checks the healthiness of endpoints specified in `--endpoints` flag
    Health,
    /// Prints out the status of endpoints specified in `--endpoints` flag
    Status(StatusArgs),
    /// Prints the KV history hash for each endpoint in --endpoints
    Hashkv(HashKvArgs),
    /// kvctl only: asks every member it can reach and says whether the cluster is healthy,
    /// degraded or has lost quorum, and what to do
    Diagnose,
}

#[derive(Args, Debug, Clone, Default)]
pub struct HashKvArgs {
    /// maximum revision to hash (default: all revisions)
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub rev: i64,
}

#[derive(Args, Debug)]
pub struct AlarmArgs {
    #[command(subcommand)]
    pub command: AlarmCommand,
}

#[derive(Subcommand, Debug)]
pub enum AlarmCommand {
    /// Disarms all alarms
    Disarm(AlarmNoArgs),
    /// Lists all alarms
    List(AlarmNoArgs),
}

#[derive(Args, Debug, Clone, Default)]
pub struct AlarmNoArgs {
    /// (none accepted)
    pub args: Vec<String>,
}

#[derive(Args, Debug, Clone, Default)]
pub struct StatusArgs {
    /// kvctl only: add each member's WAL fsync p99 over the last minute (kvd reports it in a
    /// StatusResponse extension field; etcd does not, and shows "-"). A flag rather than a
    /// new column or field by default, so that `-w table`, `-w json` and `-w fields` stay
    /// byte-identical to etcdctl's unless it is asked for.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub fsync: bool,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(subcommand)]
    pub command: CheckCommand,
}

#[derive(Subcommand, Debug)]
pub enum CheckCommand {
    /// Check the performance of the etcd cluster
    Perf(CheckPerfArgs),
    /// kvctl only: check that a local disk syncs fast enough for a data dir (write + fdatasync
    /// latency against etcd's guidance, p99 < 10 ms); exits 1 when it is too slow
    Disk(CheckDiskArgs),
}

#[derive(Args, Debug, Clone)]
pub struct CheckPerfArgs {
    /// The performance check's workload model. Accepted workloads: s(small), m(medium), l(large), xl(xLarge)
    #[arg(long, default_value = "s")]
    pub load: String,
    /// The prefix for writing the performance check's keys.
    #[arg(long, default_value = "/etcdctl-check-perf/")]
    pub prefix: String,
    /// Compact storage with last revision after test is finished.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub auto_compact: bool,
    /// Defragment storage after test is finished.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub auto_defrag: bool,
    /// Length of the load instead of the workload's 60 s (for tests; the verdict of a shorter
    /// run is not comparable with etcdctl's).
    #[arg(long, hide = true, value_parser = parse_go_duration)]
    pub duration: Option<Duration>,
}

#[derive(Args, Debug, Clone)]
pub struct CheckDiskArgs {
    /// Directory to write the test file in: put it on the disk the data dir will use
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Number of write + fdatasync rounds
    #[arg(long, default_value_t = kvd::wal::diskcheck::DEFAULT_COUNT)]
    pub count: u64,
    /// Bytes per write (etcd's fio recipe uses 2300, a typical WAL batch)
    #[arg(long, default_value_t = kvd::wal::diskcheck::DEFAULT_SIZE)]
    pub size: usize,
}

#[derive(Args, Debug)]
pub struct LeaseArgs {
    #[command(subcommand)]
    pub command: LeaseCommand,
}

/// Lease subcommands, with etcdctl 3.4's arguments (checked by the commands, for etcdctl's
/// messages).
#[derive(Subcommand, Debug)]
pub enum LeaseCommand {
    /// Creates leases
    Grant(LeaseIdArgs),
    /// Revokes leases
    Revoke(LeaseIdArgs),
    /// Get lease information
    #[command(name = "timetolive")]
    TimeToLive(LeaseTimeToLiveArgs),
    /// List all active leases
    List,
    /// Keeps leases alive (renew)
    KeepAlive(LeaseKeepAliveArgs),
}

#[derive(Args, Debug, Clone)]
pub struct LeaseIdArgs {
    pub args: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct LeaseTimeToLiveArgs {
    /// <leaseID>
    pub args: Vec<String>,
    /// Get keys attached to this lease
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub keys: bool,
}

#[derive(Args, Debug, Clone)]
pub struct LeaseKeepAliveArgs {
    /// <leaseID>
    pub args: Vec<String>,
    /// Resets the keep-alive time to its original value and exits immediately
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub once: bool,
}

#[derive(Args, Debug)]
pub struct MemberArgs {
    #[command(subcommand)]
    pub command: MemberCommand,
}

/// Member subcommands, with etcdctl 3.4's arguments.
#[derive(Subcommand, Debug)]
pub enum MemberCommand {
    /// Lists all members in the cluster
    List,
    /// Adds a member into the cluster
    Add(MemberAddArgs),
    /// Removes a member from the cluster
    Remove(MemberIdArgs),
    /// Updates a member in the cluster
    Update(MemberUpdateArgs),
    /// Promotes a non-voting member in the cluster
    Promote(MemberIdArgs),
    /// kvctl only: replaces a member (by name or hex ID) with a new one: adds the new member as
    /// a learner, waits for it to catch up, promotes it, then removes the old one; refuses any
    /// step that could cost quorum, and continues where an interrupted run stopped
    Replace(MemberReplaceArgs),
}

#[derive(Args, Debug, Clone)]
pub struct MemberReplaceArgs {
    /// <old member name or ID>
    pub args: Vec<String>,
    /// name of the new member
    #[arg(long, default_value = "")]
    pub name: String,
    /// comma separated peer URLs for the new member.
    #[arg(long, default_value = "")]
    pub peer_urls: String,
    /// how long to wait for the new member to start and catch up before giving up (a rerun
    /// continues)
    #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
    pub wait_timeout: Duration,
}

#[derive(Args, Debug, Clone)]
pub struct MemberAddArgs {
    /// <memberName>
    pub args: Vec<String>,
    /// comma separated peer URLs for the new member.
    #[arg(long, default_value = "")]
    pub peer_urls: String,
    /// indicates if the new member is raft learner
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub learner: bool,
}

#[derive(Args, Debug, Clone)]
pub struct MemberIdArgs {
    /// <memberID>
    pub args: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct MemberUpdateArgs {
    /// <memberID>
    pub args: Vec<String>,
    /// comma separated peer URLs for the updated member.
    #[arg(long, default_value = "")]
    pub peer_urls: String,
}

#[derive(Args, Debug, Clone)]
pub struct MoveLeaderArgs {
    /// <transferee-member-id>
    pub args: Vec<String>,
}

/// The `get`, `put` and `del` requests allowed inside a txn (etcdctl parses them with the same flags).
#[derive(Parser, Debug)]
#[command(no_binary_name = true, disable_help_subcommand = true)]
pub struct TxnOpLine {
    #[command(subcommand)]
    pub op: TxnOpCommand,
}

#[derive(Subcommand, Debug)]
pub enum TxnOpCommand {
    Put(PutArgs),
    Get(GetArgs),
    Del(DelArgs),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_go_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(
            parse_go_duration("500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_go_duration("5").is_err());
        assert!(parse_go_duration("x").is_err());
    }

    #[test]
    fn bools_and_flags() {
        let cli = Cli::try_parse_from([
            "kvctl",
            "get",
            "k",
            "--prefix",
            "--endpoints=a:1,b:2",
            "-w",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.global.endpoints, vec!["a:1", "b:2"]);
        match cli.command {
            Command::Get(g) => {
                assert!(g.prefix);
                assert_eq!(g.args, vec![OsString::from("k")]);
            }
            _ => panic!(),
        }
        let cli = Cli::try_parse_from(["kvctl", "get", "--prefix=false", "k"]).unwrap();
        match cli.command {
            Command::Get(g) => assert!(!g.prefix),
            _ => panic!(),
        }
    }
}

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

/// Snapshot subcommands, with etcdctl 3.4's arguments (counted by the commands, for
/// etcdctl's messages).
#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Stores an etcd node backend snapshot to a given file
    Save(SnapshotFileArgs),
    /// Restores an etcd member snapshot to an etcd directory
    Restore(SnapshotRestoreArgs),
    /// Gets backend snapshot status of a given file
    Status(SnapshotFileArgs),
}

#[derive(Args, Debug, Clone, Default)]
pub struct SnapshotFileArgs {
    /// <filename>
    pub args: Vec<String>,
}

#[derive(Args, Debug, Clone, Default)]
pub struct SnapshotRestoreArgs {
    /// <filename>
    pub args: Vec<String>,
    /// Path to the data directory
    #[arg(long, default_value = "")]
    pub data_dir: String,
    /// Path to the WAL directory (use --data-dir if none given)
    #[arg(long, default_value = "")]
    pub wal_dir: String,
    /// Initial cluster configuration for restore bootstrap
    #[arg(long, default_value = "default=http://localhost:2380")]
    pub initial_cluster: String,
    /// Initial cluster token for the etcd cluster during restore bootstrap
    #[arg(long, default_value = "etcd-cluster")]
    pub initial_cluster_token: String,
    /// List of this member's peer URLs to advertise to the rest of the cluster
    #[arg(long, default_value = "http://localhost:2380")]
    pub initial_advertise_peer_urls: String,
    /// Human-readable name for this member
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Ignore snapshot integrity hash value (required if copied from data directory)
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub skip_hash_check: bool,
}
