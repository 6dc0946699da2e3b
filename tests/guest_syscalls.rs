//! System calls on region memory with in-thread delivery: the kernel does
//! not deliver a fault taken inside a syscall (EFAULT), so a buffer must be
//! resident for the whole call. `Region::lock_resident` keeps it so while
//! another thread holds the pager at its budget; `prefault` of a range
//! larger than the budget is refused.

#[path = "engine_util.rs"]
mod util;

use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Delivery, Error, InstallKind, MapOptions, Pager};
use util::*;

const BUDGET: u64 = 64;

/// A pager of `BUDGET` pages on a user-mode-only descriptor: a fault inside
/// a system call is `EFAULT` whatever the delivery.
fn user_mode_pager(d: Delivery) -> Pager {
    Pager::builder()
        .delivery(d)
        .budget_pages(BUDGET)
        .user_mode_only(true)
        .build()
        .unwrap()
}

#[test]
fn syscalls_on_guarded_buffers_never_fail_while_reclaim_runs() {
    for d in [Delivery::InThread, Delivery::PerRegion] {
        with_deadline(180, "guarded syscalls", move || {
            let p = user_mode_pager(d);
            let pages = 1024;
            let r = p.map_anonymous(pages * PAGE).unwrap();
            let base = r.as_ptr() as usize;
            let data = pattern_vec(41, 4 * PAGE);
            let f = TempFile::with_contents("guard", &data);
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(f.path())
                .unwrap();
            let stop = AtomicBool::new(false);
            let (mut efault, mut calls) = (0, 0);
            std::thread::scope(|sc| {
                // Keeps the pager at its budget: evictions all the time.
                sc.spawn(|| {
                    let mut k = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let a = base + (512 + k % 512) * PAGE;
                        // SAFETY: inside the region, a page no call uses.
                        unsafe { std::ptr::write_volatile(a as *mut u8, k as u8) };
                        k = k.wrapping_mul(7).wrapping_add(13);
                    }
                });
                for round in 0..600usize {
                    let off = (round % 120) * 4 * PAGE;
                    let g = r.lock_resident(off, 4 * PAGE).unwrap();
                    // read(2) into region memory (the kernel writes it).
                    file.rewind().unwrap();
                    // SAFETY: the guarded range, mapped and writable.
                    let buf = unsafe {
                        std::slice::from_raw_parts_mut((base + off) as *mut u8, 4 * PAGE)
                    };
                    calls += 1;
                    match file.read(buf) {
                        Ok(n) => assert_eq!(n, 4 * PAGE),
                        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => efault += 1,
                        Err(e) => panic!("read: {e}"),
                    }
                    // write(2) from region memory (the kernel reads it).
                    file.rewind().unwrap();
                    calls += 1;
                    match file.write(buf) {
                        Ok(n) => assert_eq!(n, 4 * PAGE),
                        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => efault += 1,
                        Err(e) => panic!("write: {e}"),
                    }
                    drop(g);
                }
                stop.store(true, Ordering::Relaxed);
            });
            assert_eq!(
                efault, 0,
                "{d}: {efault} of {calls} syscalls failed with EFAULT"
            );
            assert_bytes(
                &r.as_slice()[..4 * PAGE],
                &data,
                &format!("{d}: the read landed"),
            );
            let _ = file.as_raw_fd();
            assert!(
                p.stats().get(uffd_pager::Counter::PGSTEAL) > 1000,
                "{d}: {}",
                p.stats()
            );
        });
    }
}

#[test]
fn prefault_and_guards_larger_than_the_budget_are_refused() {
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(BUDGET)
        .build()
        .unwrap();
    let r = p.map_anonymous(1024 * PAGE).unwrap();
    let big = (BUDGET as usize + 1) * PAGE;
    assert!(matches!(r.prefault(0, big), Err(Error::OverBudget { .. })));
    assert!(matches!(
        r.lock_resident(0, big),
        Err(Error::OverBudget { .. })
    ));
    // Within the budget both work.
    r.prefault(0, 8 * PAGE).unwrap();
    let g = r.lock_resident(0, 8 * PAGE).unwrap();
    drop(g);
}

