//! Discarding pages: what happens to a page whose contents the engine no
//! longer keeps (the application dropped it, or the range left the region):
//! the kernel's `zap_page_range` for the mapping and, for private memory,
//! freeing the page and its swap copy.

use crate::address_space::Mm;
use crate::object::{InstallKind, Object};
use crate::page_cache::{
    CLEAN, DIRTY, MAPPED, MOVED, PINNED, POISONED, READAHEAD, SWAPPED, SYNCING, UPTODATE,
};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// The state bits a page loses when its contents are dropped.
pub const DISCARDED: u32 =
    UPTODATE | MAPPED | DIRTY | SWAPPED | MOVED | POISONED | CLEAN | READAHEAD | SYNCING;

/// Drops page `i` of `obj` as `MADV_DONTNEED` drops a private page: its
/// contents revert to the object's source (zeros for anonymous memory, or
/// the store), any copy in the cache area, the memfd or swap is dropped
/// (the swap copy by forgetting it: `SWAPPED` goes, and the swap store is
/// told, [`forget_swap`]), and a
/// resident page is uncharged. The caller holds the page lock and unlocks it clearing the
/// returned bits; the page's LRU entry, if any, goes stale and is dropped
/// when reclaim reaches it. `w` is the word as the caller locked it.
/// Async-signal-safe.
pub(crate) fn discard_page(mm: &Mm, obj: &Object, i: usize, w: u32) -> u32 {
    if w & UPTODATE != 0 {
        mm.uncharge(obj.units());
    }
    // Its swap copy is never read again (an anonymous object's swap only:
    // a shared object's is its store).
    if w & SWAPPED != 0 && obj.kind == InstallKind::Anonymous {
        forget_swap(obj, i);
    }
    if w & MOVED == 0 {
        let _ = obj.free_data(i, 1);
    }
    DISCARDED
}

/// Page `i`'s swap copy is never read again (its `SWAPPED` bit goes):
/// a signal-safe swap store is told at once
/// ([`Store::discard`](crate::store::Store::discard): the in-memory swap
/// gives the memory back, a swap file its blocks); another (a server's,
/// which the engine calls only from its I/O workers) hears of it when the
/// object is released ([`discard_swap_left`]). The caller holds the
/// page's lock. Async-signal-safe (atomics only).
pub(crate) fn forget_swap(obj: &Object, i: usize) {
    if obj.swap().signal_safe() {
        let size = obj.page_size() as u64;
        crate::io::discard(&**obj.swap(), i as u64 * size, size);
    } else {
        note_swap_page(obj, i);
    }
}

/// Widens the span [`discard_swap_left`] covers to page `i`: one whose
/// copy was forgotten, or one a swap write was sent for (a write that
/// failed or was given up on may land yet: its worker goes on).
/// Async-signal-safe (atomics only).
pub(crate) fn note_swap_page(obj: &Object, i: usize) {
    obj.swap_left[0].fetch_min(i, Relaxed);
    obj.swap_left[1].fetch_max(i, Relaxed);
}

/// At release, once no page can go to swap again: tells an anonymous
/// object's swap store that is not signal-safe to forget the pages from
/// the first to the last that went there (in swap now, forgotten by
/// [`forget_swap`], or written, even where the write failed:
/// [`note_swap_page`]), in one call on an I/O worker, bounded by the I/O
/// timeout (up to three times it: a wait for writes given up on, for a
/// free request slot, and for the call).
/// Before, a Redis swap namespace kept every key of every region
/// unmapped. The call's cost follows that span (a `DEL` per 64 pages for
/// Redis), not the region's size.
pub(crate) fn discard_swap_left(mm: &Mm, obj: &Arc<Object>) {
    if obj.kind != InstallKind::Anonymous || obj.swap().signal_safe() {
        return;
    }
    let swapped = |i: &usize| obj.cache.load(*i) & SWAPPED != 0;
    let first = (0..obj.npages()).find(swapped);
    let last = (0..obj.npages()).rev().find(swapped);
    let lo = first
        .unwrap_or(usize::MAX)
        .min(obj.swap_left[0].load(Relaxed));
    let hi = last.unwrap_or(0).max(obj.swap_left[1].load(Relaxed));
    if lo > hi {
        return;
    }
    let size = obj.page_size() as u64;
    let (off, len) = (lo as u64 * size, (hi - lo + 1) as u64 * size);
    if let Err(e) = mm.io.discard(obj.swap(), off, len) {
        tracing::warn!(
            errno = e.0,
            "telling a swap store to forget an unmapped region's pages failed; they stay there"
        );
    }
}

/// Pages `pages` of `obj` leave the mapping for good (an unmap, a
/// shrink): a shared page stays cached in the memfd, unmapped; an
/// anonymous page is discarded ([`discard_page`]), as the kernel discards
/// private memory that is unmapped.
///
/// A page whose word holds nothing to clear is not written: the words of
/// a large region are mapped lazily, and an update (a `lock cmpxchg`,
/// a write even where nothing changes) of every word made them all
/// resident, outside the budget, and cost one `madvise` per absent page.
pub(crate) fn give_up_pages(mm: &Mm, obj: &Object, pages: std::ops::Range<usize>) {
    for i in pages {
        let seen = obj.cache.load(i);
        if obj.kind == InstallKind::Shared {
            // A pinned page left the LRU for good (`MapOptions::pinned`):
            // unmapped, it is an ordinary cached page again, back on the
            // LRU, as the kernel munlocks pages whose range is unmapped.
            // (It stayed pinned, charged and out of reclaim's reach until
            // the whole region went: found by review.)
            if seen & PINNED != 0 {
                let w = obj.cache.lock(i);
                obj.cache.unlock(i, 0, MAPPED | PINNED);
                if w & UPTODATE != 0 {
                    mm.page_cached(obj, i);
                }
            } else if seen & MAPPED != 0 {
                obj.cache.update(i, 0, MAPPED);
            }
            continue;
        }
        // (Never loaded, or discarded already: no copy anywhere.)
        if seen == 0 {
            continue;
        }
        let w = obj.cache.lock(i);
        let clear = discard_page(mm, obj, i, w);
        obj.cache.unlock(i, 0, clear);
    }
}
