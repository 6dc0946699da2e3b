//! Concurrent faults: threads racing on the same pages (one store read per
//! page), map/unmap churn while other threads fault, and several pagers of
//! both delivery modes in one process (faults dispatched by address).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use uffd_pager::store::{LatencyModel, MemoryStore, SimulatedStore, Store};
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager, Region};
use util::*;

const KINDS: [InstallKind; 2] = [InstallKind::Anonymous, InstallKind::Shared];

fn opts(kind: InstallKind) -> MapOptions {
    MapOptions {
        kind: Some(kind),
        ..MapOptions::default()
    }
}

/// A region's base address and length, to share with threads (they read
/// through raw pointers while the owner keeps the `Region` alive).
#[derive(Clone, Copy)]
struct Span {
    base: usize,
    len: usize,
}

impl Span {
    fn of(r: &Region) -> Span {
        Span {
            base: r.as_ptr() as usize,
            len: r.len(),
        }
    }

    /// Page `p`'s bytes.
    ///
    /// # Safety
    /// The region must outlive the returned slice and nobody may write the
    /// page meanwhile.
    unsafe fn page(&self, p: usize) -> &[u8] {
        assert!((p + 1) * PAGE <= self.len);
        // SAFETY: per the caller's contract.
        unsafe { std::slice::from_raw_parts((self.base + p * PAGE) as *const u8, PAGE) }
    }
}

