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
//! A write-back failure keeps the page cached and dirty.

use crate::address_space::Mm;
use crate::address_space::VmaReadGuard;
use crate::lru::{unpack, Entry};
use crate::object::ObjectPin;
use crate::object::{InstallKind, Object};
use crate::page_cache::*;
use crate::stats::Counter::*;
use crate::sys::mem::{dontneed_batch, madvise, Mapping};
use crate::sys::uffd::{mode, MODE_DONTWAKE};
use crate::sys::{futex, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Arc;

/// Staging slots for anonymous eviction (one per concurrent evictor).
const STAGING_SLOTS: usize = 64;
/// Entries isolated from the LRU per round.
const ISOLATE: usize = 32;

/// Per-pager reclaim state.
#[derive(Debug)]
pub struct Reclaim {
    staging: Mapping,
    free_slots: AtomicU64,
    kswapd_seq: AtomicU32,
    kswapd_sleeping: AtomicBool,
    stop: AtomicBool,
}

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

impl Reclaim {
    /// Staging area registered (MISSING) with the pager's descriptor, so it
    /// can be a `UFFDIO_MOVE` destination.
    pub fn new(uffd: &crate::sys::uffd::Uffd) -> Result<Reclaim, (&'static str, i32)> {
        let staging =
            Mapping::anonymous(STAGING_SLOTS * PAGE_SIZE).map_err(|e| ("mmap staging", e))?;
        uffd.register(staging.addr(), staging.len(), mode::MISSING)
            .map_err(|e| ("UFFDIO_REGISTER staging", e))?;
        Ok(Reclaim {
            staging,
            free_slots: AtomicU64::new(u64::MAX),
            kswapd_seq: AtomicU32::new(0),
            kswapd_sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        })
    }

    fn take_slot(&self) -> usize {
        loop {
            let f = self.free_slots.load(Acquire);
            if f == 0 {
                std::thread::yield_now();
                continue;
            }
            let b = f.trailing_zeros() as u64;
            if self
                .free_slots
                .compare_exchange(f, f & !(1 << b), AcqRel, Relaxed)
                .is_ok()
            {
                return b as usize;
            }
        }
    }

    fn put_slot(&self, s: usize) {
        self.free_slots.fetch_or(1 << s, Release);
    }
}

/// How an installed page left the user mapping.
enum Unmapped {
    /// Shared: the PTE is gone; the contents are in the memfd (`data(i)`).
    InCache,
    /// Anonymous: the contents were written to the store and dropped.
    WrittenBack,
    /// Anonymous: the store write failed; the contents were kept in
    /// `data(i)` (dirty).
    KeptDirty,
    /// Anonymous: the kernel has no page where the engine installed one.
    /// That breaks the engine's invariant; the contents are gone, so the
    /// page is poisoned (the next access gets SIGBUS) rather than looping.
    Lost,
}

/// Takes installed page `i` out of the user mapping, under the region's
/// read lock. The caller holds the page lock. Anonymous pages are moved
/// out atomically (`UFFDIO_MOVE`) to a staging page and written to the
/// store from there.
fn unmap_page(mm: &Mm, obj: &Object, i: usize) -> Result<Unmapped, ()> {
    let base = obj.mapped_at.load(Acquire);
    if base == 0 {
        return Err(());
    }
    let addr = base + i * PAGE_SIZE;
    let vma = mm.lock_vma_quiet(addr).ok_or(())?;
    if !std::ptr::eq(&*vma.object, obj) || vma.page_index(addr) != i {
        return Err(());
    }
    if obj.kind == InstallKind::Shared {
        madvise(addr, PAGE_SIZE, libc::MADV_DONTNEED).map_err(|_| ())?;
        return Ok(Unmapped::InCache);
    }
    let r = &mm.reclaim;
    let s = r.take_slot();
    let slot = r.staging.addr() + s * PAGE_SIZE;
    // Where the page's contents are once it is out of the way of writers.
    let src = match mm.uffd.mv(slot, addr, PAGE_SIZE, MODE_DONTWAKE) {
        Ok(_) => Some(slot),
        // A read-only region cannot be a MOVE source; nobody can write it
        // either (protect needs the region write lock we exclude), so the
        // installed page itself is read, then dropped.
        Err(libc::EINVAL) if !vma.writable.load(Acquire) => Some(addr),
        Err(libc::ENOENT) => {
            r.put_slot(s);
            return Ok(Unmapped::Lost);
        }
        Err(_) => None,
    };
    let out = src.map(|src| {
        // SAFETY: `src` is a present page: the staging slot we just moved
        // into (ours until `put_slot`), or the installed page of a read-only
        // region under our page lock.
        let page = unsafe { std::slice::from_raw_parts(src as *const u8, PAGE_SIZE) };
        if obj.store.write((i * PAGE_SIZE) as u64, page).is_ok() {
            mm.counters.inc(WRITEBACK);
            Unmapped::WrittenBack
        } else {
            mm.counters.inc(IO_ERROR);
            match obj.data(i) {
                Ok(dst) => {
                    // SAFETY: the cache page is ours under the page lock.
                    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, PAGE_SIZE) };
                    Unmapped::KeptDirty
                }
                // No cache area could be made to keep it in.
                Err(_) => Unmapped::Lost,
            }
        }
    });
    if let Some(src) = src {
        let _ = madvise(src, PAGE_SIZE, libc::MADV_DONTNEED);
    }
    r.put_slot(s);
    out.ok_or(())
}

