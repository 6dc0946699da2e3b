//! Huge folios for kernel-mapped objects: the engine's `khugepaged`
//! (`collapse_file`), and the reclaim of a huge folio as one unit.
//!
//! # Why
//! A kernel-mapped object's pages
//! ([`MapOptions::kernel_maps`](crate::MapOptions::kernel_maps)) are
//! mapped by the kernel's own fault path. In a memfd of base-page folios
//! (shmem's transparent huge pages are off on the machines this project
//! runs on, and a kernel-mapped region is refused where they are not)
//! each fault maps at most its fault-around window, a page-table entry
//! and an rmap update per page; the kernel's own mapping of a file on a
//! disk file system, whose page cache is in large folios, maps a folio at
//! a time. Once all [`EXTENT_PAGES`] pages of a 2 MiB extent of the memfd
//! are cached, the engine collapses them into one PMD-sized folio
//! (`MADV_COLLAPSE` through the object's alias, which needs no
//! transparent-huge-page setting): the kernel then maps the extent with
//! one PMD in a region placed on a 2 MiB boundary (the engine places
//! kernel-mapped regions so), and with one batch per fault-around window
//! elsewhere.
//!
//! # Hazards
//! - **A huge folio is punched whole.** Punching part of a large folio
//!   splits it, and where the split fails (another reference held for a
//!   moment: a concurrent mapping of it, a per-CPU LRU batch) the kernel
//!   zeroes the punched part in place and leaves the folio in the page
//!   cache: a page the engine takes for absent would be mapped by the
//!   kernel, as zeros, with no fault. So a collapsed extent is never
//!   punched in part: reclaim evicts it whole (`reclaim::extent`, as the
//!   kernel reclaims a large folio as one), with every page's lock held;
//!   `Object::free_data` refuses a range that covers part of one; a
//!   refresh that cannot read its store keeps such a page (with the
//!   error).
//! - **A collapse fills holes with zeros.** It runs only with every page
//!   of the extent cached and locked, so that none can be punched
//!   meanwhile.
//!
//! The bits saying which extents are collapsed are the object's
//! (`object::extents`); reclaim's whole-extent eviction is `reclaim`'s
//! `extent`.
//!
//! # Cost
//! After a page is cached: two loads unless the first and last pages of
//! its extent are cached; then up to 512 loads, and where all are cached
//! 512 try-locks, the `madvise` (a 2 MiB allocation, a copy
//! and page-table work, once per extent), and 512 unlocks. A collapse the
//! kernel refuses for want of a huge page (`ENOMEM`, `EBUSY`) costs that
//! once and leaves the extent in base pages; any other refusal also ends
//! collapses for the object. None is tried where huge pages are off
//! ([`possible`], read at map time).
//! Async-signal-safe (atomics and one system call): a fault's fill runs it
//! in the SIGBUS handler.

use crate::address_space::Mm;
use crate::object::{Extents, Object, EXTENT_PAGES};
use crate::page_cache::{GUARDS, POISONED, UPTODATE};
use crate::stats::Counter::{THP_COLLAPSE_ALLOC, THP_COLLAPSE_ALLOC_FAILED};
use crate::sys::huge::HUGE_PAGE_SIZE;

/// CPU yields a collapse waits through, in all, for pages of its extent
/// that are locked (see `Object::lock_extent`).
const LOCK_PATIENCE: u32 = 64;

/// Whether a collapse can succeed here: huge pages are not denied to shmem
/// (`shmem_enabled` `deny`) nor to this process
/// (`prctl(PR_SET_THP_DISABLE)`). Read when a kernel-mapped object is
/// made; allocates (ordinary threads only).
pub fn possible() -> bool {
    let dir = std::path::Path::new(crate::sys::pipe::THP_DIR);
    let denied = crate::sys::pipe::setting(&dir.join("shmem_enabled")).as_deref() == Some("deny");
    // SAFETY: PR_GET_THP_DISABLE takes no pointer and only reads a flag.
    let off = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) } > 0;
    !denied && !off
}

