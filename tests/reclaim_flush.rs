//! `Region::flush` writes back only dirty pages, re-arms write tracking,
//! and unmapping writes back the rest.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use uffd_pager::{Counter, Delivery, MapOptions, Pager};

const PAGE: usize = 4096;
const PAGES: usize = 16;

const THREADS: Delivery = Delivery::Threads {
    threads: 2,
    spin_us: 0,
};

/// A file in the temporary directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn with_contents(tag: &str, contents: &[u8]) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "uffd-reclaim-flush-{tag}-{}-{n}.bin",
            std::process::id()
        ));
        std::fs::write(&path, contents).expect("writing temp file");
        TempFile(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn read(&self) -> Vec<u8> {
        std::fs::read(&self.0).expect("reading temp file")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / PAGE) as u8).collect()
}

/// A pager of 4 pages whose only reclaimer is the faulting thread's
/// direct reclaim: no kswapd, and no readahead (whose I/O threads charge
/// the pages they read, and so reclaim too, concurrently).
fn four_page_pager() -> Pager {
    Pager::builder()
        .budget_pages(4)
        .kswapd(false)
        .readahead(0, 1)
        .build()
        .unwrap()
}

fn writeback(p: &Pager) -> u64 {
    p.stats().get(Counter::WRITEBACK)
}

/// `budget`: 0 (no reclaim at all) or a budget larger than the file, so
/// nothing is evicted and every write-back counted is the flush's.
fn flush_writes_back_only_dirty_pages(delivery: Delivery, budget: u64) {
    let contents = pattern(PAGES * PAGE);
    let file = TempFile::with_contents("dirty", &contents);
    let pager = Pager::builder()
        .delivery(delivery)
        .budget_pages(budget)
        .kswapd(false)
        .build()
        .unwrap();
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region = unsafe { pager.map_file(file.path(), None, &MapOptions::default()) }.unwrap();
    assert_eq!(region.len(), PAGES * PAGE);

    // Read every page: nothing is dirty.
    assert_eq!(region.as_slice(), &contents[..]);
    assert!(pager.stats().get(Counter::PGREAD) >= PAGES as u64);
    region.flush().unwrap();
    assert_eq!(writeback(&pager), 0, "a flush after reads wrote pages back");
    assert_eq!(file.read(), contents);

    // One write: exactly one page goes back, and the file has it.
    region.as_mut_slice()[5 * PAGE + 17] = 0xA5;
    region.flush().unwrap();
    assert_eq!(writeback(&pager), 1);
    let mut want = contents.clone();
    want[5 * PAGE + 17] = 0xA5;
    assert_eq!(file.read(), want);

    // The page is clean again: a second flush writes nothing.
    region.flush().unwrap();
    assert_eq!(writeback(&pager), 1, "a clean page was written back again");

    // Write tracking was re-armed: writing the same page again dirties it.
    region.as_mut_slice()[5 * PAGE + 18] = 0x5A;
    region.flush().unwrap();
    assert_eq!(writeback(&pager), 2, "a write after a flush was not seen");
    want[5 * PAGE + 18] = 0x5A;
    assert_eq!(file.read(), want);

    // Writes left dirty are written back by the unmap.
    region.as_mut_slice()[2 * PAGE] = 0x11;
    region.as_mut_slice()[(PAGES - 1) * PAGE + PAGE - 1] = 0x22;
    want[2 * PAGE] = 0x11;
    want[(PAGES - 1) * PAGE + PAGE - 1] = 0x22;
    region.unmap().unwrap();
    assert_eq!(writeback(&pager), 4, "unmap wrote back the wrong pages");
    assert_eq!(file.read(), want);
    assert_eq!(pager.stats().get(Counter::PGSTEAL), 0);
}

#[test]
fn flush_in_thread() {
    flush_writes_back_only_dirty_pages(Delivery::InThread, 0);
}

#[test]
fn flush_handler_threads() {
    flush_writes_back_only_dirty_pages(THREADS, 0);
}

#[test]
fn flush_in_thread_with_a_budget() {
    flush_writes_back_only_dirty_pages(Delivery::InThread, 4 * PAGES as u64);
}

