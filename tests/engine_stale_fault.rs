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
    // SAFETY: installs a handler that does nothing (async-signal-safe),
    // with SA_RESTART so that no system call of the test sees EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nudged as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
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
        "rounds {} signals {sent} no-region outcomes (segv counter) {} pgfault {}",
        rounds.load(Relaxed),
        s.get(Counter::SEGV),
        s.get(Counter::PGFAULT)
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
