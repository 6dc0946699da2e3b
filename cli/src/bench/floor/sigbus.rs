//! In-thread delivery for the floor: a SIGBUS handler of its own,
//! installed only for the duration of a pass, reading its state from
//! atomics.

use super::{fatal, resolve, Target};
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Mutex, Once, PoisonError};
use uffd_pager::delivery::Delivery;
use uffd_pager::error::Result;
use uffd_pager::pager::Pager;
use uffd_pager::sys::uffd::Uffd;

/// The in-thread floor's state, read by its SIGBUS handler.
struct SigState {
    uffd: AtomicUsize,
    base: AtomicUsize,
    len: AtomicUsize,
    src: AtomicUsize,
    memfd: AtomicUsize,
    prev_handler: AtomicUsize,
    prev_flags: AtomicUsize,
}

static SIG: SigState = SigState {
    uffd: AtomicUsize::new(0),
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    src: AtomicUsize::new(0),
    memfd: AtomicUsize::new(0),
    prev_handler: AtomicUsize::new(0),
    prev_flags: AtomicUsize::new(0),
};

/// One in-thread floor pass at a time, process-wide (they share [`SIG`] and
/// the SIGBUS disposition).
static SERIAL: Mutex<()> = Mutex::new(());
static ENGINE_HANDLER: Once = Once::new();

/// Makes sure the engine's process-wide SIGBUS handler is installed before
/// the floor first saves and restores the disposition. Otherwise a pager
/// built during a floor pass would record the floor's handler as its
/// "previous" one, and the floor's restore would then remove the engine's.
pub(super) fn settle_engine_handler() {
    ENGINE_HANDLER.call_once(|| {
        let _ = Pager::builder().delivery(Delivery::InThread).build();
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    let base = SIG.base.load(Acquire);
    let len = SIG.len.load(Acquire);
    // si_code > 0: raised by the kernel for a fault (not kill/tgkill).
    if code > 0 && base != 0 && addr.wrapping_sub(base) < len {
        let t = Target {
            base,
            len,
            src: SIG.src.load(Acquire),
            memfd: SIG.memfd.load(Acquire) as i32,
        };
        // SAFETY: `uffd` points to the floor's descriptor, which outlives
        // the pass; `base` is non-zero only during the pass.
        let uffd = unsafe { &*(SIG.uffd.load(Acquire) as *const Uffd) };
        if resolve(uffd, &t, addr).is_err() {
            fatal(b"uffd-pager floor: install failed in the SIGBUS handler\n");
        }
        return;
    }
    chain(sig, info, uctx);
}

/// Passes a SIGBUS that is not the floor's to the handler installed before
/// the floor's, or applies the default action.
pub(crate) fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    uffd_pager::delivery::sigbus::chain_to(
        SIG.prev_handler.load(Acquire),
        SIG.prev_flags.load(Acquire) as libc::c_int,
        sig,
        info,
        uctx,
    );
}

/// A SIGBUS handler of the floor's, installed while this lives (and the
/// [`SERIAL`] guard with it).
struct Installed {
    old: libc::sigaction,
}

/// A raw SA_SIGINFO signal handler.
pub(crate) type RawHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

impl Installed {
    fn new(handler: RawHandler) -> Result<Installed> {
        // SAFETY: zeroed sigaction structs are valid; we query the current
        // disposition first (so chaining works from the first signal), then
        // install ours with SA_SIGINFO and an empty mask.
        let old = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return Err(crate::sys_error(
                    "sigaction(SIGBUS)",
                    uffd_pager::sys::errno(),
                ));
            }
            SIG.prev_handler.store(old.sa_sigaction, Release);
            SIG.prev_flags.store(old.sa_flags as usize, Release);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
                return Err(crate::sys_error(
                    "sigaction(SIGBUS)",
                    uffd_pager::sys::errno(),
                ));
            }
            old
        };
        Ok(Installed { old })
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        // SAFETY: restores the disposition saved in `new`.
        unsafe { libc::sigaction(libc::SIGBUS, &self.old, std::ptr::null_mut()) };
    }
}

/// Runs `f` with `handler` as the process's SIGBUS handler (and no other
/// floor pass running), restoring the previous disposition afterwards. The
/// handler passes signals that are not its own to [`chain`].
pub(crate) fn with_raw_handler<R>(handler: RawHandler, f: impl FnOnce() -> Result<R>) -> Result<R> {
    settle_engine_handler();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let _installed = Installed::new(handler)?;
    f()
}

/// Runs `f` with the floor's SIGBUS handler serving `t` (and no other floor
/// pass running), restoring the previous disposition afterwards.
pub(super) fn with_handler<R>(uffd: &Uffd, t: &Target, f: impl FnOnce() -> Result<R>) -> Result<R> {
    with_raw_handler(on_sigbus, || {
        SIG.uffd.store(uffd as *const Uffd as usize, Release);
        SIG.src.store(t.src, Release);
        SIG.memfd.store(t.memfd as usize, Release);
        SIG.len.store(t.len, Release);
        SIG.base.store(t.base, Release);
        let r = f();
        SIG.base.store(0, Release);
        SIG.len.store(0, Release);
        SIG.uffd.store(0, Release);
        r
    })
}
