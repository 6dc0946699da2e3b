//! A fault a handler thread is serving while the application unmaps its
//! range, and another pager maps a region there before the unmap's event
//! is applied.
//!
//! With handler threads the application's `munmap` returns once its event
//! is read, and the engine applies it only when the faults in flight have
//! left the gate. The kernel's fill ioctls (`UFFDIO_COPY`, `ZEROPAGE`,
//! `CONTINUE`) check only that the destination is registered with *some*
//! userfaultfd, not with the descriptor they are called on. So a fault past
//! its lookup installed its page into whatever registered mapping took the
//! range meanwhile: another pager's fresh region read the unmapped
//! region's bytes (0xAB here, where it holds zeros). Now an install from a
//! handler thread waits for a read in flight and backs off while an event
//! read is not yet applied; the fault restarts and finds no region.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::MemoryStore;
use uffd_pager::testing::{set_after_lookup, Site};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager};
use util::{perms_at, PAGE, THREADS};

/// The region whose fault the hook holds (0: none), whether it holds it,
/// and whether the test let it go.
static TARGET: AtomicUsize = AtomicUsize::new(0);
static HELD: AtomicBool = AtomicBool::new(false);
static GO: AtomicBool = AtomicBool::new(false);
/// The tests share the hook: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes the hook for one test: held until the guard drops.
fn take_the_hook() -> std::sync::MutexGuard<'static, ()> {
    let g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    HELD.store(false, SeqCst);
    GO.store(false, SeqCst);
    g
}

/// Holds the target region's fault, past its lookup, until the test lets
/// it go (at most 10 s), once. Async-signal-safe (atomics and sleeps): it
/// also runs for the other pager's in-thread faults.
fn until_let_go(site: &Site<'_>) {
    let a = TARGET.load(SeqCst);
    if a == 0 || site.start() != a || TARGET.swap(0, SeqCst) == 0 {
        return;
    }
    HELD.store(true, SeqCst);
    let t = Instant::now();
    while !GO.load(SeqCst) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what} never came");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Once the hook holds the fault: the application's own munmap of the
/// region's 4 pages at `base` (it returns once the other handler thread has
/// read the event, which waits to be applied until the held fault leaves
/// the gate), then `other` maps a region of zeros there, then the hook lets
/// the fault go. The range is held ([`uffd_pager::AddressHold`]) from the
/// munmap to the map. Under load the map failed with `Overlap` (and the
/// racing access, its pager dropped by the panic, then faulted on what was
/// there: SIGSEGV), 10 to 15 runs in 80: the pagers' threads were still
/// starting after `build()` returned, and Rust's std maps each thread's
/// signal stack as it starts, in the hole. The engine's threads are
/// running by the time `build()` returns now.
fn unmap_and_map_theirs(base: usize, other: &Pager) -> uffd_pager::Region {
    wait_for("the fault", || HELD.load(SeqCst));
    // SAFETY: the region's whole range, which the test gives up here.
    assert_eq!(unsafe { libc::munmap(base as *mut _, 4 * PAGE) }, 0);
    let _hold = uffd_pager::AddressHold::new(base, 4 * PAGE).unwrap();
    let fixed = MapOptions {
        kind: Some(InstallKind::Anonymous),
        fixed_addr: Some(base),
        ..MapOptions::default()
    };
    let theirs = other.map_anonymous_with(4 * PAGE, &fixed).unwrap();
    assert_eq!(theirs.as_ptr() as usize, base);
    GO.store(true, SeqCst);
    theirs
}

/// A pager with handler threads, and nothing of its own (readahead,
/// fault-around, kswapd) to touch the region beside the test's fault.
fn quiet_threads_pager() -> Pager {
    Pager::builder()
        .delivery(THREADS)
        .readahead(0, 1)
        .fault_around(0)
        .kswapd(false)
        .build()
        .unwrap()
}

#[test]
fn a_fault_in_flight_installs_nothing_into_another_pagers_region_mapped_there() {
    let _hook = take_the_hook();
    let pager = quiet_threads_pager();
    let other = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::from_bytes(&[0xAB; 4 * PAGE]).unwrap());
    let opts = MapOptions {
        kind: Some(InstallKind::Anonymous),
        ..MapOptions::default()
    };
    // SAFETY: only this region reads the store; nothing writes it.
    let region = unsafe { pager.map_store(store, 4 * PAGE, &opts) }.unwrap();
    let base = region.as_ptr() as usize;

    TARGET.store(base, SeqCst);
    set_after_lookup(Some(until_let_go));
    // A plain load of page 0 (a user-mode fault, so this runs as any user):
    // a handler thread serves it, and the hook holds it past its lookup.
    let reader = std::thread::spawn(move || {
        // SAFETY: `base` is mapped memory, the region's or, once the test
        // has moved on, the other pager's region at the same address.
        unsafe { std::ptr::read_volatile(base as *const u8) }
    });
    let theirs = unmap_and_map_theirs(base, &other);
    let seen = reader.join().unwrap();
    set_after_lookup(None);
    let there = theirs.as_slice()[0];
    assert_eq!(
        (seen, there),
        (0, 0),
        "the unmapped region's page went into the other pager's region (its \
         first byte reads {there:#x}, the racing load saw {seen:#x}): {}",
        pager.stats()
    );
    drop(theirs);
    drop(region);
}

#[test]
fn a_write_in_flight_to_a_protected_region_leaves_the_mapping_there_writable() {
    let _hook = take_the_hook();
    let pager = quiet_threads_pager();
    if pager.descriptor().user_mode_only {
        // (Not root: the write inside `read(2)` would be EFAULT at once,
        // with no fault to hold. CI runs this as root.)
        eprintln!("skipped: handler threads need a full descriptor");
        return;
    }
    let other = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let region = pager.map_anonymous(4 * PAGE).unwrap();
    let base = region.as_ptr() as usize;
    // Page 0 in place, then the region read-only with write protection: a
    // write to it is a write-protect fault, which makes the region
    // read-only for real (`mprotect` of its whole range).
    assert_eq!(region.as_slice()[0], 0);
    region.protect(false).unwrap();

    TARGET.store(base, SeqCst);
    set_after_lookup(Some(until_let_go));
    // A write into page 0 inside a system call (`read(2)` from a pipe):
    // a handler thread serves its fault, and the hook holds it.
    let writer = std::thread::spawn(move || {
        let mut fds = [0i32; 2];
        // SAFETY: pipe writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: one byte from our own buffer into our own pipe.
        assert_eq!(unsafe { libc::write(fds[1], [7u8].as_ptr().cast(), 1) }, 1);
        // SAFETY: `base` is writable memory or the call fails with EFAULT.
        let n = unsafe { libc::read(fds[0], base as *mut _, 1) };
        // SAFETY: closing our own descriptors.
        unsafe { libc::close(fds[0]) };
        // SAFETY: as above.
        unsafe { libc::close(fds[1]) };
        n
    });
    let theirs = unmap_and_map_theirs(base, &other);
    let _ = writer.join().unwrap();
    set_after_lookup(None);
    let perms = perms_at(base);
    assert!(
        perms.starts_with("rw"),
        "the other pager's region was made {perms} by the unmapped region's fault: {}",
        pager.stats()
    );
    drop(theirs);
    drop(region);
}
