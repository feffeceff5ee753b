//! etcd flags that kvd accepts without acting on them, so that a command line written for etcd
//! (kubeadm's manifest, Patroni's, k3s' and RKE2's) starts kvd unchanged.
//!
//! Invariants:
//! - No flag here changes what kvd does. Each entry says why it may be ignored; a flag whose
//!   absence would be unsafe or surprising (`--discovery*`, `--proxy`) is not here and stays
//!   refused.
//! - Never silent: a flag given (on the command line or through its `ETCD_*` variable) with a
//!   value other than the one kvd behaves as anyway is reported once, naming the flag, its
//!   value and what kvd does instead ([`given`]; the binary logs each at warning level).
//! - The flags read the same `ETCD_<FLAG>` variables as etcd's, so the environment check
//!   ([`crate::server::config::env`]) counts them as known.

use clap::parser::ValueSource;
use clap::{Arg, ArgMatches};

/// How a flag takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A Go bool flag: `--flag`, `--flag=true`, `--flag=false` (and Go's other spellings).
    Bool,
    /// A flag with a value, given as `--flag=v` or `--flag v`.
    Value,
}

/// One etcd flag kvd accepts without effect.
struct Ignored {
    name: &'static str,
    kind: Kind,
    /// The value kvd behaves as anyway (normalised `true`/`false` for bool flags): giving it
    /// changes nothing and is not worth a warning.
    same_as: Option<&'static str>,
    /// What kvd does instead, for the warning.
    why: &'static str,
}

const fn flag(
    name: &'static str,
    kind: Kind,
    same_as: Option<&'static str>,
    why: &'static str,
) -> Ignored {
    Ignored {
        name,
        kind,
        same_as,
        why,
    }
}

use Kind::{Bool, Value};

const NO_V2: &str = "kvd serves the v3 API only";
const NO_BBOLT: &str = "kvd's backend is not bbolt";
const NO_TRACING: &str = "kvd does not export OpenTelemetry traces";
const OWN_LOG_FILES: &str = "kvd logs to stderr or stdout only";
const NO_HASH_CHECK: &str =
    "kvd has no compaction hash check (--experimental-corrupt-check-time runs the periodic check)";
const OWN_BATCHING: &str = "kvd's backend commits on its own schedule";
const OWN_COMPACTION: &str = "kvd compacts in one pass at the requested revision";
const OWN_KEEPALIVE: &str = "kvd's gRPC transport uses its own keepalive settings";
const NO_SLOW_LOG: &str = "kvd does not log slow requests";

