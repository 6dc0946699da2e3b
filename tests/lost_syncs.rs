//! A store whose failed sync loses the writes it was to make durable, as
//! a file's `fsync` can (the kernel drops the failed pages from its cache
//! and reports the error once): every call that met such a failure
//! reports it, and none says Ok over pages that were lost.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uffd_pager::store::{Store, StoreError};
use uffd_pager::{MapOptions, Pager};
use util::PAGE;

/// Writes go to `staged`; a sync moves them to `durable`, or, failing
/// (once, when `fail_next` is set), drops them and answers EIO.
struct Staged {
    durable: Mutex<Vec<u8>>,
    staged: Mutex<Vec<(u64, Vec<u8>)>>,
    fail_next: AtomicBool,
    /// A sync waits while this is set (10 s at most), saying so in
    /// `in_sync`.
    hold_sync: AtomicBool,
    in_sync: AtomicBool,
}

impl Staged {
    fn new(pages: usize) -> Arc<Staged> {
        Arc::new(Staged {
            durable: Mutex::new(vec![0; pages * PAGE]),
            staged: Mutex::default(),
            fail_next: AtomicBool::new(false),
            hold_sync: AtomicBool::new(false),
            in_sync: AtomicBool::new(false),
        })
    }

    fn durable(&self) -> Vec<u8> {
        self.durable.lock().unwrap().clone()
    }
}