/// Several threads fault the same pages at once (a slow store makes them
/// overlap); the store sees exactly one read per page and every thread sees
/// the right data. `kernel_maps`: a read-only shared region the kernel maps
/// (`MapOptions::kernel_maps`), where the engine installs nothing.
fn same_pages_once(d: Delivery, kind: InstallKind, kernel_maps: bool) {
    const THREADS_N: usize = 4;
    const PAGES: usize = 24;
    let ctx = format!("{d} {kind} kernel_maps {kernel_maps}");
    let p = pager(d);
    let opts = MapOptions {
        writable: !kernel_maps,
        kernel_maps,
        ..opts(kind)
    };
    let data = Arc::new(pattern_vec(7, PAGES * PAGE));
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let sim = Arc::new(SimulatedStore::new(
        mem,
        LatencyModel::Fixed { ns: 2_000_000 },
        0,
        1,
    ));
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { p.map_store(sim.clone(), PAGES * PAGE, &opts) }.unwrap();
    let span = Span::of(&region);
    let barrier = Arc::new(Barrier::new(THREADS_N));
    let handles: Vec<_> = (0..THREADS_N)
        .map(|t| {
            let (barrier, data) = (barrier.clone(), data.clone());
            std::thread::spawn(move || {
                barrier.wait();
                // All threads walk the pages in the same order, so they
                // collide on each one; odd threads start from the middle.
                let start = if t.is_multiple_of(2) { 0 } else { PAGES / 2 };
                for k in 0..PAGES {
                    let pg = (start + k) % PAGES;
                    // SAFETY: the region outlives the threads (joined
                    // below); nobody writes it.
                    let got = unsafe { span.page(pg) };
                    let want = &data[pg * PAGE..(pg + 1) * PAGE];
                    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
                        return Err(format!("thread {t}: page {pg} byte {i} wrong"));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap_or_else(|e| panic!("{ctx}: {e}"));
    }
    assert_eq!(sim.reads(), PAGES as u64, "{ctx}: store reads");
    let s = p.stats();
    assert_eq!(s.get(Counter::PGREAD), PAGES as u64, "{ctx}: {s}");
    let installs = if kernel_maps { 0 } else { PAGES as u64 };
    assert_eq!(s.get(Counter::PGINSTALL), installs, "{ctx}: {s}");
    assert_eq!(s.get(Counter::PAGE_DROPPED), 0, "{ctx}: {s}");
    assert!(s.get(Counter::PGFAULT) >= PAGES as u64, "{ctx}: {s}");
    assert_bytes(region.as_slice(), &data, &ctx);
    // The region and the store agree at the end too.
    drop(region);
    assert_eq!(sim.reads(), PAGES as u64, "{ctx}: store reads after drop");
}

#[test]
fn concurrent_same_pages_one_read_each_in_thread() {
    for kind in KINDS {
        with_deadline(60, "same pages, in-thread", move || {
            same_pages_once(Delivery::InThread, kind, false)
        });
    }
}

/// The same on a kernel-mapped region: a fault that finds the page filled
/// by another's (the kernel has not mapped it yet) takes it as it is,
/// rather than for dropped (punched out and read again).
#[test]
fn concurrent_same_pages_one_read_each_kernel_mapped() {
    for d in [Delivery::InThread, THREADS] {
        with_deadline(60, "same pages, kernel-mapped", move || {
            same_pages_once(d, InstallKind::Shared, true)
        });
    }
}

#[test]
fn concurrent_same_pages_one_read_each_threads() {
    for kind in KINDS {
        with_deadline(60, "same pages, threads", move || {
            same_pages_once(THREADS, kind, false)
        });
    }
}

/// Threads keep faulting (and checking) one region while the main thread
/// maps, touches and unmaps (or drops) other regions of the same pager 200
/// times.
fn churn_while_faulting(d: Delivery) {
    const READERS: usize = 2;
    const PAGES: usize = 512;
    let ctx = d.to_string();
    let p = Arc::new(pager(d));
    let data = Arc::new(pattern_vec(100, PAGES * PAGE));
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    // A little latency so that the readers are still faulting while the
    // churn runs.
    let sim = Arc::new(SimulatedStore::new(
        mem,
        LatencyModel::Fixed { ns: 50_000 },
        0,
        1,
    ));
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region =
        unsafe { p.map_store(sim.clone(), PAGES * PAGE, &opts(InstallKind::Shared)) }.unwrap();
    let span = Span::of(&region);
    let done = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..READERS)
        .map(|t| {
            let (done, data, checked) = (done.clone(), data.clone(), checked.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut pass = 0;
                while pass == 0 || !done.load(Ordering::Relaxed) {
                    for k in 0..PAGES {
                        // Reader 0 goes forward, reader 1 backward.
                        let pg = if t == 0 { k } else { PAGES - 1 - k };
                        // SAFETY: the region outlives the readers (joined
                        // before it is dropped); nobody writes it.
                        let got = unsafe { span.page(pg) };
                        if got != &data[pg * PAGE..(pg + 1) * PAGE] {
                            return Err(format!("reader {t}: page {pg} wrong on pass {pass}"));
                        }
                        checked.fetch_add(1, Ordering::Relaxed);
                    }
                    pass += 1;
                }
                Ok(())
            })
        })
        .collect();

    for i in 0..200u64 {
        let kind = KINDS[(i % 2) as usize];
        let pages = 1 + (i % 4) as usize;
        let seed = 1000 + i;
        let want = pattern_vec(seed, pages * PAGE);
        let store: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&want).unwrap());
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut r = unsafe { p.map_store(store, pages * PAGE, &opts(kind)) }
            .unwrap_or_else(|e| panic!("{ctx}: map #{i}: {e}"));
        assert_bytes(r.as_slice(), &want, &format!("{ctx}: churn region #{i}"));
        r.as_mut_slice()[0] = !want[0];
        assert_eq!(r.as_slice()[0], !want[0], "{ctx}: churn write #{i}");
        if i % 3 == 0 {
            drop(r);
        } else {
            r.unmap()
                .unwrap_or_else(|e| panic!("{ctx}: unmap #{i}: {e}"));
        }
        // Some anonymous churn too.
        let mut a = p.map_anonymous(2 * PAGE).unwrap();
        a.as_mut_slice()[PAGE] = i as u8;
        assert_eq!(a.as_slice()[PAGE], i as u8);
        assert_eq!(a.as_slice()[0], 0);
        drop(a);
    }
    done.store(true, Ordering::Relaxed);
    for h in readers {
        h.join().unwrap().unwrap_or_else(|e| panic!("{ctx}: {e}"));
    }
    assert!(checked.load(Ordering::Relaxed) >= (READERS * PAGES) as u64);
    assert_eq!(sim.reads(), PAGES as u64, "{ctx}: one read per page");
    assert_bytes(region.as_slice(), &data, &ctx);
}

#[test]
fn concurrent_unmap_while_faulting_in_thread() {
    with_deadline(120, "churn, in-thread", || {
        churn_while_faulting(Delivery::InThread)
    });
}

#[test]
fn concurrent_unmap_while_faulting_threads() {
    with_deadline(120, "churn, threads", || churn_while_faulting(THREADS));
}

