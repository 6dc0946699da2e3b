//! An unmap that waits for a readahead run still reading into the region
//! (a store call under a pin of the object, as long as the store takes)
//! sleeps: it spun on `sched_yield`, a whole CPU for the length of the
//! store call.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{LatencyModel, MemoryStore, SimulatedStore};
use uffd_pager::{Delivery, MapOptions, Pager};
use util::*;

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One round: maps a region over a slow store, faults two pages in order
/// (each asks for a readahead run, read on the I/O thread after the fault
/// returns) and unmaps it 50 ms later; returns the unmap's wall and CPU
/// time.
fn round(p: &Pager) -> (Duration, Duration) {
    let pages = 64;
    let mem = Arc::new(MemoryStore::from_bytes(&pattern_vec(3, pages * PAGE)).unwrap());
    let slow = Arc::new(SimulatedStore::new(
        mem,
        LatencyModel::Fixed { ns: 300_000_000 },
        0,
        1,
    ));
    // SAFETY: nothing else changes the store.
    let r = unsafe { p.map_store(slow, pages * PAGE, &MapOptions::default()) }.unwrap();
    assert_eq!(r.as_slice()[0], pattern(3, 0));
    assert_eq!(r.as_slice()[PAGE], pattern(3, PAGE));
    // (Time for the I/O thread to take the run the second fault asked for:
    // an unmap that comes first cancels it, and nothing waits. CI's run of
    // the first version met that in three rounds of three.)
    std::thread::sleep(Duration::from_millis(50));
    let (t, cpu) = (Instant::now(), thread_cpu());
    r.unmap().unwrap();
    (t.elapsed(), thread_cpu() - cpu)
}

#[test]
fn an_unmap_waiting_for_a_readahead_run_sleeps() {
    with_deadline(60, "unmap wait", || {
        let p = Pager::builder()
            .delivery(Delivery::InThread)
            .readahead(16, 1)
            .fault_around(0)
            .build()
            .unwrap();
        // (Up to three rounds: where the I/O thread has not taken the run
        // by the unmap, nothing waits, and the round says nothing.)
        let mut waited = 0;
        for _ in 0..3 {
            let (wall, used) = round(&p);
            println!("the unmap took {wall:?}, {used:?} of CPU");
            if wall >= Duration::from_millis(100) {
                waited += 1;
                assert!(
                    used < wall / 4,
                    "the unmap spun: {used:?} of CPU in {wall:?}"
                );
            }
        }
        assert!(
            waited > 0,
            "no readahead run was in flight at any unmap: the case did not happen"
        );
    });
}
