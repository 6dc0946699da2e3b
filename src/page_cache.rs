//! The page cache: one 32-bit state word per page of a mapped object.
//!
//! | state     | bits                          | kernel analog |
//! |-----------|-------------------------------|---------------|
//! | Absent    | none of LOCKED/UPTODATE       | no folio |
//! | Loading   | LOCKED, not UPTODATE          | locked folio, I/O in flight |
//! | Cached    | UPTODATE, not MAPPED          | clean/dirty folio, not mapped |
//! | Installed | UPTODATE and MAPPED           | folio mapped by a PTE |
//!
//! LOCKED is the page lock (`folio_lock`): held for a load, an install and
//! an eviction, so one store read per page and no install racing an evict.
//! Waiters sleep on the word itself (futex), with a WAITERS bit so that an
//! unlock with nobody waiting costs no syscall.
//!
//! A tiny object's words (up to 8) live inline, in the object itself; a
//! small object's (up to a page of them) live on the heap, packed
//! next to other small objects' state, so that many small regions cost no
//! mapping each and share cache lines and TLB entries. A larger object's
//! words live in an anonymous mapping of their own: a page of metadata
//! costs memory only once a page in its range is touched. No word is ever
//! allocated on the fault path.
//!
//! # Cost
//! 4 bytes per tracked page. Lock/unlock: one CAS each. Async-signal-safe.

use crate::sync::model::{futex, AtomicU32};
use crate::sys::{mem::Mapping, PAGE_SIZE};
use std::sync::atomic::Ordering::*;

/// Page lock held (loading, installing or evicting).
pub const LOCKED: u32 = 1 << 0;
/// Contents are present in the cache.
pub const UPTODATE: u32 = 1 << 1;
/// Present in a user mapping.
pub const MAPPED: u32 = 1 << 2;
/// Contents differ from the store.
pub const DIRTY: u32 = 1 << 3;
/// Accessed since the reclaimer last looked (second chance).
pub const REFERENCED: u32 = 1 << 4;
/// On the LRU (or in a per-thread add batch).
pub const ON_LRU: u32 = 1 << 5;
/// Somebody sleeps on this word.
pub const WAITERS: u32 = 1 << 6;
/// The store failed to read this page; accesses get SIGBUS.
pub const POISONED: u32 = 1 << 7;
/// Anonymous page whose contents live in the store (swapped out at least
/// once); without it an anonymous page is a zero page.
pub const SWAPPED: u32 = 1 << 8;
/// Never evict (the mlock analog).
pub const PINNED: u32 = 1 << 9;
/// In a per-CPU add batch, not yet in the LRU proper.
pub const LRU_BATCHED: u32 = 1 << 10;
/// Anonymous page installed by moving it out of the cache area: the area
/// holds no copy.
pub const MOVED: u32 = 1 << 11;
/// Loaded by readahead and not yet used by a fault (`PG_readahead`-ish).
pub const READAHEAD: u32 = 1 << 12;
/// Anonymous page installed into a read-only region and not writable since
/// (the region was not made writable): its store, or the zero page if it
/// was never swapped out, still holds its contents, so reclaim drops it
/// without writing it anywhere (a clean page of a private file mapping).
pub const CLEAN: u32 = 1 << 13;
/// Written to the store by a write-back whose `Store::sync` has not
/// ended (the tail of `PG_writeback`): if the sync fails the page goes
/// dirty again, so reclaim leaves it alone until then. (Evicted, it could
/// not: the next flush said Ok for a page the failed sync may have lost.)
pub const SYNCING: u32 = 1 << 14;

/// One residency guard on the page ([`crate::ResidentGuard`], the mlock
/// analog): reclaim leaves a page with any alone. The count takes the top
/// 16 bits.
pub const GUARD_ONE: u32 = 1 << 16;
/// The residency guard count.
pub const GUARDS: u32 = 0xFFFF << 16;

/// Word arrays up to this size live on the heap.
const SMALL_WORDS: usize = PAGE_SIZE;

/// The four states of `kernel-model.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// Not cached.
    Absent,
    /// I/O in flight.
    Loading,
    /// Up to date, not installed.
    Cached,
    /// Present in the user's mapping.
    Installed,
}

