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

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::MemoryStore;
use uffd_pager::testing::{set_after_lookup, Site};
use uffd_pager::{Counter, InstallKind, MapOptions, Pager};
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
