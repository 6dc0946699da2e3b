//! Pages that leave residency without reclaim (dropped by `dontneed`,
//! shrunk away by `remap`) leave stale LRU entries behind. Reclaim drops a
//! stale entry when it reaches it; a page that becomes resident again must
//! be added to the LRU anew, or it is never evicted and the budget stops
//! holding.

#[path = "engine_util.rs"]
mod util;

use uffd_pager::{Delivery, Pager, Region};
use util::*;

const PAGES: usize = 128;

/// A budget above the region's size: nothing is evicted until asked.
fn pager(d: Delivery) -> Pager {
    Pager::builder()
        .delivery(d)
        .budget_pages(4 * PAGES as u64)
        .build()
        .unwrap()
}

fn write_all(r: &mut Region, v: u8) {
    for p in 0..PAGES {
        r.as_mut_slice()[p * PAGE + 1] = v;
    }
}

/// The pages made resident again are evictable: reclaim frees them.
fn assert_evictable(p: &Pager, r: &Region, ctx: &str) {
    assert!(
        p.stats().resident_pages >= PAGES as u64,
        "{ctx}: all resident"
    );
    p.reclaim_pages(10 * PAGES as u64);
    let left = p.stats().resident_pages;
    assert!(left <= 8, "{ctx}: {left} pages could not be reclaimed");
    for pg in 0..PAGES {
        assert_eq!(r.as_slice()[pg * PAGE + 1], 2, "{ctx}: page {pg}");
    }
}

#[test]
fn pages_dropped_by_dontneed_rejoin_the_lru() {
    for d in DELIVERIES {
        let p = pager(d);
        let mut r = p.map_anonymous(PAGES * PAGE).unwrap();
        write_all(&mut r, 1);
        r.dontneed(0, PAGES * PAGE).unwrap();
        // Reclaim reaches the stale entries of the dropped pages.
        p.reclaim_pages(10 * PAGES as u64);
        write_all(&mut r, 2);
        assert_evictable(&p, &r, &format!("{d}"));
    }
}

#[test]
fn pages_shrunk_away_by_remap_rejoin_the_lru() {
    for d in DELIVERIES {
        let p = pager(d);
        let mut r = p.map_anonymous(PAGES * PAGE).unwrap();
        write_all(&mut r, 1);
        r.remap(PAGE).unwrap();
        p.reclaim_pages(10 * PAGES as u64);
        r.remap(PAGES * PAGE).unwrap();
        write_all(&mut r, 2);
        assert_evictable(&p, &r, &format!("{d}"));
    }
}
