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

mod evict;
mod extent;
mod huge;
mod kswapd;
pub mod staging;
mod unmap_batch;

use crate::address_space::Mm;
use crate::lru::{unpack, Entry};
use crate::object::{InstallKind, Object};
use crate::page_cache::*;
use crate::stats::Counter::*;
use crate::sys::{futex, now_ns, PAGE_SIZE};
use crate::write_error::Permit;

pub use evict::{evict_page, Evict, Pass};
pub use kswapd::{maybe_wake_kswapd, start_kswapd, stop_kswapd, watermarks};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use unmap_batch::UnmapBatch;

/// Entries isolated from the LRU per round.
const ISOLATE: usize = 32;

/// Frees up to `nr` pages from the LRU; returns how many were freed.
/// Clean pages wait in an unmap batch (`reclaim/unmap_batch.rs`) and
/// leave together, one zap per 32 of them, however many rounds of
/// isolation that takes (rotated pages do not shrink the batch).
/// Async-signal-safe.
pub fn shrink(mm: &Mm, nr: u64) -> u64 {
    shrink_drained(mm, nr, nr, &mut Pass::new())
}

/// [`shrink_in`] for `nr` pages, and if that freed fewer than `enough`, a
/// second pass after draining every CPU's add batch.
///
/// Hazard: the first pass drains them only if the ring runs dry, and it
/// does not while pages it cannot free rotate through it (busy, or dirty
/// over a store in its write backoff). Pages that sat in an add batch
/// were never looked at: 2 MiB pages there took residency past the
/// hugetlb pool (SIGBUS), and `Pager::reclaim_pages` and kswapd freed
/// nothing beside one dirty page a failing store refused while a clean
/// page waited in a batch (found while writing a test).
fn shrink_drained(mm: &Mm, nr: u64, enough: u64, pass: &mut Pass) -> u64 {
    let freed = shrink_in(mm, nr, pass);
    if freed >= enough {
        return freed;
    }
    mm.lru.drain_all(&mm.objects, &mm.counters);
    freed + shrink_in(mm, enough - freed, pass)
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
    // Hazard: pages reclaim cannot free (guarded, locked, in a piece no
    // window finds) go back to the tail, so the ring never runs dry. A
    // limit from `nr` alone let a large one (`reclaim_pages(u64::MAX)`,
    // "drop every page") rotate them for ever once the rest were freed
    // (found by review). So no pass looks at the ring more than about
    // twice over (the second look finds a page its first look took the
    // referenced mark from), as the kernel's scan is bounded by the
    // LRU's size. (Taken at the start, as evictions shrink the ring, and
    // again when the add batches are drained into it.)
    let ring_scan = || (mm.lru.entries() as u64).saturating_mul(2) + 2 * ISOLATE as u64;
    let mut ring_limit = ring_scan();
    while freed + (batch.len() as u64) < nr
        && scanned < max_scan
        && scanned < ring_limit
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
            ring_limit = ring_limit.max(scanned + ring_scan());
            continue;
        }
        let mut nb = 0;
        for (k, &e) in buf[..n].iter().enumerate() {
            // Enough (in units: one 2 MiB page is 512): the entries not
            // looked at go back where they were. Evicting the whole
            // isolated batch took a small budget's direct reclaim, meant
            // to free a sixteenth of it, to half of it, and a 2 MiB
            // pager's to 32 pages where one would do.
            // And an event waiting for this section leaves it after each
            // page, not after the batch: a batch of dirty pages is a store
            // write each, and the application's `munmap` (and with
            // in-thread delivery every fault that begins meanwhile) waited
            // for all of them (found by review: 32 writes).
            if freed + batch.len() as u64 >= nr || mm.events.pending() {
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
                    // (A huge folio of clean pages is evicted whole on any
                    // pass: see `collapse`.)
                    Err((_, Some(obj))) if pass.clean_only && !obj.collapsed(page) => Evict::Rotate,
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
                Evict::EvictedPages(n) => {
                    freed += n;
                    c.add(PGSTEAL, n);
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
    // SeqCst, as `maybe_wake_kswapd`'s load: see there (on x86-64 the
    // same locked add as a relaxed one).
    let now = mm.resident.fetch_add(n, SeqCst) + n;
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
        .fetch_update(SeqCst, Relaxed, |r| (r + n <= budget).then_some(r + n))
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
        // (A second pass only to bring it back to the budget: see
        // `shrink_drained`.)
        shrink_drained(mm, want, over, &mut Pass::new());
    }
}
