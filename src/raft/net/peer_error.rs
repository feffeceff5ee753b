//! Why an RPC to a peer failed, read from the error's types (never its text), and the kind
//! ([`ErrorCode`]) a member's error status carries in its details.
//!
//! Invariants:
//! - [`PeerFailure::never_sent`] holds only when no connection to the peer was established for
//!   the call (tonic's `ConnectError` is in the error's source chain, or the URL was bad), so
//!   the request cannot have reached the peer. Callers rely on this to send a write again.
//! - A status the peer itself sent (no transport error under it) is [`PeerFailure::Status`].

use std::error::Error;
use std::io::ErrorKind;

use prost::Message;

use crate::proto::kvdpb::{ErrorCode, PeerError};

/// A peer RPC's error status: `code` and `message` as a client of the receiving member would
/// get them, `kind` in the status details for the receiver to act on.
pub fn status_of_kind(
    code: tonic::Code,
    message: impl Into<String>,
    kind: ErrorCode,
) -> tonic::Status {
    let details = PeerError { code: kind as i32 }.encode_to_vec();
    tonic::Status::with_details(code, message, details.into())
}

/// The kind a peer's error status carries: `Unspecified` for a status made by this member's
/// transport, or sent by a member that sends no kind.
pub fn kind_of(s: &tonic::Status) -> ErrorCode {
    PeerError::decode(s.details())
        .ok()
        .and_then(|e| ErrorCode::try_from(e.code).ok())
        .unwrap_or(ErrorCode::Unspecified)
}

/// The answer of a member that is not the leader to a request only the leader serves; it
/// proposed nothing, so the request may go to the leader.
pub fn not_leader() -> tonic::Status {
    status_of_kind(
        tonic::Code::FailedPrecondition,
        "not leader",
        ErrorCode::NotLeader,
    )
}

/// A member's answer to peer RPCs while it stops: not a failure of the link, and not worth a
/// warning.
pub fn stopping() -> tonic::Status {
    status_of_kind(
        tonic::Code::Unavailable,
        "member stopping",
        ErrorCode::Stopped,
    )
}

/// One failed exchange with a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeerFailure {
    #[error("connection refused")]
    Refused,
    /// The TCP connect did not complete in time: packets to the peer are being dropped.
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("cannot connect: {0}")]
    Connect(ErrorKind),
    /// The peer's URL cannot be dialled at all.
    #[error("bad peer URL")]
    BadAddress,
    /// No answer within the caller's deadline.
    #[error("no answer in time")]
    Timeout,
    /// A connection that was up failed (reset, keep-alive expired, peer went away).
    #[error("connection broken")]
    Broken,
    /// The peer answered with an error status.
    #[error("peer answered {0:?}")]
    Status(tonic::Code),
    /// The peer's answer could not be decoded.
    #[error("undecodable reply")]
    BadReply,
    /// The peer answered that it is stopping ([`stopping`]).
    #[error("peer is stopping")]
    Stopping,
}

impl PeerFailure {
    /// Classifies a failed tonic call.
    pub fn of_status(s: &tonic::Status) -> PeerFailure {
        let mut connecting = false;
        let mut cur: Option<&(dyn Error + 'static)> = s.source();
        while let Some(e) = cur {
            connecting |= e.is::<tonic::ConnectError>();
            if connecting {
                if let Some(io) = e.downcast_ref::<std::io::Error>() {
                    return match io.kind() {
                        ErrorKind::ConnectionRefused => PeerFailure::Refused,
                        ErrorKind::TimedOut => PeerFailure::ConnectTimeout,
                        k => PeerFailure::Connect(k),
                    };
                }
            }
            cur = e.source();
        }
        if connecting {
            return PeerFailure::Connect(ErrorKind::Other);
        }
        if s.source().is_none() && kind_of(s) == ErrorCode::Stopped {
            return PeerFailure::Stopping;
        }
        match s.code() {
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => PeerFailure::Timeout,
            // A status decoded from the peer's answer has no source; one made from a local
            // transport error has.
            tonic::Code::Unavailable | tonic::Code::Unknown if s.source().is_some() => {
                PeerFailure::Broken
            }
            c => PeerFailure::Status(c),
        }
    }

    /// The call never reached the peer (see the module invariants).
    pub fn never_sent(&self) -> bool {
        matches!(
            self,
            PeerFailure::Refused
                | PeerFailure::ConnectTimeout
                | PeerFailure::Connect(_)
                | PeerFailure::BadAddress
        )
    }

    /// The failure is about reaching the peer, not about what it answered.
    pub fn is_transport(&self) -> bool {
        match self {
            PeerFailure::Status(c) => matches!(
                c,
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            PeerFailure::BadReply => false,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::kvdpb::peer_client::PeerClient;
    use crate::proto::kvdpb::ProbeRequest;

    #[tokio::test]
    async fn a_closed_port_is_refused_and_never_sent() {
        // A port nothing listens on: bind, note it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect_lazy();
        let s = PeerClient::new(ch)
            .probe(ProbeRequest::default())
            .await
            .unwrap_err();
        let f = PeerFailure::of_status(&s);
        assert_eq!(f, PeerFailure::Refused, "{s:?}");
        assert!(f.never_sent() && f.is_transport());
    }

    /// A listener that never accepts: the TCP handshake completes in the kernel's backlog, the
    /// call is sent and never answered. That is a timeout, and the request may have arrived.
    #[tokio::test]
    async fn an_unanswered_call_times_out_and_may_have_been_sent() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .timeout(std::time::Duration::from_millis(200))
            .connect_lazy();
        let s = PeerClient::new(ch)
            .probe(ProbeRequest::default())
            .await
            .unwrap_err();
        let f = PeerFailure::of_status(&s);
        assert!(!f.never_sent(), "{f:?} from {s:?}");
        assert!(f.is_transport(), "{f:?} from {s:?}");
        drop(l);
    }

    #[test]
    fn statuses_sent_by_the_peer_are_not_transport_failures() {
        for s in [
            tonic::Status::unavailable("etcdserver: request timed out"),
            tonic::Status::unavailable("etcdserver: leader changed"),
            tonic::Status::unknown("connection reset"),
            tonic::Status::failed_precondition("not leader"),
        ] {
            let f = PeerFailure::of_status(&s);
            assert!(matches!(f, PeerFailure::Status(_)), "{s:?} -> {f:?}");
            assert!(!f.never_sent(), "{s:?}");
        }
    }

    #[test]
    fn a_stopping_member_is_told_apart_and_may_have_seen_the_call() {
        let f = PeerFailure::of_status(&stopping());
        assert_eq!(f, PeerFailure::Stopping);
        // It refused before calling Raft, but the same kind also answers a write that a
        // stopping leader may have appended: never "not sent".
        assert!(!f.never_sent() && f.is_transport());
        assert_ne!(PeerFailure::of_status(&not_leader()), PeerFailure::Stopping);
    }
}