/// A prefault of the whole budget was taken, but reclaim begins at the
/// high watermark: its first pages were evicted before it returned, and
/// a system call on the buffer then got EFAULT (in-thread delivery; found
/// by review). A prefault is refused past the low watermark now, and one
/// at it leaves every page resident: touching them faults nothing.
#[test]
fn a_prefault_past_the_low_watermark_is_refused_and_one_at_it_stays() {
    const B: u64 = 64;
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(B)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let data = pattern_vec(5, 256 * PAGE);
    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let opts = MapOptions {
        writable: false,
        kind: Some(InstallKind::Shared),
        ..MapOptions::default()
    };
    // SAFETY: nothing writes the store.
    let r = unsafe { p.map_store(store, 256 * PAGE, &opts) }.unwrap();
    let (_, low) = uffd_pager::watermarks(B);
    assert!(
        matches!(
            r.prefault(0, B as usize * PAGE),
            Err(Error::OverBudget { .. })
        ),
        "a prefault of the whole budget"
    );
    r.prefault(0, low as usize * PAGE).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let before = p.stats().get(uffd_pager::Counter::PGFAULT);
    for pg in 0..low as usize {
        assert_eq!(r.as_slice()[pg * PAGE], data[pg * PAGE]);
    }
    let st = p.stats();
    assert_eq!(
        st.get(uffd_pager::Counter::PGFAULT),
        before,
        "pages of the prefault were evicted before it returned\n{st}"
    );
}

/// An anonymous region mapped read-only over a store whose pages were read
/// (so installed write-protected, see `Object::protects_clean`), then made
/// writable with `Region::protect`: `read(2)` into its resident pages
/// lands, with in-thread delivery too. `protect` lifts the write
/// protection; left there, the write-protect fault inside the call was
/// `EFAULT`, where before such pages were never protected.
#[test]
fn read_2_into_a_region_made_writable_by_protect_lands() {
    for d in [Delivery::InThread, Delivery::PerRegion] {
        let p = user_mode_pager(d);
        let pages = 8;
        let data = pattern_vec(43, pages * PAGE);
        let store = std::sync::Arc::new(uffd_pager::store::MemoryStore::from_bytes(&data).unwrap());
        let opts = uffd_pager::MapOptions {
            kind: Some(uffd_pager::InstallKind::Anonymous),
            writable: false,
            ..Default::default()
        };
        // SAFETY: the store changes only through the region.
        let r = unsafe { p.map_store(store, data.len(), &opts) }.unwrap();
        assert_bytes(r.as_slice(), &data, &format!("{d}: read"));
        r.protect(true).unwrap();
        let from = pattern_vec(44, pages * PAGE);
        let f = TempFile::with_contents("protect-read", &from);
        let mut file = std::fs::File::open(f.path()).unwrap();
        // (Resident: the budget holds them, and nothing else runs.)
        // SAFETY: the region's range, mapped and now writable.
        let buf = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), pages * PAGE) };
        match file.read(buf) {
            Ok(n) => assert_eq!(n, pages * PAGE, "{d}"),
            Err(e) => panic!("{d}: read(2) into the region: {e}"),
        }
        p.reclaim_pages(64);
        assert_bytes(r.as_slice(), &from, &format!("{d}: the read landed"));
    }
}

/// `read(2)` into an anonymous region made read-only with
/// `Region::protect(false)` fails with `EFAULT`, as into a read-only
/// mapping, in every delivery mode; made writable again, it lands. With
/// handler threads the call hung: the engine refused the write with a
/// SIGSEGV sent to the thread, which a thread inside the kernel does not
/// take while the program has a handler for it (Rust's runtime has one), so
/// the copy faulted again for ever.
#[test]
fn read_2_into_a_region_made_read_only_is_efault() {
    for d in DELIVERIES {
        with_deadline(30, "read(2) into a read-only region", move || {
            let p = Pager::builder()
                .delivery(d)
                .budget_pages(BUDGET)
                .build()
                .unwrap();
            let (r, want) = filled_region(&p, uffd_pager::InstallKind::Anonymous, 8, 45);
            r.protect(false).unwrap();
            let from = pattern_vec(46, 8 * PAGE);
            let f = TempFile::with_contents("read-only-read", &from);
            let mut file = std::fs::File::open(f.path()).unwrap();
            // SAFETY: the region's range; the kernel refuses the write.
            let buf = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), 8 * PAGE) };
            let e = file.read(buf).expect_err("read(2) into a read-only region");
            assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{d}: {e}");
            assert_bytes(r.as_slice(), &want, &format!("{d}: read-only"));
            r.protect(true).unwrap();
            let g = r.lock_resident(0, 8 * PAGE).unwrap();
            file.rewind().unwrap();
            // SAFETY: as above, writable now and kept resident by `g`.
            let buf = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), 8 * PAGE) };
            assert_eq!(file.read(buf).unwrap(), 8 * PAGE, "{d}");
            drop(g);
            assert_bytes(r.as_slice(), &from, &format!("{d}: writable again"));
        });
    }
}

