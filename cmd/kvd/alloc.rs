//! The allocator, mimalloc, and the options kvd starts it with (docs/decisions/0008 and 0027).
//!
//! mimalloc reads its options from `MIMALLOC_<NAME>` environment variables when the process
//! loads, before `main`. [`apply_defaults`] then applies kvd's default for each option whose
//! variable is absent, so the environment always wins (A/B runs, and operators who prefer
//! mimalloc's own defaults).
//!
//! Transparent huge pages are off by default: with them a member loaded with 300,000 values
//! of 1 KiB held 50-250 MiB more (docs/benchmarks.md, "Memory").
//! `MIMALLOC_ALLOW_THP=1` turns them back on.

use std::ffi::{c_int, c_long};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc 3's `mi_option_set`, linked in with the allocator (libmimalloc-sys builds all of
// mimalloc; its Rust declarations are behind a feature whose option numbers are mimalloc 2's).
extern "C" {
    fn mi_option_set(option: c_int, value: c_long);
}

/// `mi_option_allow_thp` in mimalloc 3's `mi_option_t` (include/mimalloc.h).
const MI_OPTION_ALLOW_THP: c_int = 43;

/// Applies kvd's allocator defaults the environment does not override. Call first in `main`.
pub fn apply_defaults() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // What mimalloc does for MIMALLOC_ALLOW_THP=0, which it reads before `main`: stop
        // asking for huge pages, and turn them off for the process. The second also covers
        // the memory mimalloc reserved before `main` (an arena it already advised).
        // SAFETY: `mi_option_set` stores a value in mimalloc's option table (an option number
        // out of range is ignored); `prctl(PR_SET_THP_DISABLE)` only sets a flag of this
        // process and takes no pointers.
        // prctl is variadic: its arguments go as full-width integers, the unused ones zero.
        let (on, zero): (libc::c_ulong, libc::c_ulong) = (1, 0);
        unsafe {
            mi_option_set(MI_OPTION_ALLOW_THP, 0);
            libc::prctl(libc::PR_SET_THP_DISABLE, on, zero, zero, zero);
        }
    }
}
