//! Signals and in-thread delivery: the application's handlers run as on a
//! plain mapping. Each case runs in a child process with an alarm as its
//! deadline (a hang dies of SIGALRM).
//!
//! - A signal that arrives while the engine serves a fault in its SIGBUS
//!   handler waits for the fault, as the kernel delivers signals after a
//!   page fault: it ran nested with SIGBUS blocked, and a handler that
//!   touched region memory killed the process (the kernel forces a blocked
//!   SIGBUS).
//! - A signal that arrives while the engine works on an application thread
//!   (`prefault`) waits for it: a handler that touched the page the engine
//!   held locked deadlocked on its own thread's page lock.
//! - The SIGSEGV the engine raises for a refused access reaches the
//!   application's handler with the mask of the faulting code (SIGBUS was
//!   blocked there, and the handler's touch of a region killed the
//!   process), and, blocked at the fault, kills as the kernel's does (it
//!   stayed pending and the access faulted for ever).
//! - The engine's own threads block asynchronous signals, so no
//!   application handler runs in the middle of their work.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use uffd_pager::store::{LatencyModel, MemoryStore, SimulatedStore, Store};
use uffd_pager::{Delivery, MapOptions, Pager};
use util::*;

const LEN: usize = 8 * PAGE;

static TOUCH: AtomicUsize = AtomicUsize::new(0);

fn say(msg: &[u8]) {
    // SAFETY: write(2) of a caller's buffer.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// The application's SIGUSR1 handler: reads one byte of region memory.
extern "C" fn usr1_touches_region(_: libc::c_int) {
    say(b"USR1-HANDLER-START\n");
    // SAFETY: TOUCH is an address inside a live region.
    let v = unsafe { std::ptr::read_volatile(TOUCH.load(SeqCst) as *const u8) };
    let _ = v;
    say(b"USR1-HANDLER-DONE\n");
}

fn install(sig: i32, h: extern "C" fn(libc::c_int), flags: i32) {
    // SAFETY: installs an async-signal-safe handler.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = h as *const () as usize;
        sa.sa_flags = flags;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

fn slow_region(p: &Pager) -> uffd_pager::Region {
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&pattern_vec(9, LEN)).unwrap());
    let sim = Arc::new(SimulatedStore::new(
        mem,
        LatencyModel::Fixed { ns: 400_000_000 },
        0,
        1,
    ));
    // SAFETY: nothing else changes the store.
    unsafe { p.map_store(sim, LEN, &MapOptions::default()) }.unwrap()
}

/// A region over a read-only store that the application made writable
/// itself: the engine refuses its writes with SIGSEGV.
fn refused_region(p: &Pager) -> uffd_pager::Region {
    let store = Arc::new(MemoryStore::read_only(&pattern_vec(5, LEN)).unwrap());
    let opts = MapOptions {
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: nothing else changes the store.
    let region = unsafe { p.map_store(store, LEN, &opts) }.unwrap();
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: the region's own range.
    assert_eq!(
        unsafe { libc::mprotect(region.as_ptr().cast(), LEN, rw) },
        0
    );
    region
}

/// A child's in-thread pager, with an alarm `secs` away as its deadline.
fn child_pager(secs: u32) -> Pager {
    // SAFETY: alarm has no preconditions.
    unsafe { libc::alarm(secs) };
    Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap()
}

/// Sends SIGUSR1 to the calling thread after `ms`.
fn usr1_me_after(ms: u64) -> std::thread::JoinHandle<()> {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as usize;
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        // SAFETY: the target thread is alive (it waits for us to be joined).
        unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
    })
}

fn child_signal_during_sigbus_fault() {
    let p = child_pager(8);
    let slow = slow_region(&p);
    let other = p.map_anonymous(LEN).unwrap();
    TOUCH.store(other.as_ptr() as usize + 3 * PAGE, SeqCst);
    install(libc::SIGUSR1, usr1_touches_region, 0);
    let t = usr1_me_after(100);
    // SAFETY: inside the region; its store read takes 400 ms.
    let v = unsafe { std::ptr::read_volatile(slow.as_ptr().add(PAGE)) };
    t.join().unwrap();
    assert_eq!(v, pattern(9, PAGE));
    say(b"MAIN-DONE\n");
}

