//! Passing on a SIGBUS that is not the engine's: to the action that was
//! installed before ours, delivered as the kernel would have delivered it,
//! and following what that action's handler does to SIGBUS's action.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The SIGBUS action in place before ours: read before ours is installed,
/// so the handler never runs without it.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// What became of [`PREVIOUS`] since: [`KEPT`], or the disposition the
/// application's handler gave SIGBUS when it ran ([`DEFAULT`],
/// [`IGNORED`]). Ours stays installed: the engine still serves its faults.
static NOW: AtomicU8 = AtomicU8::new(KEPT);
/// [`PREVIOUS`] as it was read.
const KEPT: u8 = 0;
/// The default action: the previous handler was installed with
/// `SA_RESETHAND` and has run (the kernel would have reset SIGBUS on that
/// delivery), or it set the default itself, as Rust's std's stack-overflow
/// handler does for a SIGBUS outside a guard page.
const DEFAULT: u8 = 1;
/// Ignored: the previous handler set `SIG_IGN` itself.
const IGNORED: u8 = 2;

/// Records the action in place before ours (once, before ours goes in).
pub(super) fn remember_previous(old: libc::sigaction) {
    let _ = PREVIOUS.set(old);
}

/// Passes a SIGBUS that is not ours (or a poisoned page) on as the kernel
/// would have delivered it with the action that was installed before ours,
/// as that action's own handler has changed it since. Async-signal-safe.
///
/// Hazard: the application's handler runs believing it is SIGBUS's
/// handler, and may change SIGBUS's action, which is ours: Rust's std sets
/// the default for a SIGBUS outside a stack guard page and returns, so a
/// SIGBUS some process sent (`kill`, `raise`, a memory error's
/// `BUS_MCEERR_AO`) left the default installed, and the process died of
/// the next fault on any region (`tests/signal_chain.rs`). So once the
/// handler returns, an action it set to the default or to ignore becomes
/// what later SIGBUSes that are not ours get, and ours goes back in; a
/// handler of its own that it installs replaces ours, as any later
/// `sigaction` of the application's does; itself again, it stays the one
/// chained to. (A handler that leaves with `siglongjmp` after changing the
/// action is not followed. The look and the reinstall are two calls: an
/// action another thread installs between them is overwritten, and a
/// fault in another thread between the handler's change and the
/// reinstall gets the action the handler set.)
pub(super) fn chain(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
    ours: &libc::sigaction,
) {
    // SAFETY: a zeroed sigaction is valid; its handler is set to ignore.
    let ignore = unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = libc::SIG_IGN;
        a
    };
    let prev = match NOW.load(Ordering::Acquire) {
        KEPT => PREVIOUS.get(),
        IGNORED => Some(&ignore),
        _ => None,
    };
    let runs =
        prev.is_some_and(|p| p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN);
    if let Some(p) = prev.filter(|_| runs) {
        if p.sa_flags & libc::SA_RESETHAND != 0 {
            NOW.store(DEFAULT, Ordering::Release);
        }
    }
    chain_to(prev, sig, info, uctx, ours);
    if runs {
        follow_change(ours);
    }
}

/// After the application's handler returned: where it set SIGBUS to the
/// default or to ignore, that is what later SIGBUSes that are not ours
/// get, and `ours` (the engine's action) is installed again (see
/// [`chain`]). Async-signal-safe.
fn follow_change(ours: &libc::sigaction) {
    // SAFETY: a zeroed sigaction is a valid out-parameter; sigaction is
    // async-signal-safe and gets valid pointers.
    unsafe {
        let mut now: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut now) != 0
            || now.sa_sigaction == ours.sa_sigaction
        {
            return;
        }
        let became = match now.sa_sigaction {
            libc::SIG_DFL => DEFAULT,
            libc::SIG_IGN => IGNORED,
            // It installed itself again (as a handler that resets itself
            // does, or one that makes sure of its place): as it was.
            h if PREVIOUS.get().is_some_and(|p| p.sa_sigaction == h) => KEPT,
            _ => return,
        };
        NOW.store(became, Ordering::Release);
        libc::sigaction(libc::SIGBUS, ours, std::ptr::null_mut());
    }
}

/// `si_code` of the kernel's asynchronous memory-error SIGBUS ("action
/// optional": a page of the process went bad, not under its access).
const BUS_MCEERR_AO: libc::c_int = 5;

/// Whether `info` is a fault the kernel raised (a positive `si_code`),
/// not a signal a process sent (`kill`, `tgkill`, `sigqueue`: zero or
/// negative), nor the kernel's asynchronous memory-error SIGBUS
/// (`BUS_MCEERR_AO`), which it sends as a process would: an ignored one
/// is dropped, where it killed (found by review).
fn raised_by_a_fault(info: *const libc::siginfo_t) -> bool {
    // SAFETY: the kernel's siginfo for this delivery, or null.
    !info.is_null() && matches!(unsafe { (*info).si_code }, c if c > 0 && c != BUS_MCEERR_AO)
}

