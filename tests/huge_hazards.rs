//! What an application does behind the engine's back to 2 MiB pages, and
//! a pool that runs dry: a page it dropped with its own `MADV_DONTNEED`
//! is not brought back from an old swap copy, a page it punched with
//! `MADV_REMOVE` is written back without a fault in the engine's thread,
//! and an access with no page to be had gets SIGBUS in every delivery
//! (before, a handler thread woke the faulting thread into the same fault
//! for ever).
//!
//! The tests reserve the huge pages they need as root and give them back
//! ([`huge_util::HugePool`]); a child that dies leaves the pool to its
//! parent's guard.

#[path = "engine_util.rs"]
mod util;

#[path = "huge_util.rs"]
mod huge_util;

use huge_util::HugePool;
use std::sync::Arc;
use uffd_pager::store::{MemoryStore, Store};
use uffd_pager::{Counter, Delivery, InstallKind, Pager, HUGE_PAGE_SIZE};
use util::*;

const HUGE: usize = HUGE_PAGE_SIZE;
/// The budget's 4 KiB units in one huge page.
const UNITS: u64 = (HUGE / PAGE) as u64;
const MARKER: &str = "CHILD-REACHED-THE-ACCESS";

fn delivery_named(name: &str) -> Delivery {
    match name {
        "threads" => THREADS,
        "per-region" => Delivery::PerRegion,
        _ => Delivery::InThread,
    }
}

