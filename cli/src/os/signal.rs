//! SIGBUS handlers for the in-thread floors: installing one for a while
//! (through `nix`), passing on the signals that are not its own to the
//! handler it replaced ([`chain`]), and keeping the interrupted code's
//! `errno` ([`ErrnoGuard`]).
//!
//! One floor handler is installed at a time, process-wide (the caller
//! serialises them); the handler it replaced is kept in atomics so that
//! [`chain`], which runs inside the signal handler, reads it without locks.

use nix::errno::Errno;
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// A raw `SA_SIGINFO` signal handler.
pub type RawHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// The disposition the installed floor handler replaced: `sa_sigaction`
/// (`SIG_DFL`, `SIG_IGN` or a function) and whether it takes `siginfo`.
static PREV_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREV_SIGINFO: AtomicUsize = AtomicUsize::new(0);

/// Saves the calling thread's `errno` and puts it back on drop: a signal
/// handler's first line, so that the code it interrupted sees its own.
pub struct ErrnoGuard(i32);

impl ErrnoGuard {
    /// Saves `errno`.
    #[inline]
    pub fn save() -> ErrnoGuard {
        ErrnoGuard(Errno::last_raw())
    }
}

impl Drop for ErrnoGuard {
    #[inline]
    fn drop(&mut self) {
        Errno::set_raw(self.0);
    }
}

/// Passes a SIGBUS that the installed floor handler does not own to the
/// disposition it replaced: calls that handler (with the arguments its
/// flags ask for), ignores the signal, or for the default action resets
/// SIGBUS to it and re-raises, so the process dies of SIGBUS as it would
/// have. Async-signal-safe: atomics, sigaction, sigprocmask and raise.
pub fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    match PREV_HANDLER.load(Acquire) {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
            // SAFETY: installing the default action needs no handler code.
            let _ = unsafe { signal::sigaction(Signal::SIGBUS, &dfl) };
            let mut bus = SigSet::empty();
            bus.add(Signal::SIGBUS);
            let _ = signal::pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&bus), None);
            let _ = signal::raise(Signal::SIGBUS);
        }
        f if PREV_SIGINFO.load(Acquire) != 0 => {
            // SAFETY: `f` came from the kernel's record of an installed
            // SA_SIGINFO handler (see `Installed::new`), so it is a
            // function of this signature; we pass it our own arguments.
            let h: RawHandler = unsafe { std::mem::transmute::<usize, RawHandler>(f) };
            h(sig, info, uctx);
        }
        f => {
            // SAFETY: as above, for a handler installed without SA_SIGINFO,
            // which takes the signal number alone.
            let h = unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(f) };
            h(sig);
        }
    }
}

/// A floor's SIGBUS handler, installed while this lives; the previous
/// disposition comes back on drop. Only one may live at a time.
pub struct Installed {
    prev: SigAction,
}

impl Installed {
    /// Installs `handler` for SIGBUS (`SA_SIGINFO`, nothing else blocked),
    /// after recording the current disposition for [`chain`], so that a
    /// signal that is not the floor's is passed on correctly from the
    /// first one. The caller must make sure no other [`Installed`] lives.
    pub fn new(handler: RawHandler) -> Result<Installed, Errno> {
        // nix can only swap a disposition, so the current one is read first
        // with sigaction(2) itself (a null new action).
        // SAFETY: a zeroed sigaction is a valid buffer for the kernel to
        // fill; nothing is installed.
        let cur = unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) != 0 {
                return Err(Errno::last());
            }
            cur
        };
        PREV_SIGINFO.store((cur.sa_flags & libc::SA_SIGINFO != 0) as usize, Release);
        PREV_HANDLER.store(cur.sa_sigaction, Release);
        let ours = SigAction::new(
            SigHandler::SigAction(handler),
            SaFlags::SA_SIGINFO,
            SigSet::empty(),
        );
        // SAFETY: `handler` is an extern "C" function of the SA_SIGINFO
        // signature; the floors' handlers are async-signal-safe.
        let prev = unsafe { signal::sigaction(Signal::SIGBUS, &ours) }?;
        Ok(Installed { prev })
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        // SAFETY: puts back exactly the disposition `new` replaced.
        let _ = unsafe { signal::sigaction(Signal::SIGBUS, &self.prev) };
    }
}
