//! Arguments at the edges of the public API: each gets its typed error or
//! is taken within bounds, never a panic or a silently changed page.
//! (A failed re-registration after a move needs `fault-inject`.)

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{Store, StoreError};
use uffd_pager::{Delivery, Error, InstallKind, MapOptions, Pager};
use util::*;

/// Serialises this binary's tests that remap: the fault-inject switches
/// (`fail_next_remap`, `fail_next_reregister`) are process-wide, and one
/// test's switch taken by another's remap left that region inaccessible
/// (`PROT_NONE`): its next read was SIGSEGV, now and then, with the tests
/// run in parallel.
fn remaps() -> std::sync::MutexGuard<'static, ()> {
    static REMAPS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    REMAPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// `madvise` refuses an unaligned start (`EINVAL`); rounding it down would
/// zero bytes of an anonymous region the caller did not name.
#[test]
fn dontneed_at_an_unaligned_offset_is_refused_and_drops_nothing() {
    let p = pager(Delivery::InThread);
    let mut r = p.map_anonymous(2 * PAGE).unwrap();
    r.as_mut_slice().fill(0xab);
    let e = r.dontneed(100, 10);
    assert!(
        matches!(e, Err(Error::Unaligned { what: "offset", .. })),
        "{e:?}"
    );
    assert!(
        r.as_slice().iter().all(|&b| b == 0xab),
        "bytes were dropped"
    );
    // An aligned call still works, and rounds its end up.
    r.dontneed(0, 10).unwrap();
    assert!(r.as_slice()[..PAGE].iter().all(|&b| b == 0));
    assert!(r.as_slice()[PAGE..].iter().all(|&b| b == 0xab));
}

/// A cluster beyond any region is capped; it used to overflow the growth
/// bound (and `clamp` panicked on the first sequential fault).
#[test]
fn a_huge_fault_around_setting_is_capped() {
    for d in DELIVERIES {
        let p = Pager::builder()
            .delivery(d)
            .fault_around(usize::MAX)
            .build()
            .unwrap();
        let pages = 64;
        let data = pattern_vec(7, pages * PAGE);
        let store = Arc::new(uffd_pager::store::MemoryStore::from_bytes(&data).unwrap());
        let opts = MapOptions {
            kind: Some(InstallKind::Shared),
            writable: false,
            ..MapOptions::default()
        };
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let r = unsafe { p.map_store(store, pages * PAGE, &opts) }.unwrap();
        assert_bytes(r.as_slice(), &data, &format!("{d}"));
    }
}

/// "Reclaim everything" as `u64::MAX` pages (`uffd_pager_reclaim(p,
/// UINT64_MAX)` from C): the scan bound `nr * 16 + 1024` overflowed, a
/// panic in a debug build (`-EFAULT` from C) and a bound of 1008 pages in
/// a release one, which freed nothing of a region whose pages were all
/// recently referenced.
#[test]
fn reclaiming_u64_max_pages_frees_every_resident_page() {
    let pages = 4096;
    for nr in [u64::MAX, 1 << 60] {
        let p = Pager::builder()
            .budget_pages(2 * pages as u64)
            .kswapd(false)
            .build()
            .unwrap();
        let mut r = p.map_anonymous(pages * PAGE).unwrap();
        r.as_mut_slice().fill(1);
        assert_eq!(p.stats().resident_pages, pages as u64);
        assert_eq!(p.reclaim_pages(nr), pages as u64, "reclaim_pages({nr})");
        assert_eq!(p.stats().resident_pages, 0);
    }
}

