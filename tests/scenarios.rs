//! Scripted, deterministic scenarios that pin down the counter semantics of
//! each policy (`kernel-model.md`), on real userfaultfd faults.
//!
//! Each scenario drives one fault through a store whose read blocks at a
//! gate the test opens, while the test plays the global-lock writer; each
//! runs on a region of 4 KiB pages and on one of 2 MiB pages (the tests
//! reserve the huge pages as root, see `huge_util.rs`).

#[path = "huge_util.rs"]
mod huge_util;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uffd_pager::store::{MemoryStore, Store, StoreError};
use uffd_pager::{Counter, Delivery, MapOptions, Pager, Policy, PolicyKind, Region};

/// Scenarios share process-wide hooks: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());
const PAGE: usize = 4096;
const HUGE: usize = uffd_pager::HUGE_PAGE_SIZE;
/// Both page sizes each scenario runs with.
const SIZES: [usize; 2] = [PAGE, HUGE];

/// The huge pages a scenario of `page`-byte pages needs, reserved.
fn pool_for(page: usize) -> Option<huge_util::HugePool> {
    (page == HUGE).then(|| huge_util::HugePool::take(6))
}

/// A memory store whose reads wait until the gate opens.
struct GateStore {
    inner: MemoryStore,
    open: AtomicBool,
    entered: AtomicU64,
}

impl GateStore {
    fn new(pages: usize, page: usize) -> Arc<GateStore> {
        let data: Vec<u8> = (0..pages * page).map(|i| (i / page + 1) as u8).collect();
        Arc::new(GateStore {
            inner: MemoryStore::from_bytes(&data).unwrap(),
            open: AtomicBool::new(false),
            entered: AtomicU64::new(0),
        })
    }
}

impl Store for GateStore {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.entered.fetch_add(1, SeqCst);
        // (Bounded: a test that failed before it opened the gate would
        // wait here for ever in its pager's drop.)
        let t = std::time::Instant::now();
        while !self.open.load(SeqCst) && t.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::yield_now();
        }
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write(off, buf)
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "gate"
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::yield_now();
    }
}

struct Setup {
    pager: Pager,
    region: Region,
    store: Arc<GateStore>,
}

fn setup(policy: PolicyKind, delivery: Delivery, page: usize) -> Setup {
    let pager = Pager::builder()
        .policy(Policy::new(policy))
        .delivery(delivery)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let store = GateStore::new(4, page);
    let opts = MapOptions {
        page_size: page,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { pager.map_store(store.clone(), 4 * page, &opts) }.unwrap();
    pager.reset_stats();
    Setup {
        pager,
        region,
        store,
    }
}

/// Touches page 0 from a new thread; returns the byte read.
fn touch(region: &Region) -> std::thread::JoinHandle<u8> {
    let addr = region.as_ptr() as usize;
    std::thread::spawn(move || {
        // SAFETY: the region outlives the thread (joined before drop).
        unsafe { std::ptr::read_volatile(addr as *const u8) }
    })
}

fn both_deliveries() -> [Delivery; 2] {
    [
        Delivery::InThread,
        Delivery::Threads {
            threads: 1,
            spin_us: 0,
        },
    ]
}

/// Each page size with each delivery.
fn sizes_and_deliveries() -> impl Iterator<Item = (usize, Delivery)> {
    SIZES
        .into_iter()
        .flat_map(|p| both_deliveries().into_iter().map(move |d| (p, d)))
}

#[test]
fn vanilla_retries_once_then_contends_on_the_global_lock() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (page, d) in sizes_and_deliveries() {
        let _pool = pool_for(page);
        let s = setup(PolicyKind::Vanilla, d, page);
        let t = touch(&s.region);
        wait_until("the read to start", || s.store.entered.load(SeqCst) == 1);
        let w = s.pager.hold_global_write();
        s.store.open.store(true, SeqCst);
        wait_until("the fault to queue on the global lock", || {
            s.pager.global_readers_sleeping() == 1
        });
        drop(w);
        assert_eq!(t.join().unwrap(), 1, "page 0 holds 1s");
        let st = s.pager.stats();
        assert_eq!(st.get(Counter::VMA_LOCK_RETRY), 1, "{d}\n{st}");
        assert_eq!(st.get(Counter::VMA_LOCK_SUCCESS), 0, "{d}\n{st}");
        assert_eq!(st.get(Counter::RETRY_MMAP_DROP), 1, "{d}\n{st}");
        assert_eq!(st.get(Counter::RETRY_IO_MISS), 0, "{d}\n{st}");
        assert_eq!(st.get(Counter::PGMAJFAULT), 1, "{d}\n{st}");
        assert_eq!(st.global.read_contended, 1, "{d}\n{st}");
        assert_eq!(s.store.entered.load(SeqCst), 1, "one store read");
    }
}