/// Under a small budget, dirty pages evicted before the flush were written
/// back by reclaim, clean evicted pages never are, and the flush writes
/// only what is still dirty: every page is written back at most once per
/// write.
///
/// The only reclaimer is the faulting thread's direct reclaim: no kswapd,
/// and no readahead, whose I/O threads charge the pages they read and so
/// reclaim too, concurrently. One of those could evict a page in the
/// moment between its write fault (which marks it dirty) and the write
/// itself, and write it back then as well as after the write (see
/// `a_page_evicted_between_its_write_fault_and_the_write_is_written_twice`).
#[test]
fn flush_after_eviction_writes_each_dirty_page_once() {
    let contents = pattern(PAGES * PAGE);
    let file = TempFile::with_contents("evicted", &contents);
    let pager = four_page_pager();
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region = unsafe { pager.map_file(file.path(), None, &MapOptions::default()) }.unwrap();
    // Dirty the even pages once each; read the odd ones.
    let mut want = contents.clone();
    for p in 0..PAGES {
        if p.is_multiple_of(2) {
            region.as_mut_slice()[p * PAGE + 3] = p as u8 ^ 0xFF;
            want[p * PAGE + 3] = p as u8 ^ 0xFF;
        } else {
            assert_eq!(region.as_slice()[p * PAGE + 3], contents[p * PAGE + 3]);
        }
    }
    assert!(pager.stats().get(Counter::PGSTEAL) > 0, "nothing evicted");
    region.flush().unwrap();
    assert_eq!(
        writeback(&pager),
        (PAGES / 2) as u64,
        "each dirty page must be written back exactly once (by reclaim or the flush)"
    );
    assert_eq!(file.read(), want);
    region.flush().unwrap();
    region.unmap().unwrap();
    assert_eq!(writeback(&pager), (PAGES / 2) as u64);
    assert_eq!(file.read(), want);
}

/// A write fault marks a shared page dirty before the write it serves
/// lands (the kernel's write fault sets the PTE dirty bit the same way).
/// A page evicted in between is written back with its old contents, and
/// the write, run again, faults it in anew and dirties it again: two
/// write-backs for one write, no write lost. `prefault` is that write
/// fault without the write, and `reclaim_pages` the reclaimer (a readahead
/// thread's direct reclaim, kswapd) that lands in the window.
#[test]
fn a_page_evicted_between_its_write_fault_and_the_write_is_written_twice() {
    let contents = pattern(PAGES * PAGE);
    let file = TempFile::with_contents("window", &contents);
    let pager = four_page_pager();
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region = unsafe { pager.map_file(file.path(), None, &MapOptions::default()) }.unwrap();
    region.prefault(3 * PAGE, PAGE).unwrap();
    assert_eq!(writeback(&pager), 0);
    // Just faulted in (referenced): reclaim takes it all the same, once
    // its second chance is used up within the same call.
    assert!(pager.reclaim_pages(PAGES as u64) >= 1);
    assert_eq!(
        writeback(&pager),
        1,
        "the page dirtied by the write fault was not written back"
    );
    assert_eq!(file.read(), contents, "nothing was written yet");
    region.as_mut_slice()[3 * PAGE + 1] = 0xC3;
    region.flush().unwrap();
    assert_eq!(writeback(&pager), 2);
    let mut want = contents.clone();
    want[3 * PAGE + 1] = 0xC3;
    assert_eq!(file.read(), want);
    region.unmap().unwrap();
    assert_eq!(writeback(&pager), 2);
}

/// A memory store that counts its `sync` calls, whose `sync` waits while
/// its gate is closed and fails once when told.
struct SyncStore {
    inner: uffd_pager::store::MemoryStore,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    in_sync: std::sync::atomic::AtomicBool,
    fail_once: std::sync::atomic::AtomicBool,
    syncs: AtomicUsize,
    /// Its identity differs at every call when set (the count of calls).
    fickle: Option<AtomicUsize>,
}

impl uffd_pager::store::Store for SyncStore {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), uffd_pager::store::StoreError> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), uffd_pager::store::StoreError> {
        self.inner.write(offset, buf)
    }
    fn identity(&self) -> Option<(u64, u64)> {
        let n = self.fickle.as_ref()?.fetch_add(1, Ordering::SeqCst);
        Some((7, n as u64))
    }
    fn sync(&self) -> Result<(), uffd_pager::store::StoreError> {
        self.in_sync.store(true, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        self.syncs.fetch_add(1, Ordering::SeqCst);
        if self.fail_once.swap(false, Ordering::SeqCst) {
            return Err(uffd_pager::store::StoreError(libc::EIO));
        }
        Ok(())
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "gated-sync"
    }
}

