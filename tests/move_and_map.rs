//! Two threads of the application at once: one moves a region with its own
//! `mremap`, another maps a new region, and the kernel gives the new region
//! the moved one's old range before the engine has applied the move's
//! event. The window is held open on purpose (`testing::set_before_map`).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};
use uffd_pager::testing::set_before_map;
use uffd_pager::Counter;
use util::*;

/// The move the hook starts: the region's old start and where it goes.
static FROM: AtomicUsize = AtomicUsize::new(0);
static TO: AtomicUsize = AtomicUsize::new(0);
/// Set by the hook: the mover thread may move now.
static GO: AtomicBool = AtomicBool::new(false);

/// The map hook: lets the mover go, waits until the kernel has freed the
/// old range (the mover's `mremap` then waits for its event to be read),
/// and hints that range to the map, which the kernel then gives it.
fn move_then_map_there(_len: usize) -> usize {
    let from = FROM.swap(0, SeqCst);
    if from == 0 {
        return 0;
    }
    GO.store(true, SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    while mapped(from) {
        assert!(Instant::now() < deadline, "the move did not happen");
        std::thread::yield_now();
    }
    from
}

/// The moved region keeps every page at its new address, evicted ones
/// included, and the new region at the old address is a region of its own.
/// Before, the map took the region for unmapped (its range was free) and
/// dropped it with its evicted pages; the move's event then found no region
/// to move, and the first access to an evicted page at the new address
/// was SIGSEGV (handler threads) or SIGBUS (in-thread delivery).
#[test]
fn a_region_moved_while_another_thread_maps_keeps_its_pages() {
    if let Ok(k) = std::env::var("MOVE_MAP_DELIVERY") {
        let d = DELIVERIES[k.parse::<usize>().unwrap()];
        // SAFETY: alarm has no preconditions: a hang ends the child.
        unsafe { libc::alarm(30) };
        let p = uffd_pager::Pager::builder()
            .delivery(d)
            .budget_pages(16)
            .build()
            .unwrap();
        let pages = 64;
        let (r, want) = filled_region(&p, uffd_pager::InstallKind::Anonymous, pages, 41);
        let len = pages * PAGE;
        p.reclaim_pages(64);
        let from = r.as_ptr() as usize;
        let to = free_range(len);
        let mover = std::thread::spawn(move || {
            while !GO.load(SeqCst) {
                std::thread::yield_now();
            }
            app_mremap(from, len, len, to);
        });
        TO.store(to, SeqCst);
        FROM.store(from, SeqCst);
        set_before_map(Some(move_then_map_there));
        let mut n = p.map_anonymous(len).unwrap();
        set_before_map(None);
        mover.join().unwrap();
        assert_eq!(
            n.as_ptr() as usize,
            from,
            "{d}: the kernel gave another range"
        );
        assert!(p.stats().get(Counter::MAP_WAITED_EVENT) >= 1, "{d}");
        // SAFETY: the moved region's memory, `len` bytes at `to`.
        let moved = unsafe { std::slice::from_raw_parts(to as *const u8, len) };
        assert_bytes(moved, &want, &format!("{d}: the moved region"));
        n.as_mut_slice().fill(7);
        p.reclaim_pages(64);
        assert_bytes(moved, &want, &format!("{d}: the moved region, again"));
        assert!(n.as_slice().iter().all(|&b| b == 7), "{d}: the new region");
        println!("{d}: ok");
        std::process::exit(0);
    }
    if is_child() {
        return;
    }
    for k in 0..DELIVERIES.len() {
        let out = run_child(
            "a_region_moved_while_another_thread_maps_keeps_its_pages",
            &[("MOVE_MAP_DELIVERY", &k.to_string())],
        );
        assert!(out.status.success(), "{}", describe(&out));
    }
}