/// Tries to evict page `i` of `obj`. Async-signal-safe.
pub fn evict_page(mm: &Mm, obj: &Object, i: usize) -> Evict {
    if i >= obj.npages() {
        return Evict::Drop;
    }
    let Ok(w) = obj.cache.try_lock(i) else {
        return Evict::Rotate;
    };
    if w & UPTODATE == 0 || w & ON_LRU == 0 {
        obj.cache.unlock(i, 0, 0);
        return Evict::Drop;
    }
    if w & PINNED != 0 {
        obj.cache.unlock(i, 0, ON_LRU);
        return Evict::Drop;
    }
    if w & REFERENCED != 0 {
        obj.cache.unlock(i, 0, REFERENCED);
        return Evict::Rotate;
    }
    let mut dirty = w & DIRTY != 0;
    let mut written = false;
    // A clean shared page cannot be written under us (it is write-protected
    // or its region read-only, and a write would wait for our page lock):
    // the hole punch below takes it out of every mapping at once, so one
    // zap (and one TLB shootdown) does instead of two.
    let punch_unmaps = obj.kind == InstallKind::Shared && !dirty;
    if w & MAPPED != 0 && punch_unmaps {
        obj.cache.update(i, 0, MAPPED);
    } else if w & MAPPED != 0 {
        match unmap_page(mm, obj, i) {
            Err(()) => {
                obj.cache.unlock(i, 0, 0);
                return Evict::Rotate;
            }
            Ok(Unmapped::InCache) => {}
            Ok(Unmapped::WrittenBack) => written = true,
            Ok(Unmapped::KeptDirty) => {
                obj.cache.unlock(i, DIRTY, MAPPED | MOVED | CLEAN);
                return Evict::Rotate;
            }
            Ok(Unmapped::Lost) => {
                mm.counters.inc(IO_ERROR);
                obj.cache.unlock(
                    i,
                    crate::page_cache::POISONED,
                    UPTODATE | MAPPED | MOVED | DIRTY | ON_LRU | CLEAN,
                );
                mm.uncharge(1);
                return Evict::Drop;
            }
        }
        obj.cache.update(i, 0, MAPPED);
    }
    if dirty && !written && obj.store.writable() {
        // SAFETY: page lock held and the page is not mapped: nobody else
        // reads or writes its cached contents.
        let buf = unsafe { obj.page_mut(i) };
        if buf
            .map(|b| obj.store.write((i * PAGE_SIZE) as u64, b))
            .map_or(true, |r| r.is_err())
        {
            mm.counters.inc(IO_ERROR);
            obj.cache.unlock(i, DIRTY, 0);
            return Evict::Rotate;
        }
        mm.counters.inc(WRITEBACK);
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
    let swapped = if obj.zero_fill && dirty { SWAPPED } else { 0 };
    obj.cache.unlock(
        i,
        swapped,
        UPTODATE | MAPPED | DIRTY | ON_LRU | LRU_BATCHED | REFERENCED | MOVED | READAHEAD | CLEAN,
    );
    mm.uncharge(1);
    Evict::Evicted
}

/// A clean page locked for eviction, waiting for the batched zap.
struct Pending<'a> {
    obj: ObjectPin,
    i: usize,
    w: u32,
    /// Keeps the user address valid until the zap (writers excluded).
    _vma: Option<VmaReadGuard<'a>>,
}

