//! The engine's VMA: one registered range of an address space, mapping a
//! window of an [`Object`].

use crate::object::Object;
use crate::sync::region_lock::RegionLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;

/// What a region is mapped with besides its object and place
/// (`vm_flags`).
#[derive(Debug, Clone, Copy, Default)]
pub struct VmFlags {
    /// Mapped writable.
    pub writable: bool,
    /// Never evicted (`VM_LOCKED`).
    pub pinned: bool,
    /// Read at random (`VM_RAND_READ`).
    pub random: bool,
}

/// A registered range. Immutable in its bounds: an operation that changes
/// them (remap) publishes a new `Vma` and detaches this one, as the kernel
/// replaces VMAs on split and merge.
#[derive(Debug)]
pub struct Vma {
    /// First address.
    pub start: usize,
    /// One past the last address.
    pub end: usize,
    /// Page offset into the object of `start`, in the object's pages.
    pub pgoff: usize,
    /// What it maps.
    pub object: Arc<Object>,
    /// The per-VMA lock.
    pub lock: RegionLock,
    /// Writable (changed by protect under the region's write lock).
    pub writable: AtomicBool,
    /// Made read-only by [`Mm::protect`](crate::address_space::Mm::protect)
    /// with write protection (`UFFDIO_WRITEPROTECT` of every page, and
    /// pages installed protected) instead of `mprotect`: an anonymous
    /// region of base pages, whose mapping must stay writable for reclaim
    /// to move its pages out (`UFFDIO_MOVE` moves only out of writable
    /// mappings). `writable` is false meanwhile. The first write faults,
    /// and the fault makes the region read-only with `mprotect` and clears
    /// this flag, so the write gets the kernel's own answer (SIGSEGV, or
    /// EFAULT inside a system call). Set under the region's write lock.
    pub read_only_wp: AtomicBool,
    /// Set by the first anonymous fault (`anon_vma_prepare`), which needs
    /// the global lock.
    pub anon_prepared: AtomicBool,
    /// Never evicted (the mlock analog).
    pub pinned: bool,
    /// Read at random ([`crate::Access::Random`], `VM_RAND_READ`): its
    /// faults request no readahead. Set at map time, changed by
    /// [`crate::Region::advise`] (a flag read once per fault attempt, as
    /// the kernel reads `vm_flags`).
    pub random: AtomicBool,
    /// The [`crate::Region`] this VMA belongs to: pieces of one region (the
    /// application split it with its own `munmap`, or moved part of it)
    /// share it.
    pub id: u64,
    /// When this range was placed where it is, from one process-wide
    /// count ([`next_placement`]): by a map, or by a move to `start`. A
    /// piece cut from a region where it lies keeps its region's. Two
    /// pagers list one address live only while one of them has not yet
    /// applied the application's `munmap` there (the kernel frees the
    /// range before it posts the event) and the other has mapped there
    /// since. The first has an event on its way, which the SIGBUS handler
    /// asks first ([`crate::address_space::Mm::live_claim`]); where both
    /// have, the later placement is the range's, as the kernel has only
    /// the newer VMA.
    pub placed: u64,
    /// A remap, moved or refused, could not register the range again (it
    /// is left inaccessible: only its unmap works; set or cleared at each
    /// registration, `crate::mremap`'s `register_again`). The
    /// application's own `munmap` of it then raises no event, so this
    /// region's claim on its range can outlive the range: the SIGBUS
    /// handler counts it as in doubt ([`crate::address_space::Mm::live_claim`]).
    pub unregistered: AtomicBool,
}

/// The next placement stamp ([`Vma::placed`]). Async-signal-safe (one
/// atomic add).
pub(crate) fn next_placement() -> u64 {
    static PLACEMENTS: AtomicU64 = AtomicU64::new(1);
    PLACEMENTS.fetch_add(1, Relaxed)
}

impl Vma {
    /// A new, attached, unlocked VMA.
    pub fn new(start: usize, len: usize, pgoff: usize, object: Arc<Object>, writable: bool) -> Vma {
        Vma {
            start,
            end: start + len,
            pgoff,
            object,
            lock: RegionLock::new(),
            writable: AtomicBool::new(writable),
            read_only_wp: AtomicBool::new(false),
            anon_prepared: AtomicBool::new(false),
            pinned: false,
            random: AtomicBool::new(false),
            id: 0,
            placed: next_placement(),
            unregistered: AtomicBool::new(false),
        }
    }

    /// The piece `[start, end)` of this VMA (inside it), at `at` (`start`
    /// unless the piece moved): same object window, flags and region, a
    /// fresh lock; placed when this VMA was unless it moved.
    pub fn slice(&self, start: usize, end: usize, at: usize) -> Vma {
        debug_assert!(start >= self.start && end <= self.end && start < end);
        let mut v = Vma::new(
            at,
            end - start,
            self.page_index(start),
            self.object.clone(),
            self.writable.load(Relaxed),
        );
        v.pinned = self.pinned;
        v.random = AtomicBool::new(self.random.load(Relaxed));
        v.id = self.id;
        v.anon_prepared = AtomicBool::new(self.anon_prepared.load(Relaxed));
        v.read_only_wp = AtomicBool::new(self.read_only_wp.load(Relaxed));
        v.unregistered = AtomicBool::new(self.unregistered.load(Relaxed));
        if at == start {
            v.placed = self.placed;
        }
        v
    }

    /// This VMA's window of its object: `(first page, end page, base)`.
    pub fn window(&self) -> crate::object::Window {
        let (first, shift) = (self.pgoff, self.object.page_shift());
        (
            first,
            first + (self.len() >> shift),
            self.start.wrapping_sub(first << shift),
        )
    }

    /// A copy with new bounds (for remap): same object and flags, fresh lock,
    /// placed now (the range it grows into, or moves to, is new to it).
    pub fn resized(&self, start: usize, len: usize) -> Vma {
        let mut v = Vma::new(
            start,
            len,
            self.pgoff,
            self.object.clone(),
            self.writable.load(Relaxed),
        );
        v.pinned = self.pinned;
        v.random = AtomicBool::new(self.random.load(Relaxed));
        v.id = self.id;
        v.anon_prepared = AtomicBool::new(self.anon_prepared.load(Relaxed));
        v.read_only_wp = AtomicBool::new(self.read_only_wp.load(Relaxed));
        v
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether `addr` is inside.
    #[inline]
    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.start && addr < self.end
    }

    /// Object page index of `addr` (in the object's page size).
    #[inline]
    pub fn page_index(&self, addr: usize) -> usize {
        self.pgoff + ((addr - self.start) >> self.object.page_shift())
    }

    /// User address of object page `i`.
    #[inline]
    pub fn addr_of(&self, i: usize) -> usize {
        self.start + ((i - self.pgoff) << self.object.page_shift())
    }

    /// Object pages this VMA maps: `[first, first+count)`.
    pub fn pages(&self) -> std::ops::Range<usize> {
        self.pgoff..self.pgoff + (self.len() >> self.object.page_shift())
    }
}
