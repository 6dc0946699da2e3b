//! Data integrity through real page faults: every byte of every page is
//! checked for each install kind × delivery mode × backing store, for reads
//! of absent pages, writes into absent and present pages, and write-back
//! (or its absence, for private mappings) when a region is dropped.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{MemoryStore, Store};
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager, Region};
use util::*;

const PAGES: usize = 256;
const LEN: usize = PAGES * PAGE;

/// Where a region's pages come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A `MemoryStore` holding a hash pattern.
    Memory,
    /// A `FileStore` over a temp file holding a hash pattern (`map_file`).
    File,
    /// `map_zero`.
    Zero,
    /// `map_anonymous` (anonymous install kind only).
    Anon,
}

const SOURCES: [Source; 4] = [Source::Memory, Source::File, Source::Zero, Source::Anon];
const KINDS: [InstallKind; 2] = [InstallKind::Anonymous, InstallKind::Shared];

/// A mapped region plus what is needed to check it and its backing.
struct Mapped {
    region: Region,
    /// What the region should hold before any write.
    initial: Vec<u8>,
    /// Whether the region may be written.
    writable: bool,
    memory: Option<Arc<MemoryStore>>,
    file: Option<TempFile>,
}

fn map(pager: &Pager, kind: InstallKind, src: Source, seed: u64) -> Option<Mapped> {
    let opts = MapOptions {
        kind: Some(kind),
        writable: true,
        ..MapOptions::default()
    };
    let ctx = format!("{kind} {src:?}");
    Some(match src {
        Source::Memory => {
            let initial = pattern_vec(seed, LEN);
            let store = Arc::new(MemoryStore::from_bytes(&initial).expect("memory store"));
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let region = unsafe { pager.map_store(store.clone() as Arc<dyn Store>, LEN, &opts) }
                .unwrap_or_else(|e| panic!("{ctx}: map_store: {e}"));
            Mapped {
                region,
                initial,
                writable: true,
                memory: Some(store),
                file: None,
            }
        }
        Source::File => {
            let initial = pattern_vec(seed, LEN);
            let file = TempFile::with_contents("integrity", &initial);
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let region = unsafe { pager.map_file(file.path(), Some(LEN), &opts) }
                .unwrap_or_else(|e| panic!("{ctx}: map_file: {e}"));
            Mapped {
                region,
                initial,
                writable: true,
                memory: None,
                file: Some(file),
            }
        }
        Source::Zero => Mapped {
            region: pager
                .map_zero(LEN, kind)
                .unwrap_or_else(|e| panic!("{ctx}: map_zero: {e}")),
            initial: vec![0; LEN],
            // A shared zero mapping is read-only; a private one is writable.
            writable: kind == InstallKind::Anonymous,
            memory: None,
            file: None,
        },
        Source::Anon => {
            if kind != InstallKind::Anonymous {
                return None;
            }
            Mapped {
                region: pager
                    .map_anonymous(LEN)
                    .unwrap_or_else(|e| panic!("{ctx}: map_anonymous: {e}")),
                initial: vec![0; LEN],
                writable: true,
                memory: None,
                file: None,
            }
        }
    })
}

/// The backing's contents after the region is gone, if it has any.
fn backing_after(m_memory: Option<Arc<MemoryStore>>, m_file: Option<TempFile>) -> Option<Vec<u8>> {
    if let Some(s) = m_memory {
        return Some(s.snapshot());
    }
    m_file.map(|f| f.read())
}

/// Reads every page in a scrambled order (97 is coprime with the page
/// count), checking each, then compares the whole region again.
fn read_all_scrambled(region: &Region, expected: &[u8], ctx: &str) {
    let data = region.as_slice();
    for k in 0..PAGES {
        let p = (k * 97) % PAGES;
        let r = p * PAGE..(p + 1) * PAGE;
        assert_bytes(&data[r.clone()], &expected[r], &format!("{ctx}: page {p}"));
    }
    assert_bytes(data, expected, &format!("{ctx}: second pass"));
}

