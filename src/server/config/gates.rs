//! etcd 3.6's `--feature-gates` (kubeadm 1.34 writes `--feature-gates=InitialCorruptCheck=true`
//! for etcd 3.6 images), parsed as etcd's `featuregate.Set` parses it.
//!
//! Invariants:
//! - The value is `Name=bool,...` with Go's bool spellings; a name etcd 3.6 does not know is an
//!   error (`unrecognized feature gate: X`), as in etcd, so a typo never passes unnoticed.
//! - `InitialCorruptCheck` is honoured (it is `--experimental-initial-corrupt-check`); every
//!   other gate etcd knows is accepted and reported as without effect in kvd, unless it is set
//!   to what kvd does anyway.

use std::collections::BTreeMap;

use crate::server::config::compat::go_bool;
use crate::server::config::ConfigError;

/// etcd 3.6's gate for the start-up corruption check.
pub const INITIAL_CORRUPT_CHECK: &str = "InitialCorruptCheck";

/// etcd 3.6's server gates other than [`INITIAL_CORRUPT_CHECK`], with the value kvd behaves as
/// anyway (`None`: neither) and why the gate has no effect. `AllAlpha` and `AllBeta` are
/// featuregate's own.
const WITHOUT_EFFECT: &[(&str, Option<bool>, &str)] = &[
    (
        "StopGRPCServiceOnDefrag",
        Some(false),
        "kvd keeps serving during a defragmentation",
    ),
    (
        "TxnModeWriteWithSharedBuffer",
        None,
        "kvd's read path has no such mode",
    ),
    (
        "CompactHashCheck",
        Some(false),
        "kvd has no compaction hash check",
    ),
    (
        "LeaseCheckpoint",
        Some(false),
        "kvd does not checkpoint lease TTLs",
    ),
    (
        "LeaseCheckpointPersist",
        Some(false),
        "kvd does not checkpoint lease TTLs",
    ),
    (
        "SetMemberLocalAddr",
        Some(false),
        "kvd dials peers from the address the OS picks",
    ),
    ("AllAlpha", Some(false), "kvd has no alpha features"),
    ("AllBeta", None, "kvd has no beta features"),
];

/// The gates a `--feature-gates` value sets.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Gates {
    /// `InitialCorruptCheck`, when the value names it.
    pub initial_corrupt_check: Option<bool>,
    /// One message per gate set without effect, naming it.
    pub without_effect: Vec<String>,
}

/// Parses `--feature-gates`.
pub fn parse(value: &str) -> Result<Gates, ConfigError> {
    let bad = |why: String| ConfigError(format!("--feature-gates: {why}"));
    // A later setting of the same gate wins, as in etcd's map.
    let mut set = BTreeMap::new();
    for part in value.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| bad(format!("missing bool value for {}", part.trim())))?;
        let (k, v) = (k.trim(), v.trim());
        let b = go_bool(v).ok_or_else(|| {
            bad(format!(
                "invalid value of {k}={v}, err: strconv.ParseBool: parsing {v:?}: invalid syntax"
            ))
        })?;
        set.insert(k.to_string(), b);
    }
    let mut gates = Gates::default();
    for (k, b) in set {
        if k == INITIAL_CORRUPT_CHECK {
            gates.initial_corrupt_check = Some(b);
            continue;
        }
        let Some((_, same_as, why)) = WITHOUT_EFFECT.iter().find(|(n, ..)| *n == k) else {
            return Err(bad(format!("unrecognized feature gate: {k}")));
        };
        if *same_as != Some(b) {
            gates.without_effect.push(format!(
                "--feature-gates={k}={b} is accepted for etcd compatibility and has no effect: \
                 {why}"
            ));
        }
    }
    Ok(gates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeadms_gate_is_honoured() {
        let g = parse("InitialCorruptCheck=true").unwrap();
        assert_eq!(g.initial_corrupt_check, Some(true));
        assert!(g.without_effect.is_empty());
        assert_eq!(parse("").unwrap(), Gates::default());
        assert_eq!(
            parse("InitialCorruptCheck=true,InitialCorruptCheck=F")
                .unwrap()
                .initial_corrupt_check,
            Some(false)
        );
    }

    #[test]
    fn other_gates_are_reported_unless_kvd_behaves_so_anyway() {
        let g =
            parse("LeaseCheckpoint=false, CompactHashCheck=true,InitialCorruptCheck=1").unwrap();
        assert_eq!(g.initial_corrupt_check, Some(true));
        assert_eq!(
            g.without_effect,
            [
                "--feature-gates=CompactHashCheck=true is accepted for etcd compatibility and has \
              no effect: kvd has no compaction hash check"
            ]
        );
    }

    #[test]
    fn malformed_values_get_etcds_messages() {
        let e = |v| parse(v).unwrap_err().0;
        assert_eq!(
            e("Foo=true"),
            "--feature-gates: unrecognized feature gate: Foo"
        );
        assert_eq!(
            e("InitialCorruptCheck"),
            "--feature-gates: missing bool value for InitialCorruptCheck"
        );
        assert_eq!(
            e("InitialCorruptCheck=yes"),
            "--feature-gates: invalid value of InitialCorruptCheck=yes, err: \
             strconv.ParseBool: parsing \"yes\": invalid syntax"
        );
    }
}
