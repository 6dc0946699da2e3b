//! The SIGSEGV an access the engine refuses gets with in-thread delivery
//! is the one the kernel's `force_sig_fault` gives: `si_code`
//! `SEGV_ACCERR`, `si_addr` the faulting address, and the application's
//! handler runs in the faulting instruction's context. Before, the engine
//! raised it with `raise(3)` from inside its SIGBUS handler: `si_code`
//! `SI_TKILL`, no address, and a `ucontext` inside the engine (a runtime's
//! handler that reads or moves the instruction pointer there, as JITs and
//! sandboxes do, read the wrong one).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Delivery, MapOptions, Pager};
use util::*;

/// The address the access writes, and the address of its instruction.
static ADDR: AtomicUsize = AtomicUsize::new(0);
static RIP: AtomicUsize = AtomicUsize::new(0);
/// 1 while [`chaining_sigbus`] runs (it calls the engine's handler).
static IN_CHAINING: AtomicUsize = AtomicUsize::new(0);
/// The SIGBUS action [`chaining_sigbus`] passes the signal on to.
static CHAINED: AtomicUsize = AtomicUsize::new(0);

/// The application's SIGSEGV handler: exits 0 if the signal is the
/// kernel's own for a refused write at `ADDR` by the instruction at `RIP`,
/// 3 otherwise (after saying what it got).
extern "C" fn check_info(_: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo and ucontext for this SA_SIGINFO
    // delivery.
    let (code, addr, rip) = unsafe {
        let uc = &*(uctx as *const libc::ucontext_t);
        (
            (*info).si_code,
            (*info).si_addr() as usize,
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize,
        )
    };
    let (want_addr, want_rip) = (ADDR.load(SeqCst), RIP.load(SeqCst));
    let nested = IN_CHAINING.load(SeqCst);
    // (Printing allocates: the interrupted code is one store, which holds
    // no lock.)
    println!(
        "si_code {code} (want {SEGV_ACCERR}), si_addr {addr:#x} (want {want_addr:#x}), \
         rip {rip:#x} (want {want_rip:#x}), inside the chaining handler {nested} (want 0)"
    );
    let ok = code == SEGV_ACCERR && addr == want_addr && rip == want_rip && nested == 0;
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(if ok { 0 } else { 3 }) };
}

const SEGV_ACCERR: i32 = 2;

/// Writes a byte at `addr` with one instruction, whose address is stored
/// in `RIP` first.
fn write_byte_noting_where(addr: usize) {
    // SAFETY: stores the label's address into `RIP`'s own memory (an
    // atomic, only read by the handler), then writes one byte at `addr`,
    // which the caller made writable region memory.
    unsafe {
        std::arch::asm!(
            "lea {rip}, [rip + 2f]",
            "mov qword ptr [{slot}], {rip}",
            "2:",
            "mov byte ptr [{a}], 1",
            rip = out(reg) _,
            slot = in(reg) RIP.as_ptr(),
            a = in(reg) addr,
            options(nostack),
        );
    }
}

/// An in-thread pager's region of 4 pages over a read-only store, for
/// the child's life, with page 1 in (so a write to it is refused, not
/// read).
fn read_only_region() -> &'static uffd_pager::Region {
    let pager = Box::leak(Box::new(
        Pager::builder()
            .delivery(Delivery::InThread)
            .build()
            .unwrap(),
    ));
    let data = pattern_vec(6, 4 * PAGE);
    let store = Arc::new(MemoryStore::read_only(&data).unwrap());
    let opts = MapOptions {
        writable: false,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region.
    let r = Box::leak(Box::new(
        unsafe { pager.map_store(store, data.len(), &opts) }.unwrap(),
    ));
    assert_eq!(r.as_slice()[PAGE], data[PAGE]);
    r
}

#[test]
fn child_refused_write() {
    if !is_child() {
        return;
    }
    // SAFETY: alarm has no preconditions: a hang ends the child.
    unsafe { libc::alarm(20) };
    let r = read_only_region();
    let addr = r.as_ptr() as usize + PAGE + 5;
    // SAFETY: the application makes the region writable itself (the
    // engine refuses the write: its store is read-only).
    assert_eq!(
        unsafe {
            libc::mprotect(
                r.as_ptr() as *mut _,
                r.len(),
                libc::PROT_READ | libc::PROT_WRITE,
            )
        },
        0
    );
    // SAFETY: installs a handler for this child's SIGSEGV.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = check_info as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut()), 0);
    }
    ADDR.store(addr, SeqCst);
    write_byte_noting_where(addr);
    println!("the refused write returned");
    std::process::exit(2);
}

#[test]
fn a_refused_write_gets_the_kernels_sigsegv_at_the_faulting_instruction() {
    let out = run_child("child_refused_write", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

/// A runtime's SIGBUS handler installed after the engine's, which passes
/// every SIGBUS on to it by calling it, with a mask (its `sa_mask`, empty)
/// that lets SIGSEGV in.
extern "C" fn chaining_sigbus(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) {
    IN_CHAINING.store(1, SeqCst);
    // SAFETY: `CHAINED` holds the engine's SA_SIGINFO handler, stored
    // before this one was installed; the arguments are the kernel's.
    unsafe {
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            std::mem::transmute(CHAINED.load(SeqCst));
        f(sig, info, uctx);
    }
    IN_CHAINING.store(0, SeqCst);
}

/// `child_refused_write` with [`chaining_sigbus`] in front of the engine's
/// handler.
#[test]
fn child_refused_write_through_a_chaining_handler() {
    if !is_child() {
        return;
    }
    // SAFETY: installs this child's SIGBUS handler in front of the
    // engine's (read back first); the engine's is SA_SIGINFO.
    unsafe {
        let mut engine: libc::sigaction = std::mem::zeroed();
        // (The first in-thread pager installs the engine's handler.)
        let _first = read_only_region();
        libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut engine);
        assert!(engine.sa_flags & libc::SA_SIGINFO != 0);
        CHAINED.store(engine.sa_sigaction, SeqCst);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = chaining_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
    }
    child_refused_write();
}

/// The engine's SIGSEGV for a refused access waits for the return of the
/// handler that called the engine's, and arrives at the access. Before,
/// queued under the calling handler's mask, it was delivered at once,
/// nested in the engine's handler: the application's handler saw the
/// engine's registers.
#[test]
fn a_refused_write_through_a_chaining_handler_gets_its_sigsegv_at_the_access() {
    let out = run_child("child_refused_write_through_a_chaining_handler", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

/// The refused write of `child_refused_write`, with SIGSEGV left at its
/// default action.
#[test]
fn child_refused_write_default() {
    if !is_child() {
        return;
    }
    let r = read_only_region();
    make_writable_and_write(r, PAGE);
    println!("the refused write returned");
    std::process::exit(2);
}

/// The first process of a PID namespace (a program run as a container's
/// init) drops a signal some process sends it while its action is the
/// default; only a fault's SIGSEGV kills it. The engine's queued SIGSEGV
/// (or, before, its `raise`) was dropped, the write ran again and was
/// refused again, for ever. Now it dies of SIGSEGV, as without the engine.
#[test]
fn a_refused_write_kills_a_pid_namespaces_init() {
    if is_child() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: a PID namespace needs root");
        return;
    }
    let out = run_child_as_init("child_refused_write_default", &[])
        .unwrap_or_else(|out| panic!("the init spun on its refused write: {out}"));
    assert_eq!(exit_signal(&out), Some(libc::SIGSEGV), "{}", describe(&out));
}