/// A writable shared region of 4 pages over a memory store of its own.
fn shared_region(
    p: &Pager,
) -> (
    uffd_pager::Region,
    std::sync::Arc<uffd_pager::store::MemoryStore>,
) {
    let store = std::sync::Arc::new(uffd_pager::store::MemoryStore::new(4 * PAGE as u64).unwrap());
    let opts = uffd_pager::MapOptions {
        kind: Some(uffd_pager::InstallKind::Shared),
        ..uffd_pager::MapOptions::default()
    };
    // SAFETY: only this region changes the store.
    let r = unsafe { p.map_store(store.clone(), 4 * PAGE, &opts) }.unwrap();
    (r, store)
}

/// A flush while a residency guard holds a buffer of a shared region: the
/// write-back protected the guarded page again for its dirty tracking, and
/// the next `read(2)` into it failed with `EFAULT` (in-thread delivery
/// does not serve a fault inside a system call), where the guard promises
/// the call succeeds. The page is written back and stays dirty instead.
#[test]
fn a_flush_leaves_a_guarded_buffer_writable_for_system_calls() {
    let p = Pager::builder().build().unwrap();
    let (r, store) = shared_region(&p);
    let g = r.lock_resident(0, PAGE).unwrap();
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: two bytes from a local.
    assert_eq!(unsafe { libc::write(fds[1], b"xy".as_ptr().cast(), 2) }, 2);
    // SAFETY: the guarded, resident first page of the region.
    assert_eq!(unsafe { libc::read(fds[0], r.as_ptr().cast(), 1) }, 1);
    r.flush().unwrap();
    assert_eq!(store.snapshot()[0], b'x', "the flush wrote the page");
    // SAFETY: as above.
    let n = unsafe { libc::read(fds[0], r.as_ptr().add(1).cast(), 1) };
    let e = errno();
    drop(g);
    // SAFETY: closing our own descriptors.
    unsafe { libc::close(fds[0]) };
    // SAFETY: as above.
    unsafe { libc::close(fds[1]) };
    assert_eq!(
        n, 1,
        "read(2) into the guarded buffer after a flush: errno {e}"
    );
    // Still dirty: the second byte reaches the store too.
    r.flush().unwrap();
    assert_eq!(&store.snapshot()[..2], b"xy");
}

/// Whether the kernel holds the page at `addr` `mlock`ed: the `lo` flag of
/// its mapping in `/proc/self/smaps`.
fn mlocked(addr: usize) -> bool {
    let flags = smaps_field(addr, "VmFlags");
    let flags = flags.unwrap_or_else(|| panic!("no mapping holds {addr:#x}"));
    flags.split_whitespace().any(|f| f == "lo")
}