#[test]
fn retry_once_completes_under_the_region_lock() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (page, d) in sizes_and_deliveries() {
        let _pool = pool_for(page);
        let s = setup(PolicyKind::RetryOnce, d, page);
        let t = touch(&s.region);
        wait_until("the read to start", || s.store.entered.load(SeqCst) == 1);
        let w = s.pager.hold_global_write();
        s.store.open.store(true, SeqCst);
        // The fault completes while the writer still holds the global lock.
        assert_eq!(t.join().unwrap(), 1);
        drop(w);
        let st = s.pager.stats();
        assert_eq!(st.get(Counter::VMA_LOCK_RETRY), 1, "{d}\n{st}");
        assert_eq!(st.get(Counter::VMA_LOCK_SUCCESS), 1, "{d}\n{st}");
        assert_eq!(st.get(Counter::RETRY_MMAP_DROP), 1, "{d}\n{st}");
        assert_eq!(st.global.read_acquisitions, 0, "{d}\n{st}");
        assert_eq!(st.get(Counter::PGMAJFAULT), 1, "{d}\n{st}");
    }
}

#[test]
fn global_only_takes_the_global_lock_twice_for_a_major_fault() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for page in SIZES {
        let _pool = pool_for(page);
        let s = setup(PolicyKind::GlobalOnly, Delivery::InThread, page);
        s.store.open.store(true, SeqCst);
        assert_eq!(touch(&s.region).join().unwrap(), 1);
        let st = s.pager.stats();
        assert_eq!(st.global.read_acquisitions, 2, "{page}\n{st}");
        assert_eq!(st.get(Counter::RETRY_MMAP_DROP), 1, "{page}\n{st}");
        assert_eq!(st.get(Counter::VMA_LOCK_SUCCESS), 0, "{page}\n{st}");
        assert_eq!(st.get(Counter::VMA_LOCK_RETRY), 0, "{page}\n{st}");
    }
}

#[test]
fn write_locked_region_aborts_to_the_global_lock() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (page, d) in sizes_and_deliveries() {
        let _pool = pool_for(page);
        let s = setup(PolicyKind::RetryOnce, d, page);
        s.store.open.store(true, SeqCst);
        let hold = s
            .pager
            .hold_region_write(&s.region)
            .expect("region is mapped");
        let t = touch(&s.region);
        wait_until("the fault to queue on the global lock", || {
            s.pager.global_readers_sleeping() == 1
        });
        drop(hold);
        assert_eq!(t.join().unwrap(), 1);
        let st = s.pager.stats();
        assert_eq!(st.get(Counter::VMA_LOCK_ABORT), 1, "{d}\n{st}");
        assert_eq!(st.get(Counter::VMA_LOCK_SUCCESS), 0, "{d}\n{st}");
        assert_eq!(st.global.read_contended, 1, "{d}\n{st}");
    }
}

static TARGET: AtomicUsize = AtomicUsize::new(0);
static HOOK_CALLS: AtomicUsize = AtomicUsize::new(0);

fn wait_for_detach(v: &uffd_pager::testing::Site<'_>) {
    if v.start() != TARGET.load(SeqCst) {
        return;
    }
    if HOOK_CALLS.fetch_add(1, SeqCst) == 0 {
        // First lookup: let the remap detach this region before we lock it.
        let t = Instant::now();
        while !v.is_detached() && t.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
    }
}

