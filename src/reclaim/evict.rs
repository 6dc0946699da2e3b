//! Evicting one page without losing a write (`shrink_folio_list` for one
//! folio; the steps are in the parent module's docs), and the pass a run of
//! evictions shares: whether it may still write to a store.

use super::*;

/// What happened to one LRU entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evict {
    /// The page is gone (Absent).
    Evicted,
    /// The page went with others: this many base pages in all (a huge
    /// folio's extent, `extent::evict_extent`).
    EvictedPages(u64),
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
    pub(super) clean_only: bool,
    /// A page was left because it needs a write this pass or its store
    /// may not make now (see [`WRITE_REFUSED_SCAN`]).
    pub(super) write_refused: bool,
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
    pub(super) fn clean_only() -> Pass {
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
    pub(super) fn write_out(&mut self, mm: &Mm, obj: &Object, pages: &[(u64, &[u8])]) -> bool {
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
pub(super) enum Unmapped {
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
/// dropped behind its back would fault in the engine itself. `permitted`:
/// the caller holds a write permit for `obj` (it found the page needing a
/// store write).
fn unmap_page(
    mm: &Mm,
    obj: &Object,
    i: usize,
    pass: &mut Pass,
    permitted: bool,
) -> Result<Unmapped, ()> {
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
                crate::sys::mem::zap(addr, obj.page_size())
            })
            .ok_or(())?
            .map_err(|_| ())?;
        return Ok(Unmapped::InCache);
    }
    if obj.is_huge() {
        return huge::unmap_anon(mm, obj, i, addr, pass, permitted);
    }
    // Where the page is kept if its store write fails, found before it
    // leaves the mapping: the object's cache area is made on first use,
    // and one that could not be made then (ENOMEM) left the page nowhere
    // to go but home, which an event on its way refuses (found by review:
    // the slot was retired with the page in it, and the page's next fault
    // took it for dropped and read its older source).
    let keep = obj.data(i).map_err(|_| ())?;
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
        // SAFETY: the cache page is ours under the page lock.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, keep, PAGE_SIZE) };
        Unmapped::KeptDirty
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
    // A page of a huge folio goes with its whole extent. (Looked at under
    // the page's lock, which a collapse needs too; looked at again under
    // all of the extent's there.)
    if obj.collapsed(i) {
        obj.cache.unlock(i, 0, 0);
        return match super::extent::evict_extent(mm, obj, i) {
            (Evict::Evicted, n) => Evict::EvictedPages(n),
            (v, _) => v,
        };
    }
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
        dirty && obj.swap_writes()
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
        match unmap_page(mm, obj, i, pass, needs_write) {
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
    if dirty && !written && obj.swap_writes() {
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