/// `reclaim_pages(u64::MAX)` beside a page it cannot free (held by a
/// residency guard, here the calling thread's own) frees the rest and
/// returns: its scan bound came from `nr` alone, and the guarded page went
/// back to the tail each time, so the call rotated it for ever (found by
/// review).
#[test]
fn reclaiming_u64_max_pages_beside_a_guarded_page_returns() {
    let p = Pager::builder()
        .budget_pages(128)
        .kswapd(false)
        .build()
        .unwrap();
    let mut r = p.map_anonymous(64 * PAGE).unwrap();
    r.as_mut_slice().fill(1);
    let guard = r.lock_resident(0, PAGE).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = tx.send(p.reclaim_pages(u64::MAX));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        // (Let a spinning call go, so the scope can end.)
        drop(guard);
        assert_eq!(got, Ok(63), "reclaim_pages(u64::MAX) beside a guarded page");
    });
}

/// A readahead window below 4 pages: the window's growth clamped to
/// `[4, max]`, which panicked on the first sequential fault.
#[test]
fn a_readahead_window_below_four_pages_is_taken() {
    let pages = 64;
    let data = pattern_vec(9, pages * PAGE);
    let file = TempFile::with_contents("small-readahead", &data);
    for max in [1, 2, 3] {
        for d in DELIVERIES {
            let p = Pager::builder()
                .delivery(d)
                .readahead(max, 1)
                .build()
                .unwrap();
            let opts = MapOptions {
                writable: false,
                ..MapOptions::default()
            };
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let r = unsafe { p.map_file(file.path(), None, &opts) }.unwrap();
            assert_bytes(r.as_slice(), &data, &format!("max {max}, {d}"));
        }
    }
}

/// A store whose length is not a page multiple (the `Store` contract asks
/// for one; nothing enforces it): the region covers its whole pages.
struct Ragged;

impl Store for Ragged {
    fn len(&self) -> u64 {
        PAGE as u64 + 904
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        buf.fill(5);
        Ok(())
    }
    fn write(&self, _offset: u64, _data: &[u8]) -> Result<(), StoreError> {
        Err(StoreError(libc::EROFS))
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "ragged"
    }
}

/// `refresh` past the end of such a store stays within the object's pages
/// (it indexed one page too far and panicked).
#[test]
fn refresh_of_a_store_with_a_partial_last_page_stays_in_range() {
    let p = pager(Delivery::InThread);
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut r = unsafe { p.map_store(Arc::new(Ragged), PAGE, &opts) }.unwrap();
    assert_eq!(r.as_slice()[0], 5);
    r.refresh(0, u64::MAX).unwrap();
    assert_eq!(r.as_slice()[PAGE - 1], 5);
}

/// A fixed address whose range wraps past the end of the address space is
/// a typed error (the sum overflowed: a panic with overflow checks on).
#[test]
fn a_fixed_range_past_the_end_of_the_address_space_is_refused() {
    let _one = remaps();
    let p = pager(Delivery::InThread);
    let opts = MapOptions {
        fixed_addr: Some(usize::MAX & !(PAGE - 1)),
        ..MapOptions::default()
    };
    let e = p.map_anonymous_with(2 * PAGE, &opts);
    assert!(matches!(e, Err(Error::Config(_))), "{e:?}");
    let mut r = p.map_anonymous(PAGE).unwrap();
    let e = r.remap_to(2 * PAGE, Some(usize::MAX & !(PAGE - 1)));
    assert!(e.is_err(), "{e:?}");
    r.as_mut_slice()[0] = 1;
}

/// `mincore` on one page: whether anything is mapped at `addr`.
fn mapped(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore only reads the page tables; `v` has room for one page.
    unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut v) == 0 }
}

