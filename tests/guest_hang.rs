//! Every wait ends (`shared/design/guest.md`): a store read that never
//! returns times out into the read-error path, a store that panics fails
//! its call without taking a thread down, and a pager dropped with faults
//! in flight does not hang. The cases that end in a signal run in a child
//! process under a watchdog.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{MemoryStore, Store, StoreError};
use uffd_pager::{Counter, Delivery, MapOptions, Pager};
use util::*;

/// How a [`Misbehaving`] store treats page 1.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Its read never returns.
    Hang,
    /// Its read panics.
    Panic,
    /// Its read takes 300 ms.
    Slow,
    /// Its read waits until [`Gate::open`] (at most a minute).
    Gated,
}

/// Where a [`Mode::Gated`] read waits: (a read waits, the gate is open).
#[derive(Default)]
struct Gate {
    state: std::sync::Mutex<(bool, bool)>,
    cv: std::sync::Condvar,
}

impl Gate {
    fn open(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }

    /// Returns once a read waits at the gate.
    fn wait_for_reader(&self) {
        let mut st = self.state.lock().unwrap();
        while !st.0 {
            st = self.cv.wait(st).unwrap();
        }
    }

    fn pass(&self) {
        let mut st = self.state.lock().unwrap();
        st.0 = true;
        self.cv.notify_all();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !st.1 && Instant::now() < deadline {
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap()
                .0;
        }
    }
}

/// An application's store (not signal-safe, so the engine calls it on its
/// I/O workers) whose page 1 misbehaves; the others read a pattern.
struct Misbehaving {
    inner: MemoryStore,
    mode: Mode,
    gate: Gate,
}

impl Store for Misbehaving {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if off / PAGE as u64 == 1 {
            match self.mode {
                Mode::Hang => loop {
                    std::thread::sleep(Duration::from_secs(3600));
                },
                Mode::Panic => panic!("the application's store has a bug"),
                Mode::Slow => std::thread::sleep(Duration::from_millis(300)),
                Mode::Gated => self.gate.pass(),
            }
        }
        // An ordinary store may allocate and lock: it never runs in a
        // signal handler.
        let v = vec![0u8; 1];
        drop(v);
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write(off, buf)
    }
    fn writable(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "misbehaving"
    }
}

const PAGES: usize = 8;

fn misbehaving(mode: Mode) -> (Arc<dyn Store>, Vec<u8>) {
    let (store, data) = misbehaving_store(mode);
    (store, data)
}

fn misbehaving_store(mode: Mode) -> (Arc<Misbehaving>, Vec<u8>) {
    let data = pattern_vec(51, PAGES * PAGE);
    let store = Misbehaving {
        inner: MemoryStore::from_bytes(&data).unwrap(),
        mode,
        gate: Gate::default(),
    };
    (Arc::new(store), data)
}

fn child_env() -> (Delivery, Mode) {
    let d = std::env::var("UFFD_DELIVERY").unwrap().parse().unwrap();
    let m = match std::env::var("UFFD_MODE").unwrap().as_str() {
        "hang" => Mode::Hang,
        "panic" => Mode::Panic,
        _ => Mode::Slow,
    };
    (d, m)
}

/// The child: reads a good page, then the bad one (which must end in
/// SIGBUS, not hang), printing a marker before each.
#[test]
fn child_touch_a_page_whose_read_misbehaves() {
    if !is_child() {
        return;
    }
    let (d, mode) = child_env();
    let p = Pager::builder()
        .delivery(d)
        .io_timeout(Duration::from_millis(300))
        .read_attempts(1)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let (store, data) = misbehaving(mode);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(store, PAGES * PAGE, &MapOptions::default()) }.unwrap();
    assert_eq!(r.as_slice()[5], data[5]);
    assert_eq!(r.as_slice()[2 * PAGE + 5], data[2 * PAGE + 5]);
    println!("good pages served");
    let _ = std::hint::black_box(r.as_slice()[PAGE + 5]);
    println!("the bad page returned data");
}

#[test]
fn a_read_that_never_returns_ends_in_sigbus_and_the_rest_is_served() {
    for d in DELIVERIES {
        for mode in ["hang", "panic"] {
            let t = Instant::now();
            let out = run_child(
                "child_touch_a_page_whose_read_misbehaves",
                &[("UFFD_DELIVERY", &d.to_string()), ("UFFD_MODE", mode)],
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                stdout.contains("good pages served"),
                "{d} {mode}: {}",
                describe(&out)
            );
            assert!(
                !stdout.contains("returned data"),
                "{d} {mode}: {}",
                describe(&out)
            );
            assert_eq!(
                exit_signal(&out),
                Some(libc::SIGBUS),
                "{d} {mode}: {}",
                describe(&out)
            );
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{d} {mode}: took {:?}",
                t.elapsed()
            );
        }
    }
}

