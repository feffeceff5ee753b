//! Fault testing only, compiled with the `testkit` feature (the integration tests' builds of
//! the binaries; never a release build, which `tests/no_test_code_in_binary.sh` checks).
//!
//! [`PEER_DIAL_OVERRIDE_ENV`] holds `peerURL=dialURL,...`: the member dials `dialURL` whenever
//! it would dial `peerURL`, so a test can put a fault-injecting proxy on each member-to-member
//! link (peer URLs live in the replicated membership and are the same on every member, so the
//! proxies cannot be put there).

use std::collections::HashMap;

pub const PEER_DIAL_OVERRIDE_ENV: &str = "KVD_TEST_PEER_DIAL_OVERRIDE";

/// The overrides in the environment; empty when the variable is unset.
pub fn from_env() -> Result<HashMap<String, String>, String> {
    let Ok(spec) = std::env::var(PEER_DIAL_OVERRIDE_ENV) else {
        return Ok(HashMap::new());
    };
    let mut m = HashMap::new();
    for pair in spec.split(',').filter(|p| !p.is_empty()) {
        let (from, to) = pair.split_once('=').ok_or_else(|| {
            format!("{PEER_DIAL_OVERRIDE_ENV}: expected peerURL=dialURL, got {pair:?}")
        })?;
        m.insert(from.to_string(), to.to_string());
    }
    tracing::warn!(
        overrides = m.len(),
        "{PEER_DIAL_OVERRIDE_ENV} set: peer dials redirected (fault testing only)"
    );
    Ok(m)
}
