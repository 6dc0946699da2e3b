//! Handler-thread delivery wakes the faults of a batch once per run of
//! pages, after the batch. A fault it served must not wait behind a later
//! one of the batch that waits for a slow store read: before, a thread
//! whose page was in slept until the slow read was done (up to the I/O
//! timeout per attempt).

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{Store, StoreError};
use uffd_pager::{Delivery, MapOptions, Pager};
use util::PAGE;

/// Pages 0 and 2 take `SLOW` to read; page 1 none. Not signal-safe: its
/// reads run on the I/O workers while the handler thread waits.
struct Slow;

const SLOW: Duration = Duration::from_secs(2);

impl Store for Slow {
    fn len(&self) -> u64 {
        4 * PAGE as u64
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if offset != PAGE as u64 {
            std::thread::sleep(SLOW);
        }
        buf.fill((offset / PAGE as u64) as u8 + 1);
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
        Err(StoreError(libc::EROFS))
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "slow"
    }
}

#[test]
fn a_served_fault_is_woken_before_a_slow_one_of_its_batch() {
    let pager = Pager::builder()
        .delivery(Delivery::Threads {
            threads: 1,
            spin_us: 0,
        })
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let opts = MapOptions {
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the store's bytes never change.
    let r = unsafe { pager.map_store(Arc::new(Slow), 4 * PAGE, &opts) }.unwrap();
    let base = r.as_ptr() as usize;
    let t0 = Instant::now();
    let touch = |page: usize, after: Duration| {
        std::thread::spawn(move || {
            std::thread::sleep(after);
            // SAFETY: inside the region, which outlives the threads
            // (joined below).
            let b = unsafe { std::ptr::read_volatile((base + page * PAGE) as *const u8) };
            assert_eq!(b, page as u8 + 1);
            Instant::now()
        })
    };
    // The handler serves page 0 (slow) while pages 1 and 2 fault: their
    // messages come as one batch after it, page 1's first.
    let a = touch(0, Duration::ZERO);
    let b = touch(1, Duration::from_millis(200));
    let c = touch(2, Duration::from_millis(400));
    let (a, b, c) = (a.join().unwrap(), b.join().unwrap(), c.join().unwrap());
    let (a, b, c) = (a - t0, b - t0, c - t0);
    eprintln!("page 0 at {a:?}, page 1 at {b:?}, page 2 at {c:?}");
    assert!(
        b + SLOW / 2 < c,
        "page 1's thread waited for page 2's read: page 1 at {b:?}, page 2 at {c:?}"
    );
}