/// The etcd 3.4/3.5 flags (and the etcd 3.6 names of some) accepted without effect. TLS and
/// auth flags are not here: kvd implements them (or refuses them) on their own.
static IGNORED: &[Ignored] = &[
    flag("enable-v2", Bool, Some("false"), NO_V2),
    flag("experimental-enable-v2v3", Value, None, NO_V2),
    flag("enable-pprof", Bool, Some("false"), "kvd serves no pprof endpoints"),
    flag(
        "enable-grpc-gateway",
        Bool,
        Some("true"),
        "kvd always serves the JSON gateway on its client port",
    ),
    flag(
        "max-snapshots",
        Value,
        None,
        "kvd keeps only the snapshot its log needs",
    ),
    flag(
        "max-wals",
        Value,
        None,
        "kvd removes WAL segments once a snapshot covers them",
    ),
    flag(
        "strict-reconfig-check",
        Bool,
        Some("true"),
        "kvd always refuses a membership change that would leave the cluster without quorum",
    ),
    flag(
        "pre-vote",
        Bool,
        Some("true"),
        "kvd's Raft always runs the pre-vote phase",
    ),
    flag(
        "initial-election-tick-advance",
        Bool,
        None,
        "kvd's first election waits a randomised election timeout",
    ),
    flag(
        "experimental-enable-lease-checkpoint",
        Bool,
        Some("false"),
        "kvd does not checkpoint lease TTLs: a new leader restarts every lease's TTL, as etcd does without checkpoints",
    ),
    flag(
        "experimental-enable-lease-checkpoint-persist",
        Bool,
        Some("false"),
        "kvd does not checkpoint lease TTLs",
    ),
    flag("experimental-compact-hash-check-enabled", Bool, Some("false"), NO_HASH_CHECK),
    flag("experimental-compact-hash-check-time", Value, None, NO_HASH_CHECK),
    flag("compact-hash-check-time", Value, None, NO_HASH_CHECK),
    flag(
        "unsafe-no-fsync",
        Bool,
        Some("false"),
        "kvd always syncs its WAL before acknowledging a write; this flag cannot turn that off",
    ),
    flag("grpc-keepalive-min-time", Value, None, OWN_KEEPALIVE),
    flag("grpc-keepalive-interval", Value, None, OWN_KEEPALIVE),
    flag("grpc-keepalive-timeout", Value, None, OWN_KEEPALIVE),
    flag(
        "max-concurrent-streams",
        Value,
        None,
        "kvd's gRPC transport sets its own stream limit",
    ),
    flag("backend-batch-interval", Value, None, OWN_BATCHING),
    flag("backend-batch-limit", Value, None, OWN_BATCHING),
    flag("backend-bbolt-freelist-type", Value, None, NO_BBOLT),
    flag("experimental-backend-bbolt-freelist-type", Value, None, NO_BBOLT),
    flag("experimental-compaction-batch-limit", Value, None, OWN_COMPACTION),
    flag("compaction-batch-limit", Value, None, OWN_COMPACTION),
    flag("experimental-compaction-sleep-interval", Value, None, OWN_COMPACTION),
    flag("compaction-sleep-interval", Value, None, OWN_COMPACTION),
    flag("experimental-warning-apply-duration", Value, None, NO_SLOW_LOG),
    flag("warning-apply-duration", Value, None, NO_SLOW_LOG),
    flag("experimental-warning-unary-request-duration", Value, None, NO_SLOW_LOG),
    flag("warning-unary-request-duration", Value, None, NO_SLOW_LOG),
    flag(
        "experimental-txn-mode-write-with-shared-buffer",
        Bool,
        None,
        "kvd's read path has no such mode",
    ),
    flag(
        "experimental-memory-mlock",
        Bool,
        Some("false"),
        "kvd does not lock its memory",
    ),
    flag("memory-mlock", Bool, Some("false"), "kvd does not lock its memory"),
    flag(
        "experimental-bootstrap-defrag-threshold-megabytes",
        Value,
        None,
        "kvd does not defragment at start",
    ),
    flag(
        "bootstrap-defrag-threshold-megabytes",
        Value,
        None,
        "kvd does not defragment at start",
    ),
    flag(
        "experimental-stop-grpc-service-on-defrag",
        Bool,
        Some("false"),
        "kvd keeps serving during a defragmentation",
    ),
    flag(
        "experimental-max-learners",
        Value,
        None,
        "kvd does not limit the number of learners",
    ),
    flag(
        "max-learners",
        Value,
        None,
        "kvd does not limit the number of learners",
    ),
    flag(
        "experimental-downgrade-check-time",
        Value,
        None,
        "kvd checks downgrades on its own schedule",
    ),
    flag(
        "downgrade-check-time",
        Value,
        None,
        "kvd checks downgrades on its own schedule",
    ),
    flag(
        "next-cluster-version-compatible",
        Bool,
        Some("false"),
        "kvd has no cluster version to downgrade",
    ),
    flag(
        "experimental-wait-cluster-ready-timeout",
        Value,
        None,
        "kvd serves once it has applied its log",
    ),
    flag("experimental-enable-distributed-tracing", Bool, Some("false"), NO_TRACING),
    flag("experimental-distributed-tracing-address", Value, None, NO_TRACING),
    flag("experimental-distributed-tracing-service-name", Value, None, NO_TRACING),
    flag("experimental-distributed-tracing-instance-id", Value, None, NO_TRACING),
    flag("experimental-distributed-tracing-sampling-rate", Value, None, NO_TRACING),
    flag("enable-distributed-tracing", Bool, Some("false"), NO_TRACING),
    flag("distributed-tracing-address", Value, None, NO_TRACING),
    flag("distributed-tracing-service-name", Value, None, NO_TRACING),
    flag("distributed-tracing-instance-id", Value, None, NO_TRACING),
    flag("distributed-tracing-sampling-rate", Value, None, NO_TRACING),
    flag(
        "socket-reuse-port",
        Bool,
        Some("false"),
        "kvd does not set SO_REUSEPORT",
    ),
    flag(
        "socket-reuse-address",
        Bool,
        None,
        "kvd sets its listeners' socket options itself",
    ),
    flag("enable-log-rotation", Bool, Some("false"), OWN_LOG_FILES),
    flag("log-rotation-config-json", Value, None, OWN_LOG_FILES),
    flag(
        "log-package-levels",
        Value,
        Some(""),
        "kvd has one log level for the whole process (--log-level)",
    ),
    flag(
        "cors",
        Value,
        Some("*"),
        "kvd answers every origin with etcd's permissive CORS headers",
    ),
    flag(
        "host-whitelist",
        Value,
        Some("*"),
        "kvd does not check the Host header",
    ),
];