fn child_signal_during_prefault() {
    let p = child_pager(8);
    let slow = slow_region(&p);
    TOUCH.store(slow.as_ptr() as usize + PAGE, SeqCst);
    install(libc::SIGUSR1, usr1_touches_region, 0);
    let t = usr1_me_after(100);
    slow.prefault(PAGE, PAGE).unwrap();
    t.join().unwrap();
    say(b"MAIN-DONE\n");
}

/// A shared region whose store takes 400 ms a write, with page 1 dirty.
fn slow_writes_region(p: &Pager) -> uffd_pager::Region {
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&pattern_vec(9, LEN)).unwrap());
    let sim = Arc::new(
        SimulatedStore::new(mem, LatencyModel::Fixed { ns: 400_000_000 }, 0, 1)
            .with_write_latency(true),
    );
    // SAFETY: nothing else changes the store.
    let mut region = unsafe { p.map_store(sim, LEN, &MapOptions::default()) }.unwrap();
    region.as_mut_slice()[PAGE] = 0x5a;
    region
}

fn child_signal_during_reclaim_pages() {
    // SAFETY: alarm has no preconditions.
    unsafe { libc::alarm(8) };
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(64)
        .build()
        .unwrap();
    let region = slow_writes_region(&p);
    TOUCH.store(region.as_ptr() as usize + PAGE, SeqCst);
    install(libc::SIGUSR1, usr1_touches_region, 0);
    let t = usr1_me_after(100);
    // Writes page 1 back (400 ms) while it holds the page locked.
    let freed = p.reclaim_pages(64);
    t.join().unwrap();
    assert!(freed > 0, "freed {freed}");
    assert_eq!(region.as_slice()[PAGE], 0x5a);
    say(b"MAIN-DONE\n");
}

static STEP: AtomicUsize = AtomicUsize::new(0);

/// The application's SIGUSR2 handler: reads one byte of the next page of
/// a region (absent most of the time: the budget is small).
extern "C" fn usr2_touches_next_page(_: libc::c_int) {
    let k = STEP.fetch_add(1, SeqCst) % 1024;
    // SAFETY: TOUCH is the start of a live region of 1024 pages.
    let _ = unsafe { std::ptr::read_volatile((TOUCH.load(SeqCst) + k * PAGE) as *const u8) };
}

/// An in-thread pager with a budget of 64 pages and no readahead (a
/// handler's fault reads one page), with an alarm 20 s away as the
/// child's deadline.
fn small_budget_child_pager() -> Pager {
    // SAFETY: alarm has no preconditions.
    unsafe { libc::alarm(20) };
    Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(64)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap()
}

fn child_signals_during_populate() {
    let p = small_budget_child_pager();
    let region = p.map_anonymous(1024 * PAGE).unwrap();
    let mut n = 0usize;
    signals_while(&p, || {
        region.populate((n % 1024) * PAGE, PAGE).unwrap();
        n += 1;
    });
}

/// Runs `op` on this thread in a loop for 2 s while another thread sends
/// it SIGUSR2 every 20 µs (its handler reads the next page of a region of
/// 1,024, absent most of the time: the budget is 64) and a third drops a
/// page of an anonymous region with `madvise(MADV_DONTNEED)` over and
/// over, an event the engine applies under the event gate's write side
/// (and the global lock's). A handler that faults while `op` holds a gate
/// section or the global lock's read side waits for that writer, which
/// waits for `op`: the alarm ends the hang.
fn signals_while(p: &Pager, op: impl FnMut()) {
    signals_and_events_while(p, false, op)
}

