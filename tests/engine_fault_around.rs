//! Fault-around on real faults: a read fault on a shared region maps the
//! page with its cached neighbours. For a sequential reader the cluster
//! grows (64, 128, 256, 512 pages); for any other fault it is the aligned
//! base cluster. Every byte read must be the store's.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager, Region};
use util::{assert_bytes, pattern_vec, DELIVERIES, PAGE};

const PAGES: usize = 2048;
const BASE: usize = 64;

/// A shared region over a memory store, every page cached (read once,
/// page by page, then unmapped with `dontneed`, which keeps the cache).
fn cached_region(d: Delivery, data: &[u8]) -> (Pager, Region) {
    let pager = Pager::builder()
        .delivery(d)
        .readahead(0, 1)
        .fault_around(BASE)
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::from_bytes(data).unwrap());
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut r = unsafe {
        pager.map_store(
            store,
            data.len(),
            &MapOptions {
                kind: Some(InstallKind::Shared),
                writable: false,
                ..MapOptions::default()
            },
        )
    }
    .unwrap();
    // Backwards, so that no fault looks sequential while the cache fills.
    for p in (0..PAGES).rev() {
        assert_eq!(r.as_slice()[p * PAGE], data[p * PAGE]);
    }
    r.dontneed(0, data.len()).unwrap();
    pager.reset_stats();
    (pager, r)
}

#[test]
fn a_sequential_reader_gets_growing_clusters() {
    let data = pattern_vec(41, PAGES * PAGE);
    for d in DELIVERIES {
        let (pager, r) = cached_region(d, &data);
        assert_bytes(r.as_slice(), &data, &format!("{d} sequential"));
        let s = pager.stats();
        let faults = s.get(Counter::PGFAULT);
        // 64 + 128 + 256 + 512 + 512 + 512 + 64 pages: 7 faults. With a
        // fixed 64-page cluster it would be 32.
        assert!(faults <= 10, "{d}: {faults} faults\n{s}");
        assert_eq!(
            s.get(Counter::FAULT_AROUND) + faults,
            PAGES as u64,
            "{d}: every page mapped by a fault or around one\n{s}"
        );
        assert_eq!(s.get(Counter::PGREAD), 0, "{d}: all cached\n{s}");
    }
}

#[test]
fn other_faults_get_the_aligned_base_cluster() {
    let data = pattern_vec(42, PAGES * PAGE);
    for d in DELIVERIES {
        let (pager, r) = cached_region(d, &data);
        // One page in the middle of every base cluster, from the last
        // cluster to the first: no fault continues the previous one.
        for c in (0..PAGES / BASE).rev() {
            let p = c * BASE + BASE / 2;
            assert_bytes(
                &r.as_slice()[p * PAGE..(p + 1) * PAGE],
                &data[p * PAGE..(p + 1) * PAGE],
                &format!("{d} page {p}"),
            );
        }
        let s = pager.stats();
        assert_eq!(s.get(Counter::PGFAULT), (PAGES / BASE) as u64, "{d}\n{s}");
        // Each fault mapped its whole aligned cluster, and no more.
        assert_eq!(
            s.get(Counter::FAULT_AROUND),
            (PAGES - PAGES / BASE) as u64,
            "{d}\n{s}"
        );
        assert_bytes(r.as_slice(), &data, &format!("{d} after"));
    }
}
