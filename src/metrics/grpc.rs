//! `grpc_server_handled_total{grpc_service,grpc_method,grpc_code}`, counted by the client
//! port's dispatch ([`Handled`]).
//!
//! The code is read from the response head: tonic sends a handler's error as a
//! trailers-only response (`grpc-status` in the headers), and a response without it in the
//! head is counted as `OK`. For unary RPCs that is exact; a server-streaming RPC (snapshot)
//! is counted when its stream starts, so a stream that fails midway still counts as `OK`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};

use crate::sync::RwLockExt;

/// Handled RPCs by (service, method, code), as `grpc_server_handled_total` exports them.
pub type Table = BTreeMap<(String, String, &'static str), u64>;

/// Go's `codes.Code.String()` for codes 0..=16, which is what etcd's label values are.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];
const UNKNOWN: usize = 2;

/// Methods counted at most: a client can call any method name under a served service, and
/// each would otherwise add a row for good.
const MAX_METHODS: usize = 256;

type Counts = [AtomicU64; 17];

/// Request path -> counts by code. Counting a call takes the read lock and one atomic add;
/// the write lock is taken once per method, on its first call. The counts live as long as
/// the process (at most [`MAX_METHODS`] of them), so they are leaked rather than shared.
type Methods = RwLock<HashMap<String, &'static Counts>>;

fn table() -> &'static Methods {
    static T: OnceLock<Methods> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// The handled-RPC counts so far.
pub fn snapshot() -> Table {
    let t = table().read_or_recover();
    let mut out = Table::new();
    for (path, counts) in t.iter() {
        let p = path.trim_start_matches('/');
        let (svc, method) = p.split_once('/').unwrap_or((p, ""));
        for (code, n) in CODE_NAMES.iter().zip(counts.iter()) {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                out.insert((svc.to_string(), method.to_string(), code), n);
            }
        }
    }
    out
}

/// The index into [`CODE_NAMES`] of a `grpc-status` value.
fn code_index(c: &[u8]) -> usize {
    std::str::from_utf8(c)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|i| *i < CODE_NAMES.len())
        .unwrap_or(UNKNOWN)
}

#[cfg(test)]
fn record(path: &str, code: usize) {
    Handled::start(path).finish_code(code)
}

/// The counts of `path`, added on its first call (unless [`MAX_METHODS`] are counted).
fn counts_in(table: &Methods, path: &str) -> Option<&'static Counts> {
    let counts = table.read_or_recover().get(path).copied();
    if counts.is_some() {
        return counts;
    }
    let mut t = table.write_or_recover();
    if t.len() >= MAX_METHODS && !t.contains_key(path) {
        return None;
    }
    Some(
        *t.entry(path.to_string())
            .or_insert_with(|| Box::leak(Box::default())),
    )
}

/// One call being handled: started with its request path, finished with its response, so
/// that the request need not be kept (or its URI copied) while the call runs.
pub struct Handled(Option<&'static Counts>);

impl Handled {
    pub fn start(path: &str) -> Self {
        Handled(counts_in(table(), path))
    }

    /// Counts the call under the code of its response head (`OK` without `grpc-status`).
    pub fn finish<B>(&self, res: &http::Response<B>) {
        let code = res
            .headers()
            .get("grpc-status")
            .map_or(0, |v| code_index(v.as_bytes()));
        self.finish_code(code)
    }

    fn finish_code(&self, code: usize) {
        if let Some(c) = self.0 {
            c[code].fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_service_method_and_code() {
        record("/test.Svc/Counted", 0);
        record("/test.Svc/Counted", 0);
        record("/test.Svc/Counted", code_index(b"14"));
        let t = snapshot();
        let get = |code| t.get(&("test.Svc".to_string(), "Counted".to_string(), code));
        assert_eq!(get("OK"), Some(&2));
        assert_eq!(get("Unavailable"), Some(&1));
        assert_eq!(get("Internal"), None);
    }

    #[test]
    fn unparsable_codes_are_unknown() {
        for c in [&b"17"[..], b"-1", b"", b"x"] {
            assert_eq!(CODE_NAMES[code_index(c)], "Unknown", "{c:?}");
        }
        assert_eq!(CODE_NAMES[code_index(b"16")], "Unauthenticated");
    }

    #[test]
    fn the_number_of_methods_counted_is_bounded() {
        let t = Methods::default();
        for i in 0..MAX_METHODS + 10 {
            if let Some(c) = counts_in(&t, &format!("/test.Bounded/M{i}")) {
                c[0].fetch_add(1, Ordering::Relaxed);
            }
        }
        counts_in(&t, "/test.Bounded/M0").unwrap()[0].fetch_add(1, Ordering::Relaxed);
        let t = t.read_or_recover();
        assert_eq!(t.len(), MAX_METHODS);
        assert_eq!(t["/test.Bounded/M0"][0].load(Ordering::Relaxed), 2);
    }
}
