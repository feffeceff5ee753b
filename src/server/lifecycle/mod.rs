//! A member's life: [`start`] (identity, listeners, storage and Raft), [`serve`] (every server
//! and background duty) and [`stop`] (what ends a member, and the order in which it lets go),
//! with the data dir's identity file and the WAL directory's home check.

pub(crate) mod identity;
pub(crate) mod serve;
pub(crate) mod start;
pub(crate) mod stop;
pub(crate) mod wal_home;
