//! Write-back of live regions: flush, unmap and drop of shared regions over
//! writable files and memory stores, private mappings that never write
//! back, and writes that land after a move, a grow or a protect round trip.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{FileStore, FileStoreOptions, MemoryStore, Store};
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions};
use util::*;

fn opts(kind: InstallKind) -> MapOptions {
    MapOptions {
        kind: Some(kind),
        ..MapOptions::default()
    }
}

fn writable_file_store(f: &TempFile) -> Arc<dyn Store> {
    Arc::new(
        FileStore::open(
            f.path(),
            &FileStoreOptions {
                writable: true,
                ..FileStoreOptions::default()
            },
        )
        .unwrap(),
    )
}

/// Shared regions over a writable file: flush writes the region's bytes to
/// the file; unmap and drop write back the rest.
#[test]
fn ops_flush_and_unmap_write_back_shared_file() {
    for d in DELIVERIES {
        let ctx = d.to_string();
        let p = pager(d);
        let pages = 32;
        let orig = pattern_vec(40, pages * PAGE);
        let f = TempFile::with_contents("flush", &orig);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region = unsafe {
            p.map_store(
                writable_file_store(&f),
                pages * PAGE,
                &opts(InstallKind::Shared),
            )
        }
        .unwrap();
        let mut want = orig.clone();
        region.as_mut_slice()[PAGE..3 * PAGE].fill(0xF1);
        want[PAGE..3 * PAGE].fill(0xF1);
        region.as_mut_slice()[10 * PAGE + 17] = 0xF2;
        want[10 * PAGE + 17] = 0xF2;
        region.flush().unwrap();
        assert_bytes(&f.read(), &want, &format!("{ctx}: after flush"));
        assert!(p.stats().get(Counter::WRITEBACK) >= 2, "{ctx}");

        // More writes, then unmap: written back too.
        let new = pattern_vec(41, 8 * PAGE);
        region.as_mut_slice()[20 * PAGE..28 * PAGE].copy_from_slice(&new);
        want[20 * PAGE..28 * PAGE].copy_from_slice(&new);
        region.as_mut_slice()[2 * PAGE] = 0xF3;
        want[2 * PAGE] = 0xF3;
        region.unmap().unwrap();
        assert_bytes(&f.read(), &want, &format!("{ctx}: after unmap"));

        // Remapped, the file's new contents come back; drop writes back.
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region = unsafe { p.map_file(f.path(), None, &opts(InstallKind::Shared)) }.unwrap();
        assert_bytes(region.as_slice(), &want, &format!("{ctx}: remapped"));
        region.as_mut_slice()[31 * PAGE..].fill(0xF4);
        want[31 * PAGE..].fill(0xF4);
        drop(region);
        assert_bytes(&f.read(), &want, &format!("{ctx}: after drop"));
    }
}

/// A file whose length is not a page multiple: write-back covers the
/// partial last page's file bytes and never changes the file's length.
#[test]
fn ops_write_back_partial_last_page() {
    for d in DELIVERIES {
        let p = pager(d);
        let flen = 5 * PAGE + 300;
        let orig = pattern_vec(50, flen);
        let f = TempFile::with_contents("partial-wb", &orig);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region = unsafe { p.map_file(f.path(), None, &opts(InstallKind::Shared)) }.unwrap();
        assert_eq!(region.len(), 6 * PAGE);
        let mut want = orig.clone();
        want.resize(6 * PAGE, 0);
        assert_bytes(region.as_slice(), &want, &format!("{d}: mapped"));
        // Write across the end of file.
        region.as_mut_slice()[5 * PAGE..].fill(0xC7);
        region.flush().unwrap();
        let mut file_want = orig.clone();
        file_want[5 * PAGE..].fill(0xC7);
        let now = f.read();
        assert_eq!(now.len(), flen, "{d}: flush changed the file length");
        assert_bytes(&now, &file_want, &format!("{d}: after flush"));
        region.unmap().unwrap();
        assert_bytes(&f.read(), &file_want, &format!("{d}: after unmap"));
    }
}

