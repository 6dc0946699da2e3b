//! Batched unmapping of clean pages (`try_to_unmap` with
//! `TTU_BATCH_FLUSH`, then `try_to_unmap_flush`): reclaim locks each clean
//! page it picks, and the batch takes them all out of their mappings with
//! one `process_madvise(MADV_DONTNEED)` (adjacent pages merged into one
//! range), so [`BATCH`] anonymous evictions share one TLB flush, which on
//! a machine where another thread of the process runs is an IPI to its
//! CPU. Shared pages cannot share one (see [`SHARED_BATCH`]); they then
//! leave the memfd with one hole punch per run of adjacent pages.
//!
//! # Contract
//! A page in a batch is page-locked, off the LRU, and (if mapped) its
//! region is read-locked, so no writer can move or unmap it before the
//! zap; a fault on it waits for the page lock. [`UnmapBatch::flush`] must
//! run before the caller waits on anything (the batch's pages would stay
//! locked), and before it drops the batch. Nothing here allocates:
//! direct reclaim runs it in the signal handler.

use super::Evict;
use crate::address_space::{Mm, VmaReadGuard};
use crate::lru::Entry;
use crate::object::{InstallKind, Object, ObjectPin};
use crate::page_cache::*;
use crate::stats::Counter::*;
use crate::sys::mem::dontneed_batch;
use crate::sys::PAGE_SIZE;

/// Clean pages per zap (`SWAP_CLUSTER_MAX`).
pub const BATCH: usize = 32;

/// Shared pages per batch at most. Batching them saves no TLB flush:
/// every PTE userfaultfd installs is dirty, and the kernel flushes the TLB
/// on its own for each page table in which it zaps a dirty file PTE (it
/// must, before it drops the page's rmap), so a random reader's 32 shared
/// evictions cost 32 shootdowns however they are grouped: about 25 µs
/// each on this project's 2-vCPU VMs, so a batch of 32 held its pages
/// locked for 0.5-1.7 ms (p50-p90) and a fault on one of them waited that
/// long. Four keeps the lock hold near 0.1 ms. A kernel-mapped object's
/// pages ([`Object::kernel_maps`]) were mapped by the kernel's own read
/// fault, clean, so they batch as anonymous pages do.
pub const SHARED_BATCH: usize = 4;

/// Why a page did not join the batch: what to do with its LRU entry, and
/// the object back if the page needs [`super::evict_page`] instead.
pub type Refused = (Evict, Option<ObjectPin>);

/// Clean pages locked for eviction, and the ranges to zap for them. See
/// the module docs.
pub struct UnmapBatch<'a> {
    pending: [Option<Pending<'a>>; BATCH],
    /// Each pending page's LRU entry, put back if the zap fails.
    entries: [Entry; BATCH],
    n: usize,
    /// A user mapping and an anonymous cache-area copy at most, per page.
    zaps: [(usize, usize); 2 * BATCH],
    nz: usize,
    /// Shared pages among the pending (see [`SHARED_BATCH`]).
    shared: usize,
}

impl<'a> UnmapBatch<'a> {
    /// An empty batch.
    pub fn new() -> Self {
        UnmapBatch {
            pending: [const { None }; BATCH],
            entries: [0; BATCH],
            n: 0,
            zaps: [(0, 0); 2 * BATCH],
            nz: 0,
            shared: 0,
        }
    }

    /// Pages waiting.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether it must be flushed before another page can join: it holds
    /// [`BATCH`] pages, or [`SHARED_BATCH`] shared ones.
    pub fn is_full(&self) -> bool {
        self.n == BATCH || self.shared == SHARED_BATCH
    }

    /// Adds page `i` of `obj` (LRU entry `e`) if it is a clean page that
    /// can go now: a shared page that is not dirty, or an anonymous page
    /// marked `CLEAN`. The batch must not be full.
    pub fn try_add(
        &mut self,
        mm: &'a Mm,
        obj: ObjectPin,
        i: usize,
        e: Entry,
    ) -> Result<(), Refused> {
        if self.is_full() {
            // The caller flushes a full batch first; never overrun it.
            self.flush(mm);
        }
        let p = prepare_clean(mm, obj, i, &mut self.zaps, &mut self.nz)?;
        self.shared += (p.obj.kind == InstallKind::Shared && !p.obj.kernel_maps) as usize;
        self.pending[self.n] = Some(p);
        self.entries[self.n] = e;
        self.n += 1;
        Ok(())
    }

