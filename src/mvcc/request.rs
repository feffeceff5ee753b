//! The write requests the store applies, and their responses.
//!
//! # Invariants
//! - A [`WriteRequest`] is deterministic given the store's state: every member that applies the
//!   same requests in the same order reaches the same state and answers the same responses
//!   (ids and TTLs are chosen by the proposer, never by the apply).

use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse,
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, PutRequest,
    PutResponse, ResponseHeader, TxnRequest, TxnResponse,
};

/// A write request, as carried in the replicated log.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteRequest {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    /// `id` must be non-zero and `ttl` final: the proposer chooses both.
    LeaseGrant(LeaseGrantRequest),
    LeaseRevoke(LeaseRevokeRequest),
    /// Revokes the listed leases in list order, each exactly as a [`Self::LeaseRevoke`]
    /// would (its own revision if it had keys), skipping ids that are not leases: the leader
    /// proposes expired leases in batches, racing client revokes. Answered with a
    /// `LeaseRevoke` response carrying the revision after the last one.
    LeaseRevokeMany(Vec<i64>),
}

/// The response to a [`WriteRequest`]. `header.revision` is the store revision after the
/// request; the other header fields are left for the server to fill.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteResponse {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    LeaseGrant(LeaseGrantResponse),
    LeaseRevoke(LeaseRevokeResponse),
}

impl WriteResponse {
    /// The response's header: its revision is the store's after the request.
    pub fn header(&self) -> Option<&ResponseHeader> {
        match self {
            WriteResponse::Put(r) => r.header.as_ref(),
            WriteResponse::DeleteRange(r) => r.header.as_ref(),
            WriteResponse::Txn(r) => r.header.as_ref(),
            WriteResponse::Compact(r) => r.header.as_ref(),
            WriteResponse::LeaseGrant(r) => r.header.as_ref(),
            WriteResponse::LeaseRevoke(r) => r.header.as_ref(),
        }
    }
}
