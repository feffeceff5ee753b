//! etcd's `--config-file`: a YAML file that is the member's whole configuration.
//!
//! Semantics follow etcd 3.4-3.6 (`embed.ConfigFromFile`, `etcdmain` `configFromFile`):
//! - With a file, the configuration is the file's alone: other command-line flags and every
//!   `ETCD_*` variable are ignored, as etcd ignores them (the binary names those it ignores).
//!   `ETCD_CONFIG_FILE` names the file when `--config-file` is not given.
//! - Keys are etcd's JSON field names. Each becomes the kvd flag of the same meaning and goes
//!   through the command line's own parsing and validation ([`matches`]), so a file and the
//!   equivalent command line cannot behave differently.
//! - A value must have the type of etcd's Go field (a YAML string for a string, a number for a
//!   `uint`, an integer count of nanoseconds for a `time.Duration`, a sequence for a
//!   `[]string`); anything else is refused with the message Go's JSON decoder gives etcd. A
//!   null value, and an empty string, leave the setting at its default.
//! - A key etcd acts on and kvd has no flag for (`discovery`, `proxy`, a client certificate
//!   for outgoing connections...) is refused when it holds a value, as the flag is refused; a
//!   key etcd does not know, and kvd has no flag of that name, is reported and ignored (etcd
//!   ignores unknown keys silently). kvd's own flags may be keys too.
//!
//! Known differences, lenient on purpose: YAML is read as YAML 1.2, so a quoted `"yes"` is
//! taken as true for a bool (etcd's YAML 1.1 reader refuses it as a string) and an unquoted
//! `yes` is a string in a string field (etcd refuses it as a bool).

use std::path::Path;

use clap::parser::ValueSource;
use clap::ArgMatches;
use yaml_rust2::{Yaml, YamlLoader};

use crate::server::config::{command, ConfigError};