/// `MADV_COLLAPSE` calls for one extent while the kernel answers `EAGAIN`.
const COLLAPSE_TRIES: u32 = 3;

/// Page `i` of `obj` was just cached (by a fault or readahead; the caller
/// holds no lock of its extent's pages): if that completes its extent,
/// the extent is collapsed. Looks at the extent's first and last pages,
/// then, if both are cached, at the others (plain loads) before it locks
/// any.
pub fn after_cached(mm: &Mm, obj: &Object, i: usize) {
    let Some(x) = obj.extents.as_ref() else {
        return;
    };
    let (e, first) = (i / EXTENT_PAGES, i / EXTENT_PAGES * EXTENT_PAGES);
    if x.is_set(e) || x.refused() || first + EXTENT_PAGES > obj.npages() {
        return;
    }
    let cached = |k: usize| obj.cache.load(k) & UPTODATE != 0;
    if !(cached(first) && cached(first + EXTENT_PAGES - 1)) {
        return;
    }
    if (first..first + EXTENT_PAGES).all(cached) {
        collapse(mm, obj, x, e);
    }
}

/// Collapses extent `e` of `obj` into a huge folio, if all its pages are
/// cached and none is locked, poisoned or guarded.
fn collapse(mm: &Mm, obj: &Object, x: &Extents, e: usize) {
    let first = e * EXTENT_PAGES;
    let Ok(addr) = obj.data(first) else { return };
    // (The alias is aligned where the object has a whole extent; a
    // misaligned one could not be collapsed through.)
    if !(addr as usize).is_multiple_of(HUGE_PAGE_SIZE) {
        return;
    }
    let Some(_) = obj.lock_extent(first, LOCK_PATIENCE, |w| {
        w & (UPTODATE | POISONED) == UPTODATE && w & GUARDS == 0
    }) else {
        return;
    };
    // (Another fill completed it too, and collapsed it first.)
    if x.is_set(e) {
        obj.unlock_extent(first, EXTENT_PAGES, 0);
        return;
    }
    // `EAGAIN`: a page of it was busy in the kernel for a moment (still in
    // a per-CPU LRU batch, or being mapped): tried again.
    let mut r = Err(libc::EAGAIN);
    for _ in 0..COLLAPSE_TRIES {
        r = crate::sys::mem::madvise(addr as usize, HUGE_PAGE_SIZE, libc::MADV_COLLAPSE);
        if r != Err(libc::EAGAIN) {
            break;
        }
        std::thread::yield_now();
    }
    match r {
        Ok(()) => {
            x.set(e, true);
            mm.counters.inc(THP_COLLAPSE_ALLOC);
            // The collapse left the huge folio mapped in the alias, which
            // nothing reads it through: unmapped again (the page cache
            // keeps it), so that the region's mapping is its only one, as
            // a file's own mapping is (the kernel's per-mapping accounting
            // costs a first mapping more than a second).
            let _ = crate::sys::mem::madvise(addr as usize, HUGE_PAGE_SIZE, libc::MADV_DONTNEED);
        }
        // No huge page to be had (`ENOMEM`, or its charge to the memory
        // cgroup, `EBUSY`), or pages busy (`EAGAIN`): refused before any
        // folio was made. The extent stays in base pages.
        Err(libc::ENOMEM | libc::EBUSY | libc::EAGAIN) => {
            mm.counters.inc(THP_COLLAPSE_ALLOC_FAILED)
        }
        // Anything else (`EINVAL`: huge pages turned off since the map)
        // stops collapses for this object, and this extent is evicted
        // whole all the same: an error may come after the huge folio was
        // made (a review read so in the kernel's `madvise_collapse`,
        // where mapping it into the calling mapping is a last step that
        // can fail; not seen here:
        // `an_extent_far_into_a_large_object_is_collapsed`), and evicting
        // an extent of base pages whole costs only its other pages.
        Err(_) => {
            x.set(e, true);
            x.refuse();
            mm.counters.inc(THP_COLLAPSE_ALLOC_FAILED);
        }
    }
    obj.unlock_extent(first, EXTENT_PAGES, 0);
}
