//! A shared object's page cache outlives its mappings (`src/kept.rs`), on
//! real faults: mapping the same store again reads nothing it still holds;
//! a change to the store behind the pager's back, by a write through it
//! or to the file, is seen; writes through a region survive its unmap;
//! kept pages are reclaimed under the budget like any cached page.

#[path = "engine_util.rs"]
mod util;

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use uffd_pager::store::{
    FileStore, FileStoreOptions, LatencyModel, MemoryStore, SimulatedStore, Store, StoreError,
};
use uffd_pager::{Counter, Delivery, MapOptions, Pager, Region};
use util::*;

const PAGES: usize = 64;

/// A store over `data` that counts its reads.
fn counted(data: &[u8]) -> Arc<SimulatedStore> {
    let mem = Arc::new(MemoryStore::from_bytes(data).unwrap());
    Arc::new(SimulatedStore::new(mem, LatencyModel::None, 8, 1))
}

fn pager(keep: usize, budget: u64, delivery: Delivery) -> Pager {
    Pager::builder()
        .delivery(delivery)
        .budget_pages(budget)
        .readahead(0, 1)
        .keep_unmapped(keep)
        .build()
        .unwrap()
}

/// Maps `store` (shared, writable), checks every page against `want`, and
/// returns the region.
fn map_checked(p: &Pager, store: &Arc<SimulatedStore>, want: &[u8], ctx: &str) -> Region {
    // SAFETY: a write behind the engine (`write_behind`) comes only while
    // no region maps the store (its stamp moves, so nothing kept is used), or
    // after the region's only slice (in `assert_bytes`) is gone, and the
    // region is then dropped without another.
    let r = unsafe {
        p.map_store(
            store.clone() as Arc<dyn Store>,
            want.len(),
            &MapOptions::default(),
        )
    }
    .unwrap();
    assert_bytes(r.as_slice(), want, ctx);
    r
}

/// [`map_checked`], then unmaps.
fn map_and_check(p: &Pager, store: &Arc<SimulatedStore>, want: &[u8], ctx: &str) {
    drop(map_checked(p, store, want, ctx));
}

#[test]
fn mapping_a_store_again_reads_only_what_was_not_kept() {
    for d in [Delivery::InThread, THREADS] {
        let want = pattern_vec(3, PAGES * PAGE);
        let store = counted(&want);
        let p = pager(16, 4096, d);
        map_and_check(&p, &store, &want, &format!("{d}: first map"));
        let first = store.reads();
        assert!(first > 0, "{d}: the first map read the store");
        for round in 0..3 {
            map_and_check(&p, &store, &want, &format!("{d}: map {round} again"));
        }
        assert_eq!(
            store.reads(),
            first,
            "{d}: a kept object's pages were read again"
        );

        // Nothing kept: every map reads the store.
        let p = pager(0, 4096, d);
        let store = counted(&want);
        map_and_check(&p, &store, &want, &format!("{d}: unkept"));
        let first = store.reads();
        map_and_check(&p, &store, &want, &format!("{d}: unkept again"));
        assert_eq!(store.reads(), 2 * first, "{d}: keep_unmapped(0) kept pages");
    }
}

/// Writes page `page` of `store` straight to it (behind the pager's back)
/// and into `want`.
fn write_behind(store: &SimulatedStore, want: &mut [u8], page: usize, byte: u8) {
    let bytes = vec![byte; PAGE];
    store.write((page * PAGE) as u64, &bytes).unwrap();
    want[page * PAGE..(page + 1) * PAGE].copy_from_slice(&bytes);
}

#[test]
fn a_write_behind_the_pagers_back_is_seen_at_the_next_map() {
    let mut want = pattern_vec(5, PAGES * PAGE);
    let store = counted(&want);
    let p = pager(16, 4096, Delivery::InThread);
    map_and_check(&p, &store, &want, "first map");
    // With no region over the store.
    write_behind(&store, &mut want, 7, 0xa5);
    map_and_check(&p, &store, &want, "after a write to the store");
    // While a region holds the page (the region itself may show the old
    // bytes: `Region::refresh`); the stamp it was made with has moved.
    let r = map_checked(&p, &store, &want, "mapped");
    write_behind(&store, &mut want, 9, 0x5a);
    drop(r);
    map_and_check(&p, &store, &want, "after a write while mapped");
}