/// The Go type of an etcd config field, which decides what YAML it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Str,
    Bool,
    /// An unsigned integer; the Go type's name and its largest value.
    Uint(&'static str, u64),
    /// A signed integer; the Go type's name.
    Int(&'static str),
    /// `time.Duration`: an integer count of nanoseconds.
    Duration,
    /// `[]string`, joined with commas into the flag's value.
    List,
    /// `[]string` for a kvd flag that takes a single value.
    ListOfOne,
    /// A nested struct: its Go type name and its fields.
    Section(&'static str, &'static [Key]),
    /// Something etcd reads that kvd does not act on whatever its value (it only matters for
    /// a mode kvd refuses, or it concerns data kvd never has): taken and dropped.
    Inert,
}

/// One key of etcd's config file.
#[derive(Debug, PartialEq, Eq)]
struct Key {
    name: &'static str,
    ty: Ty,
    /// The kvd flag it sets, when not named as the key.
    flag: Option<&'static str>,
}

const fn k(name: &'static str, ty: Ty) -> Key {
    Key {
        name,
        ty,
        flag: None,
    }
}

const fn to(name: &'static str, ty: Ty, flag: &'static str) -> Key {
    Key {
        name,
        ty,
        flag: Some(flag),
    }
}

const UINT: Ty = Ty::Uint("uint", u64::MAX);
const UINT32: Ty = Ty::Uint("uint32", u32::MAX as u64);
const UINT64: Ty = Ty::Uint("uint64", u64::MAX);
const INT: Ty = Ty::Int("int");
const INT64: Ty = Ty::Int("int64");

use Ty::{Bool, Duration, Inert, List, ListOfOne, Section, Str};

/// `client-transport-security` (etcd's `securityConfig`).
static CLIENT_TLS: &[Key] = &[
    k("cert-file", Str),
    k("key-file", Str),
    k("client-cert-auth", Bool),
    k("trusted-ca-file", Str),
    k("auto-tls", Bool),
    k("client-cert-file", Str),
    k("client-key-file", Str),
    to("allowed-cn", List, "client-cert-allowed-cn"),
    to("allowed-hostname", List, "client-cert-allowed-hostname"),
    to(
        "skip-client-san-verification",
        Bool,
        "client-skip-client-san-verification",
    ),
];

/// `peer-transport-security`: the same fields, for the peer flags.
static PEER_TLS: &[Key] = &[
    to("cert-file", Str, "peer-cert-file"),
    to("key-file", Str, "peer-key-file"),
    to("client-cert-auth", Bool, "peer-client-cert-auth"),
    to("trusted-ca-file", Str, "peer-trusted-ca-file"),
    to("auto-tls", Bool, "peer-auto-tls"),
    to("client-cert-file", Str, "peer-client-cert-file"),
    to("client-key-file", Str, "peer-client-key-file"),
    to("allowed-cn", ListOfOne, "peer-cert-allowed-cn"),
    to("allowed-hostname", ListOfOne, "peer-cert-allowed-hostname"),
    to(
        "skip-client-san-verification",
        Bool,
        "peer-skip-client-san-verification",
    ),
];

/// `socket-options` (etcd 3.5's `transport.SocketOpts`).
static SOCKET: &[Key] = &[
    to("reuse-port", Bool, "socket-reuse-port"),
    to("reuse-address", Bool, "socket-reuse-address"),
];

/// Every key etcd 3.4, 3.5 and 3.6 read from the file (`embed.Config`'s JSON tags and
/// etcdmain's proxy and discovery fields), with its Go type.
static KEYS: &[Key] = &[
    k("name", Str),
    k("data-dir", Str),
    k("wal-dir", Str),
    k("snapshot-count", UINT64),
    k("snapshot-catchup-entries", UINT64),
    to(
        "experimental-snapshot-catch-up-entries",
        UINT64,
        "experimental-snapshot-catchup-entries",
    ),
    k("max-snapshots", UINT),
    k("max-wals", UINT),
    k("heartbeat-interval", UINT),
    k("election-timeout", UINT),
    k("initial-election-tick-advance", Bool),
    k("backend-batch-interval", Duration),
    k("backend-batch-limit", INT),
    k("backend-bbolt-freelist-type", Str),
    k("experimental-backend-bbolt-freelist-type", Str),
    k("quota-backend-bytes", INT64),
    k("max-txn-ops", UINT),
    k("max-request-bytes", UINT),
    k("max-concurrent-streams", UINT32),
    k("self-signed-cert-validity", UINT),
    k("cipher-suites", List),
    k("tls-min-version", Str),
    k("tls-max-version", Str),
    k("listen-peer-urls", Str),
    k("listen-client-urls", Str),
    k("listen-client-http-urls", Str),
    k("initial-advertise-peer-urls", Str),
    k("advertise-client-urls", Str),
    k("listen-metrics-urls", Str),
    k("initial-cluster", Str),
    k("initial-cluster-state", Str),
    k("initial-cluster-token", Str),
    k("discovery", Str),
    k("discovery-srv", Str),
    k("discovery-srv-name", Str),
    k("discovery-proxy", Str),
    k(
        "discovery-config",
        Section("v3discovery.DiscoveryConfig", &[]),
    ),
    // Only read with --discovery, which kvd refuses.
    k("discovery-fallback", Inert),
    k("proxy", Str),
    k("proxy-failure-wait", Inert),
    k("proxy-refresh-interval", Inert),
    k("proxy-dial-timeout", Inert),
    k("proxy-write-timeout", Inert),
    k("proxy-read-timeout", Inert),
    k("strict-reconfig-check", Bool),
    k("enable-v2", Bool),
    k("experimental-enable-v2v3", Str),
    // What becomes of v2 store data; kvd never has any.
    k("v2-deprecation", Inert),
    k("auto-compaction-mode", Str),
    k("auto-compaction-retention", Str),
    k("grpc-keepalive-min-time", Duration),
    k("grpc-keepalive-interval", Duration),
    k("grpc-keepalive-timeout", Duration),
    k("socket-options", Section("transport.SocketOpts", SOCKET)),
    k("pre-vote", Bool),
    k("auth-token", Str),
    k("bcrypt-cost", UINT),
    k("auth-token-ttl", UINT),
    k("experimental-initial-corrupt-check", Bool),
    k("experimental-corrupt-check-time", Duration),
    k("corrupt-check-time", Duration),
    k("experimental-compact-hash-check-enabled", Bool),
    k("experimental-compact-hash-check-time", Duration),
    k("compact-hash-check-time", Duration),
    k("experimental-enable-lease-checkpoint", Bool),
    k("experimental-enable-lease-checkpoint-persist", Bool),
    k("experimental-compaction-batch-limit", INT),
    k("compaction-batch-limit", INT),
    k("experimental-compaction-sleep-interval", Duration),
    k("compaction-sleep-interval", Duration),
    k("experimental-watch-progress-notify-interval", Duration),
    k("watch-progress-notify-interval", Duration),
    k("experimental-warning-apply-duration", Duration),
    k("warning-apply-duration", Duration),
    k("experimental-warning-unary-request-duration", Duration),
    k("warning-unary-request-duration", Duration),
    k("experimental-bootstrap-defrag-threshold-megabytes", UINT),
    k("bootstrap-defrag-threshold-megabytes", UINT),
    k("experimental-downgrade-check-time", Duration),
    k("downgrade-check-time", Duration),
    k("experimental-memory-mlock", Bool),
    k("memory-mlock", Bool),
    k("experimental-txn-mode-write-with-shared-buffer", Bool),
    k("experimental-stop-grpc-service-on-defrag", Bool),
    k("experimental-max-learners", INT),
    k("max-learners", INT),
    k("experimental-enable-distributed-tracing", Bool),
    k("enable-distributed-tracing", Bool),
    k("experimental-distributed-tracing-address", Str),
    k("distributed-tracing-address", Str),
    k("experimental-distributed-tracing-service-name", Str),
    k("distributed-tracing-service-name", Str),
    k("experimental-distributed-tracing-instance-id", Str),
    k("distributed-tracing-instance-id", Str),
    k("experimental-distributed-tracing-sampling-rate", INT),
    k("distributed-tracing-sampling-rate", INT),
    k("force-new-cluster", Bool),
    k("enable-pprof", Bool),
    k("metrics", Str),
    k("logger", Str),
    k("log-level", Str),
    k("log-format", Str),
    k("log-outputs", List),
    // etcd 3.4's deprecated name; read only when `log-outputs` is absent.
    to("log-output", List, "log-outputs"),
    k("debug", Bool),
    k("log-package-levels", Str),
    k("enable-log-rotation", Bool),
    k("log-rotation-config-json", Str),
    k("enable-grpc-gateway", Bool),
    k("unsafe-no-fsync", Bool),
    k("next-cluster-version-compatible", Bool),
    k("cors", Str),
    k("host-whitelist", Str),
    k("feature-gates", Str),
    k(
        "client-transport-security",
        Section("embed.securityConfig", CLIENT_TLS),
    ),
    k(
        "peer-transport-security",
        Section("embed.securityConfig", PEER_TLS),
    ),
];

/// A configuration file turned into kvd's command line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FileArgs {
    /// `--flag=value` arguments, in the file's order.
    pub args: Vec<String>,
    /// Keys neither etcd nor kvd knows, ignored: one warning each.
    pub unknown: Vec<String>,
}

