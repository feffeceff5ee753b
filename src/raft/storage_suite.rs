//! openraft's storage conformance suite, run against the WAL-backed log store and the
//! MVCC-engine-backed state machine.

use openraft::testing::log::{StoreBuilder, Suite};
use openraft::StorageError;

use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::types::TypeConfig;

/// `Some(n)`: the log store keeps only `n` bytes of entries in memory, so the suite reads
/// almost every entry back from the WAL.
struct Builder(Option<usize>);

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let d = tempfile::tempdir().expect("tempdir");
        let log = LogStore::open(&d.path().join("wal")).expect("open log store");
        if let Some(n) = self.0 {
            log.set_cache_bytes(n);
        }
        let sm = StateMachine::open(&d.path().join("sm")).expect("open state machine");
        Ok((d, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(Builder(None)).await.expect("storage suite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_reading_entries_back_from_the_wal() {
    Suite::test_all(Builder(Some(0)))
        .await
        .expect("storage suite");
}