impl PageState {
    /// Decodes a state word.
    #[inline]
    pub fn of(word: u32) -> PageState {
        if word & UPTODATE == 0 {
            if word & LOCKED != 0 {
                PageState::Loading
            } else {
                PageState::Absent
            }
        } else if word & MAPPED != 0 {
            PageState::Installed
        } else {
            PageState::Cached
        }
    }
}

/// The state words of one object. See the module docs.
#[derive(Debug)]
pub struct PageCache {
    words: Words,
    npages: usize,
}

/// Objects of up to this many pages keep their words inline (in the
/// object's own allocation: one cache line fewer to miss per fault when
/// many small regions are faulted at random).
const INLINE_WORDS: usize = 8;

/// Where the words live.
#[derive(Debug)]
enum Words {
    Inline([AtomicU32; INLINE_WORDS]),
    Heap(Box<[AtomicU32]>),
    Mapped(Mapping),
}

impl Words {
    #[inline]
    fn base(&self) -> *const AtomicU32 {
        match self {
            Words::Inline(a) => a.as_ptr(),
            Words::Heap(b) => b.as_ptr(),
            Words::Mapped(m) => m.addr() as *const AtomicU32,
        }
    }
}

impl PageCache {
    /// A cache of `npages` absent pages.
    /// ENOMEM where the words would not fit in the address space.
    pub fn new(npages: usize) -> Result<PageCache, i32> {
        let bytes = npages
            .checked_mul(4)
            .and_then(|b| b.checked_next_multiple_of(PAGE_SIZE))
            .ok_or(libc::ENOMEM)?;
        let words = if npages <= INLINE_WORDS {
            Words::Inline(Default::default())
        } else if bytes <= SMALL_WORDS || cfg!(loom) {
            // (A mapping of zeros is no array of loom's atomics: under the
            // model checker every word array lives on the heap.)
            Words::Heap((0..npages.max(1)).map(|_| AtomicU32::new(0)).collect())
        } else {
            Words::Mapped(Mapping::anonymous(bytes)?)
        };
        Ok(PageCache { words, npages })
    }

    /// Bytes the words take outside the object: none inline, the array on
    /// the heap, or the whole mapping.
    pub fn words_bytes(&self) -> usize {
        match &self.words {
            Words::Inline(_) => 0,
            Words::Heap(b) => std::mem::size_of_val(&**b),
            Words::Mapped(m) => m.len(),
        }
    }

    /// Bytes of memory the words hold now: the heap array, or the pages of
    /// their mapping written so far (untouched pages of it cost nothing).
    /// Not `mincore`'s count: a pass that only reads the words (a flush
    /// looks at every page's) maps the shared zero page under them, which
    /// costs nothing and which `mincore` calls resident (4 MiB for a
    /// 4 GiB region after one flush). For reports: one `pagemap` read per
    /// 4,096 pages of words.
    pub fn resident_bytes(&self) -> u64 {
        match &self.words {
            Words::Inline(_) => 0,
            Words::Heap(b) => std::mem::size_of_val(&**b) as u64,
            Words::Mapped(m) => crate::sys::pagemap::anonymous_bytes(m.addr(), m.len())
                .unwrap_or_else(|| m.resident()),
        }
    }

    /// Number of pages tracked.
    pub fn len(&self) -> usize {
        self.npages
    }

    /// Metadata bytes per tracked page.
    pub const BYTES_PER_PAGE: usize = 4;

