//! Stores in ordinary Rust: a store that is not signal-safe may allocate,
//! lock and log on every call, and the engine calls it only from its I/O
//! worker threads, even under in-thread delivery (where every fault is
//! handled in the faulting thread's SIGBUS handler). Readahead windows and
//! write-back batches reach such a store as one call each.

#[path = "engine_util.rs"]
mod util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use uffd_pager::store::{Store, StoreError, MAX_BATCH};
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager};
use util::PAGE;

/// Page `p` at version `v` holds this byte everywhere (never 0, so a lost
/// or zero page is caught).
fn fill_byte(p: usize, v: u64) -> u8 {
    ((p as u64).wrapping_mul(31).wrapping_add(v.wrapping_mul(7)) % 251 + 1) as u8
}

/// A store the way an application writes one: a `Mutex<HashMap>` of boxed
/// pages, a log line per call, and a record of which threads called it and
/// how many pages each batch carried.
struct Ordinary {
    pages: Mutex<HashMap<u64, Box<[u8]>>>,
    len: u64,
    /// Calls made from a thread that is not one of the engine's I/O
    /// workers or readahead threads (a faulting thread, say).
    foreign_calls: AtomicUsize,
    read_many_calls: AtomicUsize,
    largest_read_batch: AtomicUsize,
    write_many_calls: AtomicUsize,
    largest_write_batch: AtomicUsize,
    calls: AtomicU64,
}

impl Ordinary {
    fn new(npages: usize) -> Ordinary {
        let pages = (0..npages)
            .map(|p| (p as u64, vec![fill_byte(p, 0); PAGE].into_boxed_slice()))
            .collect();
        Ordinary {
            pages: Mutex::new(pages),
            len: (npages * PAGE) as u64,
            foreign_calls: AtomicUsize::new(0),
            read_many_calls: AtomicUsize::new(0),
            largest_read_batch: AtomicUsize::new(0),
            write_many_calls: AtomicUsize::new(0),
            largest_write_batch: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
        }
    }

    /// Allocates (the name, the log line), logs, and records the caller.
    fn enter(&self, what: &str, off: u64) {
        let name = std::thread::current().name().unwrap_or("").to_string();
        if !(name.starts_with("uffd-io-") || name.starts_with("uffd-readahead-")) {
            self.foreign_calls.fetch_add(1, Relaxed);
        }
        self.calls.fetch_add(1, Relaxed);
        tracing::info!(thread = %name, what, page = off / PAGE as u64, "store call");
    }
}

impl Store for Ordinary {
    fn len(&self) -> u64 {
        self.len
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.enter("read", off);
        let pages = self.pages.lock().unwrap();
        let page = pages
            .get(&(off / PAGE as u64))
            .ok_or(StoreError(libc::EIO))?;
        buf.copy_from_slice(&page[..buf.len()]);
        Ok(())
    }
    fn read_many(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.read_many_calls.fetch_add(1, Relaxed);
        self.largest_read_batch.fetch_max(buf.len() / PAGE, Relaxed);
        for (k, page) in buf.chunks_mut(PAGE).enumerate() {
            self.read(off + (k * PAGE) as u64, page)?;
        }
        Ok(())
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.enter("write", off);
        let copy: Box<[u8]> = buf.into();
        self.pages.lock().unwrap().insert(off / PAGE as u64, copy);
        Ok(())
    }
    fn write_many(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        self.write_many_calls.fetch_add(1, Relaxed);
        self.largest_write_batch.fetch_max(pages.len(), Relaxed);
        for (off, page) in pages {
            self.write(*off, page)?;
        }
        Ok(())
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "ordinary"
    }
}

/// A shared region of `npages` pages over `store`.
fn map_shared(
    pager: &Pager,
    store: Arc<dyn Store>,
    npages: usize,
    writable: bool,
) -> uffd_pager::Region {
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    unsafe { pager.map_store(store, npages * PAGE, &opts) }.unwrap()
}