impl SyncStore {
    /// Whether `h` finished within 3 s while this store's sync waited;
    /// then lets the sync go on.
    fn finished_in_sync<T>(&self, h: &std::thread::ScopedJoinHandle<'_, T>) -> bool {
        let start = std::time::Instant::now();
        while !h.is_finished() && start.elapsed() < std::time::Duration::from_secs(3) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let finished = h.is_finished();
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
        finished
    }

    fn new(contents: &[u8], open: bool, fail_once: bool) -> std::sync::Arc<SyncStore> {
        std::sync::Arc::new(SyncStore {
            inner: uffd_pager::store::MemoryStore::from_bytes(contents).unwrap(),
            open: std::sync::Mutex::new(open),
            opened: std::sync::Condvar::new(),
            in_sync: Default::default(),
            fail_once: std::sync::atomic::AtomicBool::new(fail_once),
            syncs: AtomicUsize::new(0),
            fickle: None,
        })
    }
}

/// A write-back syncs the store only when something was written to it
/// since its last sync: by this write-back, or by reclaim before it. A
/// flush or unmap of a region nobody wrote synced every time before (an
/// `fdatasync` per `munmap` of a read-only shared mapping under the
/// `LD_PRELOAD` shim, on the program's own open file, where it took the
/// program's pending write-back error).
#[test]
fn a_store_is_synced_only_after_writes() {
    let pager = four_page_pager();
    let store = SyncStore::new(&pattern(PAGES * PAGE), true, false);
    let syncs = || store.syncs.load(Ordering::SeqCst);
    // SAFETY: only this region changes the store.
    let mut region =
        unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }.unwrap();
    let sum: u64 = region.as_slice().iter().map(|&b| b as u64).sum();
    assert!(sum > 0);
    region.flush().unwrap();
    assert_eq!(syncs(), 0, "a flush with nothing written synced");
    // Written by the flush: synced once, and not again.
    region.as_mut_slice()[3 * PAGE] = 1;
    region.flush().unwrap();
    assert_eq!(syncs(), 1);
    region.flush().unwrap();
    assert_eq!(syncs(), 1, "a second flush with nothing written synced");
    // Written by reclaim only (every page dirtied, most evicted): the
    // flush syncs those writes even where it writes nothing itself.
    for p in 0..PAGES {
        region.as_mut_slice()[p * PAGE] = 2;
    }
    assert!(pager.reclaim_pages(PAGES as u64) > 0);
    assert!(writeback(&pager) > 1);
    region.flush().unwrap();
    assert_eq!(syncs(), 2, "writes reclaim made were not synced");
    region.unmap().unwrap();
    assert_eq!(syncs(), 2, "an unmap with nothing written synced");
}

/// Two write-backs of one region at once: the second, with nothing left
/// to write, waits for the first's `sync` rather than reporting success
/// while it runs (it returned at once, and the first's sync then failed);
/// the first reports the failure and its pages go dirty again, and the
/// second, which passed them by while they were being synced, writes and
/// syncs them itself before it says Ok (`tests/lost_syncs.rs`): the next
/// flush has nothing left to write.
#[test]
fn a_flush_waits_for_a_sync_in_flight() {
    let pager = four_page_pager();
    let store = SyncStore::new(&vec![0; PAGES * PAGE], false, true);
    // SAFETY: only this region changes the store.
    let mut region =
        unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }.unwrap();
    region.as_mut_slice()[0] = 1;
    region.as_mut_slice()[PAGE] = 2;
    let r = &region;
    std::thread::scope(|s| {
        let first = s.spawn(|| r.flush());
        while !store.in_sync.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let second = s.spawn(|| r.flush());
        std::thread::sleep(std::time::Duration::from_millis(100));
        let early = second.is_finished();
        *store.open.lock().unwrap() = true;
        store.opened.notify_all();
        assert!(
            !early,
            "a flush reported success while a sync was in flight"
        );
        assert!(
            first.join().unwrap().is_err(),
            "the failed sync was not reported"
        );
        second.join().unwrap().unwrap();
    });
    // The first flush's pages, dirty again, were written and synced anew
    // by the second.
    let before = writeback(&pager);
    region.flush().unwrap();
    assert_eq!(writeback(&pager), before);
    assert_eq!(&store.inner.snapshot()[..1], &[1]);
    assert_eq!(store.inner.snapshot()[PAGE], 2);
    region.unmap().unwrap();
}