/// Private (anonymous-install) regions over a writable file never write
/// to it: not on flush, not on unmap, not when reclaim evicts their
/// written pages (those go to the region's own swap).
#[test]
fn ops_private_file_mapping_never_writes_back() {
    for d in DELIVERIES {
        let p = uffd_pager::Pager::builder()
            .delivery(d)
            .budget_pages(4)
            .build()
            .unwrap();
        let orig = pattern_vec(60, 16 * PAGE);
        let f = TempFile::with_contents("private", &orig);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region = unsafe {
            p.map_store(
                writable_file_store(&f),
                16 * PAGE,
                &opts(InstallKind::Anonymous),
            )
        }
        .unwrap();
        region.as_mut_slice().fill(0x6D);
        p.reclaim_pages(64);
        assert!(region.as_slice().iter().all(|&b| b == 0x6D));
        assert_bytes(&f.read(), &orig, &format!("{d}: after eviction"));
        region.flush().unwrap();
        assert_bytes(&f.read(), &orig, &format!("{d}: after flush"));
        region.unmap().unwrap();
        assert_bytes(&f.read(), &orig, &format!("{d}: after unmap"));
        assert!(
            p.stats().get(Counter::PGSTEAL) > 0,
            "{d}: nothing was evicted"
        );
    }
}

