//! Which build this is: kvd's release version, the commit it is built from, the newest log
//! format it applies, and the etcd version it answers as. `kvd --version`, `kvctl version
//! --kvd`, `/version` and the `kvd_build_info` metric all read them from here.
//!
//! Invariants:
//! - [`VERSION`] is Cargo.toml's package version, a semantic version; the release process
//!   (docs/releases.md) keeps releases.tsv and CHANGELOG.md naming the same one.
//! - kvd's own version never replaces the etcd version: clients gate features on
//!   [`ETCD_VERSION`] (Maintenance.Status, `/version`'s `etcdserver`), so kvd's is only ever
//!   reported beside it, under names of its own.

use std::sync::OnceLock;

/// The etcd version kvd reports. Clients parse it as integers and gate features on it
/// (e.g. watch progress requests need 3.4.31+ or 3.5.13+); see docs/architecture.md.
pub const ETCD_VERSION: &str = "3.5.17";
pub use crate::raft::log_format::LOG_FORMAT;

/// kvd's release version (Cargo.toml's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit this build is made from (12 hex digits), or "unknown" when it was built
/// outside a git repository without `KVD_COMMIT` set (build.rs).
pub const COMMIT: &str = env!("KVD_COMMIT");

/// `0.2.0 (commit 1a2b3c4d5e6f, log format 2, etcd API 3.5.17)`: what `kvd --version`
/// prints after the program's name.
pub fn long() -> &'static str {
    static LONG: OnceLock<String> = OnceLock::new();
    LONG.get_or_init(|| {
        format!("{VERSION} (commit {COMMIT}, log format {LOG_FORMAT}, etcd API {ETCD_VERSION})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_every_part() {
        let l = long();
        assert!(l.starts_with(&format!("{VERSION} (commit ")), "{l}");
        assert!(
            l.ends_with(&format!(
                ", log format {LOG_FORMAT}, etcd API {ETCD_VERSION})"
            )),
            "{l}"
        );
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() >= 7 && COMMIT.bytes().all(|b| b.is_ascii_hexdigit())),
            "{COMMIT}"
        );
    }
}