/// Reads `path` and parses it with kvd's command, environment variables left out: the
/// matches to read [`crate::server::config::Flags`] from, and the keys that were ignored.
pub fn matches(path: &Path) -> Result<(ArgMatches, Vec<String>), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "--config-file: cannot read {}: {e}",
            path.display()
        ))
    })?;
    let file = parse(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))?;
    let cmd = command().mut_args(|a| a.env(None));
    let m = cmd
        .try_get_matches_from(std::iter::once("kvd".to_string()).chain(file.args))
        .map_err(|e| {
            ConfigError(format!(
                "{}: {}",
                path.display(),
                e.render().to_string().trim_end()
            ))
        })?;
    Ok((m, file.unknown))
}

/// What the command line and environment held that a config file makes kvd ignore: each
/// flag given on the command line (other than `--config-file`) and each `ETCD_*` variable
/// (other than `ETCD_CONFIG_FILE`), so the operator learns that they had no effect.
pub fn ignored(
    cli: &ArgMatches,
    env: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<String> {
    let mut out: Vec<String> = command()
        .get_arguments()
        .filter(|a| a.get_id() != "config_file")
        .filter(|a| cli.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine))
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    let mut vars: Vec<String> = env
        .into_iter()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with(crate::server::config::env::PREFIX) && k != "ETCD_CONFIG_FILE")
        .collect();
    vars.sort();
    out.extend(vars);
    out
}