/// The kernel moved the mapping but registering the new range failed
/// (`UFFDIO_REGISTER` at `vm.max_map_count`): the region follows the move,
/// its memory is inaccessible, and unmapping it still works. It used to
/// keep its old address, where nothing of it was mapped any more.
#[cfg(feature = "fault-inject")]
#[test]
fn a_failed_registration_after_a_move_leaves_the_region_where_it_went() {
    let _one = remaps();
    let p = pager(Delivery::InThread);
    // At an address the kernel does not hand out on its own: another test
    // of this binary mapping at the same time could be given the old range
    // once it is free.
    let opts = uffd_pager::MapOptions {
        fixed_addr: Some(free_range(4 * PAGE)),
        ..Default::default()
    };
    let mut r = p.map_anonymous_with(4 * PAGE, &opts).unwrap();
    r.as_mut_slice().fill(3);
    let old = r.as_ptr() as usize;
    let to = free_range(4 * PAGE);
    uffd_pager::testing::fail_next_reregister();
    let e = r.remap_to(4 * PAGE, Some(to));
    assert!(matches!(e, Err(Error::Sys { .. })), "{e:?}");
    assert_eq!(r.as_ptr() as usize, to, "the region follows the move");
    assert!(!mapped(old), "the old range is gone");
    assert!(mapped(to), "the new range is mapped");
    r.unmap().unwrap();
    assert!(!mapped(to), "unmap removed the new range");
    // The pager is still usable.
    let mut r = p.map_anonymous(PAGE).unwrap();
    r.as_mut_slice()[0] = 9;
    assert_eq!(r.as_slice()[0], 9);
}

/// A shrink whose `mremap` fails leaves the region as it was, the pages
/// it would have cut off too. They were given up before the call, so an
/// anonymous region's tail read as zeros after the error said nothing
/// had changed.
#[cfg(feature = "fault-inject")]
#[test]
fn a_shrink_the_kernel_refuses_keeps_the_tail() {
    let _one = remaps();
    for reclaimed in [false, true] {
        let p = Pager::builder().budget_pages(64).build().unwrap();
        let mut r = p.map_anonymous(8 * PAGE).unwrap();
        for pg in 0..8 {
            r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE].fill(pg as u8 + 1);
        }
        if reclaimed {
            // The tail's pages in swap, not mapped.
            assert_eq!(p.reclaim_pages(64), 8);
        }
        uffd_pager::testing::fail_next_remap();
        let e = r.remap(4 * PAGE);
        assert!(matches!(e, Err(Error::Sys { .. })), "{e:?}");
        assert_eq!(r.len(), 8 * PAGE);
        for pg in 0..8 {
            assert_eq!(
                r.as_slice()[pg * PAGE + 7],
                pg as u8 + 1,
                "page {pg} (reclaimed first: {reclaimed})"
            );
        }
    }
}

/// An anonymous region of 8 pages, page `n` filled with `n + 1`, that the
/// kernel holds as several mappings (page 1's fork flag differs), and its
/// start: a move of it the kernel refuses.
fn split_region(p: &uffd_pager::Pager) -> (uffd_pager::Region, usize) {
    let mut r = p.map_anonymous(8 * PAGE).unwrap();
    for pg in 0..8 {
        r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE].fill(pg as u8 + 1);
    }
    let start = r.as_ptr() as usize;
    // SAFETY: region memory, its flags only (the engine mapped it
    // MADV_DONTFORK; one page of it is not now, so the kernel splits it).
    assert_eq!(
        unsafe { libc::madvise((start + PAGE) as *mut libc::c_void, PAGE, libc::MADV_DOFORK) },
        0
    );
    (r, start)
}

/// A shrinking move the kernel refuses (the region spans more than one
/// kernel mapping: the application split it with its own `madvise`). This
/// kernel refuses it before it touches anything, and the region stays as
/// it was; kernels that unmapped the tail first (then refused) leave it
/// shrunk where it was, and the region follows that. Either way the
/// region's view matches the kernel's and its data is intact.
#[test]
fn a_refused_shrinking_move_leaves_the_region_as_the_kernel_left_it() {
    let _one = remaps();
    let p = pager(Delivery::InThread);
    let (mut r, start) = split_region(&p);
    let to = free_range(4 * PAGE);
    let e = r.remap_to(4 * PAGE, Some(to));
    assert!(matches!(e, Err(Error::Sys { .. })), "{e:?}");
    let len = r.len();
    assert!(len == 8 * PAGE || len == 4 * PAGE, "{len}");
    assert_eq!(r.as_ptr() as usize, start);
    assert_eq!(r.mapped(), vec![start..start + len]);
    for pg in 0..len / PAGE {
        assert_eq!(r.as_slice()[pg * PAGE + 3], pg as u8 + 1, "page {pg}");
    }
    r.unmap().unwrap();
}