/// Flush over a memory store: the store holds the region's bytes.
#[test]
fn ops_flush_shared_memory_store() {
    let p = pager(Delivery::InThread);
    let orig = pattern_vec(70, 8 * PAGE);
    let store = Arc::new(MemoryStore::from_bytes(&orig).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region =
        unsafe { p.map_store(store.clone(), 8 * PAGE, &opts(InstallKind::Shared)) }.unwrap();
    region.as_mut_slice()[4 * PAGE..5 * PAGE].fill(0x70);
    let mut want = orig.clone();
    want[4 * PAGE..5 * PAGE].fill(0x70);
    region.flush().unwrap();
    assert_bytes(&store.snapshot(), &want, "after flush");
    assert_bytes(region.as_slice(), &want, "region after flush");
}

/// Dirty tracking survives a move: a page read (installed clean) before
/// the region moves and written after it must still be written back.
fn write_after_move_is_written_back(d: Delivery, before_move: Option<u8>) {
    let ctx = format!("{d}, before-move write {before_move:?}");
    let p = pager(d);
    let orig = pattern_vec(80, 8 * PAGE);
    let store = Arc::new(MemoryStore::from_bytes(&orig).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region =
        unsafe { p.map_store(store.clone(), 8 * PAGE, &opts(InstallKind::Shared)) }.unwrap();
    let mut want = orig.clone();
    // Every page present and clean (read faults).
    assert_bytes(region.as_slice(), &want, &format!("{ctx}: read"));
    if let Some(b) = before_move {
        // Dirty, then cleaned by a flush (which write-protects again).
        region.as_mut_slice()[..8 * PAGE].fill(b);
        want.fill(b);
        region.flush().unwrap();
        assert_bytes(&store.snapshot(), &want, &format!("{ctx}: first flush"));
    }
    region
        .remap_to(8 * PAGE, Some(free_range(8 * PAGE)))
        .unwrap();
    assert_bytes(region.as_slice(), &want, &format!("{ctx}: moved"));
    region.as_mut_slice()[2 * PAGE..4 * PAGE].fill(0x81);
    want[2 * PAGE..4 * PAGE].fill(0x81);
    region.flush().unwrap();
    assert_bytes(
        &store.snapshot(),
        &want,
        &format!("{ctx}: flushed after move"),
    );
    region.unmap().unwrap();
    assert_bytes(
        &store.snapshot(),
        &want,
        &format!("{ctx}: unmapped after move"),
    );
}

#[test]
fn ops_write_after_move_is_written_back() {
    for d in DELIVERIES {
        write_after_move_is_written_back(d, None);
        write_after_move_is_written_back(d, Some(0x80));
        write_after_grow_that_moves_is_written_back(d);
    }
}

/// As above, for a `remap` that grows a region whose neighbour blocks
/// in-place growth, so the kernel moves it.
fn write_after_grow_that_moves_is_written_back(d: Delivery) {
    let p = pager(d);
    let orig = pattern_vec(85, 16 * PAGE);
    let store = Arc::new(MemoryStore::from_bytes(&orig).unwrap());
    let at = free_range(16 * PAGE);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region = unsafe {
        p.map_store(
            store.clone(),
            8 * PAGE,
            &MapOptions {
                fixed_addr: Some(at),
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    // A neighbour right after the region.
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let _blocker = unsafe {
        p.map_store(
            Arc::new(MemoryStore::new(PAGE as u64).unwrap()),
            PAGE,
            &MapOptions {
                fixed_addr: Some(at + 8 * PAGE),
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    let mut want = orig.clone();
    assert_bytes(region.as_slice(), &want[..8 * PAGE], "read");
    region.remap(16 * PAGE).unwrap();
    assert_ne!(region.as_ptr() as usize, at, "{d}: growth did not move");
    region.as_mut_slice()[..2 * PAGE].fill(0x86);
    want[..2 * PAGE].fill(0x86);
    region.flush().unwrap();
    assert_bytes(
        &store.snapshot(),
        &want,
        &format!("{d}: flushed after moving grow"),
    );
}

/// Same for a region that shrinks in place and grows again (which may or
/// may not move it).
#[test]
fn ops_write_after_shrink_and_grow_is_written_back() {
    for d in DELIVERIES {
        let p = pager(d);
        let orig = pattern_vec(90, 16 * PAGE);
        let store = Arc::new(MemoryStore::from_bytes(&orig).unwrap());
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region =
            unsafe { p.map_store(store.clone(), 16 * PAGE, &opts(InstallKind::Shared)) }.unwrap();
        let mut want = orig.clone();
        assert_bytes(region.as_slice(), &want, "read");
        region.remap(8 * PAGE).unwrap();
        region.remap(16 * PAGE).unwrap();
        assert_bytes(region.as_slice(), &want, &format!("{d}: regrown"));
        region.as_mut_slice()[PAGE..2 * PAGE].fill(0x91);
        want[PAGE..2 * PAGE].fill(0x91);
        region.as_mut_slice()[12 * PAGE..13 * PAGE].fill(0x92);
        want[12 * PAGE..13 * PAGE].fill(0x92);
        region.flush().unwrap();
        assert_bytes(&store.snapshot(), &want, &format!("{d}: flushed"));
    }
}

/// protect(false) then protect(true) keeps dirty tracking: clean pages
/// written after the round trip, and dirty pages written before it, all
/// reach the store on flush.
#[test]
fn ops_protect_round_trip_keeps_write_back() {
    for d in DELIVERIES {
        let p = pager(d);
        let orig = pattern_vec(95, 8 * PAGE);
        let store = Arc::new(MemoryStore::from_bytes(&orig).unwrap());
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region =
            unsafe { p.map_store(store.clone(), 8 * PAGE, &opts(InstallKind::Shared)) }.unwrap();
        let mut want = orig.clone();
        assert_bytes(region.as_slice(), &want, "read");
        region.as_mut_slice()[..PAGE].fill(0xA1);
        want[..PAGE].fill(0xA1);
        region.protect(false).unwrap();
        assert_bytes(region.as_slice(), &want, &format!("{d}: read-only"));
        region.protect(true).unwrap();
        region.as_mut_slice()[5 * PAGE..6 * PAGE].fill(0xA2);
        want[5 * PAGE..6 * PAGE].fill(0xA2);
        region.as_mut_slice()[PAGE / 2] = 0xA3;
        want[PAGE / 2] = 0xA3;
        region.flush().unwrap();
        assert_bytes(&store.snapshot(), &want, &format!("{d}: flushed"));
        region.as_mut_slice()[7 * PAGE] = 0xA4;
        want[7 * PAGE] = 0xA4;
        drop(region);
        assert_bytes(&store.snapshot(), &want, &format!("{d}: dropped"));
    }
}

/// A `remap` the kernel refuses (here `RLIMIT_AS` stops the growth) leaves
/// the region as it was, dirty tracking included: the engine unregistered
/// the range for the move, which cleared the write protection of its clean
/// pages, so it must protect them again when it registers the range back.
/// Before, a write to such a page after the failed remap went unseen and
/// never reached the store.
///
/// The limit leaves the rest of the process room: the pager's threads may
/// still be starting while it is in force (an I/O worker maps its signal
/// stack as it starts, and aborts the process when it cannot), so the
/// limit sits `ROOM` above the process's size, and the growth asks for
/// four times that.
#[test]
fn ops_failed_remap_keeps_write_tracking() {
    let out = run_child("child_failed_remap_keeps_write_tracking", &[]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn child_failed_remap_keeps_write_tracking() {
    if !is_child() {
        return;
    }
    const ROOM: usize = 16 << 20;
    for d in DELIVERIES {
        let p = pager(d);
        let mut orig = vec![0u8; 8 * PAGE + 4 * ROOM];
        orig[..16 * PAGE].copy_from_slice(&pattern_vec(95, 16 * PAGE));
        let store = Arc::new(MemoryStore::from_bytes(&orig).unwrap());
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut region =
            unsafe { p.map_store(store.clone(), 8 * PAGE, &opts(InstallKind::Shared)) }.unwrap();
        let mut want = orig.clone();
        // Every page present and clean.
        assert_bytes(region.as_slice(), &want[..8 * PAGE], &format!("{d}: read"));
        let vm_size = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmSize:"))
            .map(|v| v.trim().trim_end_matches(" kB").parse::<u64>().unwrap() * 1024)
            .unwrap();
        let set = |soft: u64| {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: libc::RLIM_INFINITY,
            };
            // SAFETY: setrlimit reads the struct it is given.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
        };
        set(vm_size + ROOM as u64);
        let grown = region.remap(orig.len());
        set(libc::RLIM_INFINITY);
        assert!(
            matches!(
                grown,
                Err(uffd_pager::Error::Sys {
                    op: "mremap",
                    errno: libc::ENOMEM
                })
            ),
            "{d}: the growth was not refused by the kernel: {grown:?}"
        );
        assert_bytes(
            region.as_slice(),
            &want[..8 * PAGE],
            &format!("{d}: after the refused remap"),
        );
        region.as_mut_slice()[3 * PAGE..5 * PAGE].fill(0x96);
        want[3 * PAGE..5 * PAGE].fill(0x96);
        region.flush().unwrap();
        // (The head alone: a snapshot of the whole store is slow unoptimized.)
        let mut head = vec![0u8; 8 * PAGE];
        store.read(0, &mut head).unwrap();
        assert_bytes(
            &head,
            &want[..8 * PAGE],
            &format!("{d}: flushed after the refused remap"),
        );
    }
}

/// A store that reads the page it is given twice, 50 ms apart, and
/// counts the writes whose page changed between the two reads. Signal-safe
/// (a stack copy, `nanosleep`, atomics), so the engine lends it the page
/// itself rather than a copy in an I/O worker's buffer.
struct Watching {
    inner: MemoryStore,
    changed: std::sync::atomic::AtomicUsize,
    writes: std::sync::atomic::AtomicUsize,
}

impl Store for Watching {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), uffd_pager::store::StoreError> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), uffd_pager::store::StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let mut first = [0u8; PAGE];
        first.copy_from_slice(buf);
        std::thread::sleep(std::time::Duration::from_millis(50));
        if buf != first {
            self.changed.fetch_add(1, SeqCst);
        }
        self.writes.fetch_add(1, SeqCst);
        self.inner.write(offset, buf)
    }
    fn writable(&self) -> bool {
        true
    }
    fn signal_safe(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "watching"
    }
}

/// A page under a residency guard stays writable during a write-back (a
/// system call may be writing it): the store was lent a slice of that
/// memory, which changed while the store held it. It gets a copy now.
#[test]
fn a_guarded_page_is_written_back_from_a_copy() {
    use std::sync::atomic::Ordering::SeqCst;
    let p = pager(Delivery::InThread);
    let store = Arc::new(Watching {
        inner: MemoryStore::new(4 * PAGE as u64).unwrap(),
        changed: Default::default(),
        writes: Default::default(),
    });
    // SAFETY: only this region writes the store.
    let mut r =
        unsafe { p.map_store(store.clone(), 4 * PAGE, &opts(InstallKind::Shared)) }.unwrap();
    r.as_mut_slice()[0] = 1;
    let guard = r.lock_resident(0, PAGE).unwrap();
    let at = r.as_ptr() as usize;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0u8;
            while !stop.load(SeqCst) {
                n = n.wrapping_add(1);
                // SAFETY: the guard keeps page 0 mapped writable; the test
                // holds no slice of it meanwhile (as a system call's write
                // into it would).
                unsafe { std::ptr::write_volatile((at + 100) as *mut u8, n) };
            }
        });
        r.flush().unwrap();
        stop.store(true, SeqCst);
    });
    drop(guard);
    assert!(store.writes.load(SeqCst) >= 1);
    assert_eq!(
        store.changed.load(SeqCst),
        0,
        "the page changed under the store during its write"
    );
}

/// The deliveries the held-object tests run under.
fn deliveries() -> [Delivery; 3] {
    [
        Delivery::InThread,
        Delivery::Threads {
            threads: 1,
            spin_us: 0,
        },
        Delivery::PerRegion,
    ]
}

/// A pager with delivery `d` and a shared region of 4 pages over a memory
/// store of `0x11` bytes, with `0xAA` written at `PAGE + 100`.
fn dirty_shared_region(d: Delivery) -> (uffd_pager::Pager, Arc<dyn Store>, uffd_pager::Region) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&vec![0x11u8; 4 * PAGE]).unwrap());
    let p = pager(d);
    // SAFETY: the store changes only through the engine's write-backs.
    let mut r =
        unsafe { p.map_store(store.clone(), 4 * PAGE, &opts(InstallKind::Shared)) }.unwrap();
    r.as_mut_slice()[PAGE + 100] = 0xAA;
    (p, store, r)
}

