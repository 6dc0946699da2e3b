//! A fault that looks again at a page the engine installed, while the
//! application unmaps the range under it (handler threads).
//!
//! A shared page whose PTE the kernel or the application dropped
//! (DAMON's pageout, `MADV_DONTNEED`) is mapped again with
//! `UFFDIO_CONTINUE` on the next fault (`recheck_installed`). With handler
//! threads the application's `munmap` returns once its event is read,
//! before the engine applies it, and a fault already past its lookup then
//! meets a range with no mapping: `UFFDIO_CONTINUE` answers `ENOENT`. That
//! was taken for "the memfd page was punched" (which is `EFAULT`), and the
//! page was discarded: the application's write in it, dirty and not yet
//! written back, was lost (the store kept its old byte). Now the fault
//! restarts once the event is applied, and the unmap writes the page back.
//!
//! An anonymous page the application moves with its own `mremap` leaves
//! the old address before the engine hears of it: a fault there found no
//! page and took it for one the application dropped (uncharged, off the
//! LRU, while it lived on at the new address). It now restarts while an
//! event is on its way.

#[path = "engine_util.rs"]
mod util;

#[path = "held_reader.rs"]
mod held;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::MemoryStore;
use uffd_pager::testing::{set_after_lookup, Site};
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager};
use util::{errno, PAGE, THREADS};

/// The region whose fault the hook holds (0: none), and whether it did.
static TARGET: AtomicUsize = AtomicUsize::new(0);
static HELD: AtomicBool = AtomicBool::new(false);

/// Holds the target region's fault, past its lookup, until the kernel has
/// unmapped the range (`mincore` fails), once.
fn until_the_range_is_unmapped(site: &Site<'_>) {
    let a = TARGET.load(SeqCst);
    if a == 0 || site.start() != a || TARGET.swap(0, SeqCst) == 0 {
        return;
    }
    HELD.store(true, SeqCst);
    let t = Instant::now();
    let mut v = 0u8;
    // SAFETY: mincore writes one byte to `v`; the address is only queried.
    while unsafe { libc::mincore(a as *mut _, PAGE, &mut v) } == 0
        && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_dirty_page_survives_a_fault_that_meets_the_applications_munmap() {
    let pager = Pager::builder()
        .delivery(THREADS)
        .readahead(0, 1)
        .fault_around(0)
        .kswapd(false)
        .build()
        .unwrap();
    if pager.descriptor().user_mode_only {
        // (Not root: the read inside `write(2)` would be EFAULT at once,
        // with no fault to hold. CI runs this as root.)
        eprintln!("skipped: handler threads need a full descriptor");
        return;
    }
    let store = Arc::new(MemoryStore::new(4 * PAGE as u64).unwrap());
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        ..MapOptions::default()
    };
    // SAFETY: only this region changes the store.
    let region = unsafe { pager.map_store(store.clone(), 4 * PAGE, &opts) }.unwrap();
    let base = region.as_ptr() as usize;
    // The application's write: page 0 dirty. Then its PTE goes behind the
    // engine's back (a shared region's `MADV_DONTNEED` raises no event).
    // SAFETY: the region's own memory.
    unsafe { std::ptr::write_volatile(base as *mut u8, 0xAB) };
    // SAFETY: advice on the region's own first page.
    assert_eq!(
        unsafe { libc::madvise(base as *mut _, PAGE, libc::MADV_DONTNEED) },
        0
    );

    TARGET.store(base, SeqCst);
    set_after_lookup(Some(until_the_range_is_unmapped));
    // A read of page 0 inside a system call: its fault is served by a
    // handler thread, and once the range is gone it is EFAULT, not SIGSEGV.
    let reader = std::thread::spawn(move || {
        let mut fds = [0i32; 2];
        // SAFETY: pipe writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: `base` is readable memory or the call fails with EFAULT.
        let n = unsafe { libc::write(fds[1], base as *const _, 1) };
        let e = errno();
        // SAFETY: closing our own descriptors.
        unsafe { libc::close(fds[0]) };
        // SAFETY: as above.
        unsafe { libc::close(fds[1]) };
        (n, e)
    });
    let t = Instant::now();
    while !HELD.load(SeqCst) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the fault never came"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // The application's own munmap: it returns once the event is read.
    // SAFETY: the region's whole range, which the test gives up here.
    assert_eq!(unsafe { libc::munmap(base as *mut _, 4 * PAGE) }, 0);
    let (n, e) = reader.join().unwrap();
    set_after_lookup(None);
    // The page, or EFAULT: as a read racing a munmap on a plain mapping.
    assert!(
        n == 1 || e == libc::EFAULT,
        "write(2) from the region: {n}, errno {e}"
    );

    drop(region);
    pager.flush_unmapped().unwrap();
    assert_eq!(
        store.snapshot()[0],
        0xAB,
        "the application's write was lost: {}",
        pager.stats()
    );
    assert_eq!(pager.stats().get(Counter::PAGE_DROPPED), 0);
}

/// In-thread delivery, its event reader held: the application moves an
/// anonymous region's one (written, installed) page with
/// `MREMAP_DONTUNMAP`, which keeps the old range registered, and the
/// engine faults at the old address (a `prefault` of the region, which the
/// engine still lists there) before it has read the event.
#[test]
fn a_page_moved_by_the_application_is_not_taken_for_dropped() {
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(0, 1)
        .fault_around(0)
        .kswapd(false)
        .budget_pages(64)
        .build()
        .unwrap();
    let region = pager.map_anonymous(PAGE).unwrap();
    let old = region.as_ptr() as usize;
    // SAFETY: the region's own page.
    unsafe { std::ptr::write_bytes(old as *mut u8, 7, PAGE) };
    assert_eq!(pager.stats().resident_pages, 1);
    // Where the application moves it: a reservation of the test's own.
    let to = util::reserve(PAGE);
    let _held = held::hold(held::thread_named("uffd-events"));
    let mover = std::thread::spawn(move || {
        // SAFETY: the region's page moves onto the test's reservation;
        // the old range stays mapped (DONTUNMAP).
        unsafe {
            libc::mremap(
                old as *mut libc::c_void,
                PAGE,
                PAGE,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP,
                to as *mut libc::c_void,
            ) as usize
        }
    });
    // The kernel moves the page before it posts the event.
    held::wait_for("the move", || {
        let mut v = 0u8;
        // SAFETY: mincore writes one byte to `v`.
        unsafe { libc::mincore(to as *mut _, PAGE, &mut v) == 0 && v & 1 == 1 }
    });
    let r = &region;
    std::thread::scope(|s| {
        // Restarts until the event is applied, then finds no region at the
        // old address (the result does not matter).
        let prefault = s.spawn(move || r.prefault(0, PAGE));
        std::thread::sleep(Duration::from_millis(200));
        held::HOLD.store(false, SeqCst);
        let _ = prefault.join().unwrap();
    });
    assert_eq!(mover.join().unwrap(), to, "mremap");
    let s = pager.stats();
    assert_eq!(s.get(Counter::PAGE_DROPPED), 0, "taken for dropped\n{s}");
    assert_eq!(s.resident_pages, 1, "the moved page is counted\n{s}");
    // SAFETY: the page the application moved there.
    assert_eq!(unsafe { std::ptr::read_volatile((to + 5) as *const u8) }, 7);
    // SAFETY: the old range, which DONTUNMAP left to the application.
    assert_eq!(unsafe { libc::munmap(old as *mut _, PAGE) }, 0);
}