#[test]
fn without_a_budget_nothing_is_kept() {
    // (No budget, no LRU: kept pages could never be reclaimed.)
    let want = pattern_vec(4, PAGES * PAGE);
    let store = counted(&want);
    let p = pager(16, 0, Delivery::InThread);
    map_and_check(&p, &store, &want, "first map");
    let first = store.reads();
    map_and_check(&p, &store, &want, "again");
    assert_eq!(store.reads(), 2 * first, "pages were kept without a budget");
}

#[test]
fn writes_through_a_region_survive_its_unmap_and_reach_the_store() {
    let mut want = pattern_vec(9, PAGES * PAGE);
    let store = counted(&want);
    let p = pager(16, 4096, Delivery::InThread);
    {
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut r = unsafe {
            p.map_store(
                store.clone() as Arc<dyn Store>,
                want.len(),
                &MapOptions::default(),
            )
        }
        .unwrap();
        let s = r.as_mut_slice();
        for i in (0..PAGES).step_by(3) {
            s[i * PAGE + 11] = i as u8 ^ 0x5a;
            want[i * PAGE + 11] = i as u8 ^ 0x5a;
        }
    }
    // Written back at the unmap; the write-back moved the store's stamp,
    // so the next map reads the store.
    let snapshot = {
        let mut b = vec![0u8; want.len()];
        store.read(0, &mut b).unwrap();
        b
    };
    assert_bytes(&snapshot, &want, "the store after unmap");
    map_and_check(&p, &store, &want, "mapped again");
    map_and_check(&p, &store, &want, "and again");
}

#[test]
fn kept_pages_are_reclaimed_under_the_budget() {
    let a_want = pattern_vec(11, PAGES * PAGE);
    let b_want = pattern_vec(12, 4 * PAGES * PAGE);
    let (a, b) = (counted(&a_want), counted(&b_want));
    let p = pager(16, PAGES as u64, Delivery::InThread);
    map_and_check(&p, &a, &a_want, "a");
    // b is four times the budget: a's kept pages must make room.
    map_and_check(&p, &b, &b_want, "b");
    let st = p.stats();
    assert!(
        st.peak_resident_pages <= PAGES as u64 + 64,
        "peak {} over a budget of {PAGES}\n{st}",
        st.peak_resident_pages
    );
    let before = a.reads();
    map_and_check(&p, &a, &a_want, "a again, after b");
    assert!(
        a.reads() > before,
        "a's pages were all evicted, yet none was read"
    );
}

