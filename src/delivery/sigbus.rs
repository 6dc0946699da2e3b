//! In-thread delivery: one process-wide SIGBUS handler that dispatches each
//! fault, by address, to the pager that owns it.
//!
//! The handler is async-signal-safe: it reads an [`Rcu`] registry of
//! address spaces (atomics only), runs the fault path (futex locks, ioctls,
//! store I/O, none of which allocate), and never logs. Addresses no pager
//! owns go to the previous SIGBUS handler, or to the default action.

use crate::address_space::Mm;
use crate::fault::{handle_fault, Resolution};
use crate::sync::rcu::Rcu;
use std::sync::{Arc, Once, OnceLock};

/// Registered address spaces, as raw pointers kept alive by the pagers
/// (a pager unregisters, waiting out readers, before it frees its `Mm`).
static REGISTRY: OnceLock<Rcu<Vec<usize>>> = OnceLock::new();
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALL: Once = Once::new();

fn registry() -> &'static Rcu<Vec<usize>> {
    REGISTRY.get_or_init(|| Rcu::new(Vec::new()))
}

/// Installs the handler once per process, remembering the previous one.
///
/// Without `SA_ONSTACK`: the fault path (reclaim included) needs several
/// KiB of stack, more than the small alternate signal stacks that runtimes
/// (Rust's std among them) install for their stack-overflow handlers. It
/// runs on the faulting thread's own stack, as the kernel's fault path runs
/// on the task's kernel stack.
fn ensure_installed() -> Result<(), i32> {
    let mut err = 0;
    INSTALL.call_once(|| {
        registry();
        // SAFETY: zeroed sigaction structs are valid; we fill the handler,
        // flags and an empty mask, and pass valid pointers to sigaction.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &sa, &mut old) != 0 {
                err = crate::sys::errno();
                return;
            }
            let _ = PREVIOUS.set(old);
        }
    });
    if err != 0 {
        Err(err)
    } else {
        Ok(())
    }
}

/// Adds an address space to the dispatch registry.
pub fn register(mm: &Arc<Mm>) -> Result<(), i32> {
    ensure_installed()?;
    let p = Arc::as_ptr(mm) as usize;
    registry().update(|v| {
        let mut v = v.clone();
        v.push(p);
        v
    });
    Ok(())
}

/// Removes an address space; returns once no handler can still use it.
pub fn unregister(mm: &Mm) {
    let p = mm as *const Mm as usize;
    registry().update(|v| v.iter().copied().filter(|&x| x != p).collect());
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    // si_code > 0: raised by the kernel for a fault (not kill/tgkill).
    if code > 0 {
        let write = {
            // SAFETY: for SA_SIGINFO handlers `uctx` points to the
            // interrupted context; on x86-64 gregs[REG_ERR] holds the page
            // fault error code, whose bit 1 means "write".
            let uc = unsafe { &*(uctx as *const libc::ucontext_t) };
            uc.uc_mcontext.gregs[libc::REG_ERR as usize] & 2 != 0
        };
        let handled = registry().read(|mms| {
            for &p in mms {
                // SAFETY: registered pointers are live `Mm`s until
                // `unregister` has waited out this read section.
                let mm = unsafe { &*(p as *const Mm) };
                if mm.claims(addr) {
                    return Some(handle_fault(mm, addr, write));
                }
            }
            None
        });
        match handled {
            Some(Resolution::Resolved) => return,
            Some(Resolution::Segv) => {
                // SAFETY: raise is async-signal-safe; SIGSEGV is not blocked
                // here, so it is delivered as the handler returns.
                unsafe { libc::raise(libc::SIGSEGV) };
                return;
            }
            Some(Resolution::Bus) | None => {}
        }
    }
    chain(sig, info, uctx);
}

/// Passes a SIGBUS that is not ours (or a poisoned page) to the handler
/// that was installed before ours, or applies the default action.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let prev = PREVIOUS.get();
    chain_to(
        prev.map_or(libc::SIG_DFL, |p| p.sa_sigaction),
        prev.map_or(0, |p| p.sa_flags),
        sig,
        info,
        uctx,
    );
}

/// Calls the SIGBUS handler `handler` (a `sa_sigaction` value, with its
/// `sa_flags`) as the kernel would have, or applies the default action
/// (the process dies of SIGBUS) or ignores the signal. Async-signal-safe.
pub(crate) fn chain_to(
    handler: libc::sighandler_t,
    flags: libc::c_int,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) {
    if handler == libc::SIG_IGN {
        return;
    }
    if handler == libc::SIG_DFL {
        // SAFETY: sigaction/sigprocmask/raise are async-signal-safe. We reset
        // SIGBUS to its default (terminate), unblock it and raise it: the
        // process dies with SIGBUS, as it would without a pager.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGBUS);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(libc::SIGBUS);
        }
        return;
    }
    // SAFETY: `handler` is a function pointer installed with sigaction; we
    // call it with the signature its flags declare.
    unsafe {
        if flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(sig, info, uctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(sig);
        }
    }
}
