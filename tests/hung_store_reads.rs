//! A store whose read never returns beside a healthy one, both served on
//! the I/O workers: the hung store holds one worker, not all of them.
//! Before, a fault's read that timed out was sent again at once, and its
//! retry took the next worker into the store that had not answered; the
//! healthy store's reads then queued behind them, timed out and failed
//! (found by review). Now a read given up on is not sent again while it
//! is still inside the store: a read of the same offset fails at once,
//! until that read returns (reads of other offsets go on:
//! `guest_hang::other_pages_are_served_while_one_read_hangs`), but one
//! store has at most one fewer calls inside it than there are workers.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use uffd_pager::store::{MemoryStore, Store, StoreError};
use uffd_pager::{MapOptions, Pager};
use util::OnWorkers;

const PAGE: usize = 4096;

/// A store whose reads wait while it is frozen (20 s at most).
struct Hung {
    frozen: Mutex<bool>,
    thawed: Condvar,
    reads: AtomicUsize,
}

impl Store for Hung {
    fn len(&self) -> u64 {
        (4 * PAGE) as u64
    }
    fn read(&self, _: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.reads.fetch_add(1, SeqCst);
        let t = Instant::now();
        let mut f = self.frozen.lock().unwrap();
        while *f && t.elapsed() < Duration::from_secs(20) {
            f = self
                .thawed
                .wait_timeout(f, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        buf.fill(1);
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
        Err(StoreError(libc::EROFS))
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "hung"
    }
}

/// A pager with two I/O workers (and the spare) and a 200 ms timeout,
/// a frozen [`Hung`] store and a healthy one of 7s, each mapped
/// read-only over four pages.
fn hung_beside_healthy() -> (Pager, Arc<Hung>, uffd_pager::Region, uffd_pager::Region) {
    let p = Pager::builder()
        .io_threads(2)
        .io_timeout(Duration::from_millis(200))
        .readahead(0, 1)
        .fault_around(0)
        .kswapd(false)
        .build()
        .unwrap();
    let hung = Arc::new(Hung {
        frozen: Mutex::new(true),
        thawed: Condvar::new(),
        reads: AtomicUsize::new(0),
    });
    let plain = Arc::new(OnWorkers {
        inner: MemoryStore::from_bytes(&[7; 4 * PAGE]).unwrap(),
        delay: Duration::ZERO,
    });
    let opts = MapOptions {
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: nothing writes either store.
    let a = unsafe { p.map_store(hung.clone() as Arc<dyn Store>, 4 * PAGE, &opts) }.unwrap();
    // SAFETY: as above.
    let b = unsafe { p.map_store(plain as Arc<dyn Store>, 4 * PAGE, &opts) }.unwrap();
    (p, hung, a, b)
}

/// Waits until `n` reads have come into the hung store.
fn reads_came(hung: &Hung, n: usize) {
    let t = Instant::now();
    while hung.reads.load(SeqCst) < n {
        assert!(t.elapsed() < Duration::from_secs(10), "no read came");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Thaws the hung store.
fn thaw(hung: &Hung) {
    *hung.frozen.lock().unwrap() = false;
    hung.thawed.notify_all();
}

/// Waits past the I/O timeout, reads the whole healthy region `b` and
/// thaws the hung store; asserts the healthy reads were served and
/// returns how many reads had come into the hung one.
fn healthy_served_past_the_timeout(p: &Pager, hung: &Hung, b: &uffd_pager::Region) -> usize {
    std::thread::sleep(Duration::from_millis(400));
    let served = b.populate(0, 4 * PAGE);
    let reads = hung.reads.load(SeqCst);
    thaw(hung);
    assert!(
        served.is_ok() && b.as_slice().iter().all(|&x| x == 7),
        "the healthy store's reads failed beside the hung one ({reads} reads went into \
         it): {served:?}\n{}",
        p.stats()
    );
    reads
}

#[test]
fn a_hung_store_holds_one_worker_and_the_other_store_is_served() {
    let (p, hung, a, b) = hung_beside_healthy();
    std::thread::scope(|s| {
        let stuck = s.spawn(|| a.populate(0, PAGE));
        reads_came(&hung, 1);
        // Past the first read's timeout, where its retries were sent.
        let reads = healthy_served_past_the_timeout(&p, &hung, &b);
        assert_eq!(reads, 1, "reads sent into the store that had not answered");
        assert!(stuck.join().unwrap().is_err(), "the hung store's read");
    });
}

/// Faults on three pages of the hung store at once: each read went into
/// it, on a worker of its own, until none was left for the healthy store,
/// whose reads timed out and failed (found by review). One store has at
/// most one fewer calls inside it than there are workers now (two of the
/// three here), and the third worker serves the healthy store.
#[test]
fn faults_on_many_pages_of_a_hung_store_leave_a_worker_for_the_other() {
    let (p, hung, a, b) = hung_beside_healthy();
    std::thread::scope(|s| {
        let stuck: Vec<_> = (0..3)
            .map(|k| {
                let a = &a;
                s.spawn(move || a.populate(k * PAGE, PAGE))
            })
            .collect();
        reads_came(&hung, 2);
        // Past the reads' timeout: they are given up on, still inside.
        let reads = healthy_served_past_the_timeout(&p, &hung, &b);
        assert_eq!(reads, 2, "calls inside the hung store at once");
        for t in stuck {
            let _ = t.join().unwrap();
        }
    });
}