#[test]
fn a_file_changed_behind_the_pager_is_read_anew() {
    let dir = tempfile_dir();
    let path = dir.join("kept.dat");
    let mut want = pattern_vec(13, PAGES * PAGE);
    std::fs::write(&path, &want).unwrap();
    // Old enough that the file's times vouch for its contents.
    std::thread::sleep(std::time::Duration::from_millis(120));
    let opts = FileStoreOptions {
        writable: true,
        ..FileStoreOptions::default()
    };
    let store: Arc<dyn Store> = Arc::new(FileStore::open(&path, &opts).unwrap());
    let p = pager(16, 4096, Delivery::InThread);
    let majors = |p: &Pager| p.stats().get(Counter::PGMAJFAULT);
    let map = |want: &[u8], ctx: &str| {
        // SAFETY: the other writer writes the file only between maps, each of
        // which checks the file's stamp (the test's subject): no slice is alive
        // then.
        let r = unsafe { p.map_store(store.clone(), want.len(), &MapOptions::default()) }.unwrap();
        assert_bytes(r.as_slice(), want, ctx);
    };
    map(&want, "first map");
    let first = majors(&p);
    map(&want, "unchanged");
    assert_eq!(majors(&p), first, "an unchanged file was read again");
    // Another writer, at once (the same clock tick as the stamp, maybe).
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[0x3c; 100], 5 * PAGE as u64 + 40).unwrap();
    want[5 * PAGE + 40..5 * PAGE + 140].fill(0x3c);
    map(&want, "after another writer");
    // And a truncate to the same length with new contents.
    std::thread::sleep(std::time::Duration::from_millis(120));
    map(&want, "settled again");
    f.set_len(0).unwrap();
    f.set_len((PAGES * PAGE) as u64).unwrap();
    want.fill(0);
    map(&want, "after a truncate");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("uffd-kept-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A memory store whose writes take 800 ms; two over one memory store,
/// with an identity, are two stores of one file (as two `FileStore`s of a
/// path are).
struct SlowWrites(Arc<MemoryStore>, Option<(u64, u64)>);

impl SlowWrites {
    fn new(fill: u8) -> SlowWrites {
        SlowWrites(
            Arc::new(MemoryStore::from_bytes(&vec![fill; 8 * PAGE]).unwrap()),
            None,
        )
    }
}

impl Store for SlowWrites {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        std::thread::sleep(Duration::from_millis(800));
        self.0.write(off, buf)
    }
    fn writable(&self) -> bool {
        true
    }
    fn signal_safe(&self) -> bool {
        true
    }
    fn contents_stamp(&self) -> Option<u64> {
        self.0.contents_stamp()
    }
    fn identity(&self) -> Option<(u64, u64)> {
        self.1
    }
    fn name(&self) -> &'static str {
        "slow-writes"
    }
}

/// A map of a store while the unmap of its last region (the object to be
/// kept) is still writing that region's dirty page back: the new region
/// shows the write, and the store ends with both regions' writes. The
/// object was neither kept nor listed as owing pages then, so the map
/// read the store's older byte, and its own write-back put it back over
/// the first region's write (0x11 where 0xAA was written).
#[test]
fn a_map_during_the_write_back_of_an_object_being_kept_sees_its_writes() {
    map_during_the_write_back(false);
}

/// The same with a residency guard holding the object past the unmap: the
/// unmap writes the region's dirty page back itself then (the guard's
/// drop would write it only later), and a map of the store meanwhile
/// waits for that write. It did not: the store was not marked as being
/// written, so the map read the older byte, and its own write-back put it
/// back.
#[test]
fn a_map_during_the_write_back_of_an_unmap_a_guard_outlives_sees_its_writes() {
    map_during_the_write_back(true);
}

/// A region writes a byte and is unmapped on another thread (its store's
/// writes take 800 ms), a residency guard on another page holding its
/// object past the unmap if `guarded`; the same store is mapped again
/// meanwhile, written and unmapped: the store ends with both writes.
fn map_during_the_write_back(guarded: bool) {
    let store: Arc<dyn Store> = Arc::new(SlowWrites::new(0x11));
    let p = pager(16, 1024, Delivery::InThread);
    // SAFETY: the store changes only through the engine's write-backs.
    let mut first =
        unsafe { p.map_store(store.clone(), 8 * PAGE, &MapOptions::default()) }.unwrap();
    first.as_mut_slice()[100] = 0xAA;
    let guard = guarded.then(|| first.lock_resident_owned(PAGE, PAGE, false).unwrap());
    let unmap = std::thread::spawn(move || drop(first));
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: as above.
    let mut second =
        unsafe { p.map_store(store.clone(), 8 * PAGE, &MapOptions::default()) }.unwrap();
    assert_eq!(
        second.as_slice()[100],
        0xAA,
        "the new region shows the older byte"
    );
    second.as_mut_slice()[200] = 0xBB;
    unmap.join().unwrap();
    drop(guard);
    drop(second);
    let mut page = vec![0u8; PAGE];
    store.read(0, &mut page).unwrap();
    assert_eq!(
        (page[100], page[200]),
        (0xAA, 0xBB),
        "a write was lost in the store"
    );
}

