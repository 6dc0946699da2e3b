//! Readahead and the application's own `munmap` (a non-cooperative
//! event, applied under the event gate's write side).

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{LatencyModel, MemoryStore, SimulatedStore, Store};
use uffd_pager::{InstallKind, MapOptions, Pager};
use util::*;

const REGIONS: usize = 64;
const PAGES: usize = 64;
/// Each store read takes this long.
const LATENCY: Duration = Duration::from_millis(2);

/// A readahead thread read its queued requests in one section of the
/// event gate, one store call after another for as long as the queue
/// held any: with a backlog of a couple of thousand guessed pages over a
/// store of 2 ms a read, an application's `munmap` of region memory
/// waited seconds for it (and every fault meanwhile, as new sections wait
/// while an event does). It now leaves its section between runs when an
/// event waits.
#[test]
fn a_munmap_does_not_wait_for_the_readahead_backlog() {
    let pager = Pager::builder()
        .readahead(32, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: false,
        ..MapOptions::default()
    };
    let data = pattern_vec(3, PAGES * PAGE);
    let regions: Vec<_> = (0..REGIONS)
        .map(|_| {
            let mem = Arc::new(MemoryStore::from_bytes(&data).unwrap());
            let model = LatencyModel::Fixed {
                ns: LATENCY.as_nanos() as u64,
            };
            let store: Arc<dyn Store> = Arc::new(SimulatedStore::new(mem, model, 0, 1));
            // SAFETY: nothing writes the store.
            unsafe { pager.map_store(store, data.len(), &opts) }.unwrap()
        })
        .collect();
    // A few sequential faults on each region ramp its window up to 32
    // pages: a backlog of about 30 pages per region for the one
    // readahead thread, a store call each (the store is signal-safe and
    // does not batch reads).
    for k in 0..5 {
        for r in &regions {
            assert_eq!(r.as_slice()[k * PAGE], data[k * PAGE]);
        }
    }
    let anon = pager.map_anonymous(4 * PAGE).unwrap();
    let last = anon.as_ptr() as usize + 3 * PAGE;
    let t = Instant::now();
    // SAFETY: the last page of a region nothing else uses: the engine
    // hears of it (UFFD_EVENT_UNMAP) and leaves it alone.
    assert_eq!(unsafe { libc::munmap(last as *mut libc::c_void, PAGE) }, 0);
    let took = t.elapsed();
    let rest = pager.stats().get(uffd_pager::Counter::RA_PAGES);
    println!("munmap took {took:?} ({rest} pages read ahead by then)");
    assert!(
        took < Duration::from_millis(500),
        "munmap of region memory took {took:?}, waiting for readahead's guesses"
    );
    drop(anon);
    drop(regions);
}
