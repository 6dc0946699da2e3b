//! A burst of faults on a store that is slow but healthy: more requests at
//! once than the I/O workers have slots for. Each waits for a slot within
//! its timeout. Before, a request that found every slot taken failed at
//! once, counted as a failed read, and three of them poisoned the page: 32
//! of 96 faults here got SIGBUS (a failed `populate`) from a store that
//! never failed.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{Store, StoreError};
use uffd_pager::{Counter, InstallKind, MapOptions, Pager};
use util::PAGE;

const PAGES: usize = 96;

/// Every read takes 30 ms and succeeds; it is ordinary Rust (not
/// signal-safe), so the engine calls it on its I/O workers.
struct Slow;

impl Store for Slow {
    fn len(&self) -> u64 {
        (PAGES * PAGE) as u64
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        std::thread::sleep(std::time::Duration::from_millis(30));
        buf.fill((offset / PAGE as u64) as u8 + 1);
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "slow"
    }
}

#[test]
fn a_burst_of_faults_on_a_slow_store_waits_for_io_slots() {
    let pager = Pager::builder()
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the store's bytes never change (the store contract).
    let region = unsafe { pager.map_store(Arc::new(Slow), PAGES * PAGE, &opts) }.unwrap();
    let failed: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..PAGES)
            .map(|p| {
                let region = &region;
                s.spawn(move || region.populate(p * PAGE, PAGE).is_err() as usize)
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let st = pager.stats();
    assert_eq!(failed, 0, "faults that failed\n{st}");
    assert_eq!(st.get(Counter::POISONED), 0, "{st}");
    for p in 0..PAGES {
        assert_eq!(region.as_slice()[p * PAGE + 9], p as u8 + 1, "page {p}");
    }
}