/// In-process: the pager serves other pages while one page's read hangs
/// on a worker, and is dropped without waiting for it.
#[test]
fn other_pages_are_served_while_one_read_hangs() {
    let p = Pager::builder()
        .delivery(THREADS)
        .io_timeout(Duration::from_millis(200))
        .read_attempts(1)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let (store, data) = misbehaving(Mode::Hang);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(store, PAGES * PAGE, &MapOptions::default()) }.unwrap();
    // The bad page's fault runs in a handler thread, which gives up after
    // the timeout and poisons it; the access is not made here (it would
    // be SIGBUS), only the page's fault is driven through `populate`.
    let t = Instant::now();
    assert!(r.populate(PAGE, PAGE).is_err());
    assert!(t.elapsed() < Duration::from_secs(10));
    for pg in [0, 2, 3, 7] {
        assert_eq!(
            r.as_slice()[pg * PAGE + 1],
            data[pg * PAGE + 1],
            "page {pg}"
        );
    }
    assert!(p.stats().get(Counter::IO_ERROR) >= 1);
    let t = Instant::now();
    drop(r);
    drop(p);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "drop took {:?}",
        t.elapsed()
    );
}

/// The child: a thread faults on a page whose read is slow while the main
/// thread drops the region and the pager.
#[test]
fn child_drop_with_a_fault_in_flight() {
    if !is_child() {
        return;
    }
    let (d, _) = child_env();
    let p = Pager::builder()
        .delivery(d)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let (store, data) = misbehaving(Mode::Slow);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(store, PAGES * PAGE, &MapOptions::default()) }.unwrap();
    let addr = r.as_ptr() as usize + PAGE;
    let want = data[PAGE];
    std::thread::spawn(move || {
        // SAFETY: a read of region memory that the main thread unmaps while
        // the fault is in flight: it must end (SIGSEGV, or the data if the
        // fault wins), never hang, and never read anything but the data.
        let v = unsafe { std::ptr::read_volatile(addr as *const u8) };
        println!("the racing read got {v}, want {want}");
        if v != want {
            println!("WRONG DATA");
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    drop(r);
    drop(p);
    println!("dropped in {:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(500));
    println!("done");
}

#[test]
fn dropping_with_a_fault_in_flight_does_not_hang() {
    for d in DELIVERIES {
        let t = Instant::now();
        let out = run_child(
            "child_drop_with_a_fault_in_flight",
            &[("UFFD_DELIVERY", &d.to_string()), ("UFFD_MODE", "slow")],
        );
        // The racing read either got its data before the unmap (and the
        // drop finished) or a SIGSEGV after it, which ends the process;
        // either way nothing hung.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("WRONG DATA"), "{d}: {}", describe(&out));
        // (Success means the racing read ended too: a read stuck for ever
        // printed nothing in the 500 ms after the drop.)
        assert!(
            (out.status.success()
                && stdout.contains("dropped in")
                && stdout.contains("the racing read got"))
                || exit_signal(&out) == Some(libc::SIGSEGV),
            "{d}: {}",
            describe(&out)
        );
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{d}: {:?}",
            t.elapsed()
        );
    }
}

/// A fault that waits on its store (in-thread: inside the SIGBUS handler)
/// holds up no other pager: one built and dropped meanwhile finishes while
/// the fault still waits. The handler served the fault inside the
/// registry's read section, so every other pager's build and drop (which
/// publish a new registry and wait out its readers) waited, spinning, for
/// as long as the store took.
#[test]
fn another_pager_is_built_and_dropped_while_a_fault_waits_on_its_store() {
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .io_timeout(Duration::from_secs(60))
        .read_attempts(1)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let (store, data) = misbehaving_store(Mode::Gated);
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let r = unsafe { p.map_store(store.clone(), PAGES * PAGE, &MapOptions::default()) }.unwrap();
    let addr = r.as_ptr() as usize + PAGE + 7;
    let reader = std::thread::spawn(move || {
        // SAFETY: inside the region, which outlives this thread (joined
        // below before `r` is dropped).
        unsafe { std::ptr::read_volatile(addr as *const u8) }
    });
    store.gate.wait_for_reader();
    let other = std::thread::spawn(|| {
        let q = Pager::builder()
            .delivery(Delivery::InThread)
            .build()
            .unwrap();
        let mut a = q.map_anonymous(4 * PAGE).unwrap();
        a.as_mut_slice()[PAGE] = 3;
        assert_eq!(a.as_slice()[PAGE], 3);
        drop(a);
        drop(q);
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !other.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let finished_first = other.is_finished();
    store.gate.open();
    other.join().unwrap();
    assert_eq!(reader.join().unwrap(), data[PAGE + 7]);
    assert!(
        finished_first,
        "the other pager's build and drop waited for this pager's fault"
    );
    drop(r);
}
