//! Stale LRU entries (pages of unmapped regions) were dropped only when
//! reclaim reached them, and reclaim runs only past the high watermark, so
//! a program that maps, touches and unmaps regions under its budget
//! filled a shard's ring with them. Pages added then overflowed
//! (`Lru::overflow`, "should stay 0"): they left the LRU with `ON_LRU`
//! cleared and were never added again while resident, so reclaim could
//! never free them (34 of 60 here). A full ring now drops its stale
//! entries before it refuses one (`lru/mod.rs`, `compact`).
//!
//! Pages dropped with `Region::dontneed` (or the application's own
//! `MADV_DONTNEED`) keep `ON_LRU` and their ring entry, so that a page
//! faulted in again is not added twice; `compact` kept those entries too
//! (on the LRU, not in an add batch), so touching and dropping the pages
//! of a large region under the budget filled the ring the same way.

#[path = "engine_util.rs"]
mod util;
use uffd_pager::{Delivery, Pager};
use util::*;

/// A pager of 64 pages with one LRU shard (its ring holds 5,376 entries).
fn pager() -> Pager {
    Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(64)
        .lru_shards(1)
        .build()
        .unwrap()
}

/// Touches every page of `r`, then reclaims: every page must go.
fn touch_and_reclaim_all(p: &Pager, r: &mut uffd_pager::Region) {
    let n = r.len() / PAGE;
    for i in 0..n {
        r.as_mut_slice()[i * PAGE] = 1;
    }
    let mut got = 0;
    for _ in 0..10 {
        got += p.reclaim_pages(n as u64);
    }
    assert_eq!(got, n as u64, "pages never reclaimable: {}", n as u64 - got);
}

#[test]
fn pages_added_while_the_ring_is_full_of_stale_entries_stay_reclaimable() {
    let p = pager();
    // 400 regions of 32 pages, each under the budget: 12,800 stale
    // entries, more than the ring holds (5,376 for 64 pages).
    for _ in 0..400 {
        let mut r = p.map_anonymous(32 * PAGE).unwrap();
        for i in 0..32 {
            r.as_mut_slice()[i * PAGE] = 1;
        }
        drop(r);
    }
    // (26 of 60 before: 34 stuck for the region's life.)
    touch_and_reclaim_all(&p, &mut p.map_anonymous(60 * PAGE).unwrap());
}

#[test]
fn entries_of_dropped_pages_do_not_fill_the_ring() {
    let p = pager();
    // 6,000 pages touched and dropped one at a time: residency stays at
    // one page, and 6,000 entries pass through the ring.
    let n = 6000;
    let mut big = p.map_anonymous(n * PAGE).unwrap();
    for i in 0..n {
        big.as_mut_slice()[i * PAGE] = 1;
        big.dontneed(i * PAGE, PAGE).unwrap();
    }
    assert_eq!(p.stats().resident_pages, 0);
    // (26 of 40 before: 14 stuck for the region's life.)
    touch_and_reclaim_all(&p, &mut p.map_anonymous(40 * PAGE).unwrap());
}
