//! Stale LRU entries (pages of unmapped regions) were dropped only when
//! reclaim reached them, and reclaim runs only past the high watermark, so
//! a program that maps, touches and unmaps regions under its budget
//! filled a shard's ring with them. Pages added then overflowed
//! (`Lru::overflow`, "should stay 0"): they left the LRU with `ON_LRU`
//! cleared and were never added again while resident, so reclaim could
//! never free them (34 of 60 here). A full ring now drops its stale
//! entries before it refuses one (`lru.rs`, `compact`).

#[path = "engine_util.rs"]
mod util;
use uffd_pager::{Delivery, Pager};
use util::*;

#[test]
fn pages_added_while_the_ring_is_full_of_stale_entries_stay_reclaimable() {
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(64)
        .lru_shards(1)
        .build()
        .unwrap();
    // 400 regions of 32 pages, each under the budget: 12,800 stale
    // entries, more than the ring holds (5,376 for 64 pages).
    for _ in 0..400 {
        let mut r = p.map_anonymous(32 * PAGE).unwrap();
        for i in 0..32 {
            r.as_mut_slice()[i * PAGE] = 1;
        }
        drop(r);
    }
    let mut r = p.map_anonymous(60 * PAGE).unwrap();
    for i in 0..60 {
        r.as_mut_slice()[i * PAGE] = 1;
    }
    let mut got = 0;
    for _ in 0..10 {
        got += p.reclaim_pages(60);
    }
    // (26 of 60 before: 34 stuck for the region's life.)
    assert_eq!(got, 60, "pages never reclaimable: {}", 60 - got);
    drop(r);
}
