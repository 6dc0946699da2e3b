//! What readahead reads: only pages a fault could use. Not pages past
//! the end of the region piece that faulted (a shrink, a map shorter than
//! its store, the application's own `munmap` of part of a region), and for
//! anonymous memory only pages that are in swap (the kernel's swap
//! readahead: a never-written page is the zero page, with nothing to read).

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{MemoryStore, Store};
use uffd_pager::{Counter, InstallKind, MapOptions, Pager};
use util::*;

const PAGES: usize = 64;

fn pager() -> Pager {
    // A budget well above what the tests read (so that reclaim_pages has an
    // LRU to work on, and nothing is evicted on its own).
    Pager::builder()
        .budget_pages(1024)
        .readahead(32, 1)
        .fault_around(0)
        .build()
        .unwrap()
}

/// Waits until the readahead counters have not moved for a while (the
/// I/O thread has drained its queue), then returns `readahead_pages`.
fn settled(p: &Pager) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = (u64::MAX, u64::MAX);
    let mut still = 0;
    while Instant::now() < deadline && still < 6 {
        std::thread::sleep(Duration::from_millis(50));
        let s = p.stats();
        let now = (s.get(Counter::RA_PAGES), s.get(Counter::PGREAD));
        if now == last {
            still += 1;
        } else {
            still = 0;
            last = now;
        }
    }
    last.0
}

/// A region over a store of `PAGES` pages, mapped `PAGES` long.
fn region(p: &Pager, kind: InstallKind) -> (uffd_pager::Region, Vec<u8>) {
    let data = pattern_vec(5, PAGES * PAGE);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let opts = MapOptions {
        kind: Some(kind),
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region.
    let r = unsafe { p.map_store(store, PAGES * PAGE, &opts) }.unwrap();
    (r, data)
}

/// A region shrunk to 8 pages and read from its start: readahead read up
/// to its window past the new end (to the object's page count), pages no
/// region maps any more, each charged to the budget and held (with no
/// budget, until the object went).
#[test]
fn readahead_stops_at_a_shrunk_regions_end() {
    for kind in [InstallKind::Shared, InstallKind::Anonymous] {
        let p = pager();
        let (mut r, data) = region(&p, kind);
        r.remap(8 * PAGE).unwrap();
        for pg in 0..8 {
            assert_eq!(r.as_slice()[pg * PAGE + 7], data[pg * PAGE + 7], "{kind}");
        }
        let ra = settled(&p);
        let resident = p.memory_use().resident_pages;
        assert!(
            ra <= 6 && resident <= 8,
            "{kind}: {ra} pages read ahead, {resident} resident, for a region of 8 pages"
        );
        assert_bytes(r.as_slice(), &data[..8 * PAGE], &format!("{kind}"));
    }
}

/// The same after the application's own `munmap` of the middle of a
/// region: a sequential reader of the first piece made readahead read the
/// hole, which nothing maps.
#[test]
fn readahead_stops_at_a_hole_the_application_unmapped() {
    for kind in [InstallKind::Shared, InstallKind::Anonymous] {
        let p = pager();
        let (r, data) = region(&p, kind);
        let base = r.as_ptr() as usize;
        // SAFETY: unmaps region memory nothing here refers to afterwards
        // (the test reads only the first piece and the last).
        assert_eq!(
            unsafe { libc::munmap((base + 8 * PAGE) as *mut libc::c_void, 48 * PAGE) },
            0
        );
        assert_eq!(r.mapped().len(), 2, "{kind}: two pieces");
        for pg in 0..8 {
            // SAFETY: the first piece is still mapped.
            let b = unsafe { *((base + pg * PAGE + 7) as *const u8) };
            assert_eq!(b, data[pg * PAGE + 7], "{kind} page {pg}");
        }
        let ra = settled(&p);
        let resident = p.memory_use().resident_pages;
        assert!(
            ra <= 6 && resident <= 8,
            "{kind}: {ra} pages read ahead, {resident} resident, reading 8 pages before a hole"
        );
        // The last piece still reads its own pages.
        for pg in 56..PAGES {
            // SAFETY: the last piece is still mapped.
            let b = unsafe { *((base + pg * PAGE + 7) as *const u8) };
            assert_eq!(b, data[pg * PAGE + 7], "{kind} page {pg}");
        }
    }
}

/// Anonymous memory with a few pages in swap, the rest never written: a
/// sequential read of the swapped pages made readahead read the
/// never-written pages after them from the zero store into the cache area
/// (a real page each, charged), where the fault would have mapped the zero
/// page for nothing. Only swapped pages are read ahead now.
#[test]
fn anonymous_readahead_reads_only_swapped_pages() {
    let p = pager();
    let mut r = p.map_anonymous(PAGES * PAGE).unwrap();
    let data = pattern_vec(9, 4 * PAGE);
    r.as_mut_slice()[..4 * PAGE].copy_from_slice(&data);
    assert_eq!(p.reclaim_pages(64), 4, "the four written pages go to swap");
    assert_eq!(p.memory_use().resident_pages, 0);
    p.reset_stats();
    // Two sequential major faults open a window of 4 pages after page 1:
    // pages 2 and 3 are in swap, 4 and 5 were never written.
    assert_eq!(r.as_slice()[7], data[7]);
    assert_eq!(r.as_slice()[PAGE + 7], data[PAGE + 7]);
    let ra = settled(&p);
    let mem = p.memory_use();
    assert_eq!(
        (ra, mem.resident_pages, mem.cache_area_bytes),
        (2, 4, 2 * PAGE as u64),
        "(pages read ahead, resident pages, cache-area bytes): only the two swapped pages \
         should be read ahead"
    );
    let mut want = vec![0u8; PAGES * PAGE];
    want[..4 * PAGE].copy_from_slice(&data);
    assert_bytes(r.as_slice(), &want, "anonymous memory");
}