/// A change behind the engine's back to bytes of a page the region wrote
/// (dirty), with a write-back of the page between the change and its
/// `refresh`: flushed first (`flush_range`), the page is clean and the
/// write-back has nothing to write, so the change stays, in the store and
/// in the region, beside the region's own write. Without the
/// `flush_range`, the write-back put the page's older copy over the change
/// and the refresh then read that back: the change was lost in both.
#[test]
fn flush_range_before_a_change_behind_the_engine_keeps_it() {
    for evict in [false, true] {
        let pager = four_page_pager();
        let data = pattern(PAGES * PAGE);
        let store = std::sync::Arc::new(uffd_pager::store::MemoryStore::from_bytes(&data).unwrap());
        // SAFETY: the store changes behind the region only as the protocol
        // below says.
        let mut region =
            unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }
                .unwrap();
        region.as_mut_slice()[0] = data[0] ^ 0xFF;
        region.flush_range(100, 4).unwrap();
        uffd_pager::store::Store::write(&*store, 100, &[0xEE; 4]).unwrap();
        // A write-back in the window: another thread's flush, or reclaim.
        if evict {
            pager.reclaim_pages(PAGES as u64);
            pager.reclaim_pages(PAGES as u64);
        } else {
            region.flush().unwrap();
        }
        region.refresh(100, 4).unwrap();
        let mut want = data[..PAGE].to_vec();
        want[0] ^= 0xFF;
        want[100..104].fill(0xEE);
        assert_eq!(
            &region.as_slice()[..PAGE],
            &want[..],
            "region (evict {evict})"
        );
        region.flush().unwrap();
        assert_eq!(
            &store.snapshot()[..PAGE],
            &want[..],
            "store (evict {evict})"
        );
    }
}

/// A flush that waits for its store's `sync` holds no event-gate section
/// meanwhile: the application's own `munmap` of another region returns,
/// and a fault in a third region is served, while the sync runs. Before,
/// the flush held its section through the sync: the unmap's event waited
/// for the sync to end (the `munmap` returned only when the sync was given
/// up on, 30 s later), and every fault waited behind the event.
#[test]
fn a_slow_sync_holds_up_no_unmap_or_fault() {
    let pager = Pager::builder().budget_pages(64).build().unwrap();
    let store = SyncStore::new(&vec![0; PAGES * PAGE], false, false);
    // SAFETY: only this region changes the store.
    let mut region =
        unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }.unwrap();
    region.as_mut_slice()[0] = 1;
    let other = pager.map_anonymous(4 * PAGE).unwrap();
    let third = pager.map_anonymous(4 * PAGE).unwrap();
    let (gone, gone_len) = (other.as_ptr() as usize, other.len());
    let (r, third) = (&region, &third);
    std::thread::scope(|s| {
        let flush = s.spawn(|| r.flush());
        let t = std::time::Instant::now();
        while !store.in_sync.load(Ordering::SeqCst) {
            assert!(t.elapsed().as_secs() < 10, "the flush never synced");
            std::thread::yield_now();
        }
        // SAFETY: the application unmaps region memory itself; the
        // region's handle is not used for its bytes again.
        let unmapper =
            s.spawn(move || unsafe { libc::munmap(gone as *mut libc::c_void, gone_len) });
        std::thread::sleep(std::time::Duration::from_millis(50));
        let toucher = s.spawn(move || third.as_slice()[PAGE + 7]);
        let start = std::time::Instant::now();
        while !(unmapper.is_finished() && toucher.is_finished())
            && start.elapsed() < std::time::Duration::from_secs(3)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (unmapped, served) = (unmapper.is_finished(), toucher.is_finished());
        *store.open.lock().unwrap() = true;
        store.opened.notify_all();
        assert!(unmapped, "the application's munmap waited for a sync");
        assert!(served, "a fault waited for another region's sync");
        assert_eq!(unmapper.join().unwrap(), 0);
        assert_eq!(toucher.join().unwrap(), 0);
        flush.join().unwrap().unwrap();
    });
    assert!(pager.stats().get(Counter::EVENT_UNMAP) >= 1);
    assert_eq!(store.inner.snapshot()[0], 1);
    drop(other);
    region.unmap().unwrap();
}

