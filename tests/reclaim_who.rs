//! Who reclaims past the high watermark (`reclaim/kswapd.rs`): the
//! faulting context frees clean pages itself, a batch at a time, where its
//! zap flushes only its own CPU's TLB; kswapd is woken for the pages that
//! need writing (dirty anonymous pages on their way to swap). Before, every
//! crossing of the high watermark woke kswapd, whose zaps interrupted the
//! faulting CPU, or which the scheduler ran on that CPU in its place.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, InstallKind, MapOptions, Pager};
use util::*;

const PAGE: usize = 4096;
const BUDGET: u64 = 512;

#[test]
fn clean_pages_are_freed_where_they_fault() {
    for kind in [InstallKind::Shared, InstallKind::Anonymous] {
        let pager = Pager::builder()
            .budget_pages(BUDGET)
            .readahead(0, 1)
            .fault_around(0)
            .build()
            .unwrap();
        let pages = 4 * BUDGET as usize;
        let store = Arc::new(MemoryStore::from_bytes(&pattern_vec(7, pages * PAGE)).unwrap());
        // Read-only: the engine knows its anonymous pages are clean (a
        // writable region's could have been written).
        let opts = MapOptions {
            kind: Some(kind),
            writable: false,
            ..MapOptions::default()
        };
        // SAFETY: the store is this test's own and is changed only through
        // the region.
        let r = unsafe { pager.map_store(store, pages * PAGE, &opts) }.unwrap();
        for pass in 0..2 {
            for p in 0..pages {
                let want = pattern(7, p * PAGE + pass);
                assert_eq!(r.as_slice()[p * PAGE + pass], want, "{kind} page {p}");
            }
        }
        let s = pager.stats();
        assert!(s.get(Counter::PGSTEAL) >= 6 * BUDGET, "{kind}: {s}");
        assert!(s.get(Counter::DIRECT_RECLAIM) > 0, "{kind}: {s}");
        // A pass that finds only recently used pages at the LRU's end may
        // still leave a round to kswapd; one in ten is the bound here.
        let wakes = s.get(Counter::KSWAPD_WAKE);
        assert!(
            wakes * 10 <= s.get(Counter::DIRECT_RECLAIM),
            "{kind}: kswapd woke {wakes} times for clean pages: {s}"
        );
        assert!(s.peak_resident_pages <= BUDGET + 64, "{kind}: {s}");
    }
}

#[test]
fn dirty_pages_still_go_to_kswapd() {
    let pager = Pager::builder()
        .budget_pages(BUDGET)
        .readahead(0, 1)
        .build()
        .unwrap();
    let pages = 4 * BUDGET as usize;
    let mut r = pager.map_anonymous(pages * PAGE).unwrap();
    for p in 0..pages {
        r.as_mut_slice()[p * PAGE] = p as u8 | 1;
    }
    for p in 0..pages {
        assert_eq!(r.as_slice()[p * PAGE], p as u8 | 1, "page {p}");
    }
    let s = pager.stats();
    assert!(s.get(Counter::KSWAPD_WAKE) > 0, "{s}");
    assert!(s.get(Counter::WRITEBACK) >= 3 * BUDGET, "{s}");
}

/// A pass frees what it was asked for, not every entry it took off the
/// LRU at once (32): the rest keep their place. Before, `reclaim_pages(1)`
/// freed up to 32 pages, and a small budget's direct reclaim (a
/// sixteenth of the budget: 4 pages of 64) emptied half of it.
#[test]
fn reclaim_frees_what_it_is_asked_for() {
    let pager = Pager::builder()
        .budget_pages(BUDGET)
        .kswapd(false)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let pages = 64;
    let store = Arc::new(MemoryStore::from_bytes(&pattern_vec(9, pages * PAGE)).unwrap());
    let opts = MapOptions {
        kind: Some(InstallKind::Anonymous),
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the store is this test's own and is changed only through
    // the region.
    let r = unsafe { pager.map_store(store, pages * PAGE, &opts) }.unwrap();
    for p in 0..pages {
        assert_eq!(r.as_slice()[p * PAGE], pattern(9, p * PAGE), "page {p}");
    }
    for nr in [1, 3, 5] {
        let before = pager.stats().resident_pages;
        // Referenced pages may take a round of rotation first; what is
        // freed is `nr` all the same.
        assert_eq!(pager.reclaim_pages(nr), nr, "reclaim_pages({nr})");
        assert_eq!(pager.stats().resident_pages, before - nr);
    }
    // The nine pages freed are read again, and no others.
    for p in 0..pages {
        assert_eq!(r.as_slice()[p * PAGE], pattern(9, p * PAGE), "page {p}");
    }
    assert_eq!(pager.stats().get(Counter::PGMAJFAULT), pages as u64 + 9);
}