/// The store's byte at `PAGE + 100`.
fn stored(store: &Arc<dyn Store>) -> u8 {
    let mut b = [0u8; 1];
    store.read((PAGE + 100) as u64, &mut b).unwrap();
    b[0]
}

/// The application's own `munmap` of all of `r`.
fn app_unmap(r: &uffd_pager::Region) {
    // SAFETY: the application gives the region's memory up itself.
    assert_eq!(
        unsafe { libc::munmap(r.as_ptr() as *mut libc::c_void, r.len()) },
        0
    );
}

/// The application unmaps a shared region (its own `munmap`) while a
/// residency guard holds the region's object: the guard's drop releases
/// the object, and writes its dirty pages back, later. A map of the same
/// store before that read the store's older bytes: nothing listed the
/// held object's pages as owed to the store (on the found-and-not-fixed
/// list since an earlier review). `unwritten_bytes` counts them now.
#[test]
fn a_map_while_a_guard_holds_an_unmapped_object_sees_its_dirty_pages() {
    for d in deliveries() {
        let (p, store, first) = dirty_shared_region(d);
        let guard = first.lock_resident(0, PAGE).unwrap();
        app_unmap(&first);
        // (`mapped` waits for the unmap's event to be applied.)
        assert!(first.mapped().is_empty());
        // (The written page, and the guarded one: a guarded page of a
        // writable region counts as dirty.)
        let owed = p.unwritten_bytes();
        assert!(owed >= PAGE as u64, "{d:?}: {owed} bytes owed while held");
        // SAFETY: as above.
        let second =
            unsafe { p.map_store(store.clone(), 4 * PAGE, &opts(InstallKind::Shared)) }.unwrap();
        assert_eq!(
            second.as_slice()[PAGE + 100],
            0xAA,
            "{d:?}: the new region shows the older byte"
        );
        assert_eq!(p.unwritten_bytes(), 0, "{d:?}: owed once written");
        drop(guard);
        drop(first);
        drop(second);
        assert_eq!(stored(&store), 0xAA, "{d:?}: after both regions went");
    }
}

