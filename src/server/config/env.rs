//! The `ETCD_*` environment next to the command line, read as etcd's `pkg/flags` reads it.
//!
//! Every flag can come from its `ETCD_*` variable (clap applies those); what this module adds
//! is etcd's two checks on what clap alone would pass over silently:
//! - a variable for a flag that the command line also gives is a conflict, and the member
//!   refuses to start (etcd exits with the same message);
//! - any other `ETCD_*` variable that no flag reads (a typo, a flag kvd does not have, an
//!   empty value) is reported, so that an operator learns it had no effect.

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::ArgMatches;

use crate::server::config::{command, ConfigError};

/// The prefix of the variables kvd reads its flags from, as etcd does.
pub const PREFIX: &str = "ETCD_";

/// `ETCD_*` variables that no flag used, as `NAME=value` (etcd's warning prints both).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EnvReport {
    pub unrecognized: Vec<String>,
}

/// Checks `env` against the parsed command line `matches` (parsed from [`command`]: the flags
/// kvd accepts without effect read their variables too).
pub fn check_env(
    matches: &ArgMatches,
    env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<EnvReport, ConfigError> {
    let cmd = command();
    let flag_of: BTreeMap<String, &str> = cmd
        .get_arguments()
        .filter_map(|a| {
            Some((
                a.get_env()?.to_string_lossy().into_owned(),
                a.get_id().as_str(),
            ))
        })
        .collect();
    let mut report = EnvReport::default();
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .filter(|(k, _)| k.starts_with(PREFIX))
        .collect();
    vars.sort();
    for (name, value) in vars {
        match flag_of.get(&name) {
            Some(id) if matches.value_source(id) == Some(ValueSource::CommandLine) => {
                return Err(ConfigError(format!(
                    "conflicting environment variable \"{name}\" is shadowed by corresponding \
                     command-line flag (either unset environment variable or disable flag)"
                )));
            }
            // An empty value sets nothing, in etcd as in clap.
            Some(_) if !value.is_empty() => {}
            _ => report.unrecognized.push(format!("{name}={value}")),
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        vars.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    fn check(args: &[&str], vars: &[(&str, &str)]) -> Result<EnvReport, ConfigError> {
        let matches = command().try_get_matches_from(args).unwrap();
        check_env(&matches, env(vars))
    }

    #[test]
    fn a_variable_no_flag_reads_is_reported_with_its_value() {
        let r = check(
            &["kvd"],
            &[("ETCD_FOO", "bar"), ("ETCDCTL_API", "3"), ("HOME", "/root")],
        )
        .unwrap();
        assert_eq!(r.unrecognized, ["ETCD_FOO=bar"]);
    }

    #[test]
    fn a_variable_a_flag_reads_is_not_reported() {
        let r = check(&["kvd"], &[("ETCD_NAME", "m1"), ("ETCD_DATA_DIR", "/d")]).unwrap();
        assert_eq!(r, EnvReport::default());
        // Nor one of a flag kvd accepts without effect (that flag is reported on its own).
        let r = check(&["kvd"], &[("ETCD_ENABLE_V2", "true")]).unwrap();
        assert_eq!(r, EnvReport::default());
    }

    #[test]
    fn an_empty_variable_sets_nothing_and_is_reported() {
        let r = check(&["kvd"], &[("ETCD_NAME", "")]).unwrap();
        assert_eq!(r.unrecognized, ["ETCD_NAME="]);
    }

    #[test]
    fn a_variable_shadowed_by_its_flag_is_refused_with_etcds_message() {
        let e = check(&["kvd", "--name", "y"], &[("ETCD_NAME", "x")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "conflicting environment variable \"ETCD_NAME\" is shadowed by corresponding \
             command-line flag (either unset environment variable or disable flag)"
        );
        // The flag's default does not count as given.
        assert!(check(&["kvd"], &[("ETCD_NAME", "x")]).is_ok());
    }

    #[test]
    fn every_flag_has_its_variable() {
        // etcd's flags read ETCD_<FLAG>; kvd's own flags read KVD_<FLAG>, which this check
        // leaves alone.
        for a in command().get_arguments() {
            if matches!(a.get_id().as_str(), "help" | "version") {
                continue;
            }
            let flag = a.get_long().unwrap();
            let suffix = flag.to_uppercase().replace('-', "_");
            let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            assert!(
                env == Some(format!("{PREFIX}{suffix}")) || env == Some(format!("KVD_{suffix}")),
                "--{flag} reads {env:?}"
            );
        }
    }
}