/// Logs go through a real subscriber (formatting allocates, the writer
/// locks), written to nowhere.
fn install_logger() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::sink)
        .try_init();
}

#[test]
fn an_allocating_locking_logging_store_serves_a_million_in_thread_faults() {
    install_logger();
    const NPAGES: usize = 2048;
    const THREADS: usize = 4;
    const FAULTS: u64 = 1_000_000;
    let store = Arc::new(Ordinary::new(NPAGES));
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(128)
        .readahead(0, 0)
        .fault_around(0)
        .build()
        .unwrap();
    let region = map_shared(&pager, store.clone(), NPAGES, true);
    let base = region.as_ptr() as usize;
    // Page p is owned (written) by thread p % THREADS; its version lives
    // here and only its owner changes it.
    let versions: Arc<Vec<AtomicU64>> = Arc::new((0..NPAGES).map(|_| AtomicU64::new(0)).collect());
    let checked = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (versions, pager, checked) = (versions.clone(), &pager, &checked);
            s.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                while pager.stats().get(Counter::PGFAULT) < FAULTS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let p = (x as usize % (NPAGES / THREADS)) * THREADS + t;
                    // SAFETY: in bounds of the live region; only this
                    // thread writes page p, and nobody else reads it.
                    let page = unsafe {
                        std::slice::from_raw_parts_mut((base + p * PAGE) as *mut u8, PAGE)
                    };
                    let v = versions[p].load(Relaxed);
                    let want = fill_byte(p, v);
                    if let Some(i) = page.iter().position(|&b| b != want) {
                        panic!("page {p} v{v}: byte {i} is {:#x}, want {want:#x}", page[i]);
                    }
                    checked.fetch_add(1, Relaxed);
                    if x.is_multiple_of(4) {
                        page.fill(fill_byte(p, v + 1));
                        versions[p].store(v + 1, Relaxed);
                    }
                }
            });
        }
    });
    let st = pager.stats();
    assert!(st.get(Counter::PGFAULT) >= FAULTS);
    assert!(
        st.get(Counter::WRITEBACK) > 0,
        "dirty pages were written back"
    );
    assert_eq!(
        store.foreign_calls.load(Relaxed),
        0,
        "a store that is not signal-safe is called only by the engine's I/O threads"
    );
    // Every byte of the region and of the store after the final write-back.
    // (The region first: reading it faults, and the store's lock must not
    // be held by the faulting thread then, as with any store of this kind.)
    for p in 0..NPAGES {
        let want = fill_byte(p, versions[p].load(Relaxed));
        let page = &region.as_slice()[p * PAGE..(p + 1) * PAGE];
        assert!(page.iter().all(|&b| b == want), "region page {p}");
    }
    region.flush().unwrap();
    let stored = store.pages.lock().unwrap();
    for p in 0..NPAGES {
        let want = fill_byte(p, versions[p].load(Relaxed));
        assert!(
            stored[&(p as u64)].iter().all(|&b| b == want),
            "stored page {p}"
        );
    }
    eprintln!(
        "{} faults, {} pages checked, {} store calls",
        st.get(Counter::PGFAULT),
        checked.load(Relaxed),
        store.calls.load(Relaxed)
    );
}

