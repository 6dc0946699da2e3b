//! A signal glibc cannot block (SIGSETXID, which `setuid` and its kin in
//! one thread send every other thread) arriving while the engine serves a
//! fault on one of its own stacks for a handler on a small alternate stack.
//!
//! The engine blocks every signal while it runs there, but glibc's
//! `sigfillset`/`pthread_sigmask` leave its two internal signals out, and
//! it installs SIGSETXID with `SA_ONSTACK`. With the stack pointer off the
//! alternate stack and that stack still armed, the kernel built the
//! signal's frame at the alternate stack's top, over the frames still live
//! there (the application's handler's, the kernel's own): the handler's
//! locals changed under it, and its return restored a clobbered context.
//! Its own file: it installs a process-wide SIGUSR1 handler, and runs in
//! a child process (the clobbered return can crash it).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Delivery, InstallKind, MapOptions};
use util::*;

const PAGES: usize = 8;
const ALT: usize = 16 << 10;
const CANARY: u8 = 0x5c;

/// The address the handler reads, what it read, and whether its locals
/// survived the fault.
static TARGET: AtomicUsize = AtomicUsize::new(0);
static READ: AtomicU8 = AtomicU8::new(0);
static LOCALS_KEPT: AtomicBool = AtomicBool::new(false);

/// Fills 512 bytes of its own frame, reads the target (a fault served on
/// an engine stack), and notes whether those bytes are still its own.
extern "C" fn on_usr1(_: libc::c_int) {
    let mut locals = [0u8; 512];
    for b in locals.iter_mut() {
        // SAFETY: a byte of this frame's own array.
        unsafe { std::ptr::write_volatile(b, CANARY) };
    }
    let a = TARGET.load(SeqCst);
    // SAFETY: a page of the live region the child set.
    READ.store(unsafe { std::ptr::read_volatile(a as *const u8) }, SeqCst);
    // SAFETY: as above.
    let kept = locals
        .iter()
        .all(|b| unsafe { std::ptr::read_volatile(b) } == CANARY);
    LOCALS_KEPT.store(kept, SeqCst);
}

#[test]
fn child_setxid_during_a_fault_on_an_engine_stack() {
    if !is_child() {
        return;
    }
    // SAFETY: alarm has no preconditions: a hang ends the child.
    unsafe { libc::alarm(60) };
    let pager = uffd_pager::Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap();
    let data = pattern_vec(43, PAGES * PAGE);
    // Reads of 20 ms, on the I/O workers: the fault waits on the engine's
    // stack meanwhile.
    let store = Arc::new(OnWorkers {
        inner: MemoryStore::read_only(&data).unwrap(),
        delay: Duration::from_millis(20),
    });
    let opts = MapOptions {
        writable: false,
        kind: Some(InstallKind::Anonymous),
        ..MapOptions::default()
    };
    // SAFETY: nothing else changes the read-only store.
    let region = unsafe { pager.map_store(store, data.len(), &opts) }.unwrap();
    // SAFETY: this child's SIGUSR1 handler, on the alternate stack; the
    // stack is a fresh mapping kept for the child's life.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_ONSTACK;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        let stack = libc::mmap(
            std::ptr::null_mut(),
            ALT,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(stack, libc::MAP_FAILED);
        let ss = libc::stack_t {
            ss_sp: stack,
            ss_flags: 0,
            ss_size: ALT,
        };
        assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0);
    }
    // Another thread changes nothing, but glibc signals every thread
    // (SIGSETXID) for each call.
    let stop = Arc::new(AtomicBool::new(false));
    let setxid = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(SeqCst) {
                // SAFETY: sets the group ids to what they are (-1: unchanged).
                assert_eq!(unsafe { libc::setresgid(u32::MAX, u32::MAX, u32::MAX) }, 0);
                n += 1;
            }
            n
        })
    };
    for i in 0..PAGES {
        TARGET.store(region.as_ptr() as usize + i * PAGE + 11, SeqCst);
        // SAFETY: raise runs the handler on this thread before returning.
        unsafe { libc::raise(libc::SIGUSR1) };
        assert_eq!(READ.load(SeqCst), data[i * PAGE + 11], "page {i}");
        assert!(
            LOCALS_KEPT.load(SeqCst),
            "page {i}: the handler's locals changed during the fault"
        );
    }
    stop.store(true, SeqCst);
    let calls = setxid.join().unwrap();
    println!("SETXID-SURVIVED after {calls} setresgid calls");
    std::process::exit(0);
}

#[test]
fn a_setxid_signal_during_a_fault_on_an_engine_stack_leaves_the_alternate_stack_alone() {
    let out = run_child("child_setxid_during_a_fault_on_an_engine_stack", &[]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("SETXID-SURVIVED"),
        "{}",
        describe(&out)
    );
}