impl Store for Staged {
    fn len(&self) -> u64 {
        self.durable.lock().unwrap().len() as u64
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let o = offset as usize;
        buf.copy_from_slice(&self.durable.lock().unwrap()[o..o + buf.len()]);
        for (at, bytes) in self.staged.lock().unwrap().iter() {
            let (at, end) = (*at as usize, *at as usize + bytes.len());
            let (lo, hi) = (at.max(o), end.min(o + buf.len()));
            if lo < hi {
                buf[lo - o..hi - o].copy_from_slice(&bytes[lo - at..hi - at]);
            }
        }
        Ok(())
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.staged.lock().unwrap().push((offset, buf.to_vec()));
        Ok(())
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.in_sync.store(true, SeqCst);
        let t = Instant::now();
        while self.hold_sync.load(SeqCst) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let staged = std::mem::take(&mut *self.staged.lock().unwrap());
        if self.fail_next.swap(false, SeqCst) {
            return Err(StoreError(libc::EIO));
        }
        let mut d = self.durable.lock().unwrap();
        for (at, bytes) in staged {
            d[at as usize..at as usize + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }
    fn writable(&self) -> bool {
        true
    }
    fn contents_stamp(&self) -> Option<u64> {
        Some(1)
    }
    fn name(&self) -> &'static str {
        "staged"
    }
}

/// A writable region over all of `store`'s `pages` pages.
fn writable_region(pager: &Pager, store: Arc<dyn Store>, pages: usize) -> uffd_pager::Region {
    let opts = MapOptions {
        writable: true,
        ..MapOptions::default()
    };
    // SAFETY: each test changes its store only through the region (and,
    // in `flush_range`'s, behind it only between a flush_range and a
    // refresh).
    unsafe { pager.map_store(store, pages * PAGE, &opts) }.unwrap()
}

/// Pages written, then evicted by reclaim (written to the store, not yet
/// synced); the region is unmapped while the caller holds the store too,
/// so its object may be kept for a later map (`keep_unmapped`), and the
/// unmap's sync fails: the evicted pages are lost, and the unmap says so.
/// Before, that write-back's error was dropped, the release's own try
/// synced again with success, and the unmap returned Ok over zeros.
#[test]
fn an_unmap_whose_sync_loses_evicted_pages_reports_it() {
    let pager = Pager::builder()
        .budget_pages(64)
        .kswapd(false)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let store = Staged::new(4);
    let mut r = writable_region(&pager, store.clone() as Arc<dyn Store>, 4);
    r.as_mut_slice().fill(7);
    assert_eq!(pager.reclaim_pages(4), 4, "{}", pager.stats());
    store.fail_next.store(true, SeqCst);
    let res = r.unmap();
    assert!(
        res.is_err() || store.durable().iter().all(|&b| b == 7),
        "the unmap returned Ok and the store holds {:?}",
        &store.durable()[..8]
    );
}

/// A flush, or a `flush_range`, that comes while another flush's sync of
/// the same page is in flight passes the page by (it is not dirty), and
/// that sync then fails: the page is not durable, and the second call
/// says so or writes it itself. Before, it synced the store (which had
/// dropped the page) with success and said Ok, the page dirty again.
#[test]
fn a_flush_beside_a_failing_sync_does_not_say_ok_over_its_page() {
    for second_is_range in [false, true] {
        let ctx = if second_is_range {
            "flush_range"
        } else {
            "flush"
        };
        let pager = Pager::builder().readahead(0, 1).build().unwrap();
        let store = Staged::new(4);
        let mut r = writable_region(&pager, store.clone() as Arc<dyn Store>, 4);
        r.as_mut_slice()[0] = 1;
        store.fail_next.store(true, SeqCst);
        store.hold_sync.store(true, SeqCst);
        let r = &r;
        std::thread::scope(|s| {
            let a = s.spawn(|| r.flush());
            let t = Instant::now();
            while !store.in_sync.load(SeqCst) {
                assert!(t.elapsed() < Duration::from_secs(10), "{ctx}: no sync came");
                std::thread::sleep(Duration::from_millis(1));
            }
            let b = s.spawn(|| {
                if second_is_range {
                    r.flush_range(0, PAGE as u64)
                } else {
                    r.flush()
                }
            });
            std::thread::sleep(Duration::from_millis(100));
            store.hold_sync.store(false, SeqCst);
            assert!(a.join().unwrap().is_err(), "{ctx}: the failed sync's flush");
            let b = b.join().unwrap();
            assert!(
                b.is_err() || store.durable()[0] == 1,
                "{ctx}: the second call said Ok and the store holds {}",
                store.durable()[0]
            );
        });
    }
}

/// `flush_range` over a dirty page under a residency guard: the page is
/// written from a copy and stays dirty (a system call may be writing into
/// it), so the range is not clean, and the call says so (EBUSY) instead
/// of Ok; a later write-back would put the copy over a change made behind
/// the engine. With the guard dropped, the range flushes clean.
#[test]
fn flush_range_over_a_guarded_dirty_page_is_not_ok() {
    let pager = Pager::builder().readahead(0, 1).build().unwrap();
    let store = Arc::new(uffd_pager::store::MemoryStore::new(4 * PAGE as u64).unwrap());
    let mut r = writable_region(&pager, store.clone() as Arc<dyn Store>, 4);
    r.as_mut_slice()[0] = 1;
    let guard = r.lock_resident(0, PAGE).unwrap();
    match r.flush_range(100, 4) {
        Err(uffd_pager::Error::Store(e)) if e.0 == libc::EBUSY => {}
        other => panic!("flush_range under a guard: {other:?}"),
    }
    drop(guard);
    r.flush_range(100, 4).unwrap();
    Store::write(&*store, 100, &[0xee; 4]).unwrap();
    r.refresh(100, 4).unwrap();
    r.flush().unwrap();
    let mut b = [0u8; 104];
    store.read(0, &mut b).unwrap();
    assert_eq!((b[0], &b[100..]), (1, &[0xee; 4][..]));
}

/// The same over an anonymous region: it writes nothing to its store (its
/// pages are a private copy), so a guarded dirty page leaves nothing
/// behind that a later write-back could put over a change, and the call
/// is Ok, as `flush` is. It said EBUSY.
#[test]
fn flush_range_over_a_guarded_dirty_anonymous_page_is_ok() {
    let pager = Pager::builder().readahead(0, 1).build().unwrap();
    let mut r = pager.map_anonymous(4 * PAGE).unwrap();
    r.as_mut_slice()[0] = 1;
    let guard = r.lock_resident(0, PAGE).unwrap();
    r.flush().unwrap();
    r.flush_range(0, PAGE as u64).unwrap();
    drop(guard);
    assert_eq!(r.as_slice()[0], 1);
}

/// A region the application cut into five pieces with its own `munmap`s:
/// the engine keeps the addresses of four of its store's pieces, so a
/// dirty page of the fifth cannot be write-protected for its write-back.
/// It is written from a copy and stays dirty, and a later write-back
/// would put that copy over the change the caller flushed the range
/// before. `flush_range` said Ok over it; it is not clean, so EBUSY.
#[test]
fn flush_range_over_a_page_it_cannot_protect_is_not_ok() {
    let pager = Pager::builder().readahead(0, 1).build().unwrap();
    let store = Arc::new(uffd_pager::store::MemoryStore::new(10 * PAGE as u64).unwrap());
    let mut r = writable_region(&pager, store.clone() as Arc<dyn Store>, 10);
    let base = r.as_mut_slice().as_mut_ptr() as usize;
    for hole in [1, 3, 5, 7] {
        // SAFETY: the application's own munmap of one page of region
        // memory, of which no slice is alive; none is made of it later.
        assert_eq!(
            unsafe { libc::munmap((base + hole * PAGE) as *mut _, PAGE) },
            0
        );
    }
    // Page 8 lies in the fifth piece (the last cut off).
    // SAFETY: page 8 is still the region's; no slice of it is alive.
    unsafe { *((base + 8 * PAGE) as *mut u8) = 9 };
    // A page in a piece the engine knows is flushed clean.
    // SAFETY: as above, page 0.
    unsafe { *(base as *mut u8) = 7 };
    r.flush_range(0, PAGE as u64).unwrap();
    match r.flush_range(8 * PAGE as u64, 4) {
        Err(uffd_pager::Error::Store(e)) if e.0 == libc::EBUSY => {}
        other => panic!("flush_range over a page left dirty: {other:?}"),
    }
    // Its bytes reached the store all the same.
    let mut b = [0u8; 1];
    store.read(8 * PAGE as u64, &mut b).unwrap();
    assert_eq!(b[0], 9);
    r.flush().unwrap();
}
