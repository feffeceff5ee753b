//! The peer transport, client side: openraft's RPCs over tonic ([`network`]), TLS dialing
//! ([`dial`]), per-peer health ([`links`]), typed failure causes ([`peer_error`]), snapshots
//! on the wire ([`snapshot_stream`]) over a connection of their own ([`snapshot_link`]),
//! follower writes forwarded to the leader in batches
//! ([`forward_batch`]), and commit indexes that ride on the next write ([`commit_hold`]).
//!
//! The serving side (`peer_service`) and the prober drive a node, so they live beside the node
//! one level up.
//!
//! Invariants:
//! - This folder uses the Raft layer's leaves and the state machine's snapshot types
//!   (`sm::snapshot_data`, `sm::snapshot_file`) but never the node or the log store: the node
//!   owns a transport, not the other way round (tests/layering.rs checks).
//! - A peer failure is classified from the error's types ([`peer_error`]), never its text.

pub(crate) mod commit_hold;
pub mod dial;
#[cfg(feature = "testkit")]
pub mod dial_override;
pub(crate) mod forward_batch;
pub(crate) mod links;
pub(crate) mod network;
pub(crate) mod peer_error;
pub(crate) mod snapshot_link;
pub(crate) mod snapshot_stream;

#[cfg(test)]
mod commit_hold_tests;
#[cfg(test)]
mod snapshot_stream_tests;