/// [`signals_while`], and with `unmaps` a fourth thread maps a region and
/// unmaps it with the application's own `munmap` over and over: an event
/// that also takes the lock of the index of regions' pieces.
fn signals_and_events_while(p: &Pager, unmaps: bool, mut op: impl FnMut()) {
    let region = p.map_anonymous(1024 * PAGE).unwrap();
    let dropped = p.map_anonymous(PAGE).unwrap();
    TOUCH.store(region.as_ptr() as usize, SeqCst);
    install(libc::SIGUSR2, usr2_touches_next_page, 0);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as usize;
    let s = stop.clone();
    let signaller = std::thread::spawn(move || {
        while !s.load(SeqCst) {
            // SAFETY: the target thread is alive until it joins us.
            unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR2) };
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    });
    let s = stop.clone();
    let at = dropped.as_ptr() as usize;
    let dropper = std::thread::spawn(move || {
        while !s.load(SeqCst) {
            // SAFETY: the region's page, which reads as zeros afterwards;
            // nothing holds a slice of it.
            unsafe {
                std::ptr::write_volatile(at as *mut u8, 1);
                libc::madvise(at as *mut libc::c_void, PAGE, libc::MADV_DONTNEED);
            }
        }
    });
    let mut n = 0usize;
    std::thread::scope(|scope| {
        if unmaps {
            let s = stop.clone();
            scope.spawn(move || {
                while !s.load(SeqCst) {
                    let r = p.map_anonymous(PAGE).unwrap();
                    // SAFETY: the region's own page; nothing refers to it.
                    unsafe { libc::munmap(r.as_ptr().cast(), PAGE) };
                }
            });
        }
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(2) {
            op();
            n += 1;
        }
        stop.store(true, SeqCst);
    });
    signaller.join().unwrap();
    dropper.join().unwrap();
    // (A run no signal reached tested nothing.)
    assert!(STEP.load(SeqCst) > 0, "no signal ran its handler");
    say(format!("MAIN-DONE calls {n} signals {}\n", STEP.load(SeqCst)).as_bytes());
}

fn child_signals_during_refresh() {
    let p = small_budget_child_pager();
    let mem: Arc<dyn Store> = Arc::new(MemoryStore::from_bytes(&pattern_vec(9, LEN)).unwrap());
    // SAFETY: nothing else changes the store.
    let r = unsafe { p.map_store(mem, LEN, &MapOptions::default()) }.unwrap();
    assert_eq!(r.as_slice()[PAGE], pattern(9, PAGE));
    // SAFETY: no slice of `r` is alive during the calls.
    signals_while(&p, || {
        unsafe { r.refresh_unchecked(PAGE as u64, 8) }.unwrap()
    });
}

fn child_signals_during_region_lookups() {
    let p = small_budget_child_pager();
    let r = p.map_anonymous(LEN).unwrap();
    let mut n = 0usize;
    signals_and_events_while(&p, true, || {
        std::hint::black_box(format!("{r:?} {p:?}"));
        r.prefault((n % 8) * PAGE, PAGE).unwrap();
        n += 1;
    });
}

/// A map of 2 MiB pages under a budget counts the huge pages the pager's
/// other regions hold (one walk of the table) before it maps anything.
/// Many regions make the walk long.
fn child_signals_during_a_huge_maps_count() {
    // SAFETY: alarm has no preconditions.
    unsafe { libc::alarm(20) };
    let p = Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(4096)
        .build()
        .unwrap();
    let many: Vec<_> = (0..2000).map(|_| p.map_anonymous(PAGE).unwrap()).collect();
    let opts = MapOptions {
        page_size: uffd_pager::HUGE_PAGE_SIZE,
        ..MapOptions::default()
    };
    signals_and_events_while(&p, true, || {
        // (Refused unless 2 MiB pages are reserved: the count comes first.)
        std::hint::black_box(p.map_anonymous_with(uffd_pager::HUGE_PAGE_SIZE, &opts).ok());
    });
    drop(many);
}

fn child_signals_during_memory_use() {
    let p = small_budget_child_pager();
    signals_while(&p, || {
        std::hint::black_box(p.memory_use());
    });
}

