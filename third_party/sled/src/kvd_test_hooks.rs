//! kvd patch: hooks kvd's tests use to reach paths a test cannot otherwise time. Compiled only
//! with the `kvd_test_hooks` feature, which kvd's test builds enable (its `testkit` feature)
//! and its release builds do not; `tests/no_test_code_in_binary.sh` checks the latter.

use std::sync::atomic::{AtomicUsize, Ordering};

/// How many of the next appends to a last leaf (`Tree::apply_batch_appending`, and a
/// transaction's appending tree at commit) find the leaf moved just before they replace it,
/// as when sled's segment cleaner rewrites the page between the read and the replace: the
/// replace then fails, and the append frees the leaves it allocated and tries again.
pub static LAST_LEAF_MOVES: AtomicUsize = AtomicUsize::new(0);

/// Takes one of [`LAST_LEAF_MOVES`], if any is left.
pub(crate) fn take_last_leaf_move() -> bool {
    LAST_LEAF_MOVES
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}