#[test]
fn a_readahead_window_reaches_the_store_as_one_call() {
    install_logger();
    const NPAGES: usize = 1024;
    let store = Arc::new(Ordinary::new(NPAGES));
    // Windows twice the batch: each is split into runs of MAX_BATCH pages.
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(2 * MAX_BATCH as u32, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let region = map_shared(&pager, store.clone(), NPAGES, false);
    for p in 0..NPAGES {
        let page = &region.as_slice()[p * PAGE..(p + 1) * PAGE];
        assert!(page.iter().all(|&b| b == fill_byte(p, 0)), "page {p}");
    }
    let st = pager.stats();
    let (calls, largest) = (
        store.read_many_calls.load(Relaxed),
        store.largest_read_batch.load(Relaxed),
    );
    eprintln!(
        "{} readahead pages in {calls} read_many calls (largest {largest}); {} store calls",
        st.get(Counter::RA_PAGES),
        store.calls.load(Relaxed)
    );
    assert!(
        st.get(Counter::RA_PAGES) > NPAGES as u64 / 2,
        "readahead ran"
    );
    assert!(
        calls > 0 && largest > 1,
        "windows went to the store as batches"
    );
    assert_eq!(
        largest, MAX_BATCH,
        "a window longer than a batch fills whole batches"
    );
    assert_eq!(store.foreign_calls.load(Relaxed), 0);
}

#[test]
fn a_write_back_reaches_the_store_in_batches() {
    install_logger();
    const NPAGES: usize = 200;
    let store = Arc::new(Ordinary::new(NPAGES));
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let mut region = map_shared(&pager, store.clone(), NPAGES, true);
    for p in (0..NPAGES).filter(|p| p % 3 != 0) {
        region.as_mut_slice()[p * PAGE..(p + 1) * PAGE].fill(fill_byte(p, 1));
    }
    region.flush().unwrap();
    let (calls, largest) = (
        store.write_many_calls.load(Relaxed),
        store.largest_write_batch.load(Relaxed),
    );
    eprintln!("write-back: {calls} write_many calls, largest {largest}");
    assert_eq!(largest, MAX_BATCH, "full batches of dirty pages");
    assert!(calls >= (NPAGES * 2 / 3).div_ceil(MAX_BATCH));
    let stored = store.pages.lock().unwrap();
    for p in 0..NPAGES {
        let want = fill_byte(p, u64::from(p % 3 != 0));
        assert!(stored[&(p as u64)].iter().all(|&b| b == want), "page {p}");
    }
    assert_eq!(store.foreign_calls.load(Relaxed), 0);
}

#[test]
fn anonymous_regions_swap_to_the_stores_swap_to_makes() {
    install_logger();
    const NPAGES: usize = 512;
    let made: Arc<Mutex<Vec<Arc<Ordinary>>>> = Arc::default();
    // SAFETY: each swap store is made for one region; the test keeps them
    // to read their call counts, never to write their bytes.
    let pager = unsafe {
        Pager::builder()
            .delivery(Delivery::InThread)
            .budget_pages(64)
            .swap_to({
                let made = made.clone();
                move |len| {
                    let s = Arc::new(Ordinary::new(len / PAGE));
                    made.lock().unwrap().push(s.clone());
                    Ok(s as Arc<dyn Store>)
                }
            })
    }
    .build()
    .unwrap();
    let mut region = pager.map_anonymous(NPAGES * PAGE).unwrap();
    for p in 0..NPAGES {
        region.as_mut_slice()[p * PAGE..(p + 1) * PAGE].fill(fill_byte(p, 5));
    }
    for p in 0..NPAGES {
        let page = &region.as_slice()[p * PAGE..(p + 1) * PAGE];
        assert!(page.iter().all(|&b| b == fill_byte(p, 5)), "page {p}");
    }
    let made = made.lock().unwrap();
    assert_eq!(made.len(), 1, "one swap store per anonymous region");
    let swap = &made[0];
    assert!(
        swap.calls.load(Relaxed) >= (NPAGES - 64) as u64,
        "pages went to swap and back"
    );
    assert_eq!(swap.foreign_calls.load(Relaxed), 0);
    assert!(pager.stats().get(Counter::WRITEBACK) >= (NPAGES - 64) as u64);

    // A maker that fails, or a store too small, fails the map call.
    // SAFETY: the maker keeps no store it returns (the map fails anyway).
    let failing =
        unsafe { Pager::builder().swap_to(|_| Err(std::io::Error::other("no swap here"))) }
            .build()
            .unwrap();
    let e = failing.map_anonymous(4 * PAGE).unwrap_err();
    assert!(e.to_string().contains("swap"), "{e}");
    // SAFETY: the maker keeps no store it returns (the map fails anyway).
    let small =
        unsafe { Pager::builder().swap_to(|_| Ok(Arc::new(Ordinary::new(1)) as Arc<dyn Store>)) }
            .build()
            .unwrap();
    let e = small.map_anonymous(4 * PAGE).unwrap_err();
    assert!(e.to_string().contains("swap store"), "{e}");
}

/// A store whose writes fail while `down` is set, counting write calls.
struct Flaky {
    inner: Ordinary,
    down: std::sync::atomic::AtomicBool,
    write_calls: AtomicUsize,
}

impl Store for Flaky {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.write_many(&[(off, buf)])
    }
    fn write_many(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        self.write_calls.fetch_add(1, Relaxed);
        if self.down.load(Relaxed) {
            return Err(StoreError(libc::EIO));
        }
        self.inner.write_many(pages)
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "flaky"
    }
}