/// First half of evicting a clean page (a shared page that is not dirty,
/// or an anonymous page marked `CLEAN`): lock it and, if it is mapped,
/// read-lock its region. Its zaps (the user mapping, and an anonymous
/// page's copy in the cache area) are left to the caller's batch. Returns
/// `Err(decision)` when the page cannot go now, or `Err((_, Some(obj)))`
/// when it is not such a page ("use [`evict_page`]").
fn prepare_clean<'a>(
    mm: &'a Mm,
    obj: ObjectPin,
    i: usize,
    zaps: &mut [(usize, usize)],
    nz: &mut usize,
) -> Result<Pending<'a>, (Evict, Option<ObjectPin>)> {
    if i >= obj.npages() {
        return Err((Evict::Drop, Some(obj)));
    }
    let anon = obj.kind == InstallKind::Anonymous;
    let Ok(w) = obj.cache.try_lock(i) else {
        return Err((Evict::Rotate, None));
    };
    let verdict = if w & UPTODATE == 0 || w & ON_LRU == 0 {
        Some((Evict::Drop, 0))
    } else if w & PINNED != 0 {
        Some((Evict::Drop, ON_LRU))
    } else if w & REFERENCED != 0 {
        Some((Evict::Rotate, REFERENCED))
    } else if w & DIRTY != 0 || (anon && w & CLEAN == 0) {
        obj.cache.unlock(i, 0, 0);
        return Err((Evict::Drop, Some(obj)));
    } else {
        None
    };
    if let Some((v, clear)) = verdict {
        obj.cache.unlock(i, 0, clear);
        return Err((v, None));
    }
    let mut vma = None;
    if w & MAPPED != 0 {
        let addr = obj.mapped_at.load(Acquire) + i * PAGE_SIZE;
        match mm.lock_vma_quiet(addr) {
            // An anonymous page stays clean only while its region stays
            // read-only: `protect` clears CLEAN under the region's write
            // lock, so check again now that we hold its read lock.
            Some(g)
                if std::ptr::eq(&*g.object, &*obj)
                    && g.page_index(addr) == i
                    && (!anon || obj.cache.load(i) & CLEAN != 0) =>
            {
                zaps[*nz] = (addr, PAGE_SIZE);
                *nz += 1;
                vma = Some(g);
            }
            _ => {
                obj.cache.unlock(i, 0, 0);
                return Err((Evict::Rotate, None));
            }
        }
    }
    // An anonymous page may have a copy in the cache area too (installed
    // by a copy from there): it goes in the same batch. A shared page's
    // alias needs no zap: pages are filled through the memfd, so the alias
    // maps a page only after a write-back read, and the hole punch unmaps
    // it then.
    if anon && w & MOVED == 0 {
        if let Some(a) = obj.cached_copy(i) {
            zaps[*nz] = (a, PAGE_SIZE);
            *nz += 1;
        }
    }
    Ok(Pending {
        obj,
        i,
        w,
        _vma: vma,
    })
}

