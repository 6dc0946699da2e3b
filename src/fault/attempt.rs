//! One fault attempt, `attempt(lock, tried)`: steps 1-5 of
//! `kernel-model.md`.

use super::install::{
    copy_in, install, installs_clean, installs_wp, poison, recheck_installed, Recheck,
};
use super::load::{load, read_with_retries, LoadResult};
use super::{Fault, LockKind, Outcome};
use crate::address_space::{Mm, VmaReadGuard};
use crate::object::{InstallKind, Object};
use crate::page_cache::{
    PageState, CLEAN, DIRTY, LOCKED, MAPPED, MOVED, PINNED, POISONED, READAHEAD, REFERENCED,
    SWAPPED, UPTODATE,
};
use crate::stats::Counter::*;
use crate::sync::global_lock::ReadGuard;
use crate::sys::{PageBuf, PAGE_SIZE};
use crate::vma::Vma;
use std::sync::atomic::Ordering::*;

/// The lock an attempt holds; dropping it releases the lock.
enum Held<'a> {
    Region(VmaReadGuard<'a>),
    Global(#[allow(dead_code)] ReadGuard<'a>, &'a Vma),
}

impl Held<'_> {
    fn vma(&self) -> &Vma {
        match self {
            Held::Region(g) => g,
            Held::Global(_, v) => v,
        }
    }
}