/// Reclaims until nothing of the pager is resident (kswapd may hold a page
/// it is writing back while `reclaim_pages` passes it by), or 10 s.
fn reclaim_all(pager: &Pager, units: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        pager.reclaim_pages(units);
        if pager.stats().resident_pages == 0 || std::time::Instant::now() > deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A 2 MiB anonymous page read back from swap is installed clean (its swap
/// copy still holds it). If the application then drops it with its own
/// `madvise(MADV_DONTNEED)`, it reads as zeros, as on the kernel's hugetlb,
/// also after reclaim has passed over it. Before, reclaim took the clean
/// page for one still mapped and left its swap copy as its contents: the
/// read after returned the old bytes.
#[test]
fn a_huge_page_the_application_dropped_is_not_its_old_swap_copy() {
    let _pool = HugePool::take(4);
    for d in [Delivery::InThread, THREADS] {
        let pager = huge_pager(d, 2);
        let mut region = pager
            .map_anonymous_with(2 * HUGE, &huge_opts(InstallKind::Anonymous))
            .expect("map a huge anonymous region");
        region.as_mut_slice()[..HUGE].fill(7);
        reclaim_all(&pager, 4 * UNITS);
        assert!(
            pager.stats().get(Counter::WRITEBACK) >= 1,
            "{d}: page 0 written to swap\n{}",
            pager.stats()
        );
        // Read back from swap: installed clean, write-protected.
        assert_eq!(region.as_slice()[HUGE / 2], 7, "{d}: read back from swap");
        // SAFETY: the range is the region's first (whole) page; the
        // application may drop its own memory.
        let rc = unsafe { libc::madvise(region.as_ptr().cast(), HUGE, libc::MADV_DONTNEED) };
        assert_eq!(rc, 0, "{d}: madvise: {}", errno());
        reclaim_all(&pager, 4 * UNITS);
        let s = region.as_slice();
        assert!(
            s[..HUGE].iter().all(|&b| b == 0),
            "{d}: a dropped page read {} (its old swap copy) at byte 0, not 0",
            s[0]
        );
        assert!(s[HUGE..].iter().all(|&b| b == 0), "{d}: page 1");
    }
}

/// Child of the test below: maps a 2 MiB anonymous region with the delivery
/// named in `UFFD_DELIVERY`, empties the pool, and touches the region.
#[test]
fn child_touch_a_huge_page_with_the_pool_empty() {
    if !is_child() {
        return;
    }
    let d = delivery_named(&std::env::var("UFFD_DELIVERY").unwrap_or_default());
    let pool = HugePool::take(2);
    let pager = huge_pager(d, 2);
    let region = pager
        .map_anonymous_with(2 * HUGE, &huge_opts(InstallKind::Anonymous))
        .expect("map a huge anonymous region");
    // The parent's guard puts the pool back: this process dies below.
    std::mem::forget(pool.drain());
    std::mem::forget(pool);
    // A delivery that never answers would keep this thread in the fault:
    // SIGALRM ends it instead, which the parent reports.
    // SAFETY: alarm has no preconditions.
    unsafe { libc::alarm(20) };
    eprintln!("{MARKER}");
    // SAFETY: the region is mapped and readable; a volatile read so the
    // access is made.
    let b = unsafe { std::ptr::read_volatile(region.as_ptr()) };
    eprintln!("read {b} with no page in the pool");
}

/// With the pool empty, an access to a huge page that is not there gets
/// SIGBUS, as with the kernel's own hugetlb, whichever thread serves the
/// fault. Before, handler threads (`threads`, `per-region`) only woke the
/// faulting thread, which faulted again at once, for ever.
#[test]
fn an_access_with_no_huge_page_to_be_had_gets_sigbus_in_every_delivery() {
    if is_child() {
        return;
    }
    let _pool = HugePool::take(2);
    for d in ["in-thread", "threads", "per-region"] {
        let out = run_child(
            "child_touch_a_huge_page_with_the_pool_empty",
            &[("UFFD_DELIVERY", d)],
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(MARKER),
            "{d}: the child died before its access; {}",
            describe(&out)
        );
        assert_eq!(
            exit_signal(&out),
            Some(libc::SIGBUS),
            "{d}: expected SIGBUS (SIGALRM = {}: the access never ended); {}",
            libc::SIGALRM,
            describe(&out)
        );
    }
}

/// Child of the test below: writes a shared 2 MiB page, punches it out of
/// the memfd through its mapping (`MADV_REMOVE`), empties the pool, and
/// writes the region back (`UFFD_HOW=flush`) or reclaims it (`reclaim`).
/// Prints the store's first byte of that page after.
#[test]
fn child_write_back_a_punched_huge_page_with_the_pool_empty() {
    if !is_child() {
        return;
    }
    let pool = HugePool::take(4);
    let pager = Pager::builder().budget_pages(4 * UNITS).build().unwrap();
    let store = Arc::new(MemoryStore::from_bytes(&vec![3u8; 2 * HUGE]).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region = unsafe {
        pager.map_store(
            store.clone() as Arc<dyn Store>,
            2 * HUGE,
            &huge_opts(InstallKind::Shared),
        )
    }
    .expect("map a huge shared region");
    region.as_mut_slice()[..HUGE].fill(5);
    region.as_mut_slice()[HUGE] = 6;
    // SAFETY: the region's first page; the application may punch its own
    // shared memory.
    let rc = unsafe { libc::madvise(region.as_ptr().cast(), HUGE, libc::MADV_REMOVE) };
    assert_eq!(rc, 0, "madvise(MADV_REMOVE): {}", errno());
    std::mem::forget(pool.drain());
    std::mem::forget(pool);
    eprintln!("{MARKER}");
    match std::env::var("UFFD_HOW").as_deref() {
        Ok("reclaim") => reclaim_all(&pager, 8 * UNITS),
        _ => region.flush().expect("flush"),
    }
    let mut b = [0u8; 2];
    store.read(0, &mut b[..1]).unwrap();
    store.read(HUGE as u64, &mut b[1..]).unwrap();
    println!("STORE {} {}", b[0], b[1]);
}

/// A dirty shared 2 MiB page the application punched out of the memfd
/// (`MADV_REMOVE` through its mapping) is a hole; with the pool empty,
/// loading from it to write it back was SIGBUS in the engine's own thread,
/// which killed the process. Now the hole's contents (zeros, what the
/// kernel's punched file range holds) are written, by `flush` and by
/// reclaim alike, and the other page keeps its write.
#[test]
fn a_punched_huge_page_is_written_back_without_a_fault_in_the_engine() {
    if is_child() {
        return;
    }
    let _pool = HugePool::take(4);
    for how in ["flush", "reclaim"] {
        let out = run_child(
            "child_write_back_a_punched_huge_page_with_the_pool_empty",
            &[("UFFD_HOW", how)],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("STORE 0 6"),
            "{how}: expected the punched page written as zeros and the other \
             kept; {}",
            describe(&out)
        );
    }
}

/// An unmapped object of 2 MiB pages is not kept: its pages are the
/// hugetlb pool's, which only budget pressure would have given back. A
/// live region then found the pool empty (its prefault failed with EIO,
/// an access got SIGBUS), and mapping the same store again was refused
/// (`NoHugePages`, though it needed no new page).
#[test]
fn an_unmapped_object_of_2_mib_pages_gives_its_pages_back() {
    const HUGE: usize = HUGE_PAGE_SIZE;
    let _pool = HugePool::take(4);
    let p = in_thread_huge_pager(Pager::builder().keep_unmapped(16));
    let want = pattern_vec(22, 2 * HUGE);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&want).unwrap());
    let shared = huge_opts(InstallKind::Shared);
    {
        // SAFETY: nothing else changes the store.
        let a = unsafe { p.map_store(store.clone(), want.len(), &shared) }.unwrap();
        assert_bytes(a.as_slice(), &want, "first map");
    }
    // The same store again, all of the pool free for it.
    {
        // SAFETY: as above.
        let again = unsafe { p.map_store(store.clone(), want.len(), &shared) }
            .expect("mapping the same store again");
        assert_bytes(again.as_slice(), &want, "second map");
    }
    // A live region that needs the whole pool.
    let b = p
        .map_anonymous_with(4 * HUGE, &huge_opts(InstallKind::Anonymous))
        .unwrap();
    b.prefault(0, 4 * HUGE)
        .expect("prefault while an unmapped object held the pool");
}

/// `b` as an in-thread pager with a budget of sixteen 2 MiB pages and no
/// readahead.
fn in_thread_huge_pager(b: uffd_pager::PagerBuilder) -> Pager {
    b.delivery(Delivery::InThread)
        .budget_pages(16 * (HUGE_PAGE_SIZE / PAGE) as u64)
        .readahead(0, 1)
        .build()
        .unwrap()
}

/// A child `fork()`ed while a shared region of 2 MiB pages was mapped
/// inherits the object's memfd and its alias mapping: when the parent
/// unmapped the region, the pages stayed the child's, out of the pool,
/// until the child exited (found by review). The object's drop punches
/// its memfd now, which frees them whoever holds it.
#[test]
fn a_forked_child_does_not_keep_the_pages_of_an_unmapped_region() {
    const HUGE: usize = HUGE_PAGE_SIZE;
    let _pool = HugePool::take(4);
    let p = in_thread_huge_pager(Pager::builder());
    let free_before = huge_util::available();
    let want = pattern_vec(23, 2 * HUGE);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&want).unwrap());
    // SAFETY: nothing else changes the store.
    let r = unsafe { p.map_store(store, want.len(), &huge_opts(InstallKind::Shared)) }.unwrap();
    assert_bytes(r.as_slice(), &want, "before the fork");
    assert!(huge_util::available() < free_before);
    // SAFETY: the child only waits to be killed (pause, async-signal-safe).
    let child = unsafe { libc::fork() };
    if child == 0 {
        loop {
            // SAFETY: as above.
            unsafe { libc::pause() };
        }
    }
    assert!(child > 0);
    drop(r);
    let free_after = huge_util::available();
    // SAFETY: our own child, reaped here.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    assert_eq!(free_after, free_before, "the child kept the pages");
}