/// Delivers SIGBUS with `action` (`None`: the default action) as the
/// kernel would have (`ours`: the engine's action, put back where the
/// default is raised and comes back). Async-signal-safe.
///
/// - `SIG_DFL`: the process dies of SIGBUS, as it would without a pager.
/// - `SIG_IGN`: a SIGBUS some process sent is ignored; one a fault raised
///   cannot be, since the access would only fault again (the kernel's
///   `force_sig_fault` resets an ignored or blocked SIGBUS to the default
///   action), so the process dies of it.
/// - A handler runs with the signal mask the kernel would give it: the
///   mask at the fault (`uc_sigmask`), plus its `sa_mask`, plus SIGBUS
///   unless `SA_NODEFER` (which does not take it out of `sa_mask`); ours
///   is restored when it returns (a handler that
///   leaves with `siglongjmp` restores the mask its `sigsetjmp` saved).
///   `SA_RESETHAND` is [`chain`]'s: it cannot reset our installed action.
///   `SA_ONSTACK` is not honoured: the handler runs on the faulting
///   thread's stack, which ours runs on too (see `sigbus::ensure_installed`; a
///   SIGBUS is not the stack overflow an alternate stack is for).
fn chain_to(
    action: Option<&libc::sigaction>,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
    ours: &libc::sigaction,
) {
    let (handler, flags) = action.map_or((libc::SIG_DFL, 0), |a| (a.sa_sigaction, a.sa_flags));
    if handler == libc::SIG_IGN && !raised_by_a_fault(info) {
        return;
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: sigaction is async-signal-safe; a zeroed action is valid.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
        // A fault's SIGBUS: its own siginfo is queued to this thread
        // (`rt_tgsigqueueinfo` takes a kernel `si_code` from a thread for
        // itself) while this handler blocks every signal, and kills as the
        // handler returns, as the kernel's would have: with the fault's
        // `si_code` and address, in the faulting instruction's context (a
        // core shows it). Raised from here, the process died of an
        // `SI_TKILL` with no address, in this handler's context (found by
        // review). An init drops the queued one; the access then runs
        // again, faults again (a poisoned page, a page the pool cannot
        // give, a truncated file) and the kernel's forced SIGBUS kills it.
        if raised_by_a_fault(info) {
            // SAFETY: `uctx` is the kernel's ucontext for this delivery, or
            // null (its mask is what the return restores, ours to change);
            // `info` the kernel's siginfo for it, which the syscall copies.
            unsafe {
                let uc = uctx as *mut libc::ucontext_t;
                if !uc.is_null() {
                    libc::sigdelset(&mut (*uc).uc_sigmask, libc::SIGBUS);
                }
                libc::syscall(
                    libc::SYS_rt_tgsigqueueinfo,
                    libc::getpid(),
                    libc::gettid(),
                    libc::SIGBUS,
                    info,
                );
            }
            return;
        }
        // SAFETY: sigprocmask/raise/sigaction are async-signal-safe: a
        // SIGBUS a process sent is raised again, unblocked, with the
        // default action: the process dies of it, as it would without a
        // pager. An init (of a PID namespace too) does not: the kernel
        // drops a sent signal at its default action, and the raise comes
        // back. Ours goes back in: the default left in its place made the
        // next fault on any region kill the init (found by review).
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGBUS);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(libc::SIGBUS);
            libc::sigaction(libc::SIGBUS, ours, std::ptr::null_mut());
        }
        return;
    }
    let Some(action) = action else {
        return; // (a handler comes only from an action)
    };
    // SAFETY: sigemptyset/sigismember/sigaddset work on the local set and
    // on the kernel's ucontext for this delivery (read only, when given);
    // pthread_sigmask is async-signal-safe and gets valid pointers.
    let ours = unsafe {
        let mut mask = action.sa_mask;
        let at_fault: Option<&libc::sigset_t> =
            (!uctx.is_null()).then(|| &(*(uctx as *const libc::ucontext_t)).uc_sigmask);
        if let Some(at_fault) = at_fault {
            for s in 1..=64 {
                if libc::sigismember(at_fault, s) == 1 {
                    libc::sigaddset(&mut mask, s);
                }
            }
        }
        // (`SA_NODEFER` only leaves `sig` out of what is added: where the
        // handler's `sa_mask` lists it, it is blocked, as the kernel's
        // delivery blocks it.)
        if flags & libc::SA_NODEFER == 0 {
            libc::sigaddset(&mut mask, sig);
        }
        let mut ours: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, &mut ours);
        ours
    };
    // SAFETY: `handler` is a function pointer installed with sigaction; we
    // call it with the signature its flags declare.
    unsafe {
        if flags & libc::SA_SIGINFO != 0 {
            // ("C-unwind": a cancellation may unwind out of it.)
            let f: extern "C-unwind" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(sig, info, uctx);
        } else {
            let f: extern "C-unwind" fn(libc::c_int) = std::mem::transmute(handler);
            f(sig);
        }
    }
    // SAFETY: as above; restores the mask this handler ran with.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &ours, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    /// A siginfo with `si_code` `code`.
    fn info(code: libc::c_int) -> libc::siginfo_t {
        // SAFETY: a zeroed siginfo is a valid value.
        let mut i: libc::siginfo_t = unsafe { std::mem::zeroed() };
        i.si_signo = libc::SIGBUS;
        i.si_code = code;
        i
    }

    #[test]
    fn only_a_synchronous_fault_is_raised_by_a_fault() {
        // BUS_ADRALN, BUS_ADRERR, BUS_OBJERR, BUS_MCEERR_AR.
        for code in 1..=4 {
            assert!(super::raised_by_a_fault(&info(code)), "{code}");
        }
        // SI_USER, SI_TKILL, SI_QUEUE, and the asynchronous memory error.
        for code in [0, -6, -1, super::BUS_MCEERR_AO] {
            assert!(!super::raised_by_a_fault(&info(code)), "{code}");
        }
        assert!(!super::raised_by_a_fault(std::ptr::null()));
    }
}