/// Go's `strconv.ParseBool`, normalised; `None` when Go would refuse it.
pub fn go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn env_name(flag: &str) -> String {
    format!("ETCD_{}", flag.to_uppercase().replace('-', "_"))
}

/// The clap arguments for [`IGNORED`], each reading its `ETCD_*` variable.
pub fn args() -> impl Iterator<Item = Arg> {
    IGNORED.iter().map(|f| {
        let a = Arg::new(f.name)
            .long(f.name)
            // clap takes a variable name as a static string without its `string` feature;
            // the command is built once per process, so leaking the names is bounded.
            .env(&*Box::leak(env_name(f.name).into_boxed_str()))
            .hide(true);
        match f.kind {
            Bool => a
                .num_args(0..=1)
                .default_missing_value("true")
                .value_parser(|s: &str| {
                    go_bool(s)
                        .map(|b| b.to_string())
                        .ok_or_else(|| format!("parse error: invalid boolean value {s:?}"))
                }),
            Value => a.num_args(1),
        }
    })
}

/// A flag from [`IGNORED`] that was given, with what to tell the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenIgnored {
    /// `--flag=value`, or `ETCD_FLAG=value (--flag)` when it came from the environment.
    pub given: String,
    pub why: &'static str,
}

impl std::fmt::Display for GivenIgnored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is accepted for etcd compatibility and has no effect: {}",
            self.given, self.why
        )
    }
}

/// The ignored flags given in `matches` (parsed with [`args`]) with a value kvd does not
/// already behave as, in the table's order.
pub fn given(matches: &ArgMatches) -> Vec<GivenIgnored> {
    IGNORED
        .iter()
        .filter_map(|f| {
            let source = matches.value_source(f.name)?;
            let value = matches.get_one::<String>(f.name)?;
            if f.same_as == Some(value.as_str()) {
                return None;
            }
            let given = match source {
                ValueSource::EnvVariable => {
                    format!("{}={value} (--{})", env_name(f.name), f.name)
                }
                _ => format!("--{}={value}", f.name),
            };
            Some(GivenIgnored { given, why: f.why })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<Vec<String>, String> {
        // clap reads variables from the process environment; these names are used by this
        // test only.
        for (k, v) in env {
            std::env::set_var(k, v);
        }
        let mut v = vec!["kvd"];
        v.extend_from_slice(args);
        let r = clap::Command::new("kvd")
            .args(super::args())
            .try_get_matches_from(v)
            .map(|m| given(&m).iter().map(|g| g.to_string()).collect())
            .map_err(|e| e.to_string());
        for (k, _) in env {
            std::env::remove_var(k);
        }
        r
    }

    #[test]
    fn a_given_flag_is_reported_once_with_its_value_and_why() {
        let r = parse(
            &["--enable-v2", "--max-wals=5", "--grpc-keepalive-time"],
            &[],
        );
        assert!(r.is_err(), "a flag not in the table stays unknown");
        let r = parse(&["--enable-v2", "--max-wals=5"], &[]).unwrap();
        assert_eq!(
            r,
            [
                "--enable-v2=true is accepted for etcd compatibility and has no effect: kvd \
                 serves the v3 API only",
                "--max-wals=5 is accepted for etcd compatibility and has no effect: kvd removes \
                 WAL segments once a snapshot covers them"
            ]
        );
    }

    #[test]
    fn the_value_kvd_behaves_as_anyway_is_not_reported() {
        let r = parse(
            &[
                "--enable-v2=false",
                "--pre-vote",
                "--strict-reconfig-check=T",
                "--unsafe-no-fsync=0",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(r, Vec::<String>::new());
        let r = parse(&["--pre-vote=false", "--unsafe-no-fsync"], &[]).unwrap();
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].starts_with("--pre-vote=false is accepted"), "{r:?}");
        assert!(
            r[1].starts_with("--unsafe-no-fsync=true is accepted"),
            "{r:?}"
        );
    }

    #[test]
    fn go_bool_spellings_are_accepted_and_others_refused() {
        assert!(parse(&["--enable-pprof=yes"], &[]).is_err());
        assert_eq!(parse(&["--enable-pprof=1"], &[]).unwrap().len(), 1);
    }

    #[test]
    fn a_flag_from_its_variable_names_both() {
        let r = parse(&[], &[("ETCD_EXPERIMENTAL_MEMORY_MLOCK", "true")]).unwrap();
        assert_eq!(
            r,
            [
                "ETCD_EXPERIMENTAL_MEMORY_MLOCK=true (--experimental-memory-mlock) is accepted \
              for etcd compatibility and has no effect: kvd does not lock its memory"
            ]
        );
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = IGNORED.iter().map(|f| f.name).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
    }
}