/// Runs one attempt for `f` under `lock`.
pub(super) fn attempt(mm: &Mm, f: &mut Fault, lock: LockKind) -> Outcome {
    // Step 1: find the region and take the lock.
    let held = match lock {
        LockKind::Region => match mm.lock_vma_under_rcu(f.addr) {
            Ok(g) => Held::Region(g),
            Err(_) => return Outcome::Abort,
        },
        LockKind::Global => {
            let g = mm.lock.read();
            match mm.find_vma_locked(f.addr) {
                Some(v) => Held::Global(g, v),
                None => return Outcome::Segv,
            }
        }
    };
    let vma = held.vma();
    // Another region than the engine's own call is for: none for it.
    if f.region.is_some_and(|id| id != vma.id) {
        return match lock {
            LockKind::Region => Outcome::Abort,
            LockKind::Global => Outcome::Segv,
        };
    }
    let obj = &*vma.object;
    // A write reaches a kernel-mapped region only if the application made
    // it writable itself; the engine could not see later writes to the
    // page, so it refuses this one (see `MapOptions::kernel_maps`).
    if f.write && obj.kernel_maps {
        return Outcome::Denied;
    }
    // A write to a region made read-only with write protection (see
    // `Vma::read_only_wp`): the region becomes read-only for real, and the
    // access, run again, gets the kernel's own answer: SIGSEGV, or EFAULT
    // for a write inside a system call. (Refused from here, a write inside
    // a system call would fault again for ever: a SIGSEGV sent to a thread
    // in the kernel is not fatal there while the program has a handler for
    // it.) Its resident pages then stay until it is made writable again.
    if f.write && vma.read_only_wp.load(Acquire) {
        // The engine's own fault (populate, prefault, a residency guard)
        // that read the region as writable before a racing `protect(false)`:
        // a read does.
        if f.present.is_none() {
            f.write = false;
        } else {
            // Events first: the range may no longer be this region's (an
            // `mprotect` checks nothing, unlike the ioctls that fail with
            // EAGAIN then), so it runs as a fill (`Events::fill`), and not
            // while an unmap or move is on its way.
            let uffd = mm.uffd_for(obj);
            let in_thread = mm.config.delivery.is_in_thread();
            let protect = || match uffd.mmap_changing() {
                true => Err(libc::EAGAIN),
                false => crate::sys::mem::mprotect(vma.start, vma.len(), libc::PROT_READ),
            };
            match mm.events.fill(in_thread, protect) {
                Ok(()) => {}
                Err(libc::EAGAIN) => return Outcome::Restart,
                Err(_) => return Outcome::Denied,
            }
            vma.read_only_wp.store(false, Release);
            return Outcome::Done;
        }
    }

    // Step 2: work that needs the global lock (`__vmf_anon_prepare`).
    if obj.zero_fill && !vma.anon_prepared.load(Acquire) {
        match &held {
            Held::Region(_) => match mm.lock.try_read() {
                Some(_g) => vma.anon_prepared.store(true, Release),
                None => return Outcome::Retry { major: false },
            },
            Held::Global(..) => vma.anon_prepared.store(true, Release),
        }
    }

    let i = vma.page_index(f.addr);
    // (Read before the lock may be dropped for a major fault's I/O.)
    let readahead = !vma.random.load(Relaxed);
    // Readahead reads no page past this piece of the region: nothing maps
    // those (a shrink, the application's own `munmap`, a map shorter than
    // its store).
    let ra_limit = vma.pages().end;
    // `RETRY_IO_MISS` is counted once per attempt at most.
    let mut missed = false;
    loop {
        let w = obj.cache.load(i);
        if w & POISONED != 0 {
            return poison(mm, vma, i);
        }
        if w & LOCKED != 0 {
            // Step 4: someone else's I/O, install or eviction.
            let uptodate = w & UPTODATE != 0;
            if f.tried || (uptodate && mm.config.policy.uptodate_no_retry) {
                obj.cache.wait_unlocked(i);
                continue;
            }
            let pin = obj.pin();
            drop(held);
            pin.cache.wait_unlocked(i);
            mm.counters.inc(RETRY_MMAP_DROP);
            return Outcome::Retry { major: false };
        }
        match PageState::of(w) {
            // Installed: a racing fault mapped it, this is a write to a
            // write-protected page (the `page_mkwrite` path), or it left
            // the mapping behind the engine's back; see `recheck_installed`.
            PageState::Installed => {
                if obj.cache.try_lock(i).is_err() {
                    continue;
                }
                let w = obj.cache.load(i);
                if w & (UPTODATE | MAPPED) != UPTODATE | MAPPED {
                    obj.cache.unlock(i, 0, 0);
                    continue;
                }
                match recheck_installed(mm, vma, f, i, w) {
                    Recheck::Present { dirty } => {
                        // A dirty page is no longer its source's copy.
                        let (dirty, clean) = if dirty { (DIRTY, CLEAN) } else { (0, 0) };
                        obj.cache.unlock(i, REFERENCED | dirty, clean);
                        return Outcome::Done;
                    }
                    Recheck::Gone => {
                        mm.counters.inc(PAGE_DROPPED);
                        let clear = crate::discard::discard_page(mm, obj, i, w);
                        obj.cache.unlock(i, 0, clear);
                        continue;
                    }
                    Recheck::Again => {
                        obj.cache.unlock(i, 0, 0);
                        return Outcome::Restart;
                    }
                    Recheck::Denied => {
                        obj.cache.unlock(i, 0, 0);
                        return Outcome::Denied;
                    }
                    Recheck::Failed => {
                        obj.cache.unlock(i, 0, 0);
                        return Outcome::NoPage;
                    }
                }
            }
            // Step 3: cached: install it.
            PageState::Cached => {
                if obj.cache.try_lock(i).is_err() {
                    continue;
                }
                let w = obj.cache.load(i);
                if w & (UPTODATE | MAPPED) != UPTODATE {
                    obj.cache.unlock(i, 0, 0);
                    continue;
                }
                if w & READAHEAD != 0 {
                    // A read-ahead page used: keep the window moving.
                    mm.counters.inc(RA_USED);
                    obj.cache.update(i, 0, READAHEAD);
                    if readahead {
                        crate::readahead::on_fault(mm, obj, i, ra_limit);
                    }
                }
                return finish_install(mm, vma, f, i, false, false);
            }
            // (Loading always has LOCKED, handled above.)
            PageState::Loading => continue,
            PageState::Absent => {}
        }

        // Absent. After a retry (`tried`): what an I/O brought in is gone
        // (Miss/Drop's miss). Not for a page never read: an anonymous one
        // never swapped out is a zero-page fill, no I/O.
        if f.tried && !missed && !(obj.zero_fill && w & SWAPPED == 0) {
            missed = true;
            mm.counters.inc(RETRY_IO_MISS);
        }
        let Ok(prev) = obj.cache.try_lock(i) else {
            continue;
        };
        if prev & (UPTODATE | POISONED) != 0 {
            obj.cache.unlock(i, 0, 0);
            continue;
        }
        let pinned = if vma.pinned { PINNED } else { 0 };
        crate::reclaim::charge(mm, obj.units());

        // An anonymous page never written back: a minor zero-page fault.
        if obj.zero_fill && prev & SWAPPED == 0 {
            return finish_install(mm, vma, f, i, true, true);
        }

        // Step 5: a major fault.
        f.major = true;
        if obj.kind == InstallKind::Anonymous
            && !obj.is_huge()
            && !vma.writable.load(Acquire)
            && obj.source(prev).synchronous()
            && obj.source(prev).signal_safe()
        {
            return read_and_copy(mm, vma, i, prev, pinned, f.write);
        }
        if !f.tried {
            let pin = obj.pin();
            drop(held);
            let r = load(mm, &pin, i);
            pin.cache.unlock(i, loaded_bits(r) | pinned, MOVED);
            if r == LoadResult::NoMemory {
                // The pool is empty: SIGBUS now, as below (the kernel's
                // hugetlb fault does not retry it either). No I/O was
                // done, so no retry, no miss after it, no major fault.
                mm.uncharge(pin.units());
                f.major = false;
                return Outcome::NoPage;
            }
            if r != LoadResult::Ok {
                mm.uncharge(pin.units());
            } else {
                mm.page_cached(&pin, i);
                crate::collapse::after_cached(mm, &pin, i);
                if readahead {
                    crate::readahead::on_fault(mm, &pin, i, ra_limit);
                }
            }
            mm.counters.inc(RETRY_MMAP_DROP);
            return Outcome::Retry { major: true };
        }
        match load(mm, obj, i) {
            LoadResult::Ok => {
                if readahead {
                    crate::readahead::on_fault(mm, obj, i, ra_limit);
                }
                return finish_install(mm, vma, f, i, false, true);
            }
            LoadResult::Failed => {
                obj.cache.unlock(i, POISONED, 0);
                mm.uncharge(obj.units());
                return poison(mm, vma, i);
            }
            // The pool is empty: SIGBUS now, as the kernel's hugetlb fault
            // raises it; the page stays absent for the next access.
            LoadResult::NoMemory => {
                obj.cache.unlock(i, 0, 0);
                mm.uncharge(obj.units());
                f.major = false;
                return Outcome::NoPage;
            }
        }
    }
}

