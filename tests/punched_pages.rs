//! A shared region's pages that the application punches out of the memfd
//! (`madvise(MADV_REMOVE)` through its own mapping) come back from the
//! store on their next access, whether they were mapped or only cached
//! (read ahead, not yet mapped), in every delivery. Before, a cached page
//! punched that way was SIGBUS under in-thread delivery and an endless
//! fault under handler threads: the install found no page in the memfd and
//! the fault gave up instead of reading the page again.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager};
use util::*;

const PAGES: usize = 64;
const MARKER: &str = "CHILD-PUNCHED";

fn delivery_named(name: &str) -> Delivery {
    DELIVERIES
        .into_iter()
        .find(|d| d.to_string().starts_with(name))
        .unwrap_or(Delivery::InThread)
}

/// Child of the test below: reads the first pages in order (so readahead
/// caches the next ones), punches pages 2..48 (two mapped, the rest cached
/// or absent), and reads every page back.
#[test]
fn child_punch_cached_and_mapped_pages() {
    if !is_child() {
        return;
    }
    let d = delivery_named(&std::env::var("UFFD_DELIVERY").unwrap_or_default());
    let pager = Pager::builder()
        .delivery(d)
        .readahead(32, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let data = pattern_vec(21, PAGES * PAGE);
    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: true,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract); the punch changes the memfd, not the store.
    let region = unsafe { pager.map_store(store, data.len(), &opts) }.unwrap();
    let base = region.as_ptr();
    for p in 0..4 {
        // SAFETY: inside the region.
        let b = unsafe { std::ptr::read_volatile(base.add(p * PAGE)) };
        assert_eq!(b, data[p * PAGE], "page {p} before the punch");
    }
    // Readahead runs on its own thread: wait until it has cached some.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pager.stats().get(Counter::RA_PAGES) < 8 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let ahead = pager.stats().get(Counter::RA_PAGES);
    assert!(ahead >= 8, "only {ahead} pages read ahead");
    // SAFETY: pages 2..48 of the region; the application may punch its own
    // shared memory.
    let rc = unsafe { libc::madvise(base.add(2 * PAGE).cast(), 46 * PAGE, libc::MADV_REMOVE) };
    assert_eq!(rc, 0, "madvise(MADV_REMOVE): {}", errno());
    // SAFETY: alarm has no preconditions. A fault that never ends is
    // SIGALRM, which the parent reports.
    unsafe { libc::alarm(20) };
    eprintln!("{MARKER}");
    for p in 0..PAGES {
        // SAFETY: inside the region.
        let b = unsafe { std::ptr::read_volatile(base.add(p * PAGE + 5)) };
        assert_eq!(b, data[p * PAGE + 5], "page {p} after the punch");
    }
    println!("READ-ALL {ahead} ahead");
}

#[test]
fn pages_punched_out_of_the_memfd_come_back_from_the_store() {
    if is_child() {
        return;
    }
    for d in DELIVERIES {
        let name = d.to_string();
        let out = run_child(
            "child_punch_cached_and_mapped_pages",
            &[("UFFD_DELIVERY", &name)],
        );
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("READ-ALL"),
            "{name}: every page read back after the punch (SIGBUS = {}, SIGALRM = {}); {}",
            libc::SIGBUS,
            libc::SIGALRM,
            describe(&out)
        );
    }
}

/// A page punched out of the memfd, then refreshed for a few bytes the
/// store changed behind the engine: the page comes back from the store
/// whole. The refresh wrote only those bytes into the hole before, which
/// made a page of zeros around them that the next fault mapped (4071 of
/// 4096 bytes wrong).
#[test]
fn a_refresh_of_a_punched_page_brings_the_whole_page_back() {
    let p = Pager::builder()
        .readahead(0, 1)
        .fault_around(0)
        .kswapd(false)
        .build()
        .unwrap();
    let data = pattern_vec(5, 4 * PAGE);
    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        ..MapOptions::default()
    };
    // SAFETY: the store changes behind the region only where refreshed.
    let mut r = unsafe { p.map_store(store.clone(), 4 * PAGE, &opts) }.unwrap();
    assert_eq!(r.as_slice()[10], data[10]);
    // SAFETY: advice on the region's own first page.
    let rc = unsafe { libc::madvise(r.as_ptr().cast(), PAGE, libc::MADV_REMOVE) };
    assert_eq!(rc, 0);
    uffd_pager::store::Store::write(&*store, 100, &[0xEE; 4]).unwrap();
    r.refresh(100, 4).unwrap();
    let mut want = data[..PAGE].to_vec();
    want[100..104].fill(0xEE);
    assert_bytes(
        &r.as_slice()[..PAGE],
        &want,
        "page 0 after the punch and the refresh",
    );
}
