//! openraft type configuration for kvd.
//!
//! A node id is an etcd member id (u64, never reused). A log entry's application payload is a
//! prost-encoded [`InternalRequest`](crate::proto::kvdpb::InternalRequest): the log carries
//! etcd's own request messages, so a replica applies exactly what the client sent.

use std::fmt;

use bytes::Bytes;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::proto::kvdpb::InternalResponse;

/// A member as Raft's membership config stores it. Only peer URLs are needed to replicate;
/// name and client URLs are published later through the log (as etcd does) and kept in the
/// state machine, so the Raft config stays stable when a member restarts with new client URLs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub peer_urls: Vec<String>,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.peer_urls.join(","))
    }
}

/// One replicated command: a prost-encoded `InternalRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command(pub Bytes);

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Command({} bytes)", self.0.len())
    }
}

/// What applying one command produced, handed from the state machine to the local proposer
/// in memory (a forwarded write's answer travels as the peer protocol's message instead).
/// openraft's type config asks for serde; it is the message's prost bytes, which nothing in
/// kvd writes or reads today.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommandResult(pub InternalResponse);

impl Serialize for CommandResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Bytes::from(self.0.encode_to_vec()).serialize(s)
    }
}

impl<'de> Deserialize<'de> for CommandResult {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let b = Bytes::deserialize(d)?;
        InternalResponse::decode(b)
            .map(CommandResult)
            .map_err(serde::de::Error::custom)
    }
}

openraft::declare_raft_types!(
    /// kvd's Raft types.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = Member,
);

pub type NodeId = u64;
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub type Membership = openraft::Membership<NodeId, Member>;
pub type LeaderId = openraft::type_config::alias::LeaderIdOf<TypeConfig>;
/// Why openraft stopped (a storage error, a panic in its core, or a shutdown).
pub type Fatal = openraft::error::Fatal<TypeConfig>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::kvdpb::internal_response;

    #[test]
    fn a_command_result_survives_serde_as_its_message_bytes() {
        let r = CommandResult(InternalResponse {
            response: Some(internal_response::Response::Error("boom".into())),
            revision: 7,
            error_code: 3,
        });
        let bytes = bincode::serialize(&r).unwrap();
        assert_eq!(bincode::deserialize::<CommandResult>(&bytes).unwrap(), r);
        assert!(bincode::deserialize::<CommandResult>(&[1, 0, 0, 0, 0, 0, 0, 0, 0xff]).is_err());
    }
}