    /// Whether an event is on its way on a descriptor of a pending page's
    /// object (see [`crate::events::Events::act`]): one question per
    /// descriptor (the pages of a batch share one or two).
    fn mmap_changing(&self, mm: &Mm) -> bool {
        let mut asked = [-1; 4];
        let mut n = 0;
        for p in self.pending[..self.n].iter().flatten() {
            let uffd = mm.uffd_for(&p.obj);
            if asked[..n].contains(&uffd.fd()) {
                continue;
            }
            if uffd.mmap_changing() {
                return true;
            }
            if n < asked.len() {
                asked[n] = uffd.fd();
                n += 1;
            }
        }
        false
    }

    /// Zaps every pending page's mappings at once, frees what they cached
    /// and unlocks them as absent; returns how many were freed. Pages whose
    /// zap fails are unlocked as they were and go back on the LRU.
    pub fn flush(&mut self, mm: &Mm) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let nz = crate::sys::mem::coalesce_ranges(&mut self.zaps[..self.nz]);
        // Pages that were not mapped are pending too, with nothing to zap.
        let in_thread = mm.config.delivery.is_in_thread();
        let mut zapped = [nz == 0; BATCH];
        if nz > 0 {
            let pending = &self.pending[..self.n];
            let _ = mm.events.act(
                in_thread,
                || self.mmap_changing(mm),
                || {
                    if dontneed_batch(&self.zaps[..nz]).is_ok() {
                        zapped = [true; BATCH];
                        return;
                    }
                    // Hazard: the batch stopped at a range the kernel
                    // refused after it had zapped the ranges before it.
                    // All put back as they were, those pages stayed
                    // marked mapped with their mappings gone (their next
                    // touch took them for dropped by the application), and
                    // no page of the batch was freed (seen with regions
                    // the application `mlock`ed, before the zap took
                    // locked pages too). Each page is zapped on its own
                    // now: those whose ranges all went are finished, the
                    // rest go back.
                    for (k, p) in pending.iter().enumerate() {
                        zapped[k] = p.as_ref().is_some_and(|p| {
                            p.zaps[..p.nzaps]
                                .iter()
                                .all(|&(a, l)| crate::sys::mem::zap(a, l).is_ok())
                        });
                    }
                },
            );
        }
        free_clean_shared(&self.pending[..self.n], &zapped);
        let mut freed = 0;
        let mut back = 0;
        for (k, &went) in zapped[..self.n].iter().enumerate() {
            let Some(p) = self.pending[k].take() else {
                continue;
            };
            if went {
                finish_clean(mm, p);
                freed += 1;
                mm.counters.inc(PGSTEAL);
            } else {
                p.obj.cache.unlock(p.i, 0, 0);
                self.entries[back] = self.entries[k];
                back += 1;
            }
        }
        // One update of the shared resident count for the batch, not one
        // per page: its cache line is written by every faulting CPU.
        mm.uncharge(freed);
        mm.lru
            .putback(&self.entries[..back], &mm.objects, &mm.counters);
        self.n = 0;
        self.nz = 0;
        self.shared = 0;
        freed
    }
}

impl Drop for UnmapBatch<'_> {
    /// Pending pages are locked: a batch dropped unflushed would strand
    /// them (callers flush; this is the backstop, and it needs no panic,
    /// which a signal handler must not raise).
    fn drop(&mut self) {
        for k in 0..self.n {
            if let Some(p) = self.pending[k].take() {
                p.obj.cache.unlock(p.i, 0, 0);
            }
        }
        self.n = 0;
    }
}

