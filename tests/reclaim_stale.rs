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

/// A region of more than 2^32 pages (16 TiB of address space, touched in a
/// few places): pages past index 2^32 are evicted and read back as
/// themselves. LRU entries and readahead once kept 32-bit page indices, so
/// page 2^32 + k stood for page k.
#[test]
fn pages_past_index_2_pow_32_are_evicted_as_themselves() {
    if !is_child() {
        let out = run_child("pages_past_index_2_pow_32_are_evicted_as_themselves", &[]);
        assert!(out.status.success(), "{}", describe(&out));
        // A child that could not map the region tested nothing: as root (CI)
        // that is a failure, not a pass.
        let skipped = String::from_utf8_lossy(&out.stderr).contains("skipping");
        assert!(!(skipped && is_root()), "{}", describe(&out));
        assert!(
            skipped || String::from_utf8_lossy(&out.stdout).contains("evicted as themselves"),
            "{}",
            describe(&out)
        );
        return;
    }
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(8)
        .build()
        .unwrap();
    let pages = (1usize << 32) + 64;
    let r = match p.map_anonymous(pages * PAGE) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skipping: cannot map 16 TiB here: {e}");
            return;
        }
    };
    let base = r.as_ptr() as usize;
    let at = |pg: usize| (base + pg * PAGE + 8) as *mut u64;
    let high: Vec<usize> = (0..32).map(|k| (1usize << 32) + k).collect();
    let low: Vec<usize> = (0..32).collect();
    for &pg in high.iter().chain(&low) {
        // SAFETY: inside the region.
        unsafe { std::ptr::write_volatile(at(pg), pg as u64 ^ 0x5555) };
    }
    // Every page is evictable: an entry that stood for another page left
    // the high ones resident for good.
    p.reclaim_pages(1000);
    let left = p.stats().resident_pages;
    assert!(left <= 8, "{left} pages could not be reclaimed");
    for &pg in high.iter().chain(&low) {
        // SAFETY: as above.
        let v = unsafe { std::ptr::read_volatile(at(pg)) };
        assert_eq!(v, pg as u64 ^ 0x5555, "page {pg:#x}");
    }
    assert!(p.stats().get(uffd_pager::Counter::PGSTEAL) >= 56);
    // Unmapping visits every page's state word (16 GiB of them here): the
    // child leaves without it.
    std::mem::forget(r);
    std::mem::forget(p);
    println!("pages evicted as themselves");
    // SAFETY: ends the child at once, skipping the leaked pager's drop.
    unsafe { libc::_exit(0) };
}