/// The program's own memory at `to` (`pages` pages, each byte `0x5a`),
/// mapped where a `remap_over` is to replace it.
fn program_memory(to: usize, pages: usize) {
    // SAFETY: `to` is a free range (`free_range`); the test owns it now.
    let p = unsafe {
        libc::mmap(
            to as *mut libc::c_void,
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(p as usize, to, "program mapping");
    // SAFETY: just mapped, readable and writable.
    unsafe { std::ptr::write_bytes(to as *mut u8, 0x5a, pages * PAGE) };
}

/// Whether the program's memory at `to` is still there, its bytes intact.
fn program_memory_intact(to: usize, pages: usize) -> bool {
    (0..pages).all(|pg| {
        // SAFETY: read only once `mapped` said the page is mapped; the
        // program mapped it readable.
        mapped(to + pg * PAGE) && unsafe { *((to + pg * PAGE + 5) as *const u8) } == 0x5a
    })
}

/// A move with `remap_over` (`mremap(MREMAP_FIXED)` over a range the
/// program reserved) that the kernel refuses before it touches the target
/// (here the region spans two kernel mappings, which this kernel refuses
/// before it unmaps anything) leaves the program's memory there as it
/// was, as the kernel's own refused `mremap` does. The engine used to
/// replace the target with its own reservation first and drop that
/// reservation on the error: a hole where the program's memory had been.
#[test]
fn a_refused_move_over_program_memory_leaves_that_memory() {
    let _one = remaps();
    let p = pager(Delivery::InThread);
    let (mut r, start) = split_region(&p);
    let to = free_range(4 * PAGE);
    program_memory(to, 4);
    // A shrinking move: this kernel moves a range of several mappings
    // only at its own length.
    // SAFETY: `to` is this test's own memory, to be replaced by the move.
    let e = unsafe { r.remap_over(4 * PAGE, to) };
    assert!(matches!(e, Err(Error::Sys { .. })), "{e:?}");
    assert_eq!(r.as_ptr() as usize, start);
    assert!(
        program_memory_intact(to, 4),
        "the refused move left a hole where the program's memory was"
    );
    for pg in 0..r.len() / PAGE {
        assert_eq!(r.as_slice()[pg * PAGE + 3], pg as u8 + 1, "page {pg}");
    }
    r.unmap().unwrap();
    // SAFETY: the test's own mapping.
    unsafe { libc::munmap(to as *mut libc::c_void, 4 * PAGE) };
}

/// As above, for an `mremap` that fails the way one at `vm.max_map_count`
/// does (the kernel checks the map count before it unmaps the target).
#[cfg(feature = "fault-inject")]
#[test]
fn a_failed_move_over_program_memory_leaves_that_memory() {
    let _one = remaps();
    let p = pager(Delivery::InThread);
    let mut r = p.map_anonymous(4 * PAGE).unwrap();
    r.as_mut_slice().fill(3);
    let to = free_range(4 * PAGE);
    program_memory(to, 4);
    uffd_pager::testing::fail_next_remap();
    // SAFETY: `to` is this test's own memory, to be replaced by the move.
    let e = unsafe { r.remap_over(4 * PAGE, to) };
    assert!(matches!(e, Err(Error::Sys { .. })), "{e:?}");
    assert!(
        program_memory_intact(to, 4),
        "the failed move left a hole where the program's memory was"
    );
    assert!(r.as_slice().iter().all(|&b| b == 3));
    r.unmap().unwrap();
    // SAFETY: the test's own mapping.
    unsafe { libc::munmap(to as *mut libc::c_void, 4 * PAGE) };
}

/// A move with `remap_over` onto a range an `AddressHold` keeps is an
/// overlap, as onto a region: replaced by the move, the hold's drop
/// unmapped the moved region.
#[test]
fn a_move_over_a_held_range_is_an_overlap() {
    let _one = remaps();
    let p = pager(Delivery::InThread);
    let mut r = p.map_anonymous(4 * PAGE).unwrap();
    r.as_mut_slice().fill(7);
    let to = free_range(4 * PAGE);
    let hold = uffd_pager::AddressHold::new(to, 4 * PAGE).unwrap();
    // SAFETY: nothing of the program's is at `to` (a hold only).
    let e = unsafe { r.remap_over(4 * PAGE, to) };
    assert!(matches!(e, Err(Error::Overlap { .. })), "{e:?}");
    drop(hold);
    // SAFETY: as above; the range is free now.
    unsafe { r.remap_over(4 * PAGE, to) }.unwrap();
    assert_eq!(r.as_ptr() as usize, to);
    assert!(r.as_slice().iter().all(|&b| b == 7));
    r.unmap().unwrap();
}

/// A map at the range of an `AddressHold` that is refused after it took
/// the hold over (here for its options: `kernel_maps` with `writable`)
/// leaves the hold as it was, as its docs say: the hold's range was
/// unmapped, so the caller's later map there could find it taken, and the
/// hold's drop unmapped nothing (found by review).
#[test]
fn a_refused_map_leaves_the_address_hold_as_it_was() {
    fn mapped(addr: usize) -> bool {
        let mut v = 0u8;
        // SAFETY: mincore only reads the page tables (ENOMEM: not mapped).
        unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut v) == 0 }
    }
    let p = pager(Delivery::InThread);
    let at = free_range(4 * PAGE);
    let hold = uffd_pager::AddressHold::new(at, 4 * PAGE).unwrap();
    let store: Arc<dyn Store> =
        Arc::new(uffd_pager::store::MemoryStore::from_bytes(&[5u8; 4 * PAGE]).unwrap());
    let refused = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: true,
        kernel_maps: true,
        fixed_addr: Some(at),
        ..MapOptions::default()
    };
    // SAFETY: nothing else changes the store.
    let e = unsafe { p.map_store(store.clone(), 4 * PAGE, &refused) };
    assert!(matches!(e, Err(Error::Config(_))), "{e:?}");
    assert!(mapped(at), "the refused map unmapped the held range");
    let ok = MapOptions {
        writable: false,
        kernel_maps: false,
        ..refused
    };
    // SAFETY: as above.
    let r = unsafe { p.map_store(store, 4 * PAGE, &ok) }.unwrap();
    assert_eq!(r.as_ptr() as usize, at);
    drop(hold);
    assert!(
        r.as_slice().iter().all(|&b| b == 5),
        "taken over: the hold's drop left it"
    );
}