/// Step 5 for an anonymous page of a read-only region whose store never
/// waits on a device: read it under the lock into a buffer on the stack and
/// copy it into place, keeping no copy in the cache area (the kernel's
/// synchronous swap-in, `SWP_SYNCHRONOUS_IO`). The page is clean: reclaim
/// can drop it with the next batched zap. The caller holds the page lock
/// and charged the page.
fn read_and_copy(mm: &Mm, vma: &Vma, i: usize, w: u32, pinned: u32, write: bool) -> Outcome {
    let obj: &Object = &vma.object;
    // (Base pages only: the caller sends huge pages the cache-area way.)
    let off = (i * PAGE_SIZE) as u64;
    let source = obj.source(w);
    let clean = if installs_clean(vma, w, write) {
        CLEAN
    } else {
        0
    };
    let wp = installs_wp(vma, w, write);
    // Read for this fault: not referenced (see `finish_install`).
    let installed = |mm: &Mm| {
        obj.cache
            .unlock(i, UPTODATE | MAPPED | MOVED | clean | pinned, 0);
        mm.page_cached(obj, i);
        Outcome::Done
    };
    // Where the store's page already sits in memory, copy straight from
    // there; if the kernel cannot read it, take the plain way below.
    let not_installed = |e: i32| {
        // Nothing is cached: the page is absent again. EAGAIN: an event
        // first; otherwise the kernel refused the install (it should not):
        // report SIGBUS rather than loop.
        obj.cache.unlock(i, 0, 0);
        mm.uncharge(obj.units());
        if e == libc::EAGAIN {
            Outcome::Restart
        } else {
            Outcome::NoPage
        }
    };
    if let Some(src) = crate::io::page_in_memory(&**source, off) {
        match copy_in(mm, vma, i, src, wp) {
            Ok(()) => {
                mm.counters.inc(PGREAD);
                return installed(mm);
            }
            Err(libc::EAGAIN) => return not_installed(libc::EAGAIN),
            Err(_) => {}
        }
    }
    let mut buf = PageBuf::zeroed();
    if read_with_retries(mm, || crate::io::read(&mm.io, source, off, &mut buf.0))
        == LoadResult::Failed
    {
        obj.cache.unlock(i, POISONED, 0);
        mm.uncharge(obj.units());
        return poison(mm, vma, i);
    }
    match copy_in(mm, vma, i, buf.0.as_ptr() as usize, wp) {
        Ok(()) => installed(mm),
        Err(e) => not_installed(e),
    }
}

fn loaded_bits(r: LoadResult) -> u32 {
    match r {
        LoadResult::Ok => UPTODATE,
        LoadResult::Failed => POISONED,
        LoadResult::NoMemory => 0,
    }
}