/// Where the held region starts and ends, and the handshake with the hook.
#[cfg(feature = "fault-inject")]
mod hold {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    pub static START: AtomicUsize = AtomicUsize::new(0);
    pub static END: AtomicUsize = AtomicUsize::new(0);
    pub static HELD: AtomicBool = AtomicBool::new(false);
    pub static GO: AtomicBool = AtomicBool::new(false);

    /// Holds the one handler thread on a fault in `[START, END)` until
    /// `GO`: the messages behind it (the application's `mremap`) wait
    /// unread meanwhile.
    pub fn hook(addr: usize, _tid: u32) {
        if (START.load(SeqCst)..END.load(SeqCst)).contains(&addr) {
            HELD.store(true, SeqCst);
            while !GO.load(SeqCst) {
                std::thread::yield_now();
            }
        }
    }
}

/// The application moves a region of 2 MiB pages with its own `mremap`,
/// and maps memory of its own where it was, while reclaim evicts its clean
/// page: the kernel has moved the page, the engine has not read the event
/// yet. Reclaim looked at the old address, found no page there and took
/// the page for one the application dropped:
/// uncharged, off the LRU, its swap copy forgotten, while it stayed mapped
/// at the new address (found by review). It now asks whether an event is
/// on its way first, as the zap does, and leaves the page for later.
#[cfg(feature = "fault-inject")]
#[test]
fn a_clean_huge_page_moved_by_the_application_is_not_taken_for_dropped() {
    use std::sync::atomic::Ordering::SeqCst;
    let _pool = HugePool::take(6);
    let pager = Pager::builder()
        .delivery(Delivery::Threads {
            threads: 1,
            spin_us: 0,
        })
        .budget_pages(4 * UNITS)
        .readahead(0, 1)
        .build()
        .unwrap();
    let a = pager
        .map_anonymous_with(HUGE, &huge_opts(InstallKind::Anonymous))
        .expect("map a huge anonymous region");
    let b = pager
        .map_anonymous_with(HUGE, &huge_opts(InstallKind::Anonymous))
        .unwrap();
    let old = a.as_ptr() as usize;
    // SAFETY: the region's own page; no slice of it is alive.
    unsafe { std::ptr::write_bytes(a.as_ptr(), 7, HUGE) };
    reclaim_all(&pager, 4 * UNITS);
    assert!(
        pager.stats().get(Counter::WRITEBACK) >= 1,
        "written to swap"
    );
    // Read back from swap: installed clean, write-protected.
    // SAFETY: inside the region.
    assert_eq!(
        unsafe { std::ptr::read_volatile((old + 99) as *const u8) },
        7
    );
    assert_eq!(pager.stats().resident_pages, UNITS);
    // Where the application moves it: a free, aligned 2 MiB.
    // SAFETY: a fresh reservation of the test's own.
    let room = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * HUGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    let to = room.next_multiple_of(HUGE);
    hold::START.store(b.as_ptr() as usize, SeqCst);
    hold::END.store(b.as_ptr() as usize + HUGE, SeqCst);
    uffd_pager::testing::set_before_message(Some(hold::hook));
    let bp = b.as_ptr() as usize;
    // The handler is let go on an unwind too: a failed assertion below
    // waited for ever on it otherwise (the pager's drop joins it).
    struct Go;
    impl Drop for Go {
        fn drop(&mut self) {
            hold::GO.store(true, SeqCst);
        }
    }
    let go = Go;
    // SAFETY: inside region `b`: its fault holds the handler.
    let reader = std::thread::spawn(move || unsafe { std::ptr::read_volatile(bp as *const u8) });
    let t = std::time::Instant::now();
    while !hold::HELD.load(SeqCst) {
        assert!(t.elapsed().as_secs() < 10, "the handler was never held");
        std::thread::yield_now();
    }
    let mover = std::thread::spawn(move || app_mremap(old, HUGE, HUGE, to));
    // The kernel moves the page before it posts the event (a fixed sleep
    // here was not always long enough for the mover to run).
    let t = std::time::Instant::now();
    while {
        let mut v = 0u8;
        // SAFETY: mincore only reads the page tables.
        unsafe { libc::mincore(old as *mut libc::c_void, PAGE, &mut v) == 0 }
    } {
        assert!(
            t.elapsed().as_secs() < 10,
            "the application's mremap never moved the page"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // And maps memory of its own where the region was (the engine has not
    // heard of the move yet).
    // SAFETY: the range the application's mremap left free.
    let mine = unsafe {
        libc::mmap(
            old as *mut libc::c_void,
            HUGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    } as usize;
    assert_eq!(mine, old, "mmap: {}", errno());
    for _ in 0..3 {
        pager.reclaim_pages(4 * UNITS);
    }
    drop(go);
    assert_eq!(reader.join().unwrap(), 0);
    mover.join().unwrap();
    uffd_pager::testing::set_before_message(None);
    // SAFETY: the page the application moved there.
    assert_eq!(unsafe { std::ptr::read_volatile((to + 5) as *const u8) }, 7);
    assert_eq!(
        pager.stats().resident_pages,
        2 * UNITS,
        "the moved page and `b`'s are mapped and counted\n{}",
        pager.stats()
    );
    // Written, evicted and read back: its new bytes.
    // SAFETY: the moved page, the application's to write.
    unsafe { std::ptr::write_bytes(to as *mut u8, 9, HUGE) };
    reclaim_all(&pager, 4 * UNITS);
    // SAFETY: as above.
    assert_eq!(
        unsafe { std::ptr::read_volatile((to + HUGE - 1) as *const u8) },
        9
    );
    // SAFETY: the reservation's rest (the region's piece is the pager's).
    unsafe {
        libc::munmap(room as *mut libc::c_void, to - room);
        libc::munmap(
            (to + HUGE) as *mut libc::c_void,
            room + 2 * HUGE - to - HUGE,
        );
    }
    // SAFETY: the application's own mapping.
    unsafe { libc::munmap(mine as *mut libc::c_void, HUGE) };
    drop(a);
    drop(b);
}

#[path = "gated_store.rs"]
mod gated;

/// Reclaim writing a dirty 2 MiB anonymous page to swap while the
/// application unmaps its region and another pager maps a writable
/// shared region there: the event is read but not yet applied (reclaim
/// holds the region's lock), and the write-back's end, which finds the
/// page gone, lifted the write protection it had put on the range
/// without asking whether the range was still the region's. The kernel
/// checks only that some descriptor registered it for write protection:
/// the other pager's pages, installed write-protected to track their
/// writes, became writable behind it, and a write to them was never
/// written back (found by review). Now the protection goes on and off
/// only while no event is read and not applied, as every fill.
#[test]
fn a_huge_page_written_back_across_an_unmap_leaves_the_next_mapping_protected() {
    let _pool = HugePool::take(1);
    let swap = Arc::new(gated::Gated::new(vec![0; HUGE], gated::Held::Writes));
    let to = swap.clone();
    // SAFETY: the swap store is this pager's alone.
    let pager = unsafe {
        Pager::builder()
            .delivery(THREADS)
            .budget_pages(4 * UNITS)
            .kswapd(false)
            .readahead(0, 1)
            .fault_around(0)
            .swap_to(move |_| Ok(to.clone() as Arc<dyn Store>))
    }
    .build()
    .unwrap();
    let other = Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let mut r = pager
        .map_anonymous_with(HUGE, &huge_opts(InstallKind::Anonymous))
        .unwrap();
    r.as_mut_slice().fill(0x5a);
    let base = r.as_ptr() as usize;
    std::mem::forget(r);
    std::thread::scope(|s| {
        let reclaim = s.spawn(|| pager.reclaim_pages(UNITS));
        swap.until_a_call_waits(|| reclaim.is_finished());
        // SAFETY: the region's range, which the test gives up here (the
        // region itself is forgotten, never dropped).
        assert_eq!(unsafe { libc::munmap(base as *mut _, HUGE) }, 0);
        let store = Arc::new(MemoryStore::new(HUGE as u64).unwrap());
        let theirs = {
            let _hold = uffd_pager::AddressHold::new(base, HUGE).unwrap();
            let opts = uffd_pager::MapOptions {
                writable: true,
                fixed_addr: Some(base),
                ..uffd_pager::MapOptions::default()
            };
            // SAFETY: the store changes only through this region.
            unsafe { other.map_store(store.clone() as Arc<dyn Store>, HUGE, &opts) }.unwrap()
        };
        assert_eq!(theirs.as_ptr() as usize, base);
        // Every page read, so installed write-protected (clean).
        assert!(theirs.as_slice().iter().all(|&b| b == 0));
        swap.open_after(std::time::Duration::ZERO);
        reclaim.join().unwrap();
        // SAFETY: the other region's mapping, alive; a plain store, as the
        // application's.
        unsafe { std::ptr::write_volatile((base + 3 * PAGE) as *mut u8, 7) };
        theirs.flush().unwrap();
        let mut b = [0u8; 1];
        store.read((3 * PAGE) as u64, &mut b).unwrap();
        assert_eq!(b[0], 7, "a write to the other region was not written back");
        drop(theirs);
    });
}