/// `Footprint::of` with page counts whose state words overflow the
/// address space: an error, never an arithmetic panic (debug builds) or a
/// figure computed from a wrapped size (release builds).
#[test]
fn a_footprint_past_the_address_space_is_an_error() {
    for pages in [1usize << 62, (1 << 62) + 1000, usize::MAX / 2, usize::MAX] {
        assert!(
            uffd_pager::Footprint::of(pages, 0).is_err(),
            "{pages} pages"
        );
    }
    assert!(uffd_pager::Footprint::of(1 << 20, 0).is_ok());
}

/// A region whose remap could not register its new range (`ENOMEM`) is
/// unmapped there by the application, which posts no event (the range is
/// not registered), so the table still lists it. Another region of the
/// same descriptor then grows in place over that range and takes it for
/// unmapped: no record of an event to come may be kept for it, since none
/// will. Before, one was, and it swallowed the application's next unmap of
/// the grown region, which stayed listed over memory the kernel had freed
/// (found by review).
#[cfg(feature = "fault-inject")]
#[test]
fn a_region_grown_over_an_unregistered_one_goes_at_the_applications_unmap() {
    let _one = remaps();
    let p = pager(Delivery::InThread);
    let len = 4 * PAGE;
    let base = free_range(8 * len);
    let at = |a| MapOptions {
        fixed_addr: Some(a),
        ..MapOptions::default()
    };
    // (Made twice as long, then shrunk: a region grows only within its
    // store.)
    let mut r = p.map_anonymous_with(2 * len, &at(base)).unwrap();
    r.remap(len).unwrap();
    let mut s = p.map_anonymous_with(len, &at(base + 4 * len)).unwrap();
    uffd_pager::testing::fail_next_reregister();
    assert!(s.remap_to(len, Some(base + len)).is_err());
    // SAFETY: the application unmaps the region's memory itself.
    assert_eq!(unsafe { libc::munmap((base + len) as *mut _, len) }, 0);
    r.remap(2 * len).unwrap();
    assert_eq!(r.as_ptr() as usize, base, "not grown in place");
    r.as_mut_slice().fill(5);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::munmap(base as *mut _, 2 * len) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !r.mapped().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the unmapped region is still listed: {:x?}",
            r.mapped()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop((r, s));
}