/// Installs locked page `i` and unlocks it as Installed. `fresh`: the page
/// just became resident (it joins the LRU).
fn finish_install(mm: &Mm, vma: &Vma, f: &Fault, i: usize, zero: bool, fresh: bool) -> Outcome {
    let obj: &Object = &vma.object;
    // Second chance: a page this fault found cached (read ahead, kept from
    // an earlier mapping, filled by a racing fault) is a page used again,
    // as the kernel's `mark_page_accessed` marks a page-cache hit; one read
    // or zero-filled for this fault enters the LRU unreferenced, and so do
    // the neighbours fault-around maps with it. (The kernel's fault also
    // leaves its PTE young, so reclaim keeps every new page one more round
    // and sees at the next look whether it was touched since; the engine
    // cannot see that look, so the round would delay every eviction alike
    // and cost an LRU rotation each.)
    let referenced = if fresh || f.major { 0 } else { REFERENCED };
    // A read fault on a shared object maps the page with its cached
    // neighbours (fault-around); alone if that did not map it. A 2 MiB
    // page is its own cluster.
    let around = !f.write
        && obj.kind == InstallKind::Shared
        && !obj.kernel_maps
        && !obj.is_huge()
        && mm.config.fault_around_pages > 1;
    // A kernel-mapped object's page is in the memfd now: the access, run
    // again, maps it (`MapOptions::kernel_maps`).
    let installed = if obj.kernel_maps {
        Ok(false)
    } else if around && super::around::map_pages(mm, vma, i, referenced) {
        mm.counters.inc(PGINSTALL);
        Ok(false)
    } else {
        install(
            mm,
            vma,
            i,
            zero,
            f.write,
            installs_wp(vma, obj.cache.load(i), f.write),
        )
    };
    match installed {
        Ok(moved) => {
            // A write fault on a write-tracked page installs it writable:
            // it is dirty from now on.
            let dirty = if obj.tracks_writes() && f.write {
                DIRTY
            } else {
                0
            };
            let pinned = if vma.pinned { PINNED } else { 0 };
            let mut moved = if moved { MOVED } else { 0 };
            // See `installs_clean`. A 2 MiB page read back from swap may
            // be clean: that copy stays in swap until the page is dropped
            // or written out anew, so it may be dropped too. (The state
            // word is loaded only for anonymous pages: a shared install,
            // the common path, skips it.)
            let clean = if obj.kind == InstallKind::Anonymous
                && installs_clean(vma, obj.cache.load(i), f.write)
            {
                CLEAN
            } else {
                0
            };
            // A clean page copied into a read-only region (a move is not
            // allowed there) has its contents twice: in the region and in
            // the cache area it was read into. The store still holds them,
            // so the area's copy goes at once, as `read_and_copy` keeps
            // none: otherwise every resident page costs two, and the
            // budget bounds only half of the memory.
            if clean != 0 && moved == 0 && !zero && obj.free_data(i, 1).is_ok() {
                moved = MOVED;
            }
            obj.cache.unlock(
                i,
                UPTODATE | MAPPED | referenced | dirty | pinned | moved | clean,
                0,
            );
            if fresh {
                mm.page_cached(obj, i);
                crate::collapse::after_cached(mm, obj, i);
            }
            Outcome::Done
        }
        // No page in the memfd at that offset (`UFFDIO_CONTINUE` answers
        // `EFAULT` for a hole): the application punched it (`MADV_REMOVE`
        // through its mapping) after it was cached, by readahead or a fault
        // that did not map it. As `recheck_installed` does for a mapped
        // page: give it up and fault it in again.
        Err(libc::EFAULT) if obj.kind == InstallKind::Shared && !zero => {
            let clear = if fresh {
                // Charged, not yet on the LRU or up to date.
                mm.uncharge(obj.units());
                let _ = obj.free_data(i, 1);
                crate::discard::DISCARDED
            } else {
                crate::discard::discard_page(mm, obj, i, obj.cache.load(i))
            };
            obj.cache.unlock(i, 0, clear);
            mm.counters.inc(PAGE_DROPPED);
            Outcome::Retry { major: false }
        }
        Err(e) => {
            // Not installed: the page goes back to what it was before this
            // install. A fresh zero page is absent again; a page this fault
            // just read is cached; a cached page stays cached.
            if zero {
                obj.cache.unlock(i, 0, 0);
                mm.uncharge(obj.units());
            } else if fresh {
                let pinned = if vma.pinned { PINNED } else { 0 };
                obj.cache.unlock(i, UPTODATE | pinned, MOVED);
                mm.page_cached(obj, i);
                crate::collapse::after_cached(mm, obj, i);
            } else {
                obj.cache.unlock(i, 0, 0);
            }
            // EAGAIN: an event first. Otherwise the kernel refused (it
            // should not): report SIGBUS rather than loop.
            if e == libc::EAGAIN {
                Outcome::Restart
            } else {
                Outcome::NoPage
            }
        }
    }
}
