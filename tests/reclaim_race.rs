//! Eviction versus write: application threads keep writing increasing
//! counters to their pages while another thread calls
//! `Pager::reclaim_pages` in a loop and kswapd runs. No write may be lost:
//! before each write a writer checks that its page still holds the value
//! it wrote last, and at the end every page holds its writer's last value.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, Delivery, MapOptions, Pager, Region};

const PAGE: usize = 4096;
const WORDS: usize = PAGE / 8;
const PAGES: usize = 256;
/// Pages most writes go to: inside the budget, so the pages being evicted
/// are the ones being written.
const HOT: usize = 48;
const BUDGET: u64 = 64;
const WRITERS: usize = 2;
const WRITES_PER_WRITER: u64 = 15_000;

const THREADS: Delivery = Delivery::Threads {
    threads: 2,
    spin_us: 0,
};

/// Page `p`'s contents after `n` writes: word 0 and the last word hold `n`
/// tagged with the page, so a page read from the wrong place, a stale copy
/// or a torn copy all differ.
fn value(p: usize, n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        ((p as u64 + 1) << 40) | n
    }
}

/// Word `w` of page `p` of the region at `base`.
fn word(base: usize, p: usize, w: usize) -> &'static AtomicU64 {
    assert!(p < PAGES && w < WORDS);
    // SAFETY: in bounds and aligned; the region outlives every use (the
    // callers join their threads before unmapping it).
    unsafe { &*((base + p * PAGE + w * 8) as *const AtomicU64) }
}

/// Small deterministic generator (splitmix64).
fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Outcome {
    /// Per page: how many times it was written (its last value's counter).
    counts: Vec<u64>,
    /// Reads before a write that did not find the last value written.
    lost: Vec<String>,
    /// Pages freed by the reclaimer thread.
    reclaimed: u64,
}

/// Runs the writers and the reclaimer over `region`.
fn race(pager: &Pager, region: &Region) -> Outcome {
    let base = region.as_ptr() as usize;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let reclaimer = s.spawn(|| {
            let mut freed = 0;
            while !stop.load(Ordering::Acquire) {
                freed += pager.reclaim_pages(8);
                std::thread::yield_now();
            }
            freed
        });
        let writers: Vec<_> = (0..WRITERS)
            .map(|t| {
                s.spawn(move || {
                    let mut counts = vec![0u64; PAGES];
                    let mut lost = Vec::new();
                    let mut rng = 0x5EED ^ (t as u64 + 1);
                    for _ in 0..WRITES_PER_WRITER {
                        let r = next(&mut rng);
                        let span = if !r.is_multiple_of(4) { HOT } else { PAGES };
                        // A page of this writer's partition.
                        let mut p = (next(&mut rng) as usize % span) / WRITERS * WRITERS + t;
                        if p >= span {
                            p -= WRITERS;
                        }
                        let n = counts[p];
                        for w in [0, WORDS - 1] {
                            let got = word(base, p, w).load(Ordering::Acquire);
                            if got != value(p, n) && lost.len() < 8 {
                                lost.push(format!(
                                    "writer {t} page {p} word {w}: found {got:#x}, \
                                     wrote {:#x} last",
                                    value(p, n)
                                ));
                            }
                        }
                        word(base, p, 0).store(value(p, n + 1), Ordering::Release);
                        word(base, p, WORDS - 1).store(value(p, n + 1), Ordering::Release);
                        counts[p] = n + 1;
                    }
                    (counts, lost)
                })
            })
            .collect();
        let mut counts = vec![0u64; PAGES];
        let mut lost = Vec::new();
        for h in writers {
            let (c, l) = h.join().expect("writer panicked");
            for (p, n) in c.into_iter().enumerate() {
                counts[p] += n;
            }
            lost.extend(l);
        }
        stop.store(true, Ordering::Release);
        let reclaimed = reclaimer.join().expect("reclaimer panicked");
        Outcome {
            counts,
            lost,
            reclaimed,
        }
    })
}

/// Every page of the region holds its last value (read through the region,
/// so evicted pages come back from the store).
fn check_region(region: &Region, counts: &[u64]) {
    let base = region.as_ptr() as usize;
    for (p, &n) in counts.iter().enumerate() {
        for w in [0, WORDS - 1] {
            let got = word(base, p, w).load(Ordering::Acquire);
            assert_eq!(got, value(p, n), "page {p} word {w} after the race");
        }
        for w in 1..WORDS - 1 {
            assert_eq!(word(base, p, w).load(Ordering::Relaxed), 0, "page {p}");
        }
    }
}

fn check_outcome(pager: &Pager, o: &Outcome) {
    let s = pager.stats();
    println!(
        "reclaimed by the racing thread {}, pgsteal {}, writeback {}, peak {}/{}",
        o.reclaimed,
        s.get(Counter::PGSTEAL),
        s.get(Counter::WRITEBACK),
        s.peak_resident_pages,
        s.budget_pages
    );
    assert!(o.lost.is_empty(), "writes lost:\n{}", o.lost.join("\n"));
    assert_eq!(
        o.counts.iter().sum::<u64>(),
        WRITES_PER_WRITER * WRITERS as u64
    );
    assert!(o.reclaimed > 0, "the racing reclaimer never freed a page");
    assert!(s.get(Counter::PGSTEAL) > 0);
    assert!(
        s.get(Counter::WRITEBACK) > 0,
        "dirty pages were evicted without write-back"
    );
}

fn pager(d: Delivery) -> Pager {
    Pager::builder()
        .budget_pages(BUDGET)
        .kswapd(true)
        // (The unmap must uncharge every page: nothing kept.)
        .keep_unmapped(0)
        .delivery(d)
        .build()
        .expect("building a pager")
}

fn shared_over_memory_store(d: Delivery) {
    let pager = pager(d);
    let store = Arc::new(MemoryStore::new((PAGES * PAGE) as u64).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region =
        unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }.unwrap();
    let o = race(&pager, &region);
    check_outcome(&pager, &o);
    check_region(&region, &o.counts);
    region.unmap().unwrap();
    // The unmap wrote back what was still dirty: the store has every write.
    let snap = store.snapshot();
    for (p, &n) in o.counts.iter().enumerate() {
        for w in [0, WORDS - 1] {
            let at = p * PAGE + w * 8;
            let got = u64::from_ne_bytes(snap[at..at + 8].try_into().unwrap());
            assert_eq!(got, value(p, n), "store page {p} word {w}");
        }
    }
    assert_eq!(pager.stats().resident_pages, 0);
}

fn anonymous(d: Delivery, swap_file: bool) {
    let pager = if swap_file {
        Pager::builder()
            .budget_pages(BUDGET)
            .kswapd(true)
            .delivery(d)
            .swap_dir(std::env::temp_dir())
            .build()
            .expect("building a pager")
    } else {
        pager(d)
    };
    let region = pager.map_anonymous(PAGES * PAGE).unwrap();
    let o = race(&pager, &region);
    check_outcome(&pager, &o);
    check_region(&region, &o.counts);
    region.unmap().unwrap();
    assert_eq!(pager.stats().resident_pages, 0);
}

#[test]
fn shared_memory_store_in_thread() {
    shared_over_memory_store(Delivery::InThread);
}

#[test]
fn shared_memory_store_handler_threads() {
    shared_over_memory_store(THREADS);
}

#[test]
fn anonymous_in_thread() {
    anonymous(Delivery::InThread, false);
}

#[test]
fn anonymous_handler_threads() {
    anonymous(THREADS, false);
}

#[test]
fn anonymous_swap_file_in_thread() {
    anonymous(Delivery::InThread, true);
}
