//! etcd's status for a request larger than the transport accepts.
//!
//! A request above `--max-request-bytes` + 512 KiB never reaches a handler: tonic's decoder
//! refuses it with `OutOfRange` "Error, decoded message length too large: found N bytes, the
//! limit is: M bytes". grpc-go, and so etcd, answers `ResourceExhausted` "grpc: received
//! message larger than max (N vs. M)", and clients (etcd's among them) treat the two codes
//! differently. [`etcd_size_error`] rewrites exactly that status in a trailers-only response
//! head and leaves every other response alone. (Requests between `--max-request-bytes` and the transport
//! limit reach the handler and get "etcdserver: request is too large", as in etcd.)

use tonic::{Code, Status};

const TONIC_PREFIX: &str = "Error, decoded message length too large: found ";

/// grpc-go's message for tonic's, or `None` if `msg` is not tonic's size refusal.
fn etcd_message(msg: &str) -> Option<String> {
    let rest = msg.strip_prefix(TONIC_PREFIX)?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    let (found, limit): (u64, u64) = (found.parse().ok()?, limit.parse().ok()?);
    Some(too_large(found, limit).message().to_string())
}

/// grpc-go's status for a message of `found` bytes over a transport limit of `limit`.
pub fn too_large(found: u64, limit: u64) -> Status {
    Status::new(
        Code::ResourceExhausted,
        format!("grpc: received message larger than max ({found} vs. {limit})"),
    )
}

/// etcd's status for `s` if it is tonic's size refusal (the JSON gateway, which calls the
/// services in process, sees tonic's status before any response head exists).
pub fn etcd_status(s: &Status) -> Option<Status> {
    if s.code() != Code::OutOfRange {
        return None;
    }
    etcd_message(s.message()).map(|m| Status::new(Code::ResourceExhausted, m))
}

/// Rewrites `headers` in place if they carry tonic's size refusal.
fn rewrite(headers: &mut http::HeaderMap) {
    let Some(s) = Status::from_header_map(headers) else {
        return;
    };
    if let Some(etcd) = etcd_status(&s) {
        // Only grpc-status and grpc-message change; a failure to encode leaves tonic's status.
        let _ = etcd.add_header(headers);
    }
}

/// The response mapping the client router applies (as a `tower::util::MapResponseLayer`).
pub fn etcd_size_error(mut res: axum::response::Response) -> axum::response::Response {
    rewrite(res.headers_mut());
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonic_size_refusal_becomes_grpc_go_resource_exhausted() {
        let mut h = http::HeaderMap::new();
        Status::out_of_range(
            "Error, decoded message length too large: found 3000010 bytes, the limit is: 2097152 bytes",
        )
        .add_header(&mut h)
        .unwrap();
        rewrite(&mut h);
        let s = Status::from_header_map(&h).unwrap();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            s.message(),
            "grpc: received message larger than max (3000010 vs. 2097152)"
        );
    }

    #[test]
    fn other_statuses_are_left_alone() {
        for s in [
            Status::out_of_range("etcdserver: mvcc: required revision is a future revision"),
            Status::invalid_argument("etcdserver: request is too large"),
        ] {
            let mut h = http::HeaderMap::new();
            s.add_header(&mut h).unwrap();
            let before = h.clone();
            rewrite(&mut h);
            assert_eq!(h, before);
        }
        let mut empty = http::HeaderMap::new();
        rewrite(&mut empty);
        assert!(empty.is_empty());
    }
}
