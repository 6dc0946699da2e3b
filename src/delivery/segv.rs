//! The SIGSEGV a refused access gets in SIGBUS mode ([`force_segv`]), as
//! the kernel's own fault would give it: its `si_code` and address, the
//! faulting code's context, and death where that code cannot take it.

/// Maps the page an init faults on ([`INIT_GUARD`]), in the first process
/// of a PID namespace only; nothing elsewhere. Called once, when the
/// SIGBUS handler is installed.
pub(super) fn guard_an_init() {
    // SAFETY: getpid and an anonymous, inaccessible mapping of our own.
    unsafe {
        if libc::getpid() != 1 {
            return;
        }
        let page = libc::mmap(
            std::ptr::null_mut(),
            crate::sys::PAGE_SIZE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if page != libc::MAP_FAILED {
            INIT_GUARD.store(page as usize, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// In the first process of a PID namespace (an init, which the kernel
/// lets no signal with the default action kill unless a fault raised it):
/// an inaccessible page, faulted on for real where a refused access must
/// kill ([`force_segv`]); 0 elsewhere.
static INIT_GUARD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `si_code`s of SIGSEGV (`asm-generic/siginfo.h`): no mapping at the
/// address; a mapping that refuses the access.
pub(super) const SEGV_MAPERR: i32 = 1;
pub(super) const SEGV_ACCERR: i32 = 2;

/// A SIGSEGV's `siginfo_t` as the kernel lays it out on x86-64: three
/// ints, padding, the faulting address; the rest zero.
#[repr(C)]
struct SegvInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    addr: usize,
    _rest: [u64; 13],
}
const _: () = assert!(std::mem::size_of::<SegvInfo>() == std::mem::size_of::<libc::siginfo_t>());

/// Gives the access the SIGSEGV the kernel's `force_sig_fault` would: with
/// `code` and the faulting address `addr` in its `siginfo`, and delivered
/// in the faulting code's context. It is queued to this thread
/// (`rt_tgsigqueueinfo`, which takes a kernel `si_code` from a thread for
/// itself) while this handler blocks every signal, and arrives as soon as
/// the handler returns: the application's handler then sees the faulting
/// instruction's registers in its `ucontext` (a runtime's handler may read
/// or move the instruction pointer there) and the mask the code had. Where
/// that mask blocks SIGSEGV or the action ignores it, the action is reset
/// to the default and SIGSEGV taken out of the mask the return restores
/// (`uc_sigmask`): the access would only fault again, so the process dies
/// of it, as without the engine (an init, the first process of a PID
/// namespace, faults on a page of its own instead: it would drop the
/// signal, see [`INIT_GUARD`]). Where it cannot be queued, it is raised
/// here, with the faulting code's mask (the application's handler then
/// runs nested in this one, with `si_code` `SI_TKILL`). Async-signal-safe.
pub(super) fn force_segv(addr: usize, code: i32, uctx: *mut libc::c_void) {
    // SAFETY: `uctx` is the kernel's ucontext for this delivery, or null;
    // its `uc_sigmask` is what the return from this handler restores, and
    // ours to change. sigaction, sigprocmask, the syscalls and raise are
    // async-signal-safe and get valid pointers. The read of `INIT_GUARD`'s
    // page (mapped inaccessible for the process's life) touches no Rust
    // object: it faults, and the kernel ends the process.
    unsafe {
        let uc = uctx as *mut libc::ucontext_t;
        let mut now: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut now);
        let blocked = !uc.is_null() && libc::sigismember(&(*uc).uc_sigmask, libc::SIGSEGV) == 1;
        if blocked || now.sa_sigaction == libc::SIG_IGN {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGSEGV, &dfl, std::ptr::null_mut());
            if !uc.is_null() {
                libc::sigdelset(&mut (*uc).uc_sigmask, libc::SIGSEGV);
            }
            now.sa_sigaction = libc::SIG_DFL;
        }
        // An init drops a sent signal whose action is the default: the
        // access would fault again for ever. A fault of its own raises one
        // the kernel delivers (it lifts the init's protection for a fault
        // it forces): the process dies of SIGSEGV, as without the engine.
        let guard = INIT_GUARD.load(std::sync::atomic::Ordering::Relaxed);
        if now.sa_sigaction == libc::SIG_DFL && guard != 0 {
            std::arch::asm!(
                "mov {t}, byte ptr [{g}]",
                g = in(reg) guard,
                t = out(reg_byte) _,
                options(nostack, readonly),
            );
        }
        if !uc.is_null() {
            // Blocked here, so that it waits for the return: the kernel
            // blocks every signal for this handler (its `sa_mask`), but a
            // runtime's handler installed after it may call it directly,
            // with a mask of its own that lets SIGSEGV in. Queued then, it
            // was delivered at once, nested here (the application's
            // handler saw this call's registers, not the access's). Now
            // it waits until the outer frame's return restores the mask
            // that frame's `uc_sigmask` holds. (A no-op under our own
            // `sa_mask`.)
            let mut segv: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut segv);
            libc::sigaddset(&mut segv, libc::SIGSEGV);
            libc::pthread_sigmask(libc::SIG_BLOCK, &segv, std::ptr::null_mut());
            let info = SegvInfo {
                signo: libc::SIGSEGV,
                errno: 0,
                code,
                _pad: 0,
                addr,
                _rest: [0; 13],
            };
            let queued = libc::syscall(
                libc::SYS_rt_tgsigqueueinfo,
                libc::getpid(),
                libc::gettid(),
                libc::SIGSEGV,
                &info as *const SegvInfo,
            );
            if queued == 0 {
                return;
            }
        }
        let mut mask: libc::sigset_t = std::mem::zeroed();
        if uc.is_null() {
            libc::sigemptyset(&mut mask);
        } else {
            mask = (*uc).uc_sigmask;
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        libc::raise(libc::SIGSEGV);
    }
}
