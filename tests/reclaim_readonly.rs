//! A read-only anonymous region under a budget: its pages cannot change, so
//! reclaim drops them (`CLEAN`) without writing anything back, and a fault
//! reads them from the store again. Every page must read back intact. Once
//! the region is made writable, its pages are no longer clean: a write
//! must survive eviction.

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager, Region};

const PAGE: usize = 4096;

/// A pager with a 32-page budget, and `data` mapped read-only as an
/// anonymous region over a memory store.
fn read_only_region(delivery: Delivery, data: &[u8]) -> (Pager, Region) {
    let pager = Pager::builder()
        .delivery(delivery)
        .budget_pages(32)
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::from_bytes(data).unwrap());
    let r = pager
        .map_store(
            store,
            data.len(),
            &MapOptions {
                kind: InstallKind::Anonymous,
                writable: false,
                ..MapOptions::default()
            },
        )
        .unwrap();
    (pager, r)
}

fn run(delivery: Delivery) {
    let pages = 256;
    let data: Vec<u8> = (0..pages * PAGE)
        .map(|i| (i / PAGE) as u8 ^ (i as u8))
        .collect();
    let (pager, r) = read_only_region(delivery, &data);
    for round in 0..2 {
        for p in 0..pages {
            assert_eq!(
                &r.as_slice()[p * PAGE..(p + 1) * PAGE],
                &data[p * PAGE..(p + 1) * PAGE],
                "{delivery} round {round} page {p}"
            );
        }
    }
    let s = pager.stats();
    assert!(s.get(Counter::PGSTEAL) > 0, "{s}");
    assert_eq!(
        s.get(Counter::WRITEBACK),
        0,
        "clean pages written back: {s}"
    );
    assert!(s.peak_resident_pages <= 32 + 16, "{s}");
}

fn made_writable(delivery: Delivery) {
    let pages = 256;
    let data: Vec<u8> = (0..pages * PAGE).map(|i| (i / PAGE) as u8 ^ 0x5a).collect();
    let (pager, mut r) = read_only_region(delivery, &data);
    // Installed read-only (clean), then made writable and written.
    let hot = 16;
    for p in 0..hot {
        assert_eq!(r.as_slice()[p * PAGE], data[p * PAGE]);
    }
    r.protect(true).unwrap();
    for p in 0..hot {
        r.as_mut_slice()[p * PAGE + 7] = 0xee;
    }
    // Everything else, twice: the written pages are evicted meanwhile.
    for _ in 0..2 {
        for p in hot..pages {
            assert_eq!(r.as_slice()[p * PAGE + 1], data[p * PAGE + 1]);
        }
    }
    assert!(pager.stats().get(Counter::WRITEBACK) > 0);
    for p in 0..hot {
        assert_eq!(
            r.as_slice()[p * PAGE + 7],
            0xee,
            "{delivery} page {p} lost its write"
        );
        assert_eq!(
            r.as_slice()[p * PAGE],
            data[p * PAGE],
            "{delivery} page {p}"
        );
    }
}

#[test]
fn writes_after_protect_survive_eviction() {
    made_writable(Delivery::InThread);
    made_writable(Delivery::Threads {
        threads: 1,
        spin_us: 0,
    });
}

#[test]
fn read_only_anonymous_region_is_evicted_and_reread_in_thread() {
    run(Delivery::InThread);
}

#[test]
fn read_only_anonymous_region_is_evicted_and_reread_handler_threads() {
    run(Delivery::Threads {
        threads: 1,
        spin_us: 0,
    });
}
