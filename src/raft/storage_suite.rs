//! openraft's storage conformance suite, run against the WAL-backed log store and the
//! MVCC-engine-backed state machine.

use openraft::testing::log::{StoreBuilder, Suite};
use openraft::StorageError;

use crate::raft::log::log_store::LogStore;
use crate::raft::sm::state_machine::StateMachine;
use crate::raft::types::TypeConfig;

/// `cache: Some(n)`: the log store keeps only `n` bytes of entries in memory, so the suite
/// reads almost every entry back from the WAL. `following`: appends may be written in place
/// (decision 0034), as on a follower.
struct Builder {
    cache: Option<usize>,
    following: bool,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let d = tempfile::tempdir().expect("tempdir");
        let log = LogStore::open(&d.path().join("wal")).expect("open log store");
        if let Some(n) = self.cache {
            log.set_cache_bytes(n);
        }
        log.following()
            .store(self.following, std::sync::atomic::Ordering::Relaxed);
        let sm = StateMachine::open(&d.path().join("sm")).expect("open state machine");
        Ok((d, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(Builder {
        cache: None,
        following: false,
    })
    .await
    .expect("storage suite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_reading_entries_back_from_the_wal() {
    Suite::test_all(Builder {
        cache: Some(0),
        following: false,
    })
    .await
    .expect("storage suite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_writing_appends_in_place() {
    Suite::test_all(Builder {
        cache: None,
        following: true,
    })
    .await
    .expect("storage suite");
}