/// Two overlapping residency guards: dropping one leaves the other's
/// pages `mlock`ed (the kernel does not count locks: the first guard's
/// `munlock` of its whole range unlocked the pages the second still
/// guards), and dropping the last unlocks every page.
#[test]
fn a_guard_dropped_leaves_an_overlapping_guards_pages_locked() {
    let p = Pager::builder().budget_pages(64).build().unwrap();
    let r = p.map_anonymous(8 * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let a = r.lock_resident(0, 4 * PAGE).unwrap();
    let b = r.lock_resident(2 * PAGE, 4 * PAGE).unwrap();
    if !(a.mlocked() && b.mlocked()) {
        eprintln!("skipped: the kernel refused mlock (RLIMIT_MEMLOCK)");
        return;
    }
    drop(a);
    for pg in 2..6 {
        assert!(
            mlocked(base + pg * PAGE),
            "page {pg}, still guarded, was unlocked"
        );
    }
    assert!(!mlocked(base), "page 0, no longer guarded, stayed locked");
    drop(b);
    for pg in 0..8 {
        assert!(!mlocked(base + pg * PAGE), "page {pg} stayed locked");
    }
}

/// A guarded region the application moves with its own `mremap`, and
/// another region mapped and guarded where it was: dropping the first
/// guard leaves the second region's pages locked (it unlocked the
/// addresses it had locked, which were the second region's by then).
#[test]
fn a_moved_regions_guard_leaves_what_is_mapped_where_it_was_locked() {
    let p = Pager::builder().budget_pages(64).build().unwrap();
    // (Fixed ranges out of the kernel's way: a concurrent test's mapping
    // could take the range the move frees.)
    let at = |addr| uffd_pager::MapOptions {
        fixed_addr: Some(addr),
        ..uffd_pager::MapOptions::default()
    };
    let was = free_range(4 * PAGE);
    let first = p.map_anonymous_with(4 * PAGE, &at(was)).unwrap();
    let g1 = first.lock_resident(0, 4 * PAGE).unwrap();
    if !g1.mlocked() {
        eprintln!("skipped: the kernel refused mlock (RLIMIT_MEMLOCK)");
        return;
    }
    app_mremap(was, 4 * PAGE, 4 * PAGE, free_range(4 * PAGE));
    let second = p.map_anonymous_with(4 * PAGE, &at(was)).unwrap();
    let g2 = second.lock_resident(0, 4 * PAGE).unwrap();
    assert!(g2.mlocked());
    drop(g1);
    for pg in 0..4 {
        assert!(
            mlocked(was + pg * PAGE),
            "page {pg} of the region mapped where the first was got unlocked"
        );
    }
    drop(g2);
    assert!(!mlocked(was));
    drop(second);
    drop(first);
}

/// A writable shared region whose first page the application unmapped
/// itself: a guard on the rest still faults its pages in for a write, so a
/// `read(2)` into the guarded buffer succeeds. The region's flags were
/// looked up at its first address, found nothing there, and the pages
/// were faulted in for read, write-protected: the `read(2)` failed with
/// `EFAULT` (in-thread delivery does not serve a fault in a system call).
#[test]
fn a_guard_after_the_regions_first_page_went_makes_it_writable() {
    let p = Pager::builder().build().unwrap();
    let (r, store) = shared_region(&p);
    // SAFETY: the application unmaps the region's first page itself.
    assert_eq!(unsafe { libc::munmap(r.as_ptr().cast(), PAGE) }, 0);
    let g = r.lock_resident(PAGE, PAGE).unwrap();
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: two bytes from a local.
    assert_eq!(unsafe { libc::write(fds[1], b"xy".as_ptr().cast(), 2) }, 2);
    // SAFETY: the guarded, resident second page of the region.
    let n = unsafe { libc::read(fds[0], r.as_ptr().add(PAGE).cast(), 2) };
    let e = errno();
    drop(g);
    // SAFETY: closing our own descriptors.
    unsafe { libc::close(fds[0]) };
    // SAFETY: as above.
    unsafe { libc::close(fds[1]) };
    assert_eq!(n, 2, "read(2) into the guarded buffer: errno {e}");
    r.flush().unwrap();
    assert_eq!(&store.snapshot()[PAGE..PAGE + 2], b"xy");
}

/// `Region::lock_resident_owned`: a guard that borrows neither the region
/// nor the pager (an interposer takes it under its table's lock and holds
/// it across a call that may block). A read(2) into the guarded range
/// succeeds on a user-mode-only descriptor, and the guard outlives its
/// region and its pager: dropped last, it gives its pages back and lets
/// the pager's threads stop, without a hang.
#[test]
fn an_owned_guard_serves_a_syscall_and_outlives_its_region_and_pager() {
    with_deadline(60, "an owned guard", || {
        let p = user_mode_pager(Delivery::InThread);
        let r = p.map_anonymous(16 * PAGE).unwrap();
        let g = r.lock_resident_owned(4 * PAGE, 2 * PAGE, true).unwrap();
        let mut file = std::fs::File::open("/proc/self/exe").unwrap();
        // SAFETY: the guarded range, mapped, writable and resident.
        let buf = unsafe {
            std::slice::from_raw_parts_mut((r.as_ptr() as usize + 4 * PAGE) as *mut u8, 2 * PAGE)
        };
        assert_eq!(file.read(buf).unwrap(), 2 * PAGE);
        assert_eq!(&r.as_slice()[4 * PAGE..4 * PAGE + 4], b"\x7fELF");
        // A page beside the guard is still absent: read(2) into it fails.
        // SAFETY: region memory, mapped; the kernel refuses the write.
        let n = unsafe { libc::read(file.as_raw_fd(), r.as_ptr().cast(), PAGE) };
        assert_eq!((n, errno()), (-1, libc::EFAULT), "an unguarded page");
        drop(r);
        drop(p);
        drop(g);
    });
}
