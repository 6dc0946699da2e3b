//! Stacks of the engine's own for a fault taken on a small alternate signal
//! stack.
//!
//! The SIGBUS handler runs on the stack the fault was taken on (it is
//! installed without `SA_ONSTACK`: see `sigbus::ensure_installed`), and the
//! fault path needs tens of KiB of it (a page buffer aligned to 4 KiB, and
//! reclaim beneath it). A handler of the application's that runs on its
//! alternate stack (`sigaltstack`, `SA_ONSTACK`; `SIGSTKSZ` is 8 KiB) and
//! touches an absent page of a region took the fault there, and the fault
//! path wrote below that stack, over whatever lay there: the heap, for a
//! stack from `malloc` (`tests/small_signal_stack.rs`: 17 KiB below an
//! 8 KiB stack). The kernel's own fault path runs on the task's kernel
//! stack, whatever the user stack is.
//!
//! The kernel records the thread's alternate stack in the signal frame
//! (`uc_stack`), and the handler's own frame says whether it runs on it.
//! With less than [`ROOM`] left below the handler's frame, the
//! fault is served on one of [`SLOTS`] stacks mapped when the handler is
//! installed, and the handler goes back to the application's stack to
//! return (or to pass a SIGSEGV or SIGBUS on to the application's handler,
//! which may leave by `siglongjmp`).
//!
//! Hazards:
//! - A thread that finds every slot taken waits for one (a futex): a slot
//!   is held for one fault, which never waits for a thread that has not
//!   begun its own (a thread waiting here holds no engine lock).
//! - An alternate stack disarmed while in use (`SS_AUTODISARM`) is
//!   recorded as disabled, so a fault on it is not seen as one on a small
//!   stack and is served where it was taken, as before.
//! - A `fork` while a slot is held: the child frees every slot
//!   (`pthread_atfork`), since the threads that held them are not there.
//! - Every signal stays blocked while a fault runs on an engine stack (the
//!   handler's mask, or set so where an application's handler called ours):
//!   an `SA_ONSTACK` handler that ran there would see the
//!   stack pointer off the alternate stack, and the kernel would build its
//!   frame at the alternate stack's top, over the frames still live there.
//!   glibc's own two signals cannot be blocked so, so the alternate stack
//!   is also turned off meanwhile ([`disarm`]).
//!
//! Cost: one load of the signal frame per fault; where a switch is needed,
//! an atomic swap each way and the switch itself (a few instructions, in
//! assembly with call frame information so that backtraces cross it).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Stack the fault path may need below the handler's frame; less left on an
/// alternate stack and the fault is served on one of the engine's.
pub(super) const ROOM: usize = 64 << 10;
/// How many stacks: threads faulting on small alternate stacks at once.
const SLOTS: usize = 8;
/// One stack's size, and the guard page mapped `PROT_NONE` below it.
const SIZE: usize = 256 << 10;
const GUARD: usize = crate::sys::PAGE_SIZE;

/// The stacks' mapping (its lowest address), or `None` where it could not
/// be made (faults are then served where they were taken, as before).
static POOL: OnceLock<Option<usize>> = OnceLock::new();
/// A bit per slot: taken.
static TAKEN: AtomicU32 = AtomicU32::new(0);
/// Counts slots given back: the futex word a thread waiting for one sleeps on.
static GIVEN: AtomicU32 = AtomicU32::new(0);

/// Maps the stacks, once; called as the handler is installed, never in it.
pub(super) fn reserve() {
    POOL.get_or_init(|| {
        let len = SLOTS * (SIZE + GUARD);
        // SAFETY: a fresh private anonymous mapping; then the lowest page of
        // each slot, inside it, made inaccessible.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return None;
            }
            // A slot without its guard would overflow into the one below,
            // another thread's stack: none at all then.
            for s in 0..SLOTS {
                let guard = (base as usize + s * (SIZE + GUARD)) as *mut libc::c_void;
                if libc::mprotect(guard, GUARD, libc::PROT_NONE) != 0 {
                    libc::munmap(base, len);
                    return None;
                }
            }
            // A child forked while a thread held a slot has no such thread.
            libc::pthread_atfork(None, None, Some(forked));
            Some(base as usize)
        }
    });
}

/// In a `fork`ed child: every slot is free (the threads that held one are
/// not there). Async-signal-safe.
extern "C" fn forked() {
    TAKEN.store(0, Ordering::Relaxed);
}

