//! The lock-poison policy, in one place (docs/architecture.md, "Locks"): a poisoned lock
//! means some thread panicked while holding it; kvd's critical sections are short and leave
//! their data consistent, so the next holder takes the data as it is instead of panicking too.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks a mutex, recovering the guard if an earlier holder panicked.
pub trait LockExt<T: ?Sized> {
    /// The guard, poisoned or not.
    fn lock_or_recover(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn lock_or_recover(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Read- or write-locks an `RwLock`, recovering the guard if an earlier holder panicked.
pub trait RwLockExt<T: ?Sized> {
    /// The read guard, poisoned or not.
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T>;
    /// The write guard, poisoned or not.
    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|e| e.into_inner())
    }
}
