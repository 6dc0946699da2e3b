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

/// The delivery a child of test `name` runs with (`var` set, a timer
/// armed), or `None`: in the parent, which first runs one child per
/// delivery and asserts that each passed, or in another test's child.
fn child_delivery(name: &str, var: &str) -> Option<uffd_pager::Delivery> {
    if let Ok(k) = std::env::var(var) {
        // SAFETY: alarm has no preconditions: a hang ends the child.
        unsafe { libc::alarm(30) };
        return Some(DELIVERIES[k.parse::<usize>().unwrap()]);
    }
    if !is_child() {
        for k in 0..DELIVERIES.len() {
            let out = run_child(name, &[(var, &k.to_string())]);
            assert!(out.status.success(), "{}", describe(&out));
        }
    }
    None
}

/// The moved region keeps every page at its new address, evicted ones
/// included, and the new region at the old address is a region of its own.
/// Before, the map took the region for unmapped (its range was free) and
/// dropped it with its evicted pages; the move's event then found no region
/// to move, and the first access to an evicted page at the new address
/// was SIGSEGV (handler threads) or SIGBUS (in-thread delivery).
#[test]
fn a_region_moved_while_another_thread_maps_keeps_its_pages() {
    let name = "a_region_moved_while_another_thread_maps_keeps_its_pages";
    if let Some(d) = child_delivery(name, "MOVE_MAP_DELIVERY") {
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
}

/// The second hook's move (A from `FROM2` to `TO2`), and the unmap of the
/// moved region at its destination after it.
static FROM2: AtomicUsize = AtomicUsize::new(0);
static TO2: AtomicUsize = AtomicUsize::new(0);

/// The map hook of the test below: the application moves A to `TO2` and
/// unmaps it there (each call waits for its event to be read, and the
/// event, read, for the global lock the map holds), and the map is hinted
/// `TO2`, which the kernel has freed.
fn move_unmap_then_map_there(_len: usize) -> usize {
    let (from, to) = (FROM2.swap(0, SeqCst), TO2.load(SeqCst));
    if from == 0 {
        return 0;
    }
    let len = LEN2.load(SeqCst);
    std::thread::spawn(move || app_mremap(from, len, len, to));
    let deadline = Instant::now() + Duration::from_secs(5);
    while mapped(from) || !mapped(to) {
        assert!(Instant::now() < deadline, "the move did not happen");
        std::thread::yield_now();
    }
    std::thread::spawn(move || {
        // SAFETY: the application unmaps the region it moved there.
        unsafe { libc::munmap(to as *mut libc::c_void, len) };
    });
    while mapped(to) {
        assert!(Instant::now() < deadline, "the unmap did not happen");
        std::thread::yield_now();
    }
    to
}

static LEN2: AtomicUsize = AtomicUsize::new(0);

/// The application moves region A to Q and unmaps it there while another
/// thread maps a new region X, which the kernel places at Q before the
/// move's event is applied: X stays a whole region of its own. Before,
/// the map saw nothing of the engine's at Q (the table still had A at its
/// old range) and went ahead; the move, applied next, took X for a region
/// the move had replaced and cut it, so X had no pieces and its first
/// access was SIGBUS (in-thread delivery) or SIGSEGV (handler threads).
/// Found by review.
#[test]
fn a_region_mapped_where_a_move_lands_and_is_unmapped_stays_whole() {
    let name = "a_region_mapped_where_a_move_lands_and_is_unmapped_stays_whole";
    if let Some(d) = child_delivery(name, "MOVE_UNMAP_MAP_DELIVERY") {
        let p = uffd_pager::Pager::builder().delivery(d).build().unwrap();
        let len = 16 * PAGE;
        let a = p.map_anonymous(len).unwrap();
        // SAFETY: inside A.
        unsafe { std::ptr::write_volatile(a.as_ptr(), 1u8) };
        LEN2.store(len, SeqCst);
        TO2.store(free_range(len), SeqCst);
        FROM2.store(a.as_ptr() as usize, SeqCst);
        set_before_map(Some(move_unmap_then_map_there));
        let opts = uffd_pager::MapOptions {
            kind: Some(uffd_pager::InstallKind::Shared),
            ..uffd_pager::MapOptions::default()
        };
        let mut x = p.map_anonymous_with(len, &opts).unwrap();
        set_before_map(None);
        let at = x.as_ptr() as usize;
        assert_eq!(
            x.mapped(),
            vec![at..at + len],
            "{d}: the new region was cut"
        );
        x.as_mut_slice().fill(9);
        assert!(x.as_slice().iter().all(|&b| b == 9), "{d}");
        drop(x);
        std::mem::forget(a);
        println!("{d}: ok");
        std::process::exit(0);
    }
}
