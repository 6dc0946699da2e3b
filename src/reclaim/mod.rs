//! Reclaim under the memory budget: the background reclaimer (kswapd),
//! direct reclaim in the faulting context, and eviction of one page that
//! loses no write.
//!
//! Evicting page `i` of an object (`shrink_folio_list` for one folio):
//! 1. try-lock the page (never wait: a locked page is busy, rotate it);
//! 2. a page referenced since the last look gets a second chance;
//! 3. if installed, take it out of the user mapping under the region's read
//!    lock (writers excluded): shared objects zap the PTE
//!    (`MADV_DONTNEED`; the data stays in the memfd), anonymous ones move
//!    the page out atomically with `UFFDIO_MOVE` to a staging slot and
//!    write it to swap from there, so no concurrent write can be lost: a
//!    write after the move faults and waits for the page lock;
//! 4. write a cached page back if dirty;
//! 5. free the cached contents (hole punch / `MADV_DONTNEED`), uncharge.
//!
//! A write-back failure keeps the page cached and dirty. A pass (one
//! [`shrink`], or one direct reclaim) whose write failed tries no other,
//! and reclaim leaves a failing store's dirty pages alone for a backoff
//! ([`crate::write_error`]): a store that hangs costs a fault one I/O
//! timeout at most, not one per dirty page.

mod huge;
mod kswapd;
mod put_back;
pub mod staging;
mod unmap_batch;

use crate::address_space::Mm;
use crate::lru::{unpack, Entry};
use crate::object::{InstallKind, Object};
use crate::page_cache::*;
use crate::stats::Counter::*;
use crate::sys::mem::madvise;
use crate::sys::{futex, now_ns, PAGE_SIZE};
use crate::write_error::Permit;

pub use kswapd::{maybe_wake_kswapd, start_kswapd, stop_kswapd, watermarks};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use unmap_batch::UnmapBatch;

/// Entries isolated from the LRU per round.
const ISOLATE: usize = 32;

/// What happened to one LRU entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evict {
    /// The page is gone (Absent).
    Evicted,
    /// Busy or recently referenced: back to the tail.
    Rotate,
    /// Stale or unevictable: drop the entry.
    Drop,
}

/// One reclaim pass: whether it may still write to a store. It may not
/// once one of its writes failed.
#[derive(Debug)]
pub struct Pass {
    writes: bool,
    /// Frees clean pages only, and looks at [`kswapd::CLEAN_SCAN`] LRU
    /// entries at most: a faulting context's pass past the high watermark
    /// ([`kswapd`]'s module docs).
    clean_only: bool,
    /// A page was left because it needs a write this pass or its store
    /// may not make now (see [`WRITE_REFUSED_SCAN`]).
    write_refused: bool,
}

impl Pass {
    /// A pass that has written nothing yet.
    pub fn new() -> Pass {
        Pass {
            writes: true,
            clean_only: false,
            write_refused: false,
        }
    }

    /// A pass that frees clean pages and nothing else: a page that needs
    /// a write, a move out or a 2 MiB copy is left on the LRU.
    fn clean_only() -> Pass {
        Pass {
            writes: false,
            clean_only: true,
            write_refused: false,
        }
    }

    /// Whether this pass may write a page of `obj` to its store now: none
    /// of its own writes failed, and `obj`'s store is not in a backoff
    /// (or this caller won its probe, which the caller keeps until it has
    /// written or given up). Async-signal-safe.
    fn may_write<'a>(&self, obj: &'a Object) -> Permit<'a> {
        if !self.writes {
            return Permit::Refused;
        }
        obj.write_health.may_write(now_ns)
    }

    /// Writes `pages` of `obj` to its swap store (the store itself for a
    /// shared object), counts and records the result. Async-signal-safe.
    fn write_out(&mut self, mm: &Mm, obj: &Object, pages: &[(u64, &[u8])]) -> bool {
        if obj.kind == InstallKind::Anonymous && !obj.swap().signal_safe() {
            for &(off, _) in pages {
                crate::discard::note_swap_page(obj, (off >> obj.page_shift()) as usize);
            }
        }
        let ok = obj
            .durability
            .write(|| crate::io::write(&mm.io, obj.swap(), pages))
            .is_ok();
        obj.write_health.record(ok, now_ns);
        if ok {
            mm.counters.inc(WRITEBACK);
        } else {
            mm.counters.inc(IO_ERROR);
            self.writes = false;
        }
        ok
    }
}