/// `map_anonymous_with` with `writable: false` is refused with a typed
/// error: it was taken as writable, silently (found by review).
#[test]
fn a_read_only_anonymous_map_is_refused_not_made_writable() {
    let p = Pager::builder().build().unwrap();
    let opts = MapOptions {
        writable: false,
        ..MapOptions::default()
    };
    match p.map_anonymous_with(4 * PAGE, &opts) {
        Err(Error::Config(msg)) => assert!(msg.contains("writable"), "{msg}"),
        other => panic!("map_anonymous_with(writable: false): {other:?}"),
    }
}

/// A budget under four pages is refused: one access may need four pages
/// resident at once, and under a budget of one page a load across a page
/// boundary (kswapd off) never completed: each page's fault evicted the
/// other, and the access ran again and faulted again, for ever (found by
/// review). At four pages, a `movsq` from a word across one boundary to a
/// word across another, with the budget full of older pages, completes.
#[test]
fn a_budget_under_four_pages_is_refused_and_four_serve_any_access() {
    for b in 1..4 {
        match Pager::builder().budget_pages(b).build() {
            Err(Error::Config(m)) => assert!(m.contains("budget"), "{m}"),
            r => panic!("a budget of {b} pages: {:?}", r.map(|_| ())),
        }
    }
    with_deadline(60, "a four-page access under a budget of four", || {
        let p = Pager::builder()
            .budget_pages(4)
            .kswapd(false)
            .readahead(0, 1)
            .fault_around(0)
            .build()
            .unwrap();
        let r = p.map_anonymous(8 * PAGE).unwrap();
        let base = r.as_ptr() as usize;
        for pg in [2, 3, 6, 7] {
            // SAFETY: inside the region.
            unsafe { std::ptr::write_volatile((base + pg * PAGE) as *mut u8, 1) };
        }
        let (src, dst) = (base + PAGE - 4, base + 5 * PAGE - 4);
        // SAFETY: inside the region.
        unsafe { std::ptr::write_unaligned(src as *mut u64, 0x1122_3344_5566_7788) };
        // SAFETY: both words are inside the region; movsq reads 8 bytes at
        // rsi and writes 8 at rdi (the direction flag is clear, per the
        // ABI) and changes nothing else.
        unsafe {
            std::arch::asm!(
                "movsq",
                inout("rsi") src => _,
                inout("rdi") dst => _,
                options(nostack, preserves_flags)
            )
        };
        // SAFETY: inside the region.
        let got = unsafe { std::ptr::read_unaligned(dst as *const u64) };
        assert_eq!(got, 0x1122_3344_5566_7788);
        assert!(p.stats().resident_pages <= 4, "{}", p.stats());
    });
}