#[test]
fn a_failed_write_back_stops_at_its_first_batch_and_keeps_every_page_dirty() {
    install_logger();
    const NPAGES: usize = 200;
    let store = Arc::new(Flaky {
        inner: Ordinary::new(NPAGES),
        down: std::sync::atomic::AtomicBool::new(true),
        write_calls: AtomicUsize::new(0),
    });
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let mut region = map_shared(&pager, store.clone(), NPAGES, true);
    for p in 0..NPAGES {
        region.as_mut_slice()[p * PAGE..(p + 1) * PAGE].fill(fill_byte(p, 9));
    }
    assert!(region.flush().is_err(), "the store is down");
    assert_eq!(
        store.write_calls.load(Relaxed),
        1,
        "a store that is down is asked once, not once per batch"
    );
    // Back up: every page is still dirty and goes out now.
    store.down.store(false, Relaxed);
    region.flush().unwrap();
    let stored = store.inner.pages.lock().unwrap();
    for p in 0..NPAGES {
        assert!(
            stored[&(p as u64)].iter().all(|&b| b == fill_byte(p, 9)),
            "page {p}"
        );
    }
}

/// A disk file behind a counter of store calls: what the engine asks of it.
struct CountedFile {
    inner: uffd_pager::store::FileStore,
    /// Calls that read (`read`, `read_many`, `read_to_fd`).
    calls: AtomicU64,
    /// Most pages one call read.
    largest: AtomicUsize,
}

impl CountedFile {
    fn note(&self, bytes: usize) {
        self.calls.fetch_add(1, Relaxed);
        self.largest.fetch_max(bytes / PAGE, Relaxed);
    }
}

impl Store for CountedFile {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.note(buf.len());
        self.inner.read(offset, buf)
    }
    fn read_many(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.note(buf.len());
        self.inner.read_many(offset, buf)
    }
    fn read_to_fd(
        &self,
        offset: u64,
        len: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        fd_offset: u64,
    ) -> Result<(), StoreError> {
        self.note(len);
        self.inner.read_to_fd(offset, len, fd, fd_offset)
    }
    fn batches_reads(&self) -> bool {
        self.inner.batches_reads()
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write(offset, buf)
    }
    fn writable(&self) -> bool {
        self.inner.writable()
    }
    fn signal_safe(&self) -> bool {
        self.inner.signal_safe()
    }
    fn name(&self) -> &'static str {
        "counted file"
    }
}

