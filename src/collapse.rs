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
//! # Who collapses: the completing fill, then khugepaged
//! The context whose fill completes an extent (a fault, possibly in its
//! SIGBUS handler, or a readahead thread) collapses it. An extent that
//! cannot be collapsed for the moment (a page of it locked, guarded by a
//! system call, or busy in the kernel: `EAGAIN`) is queued
//! (`Mm::khugepaged`) for the pager's khugepaged thread, started with its
//! first kernel-mapped object that has an extent ([`start_khugepaged`]),
//! which tries it again up to [`RETRIES`] times over about a second.
//! Before, such an extent stayed in base pages until its next fill (a
//! 2-extent test saw one of them stay so in 6 runs of 20).
//!
//! Why not every collapse in khugepaged, as the kernel does: measured
//! (`bench filemap --threads 1 --kernel-maps --baseline kernel`, four
//! runs of each, alternated), the engine's worst access took 5.4–9.4 ms
//! in every run with every collapse there, against 1.3–10.9 ms (three
//! runs of four under 5.3) with the completing fill's collapse, and
//! 1.7–7.1 ms in the build before khugepaged. The likely cause (not
//! traced): while the kernel collapses an extent, an access to it waits
//! for the new folio, and a collapse in another thread can be preempted
//! midway on a machine of two CPUs; in the completing fault the wait is
//! that fault's own.
//!
//! # Cost
//! After a page is cached: two loads unless the first and last pages of
//! its extent are cached; then up to 512 loads, and where all are cached
//! 512 try-locks, the `madvise` (a 2 MiB allocation, a copy and
//! page-table work, once per extent), and 512 unlocks; a busy extent
//! costs a push and a futex wake more. A collapse the kernel refuses for want of a
//! huge page (`ENOMEM`, `EBUSY`) costs that once and leaves the extent in
//! base pages; any other refusal also ends collapses for the object. None
//! is tried where huge pages are off ([`possible`], read at map time).
//! [`after_cached`] is async-signal-safe (atomics and system calls): a
//! fault's fill runs it in the SIGBUS handler.

use crate::address_space::Mm;
use crate::lru::{entry, unpack};
use crate::object::{Extents, Object, EXTENT_PAGES};
use crate::page_cache::{GUARDS, POISONED, UPTODATE};
use crate::stats::Counter::{THP_COLLAPSE_ALLOC, THP_COLLAPSE_ALLOC_FAILED};
use crate::sync::work_queue::Next;
use crate::sys::huge::HUGE_PAGE_SIZE;
use crate::sys::now_ns;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

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
/// the extent is collapsed, or queued for khugepaged to try again where
/// it is busy (a full queue drops it). Looks at the extent's first and
/// last pages, then, if both are cached, at the others (plain loads),
/// before it locks any.
pub fn after_cached(mm: &Mm, obj: &Object, i: usize) {
    let first = i / EXTENT_PAGES * EXTENT_PAGES;
    if !complete(obj, first) {
        return;
    }
    if let Some(x) = obj.extents.as_ref() {
        if collapse(mm, obj, x, first / EXTENT_PAGES) == Outcome::Busy
            && mm.khugepaged.push(entry(obj.slot.load(Relaxed), first))
        {
            mm.khugepaged.kick();
        }
    }
}

/// Whether the extent at page `first` of `obj` is one to collapse: not
/// collapsed, whole within the object, and every page cached.
fn complete(obj: &Object, first: usize) -> bool {
    let Some(x) = obj.extents.as_ref() else {
        return false;
    };
    if x.is_set(first / EXTENT_PAGES) || x.refused() || first + EXTENT_PAGES > obj.npages() {
        return false;
    }
    let cached = |k: usize| obj.cache.load(k) & UPTODATE != 0;
    cached(first) && cached(first + EXTENT_PAGES - 1) && (first..first + EXTENT_PAGES).all(cached)
}

/// What a collapse came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Collapsed, refused for good, or nothing to do (no longer whole).
    Done,
    /// A page was locked, guarded or busy in the kernel: worth another try.
    Busy,
}

/// Times khugepaged tries an extent that was [busy](Outcome::Busy): after
/// 1, 2, 4, ... ms, 1,023 ms in all.
pub const RETRIES: u32 = 10;

/// Busy extents khugepaged keeps to try again; more are dropped.
const MAX_LATER: usize = 1024;