#[test]
fn region_detached_during_lookup_counts_a_miss() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // (4 KiB only: a region of 2 MiB pages cannot be remapped.)
    let mut s = setup(PolicyKind::RetryOnce, Delivery::InThread, PAGE);
    s.store.open.store(true, SeqCst);
    TARGET.store(s.region.as_ptr() as usize, SeqCst);
    HOOK_CALLS.store(0, SeqCst);
    uffd_pager::testing::set_after_lookup(Some(wait_for_detach));
    let t = touch(&s.region);
    wait_until("the lookup", || HOOK_CALLS.load(SeqCst) >= 1);
    // Same length: the kernel keeps the range; the engine still replaces
    // the region, detaching the old one.
    s.region.remap(4 * PAGE).unwrap();
    let v = t.join().unwrap();
    uffd_pager::testing::set_after_lookup(None);
    assert_eq!(v, 1);
    let st = s.pager.stats();
    assert!(st.get(Counter::VMA_LOCK_MISS) >= 1, "{st}");
    assert_eq!(s.region.as_slice()[PAGE], 2, "data intact after remap");
}

/// A retried fault that finds a page no I/O brought in (an anonymous page
/// never swapped out: a zero-page fill) is no Miss/Drop miss. Under
/// `retry-once-tried` the second region attempt always has `tried`; with
/// the global lock held both region attempts give up before the page
/// (`__vmf_anon_prepare`), and the global attempt counted
/// `RETRY_IO_MISS` for a zero fill.
#[test]
fn a_zero_fill_after_a_retry_is_no_io_miss() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for d in both_deliveries() {
        let pager = Pager::builder()
            .policy(Policy::new(PolicyKind::RetryOnceTried))
            .delivery(d)
            .readahead(0, 1)
            .fault_around(0)
            .build()
            .unwrap();
        let region = pager.map_anonymous(4 * PAGE).unwrap();
        pager.reset_stats();
        let w = pager.hold_global_write();
        let t = touch(&region);
        wait_until("the fault to queue on the global lock", || {
            pager.global_readers_sleeping() == 1
        });
        drop(w);
        assert_eq!(t.join().unwrap(), 0, "a fresh anonymous page");
        let st = pager.stats();
        assert_eq!(st.get(Counter::RETRY_IO_MISS), 0, "{d}\n{st}");
        assert_eq!(st.get(Counter::PGMAJFAULT), 0, "{d}\n{st}");
        assert_eq!(st.global.read_contended, 1, "{d}\n{st}");
    }
}

#[test]
fn page_reclaimed_before_the_retry_counts_retry_io_miss() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (page, d) in sizes_and_deliveries() {
        let _pool = pool_for(page);
        // The budget counts 4 KiB units: two pages of either size (at
        // least the engine's least budget, four 4 KiB pages).
        let units = (page / PAGE) as u64;
        let pager = Pager::builder()
            .policy(Policy::new(PolicyKind::Vanilla))
            .delivery(d)
            .budget_pages((2 * units).max(uffd_pager::limits::MIN_BUDGET_PAGES))
            .kswapd(false)
            .readahead(0, 1)
            .fault_around(0)
            .build()
            .unwrap();
        let store = GateStore::new(4, page);
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let region = unsafe {
            pager.map_store(
                store.clone(),
                4 * page,
                &MapOptions {
                    writable: false,
                    page_size: page,
                    ..MapOptions::default()
                },
            )
        }
        .unwrap();
        pager.reset_stats();
        let t = touch(&region);
        wait_until("the read to start", || store.entered.load(SeqCst) == 1);
        // A writer holds the global lock: the vanilla retry queues behind it
        // with the page Cached and unlocked, i.e. reclaimable.
        let w = pager.hold_global_write();
        store.open.store(true, SeqCst);
        wait_until("the fault to queue on the global lock", || {
            pager.global_readers_sleeping() == 1
        });
        assert_eq!(
            pager.reclaim_pages(1),
            units,
            "{d}: the loaded page is evicted"
        );
        drop(w);
        assert_eq!(t.join().unwrap(), 1, "{d}: data intact");
        let st = pager.stats();
        assert_eq!(st.get(Counter::RETRY_MMAP_DROP), 1, "{d}\n{st}");
        assert_eq!(st.get(Counter::RETRY_IO_MISS), 1, "{d}\n{st}");
        assert!(st.get(Counter::PGSTEAL) >= 1, "{d}\n{st}");
        assert_eq!(
            store.entered.load(SeqCst),
            2,
            "{d}: read again under the lock"
        );
        assert!((st.miss_drop_pct() - 100.0).abs() < 1e-9, "{d}");
    }
}