/// The application's SIGSEGV handler: reports whether SIGBUS is blocked,
/// touches an absent page of a region, exits 0.
extern "C" fn segv_reports_mask(_: libc::c_int) {
    // SAFETY: pthread_sigmask/sigismember on locals.
    unsafe {
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut cur);
        if libc::sigismember(&cur, libc::SIGBUS) == 1 {
            say(b"SEGV-HANDLER: SIGBUS BLOCKED\n");
        } else {
            say(b"SEGV-HANDLER: SIGBUS not blocked\n");
        }
        let _ = std::ptr::read_volatile(TOUCH.load(SeqCst) as *const u8);
        say(b"SEGV-HANDLER: touched region\n");
        libc::_exit(0);
    }
}

fn child_segv_handler_touches_region() {
    let p = child_pager(8);
    let other = p.map_anonymous(LEN).unwrap();
    TOUCH.store(other.as_ptr() as usize + 5 * PAGE, SeqCst);
    let region = refused_region(&p);
    install(libc::SIGSEGV, segv_reports_mask, 0);
    // SAFETY: inside the region: the engine refuses the write with SIGSEGV.
    unsafe { std::ptr::write_volatile(region.as_ptr().add(6 * PAGE), 0x77) };
    say(b"MAIN: survived\n");
}

fn run(name: &str) -> std::process::Output {
    let out = run_child(name, &[]);
    eprintln!("{name}: signal {:?}\n{}", exit_signal(&out), describe(&out));
    out
}

/// Runs `child` in a child process (this test binary again); asserts it
/// exits cleanly, as on a plain mapping, having printed each of `want`
/// (what shows that the case under test happened: a handler ran).
fn exits_cleanly(name: &str, child: fn(), want: &[&str]) {
    if is_child() {
        return child();
    }
    let out = run(name);
    assert!(out.status.success(), "a clean exit, as on a plain mapping");
    let err = String::from_utf8_lossy(&out.stderr);
    for w in want {
        assert!(err.contains(w), "{name}: no {w:?} in the child's output");
    }
}

/// What a case with an application handler that touches a region prints.
const USR1_RAN: &[&str] = &["USR1-HANDLER-DONE", "MAIN-DONE"];
/// What a case run under a stream of signals prints.
const SIGNALLED: &[&str] = &["MAIN-DONE"];

#[test]
fn signal_during_sigbus_fault() {
    exits_cleanly(
        "signal_during_sigbus_fault",
        child_signal_during_sigbus_fault,
        USR1_RAN,
    );
}

#[test]
fn signal_during_prefault() {
    exits_cleanly(
        "signal_during_prefault",
        child_signal_during_prefault,
        USR1_RAN,
    );
}

#[test]
fn signal_during_reclaim_pages() {
    exits_cleanly(
        "signal_during_reclaim_pages",
        child_signal_during_reclaim_pages,
        USR1_RAN,
    );
}

#[test]
fn signals_during_populate() {
    exits_cleanly(
        "signals_during_populate",
        child_signals_during_populate,
        SIGNALLED,
    );
}

/// `Region::refresh` entered the event gate before it blocked signals,
/// and `Pager::memory_use` held the global lock's read side with signals
/// open: a handler that faulted there waited for an event being applied,
/// which waited for the call (found by review).
#[test]
fn signals_during_refresh() {
    exits_cleanly(
        "signals_during_refresh",
        child_signals_during_refresh,
        SIGNALLED,
    );
}

/// `Region::prefault`, the region's `Debug` and the pager's read the index
/// of regions' pieces under its lock, which applying the application's
/// `munmap` takes, with signals open: a handler that faulted there waited for that
/// event, which waited for the call.
#[test]
fn signals_during_region_lookups() {
    exits_cleanly(
        "signals_during_region_lookups",
        child_signals_during_region_lookups,
        SIGNALLED,
    );
}