/// A kept object's pages are resident and charged to the budget
/// (`resident_pages`), and the memory report counts them: it once walked
/// only the mapped regions, so they were missing from it (a page figure of
/// 0 bytes beside 64 resident pages).
#[test]
fn the_memory_report_counts_kept_objects() {
    let p = pager(4, 256, Delivery::InThread);
    let data = pattern_vec(7, PAGES * PAGE);
    let store = counted(&data);
    let r = map_checked(&p, &store, &data, "first map");
    let mapped = p.memory_use();
    assert_eq!(mapped.resident_pages, PAGES as u64, "{mapped:?}");
    drop(r);
    let m = p.memory_use();
    assert_eq!(m.resident_pages, PAGES as u64, "kept: {m:?}");
    assert!(
        m.memfd_bytes >= (PAGES * PAGE) as u64,
        "the report holds {} bytes of memfd pages for {} resident pages: {m:?}",
        m.memfd_bytes,
        m.resident_pages
    );
    assert_eq!(m.metadata_bytes, mapped.metadata_bytes, "{m:?} {mapped:?}");
    // Mapped again: the object is taken back, and counted once.
    let r = map_checked(&p, &store, &data, "second map");
    assert_eq!(p.memory_use().memfd_bytes, m.memfd_bytes);
    drop(r);
}

/// Second chance goes to pages used again: a page a fault finds cached
/// (here a kept object's, mapped anew) is referenced, one read for its
/// fault is not, so reclaim takes the pages used once first, though they
/// came later. Before, every install was referenced, every page got one
/// rotation, and the older pages, used twice, went first.
#[test]
fn pages_used_again_outlive_pages_used_once() {
    const N: usize = 16;
    let a_want = pattern_vec(21, N * PAGE);
    // (More of b than is reclaimed: the last pages faulted wait in the
    // per-CPU add batch, off the LRU, as the kernel's do.)
    let b_want = pattern_vec(22, 3 * N * PAGE);
    let (a, b) = (counted(&a_want), counted(&b_want));
    let p = pager(4, 4096, Delivery::InThread);
    map_and_check(&p, &a, &a_want, "a, first use");
    let ra = map_checked(&p, &a, &a_want, "a, used again");
    let rb = map_checked(&p, &b, &b_want, "b, first use");
    let st = p.stats();
    assert_eq!(p.reclaim_pages(N as u64), N as u64);
    let scanned = p.stats().get(Counter::PGSCAN) - st.get(Counter::PGSCAN);
    let (a_reads, b_reads) = (a.reads(), b.reads());
    assert_bytes(ra.as_slice(), &a_want, "a after reclaim");
    assert_bytes(rb.as_slice(), &b_want, "b after reclaim");
    assert_eq!(
        a.reads(),
        a_reads,
        "pages used twice were evicted before pages used once ({scanned} scanned)"
    );
    assert_eq!(b.reads() - b_reads, N as u64, "b's pages were not evicted");
}

/// The page a fault read for itself must not go before the neighbours
/// fault-around mapped with it, which nobody touched: fault-around marks
/// those referenced (`fault/around.rs`), and since ded3ba4 the faulting
/// page itself is not, so reclaim took the one page the application used
/// and kept the fifteen it never did.
#[test]
fn the_faulting_page_outlives_the_neighbours_mapped_around_it() {
    const N: usize = 16;
    let want = pattern_vec(23, N * PAGE);
    let store = counted(&want);
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(4096)
        .kswapd(false)
        .readahead(0, 1)
        .fault_around(N)
        .keep_unmapped(4)
        .build()
        .unwrap();
    // Pages 1..N cached (kept after the first region went), page 0 not.
    {
        // SAFETY: the store is changed only through the pager.
        let r = unsafe {
            p.map_store(
                store.clone() as Arc<dyn Store>,
                want.len(),
                &MapOptions::default(),
            )
        }
        .unwrap();
        assert_bytes(&r.as_slice()[PAGE..], &want[PAGE..], "pages 1..");
    }
    let before = store.reads();
    // SAFETY: as above.
    let r = unsafe {
        p.map_store(
            store.clone() as Arc<dyn Store>,
            want.len(),
            &MapOptions::default(),
        )
    }
    .unwrap();
    // One fault: page 0 read, its cached neighbours mapped around it.
    assert_eq!(r.as_slice()[0], want[0]);
    assert_eq!(store.reads(), before + 1, "only page 0 was read");
    assert_eq!(p.reclaim_pages(1), 1);
    let reads = store.reads();
    assert_bytes(&r.as_slice()[..PAGE], &want[..PAGE], "page 0 again");
    assert_eq!(
        store.reads(),
        reads,
        "the page the application read was evicted before the {} neighbours it never touched",
        N - 1
    );
}

