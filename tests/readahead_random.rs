//! Readahead on real faults follows the access pattern: a random reader
//! gets (almost) none, even though its faults now and then land just past
//! the last one, and a sequential reader that follows still gets its
//! window back.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Counter, InstallKind, MapOptions, Pager};
use util::{pattern_vec, PAGE};

const PAGES: usize = 8192;

#[test]
fn a_random_reader_gets_no_readahead_and_a_sequential_one_does() {
    let data = pattern_vec(5, PAGES * PAGE);
    let pager = Pager::builder()
        .budget_pages(1024)
        .readahead(32, 2)
        .fault_around(64)
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { pager.map_store(store, data.len(), &opts) }.unwrap();
    let s = region.as_slice();
    let reads = 20_000;
    // Two random readers at once, as `bench random --threads 2`.
    std::thread::scope(|sc| {
        for t in 0..2u64 {
            let data = &data;
            sc.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                for _ in 0..reads / 2 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let p = (x >> 33) as usize % PAGES;
                    assert_eq!(s[p * PAGE + 9], data[p * PAGE + 9], "page {p}");
                }
            });
        }
    });
    let random_ra = pager.stats().get(Counter::RA_PAGES);
    // One random fault in seven or so lands within readahead's reach past
    // the last one; each of those used to double the window (2,000+ pages
    // read ahead here, nearly all wasted).
    assert!(
        random_ra < reads / 100,
        "{random_ra} pages read ahead for {reads} random reads"
    );
    for p in 0..PAGES / 2 {
        assert_eq!(s[p * PAGE], data[p * PAGE], "page {p}");
    }
    let seq_ra = pager.stats().get(Counter::RA_PAGES) - random_ra;
    assert!(
        seq_ra > PAGES as u64 / 4,
        "{seq_ra} pages read ahead for a sequential read of {} pages",
        PAGES / 2
    );
}
