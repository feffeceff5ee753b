//! A test-only crash point for multi-step writes that must survive a crash at any step
//! (a snapshot load, a snapshot install). Outside `cfg(test)` [`crash_point`] does nothing and
//! compiles to nothing, so no release binary carries it.
//!
//! A test arms it with [`crash_after`]`(Some(n))`: the n-th crash point this thread reaches
//! flushes the engine, so that everything written up to there is durable (as the engine's
//! background flush may have made it before a real crash), and fails. The caller stops there
//! as it would at a crash; the test drops the store and reopens it from the same directory.
//!
//! # Invariants
//! - Outside `cfg(test)` a crash point has no effect; under test it fires only on the thread
//!   that armed it, so tests running in parallel do not crash each other's stores. Work handed
//!   to a helper thread takes the armed count along ([`Armed::take`], [`Armed::enter`]) and
//!   gives back what is left, so its crash points count as the arming thread's.

#[cfg(test)]
use super::engine::Engine;
use super::engine::StoreEngine;
use super::error::MvccError;

#[cfg(test)]
thread_local! {
    static LEFT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Arms (`Some(n)`: crash at the n-th point from now on this thread) or disarms the crash.
#[cfg(test)]
pub fn crash_after(n: Option<usize>) {
    LEFT.with(|l| l.set(n));
}

/// A point where a crash must leave a state that reopening repairs.
#[inline]
pub fn crash_point(engine: &StoreEngine) -> Result<(), MvccError> {
    #[cfg(test)]
    match LEFT.with(|l| l.get()) {
        Some(1) => {
            LEFT.with(|l| l.set(None));
            engine.flush()?;
            return Err(MvccError::corrupt("injected crash"));
        }
        Some(n) => LEFT.with(|l| l.set(Some(n.saturating_sub(1)))),
        None => {}
    }
    #[cfg(not(test))]
    let _ = engine;
    Ok(())
}

/// The crash count of one thread, carried to a helper thread and back. Empty outside
/// `cfg(test)`.
#[derive(Debug, Default)]
pub struct Armed {
    #[cfg(test)]
    left: Option<usize>,
}

impl Armed {
    /// Takes this thread's armed count (disarming it here).
    pub fn take() -> Armed {
        Armed {
            #[cfg(test)]
            left: LEFT.with(|l| l.take()),
        }
    }

    /// Arms this thread with the count taken.
    pub fn enter(self) {
        #[cfg(test)]
        LEFT.with(|l| l.set(self.left));
    }
}