/// The application unmaps a new region before the map that made it has
/// given back its own reference to the region's object (the kernel has
/// published the range; a C program under the shim, or a thread that
/// knows the fixed address, can unmap it at once). The unmap's release
/// saw the map's reference and left the object to it, and the map then
/// dropped it plainly: freed with its pages charged and its slot in the
/// reverse map still pointing at it (found by review). The map gives its
/// reference back through the release now, which keeps or frees the
/// object as any last release does.
#[cfg(feature = "fault-inject")]
#[test]
fn an_unmap_before_the_map_returns_releases_the_object() {
    /// The thread whose map the hook acts on: the hook is process-wide,
    /// and another test's map meanwhile had its region unmapped under it.
    static OWNER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    fn unmap_at_once(start: usize) {
        // SAFETY: gettid has no preconditions.
        if unsafe { libc::gettid() } != OWNER.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        // SAFETY: the test's own new region, used by nothing yet.
        assert_eq!(unsafe { libc::munmap(start as *mut _, 16 * PAGE) }, 0);
        // The handler thread applies the unmap's event meanwhile.
        std::thread::sleep(Duration::from_millis(300));
    }
    let data = pattern_vec(7, 16 * PAGE);
    let store = counted(&data);
    let threads = Delivery::Threads {
        threads: 1,
        spin_us: 0,
    };
    let p = pager(16, 1024, threads);
    // Kept after its unmap, with its 16 pages resident.
    map_and_check(&p, &store, &data, "first map");
    assert_eq!(p.stats().resident_pages, 16);
    // SAFETY: gettid has no preconditions.
    OWNER.store(
        unsafe { libc::gettid() },
        std::sync::atomic::Ordering::SeqCst,
    );
    uffd_pager::testing::set_after_published(Some(unmap_at_once));
    // SAFETY: the store changes only through the engine.
    let r = unsafe {
        p.map_store(
            store.clone() as Arc<dyn Store>,
            16 * PAGE,
            &MapOptions::default(),
        )
    };
    uffd_pager::testing::set_after_published(None);
    drop(r.unwrap());
    // Kept again (or released): either way reclaim can reach its pages.
    p.reclaim_pages(1 << 20);
    let st = p.stats();
    assert_eq!(
        st.resident_pages, 0,
        "pages stayed charged to no object\n{st}"
    );
    // And the store maps again with the right bytes.
    map_and_check(&p, &store, &data, "after");
}

