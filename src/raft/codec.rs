//! The byte form of what the Raft layer keeps and sends that is not a protobuf message: log
//! entries and votes in the WAL, snapshot metadata, the state machine's own records and the
//! peer messages' openraft payloads (bincode).
//!
//! A leaf: it knows serde and [`StoreError`], nothing else in the layer, so the log store, the
//! state machine and the network share it without importing each other.

use super::error::StoreError;

pub(crate) fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    bincode::serialize(v).expect("in-memory serialization cannot fail")
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    b: &[u8],
) -> Result<T, StoreError> {
    bincode::deserialize(b).map_err(|source| StoreError::Decode { what, source })
}
