//! Test-only tools for kvd, kept out of the server build: nothing here is linked into `kvd`,
//! `kvctl` or `kvbench`.
//!
//! - [`linearizability`]: checks histories that chaos-test clients record against a running
//!   cluster (KV operations and watch streams).
//!
//! The WAL's simulated file system (`kvd::wal::simfs`) stays in the kvd crate because the
//! WAL's own unit tests run on it; it is compiled only for tests and for builds with kvd's
//! `testkit` feature, which only the integration tests enable.

pub mod linearizability;
