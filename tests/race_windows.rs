//! Windows in which a shared page's bytes could go wrong, each held open
//! on purpose: a write to a clean page while a remap gives the range its
//! protection back, a `refresh` that meets a page whose store read is
//! still in flight, a remap that cannot protect the range again while
//! an eviction writes one of its pages back, a 2 MiB anonymous page the
//! application drops while its eviction writes it to swap, and an
//! application `munmap` while reclaim writes a batch of dirty pages.

#[path = "engine_util.rs"]
mod util;

#[path = "huge_util.rs"]
mod huge_util;

#[path = "gated_store.rs"]
mod gated;

use gated::{Gated, Held};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{MemoryStore, Store};
use uffd_pager::testing::{fail_next_reprotect, set_after_reprotect, Site};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager};
use util::*;

/// An in-thread pager that maps and reads one page per fault (no
/// readahead, no fault-around), so each test's page is on its own.
fn one_page_at_a_time() -> Pager {
    Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap()
}

/// Held by the tests that set the process-wide remap hooks
/// (`set_after_reprotect`, `fail_next_reprotect`): the other's remap,
/// run meanwhile, took them.
static REMAP_HOOKS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Where [`write_from_another_thread`] writes (offset into the region + 1;
/// 0: nothing to do), and whether its write has landed.
static WRITE_OFF: AtomicUsize = AtomicUsize::new(0);
static WROTE: AtomicBool = AtomicBool::new(false);

/// The remap hook: another thread writes one byte of the region while the
/// remap still holds its locks; the hook gives it 300 ms to land (at once
/// where the page is writable without a fault; a fault waits for the
/// remap to finish).
fn write_from_another_thread(site: &Site<'_>) {
    let off = WRITE_OFF.swap(0, SeqCst);
    if off == 0 {
        return;
    }
    let addr = site.start() + off - 1;
    std::thread::spawn(move || {
        // SAFETY: inside the region, which the test keeps mapped until this
        // write has landed (it waits for `WROTE`).
        unsafe { std::ptr::write_volatile(addr as *mut u8, 0xab) };
        WROTE.store(true, SeqCst);
    });
    let t = Instant::now();
    while !WROTE.load(SeqCst) && t.elapsed() < Duration::from_millis(300) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A remap unregisters the range (which clears the write protection of the
/// clean pages) and registers it again. It gave the range its protection
/// back before it protected the clean pages again, and a write in between
/// (another thread's) found a page writable without a fault: the page
/// stayed clean, so `flush` skipped it and the byte never reached the
/// store.
#[test]
fn a_write_while_a_remap_restores_access_is_written_back() {
    let _hooks = REMAP_HOOKS.lock().unwrap_or_else(|e| e.into_inner());
    let p = one_page_at_a_time();
    let data = pattern_vec(61, 32 * PAGE);
    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut r = unsafe { p.map_store(store.clone(), 16 * PAGE, &opts) }.unwrap();
    // Every page mapped clean.
    assert_bytes(r.as_slice(), &data[..16 * PAGE], "before the remap");
    let off = 3 * PAGE + 5;
    WRITE_OFF.store(off + 1, SeqCst);
    set_after_reprotect(Some(write_from_another_thread));
    let remapped = r.remap(24 * PAGE);
    set_after_reprotect(None);
    remapped.unwrap();
    let t = Instant::now();
    while !WROTE.load(SeqCst) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the write never landed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(r.as_slice()[off], 0xab);
    r.flush().unwrap();
    assert_eq!(
        store.snapshot()[off],
        0xab,
        "a write made while the remap gave access back was not written back"
    );
}

/// `refresh` skipped a page whose read was in flight (locked, not yet up
/// to date) as if nothing held it: the read, which took the bytes before
/// the change, then made the page up to date with the old ones, and the
/// region showed them after the refresh. It now waits for the read and
/// refreshes the page after it.
#[test]
fn a_refresh_during_the_pages_read_leaves_the_new_bytes() {
    let p = one_page_at_a_time();
    let data = pattern_vec(67, 4 * PAGE);
    let store = Arc::new(Gated::new(data.clone(), Held::ReadOfPage1));
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        ..MapOptions::default()
    };
    // SAFETY: the one change behind the engine (below) comes while no
    // slice of the region is alive, and the refresh that covers it returns
    // before the next slice is made.
    let mut r = unsafe { p.map_store(store.clone(), 4 * PAGE, &opts) }.unwrap();
    let at = PAGE + 7;
    let addr = r.as_ptr() as usize + at;
    // SAFETY: inside the region, which outlives this thread (joined below).
    let reader = std::thread::spawn(move || unsafe { std::ptr::read_volatile(addr as *const u8) });
    // The read has taken the old bytes and waits.
    store.until_a_call_waits(|| false);
    let new = data[at] ^ 0xff;
    store.bytes.lock().unwrap()[at] = new;
    let opener = {
        let store = store.clone();
        std::thread::spawn(move || store.open_after(Duration::from_millis(200)))
    };
    r.refresh(at as u64, 1).unwrap();
    opener.join().unwrap();
    let seen = reader.join().unwrap();
    assert!(
        seen == data[at] || seen == new,
        "the racing read got {seen}"
    );
    assert_eq!(
        r.as_slice()[at],
        new,
        "the page kept the bytes its in-flight read took before the change"
    );
}

/// A remap whose write protection of the moved range fails (`EAGAIN`, an
/// event on its way) counts every mapped page dirty instead, without the
/// pages' locks. A review feared an eviction holding one across its store
/// write: the remap returns, the application writes the page (writable,
/// unprotected) and the eviction drops the page with that write in it.
/// The eviction zaps the page before it writes it, so the write faults and
/// waits for the eviction, then reads the page back: nothing is lost.
#[test]
fn a_remap_that_cannot_protect_again_during_an_eviction_keeps_a_write() {
    let _hooks = REMAP_HOOKS.lock().unwrap_or_else(|e| e.into_inner());
    // (A budget: without one there is no LRU to evict from.)
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(0, 1)
        .fault_around(0)
        .budget_pages(64)
        .build()
        .unwrap();
    let data = pattern_vec(71, 8 * PAGE);
    let store = Arc::new(Gated::new(data.clone(), Held::Writes));
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region.
    let mut r = unsafe { p.map_store(store.clone(), 4 * PAGE, &opts) }.unwrap();
    let at = PAGE + 9;
    r.as_mut_slice()[at] = 0x11;
    std::thread::scope(|s| {
        // The eviction of the dirty page waits in its store write, the
        // page locked.
        let evictor = s.spawn(|| p.reclaim_pages(1));
        store.until_a_call_waits(|| evictor.is_finished());
        s.spawn(|| store.open_after(Duration::from_millis(300)));
        fail_next_reprotect();
        r.remap(8 * PAGE).unwrap();
        r.as_mut_slice()[at] = 0x77;
        assert_eq!(evictor.join().unwrap(), 1, "the eviction");
    });
    assert_eq!(r.as_slice()[at], 0x77, "the write after the remap");
    r.flush().unwrap();
    assert_eq!(
        store.bytes.lock().unwrap()[at],
        0x77,
        "the write after the remap was not written back"
    );
}

/// A 2 MiB anonymous page leaves the mapping write-protected, copied, and
/// written to swap before it is zapped; write protection does not stop the
/// application's own `MADV_DONTNEED`. One dropped while the swap write was
/// in flight came back with the bytes of that write (the eviction zapped
/// nothing and counted the copy as the page), where the kernel's hugetlb
/// gives zeros. The eviction now looks before its zap and takes the page
/// for dropped.
#[test]
fn a_huge_page_dropped_during_its_swap_write_reads_as_zeros() {
    let _pool = huge_util::HugePool::take(2);
    let huge = uffd_pager::HUGE_PAGE_SIZE;
    let swap = Arc::new(Gated::new(vec![0; huge], Held::Writes));
    let made = swap.clone();
    // SAFETY: the one swap store is made for the one region and changed
    // only by the engine (the test reads its gate, not its bytes).
    let builder = unsafe {
        Pager::builder()
            .delivery(Delivery::InThread)
            .budget_pages(2 * (huge / PAGE) as u64)
            .swap_to(move |_| Ok(made.clone() as Arc<dyn Store>))
    };
    let p = builder.build().unwrap();
    let mut r = p
        .map_anonymous_with(huge, &huge_opts(InstallKind::Anonymous))
        .expect("map a 2 MiB anonymous region");
    r.as_mut_slice().fill(7);
    let addr = r.as_ptr() as usize;
    std::thread::scope(|s| {
        let evictor = s.spawn(|| p.reclaim_pages((huge / PAGE) as u64));
        swap.until_a_call_waits(|| evictor.is_finished());
        // SAFETY: the region's one page; the application may drop its own
        // memory (no slice of the region is used meanwhile).
        let rc = unsafe { libc::madvise(addr as *mut libc::c_void, huge, libc::MADV_DONTNEED) };
        assert_eq!(rc, 0, "madvise: {}", errno());
        swap.open_after(Duration::ZERO);
        evictor.join().unwrap();
    });
    let s = r.as_slice();
    assert!(
        s.iter().all(|&b| b == 0),
        "the dropped page read {} (the swap copy made before the drop), not 0",
        s[0]
    );
}

/// Reclaim looked at waiting events between batches only: with a batch of
/// 32 dirty pages, the application's `munmap` of another region (and with
/// in-thread delivery every fault begun meanwhile) waited for 32 store
/// writes. It now leaves after the page it is writing.
#[test]
fn a_munmap_waits_for_one_reclaim_write_not_a_batch() {
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(0, 1)
        .fault_around(0)
        .kswapd(false)
        .budget_pages(1024)
        .build()
        .unwrap();
    let store = Arc::new(Gated::new(vec![0; 64 * PAGE], Held::Writes));
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region.
    let mut r = unsafe { p.map_store(store.clone(), 64 * PAGE, &opts) }.unwrap();
    for pg in 0..64 {
        r.as_mut_slice()[pg * PAGE] = 1;
    }
    let other = p.map_anonymous(PAGE).unwrap();
    let gone = other.as_ptr() as usize;
    std::thread::scope(|s| {
        let evictor = s.spawn(|| p.reclaim_pages(64));
        store.until_a_call_waits(|| evictor.is_finished());
        let st = &store;
        let unmapper = s.spawn(move || {
            // SAFETY: the other region's range, given up by the test.
            let rc = unsafe { libc::munmap(gone as *mut libc::c_void, PAGE) };
            (rc, st.writes.load(SeqCst))
        });
        // The event reader waits for reclaim's section.
        let t = Instant::now();
        while !p.events_waiting() {
            assert!(t.elapsed() < Duration::from_secs(20), "no event waits");
            std::thread::sleep(Duration::from_millis(1));
        }
        store.open_after(Duration::ZERO);
        let (rc, writes) = unmapper.join().unwrap();
        assert_eq!(rc, 0, "munmap");
        assert!(
            writes <= 2,
            "the munmap waited for {writes} store writes\n{}",
            p.stats()
        );
        evictor.join().unwrap();
    });
    drop(other);
}
