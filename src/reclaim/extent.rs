//! Reclaim of a huge folio as one unit: a kernel-mapped object's
//! collapsed 2 MiB extent ([`crate::collapse`]) leaves the memfd whole,
//! never a page at a time (see that module's hazards).

use super::Evict;
use crate::address_space::Mm;
use crate::object::{Object, EXTENT_PAGES};
use crate::page_cache::*;
use crate::stats::Counter::RA_WASTED;

/// Evicts the collapsed extent of page `i` whole: its huge folio leaves
/// the memfd in one hole punch, which unmaps it everywhere, and every
/// page of it is absent after. Page `i`'s LRU entry decides, as a large
/// folio's one entry does: referenced, it rotates. Busy, pinned or
/// guarded pages keep the extent (`Rotate`); the other pages' LRU entries
/// go stale. Returns the verdict and the pages freed.
pub fn evict_extent(mm: &Mm, obj: &Object, i: usize) -> (Evict, u64) {
    let Some(x) = obj.extents.as_ref() else {
        return (Evict::Rotate, 0);
    };
    let (e, first) = (i / EXTENT_PAGES, i / EXTENT_PAGES * EXTENT_PAGES);
    // Page `i`'s own entry first, as `evict_page` looks at a page's.
    let Ok(w) = obj.cache.try_lock(i) else {
        return (Evict::Rotate, 0);
    };
    let (verdict, clear) = if w & UPTODATE == 0 || w & ON_LRU == 0 {
        (Some(Evict::Drop), ON_LRU | LRU_BATCHED)
    } else if w & PINNED != 0 {
        (Some(Evict::Drop), ON_LRU)
    } else if w & REFERENCED != 0 {
        (Some(Evict::Rotate), REFERENCED)
    } else {
        match pinned_region(mm, obj, i) {
            Some(true) => {
                obj.cache.unlock(i, PINNED, ON_LRU);
                return (Evict::Drop, 0);
            }
            Some(false) => (None, 0),
            None => (Some(Evict::Rotate), 0),
        }
    };
    obj.cache.unlock(i, 0, clear);
    if let Some(v) = verdict {
        return (v, 0);
    }
    // A pinned page keeps the whole extent, as an `mlock`ed page keeps a
    // large folio off the kernel's evictable lists: this entry leaves the
    // LRU, as a pinned page's does (rotated, it came back for good, and
    // so did every other page's of the extent).
    if (first..first + EXTENT_PAGES).any(|k| obj.cache.load(k) & PINNED != 0) {
        return match obj.cache.try_lock(i) {
            Ok(_) => {
                obj.cache.unlock(i, 0, ON_LRU);
                (Evict::Drop, 0)
            }
            Err(_) => (Evict::Rotate, 0),
        };
    }
    // Then the whole extent, locked: still collapsed (not evicted whole by
    // another pass since the caller looked), page `i` still on the LRU,
    // and no page that must stay.
    let Some(words) = obj.lock_extent(first, 0, |w| {
        w & (PINNED | DIRTY) == 0 && w & (GUARDS | SYNCING) == 0
    }) else {
        return (Evict::Rotate, 0);
    };
    let w = words[i - first];
    if !x.is_set(e) || w & (UPTODATE | ON_LRU) != UPTODATE | ON_LRU {
        obj.unlock_extent(first, EXTENT_PAGES, 0);
        return (Evict::Rotate, 0);
    }
    let _ = obj.free_data_whole(first, EXTENT_PAGES);
    x.set(e, false);
    let mut freed = 0;
    for (k, &w) in words.iter().enumerate() {
        if w & UPTODATE != 0 {
            freed += 1;
        }
        if w & READAHEAD != 0 {
            mm.counters.inc(RA_WASTED);
        }
        obj.cache.unlock(
            first + k,
            0,
            UPTODATE | MAPPED | ON_LRU | LRU_BATCHED | REFERENCED | MOVED | READAHEAD | CLEAN,
        );
    }
    mm.uncharge(freed);
    (Evict::Evicted, freed)
}

/// Whether page `i` lies in a pinned region now (a kernel-mapped page may
/// be mapped with no fault the engine saw, so never marked `PINNED`; see
/// `unmap_batch`'s `prepare_clean`); `None` where its region cannot be
/// read-locked now (the extent waits).
fn pinned_region(mm: &Mm, obj: &Object, i: usize) -> Option<bool> {
    // (No window found where the object has more pieces than its windows
    // hold: maybe a pinned region's later piece, as `prepare_clean` takes
    // it.)
    let Some(addr) = obj.windows.addr_of(i) else {
        return Some(obj.maybe_pinned_unfound());
    };
    let g = mm.lock_vma_quiet(addr)?;
    Some(std::ptr::eq(&*g.object, obj) && g.page_index(addr) == i && g.pinned)
}
