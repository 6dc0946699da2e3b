//! In-thread delivery for the floor: a SIGBUS handler of its own,
//! installed only for the duration of a pass, reading its state from
//! atomics.

use super::{fatal, resolve, Target};
use crate::os::signal::{chain, ErrnoGuard, Installed, RawHandler};
use crate::os::uffd::Uffd;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Mutex, Once, PoisonError};
use uffd_pager::{Delivery, Pager, Result};

/// The in-thread floor's state, read by its SIGBUS handler.
struct SigState {
    uffd: AtomicUsize,
    base: AtomicUsize,
    len: AtomicUsize,
    src: AtomicUsize,
    memfd: AtomicUsize,
    alias: AtomicUsize,
    page: AtomicUsize,
    hop: AtomicUsize,
}

static SIG: SigState = SigState {
    uffd: AtomicUsize::new(0),
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    src: AtomicUsize::new(0),
    memfd: AtomicUsize::new(0),
    alias: AtomicUsize::new(0),
    page: AtomicUsize::new(0),
    hop: AtomicUsize::new(0),
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
    let _errno = ErrnoGuard::save();
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
            alias: SIG.alias.load(Acquire),
            page: SIG.page.load(Acquire),
            hop: SIG.hop.load(Acquire),
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

/// Runs `f` with `handler` as the process's SIGBUS handler (and no other
/// floor pass running), restoring the previous disposition afterwards. The
/// handler passes signals that are not its own to [`chain`].
pub(crate) fn with_raw_handler<R>(handler: RawHandler, f: impl FnOnce() -> Result<R>) -> Result<R> {
    settle_engine_handler();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let _installed =
        Installed::new(handler).map_err(|e| crate::sys_error("sigaction(SIGBUS)", e as i32))?;
    f()
}

/// Runs `f` with the floor's SIGBUS handler serving `t` (and no other floor
/// pass running), restoring the previous disposition afterwards.
pub(super) fn with_handler<R>(uffd: &Uffd, t: &Target, f: impl FnOnce() -> Result<R>) -> Result<R> {
    with_raw_handler(on_sigbus, || {
        SIG.uffd.store(uffd as *const Uffd as usize, Release);
        SIG.src.store(t.src, Release);
        SIG.memfd.store(t.memfd as usize, Release);
        SIG.alias.store(t.alias, Release);
        SIG.page.store(t.page, Release);
        SIG.hop.store(t.hop, Release);
        SIG.len.store(t.len, Release);
        SIG.base.store(t.base, Release);
        let r = f();
        SIG.base.store(0, Release);
        SIG.len.store(0, Release);
        SIG.uffd.store(0, Release);
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use uffd_pager::PAGE_SIZE;

    #[test]
    fn faults_outside_the_floor_chain_to_the_engine() {
        let pager = Pager::builder()
            .delivery(Delivery::InThread)
            .build()
            .unwrap();
        let mut r = pager.map_anonymous(4 * PAGE_SIZE).unwrap();
        // No floor range is set: every SIGBUS the floor's handler sees is
        // someone else's, here the engine's, and must reach its handler.
        let sum = with_raw_handler(on_sigbus, || {
            // SAFETY: a zeroed sigaction is a valid buffer to read into.
            let cur = unsafe {
                let mut cur: libc::sigaction = std::mem::zeroed();
                assert_eq!(libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur), 0);
                cur
            };
            assert_eq!(cur.sa_sigaction, on_sigbus as RawHandler as usize);
            let s = r.as_mut_slice();
            s[0] = 1;
            s[3 * PAGE_SIZE] = 2;
            Ok(s[0] + s[3 * PAGE_SIZE] + s[PAGE_SIZE])
        })
        .unwrap();
        assert_eq!(sum, 3);
    }
}