/// Turns the text of a config file into flags.
pub fn parse(text: &str) -> Result<FileArgs, ConfigError> {
    let docs = YamlLoader::load_from_str(text)
        .map_err(|e| ConfigError(format!("error converting YAML to JSON: yaml: {e}")))?;
    let mut out = FileArgs::default();
    let root = match docs.into_iter().next() {
        None | Some(Yaml::Null) => return Ok(out),
        Some(Yaml::Hash(h)) => h,
        Some(other) => {
            return Err(ConfigError(format!(
                "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {} \
                 into Go value of type embed.configYAML",
                json_kind(&other, false)
            )))
        }
    };
    let has_log_outputs = root.contains_key(&Yaml::String("log-outputs".into()));
    let flags = kvd_flags();
    for (key, value) in &root {
        let Yaml::String(name) = key else {
            out.unknown
                .push(scalar_text(key).unwrap_or_else(|| format!("{key:?}")));
            continue;
        };
        if name == "log-output" && has_log_outputs {
            continue;
        }
        match KEYS.iter().find(|k| k.name == name) {
            Some(key) => convert(key, value, "configYAML", "", &flags, &mut out)?,
            None if flags.iter().any(|f| f == name) => {
                // One of kvd's own flags (or an etcd flag etcd's file does not read, such as
                // --client-crl-file): its value as the command line would give it.
                match value {
                    Yaml::Null => {}
                    v => match scalar_text(v) {
                        Some(t) if t.is_empty() => {}
                        Some(t) => out.args.push(format!("--{name}={t}")),
                        None => {
                            return Err(ConfigError(format!(
                                "{name}: expected a single value, got {}",
                                json_kind(v, false)
                            )))
                        }
                    },
                }
            }
            None => out.unknown.push(name.clone()),
        }
    }
    Ok(out)
}

/// The long names of kvd's flags that a file may set (not the file itself, help or version).
fn kvd_flags() -> Vec<String> {
    command()
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| !matches!(*l, "config-file" | "help" | "version"))
        .map(str::to_string)
        .collect()
}

/// Converts one key's value into `args`. `owner` is the Go struct holding the field and
/// `path` the keys above it, for Go's error message.
fn convert(
    key: &Key,
    value: &Yaml,
    owner: &str,
    path: &str,
    flags: &[String],
    out: &mut FileArgs,
) -> Result<(), ConfigError> {
    let field = format!("{path}{}", key.name);
    let numeric = matches!(key.ty, Ty::Uint(..) | Ty::Int(_) | Duration);
    let mismatch = |go_ty: &str, v: &Yaml| {
        ConfigError(format!(
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {} into Go \
             struct field {owner}.{field} of type {go_ty}",
            json_kind(v, numeric)
        ))
    };
    if matches!(value, Yaml::Null) || key.ty == Inert {
        return Ok(());
    }
    let text: Option<String> = match key.ty {
        Inert => None,
        Str => match value {
            Yaml::String(s) => Some(s.clone()),
            v => return Err(mismatch("string", v)),
        },
        Bool => match value {
            Yaml::Boolean(b) => Some(b.to_string()),
            Yaml::String(s) => match yaml11_bool(s) {
                Some(b) => Some(b.to_string()),
                None => return Err(mismatch("bool", value)),
            },
            v => return Err(mismatch("bool", v)),
        },
        Ty::Uint(go_ty, max) => match integral(value) {
            Some(n) if n >= 0 && (n as u64) <= max => Some(n.to_string()),
            _ => return Err(mismatch(go_ty, value)),
        },
        Ty::Int(go_ty) => match integral(value) {
            Some(n) => Some(n.to_string()),
            None => return Err(mismatch(go_ty, value)),
        },
        Duration => match integral(value) {
            Some(n) => Some(go_duration(n)),
            None => return Err(mismatch("time.Duration", value)),
        },
        List | ListOfOne => {
            let Yaml::Array(items) = value else {
                return Err(mismatch("[]string", value));
            };
            let mut parts = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Yaml::String(s) => parts.push(s.clone()),
                    v => return Err(mismatch("string", v)),
                }
            }
            if key.ty == ListOfOne && parts.len() > 1 {
                return Err(ConfigError(format!(
                    "{field}: kvd takes one value here (etcd 3.4's single --{}), got {}",
                    key.flag.unwrap_or(key.name),
                    parts.len()
                )));
            }
            Some(parts.join(","))
        }
        Section(go_ty, fields) => {
            let Yaml::Hash(h) = value else {
                return Err(mismatch(go_ty, value));
            };
            let owner = go_ty.rsplit('.').next().unwrap_or(go_ty);
            for (name, v) in h {
                let Some(sub) = fields.iter().find(|f| Yaml::String(f.name.into()) == *name) else {
                    if fields.is_empty() && !is_empty(v) {
                        return Err(unsupported(&field, key.name));
                    }
                    if !fields.is_empty() {
                        let name = scalar_text(name).unwrap_or_default();
                        out.unknown.push(format!("{field}.{name}"));
                    }
                    continue;
                };
                convert(sub, v, owner, &format!("{field}."), flags, out)?;
            }
            None
        }
    };
    let Some(text) = text else {
        return Ok(());
    };
    let flag = key.flag.unwrap_or(key.name);
    if !flags.iter().any(|f| f == flag) {
        // etcd acts on this key and kvd cannot: refused unless it asks for nothing.
        if is_empty(value) || (flag == "proxy" && text == "off") {
            return Ok(());
        }
        return Err(unsupported(&field, flag));
    }
    if text.is_empty() {
        return Ok(());
    }
    out.args.push(format!("--{flag}={text}"));
    Ok(())
}