/// One combination: a read-everything region, and a region whose odd pages
/// are written before they were ever read (write faults on absent pages),
/// then every byte read back; then write-back is checked on drop.
fn check_combo(pager: &Pager, kind: InstallKind, src: Source, seed: u64) {
    let ctx = format!("{} {kind} {src:?}", pager.delivery());

    // Region A: read every byte of absent pages.
    let Some(a) = map(pager, kind, src, seed) else {
        return;
    };
    read_all_scrambled(&a.region, &a.initial, &format!("{ctx} read"));
    if a.writable {
        // Overwrite the now-present pages and read them back.
        let mut region = a.region;
        let new = pattern_vec(seed ^ 0xA5A5, LEN);
        region.as_mut_slice().copy_from_slice(&new);
        assert_bytes(region.as_slice(), &new, &format!("{ctx} rewrite present"));
        drop(region);
        let want = match kind {
            InstallKind::Shared => &new,
            InstallKind::Anonymous => &a.initial,
        };
        if let Some(after) = backing_after(a.memory, a.file) {
            assert_bytes(&after, want, &format!("{ctx} backing after drop (A)"));
        }
    } else {
        drop(a);
    }

    // Region B: write odd pages first, then read everything.
    let b = map(pager, kind, src, seed + 1).expect("mapped once already");
    let mut expected = b.initial.clone();
    let mut region = b.region;
    if b.writable {
        let new = pattern_vec(seed ^ 0x5A5A, LEN);
        {
            let s = region.as_mut_slice();
            for p in (1..PAGES).step_by(2) {
                let r = p * PAGE..(p + 1) * PAGE;
                s[r.clone()].copy_from_slice(&new[r.clone()]);
                expected[r.clone()].copy_from_slice(&new[r]);
            }
            // A single byte into an absent even page, too.
            s[4 * PAGE + 123] = !expected[4 * PAGE + 123];
            expected[4 * PAGE + 123] = !expected[4 * PAGE + 123];
        }
    }
    read_all_scrambled(&region, &expected, &format!("{ctx} after writes"));
    drop(region);
    if b.writable {
        let want = match kind {
            InstallKind::Shared => &expected,
            InstallKind::Anonymous => &b.initial,
        };
        if let Some(after) = backing_after(b.memory, b.file) {
            assert_bytes(&after, want, &format!("{ctx} backing after drop (B)"));
        }
    }
}

fn check_delivery(d: Delivery) {
    check_all(&pager(d), d);
}

/// Every combination on `pager`, then the fault counts.
fn check_all(pager: &Pager, d: Delivery) {
    let mut seed = 1;
    for kind in KINDS {
        for src in SOURCES {
            check_combo(pager, kind, src, seed);
            seed += 10;
        }
    }
    let s = pager.stats();
    // At least every page of every region A was faulted in.
    assert!(
        s.get(Counter::PGFAULT) >= (PAGES * 7) as u64,
        "{d}: PGFAULT {} too low",
        s.get(Counter::PGFAULT)
    );
    assert!(s.get(Counter::PGINSTALL) >= (PAGES * 7) as u64, "{d}: {s}");
}

/// The same combinations under a budget of an eighth of a region: every
/// page read and written is evicted and faulted back in, dirty ones
/// written back (to their store, or to swap for an anonymous region)
/// before they go. Without a budget (the default, unlimited) the checks
/// above never evicted a page: a reclaim that lost or misplaced a dirty
/// page passed them (found by review).
#[test]
fn integrity_under_a_budget_all_kinds_and_stores() {
    for d in DELIVERIES {
        let pager = Pager::builder()
            .delivery(d)
            .readahead(0, 1)
            .fault_around(0)
            .budget_pages(PAGES as u64 / 8)
            .build()
            .unwrap_or_else(|e| panic!("building a {d} pager: {e}"));
        check_all(&pager, d);
        let s = pager.stats();
        assert!(s.get(Counter::PGSTEAL) >= (PAGES * 4) as u64, "{d}: {s}");
        assert!(s.get(Counter::WRITEBACK) > 0, "{d}: {s}");
    }
}

#[test]
fn integrity_in_thread_all_kinds_and_stores() {
    check_delivery(Delivery::InThread);
}

#[test]
fn integrity_threads_all_kinds_and_stores() {
    check_delivery(THREADS);
}

/// Major faults read each page from the store exactly once; anonymous
/// zero-fill pages never touch a store.
#[test]
fn integrity_store_reads_are_counted_once_per_page() {
    for d in DELIVERIES {
        for kind in KINDS {
            let pager = pager(d);
            let ctx = format!("{d} {kind}");
            let data = pattern_vec(77, LEN);
            let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&data).unwrap());
            let sim = Arc::new(uffd_pager::store::SimulatedStore::new(
                mem,
                uffd_pager::store::LatencyModel::None,
                0,
                1,
            ));
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let region = unsafe {
                pager.map_store(
                    sim.clone(),
                    LEN,
                    &MapOptions {
                        kind: Some(kind),
                        ..MapOptions::default()
                    },
                )
            }
            .unwrap();
            read_all_scrambled(&region, &data, &ctx);
            assert_eq!(sim.reads(), PAGES as u64, "{ctx}: store reads");
            let s = pager.stats();
            assert_eq!(s.get(Counter::PGREAD), PAGES as u64, "{ctx}: {s}");
            assert_eq!(s.get(Counter::PGMAJFAULT), PAGES as u64, "{ctx}: {s}");
            // Reading again is served from the installed pages.
            read_all_scrambled(&region, &data, &ctx);
            assert_eq!(sim.reads(), PAGES as u64, "{ctx}: store reads, 2nd pass");
        }
    }
}