/// The count of 2 MiB pages a huge map makes walked the table with signals
/// open: a handler that faulted there waited for an event that waited for
/// the walk to end.
#[test]
fn signals_during_a_huge_maps_count() {
    exits_cleanly(
        "signals_during_a_huge_maps_count",
        child_signals_during_a_huge_maps_count,
        SIGNALLED,
    );
}

#[test]
fn signals_during_memory_use() {
    exits_cleanly(
        "signals_during_memory_use",
        child_signals_during_memory_use,
        SIGNALLED,
    );
}

#[test]
fn segv_handler_touches_region() {
    exits_cleanly(
        "segv_handler_touches_region",
        child_segv_handler_touches_region,
        &[
            "SEGV-HANDLER: SIGBUS not blocked",
            "SEGV-HANDLER: touched region",
        ],
    );
}

fn block(sig: i32) {
    // SAFETY: pthread_sigmask on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()),
            0
        );
    }
}

/// A thread with SIGSEGV blocked writes to a region the engine refuses
/// writes to: the kernel kills it (force_sig_fault unblocks SIGSEGV).
fn child_segv_blocked_write_refused() {
    let p = child_pager(5);
    let region = refused_region(&p);
    block(libc::SIGSEGV);
    say(b"WRITING\n");
    // SAFETY: inside the region: refused.
    unsafe { std::ptr::write_volatile(region.as_ptr().add(6 * PAGE), 0x77) };
    say(b"MAIN: survived\n");
}

#[test]
fn segv_blocked_write_refused() {
    if is_child() {
        return child_segv_blocked_write_refused();
    }
    let out = run("segv_blocked_write_refused");
    assert_eq!(
        exit_signal(&out),
        Some(libc::SIGSEGV),
        "the kernel's answer: SIGSEGV"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("WRITING"),
        "died before the write"
    );
}

/// The signals blocked on thread `tid` of this process (`SigBlk`).
fn blocked(tid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("SigBlk:")).unwrap();
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

#[test]
fn the_engines_threads_block_asynchronous_signals() {
    let p = Pager::builder()
        .delivery(Delivery::Threads {
            threads: 2,
            spin_us: 0,
        })
        .budget_pages(64)
        .build()
        .unwrap();
    let _r = p.map_anonymous(LEN).unwrap();
    // A kernel-mapped region of a whole 2 MiB extent starts khugepaged.
    let huge = 2 << 20;
    let store = Arc::new(MemoryStore::read_only(&vec![7u8; huge]).unwrap());
    let opts = MapOptions {
        kind: Some(uffd_pager::InstallKind::Shared),
        writable: false,
        kernel_maps: true,
        ..MapOptions::default()
    };
    // SAFETY: nothing changes the store.
    let _k = unsafe { p.map_store(store, huge, &opts) }.unwrap();
    // The engine's threads (two handlers, kswapd, the I/O workers,
    // khugepaged where huge pages are not denied), once each has named
    // itself.
    let engine = || -> Vec<(String, String)> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| {
                let tid = e.ok()?.file_name().into_string().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
                comm.starts_with("uffd")
                    .then(|| (tid, comm.trim().to_string()))
            })
            .collect()
    };
    let t = std::time::Instant::now();
    while engine().len() < 3 && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let bit = |s: i32| 1u64 << (s - 1);
    let threads = engine();
    assert!(threads.len() >= 3, "engine threads: {threads:?}");
    let denied = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .map_or(true, |v| v.contains("[deny]"));
    assert!(
        denied || threads.iter().any(|(_, c)| c == "uffd-khugepaged"),
        "engine threads: {threads:?}"
    );
    for (tid, comm) in threads {
        let m = blocked(&tid);
        for s in [libc::SIGUSR1, libc::SIGALRM, libc::SIGTERM, libc::SIGCHLD] {
            assert_ne!(m & bit(s), 0, "{comm} has signal {s} unblocked");
        }
        for s in [libc::SIGBUS, libc::SIGSEGV] {
            assert_eq!(m & bit(s), 0, "{comm} has signal {s} blocked");
        }
    }
}