/// A clean page locked for eviction, waiting for the batched zap.
struct Pending<'a> {
    obj: ObjectPin,
    i: usize,
    w: u32,
    /// Keeps the user address valid until the zap (writers excluded).
    _vma: Option<VmaReadGuard<'a>>,
    /// This page's own ranges among the batch's zaps (its user mapping,
    /// its cache-area copy): zapped one by one if the batch's zap fails.
    zaps: [(usize, usize); 2],
    nzaps: usize,
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
) -> Result<Pending<'a>, Refused> {
    // A 2 MiB page goes alone: its zap is a flush of its own anyway, and
    // an anonymous one cannot be zapped before it is copied out.
    if i >= obj.npages() || obj.is_huge() {
        return Err((Evict::Drop, Some(obj)));
    }
    let anon = obj.kind == InstallKind::Anonymous;
    let Ok(w) = obj.cache.try_lock(i) else {
        return Err((Evict::Rotate, None));
    };
    // A page of a huge folio goes with its whole extent
    // (`extent::evict_extent`), never on its own. (Looked at under the
    // page's lock, which a collapse needs too.)
    if obj.collapsed(i) {
        obj.cache.unlock(i, 0, 0);
        return Err((Evict::Drop, Some(obj)));
    }
    let verdict = if w & UPTODATE == 0 || w & ON_LRU == 0 {
        // A stale entry: see `evict_page`.
        Some((Evict::Drop, ON_LRU | LRU_BATCHED))
    } else if w & PINNED != 0 {
        Some((Evict::Drop, ON_LRU))
    } else if w & (GUARDS | SYNCING) != 0 {
        // Guarded for a system call, or its write-back's sync may yet
        // fail: later.
        Some((Evict::Rotate, 0))
    } else if w & REFERENCED != 0 {
        Some((Evict::Rotate, REFERENCED))
    } else if w & DIRTY != 0 || (anon && (w & CLEAN == 0 || !obj.quiet)) {
        // Not clean, or a clean anonymous page of a region whose
        // descriptor reports `madvise` (one made read-only by `protect`):
        // zapping it would raise an event, so `evict_page` moves it out.
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
    // The kernel maps a kernel-mapped object's cached pages on its own, so
    // one that is not MAPPED may be mapped too: zapped with the batch if
    // its region can be read-locked now (a clean PTE, so it shares the
    // batch's flush); else the hole punch unmaps it, a flush of its own.
    let first_zap = *nz;
    //
    // Hazard: for the same reason a page of a pinned kernel-mapped region
    // may be mapped with no fault the engine saw (read ahead, or cached
    // by a kept object), so never marked PINNED: it is marked now, and
    // leaves the LRU, as a fault would have done (`MapOptions::pinned`).
    // A region that cannot be read-locked now (a remap or an unmap holds
    // it for a moment) may be pinned: later (found by review: its pages
    // were punched as an unpinned region's).
    let maybe_mapped = obj.kernel_maps && w & MAPPED == 0;
    if maybe_mapped {
        if let Some(addr) = obj.windows.addr_of(i) {
            let Some(g) = mm.lock_vma_quiet(addr) else {
                obj.cache.unlock(i, 0, 0);
                return Err((Evict::Rotate, None));
            };
            if std::ptr::eq(&*g.object, &*obj) && g.page_index(addr) == i && g.pinned {
                obj.cache.unlock(i, PINNED, ON_LRU);
                return Err((Evict::Drop, None));
            }
            if std::ptr::eq(&*g.object, &*obj) && g.page_index(addr) == i {
                zaps[*nz] = (addr, PAGE_SIZE);
                *nz += 1;
                vma = Some(g);
            }
        } else if obj.maybe_pinned_unfound() {
            // No window found, and the object has more pieces than its
            // windows hold: a page of a pinned region's later piece, for
            // all reclaim can tell (it was punched out as an unpinned
            // page's, found by review). It leaves the LRU; the object's
            // release frees it.
            obj.cache.unlock(i, PINNED, ON_LRU);
            return Err((Evict::Drop, None));
        }
    } else if w & MAPPED != 0 {
        let Some(addr) = obj.windows.addr_of(i) else {
            obj.cache.unlock(i, 0, 0);
            return Err((Evict::Rotate, None));
        };
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
    let mut own = [(0, 0); 2];
    let nzaps = *nz - first_zap;
    own[..nzaps].copy_from_slice(&zaps[first_zap..*nz]);
    Ok(Pending {
        obj,
        i,
        w,
        _vma: vma,
        zaps: own,
        nzaps,
    })
}

/// Frees the memfd pages of the shared pages among `pending` that were
/// `zapped` (out of every mapping now): one hole punch per run of adjacent
/// pages of one object. An anonymous page's copies went with the zap.
fn free_clean_shared(pending: &[Option<Pending<'_>>], zapped: &[bool; BATCH]) {
    // (object address, page, index into `pending`), sorted into runs.
    let mut order = [(0usize, 0usize, 0usize); BATCH];
    let mut n = 0;
    for (k, p) in pending.iter().enumerate() {
        let p = p.as_ref().filter(|_| zapped[k]);
        if let Some(p) = p.filter(|p| p.obj.kind == InstallKind::Shared) {
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
/// absent (the caller uncharges the batch).
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
}
