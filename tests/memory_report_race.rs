//! `Pager::memory_use` while regions are unmapped: a report must never
//! delay an unmap's write-back past its return (the report walks the
//! regions under the global lock's read side, as `/proc/PID/smaps` walks
//! them under `mmap_lock`, and holds no reference an unmap could find).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use uffd_pager::store::{MemoryStore, Store};
use uffd_pager::{MapOptions, Pager};
use util::PAGE;

#[test]
fn an_unmap_during_a_memory_report_has_written_back_when_it_returns() {
    const ROUNDS: usize = 1500;
    const PAGES: usize = 4;
    let pager = Pager::builder().budget_pages(64).build().unwrap();
    // Other regions make each report's walk longer.
    let others: Vec<_> = (0..64)
        .map(|_| pager.map_anonymous(PAGES * PAGE).unwrap())
        .collect();
    let done = AtomicBool::new(false);
    /// Stops the reporter however the rounds end (a failed unwrap too).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !done.load(Relaxed) {
                std::hint::black_box(pager.memory_use());
            }
        });
        let stop = Stop(&done);
        let mut late = 0;
        for round in 0..ROUNDS {
            let store = Arc::new(MemoryStore::new((PAGES * PAGE) as u64).unwrap());
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let mut r =
                unsafe { pager.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }
                    .unwrap();
            let v = (round % 251) as u8 + 1;
            r.as_mut_slice()[PAGE + 3] = v;
            r.unmap().unwrap();
            let mut page = vec![0u8; PAGE];
            store.read(PAGE as u64, &mut page).unwrap();
            if page[3] != v {
                late += 1;
            }
        }
        drop(stop);
        assert_eq!(
            late, 0,
            "unmaps that returned before their write-back, of {ROUNDS}"
        );
    });
    drop(others);
}
