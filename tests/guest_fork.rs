//! `fork()` with live regions (`shared/design/guest.md`): the child gets no
//! copy of region memory (a touch is a clean SIGSEGV, never zeros), every
//! engine call in the child is refused or does nothing, and nothing the
//! child does reaches the parent's pages.

#[path = "engine_util.rs"]
mod util;

use std::time::{Duration, Instant};
use uffd_pager::{Delivery, Error, InstallKind, Pager, Region};
use util::*;

const PAGES: usize = 1024;

/// Waits for `pid` for up to `secs`, killing it if it hangs; returns the
/// wait status.
fn wait_with_watchdog(pid: libc::pid_t, secs: u64) -> i32 {
    let t = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return status;
        }
        if t.elapsed() > Duration::from_secs(secs) {
            // SAFETY: killing our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            panic!("the child hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// In a child: whether `addr` is mapped here (mincore fails with ENOMEM on
/// unmapped addresses). Async-signal-safe enough for a child of fork.
fn mapped(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore only inspects page tables.
    unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut v) == 0 }
}

/// The child's part: exits 0 if every check passes, with a distinct code
/// for the first that fails.
fn child(p: Pager, mut r: Region) -> ! {
    let base = r.as_ptr() as usize;
    let code = (|| {
        // Region memory is not mapped in the child.
        if (0..PAGES).step_by(97).any(|pg| mapped(base + pg * PAGE)) {
            return 10;
        }
        // Engine calls are refused, and do nothing to the parent.
        if !matches!(r.flush(), Err(Error::ForkedChild)) {
            return 11;
        }
        if !matches!(r.prefault(0, PAGE), Err(Error::ForkedChild)) {
            return 12;
        }
        if !matches!(r.dontneed(0, PAGES * PAGE), Err(Error::ForkedChild)) {
            return 13;
        }
        if !matches!(r.protect(false), Err(Error::ForkedChild)) {
            return 14;
        }
        if p.reclaim_pages(1 << 20) != 0 {
            return 15;
        }
        if !matches!(p.map_anonymous(PAGE), Err(Error::ForkedChild)) {
            return 16;
        }
        // The child holds no copy of the engine's userfaultfds (each kept
        // the parent's registrations alive): /dev/null took their numbers.
        let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
            return 18;
        };
        let uffds = fds
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy().contains("userfaultfd"))
            .count();
        if uffds != 0 {
            return 17;
        }
        // Dropping them does nothing (and does not hang).
        drop(r);
        drop(p);
        0
    })();
    // SAFETY: leave the child without running the parent's atexit handlers.
    unsafe { libc::_exit(code) }
}

#[test]
fn fork_leaves_the_parent_intact() {
    if !is_child() {
        // Forks in a process of its own, with few threads besides ours.
        let out = run_child("fork_leaves_the_parent_intact", &[]);
        assert!(out.status.success(), "{}", describe(&out));
        return;
    }
    for d in DELIVERIES {
        for kind in [InstallKind::Anonymous, InstallKind::Shared] {
            let ctx = format!("{d} {kind}");
            let p = Pager::builder()
                .delivery(d)
                .budget_pages(256)
                .build()
                .unwrap();
            let (r, want) = filled_region(&p, kind, PAGES, 31);
            // SAFETY: fork; the child only runs `child`, then _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork: {}", errno());
            if pid == 0 {
                child(p, r);
            }
            let status = wait_with_watchdog(pid, 60);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "{ctx}: child status {status:#x} (exit code {})",
                libc::WEXITSTATUS(status)
            );
            // The parent's region is whole, and still served.
            for round in 0..2 {
                assert_bytes(r.as_slice(), &want, &format!("{ctx}: round {round}"));
                p.reclaim_pages(1 << 20);
            }
        }
    }
}

/// A child that touches region memory gets SIGSEGV (no mapping there), not
/// a page of zeros.
#[test]
fn child_touching_region_memory_gets_sigsegv() {
    if !is_child() {
        let out = run_child("child_touching_region_memory_gets_sigsegv", &[]);
        assert!(out.status.success(), "{}", describe(&out));
        return;
    }
    for d in [Delivery::InThread, THREADS] {
        let p = pager(d);
        let (r, _) = filled_region(&p, InstallKind::Anonymous, PAGES, 32);
        let base = r.as_ptr() as usize;
        // SAFETY: fork; the child only reads one byte, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: a read the kernel must refuse (nothing is mapped).
            let v = unsafe { std::ptr::read_volatile((base + 5 * PAGE) as *const u8) };
            // SAFETY: leave without the parent's atexit handlers.
            unsafe { libc::_exit(100 + (v == 0) as i32) };
        }
        let status = wait_with_watchdog(pid, 30);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
            "{d}: child status {status:#x}"
        );
        drop(r);
    }
}

/// Armed: the next unpin of a fault's registry pin says so in `INSIDE`,
/// then waits for `FORKED` (10 s at most).
#[cfg(feature = "fault-inject")]
mod held_reader {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::time::{Duration, Instant};

