//! Tests of [`crate::io`]: timeouts, late answers, stale writes.

use super::*;
use crate::store::MemoryStore;

/// A store that is not signal-safe and whose reads of page 1 never
/// return (until `release`), and whose page 2 panics.
struct Stuck {
    inner: MemoryStore,
    release: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Store for Stuck {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        match off / PAGE_SIZE as u64 {
            1 => {
                let mut g = self.release.lock().unwrap();
                while !*g {
                    g = self.cv.wait(g).unwrap();
                }
            }
            2 => panic!("a store bug"),
            _ => {}
        }
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write(off, buf)
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "stuck"
    }
}

#[test]
fn calls_end_within_the_timeout_and_late_answers_are_dropped() {
    let io = Arc::new(Io::new(500_000_000, 0).unwrap());
    let mut workers = Vec::new();
    start(&io, |io| io, 2, &mut workers).unwrap();
    let stuck = Arc::new(Stuck {
        inner: MemoryStore::from_bytes(&[7u8; 4 * PAGE_SIZE]).unwrap(),
        release: std::sync::Mutex::new(false),
        cv: std::sync::Condvar::new(),
    });
    let store: Arc<dyn Store> = stuck.clone();
    let mut buf = [0u8; PAGE_SIZE];
    io.read(&store, 0, &mut buf).unwrap();
    assert_eq!(buf[9], 7);
    let t = std::time::Instant::now();
    assert_eq!(
        io.read(&store, PAGE_SIZE as u64, &mut buf),
        Err(StoreError(libc::ETIMEDOUT))
    );
    assert!(t.elapsed() >= std::time::Duration::from_millis(500));
    // A panic is given a patient queue of its own: unwinding with
    // `RUST_BACKTRACE` set symbolises a backtrace, which on a loaded
    // machine outlasts the 500 ms above (CI saw ETIMEDOUT here).
    let patient = Arc::new(Io::new(60_000_000_000, 0).unwrap());
    start(&patient, |io| io, 1, &mut workers).unwrap();
    assert_eq!(
        patient.read(&store, 2 * PAGE_SIZE as u64, &mut buf),
        Err(StoreError(libc::EIO)),
        "a panic is a failed read"
    );
    // The workers serve the next call (the one that caught the panic
    // among them).
    patient.read(&store, 0, &mut buf).unwrap();
    assert_eq!(buf[9], 7);
    patient.stop();
    io.write(&store, &[(3 * PAGE_SIZE as u64, &[5u8; PAGE_SIZE])])
        .unwrap();
    io.read(&store, 3 * PAGE_SIZE as u64, &mut buf).unwrap();
    assert_eq!(buf[0], 5);
    // The read given up on is not sent again while it is inside the
    // store: a read of its page fails at once.
    let t = std::time::Instant::now();
    assert_eq!(
        io.read(&store, PAGE_SIZE as u64, &mut buf),
        Err(StoreError(libc::ETIMEDOUT))
    );
    assert!(t.elapsed() < std::time::Duration::from_millis(500));
    // The stuck call returns late; its slot is freed, nothing else.
    *stuck.release.lock().unwrap() = true;
    stuck.cv.notify_all();
    for _ in 0..SLOTS * 2 {
        io.read(&store, 0, &mut buf).unwrap();
    }
    io.stop();
    for w in workers {
        w.join().unwrap();
    }
}

/// A store whose writes block until released, recording what landed.
struct SlowWrites {
    inner: MemoryStore,
    open: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Store for SlowWrites {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        let mut g = self.open.lock().unwrap();
        while !*g {
            g = self.cv.wait(g).unwrap();
        }
        self.inner.write(off, buf)
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "slow-writes"
    }
}

#[test]
fn a_write_given_up_on_blocks_newer_writes_of_its_pages_until_it_returns() {
    let io = Arc::new(Io::new(200_000_000, 0).unwrap());
    let mut workers = Vec::new();
    start(&io, |io| io, 2, &mut workers).unwrap();
    let slow = Arc::new(SlowWrites {
        inner: MemoryStore::new(4 * PAGE_SIZE as u64).unwrap(),
        open: std::sync::Mutex::new(false),
        cv: std::sync::Condvar::new(),
    });
    let store: Arc<dyn Store> = slow.clone();
    let p1 = PAGE_SIZE as u64;
    let old = [1u8; PAGE_SIZE];
    let new = [2u8; PAGE_SIZE];
    // The old contents' write times out but stays in the store call.
    assert_eq!(
        io.write(&store, &[(p1, &old)]),
        Err(StoreError(libc::ETIMEDOUT))
    );
    // A newer write of the same page must not race it...
    assert_eq!(
        io.write(&store, &[(p1, &new)]),
        Err(StoreError(libc::EBUSY))
    );
    // ...while other pages are written (once the store lets them).
    *slow.open.lock().unwrap() = true;
    slow.cv.notify_all();
    io.write(&store, &[(2 * p1, &new)]).unwrap();
    // The old write has returned: the page can be written again, and
    // the newest contents are what the store keeps.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while io.write(&store, &[(p1, &new)]) == Err(StoreError(libc::EBUSY)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned write never returned"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let mut buf = [0u8; PAGE_SIZE];
    slow.inner.read(p1, &mut buf).unwrap();
    assert_eq!(buf, new);
    io.stop();
    for w in workers {
        w.join().unwrap();
    }
}

