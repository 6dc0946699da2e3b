//! Taking a 2 MiB anonymous page out of the user mapping.
//!
//! A base page leaves by `UFFDIO_MOVE` (atomic: a write after the move
//! faults). Hugetlb has no `UFFDIO_MOVE`, so a huge page leaves in four
//! steps, each safe against the application's writes:
//!
//! 1. write-protect it (`UFFDIO_WRITEPROTECT`; the region is registered
//!    for WP): from here a write faults and waits for the page lock, which
//!    the caller holds, so the contents cannot change under the copy;
//! 2. copy it into the object's cache area through `/proc/self/mem`
//!    ([`crate::sys::huge::read_self`]): never a plain load from the user's
//!    mapping, where a page the application dropped would fault in the
//!    engine's own thread on a fault only the engine can serve;
//! 3. write the copy to swap;
//! 4. unless the application dropped it meanwhile (its own
//!    `MADV_DONTNEED`, which write protection does not stop), zap it
//!    (`MADV_DONTNEED`: the region's descriptor is the quiet one,
//!    so this raises no event). A write waiting since step 1 then finds the
//!    page absent and reads it back from swap.
//!
//! A page marked `CLEAN` skips steps 1-3: it was installed
//! write-protected for a read and not written since (a write faults and
//! clears the mark under the page lock), so its source (the store, or its
//! copy in swap) still holds it. Any step that fails lifts the protection again and leaves
//! the page where it was.

use super::evict::Unmapped;
use super::Pass;
use crate::address_space::Mm;
use crate::object::Object;
use crate::page_cache::CLEAN;
use crate::sys::pagemap::page_present;

/// Takes huge anonymous page `i` (mapped at `addr`; the caller holds its
/// page lock and its region's read lock) out of the mapping. `permitted`:
/// the caller holds a write permit for `obj` (`crate::write_error`); one
/// that found the page clean holds none. Async-signal-safe.
pub(super) fn unmap_anon(
    mm: &Mm,
    obj: &Object,
    i: usize,
    addr: usize,
    pass: &mut Pass,
    permitted: bool,
) -> Result<Unmapped, ()> {
    let len = obj.page_size();
    let in_thread = mm.config.delivery.is_in_thread();
    let changing = || mm.uffd_for(obj).mmap_changing();
    let zap = || {
        mm.events
            .act(in_thread, changing, || crate::sys::mem::zap(addr, len))
            .ok_or(())?
            .map_err(|_| ())
    };
    // Absent from `addr`: dropped by the application, if no event is on its
    // way. Its own `mremap` moves the page before the engine hears of it,
    // and a page taken for dropped then was uncharged, taken off the LRU
    // and lost its swap copy while it stayed mapped at the new address
    // (found by review). With an event on its way it is neither: the zap
    // below fails alike, and the page waits for a later pass.
    let dropped = || {
        mm.events
            .act(in_thread, changing, || page_present(addr) == Ok(false))
            == Some(true)
    };
    if obj.cache.load(i) & CLEAN != 0 {
        // The application may have dropped it (its own `MADV_DONTNEED`,
        // which this region's quiet descriptor does not report): then its
        // contents are the object's source again, not the copy it was read
        // from (an older swap copy would come back). One that drops it
        // between this look and the zap still has the window.
        if dropped() {
            return Ok(Unmapped::Dropped);
        }
        zap()?;
        return Ok(Unmapped::InCache);
    }
    // Clean when the caller looked, which was before this region's read
    // lock: `Region::protect(true)` clears the mark under the region's
    // write lock, and may have run between. The caller then asked for no
    // write permit, and the copy below would go to a store in its backoff,
    // or from a pass that may not write (found by review: 2 MiB written
    // to a failing store, or from a faulting thread's clean-only pass).
    // Later: the next look finds the page dirty and asks.
    if !permitted {
        return Err(());
    }
    // Hazard: the kernel's `UFFDIO_WRITEPROTECT` checks only that the
    // range is registered for write protection with *some* descriptor.
    // Across the store write below, the application may unmap the region
    // and another pager map a region there (its event read, not yet
    // applied: this holds the region's lock): lifting the protection then
    // made that pager's write-tracked pages writable behind it, and their
    // writes were never written back (found by review). So both ways go
    // as a fill does (`Events::fill`): not while an event is read and not
    // applied. (Left on, the protection is the departing region's: the
    // event's apply drops it.)
    let uffd = mm.uffd_for(obj);
    let protect = |on: bool| {
        mm.events
            .fill(in_thread, || uffd.writeprotect(addr, len, on, !on))
    };
    let unprotect = || {
        let _ = protect(false);
    };
    protect(true).map_err(|_| ())?;
    let Ok(dst) = obj.data(i) else {
        unprotect();
        return Err(());
    };
    // SAFETY: `dst` is page `i`'s place in the cache area (`len` bytes),
    // ours under the page lock.
    if unsafe { crate::sys::huge::read_self(addr, dst, len) }.is_err() {
        let _ = obj.free_data(i, 1);
        if dropped() {
            return Ok(Unmapped::Dropped);
        }
        unprotect();
        return Err(());
    }
    // SAFETY: as above; the copy is complete.
    let page = unsafe { std::slice::from_raw_parts(dst as *const u8, len) };
    let off = (i << obj.page_shift()) as u64;
    let written = pass.write_out(mm, obj, &[(off, page)]);
    // The write-protection keeps the application's writes out, not its
    // own `MADV_DONTNEED` (which the quiet descriptor does not report):
    // a page dropped during the store write reads as its source again, not
    // as the copy just made (found by review: the old bytes came back). A
    // drop between this look and the zap still has that window, as for a
    // clean page above, but it is a system call long, not a store write.
    if dropped() {
        let _ = obj.free_data(i, 1);
        if written {
            crate::discard::forget_swap(obj, i);
        }
        return Ok(Unmapped::Dropped);
    }
    if zap().is_err() {
        let _ = obj.free_data(i, 1);
        unprotect();
        return Err(());
    }
    if written {
        let _ = obj.free_data(i, 1);
        Ok(Unmapped::WrittenBack)
    } else {
        Ok(Unmapped::KeptDirty)
    }
}