/// The same as `a_map_during_the_write_back_of_an_object_being_kept_sees_its_writes`
/// for the maps that did not wait for that write-back (found by review):
/// one of the anonymous kind (a read-only map with random access advice
/// gets it by default), and one through another store of the same file
/// (the same identity). Each read the store's older byte (0x11 where 0xAA
/// was written); the second's own write-back would then have put it back
/// over the first region's write.
#[test]
fn every_map_of_the_store_waits_for_the_write_back_of_an_object_being_kept() {
    let mut one = SlowWrites::new(0x11);
    one.1 = Some((7, 7));
    let other = SlowWrites(one.0.clone(), one.1);
    let first_store: Arc<dyn Store> = Arc::new(one);
    let anonymous = MapOptions {
        kind: Some(uffd_pager::InstallKind::Anonymous),
        writable: false,
        ..MapOptions::default()
    };
    for (how, second_store, opts) in [
        ("an anonymous map", first_store.clone(), anonymous),
        (
            "a map through another store of the file",
            Arc::new(other) as Arc<dyn Store>,
            MapOptions::default(),
        ),
    ] {
        let p = pager(16, 1024, Delivery::InThread);
        // SAFETY: the store changes only through the engine's write-backs.
        let mut first =
            unsafe { p.map_store(first_store.clone(), 8 * PAGE, &MapOptions::default()) }.unwrap();
        let byte = first.as_slice()[100];
        first.as_mut_slice()[100] = byte + 1;
        let unmap = std::thread::spawn(move || drop(first));
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: as above.
        let second = unsafe { p.map_store(second_store, 8 * PAGE, &opts) }.unwrap();
        assert_eq!(second.as_slice()[100], byte + 1, "{how}: the older byte");
        drop(second);
        unmap.join().unwrap();
    }
}

/// A store whose reads past page 3 take a second (readahead's), counted.
struct SlowReadAhead(MemoryStore, std::sync::atomic::AtomicUsize);

impl Store for SlowReadAhead {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if off >= 4 * PAGE as u64 {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(1));
        }
        self.0.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.0.write(off, buf)
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "slow-read-ahead"
    }
}

/// The release of a region's object waits for the pins on it (a readahead
/// run reading into it, reclaim writing one of its pages) before it
/// writes its dirty pages back; it listed them as owed to the store only
/// after that wait. A map of the store meanwhile found nothing to wait
/// for and read the store's older bytes (found by review). They are
/// listed first now.
#[test]
fn a_map_while_the_release_waits_for_readahead_sees_the_dirty_pages() {
    use std::sync::atomic::Ordering::SeqCst;
    let store = Arc::new(SlowReadAhead(
        MemoryStore::from_bytes(&vec![0x11u8; 64 * PAGE]).unwrap(),
        Default::default(),
    ));
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(32, 1)
        .build()
        .unwrap();
    // SAFETY: the store changes only through the engine's write-backs.
    let mut first = unsafe {
        p.map_store(
            store.clone() as Arc<dyn Store>,
            64 * PAGE,
            &MapOptions::default(),
        )
    }
    .unwrap();
    // Sequential faults: readahead reads what follows, slowly.
    for pg in 0..4 {
        assert_eq!(first.as_slice()[pg * PAGE], 0x11);
    }
    let t = std::time::Instant::now();
    while store.1.load(SeqCst) == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        store.1.load(SeqCst) > 0,
        "no readahead: the test tests nothing"
    );
    first.as_mut_slice()[100] = 0xAA;
    let unmap = std::thread::spawn(move || drop(first));
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: as above.
    let second = unsafe {
        p.map_store(
            store.clone() as Arc<dyn Store>,
            64 * PAGE,
            &MapOptions::default(),
        )
    }
    .unwrap();
    assert_eq!(
        second.as_slice()[100],
        0xAA,
        "the new region shows the older byte"
    );
    drop(second);
    unmap.join().unwrap();
}

/// Two regions over one store, the program's own reference to the store
/// dropped, then both regions: each object was kept, since the other held
/// the store, though nobody could map the store again. Their pages stayed
/// resident and their memfds and store open until newer objects pushed
/// them out (found by review). A store only kept objects hold is released
/// with them now.
#[test]
fn objects_of_a_store_nobody_can_map_again_are_not_kept() {
    let data = pattern_vec(3, PAGES * PAGE);
    let store = counted(&data);
    let p = pager(16, 1024, Delivery::InThread);
    let one = map_checked(&p, &store, &data, "one");
    let two = map_checked(&p, &store, &data, "two");
    drop(store);
    drop(one);
    drop(two);
    let st = p.stats();
    assert_eq!(st.resident_pages, 0, "kept for a store nobody holds\n{st}");
}

/// A read-only memory store whose `contents_stamp` (`.1`) or drop (`.2`)
/// panics while its flag is set.
struct Panicky(MemoryStore, Arc<AtomicBool>, Arc<AtomicBool>);