/// A store whose first sync blocks until released, then fails.
struct SlowFailingSync {
    inner: MemoryStore,
    release: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
    syncs: std::sync::atomic::AtomicU32,
}

impl Store for SlowFailingSync {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write(off, buf)
    }
    fn sync(&self) -> Result<(), StoreError> {
        if self.syncs.fetch_add(1, SeqCst) > 0 {
            return Ok(());
        }
        let mut g = self.release.lock().unwrap();
        while !*g {
            g = self.cv.wait(g).unwrap();
        }
        Err(StoreError(libc::EIO))
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "slow failing sync"
    }
}

/// A sync given up on (past the timeout) that goes on and fails takes the
/// kernel's one report of the failure with it: while it runs another sync
/// of the store is refused, and once it failed the next one reports it.
/// (Before, the second sync ran beside it and said Ok.)
#[test]
fn a_sync_given_up_on_blocks_the_next_and_passes_its_failure_on() {
    let io = Arc::new(Io::new(200_000_000, 0).unwrap());
    let mut workers = Vec::new();
    start(&io, |io| io, 2, &mut workers).unwrap();
    let slow = Arc::new(SlowFailingSync {
        inner: MemoryStore::new(PAGE_SIZE as u64).unwrap(),
        release: std::sync::Mutex::new(false),
        cv: std::sync::Condvar::new(),
        syncs: Default::default(),
    });
    let store: Arc<dyn Store> = slow.clone();
    assert_eq!(io.sync(&store), Err(StoreError(libc::ETIMEDOUT)));
    assert_eq!(
        io.sync(&store),
        Err(StoreError(libc::EBUSY)),
        "still running"
    );
    *slow.release.lock().unwrap() = true;
    slow.cv.notify_all();
    // (Until the worker has recorded the failure and freed the slot.)
    let mut r = io.sync(&store);
    while r == Err(StoreError(libc::EBUSY)) {
        std::thread::sleep(std::time::Duration::from_millis(5));
        r = io.sync(&store);
    }
    assert_eq!(r, Err(StoreError(libc::EIO)), "its failure, reported once");
    assert_eq!(io.sync(&store), Ok(()));
    assert_eq!(slow.syncs.load(SeqCst), 2);
    io.stop();
    for w in workers {
        w.join().unwrap();
    }
}

/// A store that is not signal-safe and whose reads succeed without writing
/// a byte (a sparse store that leaves a page it does not have as it is).
struct Leaves;

impl Store for Leaves {
    fn len(&self) -> u64 {
        4 * PAGE_SIZE as u64
    }
    fn read(&self, _: u64, _: &mut [u8]) -> Result<(), StoreError> {
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "leaves"
    }
}

#[test]
fn a_read_a_store_leaves_unwritten_is_zeros_not_the_last_requests_bytes() {
    let io = Arc::new(Io::new(5_000_000_000, 0).unwrap());
    let mut workers = Vec::new();
    // One after the other, both requests take slot 0 and its buffer.
    start(&io, |io| io, 1, &mut workers).unwrap();
    let secret: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&[0xAA; PAGE_SIZE]).unwrap());
    let mut buf = [0u8; PAGE_SIZE];
    io.read(&secret, 0, &mut buf).unwrap();
    assert_eq!(buf[0], 0xAA);
    let leaves: Arc<dyn Store> = Arc::new(Leaves);
    let mut buf = [0x55u8; PAGE_SIZE];
    io.read(&leaves, 0, &mut buf).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0),
        "the other request's bytes came back: {:#x}",
        buf[0]
    );
    io.stop();
}

/// A store whose reads wait `ms` and whose drop panics.
struct PanicsOnDrop {
    ms: u64,
}

impl Store for PanicsOnDrop {
    fn len(&self) -> u64 {
        PAGE_SIZE as u64
    }
    fn read(&self, _: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        std::thread::sleep(std::time::Duration::from_millis(self.ms));
        buf.fill(1);
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "panics-on-drop"
    }
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("a store's drop panicked");
    }
}

#[test]
fn a_store_whose_drop_panics_on_a_worker_leaves_the_worker_serving() {
    let io = Arc::new(Io::new(50_000_000, 0).unwrap());
    let mut workers = Vec::new();
    start(&io, |io| io, 1, &mut workers).unwrap();
    let slow: Arc<dyn Store> = Arc::new(PanicsOnDrop { ms: 200 });
    let mut buf = [0u8; PAGE_SIZE];
    assert_eq!(
        io.read(&slow, 0, &mut buf),
        Err(StoreError(libc::ETIMEDOUT))
    );
    // The worker now holds the last reference: it drops the store when
    // the read ends, and the drop panics.
    drop(slow);
    std::thread::sleep(std::time::Duration::from_millis(400));
    let fine: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&[3; PAGE_SIZE]).unwrap());
    assert_eq!(io.read(&fine, 0, &mut buf), Ok(()));
    assert_eq!(buf[0], 3);
    // (The spare worker would serve that read alone.)
    assert!(
        workers.iter().all(|w| !w.is_finished()),
        "a worker ended on the panic"
    );
    io.stop();
}