/// Collapses extent `e` of `obj` into a huge folio, if all its pages are
/// cached and none is locked, poisoned or guarded.
fn collapse(mm: &Mm, obj: &Object, x: &Extents, e: usize) -> Outcome {
    let first = e * EXTENT_PAGES;
    let Ok(addr) = obj.data(first) else {
        return Outcome::Done;
    };
    // (The alias is aligned where the object has a whole extent; a
    // misaligned one could not be collapsed through.)
    if !(addr as usize).is_multiple_of(HUGE_PAGE_SIZE) {
        return Outcome::Done;
    }
    // A page no longer cached (evicted since) or poisoned ends the try:
    // the fill that caches it again queues the extent again.
    let gone = std::cell::Cell::new(false);
    let Some(_) = obj.lock_extent(first, LOCK_PATIENCE, |w| {
        gone.set(gone.get() || w & (UPTODATE | POISONED) != UPTODATE);
        w & (UPTODATE | POISONED) == UPTODATE && w & GUARDS == 0
    }) else {
        return if gone.get() {
            Outcome::Done
        } else {
            Outcome::Busy
        };
    };
    // (Queued twice, by two fills that each saw it complete.)
    if x.is_set(e) {
        obj.unlock_extent(first, EXTENT_PAGES, 0);
        return Outcome::Done;
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
    let outcome = match r {
        Ok(()) => {
            x.set(e, true);
            mm.counters.inc(THP_COLLAPSE_ALLOC);
            // The collapse left the huge folio mapped in the alias, which
            // nothing reads it through: unmapped again (the page cache
            // keeps it), so that the region's mapping is its only one, as
            // a file's own mapping is (the kernel's per-mapping accounting
            // costs a first mapping more than a second).
            let _ = crate::sys::mem::madvise(addr as usize, HUGE_PAGE_SIZE, libc::MADV_DONTNEED);
            Outcome::Done
        }
        // Pages still busy after the tries above: khugepaged tries later.
        Err(libc::EAGAIN) => Outcome::Busy,
        // No huge page to be had (`ENOMEM`, or its charge to the memory
        // cgroup, `EBUSY`): refused before any folio was made. The extent
        // stays in base pages.
        Err(libc::ENOMEM | libc::EBUSY) => {
            mm.counters.inc(THP_COLLAPSE_ALLOC_FAILED);
            Outcome::Done
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
            Outcome::Done
        }
    };
    obj.unlock_extent(first, EXTENT_PAGES, 0);
    outcome
}

/// Collapses the extent a queue entry names, if its object is still there
/// and the extent still complete.
fn collapse_entry(mm: &Mm, e: u64) -> Outcome {
    let (slot, first) = unpack(e);
    // (A slot reused by another object since: that object's extent, if
    // it is one to collapse, which does no harm.)
    let Some(obj) = mm.objects.pin(slot) else {
        return Outcome::Done;
    };
    match obj.extents.as_ref() {
        Some(x) if complete(&obj, first) => collapse(mm, &obj, x, first / EXTENT_PAGES),
        _ => Outcome::Done,
    }
}

/// A busy extent to try again at `due` (`now_ns`).
struct Later {
    e: u64,
    tries: u32,
    due: u64,
}

/// Starts `mm`'s khugepaged: the thread that collapses the extents fills
/// complete (see the module docs) until [`stop_khugepaged`].
pub fn start_khugepaged(mm: &Arc<Mm>) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mm = mm.clone();
    crate::sys::thread::spawn("uffd-khugepaged".into(), move || {
        // Each extent waits 1 ms before its first try here (the
        // completing context's try has just failed), and twice as long
        // before each next one.
        let mut later: Vec<Later> = Vec::new();
        let queue = |later: &mut Vec<Later>, e: u64, tries: u32| {
            if tries < RETRIES && later.len() < MAX_LATER {
                let due = now_ns() + (1_000_000 << tries);
                later.push(Later { e, tries, due });
            }
        };
        loop {
            let now = now_ns();
            let Some(k) = later.iter().position(|l| l.due <= now) else {
                let wait = later.iter().map(|l| l.due - now).min();
                match mm.khugepaged.next_within(wait) {
                    Next::Item(e) => queue(&mut later, e, 0),
                    Next::TimedOut => {}
                    Next::Stopped => return,
                }
                continue;
            };
            let l = later.swap_remove(k);
            if collapse_entry(&mm, l.e) == Outcome::Busy {
                queue(&mut later, l.e, l.tries + 1);
            }
        }
    })
}

/// Stops khugepaged (the thread exits at its next wake-up; extents still
/// queued stay in base pages).
pub fn stop_khugepaged(mm: &Mm) {
    mm.khugepaged.stop();
}