/// Set while the application side of
/// `an_eviction_in_flight_never_takes_the_applications_new_page` runs.
static EVICT_ARMED: AtomicBool = AtomicBool::new(false);
static EVICT_HELD: AtomicBool = AtomicBool::new(false);
static EVICT_GO: AtomicBool = AtomicBool::new(false);

std::thread_local!(static EVICTOR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });

/// Holds the evicting thread's first lookup until the test says go.
fn hold_evictor(_: &uffd_pager::testing::Site<'_>) {
    if EVICTOR.with(|c| c.get()) && EVICT_ARMED.swap(false, SeqCst) {
        EVICT_HELD.store(true, SeqCst);
        let t = Instant::now();
        while !EVICT_GO.load(SeqCst) && t.elapsed() < Duration::from_secs(20) {
            std::thread::yield_now();
        }
    }
}

/// Checks that the application's own 8 pages at `mine` (where region `r`
/// of `p` was) still hold the 0xA5 it wrote, after dropping `r` and
/// unmapping them.
fn assert_own_pages_kept(p: &Pager, r: Region, mine: usize, ctx: &str) {
    let lost: Vec<usize> = (0..8)
        .filter(|pg| {
            // SAFETY: the application's own mapping.
            let b = unsafe { std::ptr::read_volatile((mine + pg * PAGE) as *const u8) };
            b != 0xA5
        })
        .collect();
    let st = p.stats();
    drop(r);
    // SAFETY: the application's own mapping.
    unsafe { libc::munmap(mine as *mut libc::c_void, 8 * PAGE) };
    assert!(
        lost.is_empty(),
        "{ctx}: the application's pages {lost:?} were taken\n{st}"
    );
}

/// A pager whose evictions run only when asked (`reclaim_pages`), one
/// page per fault.
fn evict_on_demand(d: Delivery) -> Pager {
    Pager::builder()
        .delivery(d)
        .budget_pages(64)
        .kswapd(false)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap()
}

/// Starts an eviction of one page of `p`, holds it right after its lookup,
/// runs `app` meanwhile, then lets the eviction finish.
fn with_an_eviction_held<R>(p: &Pager, app: impl FnOnce() -> R) -> R {
    EVICT_HELD.store(false, SeqCst);
    EVICT_GO.store(false, SeqCst);
    EVICT_ARMED.store(true, SeqCst);
    uffd_pager::testing::set_after_lookup(Some(hold_evictor));
    let r = std::thread::scope(|s| {
        let t = s.spawn(|| {
            EVICTOR.with(|c| c.set(true));
            p.reclaim_pages(1)
        });
        wait_until("the eviction's lookup", || EVICT_HELD.load(SeqCst));
        let r = app();
        EVICT_GO.store(true, SeqCst);
        t.join().unwrap();
        r
    });
    uffd_pager::testing::set_after_lookup(None);
    r
}