/// The application's own `munmap` of a region with dirty pages: the
/// engine writes them back once the unmap is applied, and holds no lock
/// that faults need while it does. A fault in another region is served
/// while the store's sync runs, and a map of the same store afterwards
/// reads what was written. Before, the write-back and its sync ran under
/// the event gate and the global lock, and every fault of the pager waited
/// for them.
#[test]
fn the_applications_munmap_writes_back_without_holding_up_faults() {
    for delivery in [Delivery::InThread, THREADS] {
        let pager = Pager::builder()
            .budget_pages(64)
            .delivery(delivery)
            .build()
            .unwrap();
        let store = SyncStore::new(&vec![0; PAGES * PAGE], false, false);
        // SAFETY: only this region changes the store.
        let region =
            unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }
                .unwrap();
        // SAFETY: the region's bytes, no slice of them alive.
        unsafe { std::ptr::write_volatile(region.as_ptr().add(3 * PAGE), 9) };
        let third = pager.map_anonymous(4 * PAGE).unwrap();
        let (gone, gone_len) = (region.as_ptr() as usize, region.len());
        std::mem::forget(region); // the application's munmap takes it
        let third = &third;
        std::thread::scope(|s| {
            // SAFETY: region memory the test gave up (forget) for the
            // application to unmap.
            let unmapper =
                s.spawn(move || unsafe { libc::munmap(gone as *mut libc::c_void, gone_len) });
            while !store.in_sync.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            let toucher = s.spawn(move || third.as_slice()[PAGE + 7]);
            let served = store.finished_in_sync(&toucher);
            assert!(
                served,
                "{delivery}: a fault waited for an unmapped region's sync"
            );
            assert_eq!(toucher.join().unwrap(), 0);
            assert_eq!(unmapper.join().unwrap(), 0);
        });
        // SAFETY: only this region changes the store.
        let again = unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }
            .unwrap();
        assert_eq!(again.as_slice()[3 * PAGE], 9, "{delivery}");
        assert_eq!(store.inner.snapshot()[3 * PAGE], 9, "{delivery}");
        assert!(pager.stats().get(Counter::EVENT_UNMAP) >= 1);
    }
}

/// A `flush_range` in flight (its sync waiting) when the application
/// unmaps the region with its own `munmap`: the flush's reference writes
/// the region's other dirty pages when it is given back, and a map of the
/// same store meanwhile waits for that instead of reading the older bytes
/// (before, it read them: 0, not 5).
#[test]
fn a_map_of_the_store_waits_for_a_flush_in_flight() {
    let pager = Pager::builder().budget_pages(64).build().unwrap();
    let store = SyncStore::new(&vec![0; PAGES * PAGE], false, false);
    // SAFETY: only this region changes the store (the second map below
    // comes once the first region is gone).
    let region =
        unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }.unwrap();
    // SAFETY: the region's bytes, no slice of them alive.
    unsafe {
        std::ptr::write_volatile(region.as_ptr(), 1);
        std::ptr::write_volatile(region.as_ptr().add(5 * PAGE), 5);
    }
    let (gone, gone_len) = (region.as_ptr() as usize, region.len());
    let r = &region;
    let got = std::thread::scope(|s| {
        let flush = s.spawn(|| r.flush_range(0, PAGE as u64));
        while !store.in_sync.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // SAFETY: the application unmaps region memory itself; the
        // region's handle is not used for its bytes again.
        assert_eq!(
            unsafe { libc::munmap(gone as *mut libc::c_void, gone_len) },
            0
        );
        let mapper = s.spawn(|| {
            // SAFETY: the store's only region now.
            let again =
                unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }
                    .unwrap();
            again.as_slice()[5 * PAGE]
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        *store.open.lock().unwrap() = true;
        store.opened.notify_all();
        flush.join().unwrap().unwrap();
        mapper.join().unwrap()
    });
    assert_eq!(
        got, 5,
        "a map read the store while a flush still owed it a page"
    );
    assert_eq!(store.inner.snapshot()[5 * PAGE], 5);
    drop(region);
}

/// Two `munmap`s of the application's, the first of a region whose store's
/// sync is slow: the second returns while the first region's write-back
/// waits. With in-thread delivery the event reader wrote the first region
/// back itself, and read no other event until the sync ended.
#[test]
fn a_slow_write_back_holds_up_no_other_munmap() {
    let pager = Pager::builder().budget_pages(64).build().unwrap();
    let store = SyncStore::new(&vec![0; PAGES * PAGE], false, false);
    // SAFETY: only this region changes the store.
    let slow =
        unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }.unwrap();
    // SAFETY: the region's bytes, no slice of them alive.
    unsafe { std::ptr::write_volatile(slow.as_ptr(), 4) };
    let other = pager.map_anonymous(4 * PAGE).unwrap();
    let spans = [slow.as_ptr() as usize, other.as_ptr() as usize];
    let lens = [slow.len(), other.len()];
    // The application's munmaps take them.
    std::mem::forget(slow);
    std::mem::forget(other);
    std::thread::scope(|s| {
        // SAFETY: region memory the test gave up (forget) for the
        // application to unmap.
        let unmap = |k: usize| unsafe { libc::munmap(spans[k] as *mut libc::c_void, lens[k]) };
        let first = s.spawn(move || unmap(0));
        while !store.in_sync.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let second = s.spawn(move || unmap(1));
        let returned = store.finished_in_sync(&second);
        assert!(returned, "a munmap waited for another region's write-back");
        assert_eq!(first.join().unwrap(), 0);
        assert_eq!(second.join().unwrap(), 0);
    });
    pager.flush_unmapped().unwrap();
    assert_eq!(store.inner.snapshot()[0], 4);
    assert!(pager.stats().get(Counter::EVENT_UNMAP) >= 2);
}

