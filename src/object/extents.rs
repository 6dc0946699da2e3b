//! Which 2 MiB extents of a kernel-mapped object's memfd are huge folios
//! ([`crate::collapse`] makes them, reclaim's `extent` evicts them whole),
//! and locking an extent's pages together.
//!
//! # Contract
//! An extent's bit is set and cleared only with the locks of all its
//! pages held, so whoever holds one of them sees it stable.

use super::Object;
use crate::sys::huge::HUGE_PAGE_SIZE;
use crate::sys::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// Base pages per extent (a PMD's worth).
pub const EXTENT_PAGES: usize = HUGE_PAGE_SIZE / PAGE_SIZE;

/// Which of an object's 2 MiB extents are collapsed: a bit each.
#[derive(Debug)]
pub struct Extents {
    bits: Box<[AtomicU64]>,
    /// A collapse was refused for a reason that would refuse the next
    /// (see [`crate::collapse`]): none is tried again.
    refused: AtomicBool,
}

impl Extents {
    /// For an object of `npages` base pages; `None` if it has no whole
    /// extent.
    pub fn new(npages: usize) -> Option<Extents> {
        let n = npages / EXTENT_PAGES;
        (n > 0).then(|| Extents {
            bits: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            refused: AtomicBool::new(false),
        })
    }

    /// Whether extent `e` is collapsed (stable for a holder of one of its
    /// pages' locks).
    pub fn is_set(&self, e: usize) -> bool {
        self.bits
            .get(e / 64)
            .is_some_and(|b| b.load(Acquire) & (1 << (e % 64)) != 0)
    }

    /// No collapse is to be tried again.
    pub fn refuse(&self) {
        self.refused.store(true, Relaxed);
    }

    /// Whether [`refuse`](Self::refuse) was called.
    pub fn refused(&self) -> bool {
        self.refused.load(Relaxed)
    }

    /// Marks extent `e` collapsed (`on`) or not; the caller holds the
    /// locks of all its pages.
    pub fn set(&self, e: usize, on: bool) {
        let bit = 1u64 << (e % 64);
        if on {
            self.bits[e / 64].fetch_or(bit, Release);
        } else {
            self.bits[e / 64].fetch_and(!bit, Release);
        }
    }

    /// Whether `[i, i + n)` covers part of a collapsed extent (not all of
    /// it): a hole punch there could zero pages in place (see the module's
    /// hazards).
    pub fn cuts(&self, i: usize, n: usize) -> bool {
        if n == 0 {
            return false;
        }
        let end = i + n;
        let part = |e: usize| {
            let (s, t) = (e * EXTENT_PAGES, (e + 1) * EXTENT_PAGES);
            self.is_set(e) && (i > s || end < t)
        };
        part(i / EXTENT_PAGES) || part((end - 1) / EXTENT_PAGES)
    }
}

impl Object {
    /// Whether page `i` lies in a collapsed extent (stable for a holder
    /// of page `i`'s lock).
    pub fn collapsed(&self, i: usize) -> bool {
        self.extents
            .as_ref()
            .is_some_and(|x| x.is_set(i / EXTENT_PAGES))
    }

    /// Locks every page of the extent at `first` whose word passes `ok`,
    /// in page order; if one fails `ok`, or is locked and stays locked
    /// once `patience` yields of the CPU (for the whole extent) are spent,
    /// unlocks those taken and returns `None`. Otherwise the pages' words,
    /// as locked.
    ///
    /// Never waits on a lock for good, so no holder of some of these pages
    /// waiting for others can deadlock with it. A page is held for a
    /// moment by a fault that looks at it again, or by reclaim: a
    /// collapse is patient with those before it gives the extent back to
    /// khugepaged to try later; an eviction, which its LRU entry retries,
    /// is not (`patience` 0).
    pub fn lock_extent(
        &self,
        first: usize,
        mut patience: u32,
        ok: impl Fn(u32) -> bool,
    ) -> Option<[u32; EXTENT_PAGES]> {
        let mut words = [0u32; EXTENT_PAGES];
        for (k, word) in words.iter_mut().enumerate() {
            let mut r = self.cache.try_lock(first + k);
            while r.is_err() && patience > 0 {
                patience -= 1;
                // (`sched_yield`: async-signal-safe.)
                std::thread::yield_now();
                r = self.cache.try_lock(first + k);
            }
            match r {
                Ok(w) if ok(w) => *word = w,
                r => {
                    if r.is_ok() {
                        self.cache.unlock(first + k, 0, 0);
                    }
                    self.unlock_extent(first, k, 0);
                    return None;
                }
            }
        }
        Some(words)
    }

    /// Unlocks the first `n` pages of the extent at `first`, clearing `clear`.
    pub fn unlock_extent(&self, first: usize, n: usize, clear: u32) {
        for k in 0..n {
            self.cache.unlock(first + k, 0, clear);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_cuts_a_collapsed_extent_only_where_it_covers_part_of_it() {
        let x = Extents::new(3 * EXTENT_PAGES + 7).unwrap();
        x.set(1, true);
        let e1 = EXTENT_PAGES;
        // Extents 0 and 2 are not collapsed: anything goes there.
        assert!(!x.cuts(0, 1));
        assert!(!x.cuts(2 * e1 + 5, 9));
        // Extent 1 whole, alone or with neighbours: not cut.
        assert!(!x.cuts(e1, EXTENT_PAGES));
        assert!(!x.cuts(0, 3 * EXTENT_PAGES));
        assert!(!x.cuts(10, 2 * EXTENT_PAGES));
        // Part of it: from inside, up to inside, or one page.
        assert!(x.cuts(e1 + 1, 1));
        assert!(x.cuts(e1, EXTENT_PAGES - 1));
        assert!(x.cuts(e1 - 3, 4));
        assert!(x.cuts(e1 + EXTENT_PAGES - 1, 2));
        assert!(!x.cuts(e1, 0));
        // Not a whole extent: no bits at all.
        assert!(Extents::new(EXTENT_PAGES - 1).is_none());
    }
}
