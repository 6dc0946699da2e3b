//! Reclaim beside a store in its write backoff (`write_error`): a dirty
//! page the store refuses does not hide the clean pages that wait in an
//! add batch, and a 2 MiB anonymous page asks for a write permit whenever
//! it is written, also when the page reclaim found clean was made
//! writable under it (`Region::protect(true)` clears the clean mark under
//! the region's write lock, between reclaim's first look, under the page
//! lock, and its unmap, under the region's read lock).
//!
//! The 2 MiB test reserves the huge pages it needs as root and gives them
//! back ([`huge_util::HugePool`]).

#[path = "engine_util.rs"]
mod util;

#[path = "huge_util.rs"]
mod huge_util;

use huge_util::HugePool;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uffd_pager::store::{Store, StoreError};
use uffd_pager::testing::{set_after_lookup, Site};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager, HUGE_PAGE_SIZE};
use util::{huge_opts, PAGE};

const HUGE: usize = HUGE_PAGE_SIZE;
/// The budget's 4 KiB units in one huge page.
const UNITS: u64 = (HUGE / PAGE) as u64;

/// A store that reads as zeros and fails every write, recording the
/// offsets asked for.
struct Failing {
    len: u64,
    writes: Mutex<Vec<u64>>,
}

impl Failing {
    fn new(len: usize) -> Arc<Failing> {
        Arc::new(Failing {
            len: len as u64,
            writes: Mutex::default(),
        })
    }

    fn writes(&self) -> Vec<u64> {
        self.writes.lock().unwrap().clone()
    }
}

impl Store for Failing {
    fn len(&self) -> u64 {
        self.len
    }
    fn read(&self, _: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        buf.fill(0);
        Ok(())
    }
    fn write(&self, offset: u64, _: &[u8]) -> Result<(), StoreError> {
        self.writes.lock().unwrap().push(offset);
        Err(StoreError(libc::EIO))
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "failing"
    }
}

/// The swap store an anonymous region was given, once it is mapped.
type Made = Arc<Mutex<Option<Arc<Failing>>>>;

/// A pager with no kswapd whose anonymous regions swap to a [`Failing`]
/// store each (the last one made is in the [`Made`]).
fn pager() -> (Pager, Made) {
    let swap = Made::default();
    let made = swap.clone();
    // SAFETY: the swap store is made here and kept by the pager alone.
    let b = unsafe {
        Pager::builder().swap_to(move |len| {
            let s = Failing::new(len);
            *made.lock().unwrap() = Some(s.clone());
            Ok(s as Arc<dyn Store>)
        })
    };
    let pager = b
        .delivery(Delivery::InThread)
        .budget_pages(4 * UNITS)
        .kswapd(false)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    (pager, swap)
}

/// Page 1 of a shared region written, and its write to the store failed:
/// it stays, dirty, and the store's backoff refuses it. Page 0, read
/// after, waits in this CPU's add batch. `reclaim_pages` frees page 0.
/// Before, it rotated page 1 through the ring, which never ran dry and so
/// was never drained, and freed nothing (kswapd alike).
#[test]
fn a_page_the_store_refuses_does_not_hide_the_clean_ones_in_add_batches() {
    let (pager, _) = pager();
    let store = Failing::new(2 * PAGE);
    let opts = MapOptions {
        kind: Some(InstallKind::Shared),
        writable: true,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region.
    let mut region =
        unsafe { pager.map_store(store.clone() as Arc<dyn Store>, 2 * PAGE, &opts) }.unwrap();
    region.as_mut_slice()[PAGE + 5] = 7;
    assert_eq!(pager.reclaim_pages(1), 0, "{}", pager.stats());
    assert_eq!(store.writes(), [PAGE as u64]);
    assert_eq!(region.as_slice()[9], 0);
    assert_eq!(pager.stats().resident_pages, 2);
    assert_eq!(pager.reclaim_pages(1), 1, "{}", pager.stats());
    assert_eq!(pager.stats().resident_pages, 1);
    assert_eq!(region.as_slice()[PAGE + 5], 7);
}

thread_local! {
    /// Set in the thread that runs the reclaim the hook stops.
    static RECLAIMER: Cell<bool> = const { Cell::new(false) };
}
/// The hook stops the reclaimer's next lookup (once), says so in
/// `STOPPED`, and waits for `PROTECTED` (10 s at most).
static ARMED: AtomicBool = AtomicBool::new(false);
static STOPPED: AtomicBool = AtomicBool::new(false);
static PROTECTED: AtomicBool = AtomicBool::new(false);

fn until_protected(_: &Site<'_>) {
    if !RECLAIMER.with(Cell::get) || !ARMED.swap(false, SeqCst) {
        return;
    }
    STOPPED.store(true, SeqCst);
    let t = Instant::now();
    while !PROTECTED.load(SeqCst) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Page 1 of a region is dirty and its swap store failing (reclaim holds
/// off writes to it for a backoff); page 0 was only read, so reclaim
/// found it clean and asked for no permit. `protect(true)` lands between
/// that look and the unmap. Before, the unmap then copied page 0 and
/// wrote it to the failing store in its backoff (2 MiB, with no bound on
/// how many while the backoff was meant to hold writes off); now it
/// leaves the page for a later look, which asks.
#[test]
fn a_huge_page_made_writable_during_its_eviction_is_not_written_in_a_backoff() {
    let _pool = HugePool::take(2);
    let (pager, swap) = pager();
    let mut region = pager
        .map_anonymous_with(2 * HUGE, &huge_opts(InstallKind::Anonymous))
        .unwrap();
    let swap = swap
        .lock()
        .unwrap()
        .clone()
        .expect("the region's swap store");

    // Page 1 dirty; its write-back fails, five times in a row, so that the
    // store's backoff is 1.6 s long when the test goes on.
    region.as_mut_slice()[HUGE + 5] = 7;
    let t = Instant::now();
    while swap.writes().len() < 5 {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", swap.writes());
        pager.reclaim_pages(UNITS);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(swap.writes().iter().all(|&o| o == HUGE as u64));
    // Page 0 only read: installed clean.
    assert_eq!(region.as_slice()[9], 0);
    let before = swap.writes().len();

    STOPPED.store(false, SeqCst);
    PROTECTED.store(false, SeqCst);
    ARMED.store(true, SeqCst);
    set_after_lookup(Some(until_protected));
    std::thread::scope(|s| {
        let reclaimer = s.spawn(|| {
            RECLAIMER.with(|r| r.set(true));
            pager.reclaim_pages(2 * UNITS)
        });
        let t = Instant::now();
        while !STOPPED.load(SeqCst) && !reclaimer.is_finished() {
            assert!(t.elapsed() < Duration::from_secs(10), "no lookup came");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            STOPPED.load(SeqCst),
            "reclaim never unmapped page 0\n{}",
            pager.stats()
        );
        region.protect(true).unwrap();
        PROTECTED.store(true, SeqCst);
        reclaimer.join().unwrap();
    });
    set_after_lookup(None);
    let after = swap.writes();
    assert!(
        after[before..].iter().all(|&o| o != 0),
        "page 0 written to the failing store during its backoff: {after:?}"
    );
    // Written to, page 0 keeps its byte, and page 1 its own.
    region.as_mut_slice()[9] = 3;
    assert_eq!(region.as_slice()[9], 3);
    assert_eq!(region.as_slice()[HUGE + 5], 7);
}
