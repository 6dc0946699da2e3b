//! A fault message can outlive its fault. A thread waiting in the kernel
//! for a handler leaves the wait on any wake-up (a signal, a spurious
//! wake-up) and faults again, sending a second message for the same page;
//! the first handler's `UFFDIO_WAKE` then lets it go on, and the second
//! message may be handled only after the thread has unmapped the region
//! (its address may then hold nothing, or another thread's new region).
//! Such a message must never get the thread a SIGSEGV.
//!
//! Checked in child processes (the test binary re-run with `UFFD_CHILD=1
//! --exact <child test>`), as `mmap_thrash.c` does it: threads with a file
//! each map it, read a byte per page and unmap it, over and over, through
//! one pager, while a thread interrupts their fault waits with a signal
//! whose handler does nothing (a profiling timer would do the same).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{FileStore, FileStoreOptions, LatencyModel, SimulatedStore, Store};
use uffd_pager::{Counter, Delivery, MapOptions, Pager, Policy, PolicyKind};
use util::*;

const WORKERS: usize = 4;
const PAGES: usize = 64;
const SECS: u64 = 4;

extern "C" fn nudged(_: libc::c_int) {}

/// Installs `handler` (async-signal-safe, as every handler here is) for
/// `sig`.
fn on_signal(sig: libc::c_int, handler: extern "C" fn(libc::c_int), flags: libc::c_int) {
    // SAFETY: a zeroed sigaction is valid; the handler is a plain
    // function that only makes async-signal-safe calls.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as libc::sighandler_t;
        sa.sa_flags = flags;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

fn child_delivery() -> Delivery {
    match std::env::var("UFFD_DELIVERY").as_deref() {
        Ok("threads") => THREADS,
        Ok("per-region") => Delivery::PerRegion,
        _ => Delivery::InThread,
    }
}

/// Child: the map/read/unmap loop; exits normally unless a thread was
/// killed.
#[test]
fn child_map_read_unmap_with_signals() {
    if !is_child() {
        return;
    }
    // A handler that does nothing, with SA_RESTART so that no system call
    // of the test sees EINTR.
    on_signal(libc::SIGUSR1, nudged, libc::SA_RESTART);
    let pager = Arc::new(
        Pager::builder()
            .delivery(child_delivery())
            .policy(Policy::new(PolicyKind::Vanilla))
            .budget_pages((WORKERS * PAGES / 2) as u64)
            .build()
            .expect("building the pager"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel::<libc::pthread_t>();
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (pager, stop, rounds, tx) = (pager.clone(), stop.clone(), rounds.clone(), tx.clone());
        workers.push(std::thread::spawn(move || {
            let data = pattern_vec(w as u64, PAGES * PAGE);
            let file = TempFile::with_contents("stale-fault", &data);
            let fs = FileStore::open(file.path(), &FileStoreOptions::default()).unwrap();
            let store: Arc<dyn Store> = Arc::new(SimulatedStore::new(
                Arc::new(fs),
                LatencyModel::Fixed { ns: 20_000 },
                0,
                w as u64,
            ));
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let opts = MapOptions {
                writable: false,
                ..MapOptions::default()
            };
            while !stop.load(Relaxed) {
                // SAFETY: the test changes this store only through the region (the
                // store contract).
                let region =
                    unsafe { pager.map_store(store.clone(), PAGES * PAGE, &opts) }.unwrap();
                let p = region.as_ptr();
                for i in 0..PAGES {
                    let off = i * PAGE + (i % 7) * 13;
                    // SAFETY: inside the region, which is mapped until
                    // the unmap below.
                    let b = unsafe { std::ptr::read_volatile(p.add(off)) };
                    assert_eq!(b, data[off], "worker {w}: page {i}");
                }
                region.unmap().unwrap();
                rounds.fetch_add(1, Relaxed);
            }
        }));
    }
    drop(tx);
    let threads: Vec<libc::pthread_t> = rx.iter().take(WORKERS).collect();
    let deadline = Instant::now() + Duration::from_secs(SECS);
    let mut sent = 0u64;
    while Instant::now() < deadline {
        for &t in &threads {
            // SAFETY: the workers run until `stop` is set below.
            unsafe { libc::pthread_kill(t, libc::SIGUSR1) };
            sent += 1;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    stop.store(true, Relaxed);
    for w in workers {
        w.join().expect("worker panicked");
    }
    let s = pager.stats();
    eprintln!(
        "rounds {} signals {sent} segv {} pgfault {}",
        rounds.load(Relaxed),
        s.get(Counter::SEGV),
        s.get(Counter::PGFAULT)
    );
    // A run with no round or no signal tested nothing.
    assert!(
        rounds.load(Relaxed) > 0 && sent > 0,
        "the scenario did not run"
    );
}

fn run(delivery: &str) {
    let out = run_child(
        "child_map_read_unmap_with_signals",
        &[("UFFD_DELIVERY", delivery)],
    );
    assert!(
        out.status.success(),
        "{delivery}: the map/read/unmap loop did not finish cleanly; {}",
        describe(&out)
    );
    eprintln!(
        "{delivery}: {}",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .find(|l| l.starts_with("rounds "))
            .unwrap_or("")
    );
}

#[test]
fn stale_fault_messages_never_kill_handler_threads_delivery() {
    run("threads");
}

#[test]
fn stale_fault_messages_never_kill_per_region_delivery() {
    run("per-region");
}

#[test]
fn map_read_unmap_with_signals_in_thread_delivery() {
    run("in-thread");
}

/// The address whose fault messages [`hold_stale`] holds back (0: none),
/// and how many it has seen.
#[cfg(feature = "fault-inject")]
static STALE_AT: AtomicU64 = AtomicU64::new(0);
#[cfg(feature = "fault-inject")]
static STALE_SEEN: AtomicU64 = AtomicU64::new(0);
/// Set once the writable region is unmapped; whether the second message
/// came before that (it is the write's, made stale; one after it is the
/// read of the new region's).
#[cfg(feature = "fault-inject")]
static UNMAPPED: AtomicBool = AtomicBool::new(false);
#[cfg(feature = "fault-inject")]
static SECOND_BEFORE_UNMAP: AtomicBool = AtomicBool::new(false);
/// Set once the hook has let the second message go.
#[cfg(feature = "fault-inject")]
static SECOND_HANDLED: AtomicBool = AtomicBool::new(false);

/// Makes the second message of a fault stale, as a signal does by chance:
/// the first message of the fault at `STALE_AT` is held while the faulting
/// thread gets a signal (it leaves the kernel's wait and faults again: a
/// second message, which the other handler thread reads); the second is
/// held long enough for the thread, woken by the first one's wake, to
/// unmap its region and map another at the address.
#[cfg(feature = "fault-inject")]
fn hold_stale(addr: usize, tid: u32) {
    if addr as u64 & !(PAGE as u64 - 1) != STALE_AT.load(Relaxed) {
        return;
    }
    match STALE_SEEN.fetch_add(1, Relaxed) {
        0 => {
            // SAFETY: tgkill to a thread of this process; the test's
            // handler for SIGUSR1 does nothing.
            unsafe {
                libc::syscall(
                    libc::SYS_tgkill,
                    libc::getpid(),
                    tid as libc::c_int,
                    libc::SIGUSR1,
                )
            };
            // Until the second message is read (a fixed 100 ms was not
            // always long enough for the thread to fault again).
            let t = std::time::Instant::now();
            while STALE_SEEN.load(Relaxed) < 2 && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        1 => {
            SECOND_BEFORE_UNMAP.store(!UNMAPPED.load(Relaxed), Relaxed);
            std::thread::sleep(Duration::from_millis(300));
            SECOND_HANDLED.store(true, Relaxed);
        }
        _ => {}
    }
}

#[cfg(feature = "fault-inject")]
extern "C" fn killed(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(SEGV_EXIT) };
}

/// The child's exit status on SIGSEGV.
#[cfg(feature = "fault-inject")]
const SEGV_EXIT: i32 = 41;

/// Child: one write to a writable region, made stale as [`hold_stale`]
/// says; the thread then maps a read-only region (its store is read-only:
/// a write to it is refused) at the same address and waits there.
#[cfg(feature = "fault-inject")]
#[test]
fn child_stale_write_meets_a_read_only_region() {
    if !is_child() {
        return;
    }
    // A handler that does nothing, with SA_RESTART so that no system call
    // of the test sees EINTR.
    on_signal(libc::SIGUSR1, nudged, libc::SA_RESTART);
    // A SIGSEGV sent with tgkill (not a fault) passes through Rust's own
    // handler (it looks for a stack overflow, puts back the default and
    // returns): the child counts it and exits.
    on_signal(libc::SIGSEGV, killed, 0);
    let pager = Pager::builder()
        .delivery(child_delivery())
        .budget_pages(64)
        .build()
        .expect("building the pager");
    let data = pattern_vec(3, PAGES * PAGE);
    let file = TempFile::with_contents("stale-write", &data);
    let store: Arc<dyn Store> =
        Arc::new(FileStore::open(file.path(), &FileStoreOptions::default()).unwrap());
    let a = pager.map_anonymous(PAGES * PAGE).unwrap();
    let at = a.as_ptr() as usize;
    STALE_AT.store(at as u64, Relaxed);
    uffd_pager::testing::set_before_message(Some(hold_stale));
    // SAFETY: inside the region, mapped until the unmap below.
    unsafe { std::ptr::write_volatile(a.as_ptr(), 7u8) };
    a.unmap().unwrap();
    UNMAPPED.store(true, Relaxed);
    let opts = MapOptions {
        writable: false,
        fixed_addr: Some(at),
        ..MapOptions::default()
    };
    // SAFETY: nothing changes the file while the region is mapped.
    let b = unsafe { pager.map_store(store, PAGES * PAGE, &opts) }.unwrap();
    // The page the held message is for, read before it is handled: the
    // message finds it installed.
    // SAFETY: inside the region.
    let got = unsafe { std::ptr::read_volatile(b.as_ptr()) };
    assert_eq!(got, data[0]);
    // The held second message is let go and handled (a fixed 600 ms did
    // the waiting before).
    let t = std::time::Instant::now();
    while !SECOND_HANDLED.load(Relaxed) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        STALE_SEEN.load(Relaxed) >= 2 && SECOND_BEFORE_UNMAP.load(Relaxed),
        "the write never sent a second message ({} seen)",
        STALE_SEEN.load(Relaxed)
    );
    uffd_pager::testing::set_before_message(None);
    b.unmap().unwrap();
}

/// A stale message of a write, handled once a read-only region took the
/// address, sent the thread a SIGSEGV at once, at whatever it did then.
#[cfg(feature = "fault-inject")]
#[test]
fn a_stale_write_message_never_kills_the_thread() {
    // (Handler threads only: a second message needs a second handler to
    // read it while the first holds the first one; per-region delivery has
    // one per region.)
    let out = run_child(
        "child_stale_write_meets_a_read_only_region",
        &[("UFFD_DELIVERY", "threads")],
    );
    assert!(
        out.status.success(),
        "the thread was killed ({} is SIGSEGV): {}",
        SEGV_EXIT,
        describe(&out)
    );
}
