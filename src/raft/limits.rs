//! How large one replicated request may be, the limits derived from it, and how long a
//! request waits.
//!
//! One place fixes the largest request (`MAX_REQUEST_BYTES`, the upper bound of
//! `--max-request-bytes`); the peer message limit is derived from it, and compile-time checks
//! tie it to the WAL's record limit. Invariant: a request the server accepts (encoded
//! `InternalRequest` <= `--max-request-bytes` <= `MAX_REQUEST_BYTES`) always fits in one WAL
//! record and in one peer message, so it can never be refused *after* it entered the log
//! (a refused WAL record is a storage error that stops the member; an unsendable entry stalls
//! replication forever).

use std::time::Duration;

use crate::wal::format::MAX_PAYLOAD;

/// Upper bound of `--max-request-bytes` (etcd only warns above 10 MiB; kvd refuses to start).
pub const MAX_REQUEST_BYTES: usize = 64 << 20;

/// What a log entry adds around its command: bincode's log id, payload tag and length, and
/// the WAL's index field. Measured at under 100 bytes; generous on purpose.
pub const ENTRY_OVERHEAD: usize = 4 << 10;

/// The log store ends a replication batch once its commands reach this many bytes, so a batch
/// holds at most this much plus one last entry.
pub const REPLICATION_BATCH_BYTES: usize = 8 << 20;

/// The Raft log store keeps the newest entries in memory up to about this many bytes; older
/// ones (until the next snapshot purges them) are read back from the WAL when a lagging
/// follower or a slow apply needs them. It bounds the log's memory independently of
/// `--snapshot-count`.
pub const LOG_CACHE_BYTES: usize = 16 << 20;

/// Snapshot data is streamed in chunks of this size. A receiver takes chunks of any size up to
/// the peer message limit (releases before 0.2.0 sent 4 MiB). 1 MiB peaked 15-20 MiB lower on
/// the receiving member than 4 MiB, in no more time (docs/benchmarks.md, "Lent entries").
pub const SNAPSHOT_CHUNK: usize = 1 << 20;

/// Peer (tonic) message limit, both directions: a full replication batch plus one maximal
/// entry, with 1 MiB for the per-entry and message framing of up to openraft's 300 entries.
pub const MAX_PEER_MESSAGE: usize =
    REPLICATION_BATCH_BYTES + MAX_REQUEST_BYTES + ENTRY_OVERHEAD + (1 << 20);

const _: () = assert!(MAX_REQUEST_BYTES + ENTRY_OVERHEAD <= MAX_PAYLOAD);
const _: () = assert!(SNAPSHOT_CHUNK + (1 << 20) <= MAX_PEER_MESSAGE);

/// How long a request waits for a leader, for its commit, or for a read index.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
