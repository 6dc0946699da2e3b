//! A read-only anonymous region under a budget: eviction cannot move its
//! pages out (UFFDIO_MOVE needs a writable source), so it writes them back
//! from the installed page itself. Every page must read back intact.

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager};

const PAGE: usize = 4096;

fn run(delivery: Delivery) {
    let pager = Pager::builder()
        .delivery(delivery)
        .budget_pages(32)
        .build()
        .unwrap();
    let pages = 256;
    let data: Vec<u8> = (0..pages * PAGE)
        .map(|i| (i / PAGE) as u8 ^ (i as u8))
        .collect();
    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let r = pager
        .map_store(
            store,
            pages * PAGE,
            &MapOptions {
                kind: InstallKind::Anonymous,
                writable: false,
                ..MapOptions::default()
            },
        )
        .unwrap();
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
    assert!(s.peak_resident_pages <= 32 + 16, "{s}");
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
