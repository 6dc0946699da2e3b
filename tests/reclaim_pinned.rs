//! Pinned regions (`MapOptions { pinned: true, .. }`, the mlock analog) are
//! never evicted, neither by explicit reclaim nor by kswapd and direct
//! reclaim under pressure from other regions.

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, Delivery, MapOptions, Pager, Region};

const PAGE: usize = 4096;
const PINNED_PAGES: usize = 16;

const THREADS: Delivery = Delivery::Threads {
    threads: 2,
    spin_us: 0,
};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i / PAGE) as u8 ^ seed)
        .collect()
}

fn map_pinned(pager: &Pager, contents: &[u8]) -> Region {
    let store = Arc::new(MemoryStore::from_bytes(contents).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    unsafe {
        pager.map_store(
            store,
            contents.len(),
            &MapOptions {
                pinned: true,
                populate: true,
                ..MapOptions::default()
            },
        )
    }
    .unwrap()
}

/// Reads the pinned region and checks it is intact and still mapped: the
/// read takes no fault at all.
#[track_caller]
fn check_pinned_resident(pager: &Pager, r: &Region, contents: &[u8]) {
    let before = pager.stats().get(Counter::PGFAULT);
    assert!(r.as_slice() == contents, "pinned region contents changed");
    let faults = pager.stats().get(Counter::PGFAULT) - before;
    assert_eq!(faults, 0, "a pinned page was evicted (it faulted back in)");
}

fn pinned_alone_is_never_reclaimed(delivery: Delivery) {
    let pager = Pager::builder()
        .budget_pages(64)
        .kswapd(false)
        .delivery(delivery)
        .build()
        .unwrap();
    let contents = pattern(PINNED_PAGES * PAGE, 1);
    let pinned = map_pinned(&pager, &contents);
    assert_eq!(pager.stats().resident_pages, PINNED_PAGES as u64);

    assert_eq!(
        pager.reclaim_pages(1 << 20),
        0,
        "pinned pages were reclaimed"
    );
    let s = pager.stats();
    assert_eq!(s.get(Counter::PGSTEAL), 0);
    assert_eq!(s.resident_pages, PINNED_PAGES as u64);
    check_pinned_resident(&pager, &pinned, &contents);
    // Asked again (the pinned pages left the LRU the first time).
    assert_eq!(pager.reclaim_pages(1 << 20), 0);
    check_pinned_resident(&pager, &pinned, &contents);
}

#[test]
fn pinned_alone_in_thread() {
    pinned_alone_is_never_reclaimed(Delivery::InThread);
}

#[test]
fn pinned_alone_handler_threads() {
    pinned_alone_is_never_reclaimed(THREADS);
}

/// With another region resident too, reclaim frees exactly that region's
/// pages.
#[test]
fn reclaim_frees_only_unpinned_pages() {
    let pager = Pager::builder()
        .budget_pages(64)
        .kswapd(false)
        .build()
        .unwrap();
    let contents = pattern(PINNED_PAGES * PAGE, 2);
    let pinned = map_pinned(&pager, &contents);

    const OTHER: usize = 32;
    let mut other = pager.map_anonymous(OTHER * PAGE).unwrap();
    for p in 0..OTHER {
        other.as_mut_slice()[p * PAGE + 1] = p as u8 + 1;
    }
    assert_eq!(pager.stats().resident_pages, (PINNED_PAGES + OTHER) as u64);

    let freed = pager.reclaim_pages(1 << 20);
    let s = pager.stats();
    assert_eq!(freed, OTHER as u64, "reclaim must free every unpinned page");
    assert_eq!(s.get(Counter::PGSTEAL), OTHER as u64);
    assert_eq!(s.resident_pages, PINNED_PAGES as u64);
    check_pinned_resident(&pager, &pinned, &contents);
    // The evicted region comes back intact from swap.
    for p in 0..OTHER {
        assert_eq!(other.as_slice()[p * PAGE + 1], p as u8 + 1, "page {p}");
    }
}

/// Under sustained pressure (a region 8x the budget streamed through with
/// kswapd on), the pinned region stays resident and intact.
fn pinned_survives_pressure(delivery: Delivery) {
    const BUDGET: u64 = 48;
    let pager = Pager::builder()
        .budget_pages(BUDGET)
        .kswapd(true)
        .delivery(delivery)
        .build()
        .unwrap();
    let contents = pattern(PINNED_PAGES * PAGE, 3);
    let pinned = map_pinned(&pager, &contents);

    let pages = 8 * BUDGET as usize;
    let mut other = pager.map_anonymous(pages * PAGE).unwrap();
    for round in 0..3u8 {
        for p in 0..pages {
            other.as_mut_slice()[p * PAGE + 9] = round ^ p as u8;
        }
        check_pinned_resident(&pager, &pinned, &contents);
    }
    for p in 0..pages {
        assert_eq!(other.as_slice()[p * PAGE + 9], 2 ^ p as u8, "page {p}");
    }
    let s = pager.stats();
    assert!(s.get(Counter::PGSTEAL) > 0, "no pressure: nothing evicted");
    assert!(s.resident_pages >= PINNED_PAGES as u64);
    check_pinned_resident(&pager, &pinned, &contents);
}

#[test]
fn pinned_survives_pressure_in_thread() {
    pinned_survives_pressure(Delivery::InThread);
}

#[test]
fn pinned_survives_pressure_handler_threads() {
    pinned_survives_pressure(THREADS);
}

/// A pinned **kernel-mapped** region (`MapOptions::kernel_maps`): the
/// kernel maps the pages already in its memfd with no fault the engine
/// sees, so those that readahead filled (or that a kept object brought)
/// were never marked pinned, and reclaim zapped and punched them: the 4
/// pages read ahead here were evicted, and the program's next reads of
/// them faulted (found by review). Reclaim now pins a
/// page it finds under a pinned region instead.
#[test]
fn a_pinned_kernel_mapped_region_keeps_the_pages_readahead_filled() {
    pinned_kernel_mapped_keeps_read_ahead(false);
}

/// As above while the region is write-locked (a remap or an unmap holds
/// it for a moment): reclaim could not read-lock it to learn that it is
/// pinned, and punched its pages as an unpinned region's (found by a
/// read-only review). It now leaves them for a later pass.
#[cfg(feature = "fault-inject")]
#[test]
fn a_pinned_kernel_mapped_region_keeps_its_pages_while_write_locked() {
    pinned_kernel_mapped_keeps_read_ahead(true);
}

fn pinned_kernel_mapped_keeps_read_ahead(write_locked: bool) {
    const PAGES: usize = 64;
    let pager = Pager::builder()
        .budget_pages(1024)
        .readahead(32, 1)
        .kswapd(false)
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let contents = pattern(PAGES * PAGE, 5);
    let store = Arc::new(MemoryStore::from_bytes(&contents).unwrap());
    let opts = MapOptions {
        kind: Some(uffd_pager::InstallKind::Shared),
        kernel_maps: true,
        pinned: true,
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: nothing else changes the store.
    let r = unsafe { pager.map_store(store, PAGES * PAGE, &opts) }.unwrap();
    let s = r.as_slice();
    // Sequential faults: readahead fills what follows.
    for p in 0..4 {
        assert_eq!(s[p * PAGE], contents[p * PAGE]);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while pager.stats().get(Counter::RA_PAGES) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let read_ahead = pager.stats().get(Counter::RA_PAGES);
    assert!(read_ahead > 0, "no readahead: the test tests nothing");
    // The program reads the pages readahead filled (the kernel maps them).
    for p in 4..8 {
        assert_eq!(s[p * PAGE + 1], contents[p * PAGE + 1]);
    }
    let stolen = pager.stats().get(Counter::PGSTEAL);
    #[cfg(feature = "fault-inject")]
    let hold = write_locked.then(|| pager.hold_region_write(&r).unwrap());
    #[cfg(not(feature = "fault-inject"))]
    let _ = write_locked;
    pager.reclaim_pages(1 << 20);
    #[cfg(feature = "fault-inject")]
    drop(hold);
    let st = pager.stats();
    assert_eq!(
        st.get(Counter::PGSTEAL) - stolen,
        0,
        "pages of a pinned region were evicted ({read_ahead} read ahead)\n{st}"
    );
    let before = st.get(Counter::PGFAULT);
    assert!(s[..8 * PAGE] == contents[..8 * PAGE]);
    assert_eq!(pager.stats().get(Counter::PGFAULT) - before, 0);
}

/// Pages that leave a pinned shared region (its shrink, or the
/// application's `munmap` of its tail) are ordinary cached pages again:
/// reclaim frees them, as the kernel munlocks pages whose range is
/// unmapped. They stayed pinned, off the LRU and charged until the whole
/// region went (found by review).
#[test]
fn pages_that_leave_a_pinned_region_can_be_reclaimed() {
    for by_munmap in [false, true] {
        let pager = Pager::builder()
            .budget_pages(128)
            .kswapd(false)
            .build()
            .unwrap();
        let contents = pattern(64 * PAGE, 5);
        let mut pinned = map_pinned(&pager, &contents);
        assert_eq!(pager.stats().resident_pages, 64);
        if by_munmap {
            let tail = pinned.as_ptr() as usize + 32 * PAGE;
            // SAFETY: the region's own tail, given up here; the region is
            // only read below its first 32 pages from now on (its drop
            // unmaps what it still maps).
            assert_eq!(unsafe { libc::munmap(tail as *mut _, 32 * PAGE) }, 0);
            let t = std::time::Instant::now();
            while pinned.mapped().iter().map(|r| r.len()).sum::<usize>() > 32 * PAGE {
                assert!(t.elapsed().as_secs() < 10, "the unmap's event never came");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        } else {
            pinned.remap(32 * PAGE).unwrap();
        }
        let freed = pager.reclaim_pages(64);
        assert_eq!(
            (freed, pager.stats().resident_pages),
            (32, 32),
            "by munmap: {by_munmap}: (freed, resident) after reclaim"
        );
        assert!(pinned.as_slice()[..32 * PAGE] == contents[..32 * PAGE]);
    }
}

/// `MADV_DONTNEED` of a pinned region is refused, as `madvise` refuses a
/// locked mapping (EINVAL), and its bytes stay: an anonymous pinned
/// region read zeros after it, and the call said Ok (the shim maps a
/// program's `MAP_LOCKED` memory pinned).
#[test]
fn dontneed_of_a_pinned_region_is_refused_and_keeps_its_bytes() {
    let pager = Pager::builder().build().unwrap();
    let opts = MapOptions {
        pinned: true,
        ..MapOptions::default()
    };
    let mut r = pager.map_anonymous_with(4 * PAGE, &opts).unwrap();
    r.as_mut_slice().fill(7);
    let e = r.dontneed(0, 4 * PAGE).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(r.as_slice().iter().all(|&b| b == 7));
    let c = map_pinned(&pager, &pattern(2 * PAGE, 3));
    // SAFETY: no slice of `c` is alive.
    let e = unsafe { c.dontneed_unchecked(0, PAGE) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert_eq!(c.as_slice(), &pattern(2 * PAGE, 3)[..]);
}