/// The application's `munmap` of a region whose store's sync is slow: a
/// map of another store, and the drop of another region, return while that
/// write-back waits. They waited for it: every map and unmap waited for
/// all of the pager's releases, whatever their store.
#[test]
fn a_slow_write_back_holds_up_no_map_of_another_store() {
    let pager = Pager::builder().budget_pages(64).build().unwrap();
    let store = SyncStore::new(&vec![0; PAGES * PAGE], false, false);
    // SAFETY: only this region changes the store.
    let slow =
        unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }.unwrap();
    // SAFETY: the region's bytes, no slice of them alive.
    unsafe { std::ptr::write_volatile(slow.as_ptr(), 4) };
    let bystander = pager.map_anonymous(4 * PAGE).unwrap();
    let (at, len) = (slow.as_ptr() as usize, slow.len());
    // The application's munmap takes it.
    std::mem::forget(slow);
    let pager = &pager;
    std::thread::scope(|s| {
        // SAFETY: region memory the test gave up (forget) for the
        // application to unmap.
        let first = s.spawn(move || unsafe { libc::munmap(at as *mut libc::c_void, len) });
        while !store.in_sync.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let other = s.spawn(move || {
            let mem = uffd_pager::store::MemoryStore::from_bytes(&[5; 4 * PAGE]).unwrap();
            // SAFETY: a store of this thread's own, changed only through
            // the region.
            let r = unsafe {
                pager.map_store(std::sync::Arc::new(mem), 4 * PAGE, &MapOptions::default())
            }
            .unwrap();
            assert_eq!(r.as_slice()[PAGE], 5);
            drop(r);
            drop(bystander);
        });
        let returned = store.finished_in_sync(&other);
        assert!(
            returned,
            "a map of another store waited for a region's write-back"
        );
        assert_eq!(first.join().unwrap(), 0);
        other.join().unwrap();
    });
    pager.flush_unmapped().unwrap();
    assert_eq!(store.inner.snapshot()[0], 4);
}

/// A store whose identity differs at every call (as a file store's may,
/// where `fstat` fails once): its region's release is marked and unmarked
/// by one key, the object's, made at map. The release made a key of its
/// own at each end, and the mark of the first was never undone: the next
/// map of the store waited for ever (found by review).
#[test]
fn a_store_whose_identity_changes_is_mapped_again_after_the_applications_munmap() {
    let pager = Pager::builder().budget_pages(64).build().unwrap();
    let store = std::sync::Arc::new(SyncStore {
        fickle: Some(AtomicUsize::new(0)),
        ..std::sync::Arc::into_inner(SyncStore::new(&vec![0; PAGES * PAGE], true, false)).unwrap()
    });
    // SAFETY: only this region changes the store.
    let r =
        unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }.unwrap();
    // SAFETY: the region's bytes, no slice of them alive.
    unsafe { std::ptr::write_volatile(r.as_ptr(), 6) };
    let (at, len) = (r.as_ptr() as usize, r.len());
    std::mem::forget(r);
    // SAFETY: region memory the test gave up (forget) for the application
    // to unmap.
    assert_eq!(unsafe { libc::munmap(at as *mut libc::c_void, len) }, 0);
    // (Not a scoped thread: one that hangs must not hold up the test.)
    let pager = std::sync::Arc::new(pager);
    let p = pager.clone();
    let again = std::thread::spawn(move || {
        // SAFETY: as above.
        let r = unsafe { p.map_store(store, PAGES * PAGE, &MapOptions::default()) }.unwrap();
        r.as_slice()[0]
    });
    let start = std::time::Instant::now();
    while !again.is_finished() && start.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        again.is_finished(),
        "the map waited for a release that was over"
    );
    assert_eq!(again.join().unwrap(), 6);
}