/// The same held object, flushed through its region: `Region::flush` of a
/// region the application unmapped looked for its pages on the unwritten
/// list only, and said Ok with them unwritten.
#[test]
fn a_flush_while_a_guard_holds_an_unmapped_object_writes_its_pages() {
    for d in deliveries() {
        let (_p, store, first) = dirty_shared_region(d);
        let guard = first.lock_resident(0, PAGE).unwrap();
        app_unmap(&first);
        first.flush().unwrap();
        assert_eq!(stored(&store), 0xAA, "{d:?}: the store after the flush");
        drop(guard);
    }
}

/// `Region::unmap` with a residency guard alive writes the region's dirty
/// pages back and reports how that went, as its docs (and the C header's
/// `uffd_pager_region_unmap`) say: the guard's reference kept the object,
/// and the write waited for the guard's drop, which can only log a
/// failure (the store still held the older byte after the unmap).
#[test]
fn unmap_writes_back_while_a_guard_holds_the_object() {
    for d in deliveries() {
        let (_p, store, r) = dirty_shared_region(d);
        let guard = r.lock_resident_owned(0, PAGE, false).unwrap();
        r.unmap().unwrap();
        assert_eq!(stored(&store), 0xAA, "{d:?}: written at the unmap");
        drop(guard);
        assert_eq!(stored(&store), 0xAA, "{d:?}: after the guard");
    }
}