/// An eviction that found its page before the application mapped its own
/// memory over the range (`mmap(MAP_FIXED)`) must not act after: with
/// handler threads the kernel lets the application's call return once the
/// `UNMAP` event is read, before the engine applies it, and `UFFDIO_MOVE`
/// checks only its destination's registration, so the move took the
/// application's freshly written page (it then read zeros). Evictions now
/// act only while no event is read and not applied.
#[test]
fn an_eviction_in_flight_never_takes_the_applications_new_page() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for d in [
        Delivery::Threads {
            threads: 2,
            spin_us: 0,
        },
        Delivery::PerRegion,
    ] {
        let p = evict_on_demand(d);
        let mut r = p.map_anonymous(64 * PAGE).unwrap();
        let base = r.as_ptr() as usize;
        // Only pages 40..48 resident, dirty.
        r.as_mut_slice()[40 * PAGE..48 * PAGE].fill(0x11);
        let mine = base + 40 * PAGE;
        with_an_eviction_held(&p, || {
            // SAFETY: the application maps its own memory over region
            // memory, as it may.
            let q = unsafe {
                libc::mmap(
                    mine as *mut libc::c_void,
                    8 * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            assert_eq!(q as usize, mine, "{d}: mmap");
            for k in 0..8 * PAGE {
                // SAFETY: the application's own mapping.
                unsafe { std::ptr::write_volatile((mine + k) as *mut u8, 0xA5) };
            }
        });
        assert_own_pages_kept(&p, r, mine, &d.to_string());
    }
}

/// As above, but another thread unmaps the region memory and the
/// application maps its own there while the unmap waits for its event: the
/// kernel frees the range before it posts the event, so nothing the engine
/// reads or applies stands between the two. In-thread delivery took every
/// one of the new pages (its evictions checked for no event at all); the
/// eviction now asks the kernel whether an event is on its way on the
/// region's descriptor right before it acts. Both the move of a dirty
/// anonymous page and the batched zap of clean shared pages.
#[test]
fn an_eviction_in_flight_never_takes_another_threads_new_mapping() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let threads = Delivery::Threads {
        threads: 2,
        spin_us: 0,
    };
    for d in [Delivery::InThread, threads, Delivery::PerRegion] {
        for shared in [false, true] {
            let p = evict_on_demand(d);
            let store = Arc::new(MemoryStore::new(64 * PAGE as u64).unwrap());
            let mut r = if shared {
                // SAFETY: nothing writes the store but the engine (the
                // store contract).
                unsafe { p.map_store(store, 64 * PAGE, &MapOptions::default()) }.unwrap()
            } else {
                p.map_anonymous(64 * PAGE).unwrap()
            };
            let base = r.as_ptr() as usize;
            if shared {
                // Pages 40..48 mapped clean.
                assert!(r.as_slice()[40 * PAGE..48 * PAGE].iter().all(|&b| b == 0));
            } else {
                // Pages 40..48 resident, dirty.
                r.as_mut_slice()[40 * PAGE..48 * PAGE].fill(0x11);
            }
            let mine = base + 40 * PAGE;
            let ctx = format!("{d}, {}", if shared { "shared" } else { "anonymous" });
            let (mapped, un) = with_an_eviction_held(&p, || {
                // SAFETY: the application unmaps region memory, as it may.
                let un = std::thread::spawn(move || unsafe {
                    libc::munmap(mine as *mut libc::c_void, 8 * PAGE)
                });
                let mut mapped = false;
                let t0 = Instant::now();
                while !mapped && t0.elapsed() < Duration::from_secs(10) {
                    // SAFETY: maps only where nothing is mapped.
                    let q = unsafe {
                        libc::mmap(
                            mine as *mut libc::c_void,
                            8 * PAGE,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                            -1,
                            0,
                        )
                    };
                    mapped = q as usize == mine;
                    if !mapped {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                if mapped {
                    for k in 0..8 * PAGE {
                        // SAFETY: the application's own mapping.
                        unsafe { std::ptr::write_volatile((mine + k) as *mut u8, 0xA5) };
                    }
                }
                (mapped, un)
            });
            assert_eq!(un.join().unwrap(), 0, "{ctx}: munmap");
            assert!(mapped, "{ctx}: the unmapped range never became free");
            assert_own_pages_kept(&p, r, mine, &ctx);
        }
    }
}