    /// The state word of page `i`.
    #[inline]
    pub fn word(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.npages, "page {i} out of range {}", self.npages);
        // SAFETY: `words` holds at least `npages` zero-initialised, 4-byte
        // aligned u32s (a boxed slice, or a mapping) and lives as long as
        // `self`; AtomicU32 has u32's layout.
        unsafe { &*self.words.base().add(i) }
    }

    /// Current word of page `i`.
    #[inline]
    pub fn load(&self, i: usize) -> u32 {
        self.word(i).load(Acquire)
    }

    #[cfg(test)]
    /// Current state of page `i`.
    #[inline]
    pub fn state(&self, i: usize) -> PageState {
        PageState::of(self.load(i))
    }

    /// Tries to take the page lock; on success returns the word as it was
    /// (without LOCKED), on failure the current word.
    #[inline]
    pub fn try_lock(&self, i: usize) -> Result<u32, u32> {
        let w = self.word(i);
        let mut cur = w.load(Relaxed);
        loop {
            if cur & LOCKED != 0 {
                return Err(cur);
            }
            match w.compare_exchange_weak(cur, cur | LOCKED, Acquire, Relaxed) {
                Ok(_) => return Ok(cur),
                Err(now) => cur = now,
            }
        }
    }

    /// Takes the page lock, sleeping while someone else holds it.
    pub fn lock(&self, i: usize) -> u32 {
        loop {
            match self.try_lock(i) {
                Ok(w) => return w,
                Err(_) => self.wait_unlocked(i),
            }
        }
    }

    /// Releases the page lock, setting `set` and clearing `clear` in the same
    /// atomic step; wakes sleepers.
    #[inline]
    pub fn unlock(&self, i: usize, set: u32, clear: u32) {
        let w = self.word(i);
        let prev = w
            .fetch_update(Release, Relaxed, |c| {
                Some((c | set) & !(clear | LOCKED | WAITERS))
            })
            .unwrap_or_else(|c| c);
        if prev & WAITERS != 0 {
            futex::wake_all(w);
        }
    }

    /// Sets/clears flag bits without touching the lock.
    #[inline]
    pub fn update(&self, i: usize, set: u32, clear: u32) -> u32 {
        self.word(i)
            .fetch_update(AcqRel, Relaxed, |c| Some((c | set) & !clear))
            .unwrap_or_else(|c| c)
    }

    /// Adds a residency guard to page `i`; false if it has the most it can
    /// count (65535).
    pub fn guard(&self, i: usize) -> bool {
        self.word(i)
            .fetch_update(AcqRel, Relaxed, |c| {
                (c & GUARDS != GUARDS).then_some(c + GUARD_ONE)
            })
            .is_ok()
    }

    /// Drops a residency guard of page `i` (one that [`PageCache::guard`]
    /// added); true if it was the page's last.
    pub fn unguard(&self, i: usize) -> bool {
        self.word(i).fetch_sub(GUARD_ONE, Release) & GUARDS == GUARD_ONE
    }

    /// Sleeps until page `i` is not locked (returns at once if it is not).
    pub fn wait_unlocked(&self, i: usize) {
        let w = self.word(i);
        loop {
            let cur = w.load(Acquire);
            if cur & LOCKED == 0 {
                return;
            }
            if cur & WAITERS == 0
                && w.compare_exchange_weak(cur, cur | WAITERS, Relaxed, Relaxed)
                    .is_err()
            {
                continue;
            }
            futex::wait(w, cur | WAITERS);
        }
    }

    #[cfg(test)]
    /// Counts pages per state (a linear scan; for reports and tests).
    pub fn census(&self) -> [usize; 4] {
        let mut c = [0; 4];
        for i in 0..self.npages {
            c[self.state(i) as usize] += 1;
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn states_and_lock() {
        let pc = PageCache::new(8).unwrap();
        assert_eq!(pc.state(3), PageState::Absent);
        assert_eq!(pc.try_lock(3), Ok(0));
        assert_eq!(pc.state(3), PageState::Loading);
        assert!(pc.try_lock(3).is_err());
        pc.unlock(3, UPTODATE, 0);
        assert_eq!(pc.state(3), PageState::Cached);
        pc.try_lock(3).unwrap();
        pc.unlock(3, MAPPED, 0);
        assert_eq!(pc.state(3), PageState::Installed);
        assert_eq!(pc.census(), [7, 0, 0, 1]);
    }

    #[test]
    fn waiter_is_woken() {
        let pc = Arc::new(PageCache::new(1).unwrap());
        pc.try_lock(0).unwrap();
        let p2 = pc.clone();
        let t = std::thread::spawn(move || {
            p2.wait_unlocked(0);
            p2.state(0)
        });
        while pc.load(0) & WAITERS == 0 {
            std::thread::yield_now();
        }
        pc.unlock(0, UPTODATE, 0);
        assert_eq!(t.join().unwrap(), PageState::Cached);
    }
}