fn unsupported(field: &str, flag: &str) -> ConfigError {
    ConfigError(format!(
        "{field}: kvd does not support etcd's --{flag} (docs/operations.md lists the flags \
         kvd refuses)"
    ))
}

/// Go's `encoding/json` name for the JSON a YAML value becomes, as in its error messages:
/// a number that does not fit a numeric field is named with its value ("number -1").
fn json_kind(v: &Yaml, numeric_field: bool) -> String {
    match v {
        Yaml::String(_) => "string".into(),
        Yaml::Boolean(_) => "bool".into(),
        Yaml::Integer(n) if numeric_field => format!("number {n}"),
        Yaml::Real(r) if numeric_field => format!("number {r}"),
        Yaml::Integer(_) | Yaml::Real(_) => "number".into(),
        Yaml::Array(_) => "array".into(),
        Yaml::Hash(_) => "object".into(),
        _ => "null".into(),
    }
}

/// An integer, or a float without a fraction (YAML `1.0` reaches Go's decoder as `1`).
fn integral(v: &Yaml) -> Option<i64> {
    match v {
        Yaml::Integer(n) => Some(*n),
        Yaml::Real(r) => {
            let f: f64 = r.parse().ok()?;
            (f.fract() == 0.0 && f.abs() < 9.0e18).then_some(f as i64)
        }
        _ => None,
    }
}

/// YAML 1.1's boolean words, which etcd's YAML reader takes (the quoted forms too, here).
fn yaml11_bool(s: &str) -> Option<bool> {
    match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// A scalar's text as a command line would give it.
fn scalar_text(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(n) => Some(n.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A value that asks for nothing: null, an empty string or list or map, false or zero.
fn is_empty(v: &Yaml) -> bool {
    match v {
        Yaml::Null => true,
        Yaml::String(s) => s.is_empty(),
        Yaml::Boolean(b) => !b,
        Yaml::Integer(n) => *n == 0,
        Yaml::Array(a) => a.iter().all(is_empty),
        Yaml::Hash(h) => h.values().all(is_empty),
        _ => false,
    }
}

/// Nanoseconds as a Go duration the flags parse ("5s", "100ms", "1500us", "7ns").
fn go_duration(ns: i64) -> String {
    let (sign, n) = if ns < 0 {
        ("-", ns.unsigned_abs())
    } else {
        ("", ns as u64)
    };
    let (v, unit) = match n {
        0 => return "0s".into(),
        n if n % 1_000_000_000 == 0 => (n / 1_000_000_000, "s"),
        n if n % 1_000_000 == 0 => (n / 1_000_000, "ms"),
        n if n % 1_000 == 0 => (n / 1_000, "us"),
        n => (n, "ns"),
    };
    format!("{sign}{v}{unit}")
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