/// Runs `f`, on one of the engine's stacks where the fault was taken on an
/// alternate stack with less than [`ROOM`] left below this frame (`uctx` is
/// the handler's `ucontext_t`, or null). Async-signal-safe where `f` is.
pub(super) fn with_room<R>(uctx: *const libc::c_void, f: impl FnOnce() -> R) -> R {
    let here = &uctx as *const _ as usize;
    let uc = uctx as *const libc::ucontext_t;
    // Whether this frame is on the alternate stack, and near its bottom.
    // This frame's own address, not the interrupted stack pointer: a
    // handler of the application's installed after ours with `SA_ONSTACK`
    // that passes faults on to ours by calling it (as runtimes that chain
    // handlers do) runs it on the alternate stack for a fault taken on the
    // thread's own; the interrupted stack pointer said "not cramped", and
    // the fault path wrote below the alternate stack (found by review).
    // (The frame's `ss_flags` are the stack's settings, not whether it is
    // in use.)
    // SAFETY: the kernel's ucontext for this delivery, when not null.
    let cramped = !uc.is_null()
        && unsafe {
            let (low, size) = ((*uc).uc_stack.ss_sp as usize, (*uc).uc_stack.ss_size);
            size != 0 && here > low && here - low <= size && here - low < ROOM
        };
    let Some(&Some(base)) = POOL.get().filter(|_| cramped) else {
        return f();
    };
    // Every signal blocked while the fault runs on an engine stack (see the
    // module's hazards). Called by the kernel, this handler's mask has them
    // all already; called by the application's handler, it has that one's.
    // SAFETY: pthread_sigmask is async-signal-safe; valid sets.
    let before = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
        before
    };
    let slot = take();
    let top = base + slot * (SIZE + GUARD) + GUARD + SIZE;
    let mut f = Some(f);
    let mut out = None;
    let mut run = || {
        let armed = disarm();
        out = f.take().map(|f| f());
        if let Some(ss) = armed {
            // SAFETY: the alternate stack this thread had, back as it was
            // (this frame is on the engine's stack, not on it).
            unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
        }
    };
    // SAFETY: `top` is the (16-byte aligned) end of a slot this thread took,
    // mapped read-write below it for SIZE bytes, above a guard page.
    unsafe { run_on(top, &mut run) };
    give(slot);
    // SAFETY: as above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
    match out {
        Some(r) => r,
        // (`run` always runs; an unwind out of it aborts in `trampoline`.)
        None => unreachable!(),
    }
}

/// Turns this thread's alternate stack off, from a frame on one of the
/// engine's stacks, and returns it to arm again (`None`: it was off).
///
/// Hazard: glibc leaves two signals of its own out of `sigfillset` and
/// `pthread_sigmask` (SIGCANCEL, and SIGSETXID, which `setuid` and its kin
/// in any thread send every other), and installs SIGSETXID with
/// `SA_ONSTACK`. With the stack pointer off the alternate stack and that
/// stack armed, the kernel built such a signal's frame at the alternate
/// stack's top, over the frames still live there: the application's
/// handler's locals changed, and its return restored a clobbered context
/// (`tests/setxid_on_alt_stack.rs`: SIGSEGV). Off, the signal runs on the
/// engine's stack, which has room. Async-signal-safe (errno is the
/// caller's to keep).
fn disarm() -> Option<libc::stack_t> {
    // SAFETY: sigaltstack reads and writes the two structs; this frame is
    // not on the alternate stack (EPERM otherwise, and nothing changes).
    unsafe {
        let off = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        let mut was: libc::stack_t = std::mem::zeroed();
        if libc::sigaltstack(&off, &mut was) != 0 || was.ss_flags & libc::SS_DISABLE != 0 {
            return None;
        }
        // (Armed again with its own flags: `SS_AUTODISARM` stays.)
        was.ss_flags &= !libc::SS_ONSTACK;
        Some(was)
    }
}

fn take() -> usize {
    loop {
        let seen = GIVEN.load(Ordering::Acquire);
        let taken = TAKEN.load(Ordering::Relaxed);
        let free = !taken & ((1u32 << SLOTS) - 1);
        if free == 0 {
            crate::sys::futex::wait(&GIVEN, seen);
            continue;
        }
        let s = free.trailing_zeros();
        if TAKEN
            .compare_exchange(taken, taken | 1 << s, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return s as usize;
        }
    }
}

fn give(slot: usize) {
    TAKEN.fetch_and(!(1u32 << slot), Ordering::Release);
    GIVEN.fetch_add(1, Ordering::Release);
    crate::sys::futex::wake_all(&GIVEN);
}

/// Calls `f` with the stack pointer at `top`, and puts it back after.
///
/// # Safety
/// `top` must be 16-byte aligned, with enough writable stack below it for
/// `f`, used by nothing else meanwhile.
unsafe fn run_on(top: usize, f: &mut dyn FnMut()) {
    /// Runs on the new stack. `extern "C"`: a panic in `f` aborts here
    /// instead of unwinding through the switch.
    extern "C" fn trampoline(f: *mut libc::c_void) {
        // SAFETY: `run_on` passes a pointer to its own live argument.
        unsafe { (*(f as *mut &mut dyn FnMut()))() }
    }
    let mut f = f;
    let arg = &mut f as *mut &mut dyn FnMut() as *mut libc::c_void;
    // SAFETY: `switch_stack` (below) calls `trampoline(arg)` on the stack
    // at `top` (the caller's contract) and comes back to this one.
    unsafe { uffd_pager_switch_stack(arg, trampoline, top) };
}

extern "C" {
    /// `f(arg)` with the stack pointer at `top`: the frame pointer keeps
    /// the old stack, and the call frame information says so, so an
    /// unwinder or debugger walks from the engine's stack back to the
    /// application's (computed from the stack pointer, it read the next
    /// slot's guard page: a backtrace of a panic there was a SIGSEGV).
    fn uffd_pager_switch_stack(
        arg: *mut libc::c_void,
        f: extern "C" fn(*mut libc::c_void),
        top: usize,
    );
}

// rdi: arg (passed on), rsi: f, rdx: top (16-byte aligned, so the call
// meets the ABI's alignment). Hidden: not in a shared library's symbols.
std::arch::global_asm!(
    ".p2align 4",
    ".globl uffd_pager_switch_stack",
    ".hidden uffd_pager_switch_stack",
    ".type uffd_pager_switch_stack,@function",
    "uffd_pager_switch_stack:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rsp",
    ".cfi_def_cfa_register rbp",
    "mov rsp, rdx",
    "call rsi",
    "mov rsp, rbp",
    "pop rbp",
    ".cfi_def_cfa rsp, 8",
    "ret",
    ".cfi_endproc",
    ".size uffd_pager_switch_stack, .-uffd_pager_switch_stack",
);