impl Default for Pass {
    fn default() -> Pass {
        Pass::new()
    }
}

/// How an installed page left the user mapping.
enum Unmapped {
    /// Shared: the PTE is gone; the contents are in the memfd (`data(i)`).
    InCache,
    /// Anonymous: the contents were written to the store and dropped.
    WrittenBack,
    /// Anonymous memory (zero-filled): the page held only zeros, which is
    /// what its source reads as, so it was dropped without a write (the
    /// zero page a read maps, or a page written back to zeros).
    Zeros,
    /// Anonymous: the store write failed; the contents were kept in
    /// `data(i)` (dirty).
    KeptDirty,
    /// Anonymous: no page was mapped where the engine had installed one:
    /// the application dropped it (its own `madvise(MADV_DONTNEED)`), so its
    /// contents are the object's source again.
    Dropped,
}

/// Takes installed page `i` out of the user mapping, under the region's
/// read lock. The caller holds the page lock. Anonymous pages are moved
/// out atomically (`UFFDIO_MOVE`) to a staging page and written to swap
/// from there: the engine never reads the user's mapping, where a page
/// dropped behind its back would fault in the engine itself.
fn unmap_page(mm: &Mm, obj: &Object, i: usize, pass: &mut Pass) -> Result<Unmapped, ()> {
    let addr = obj.windows.addr_of(i).ok_or(())?;
    let vma = mm.lock_vma_quiet(addr).ok_or(())?;
    if !std::ptr::eq(&*vma.object, obj) || vma.page_index(addr) != i {
        return Err(());
    }
    let in_thread = mm.config.delivery.is_in_thread();
    let changing = || mm.uffd_for(obj).mmap_changing();
    if obj.kind == InstallKind::Shared {
        mm.events
            .act(in_thread, changing, || {
                madvise(addr, obj.page_size(), libc::MADV_DONTNEED)
            })
            .ok_or(())?
            .map_err(|_| ())?;
        return Ok(Unmapped::InCache);
    }
    if obj.is_huge() {
        return huge::unmap_anon(mm, obj, i, addr, pass);
    }
    let r = &mm.reclaim;
    let Some(s) = r.take_slot() else {
        return Err(());
    };
    // A read-write slot first; a read-only mapping (the region's, or one
    // the application made with its own mprotect) takes the read-only one;
    // a locked one (the application's mlock) a slot locked alike.
    let moved = mm.events.act(in_thread, changing, || {
        r.move_out(&mm.counters, addr, s).map_err(|e| match e {
            // No page there because the application's `mremap` began after
            // the check above (the move goes through the staging
            // descriptor, whose ioctl does not see the region's pending
            // event): the page moved with the range, it was not dropped.
            // Later, once the event is applied (taken for dropped, it was
            // uncharged while still mapped at its new address).
            libc::ENOENT if changing() => libc::EAGAIN,
            e => e,
        })
    });
    let Some(moved) = moved else {
        r.put_slot(s);
        return Err(());
    };
    let src = match moved {
        Ok(src) => src,
        Err(libc::ENOENT) => {
            r.put_slot(s);
            return Ok(Unmapped::Dropped);
        }
        // Busy (EAGAIN, EBUSY: a page shared with another process), or a
        // mapping neither slot matches: try again later.
        Err(_) => {
            r.put_slot(s);
            return Err(());
        }
    };
    // SAFETY: `src` is a present page of a staging slot that is ours
    // until `put_slot`.
    let page = unsafe { std::slice::from_raw_parts(src as *const u8, PAGE_SIZE) };
    // A page of anonymous memory that holds only zeros (every page a read
    // mapped the zero page for) equals its source: written out, it would
    // take a page of swap, outside the budget, for nothing.
    let out = if obj.zero_fill && all_zeros(page) {
        Unmapped::Zeros
    } else if pass.write_out(mm, obj, &[((i * PAGE_SIZE) as u64, page)]) {
        Unmapped::WrittenBack
    } else {
        match obj.data(i) {
            Ok(dst) => {
                // SAFETY: the cache page is ours under the page lock.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, PAGE_SIZE) };
                Unmapped::KeptDirty
            }
            Err(_) => {
                // No cache area could be made to keep it in, and the page
                // must not be lost: put it back where it was.
                let home = put_back::put_back(mm, &vma, addr, src);
                if home {
                    r.put_slot(s);
                } else {
                    r.retire(s);
                }
                return Err(());
            }
        }
    };
    // Empty the slot before it is reused (the staging descriptor asks for
    // no events, so this blocks on nothing); one that cannot be emptied is
    // not used again.
    if r.empty(src) {
        r.put_slot(s);
    } else {
        r.retire(s);
    }
    Ok(out)
}