/// A file on a disk is read ahead a window per `pread` (one request to the
/// device), not a page per `pread`: a sequential reader of an `O_DIRECT`
/// file then waits for a request per window, as under the kernel's
/// readahead. (Before, a signal-safe store got its window a page at a
/// time: 32 requests for 32 pages.)
#[test]
fn a_disk_files_readahead_window_is_one_read() {
    const NPAGES: usize = 1024;
    let path = std::env::temp_dir().join(format!("uffd-ra-window-{}.bin", std::process::id()));
    let data: Vec<u8> = (0..NPAGES * PAGE).map(|o| fill_byte(o / PAGE, 3)).collect();
    std::fs::write(&path, &data).unwrap();
    let inner = uffd_pager::store::FileStore::open(
        &path,
        &uffd_pager::store::FileStoreOptions {
            direct: true,
            ..Default::default()
        },
    );
    let _ = std::fs::remove_file(&path);
    let inner = inner.unwrap();
    if !inner.batches_reads() {
        eprintln!("skipped: {} is not on a disk", path.display());
        return;
    }
    let store = Arc::new(CountedFile {
        inner,
        calls: AtomicU64::new(0),
        largest: AtomicUsize::new(0),
    });
    for d in [Delivery::InThread, util::THREADS] {
        store.calls.store(0, Relaxed);
        let pager = Pager::builder()
            .delivery(d)
            .budget_pages(4096)
            .readahead(MAX_BATCH as u32, 1)
            .keep_unmapped(0)
            .build()
            .unwrap();
        let region = map_shared(&pager, store.clone(), NPAGES, false);
        for p in 0..NPAGES {
            let page = &region.as_slice()[p * PAGE..(p + 1) * PAGE];
            assert!(page.iter().all(|&b| b == fill_byte(p, 3)), "{d}: page {p}");
        }
        let calls = store.calls.load(Relaxed);
        let ra = pager.stats().get(Counter::RA_PAGES);
        eprintln!(
            "{d}: {NPAGES} pages in {calls} reads (largest {}), {ra} read ahead",
            store.largest.load(Relaxed)
        );
        assert!(ra > NPAGES as u64 / 2, "{d}: readahead ran ({ra} pages)");
        // (A reader that overtakes readahead reads its own pages one by
        // one, so the count depends on timing; a page at a time it would
        // be one call per page.)
        assert!(
            store.largest.load(Relaxed) > 1 && calls <= (NPAGES / 2) as u64,
            "{d}: {calls} reads for {NPAGES} pages: the windows went a page at a time"
        );
    }
}

/// A swap store that is not signal-safe: memory, with a record of each
/// `discard` (the calling thread's name, offset and length, and the
/// writes done by then), which takes `discard_ms`; a write takes
/// `write_ms`.
struct SwapRecorder {
    inner: uffd_pager::store::MemoryStore,
    discards: Mutex<Vec<(String, u64, u64, usize)>>,
    discard_ms: u64,
    write_ms: u64,
    writes: AtomicUsize,
}

impl Store for SwapRecorder {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        std::thread::sleep(std::time::Duration::from_millis(self.write_ms));
        self.writes.fetch_add(1, SeqCst);
        self.inner.write(off, buf)
    }
    fn discard(&self, off: u64, len: u64) {
        let name = std::thread::current().name().unwrap_or("").to_string();
        let writes = self.writes.load(SeqCst);
        self.discards.lock().unwrap().push((name, off, len, writes));
        std::thread::sleep(std::time::Duration::from_millis(self.discard_ms));
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "swap-recorder"
    }
}

/// An in-thread pager of 64 pages, no readahead, whose anonymous regions
/// swap to [`SwapRecorder`]s (the last one made is in `made`).
fn recorded_swap_pager(
    (discard_ms, write_ms): (u64, u64),
    io_timeout: std::time::Duration,
    made: Arc<Mutex<Option<Arc<SwapRecorder>>>>,
) -> Pager {
    let make = move |len: usize| -> std::io::Result<Arc<dyn Store>> {
        let s = Arc::new(SwapRecorder {
            inner: uffd_pager::store::MemoryStore::new(len as u64)?,
            discards: Mutex::new(Vec::new()),
            discard_ms,
            write_ms,
            writes: AtomicUsize::new(0),
        });
        *made.lock().unwrap() = Some(s.clone());
        Ok(s)
    };
    // SAFETY: each swap store is made here; the test only reads its record.
    let b = unsafe { Pager::builder().swap_to(make) };
    b.delivery(Delivery::InThread)
        .budget_pages(64)
        .readahead(0, 1)
        .fault_around(0)
        .io_timeout(io_timeout)
        .build()
        .unwrap()
}