/// Two in-thread pagers and one handler-thread pager at once, each with its
/// own region, faulted from several threads: data correct, and each pager
/// counts exactly its own installs.
#[test]
fn concurrent_several_pagers_dispatch_by_address() {
    with_deadline(120, "several pagers", || {
        const APP_THREADS: usize = 4;
        let specs: [(Delivery, InstallKind, usize, u64); 3] = [
            (Delivery::InThread, InstallKind::Shared, 48, 201),
            (Delivery::InThread, InstallKind::Anonymous, 80, 202),
            (THREADS, InstallKind::Shared, 112, 203),
        ];
        let mut pagers = Vec::new();
        let mut regions = Vec::new();
        let mut spans = Vec::new();
        let mut datas = Vec::new();
        for (d, kind, pages, seed) in specs {
            let p = pager(d);
            let data = Arc::new(pattern_vec(seed, pages * PAGE));
            let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
            let sim = Arc::new(SimulatedStore::new(
                mem,
                LatencyModel::Fixed { ns: 20_000 },
                0,
                seed,
            ));
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let r = unsafe { p.map_store(sim, pages * PAGE, &opts(kind)) }.unwrap();
            spans.push(Span::of(&r));
            regions.push(r);
            datas.push(data);
            pagers.push(p);
        }
        let barrier = Arc::new(Barrier::new(APP_THREADS));
        let handles: Vec<_> = (0..APP_THREADS)
            .map(|t| {
                let (barrier, datas, spans) = (barrier.clone(), datas.clone(), spans.clone());
                std::thread::spawn(move || -> Result<(), String> {
                    barrier.wait();
                    // Interleave the three regions, each thread from its own
                    // starting point.
                    let max = spans.iter().map(|s| s.len / PAGE).max().unwrap();
                    for k in 0..max {
                        for (j, s) in spans.iter().enumerate() {
                            let pages = s.len / PAGE;
                            if k >= pages {
                                continue;
                            }
                            let pg = (k + t * 7 + j * 3) % pages;
                            // SAFETY: the regions outlive the threads; nobody
                            // writes them.
                            let got = unsafe { s.page(pg) };
                            if got != &datas[j][pg * PAGE..(pg + 1) * PAGE] {
                                return Err(format!("thread {t}: region {j} page {pg} wrong"));
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
        for (j, (p, (d, _, pages, _))) in pagers.iter().zip(specs).enumerate() {
            let s = p.stats();
            let pages = pages as u64;
            let faults = s.get(Counter::PGFAULT);
            assert_eq!(s.get(Counter::PGINSTALL), pages, "pager {j} ({d}): {s}");
            assert_eq!(s.get(Counter::PGREAD), pages, "pager {j} ({d}): {s}");
            assert!(
                faults >= pages,
                "pager {j} ({d}): PGFAULT {faults} < {pages}"
            );
            if d.is_in_thread() {
                // Each application thread faults each page at most once.
                assert!(
                    faults <= pages * APP_THREADS as u64,
                    "pager {j} ({d}): PGFAULT {faults} > {}",
                    pages * APP_THREADS as u64
                );
            }
            assert_eq!(s.get(Counter::SEGV), 0, "pager {j} ({d}): {s}");
            assert_bytes(regions[j].as_slice(), &datas[j], &format!("pager {j}"));
        }
        // Faults on one pager's region never show up in another's counters:
        // touching only region 0 again after a reset leaves the others at 0.
        for p in &pagers {
            p.reset_stats();
        }
        let mut fresh = pagers[0].map_anonymous(16 * PAGE).expect("map on pager 0");
        fresh.as_mut_slice().fill(0x42);
        assert!(fresh.as_slice().iter().all(|&b| b == 0x42));
        assert!(pagers[0].stats().get(Counter::PGFAULT) >= 16);
        assert_eq!(pagers[1].stats().get(Counter::PGFAULT), 0);
        assert_eq!(pagers[2].stats().get(Counter::PGFAULT), 0);
        drop(fresh);
        drop(regions);
    });
}

/// Pagers come and go while another pager's region is being faulted from
/// other threads: teardown of one never disturbs the others.
#[test]
fn concurrent_pagers_created_and_dropped() {
    with_deadline(120, "pager churn", || {
        let keep = pager(Delivery::InThread);
        let data = Arc::new(pattern_vec(300, 256 * PAGE));
        let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
        let sim = Arc::new(SimulatedStore::new(
            mem,
            LatencyModel::Fixed { ns: 50_000 },
            0,
            3,
        ));
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let region =
            unsafe { keep.map_store(sim.clone(), 256 * PAGE, &opts(InstallKind::Anonymous)) }
                .unwrap();
        let span = Span::of(&region);
        let reader = {
            let data = data.clone();
            std::thread::spawn(move || -> Result<(), String> {
                for pg in 0..256 {
                    // SAFETY: the region outlives the reader; nobody writes it.
                    if unsafe { span.page(pg) } != &data[pg * PAGE..(pg + 1) * PAGE] {
                        return Err(format!("page {pg} wrong"));
                    }
                }
                Ok(())
            })
        };
        for i in 0..20u64 {
            let d = DELIVERIES[(i % 3) as usize];
            let p: Pager = pager(d);
            let want = pattern_vec(400 + i, 4 * PAGE);
            let store: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&want).unwrap());
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let r = unsafe { p.map_store(store, 4 * PAGE, &opts(InstallKind::Shared)) }.unwrap();
            assert_bytes(r.as_slice(), &want, &format!("{d} pager #{i}"));
            drop(r);
            drop(p);
        }
        reader.join().unwrap().unwrap();
        assert_eq!(sim.reads(), 256);
        assert_bytes(region.as_slice(), &data, "kept region");
    });
}