/// Whether `page` holds only zeros.
fn all_zeros(page: &[u8]) -> bool {
    page.chunks_exact(8)
        .all(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")) == 0)
}

/// Tries to evict page `i` of `obj` in `pass`. Async-signal-safe.
pub fn evict_page(mm: &Mm, obj: &Object, i: usize, pass: &mut Pass) -> Evict {
    if i >= obj.npages() {
        return Evict::Drop;
    }
    let Ok(w) = obj.cache.try_lock(i) else {
        return Evict::Rotate;
    };
    if w & UPTODATE == 0 || w & ON_LRU == 0 {
        // A stale entry (the page left residency: dropped, shrunk away,
        // unmapped by the application). It was the page's one entry, so
        // the page is off the LRU now: when it comes back it is added anew.
        obj.cache.unlock(i, 0, ON_LRU | LRU_BATCHED);
        return Evict::Drop;
    }
    if w & PINNED != 0 {
        obj.cache.unlock(i, 0, ON_LRU);
        return Evict::Drop;
    }
    // A system call is about to use it (a residency guard), or a
    // write-back's sync may yet fail and need it dirty again: later.
    if w & (GUARDS | SYNCING) != 0 {
        obj.cache.unlock(i, 0, 0);
        return Evict::Rotate;
    }
    if w & REFERENCED != 0 {
        obj.cache.unlock(i, 0, REFERENCED);
        return Evict::Rotate;
    }
    let mut dirty = w & DIRTY != 0;
    let mut written = false;
    let mut zeros = false;
    // A page that needs a store write (an anonymous one mapped and maybe
    // written, a dirty one of a writable store) while this pass or its
    // store may not write: later (`crate::write_error`).
    let needs_write = if w & MAPPED != 0 && obj.kind == InstallKind::Anonymous {
        !obj.is_huge() || w & CLEAN == 0
    } else {
        dirty && obj.swap().writable()
    };
    // (Held to the end: a probe this page meets no write for after all
    // is given back as it goes.)
    let _permit = if needs_write {
        let p = pass.may_write(obj);
        if !p.allowed() {
            pass.write_refused = true;
            obj.cache.unlock(i, 0, 0);
            return Evict::Rotate;
        }
        p
    } else {
        Permit::Healthy
    };
    // A clean shared page cannot be written under us (it is write-protected
    // or its region read-only, and a write would wait for our page lock):
    // the hole punch below takes it out of every mapping at once, so one
    // zap (and one TLB shootdown) does instead of two.
    let punch_unmaps = obj.kind == InstallKind::Shared && !dirty;
    if w & MAPPED != 0 && punch_unmaps {
        obj.cache.update(i, 0, MAPPED);
    } else if w & MAPPED != 0 {
        match unmap_page(mm, obj, i, pass) {
            Err(()) => {
                obj.cache.unlock(i, 0, 0);
                return Evict::Rotate;
            }
            Ok(Unmapped::InCache) => {}
            Ok(Unmapped::WrittenBack) => written = true,
            Ok(Unmapped::Zeros) => {
                zeros = true;
                dirty = false;
            }
            Ok(Unmapped::KeptDirty) => {
                obj.cache.unlock(i, DIRTY, MAPPED | MOVED | CLEAN);
                return Evict::Rotate;
            }
            Ok(Unmapped::Dropped) => {
                mm.counters.inc(PAGE_DROPPED);
                let clear = crate::discard::discard_page(mm, obj, i, w);
                obj.cache
                    .unlock(i, 0, clear | ON_LRU | LRU_BATCHED | REFERENCED);
                return Evict::Drop;
            }
        }
        obj.cache.update(i, 0, MAPPED);
    }
    if dirty && !written && obj.swap().writable() {
        // SAFETY: page lock held and the page is not mapped: nobody else
        // reads or writes its cached contents.
        let buf = unsafe { obj.page_to_write_out(i) };
        let off = (i << obj.page_shift()) as u64;
        let ok = match buf {
            Ok(b) => pass.write_out(mm, obj, &[(off, b)]),
            Err(_) => {
                mm.counters.inc(IO_ERROR);
                false
            }
        };
        if !ok {
            obj.cache.unlock(i, DIRTY, 0);
            return Evict::Rotate;
        }
    }
    dirty |= written;
    if w & READAHEAD != 0 {
        mm.counters.inc(RA_WASTED);
    }
    // A page installed by moving it out of the cache area left no copy
    // there to free.
    if w & MOVED == 0 {
        let _ = obj.free_data(i, 1);
    }
    // An anonymous page written out now lives in swap; one dropped clean
    // keeps whatever it had (its source, or an older swap copy that is
    // still its contents).
    let swapped = if obj.kind == InstallKind::Anonymous && dirty {
        SWAPPED
    } else {
        0
    };
    // Zeros read as its source: an older swap copy is not its contents.
    let forget = if zeros && w & SWAPPED != 0 {
        crate::discard::forget_swap(obj, i);
        SWAPPED
    } else {
        0
    };
    obj.cache.unlock(
        i,
        swapped,
        UPTODATE
            | MAPPED
            | DIRTY
            | ON_LRU
            | LRU_BATCHED
            | REFERENCED
            | MOVED
            | READAHEAD
            | CLEAN
            | forget,
    );
    mm.uncharge(obj.units());
    Evict::Evicted
}

/// Frees up to `nr` pages from the LRU; returns how many were freed.
/// Clean pages wait in an unmap batch (`reclaim/unmap_batch.rs`) and
/// leave together, one zap per 32 of them, however many rounds of
/// isolation that takes (rotated pages do not shrink the batch).
/// Async-signal-safe.
pub fn shrink(mm: &Mm, nr: u64) -> u64 {
    shrink_in(mm, nr, &mut Pass::new())
}

/// [`shrink`] as part of `pass`.
fn shrink_in(mm: &Mm, nr: u64, pass: &mut Pass) -> u64 {
    let c = &mm.counters;
    let mut freed = 0;
    let mut scanned = 0u64;
    let max_scan = if pass.clean_only {
        kswapd::CLEAN_SCAN
    } else {
        nr.saturating_mul(16).saturating_add(1024)
    };
    let mut drained = false;
    let mut buf = [0 as Entry; ISOLATE];
    let mut back = [0 as Entry; ISOLATE];
    let mut batch = UnmapBatch::new();
    // An event waiting to be applied waits for this section (and refuses
    // our zaps meanwhile): leave instead of rotating through `max_scan`.
    // Meeting pages it may not write, it looks at fewer (see
    // `WRITE_REFUSED_SCAN`).
    let refused_scan = nr.min(WRITE_REFUSED_SCAN).saturating_mul(16) + 1024;
    while freed + (batch.len() as u64) < nr
        && scanned < max_scan
        && !(pass.write_refused && scanned >= refused_scan)
        && !mm.events.pending()
    {
        let n = mm.lru.isolate(&mut buf, c);
        if n == 0 {
            // (A clean pass does not drain every CPU's add batch: it is a
            // faulting context's, and kswapd will if it must.)
            if drained || pass.clean_only {
                break;
            }
            // Pages may be sitting in add batches: drain them all once,
            // with no page of ours left locked.
            freed += batch.flush(mm);
            mm.lru.drain_all(&mm.objects, c);
            drained = true;
            continue;
        }
        let mut nb = 0;
        for (k, &e) in buf[..n].iter().enumerate() {
            // Enough (in units: one 2 MiB page is 512): the entries not
            // looked at go back where they were. Evicting the whole
            // isolated batch took a small budget's direct reclaim, meant
            // to free a sixteenth of it, to half of it, and a 2 MiB
            // pager's to 32 pages where one would do.
            if freed + batch.len() as u64 >= nr {
                mm.lru.unisolate(&buf[k..n], &mm.objects, c);
                break;
            }
            scanned += 1;
            c.inc(PGSCAN);
            let (slot, page) = unpack(e);
            // What an eviction frees, in the budget's 4 KiB units.
            let mut units = 1;
            let verdict = match mm.objects.pin(slot) {
                None => Evict::Drop,
                Some(obj) => match batch.try_add(mm, obj, page, e) {
                    Ok(()) => {
                        if batch.is_full() {
                            freed += batch.flush(mm);
                        }
                        continue;
                    }
                    Err((_, Some(_))) if pass.clean_only => Evict::Rotate,
                    Err((_, Some(obj))) => {
                        // `evict_page` may write the page back and wait
                        // on its store: the batch's pages must not stay
                        // locked meanwhile (see `unmap_batch`'s contract).
                        freed += batch.flush(mm);
                        units = obj.units();
                        evict_page(mm, &obj, page, pass)
                    }
                    Err((v, None)) => v,
                },
            };
            match verdict {
                Evict::Evicted => {
                    freed += units;
                    c.inc(PGSTEAL);
                }
                Evict::Rotate => {
                    back[nb] = e;
                    nb += 1;
                }
                Evict::Drop => {}
            }
        }
        mm.lru.putback(&back[..nb], &mm.objects, c);
    }
    freed + batch.flush(mm)
}

/// Charges `n` pages to the resident count; over the budget, reclaims
/// directly in the calling (faulting) context, and wakes kswapd past
/// its watermark. Async-signal-safe.
#[inline]
pub fn charge(mm: &Mm, n: u64) {
    let now = mm.resident.fetch_add(n, Relaxed) + n;
    // Read first: at steady state the peak does not move, and a plain
    // load leaves its cache line shared between the faulting CPUs.
    if now > mm.peak_resident.load(Relaxed) {
        mm.peak_resident.fetch_max(now, Relaxed);
    }
    let budget = mm.config.budget_pages;
    if budget > 0 {
        let now = if now > budget {
            direct(mm);
            mm.resident.load(Relaxed)
        } else {
            now
        };
        kswapd::past_high(mm, now);
    }
}

/// Charges `n` pages only if they fit in the budget as it stands (one
/// compare-and-swap: no other charge can slip in between the check and
/// the charge); `false`, charging nothing, if they do not. For reads that
/// are guesses (a 2 MiB page read ahead), which must never take residency
/// past the budget: the faults in flight already may. Async-signal-safe.
pub fn charge_within_budget(mm: &Mm, n: u64) -> bool {
    let budget = mm.config.budget_pages;
    if budget == 0 {
        charge(mm, n);
        return true;
    }
    let Ok(prev) = mm
        .resident
        .fetch_update(Relaxed, Relaxed, |r| (r + n <= budget).then_some(r + n))
    else {
        return false;
    };
    let now = prev + n;
    if now > mm.peak_resident.load(Relaxed) {
        mm.peak_resident.fetch_max(now, Relaxed);
    }
    maybe_wake_kswapd(mm, now);
    true
}

/// A pass that has met a page it may not write (its store's writes fail,
/// see `crate::write_error`) looks at 16 LRU entries for each page it
/// asks for, up to this many pages, and 1,024 more.
///
/// Hazard: such pages stay resident, so residency can be far over the
/// budget, and a pass asks for all of the excess and looks at 16 entries
/// per page of it: every fault scanned more than the one before, twice.
/// Writing 2,048 pages over a failing store with a budget of 256 scanned
/// 55 million entries (22 s). Not for every pass: one that frees 2 MiB
/// pages looks at few entries over and over while they are busy, and
/// giving up sooner left residency past the hugetlb pool (SIGBUS).
const WRITE_REFUSED_SCAN: u64 = 4 * unmap_batch::BATCH as u64;

/// Direct reclaim: called in the faulting context after a charge took the
/// pager over its budget. Like the kernel's (`nr_to_reclaim` is
/// `SWAP_CLUSTER_MAX`), it frees a batch, not just the page or two over
/// the budget: one zap, and so one TLB flush, for 32 evictions (fewer for
/// budgets under 512 pages, at most a sixteenth of the budget). One pass:
/// after a failed store write it writes no more, and frees what it can
/// without writing (the fault may then leave the pager over its budget).
pub fn direct(mm: &Mm) {
    let budget = mm.config.budget_pages;
    let over = mm.resident.load(Relaxed).saturating_sub(budget);
    if over > 0 {
        mm.counters.inc(DIRECT_RECLAIM);
        let batch = (unmap_batch::BATCH as u64).min(budget / 16).max(1);
        let want = over.max(batch);
        let mut pass = Pass::new();
        // What is left may sit in other CPUs' add batches, which the first
        // pass drains only if the ring runs dry (it does not while pages
        // it cannot free rotate through it): a second pass after draining
        // them. (Without it, 2 MiB pages in add batches were not freed and
        // residency went past the hugetlb pool: SIGBUS.)
        if shrink_in(mm, want, &mut pass) < over {
            mm.lru.drain_all(&mm.objects, &mm.counters);
            let over = mm.resident.load(Relaxed).saturating_sub(budget);
            shrink_in(mm, over, &mut pass);
        }
    }
}