/// Frees the memfd pages of the shared pages among `pending` (out of every
/// mapping now): one hole punch per run of adjacent pages of one object.
/// An anonymous page's copies went with the zap.
fn free_clean_shared(pending: &[Option<Pending<'_>>]) {
    // (object address, page, index into `pending`), sorted into runs.
    let mut order = [(0usize, 0usize, 0usize); ISOLATE];
    let mut n = 0;
    for (k, p) in pending.iter().enumerate() {
        if let Some(p) = p.as_ref().filter(|p| p.obj.kind == InstallKind::Shared) {
            order[n] = (&*p.obj as *const Object as usize, p.i, k);
            n += 1;
        }
    }
    order[..n].sort_unstable();
    let mut k = 0;
    while k < n {
        let (o, start, first) = order[k];
        let mut len = 1;
        while k + len < n && (order[k + len].0, order[k + len].1) == (o, start + len) {
            len += 1;
        }
        if let Some(p) = &pending[first] {
            let _ = p.obj.free_data(start, len);
        }
        k += len;
    }
}

/// Last step: the page is out of every mapping and freed; unlock it as
/// absent.
fn finish_clean(mm: &Mm, p: Pending<'_>) {
    let (obj, i) = (&p.obj, p.i);
    if p.w & READAHEAD != 0 {
        mm.counters.inc(RA_WASTED);
    }
    obj.cache.unlock(
        i,
        0,
        UPTODATE | MAPPED | DIRTY | ON_LRU | LRU_BATCHED | REFERENCED | MOVED | READAHEAD | CLEAN,
    );
    mm.uncharge(1);
}

/// Frees up to `nr` pages from the LRU; returns how many were freed.
/// Async-signal-safe.
pub fn shrink(mm: &Mm, nr: u64) -> u64 {
    let c = &mm.counters;
    let mut freed = 0;
    let mut scanned = 0u64;
    let max_scan = nr * 16 + 1024;
    let mut drained = false;
    let mut buf = [0 as Entry; ISOLATE];
    let mut back = [0 as Entry; ISOLATE];
    while freed < nr && scanned < max_scan {
        let n = mm.lru.isolate(&mut buf, c);
        if n == 0 {
            if drained {
                break;
            }
            // Pages may be sitting in add batches: drain them all once.
            mm.lru.drain_all(&mm.objects, c);
            drained = true;
            continue;
        }
        let mut nb = 0;
        // Clean pages are zapped together, in one process_madvise: for
        // anonymous ones that is one TLB flush for the batch; shared ones
        // installed dirty by UFFDIO_CONTINUE still cost a flush each, but
        // one syscall.
        let mut pending: [Option<Pending<'_>>; ISOLATE] = [const { None }; ISOLATE];
        let mut zaps = [(0usize, 0usize); 2 * ISOLATE];
        let mut nz = 0;
        for (k, &e) in buf[..n].iter().enumerate() {
            scanned += 1;
            c.inc(PGSCAN);
            let (slot, page) = unpack(e);
            let verdict = match mm.objects.pin(slot) {
                None => Evict::Drop,
                Some(obj) => match prepare_clean(mm, obj, page, &mut zaps, &mut nz) {
                    Ok(p) => {
                        pending[k] = Some(p);
                        continue;
                    }
                    Err((_, Some(obj))) => evict_page(mm, &obj, page),
                    Err((v, None)) => v,
                },
            };
            match verdict {
                Evict::Evicted => {
                    freed += 1;
                    c.inc(PGSTEAL);
                }
                Evict::Rotate => {
                    back[nb] = e;
                    nb += 1;
                }
                Evict::Drop => {}
            }
        }
        // Pages that were not mapped are pending too, with nothing to zap.
        let nz = crate::sys::mem::coalesce_ranges(&mut zaps[..nz]);
        let ok = nz == 0 || dontneed_batch(&zaps[..nz]).is_ok();
        if ok {
            free_clean_shared(&pending);
        }
        for (k, p) in pending.iter_mut().enumerate() {
            let Some(p) = p.take() else { continue };
            if ok {
                finish_clean(mm, p);
                freed += 1;
                c.inc(PGSTEAL);
            } else {
                p.obj.cache.unlock(p.i, 0, 0);
                back[nb] = buf[k];
                nb += 1;
            }
        }
        mm.lru.putback(&back[..nb], c);
    }
    freed
}

/// Direct reclaim: called in the faulting context after a charge took the
/// pager over its budget.
pub fn direct(mm: &Mm) {
    let budget = mm.config.budget_pages;
    let over = mm.resident.load(Relaxed).saturating_sub(budget);
    if over > 0 {
        mm.counters.inc(DIRECT_RECLAIM);
        if shrink(mm, over) < over {
            // What is left may sit in other CPUs' add batches.
            mm.lru.drain_all(&mm.objects, &mm.counters);
            let over = mm.resident.load(Relaxed).saturating_sub(budget);
            shrink(mm, over);
        }
    }
}

/// The watermarks: kswapd wakes above `high` and reclaims down to `low`.
pub fn watermarks(budget: u64) -> (u64, u64) {
    let high = budget - (budget / 32).max(1).min(budget);
    let low = budget - (budget / 16).max(2).min(budget);
    (high, low)
}

/// Wakes kswapd if it sleeps and residency passed the high watermark.
/// Async-signal-safe (one futex wake at most).
#[inline]
pub fn maybe_wake_kswapd(mm: &Mm, resident: u64) {
    let (high, _) = watermarks(mm.config.budget_pages);
    if resident > high && mm.reclaim.kswapd_sleeping.load(Relaxed) {
        mm.reclaim.kswapd_seq.fetch_add(1, Release);
        futex::wake(&mm.reclaim.kswapd_seq, 1);
    }
}

/// Starts the background reclaimer for `mm`.
pub fn start_kswapd(mm: &Arc<Mm>) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mm = mm.clone();
    std::thread::Builder::new()
        .name("uffd-kswapd".into())
        .spawn(move || {
            let r = &mm.reclaim;
            let (high, low) = watermarks(mm.config.budget_pages);
            while !r.stop.load(Acquire) {
                let seq = r.kswapd_seq.load(Acquire);
                let resident = mm.resident.load(Relaxed);
                if resident > high {
                    mm.counters.inc(KSWAPD_WAKE);
                    let got = shrink(&mm, resident - low);
                    if got == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    continue;
                }
                r.kswapd_sleeping.store(true, SeqCst);
                if mm.resident.load(SeqCst) <= high && !r.stop.load(Acquire) {
                    futex::wait(&r.kswapd_seq, seq);
                }
                r.kswapd_sleeping.store(false, Relaxed);
            }
        })
}

/// Stops the background reclaimer (the thread exits at its next wake-up).
pub fn stop_kswapd(mm: &Mm) {
    mm.reclaim.stop.store(true, Release);
    mm.reclaim.kswapd_seq.fetch_add(1, Release);
    futex::wake_all(&mm.reclaim.kswapd_seq);
}