    pub static ARMED: AtomicBool = AtomicBool::new(false);
    pub static INSIDE: AtomicBool = AtomicBool::new(false);
    pub static FORKED: AtomicBool = AtomicBool::new(false);

    pub fn hold() {
        if !ARMED.swap(false, SeqCst) {
            return;
        }
        INSIDE.store(true, SeqCst);
        let t = Instant::now();
        while !FORKED.load(SeqCst) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A child forked while another thread was inside a read section of the
/// engine's SIGBUS registry (an in-thread fault, unpinning) builds an
/// in-thread pager of its own and is served. It inherited that thread's
/// reader count, which no thread of its own would ever drop, and its
/// pager's registration waited for ever for that reader.
#[cfg(feature = "fault-inject")]
#[test]
fn a_child_forked_during_a_fault_builds_an_in_thread_pager() {
    use held_reader::*;
    use std::sync::atomic::Ordering::SeqCst;
    if !is_child() {
        let out = run_child(
            "a_child_forked_during_a_fault_builds_an_in_thread_pager",
            &[],
        );
        assert!(out.status.success(), "{}", describe(&out));
        return;
    }
    let p = pager(Delivery::InThread);
    let r = p.map_anonymous(4 * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    ARMED.store(true, SeqCst);
    uffd_pager::testing::set_after_unpin(Some(hold));
    let faulting = std::thread::spawn(move || {
        // SAFETY: a page of the live region, read once.
        unsafe { std::ptr::read_volatile((base + PAGE) as *const u8) }
    });
    let t = Instant::now();
    while !INSIDE.load(SeqCst) {
        assert!(t.elapsed() < Duration::from_secs(10), "no fault unpinned");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: fork; the child builds a pager, uses it, and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", errno());
    if pid == 0 {
        // SAFETY: alarm has no preconditions; a hang dies of SIGALRM.
        unsafe { libc::alarm(10) };
        let code = (|| {
            let Ok(q) = Pager::builder().delivery(Delivery::InThread).build() else {
                return 20;
            };
            let Ok(mut own) = q.map_anonymous(4 * PAGE) else {
                return 21;
            };
            own.as_mut_slice()[2 * PAGE] = 8;
            if own.as_slice()[2 * PAGE] != 8 {
                return 22;
            }
            0
        })();
        // SAFETY: leave the child without the parent's atexit handlers.
        unsafe { libc::_exit(code) }
    }
    FORKED.store(true, SeqCst);
    assert_eq!(faulting.join().unwrap(), 0);
    uffd_pager::testing::set_after_unpin(None);
    let status = wait_with_watchdog(pid, 30);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x} (signal {})",
        libc::WTERMSIG(status)
    );
    drop(r);
}

/// The pager [`refused_in_child`] calls, and what it got: 1 refused as a
/// child's call, 2 a region made, 3 another error, 0 not run.
static EARLY_PAGER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static EARLY_SAW: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// A fork child handler registered before the first pager was built.
extern "C" fn refused_in_child() {
    use std::sync::atomic::Ordering::SeqCst;
    let p = EARLY_PAGER.load(SeqCst) as *const Pager;
    if p.is_null() {
        return;
    }
    // SAFETY: the test's pager, alive across the fork (the child's copy).
    let got = match unsafe { &*p }.map_anonymous(4 * PAGE) {
        Err(Error::ForkedChild) => 1,
        Ok(r) => {
            std::mem::forget(r);
            2
        }
        Err(_) => 3,
    };
    EARLY_SAW.store(got, SeqCst);
}

/// A fork child handler registered before the first pager was built runs
/// before the engine's marks the child (child handlers run in the order
/// they were registered). One that called the engine was served as in
/// the parent: it mapped a region, its ioctls on the parent's address
/// space. The engine marks a fork under way first now (its prepare
/// handler runs before the others), and the call is refused.
#[test]
fn a_fork_child_handler_registered_before_the_pager_is_refused() {
    use std::sync::atomic::Ordering::SeqCst;
    if !is_child() {
        let out = run_child(
            "a_fork_child_handler_registered_before_the_pager_is_refused",
            &[],
        );
        assert!(out.status.success(), "{}", describe(&out));
        return;
    }
    // SAFETY: registers a child handler of the test's.
    unsafe { libc::pthread_atfork(None, None, Some(refused_in_child)) };
    let p = pager(Delivery::InThread);
    let (r, want) = filled_region(&p, InstallKind::Anonymous, PAGES, 34);
    EARLY_PAGER.store(&p as *const Pager as usize, SeqCst);
    // SAFETY: fork; the child reports what its handler got, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", errno());
    if pid == 0 {
        // SAFETY: leave the child without the parent's atexit handlers.
        unsafe { libc::_exit(EARLY_SAW.load(SeqCst)) };
    }
    let status = wait_with_watchdog(pid, 30);
    EARLY_PAGER.store(0, SeqCst);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 1,
        "the child handler got {} (1: refused as a child's call)",
        libc::WEXITSTATUS(status)
    );
    assert_bytes(r.as_slice(), &want, "the parent's region");
}