/// Writes pages 1000 and 1003 of a 1 GiB anonymous region and evicts them
/// to swap.
fn two_pages_in_swap(pager: &Pager) -> uffd_pager::Region {
    let mut region = pager.map_anonymous(1 << 30).unwrap();
    for p in [1000, 1003] {
        region.as_mut_slice()[p * PAGE..(p + 1) * PAGE].fill(fill_byte(p, 1));
    }
    for _ in 0..100 {
        if pager.stats().get(Counter::WRITEBACK) >= 2 {
            break;
        }
        pager.reclaim_pages(64);
    }
    assert!(
        pager.stats().get(Counter::WRITEBACK) >= 2,
        "{}",
        pager.stats()
    );
    region
}

/// A region that swapped to a store that is not signal-safe tells it to
/// forget what went there when it goes: once, on an I/O worker, over the
/// pages from the first to the last that went to swap. (The first version
/// called the store on the releasing thread, over the whole region: a
/// round trip per 64 pages of a Redis namespace however little went
/// there. Found by review.)
#[test]
fn a_region_that_goes_has_its_swap_store_forget_only_what_went_there() {
    let made = Arc::new(Mutex::new(None));
    let pager = recorded_swap_pager((0, 0), std::time::Duration::from_secs(10), made.clone());
    let region = two_pages_in_swap(&pager);
    for p in [1000, 1003] {
        assert_eq!(region.as_slice()[p * PAGE + 9], fill_byte(p, 1), "page {p}");
    }
    drop(region);
    let store = made.lock().unwrap().take().unwrap();
    let d = store.discards.lock().unwrap().clone();
    assert_eq!(d.len(), 1, "{d:?}");
    let (thread, off, len, _) = &d[0];
    assert!(thread.starts_with("uffd-io-"), "called on {thread:?}");
    assert_eq!((*off, *len), (1000 * PAGE as u64, 4 * PAGE as u64));
}

/// A swap store's discard that takes longer than the I/O timeout is given
/// up on: the region's drop returns after the timeout, not after the
/// store (it waited the store's 4 s before).
#[test]
fn a_slow_swap_discard_holds_up_a_drop_no_longer_than_the_io_timeout() {
    let made = Arc::new(Mutex::new(None));
    let pager = recorded_swap_pager((4000, 0), std::time::Duration::from_millis(200), made);
    let region = two_pages_in_swap(&pager);
    let t = std::time::Instant::now();
    drop(region);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "the drop took {:?}",
        t.elapsed()
    );
}

/// A swap write given up on (past the I/O timeout) still lands, later: the
/// page it was for stays dirty, not in swap, yet its copy reaches the
/// store. The release tells the store to forget that page too, once the
/// write is done. Before, with no page in swap the store was told nothing,
/// and the late write's copy stayed (found by review).
#[test]
fn a_swap_write_given_up_on_is_forgotten_once_it_lands() {
    let made = Arc::new(Mutex::new(None));
    let pager = recorded_swap_pager(
        (0, 300),
        std::time::Duration::from_millis(200),
        made.clone(),
    );
    let mut region = pager.map_anonymous(1 << 20).unwrap();
    region.as_mut_slice()[200 * PAGE] = 1;
    pager.reclaim_pages(64);
    assert!(
        pager.stats().get(Counter::IO_ERROR) >= 1,
        "{}",
        pager.stats()
    );
    drop(region);
    let store = made.lock().unwrap().take().unwrap();
    let d = store.discards.lock().unwrap().clone();
    assert_eq!(d.len(), 1, "{d:?}");
    let (_, off, len, writes) = &d[0];
    assert_eq!((*off, *len), (200 * PAGE as u64, PAGE as u64));
    assert_eq!(*writes, 1, "the late write landed before the discard");
}