impl Panicky {
    fn store(data: &[u8], stamp: &Arc<AtomicBool>, drop: &Arc<AtomicBool>) -> Arc<dyn Store> {
        Arc::new(Panicky(
            MemoryStore::from_bytes(data).unwrap(),
            stamp.clone(),
            drop.clone(),
        ))
    }

    fn check(flag: &AtomicBool) {
        if flag.load(Relaxed) {
            panic!("the store's own code panics");
        }
    }
}

impl Drop for Panicky {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            Panicky::check(&self.2);
        }
    }
}

impl Store for Panicky {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.read(off, buf)
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
        Err(StoreError(libc::EROFS))
    }
    fn writable(&self) -> bool {
        false
    }
    fn signal_safe(&self) -> bool {
        true
    }
    fn contents_stamp(&self) -> Option<u64> {
        Panicky::check(&self.1);
        self.0.contents_stamp()
    }
    fn name(&self) -> &'static str {
        "panicky"
    }
}

/// A store that panics when a map asks whether its kept object is still
/// good: the kept object is released (its pages uncharged), not freed
/// while reclaim could still reach it. Before, the panic unwound with the
/// object's only reference and freed it in the rmap, its pages still
/// charged to the budget.
#[test]
fn a_store_that_panics_at_the_next_map_releases_its_kept_object() {
    let data = vec![0x5a; 8 * PAGE];
    let (panics, never) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let store = Panicky::store(&data, &panics, &never);
    let p = pager(16, 1024, Delivery::InThread);
    let opts = MapOptions {
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: nothing changes the store.
    let map = || unsafe { p.map_store(store.clone(), data.len(), &opts) };
    let r = map().unwrap();
    assert_eq!(r.as_slice(), &data[..]);
    drop(r);
    assert_eq!(p.stats().resident_pages, 8, "kept with its pages");
    panics.store(true, Relaxed);
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| map().map(drop)));
    assert!(again.is_err(), "the store's panic reaches the caller");
    panics.store(false, Relaxed);
    assert_eq!(
        p.stats().resident_pages,
        0,
        "the kept object was not released"
    );
    // The pager goes on: the store maps and reads again.
    assert_eq!(map().unwrap().as_slice(), &data[..]);
}

/// Two kept objects whose stores nobody else holds any more go together
/// at the next keep; the first one's store panics as it is dropped, the
/// last step of its release (the only store code a clean kept object's
/// release runs: whether a store takes writes is asked once, at map).
/// The second is still released (its pages uncharged), not dropped while
/// reclaim could reach it. Before, the unwind dropped the second with the
/// rest of the list: its 8 pages stayed charged.
#[test]
fn a_panic_releasing_one_kept_object_releases_the_others() {
    let data = vec![0x6b; 8 * PAGE];
    let p = pager(16, 1024, Delivery::InThread);
    let opts = MapOptions {
        writable: false,
        ..MapOptions::default()
    };
    let store = |flag: &Arc<AtomicBool>| Panicky::store(&data, &Arc::default(), flag);
    let map = |s: &Arc<dyn Store>| {
        // SAFETY: nothing changes the store.
        let r = unsafe { p.map_store(s.clone(), data.len(), &opts) }.unwrap();
        assert_eq!(r.as_slice(), &data[..]);
        r
    };
    let a_panics = Arc::new(AtomicBool::new(false));
    let never = Arc::new(AtomicBool::new(false));
    let (a, c, b) = (store(&a_panics), store(&never), store(&never));
    drop(map(&a));
    drop(map(&c));
    assert_eq!(p.stats().resident_pages, 16, "both kept");
    drop((a, c));
    let r = map(&b);
    a_panics.store(true, Relaxed);
    // The unmap of b's region keeps it, and lets the orphaned two go.
    let unmapped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(r)));
    assert!(unmapped.is_err(), "the store's panic reaches the caller");
    assert_eq!(
        p.stats().resident_pages,
        8,
        "b's 8 pages kept; a's and c's released"
    );
}
