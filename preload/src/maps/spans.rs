//! A lock-free copy of the address ranges of the table's mappings, so that
//! a call on memory that is not the pager's goes to the kernel without
//! the table's lock.
//!
//! Why: an allocator of the program's own (jemalloc, tcmalloc, an arena
//! allocator) may call `mmap`, `munmap` or `madvise` while it holds its
//! own lock, and the shim allocates while it holds the table's: one
//! thread in the allocator waiting for the table, another in the shim
//! waiting for the allocator, both waited for ever. The kernel's calls
//! take no lock the program can hold. So those calls decide "not the
//! pager's" from these atomics alone (and an anonymous `mmap` under
//! `UFFD_PAGER_ANON_MIN` from the threshold alone).
//!
//! Each slot holds one entry's range, `[start, end)` (its whole length as
//! mapped or last moved through the shim; parts the program unmapped since
//! still count, which only sends such calls through the lock). Written
//! only under the table's lock (one writer at a time), read by anyone:
//! `end` is stored last with Release and read first with Acquire, so a
//! reader that sees a slot's end sees its start. Entries past [`SLOTS`]
//! have no slot, and while any exists every call takes the lock, as before.
//!
//! Cost: a scan of the slots in use (one or two loads each) per call.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// Slots: entries tracked without the lock.
const SLOTS: usize = 256;

struct Span {
    start: AtomicUsize,
    /// 0: the slot is free.
    end: AtomicUsize,
}

static SPANS: [Span; SLOTS] = [const {
    Span {
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
    }
}; SLOTS];
/// Slots below this have been used (the scan stops there).
static USED: AtomicUsize = AtomicUsize::new(0);
/// Entries with no slot.
static UNTRACKED: AtomicUsize = AtomicUsize::new(0);

/// Records a new entry's range; its slot, `None` if all are taken. Under
/// the table's lock.
pub(super) fn add(r: Range<usize>) -> Option<usize> {
    let k = SPANS.iter().position(|s| s.end.load(Relaxed) == 0);
    match k {
        Some(k) => {
            set(Some(k), r);
            USED.fetch_max(k + 1, Release);
        }
        None => {
            UNTRACKED.fetch_add(1, Relaxed);
        }
    }
    k
}

/// The entry in `slot` covers `r` now (moved through the shim). Under the
/// table's lock.
pub(super) fn set(slot: Option<usize>, r: Range<usize>) {
    if let Some(k) = slot {
        SPANS[k].start.store(r.start, Relaxed);
        SPANS[k].end.store(r.end.max(1), Release);
    }
}

/// The entry in `slot` is gone. Under the table's lock.
pub(super) fn remove(slot: Option<usize>) {
    match slot {
        Some(k) => SPANS[k].end.store(0, Release),
        None => {
            UNTRACKED.fetch_sub(1, Relaxed);
        }
    }
}

/// Whether `[a, b)` may hold pager memory (`false`: it holds none, and
/// the call is the kernel's). Lock-free, allocation-free.
pub fn may_be_ours(a: usize, b: usize) -> bool {
    if UNTRACKED.load(Relaxed) > 0 {
        return true;
    }
    let used = USED.load(Acquire);
    SPANS[..used].iter().any(|s| {
        let end = s.end.load(Acquire);
        end != 0 && a < end && s.start.load(Relaxed) < b
    })
}
