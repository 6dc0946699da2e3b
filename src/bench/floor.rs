//! The raw floor loop: the userfaultfd ioctls a pager cannot avoid, driven
//! by the smallest handler that works, with no engine in between.
//!
//! - **Anonymous**: a private anonymous range registered MISSING. Each fault
//!   copies its page's 4 KiB from a source buffer to a staging page, then
//!   UFFDIO_COPY installs it (and wakes).
//! - **Shared**: a memfd mapping registered MINOR|MISSING. The memfd is
//!   filled through an alias mapping up front, and `MADV_DONTNEED` on the
//!   user mapping drops only the page-table entries, so every touch is a
//!   MINOR fault. Each fault copies 4 KiB from the source into the memfd
//!   page (it exists already) and UFFDIO_CONTINUE maps it (and wakes).
//!
//! One page per ioctl, one ioctl per fault: the same granularity as the
//! engine. Delivery is either in-thread (a SIGBUS handler of the floor's
//! own, installed only for the duration of a pass, see the module docs of
//! [`crate::bench`]) or handler threads that block in poll(2) and read one
//! message per fault, optionally spinning first as the engine's pool does.
//!
//! A failed install leaves the faulting thread with no way forward, so the
//! floor reports it on stderr and aborts the process.

use super::touch;
use crate::delivery::Delivery;
use crate::error::{Error, Result};
use crate::object::InstallKind;
use crate::pager::Pager;
use crate::sys::mem::{madvise, Mapping, Memfd};
use crate::sys::uffd::{feature, mode, Msg, Uffd, EVENT_PAGEFAULT};
use crate::sys::{now_ns, PAGE_SIZE};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// The addresses a fault is resolved with. Plain integers, so that the
/// signal handler can rebuild it from atomics.
#[derive(Debug, Clone, Copy)]
struct Target {
    /// The registered user range.
    base: usize,
    len: usize,
    /// The source buffer (same layout as the user range).
    src: usize,
    /// The memfd alias for shared ranges; 0 for anonymous ones.
    alias: usize,
}

/// Resolves the fault at `addr` (inside `t`) with one page-sized install
/// that also wakes. `stage` is a page the caller owns exclusively.
/// Async-signal-safe: a memcpy and ioctls.
fn resolve(uffd: &Uffd, t: &Target, addr: usize, stage: usize) -> std::result::Result<(), i32> {
    let page = addr & !(PAGE_SIZE - 1);
    let off = page - t.base;
    let dst = if t.alias != 0 { t.alias + off } else { stage };
    // SAFETY: `t.src + off` is a page of the live source buffer (same length
    // as the user range, and `off < t.len`); `dst` is either the matching
    // page of the live memfd alias or the caller's staging page. Neither is
    // referenced as a Rust object, and the ranges are distinct mappings.
    unsafe {
        std::ptr::copy_nonoverlapping((t.src + off) as *const u8, dst as *mut u8, PAGE_SIZE);
    }
    loop {
        let r = if t.alias != 0 {
            uffd.cont(page, PAGE_SIZE, 0)
        } else {
            uffd.copy(page, stage, PAGE_SIZE, 0)
        };
        match r {
            Ok(_) | Err(libc::EEXIST) => return Ok(()),
            Err(libc::EAGAIN) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes `msg` to stderr and aborts; async-signal-safe.
fn fatal(msg: &[u8]) -> ! {
    // SAFETY: write(2) from a live buffer and abort(3) are async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::abort()
    }
}

/// The in-thread floor's state, read by its SIGBUS handler.
struct SigState {
    uffd: AtomicUsize,
    base: AtomicUsize,
    len: AtomicUsize,
    src: AtomicUsize,
    alias: AtomicUsize,
    stage: AtomicUsize,
    prev_handler: AtomicUsize,
    prev_flags: AtomicUsize,
}

static SIG: SigState = SigState {
    uffd: AtomicUsize::new(0),
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    src: AtomicUsize::new(0),
    alias: AtomicUsize::new(0),
    stage: AtomicUsize::new(0),
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
fn settle_engine_handler() {
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
            alias: SIG.alias.load(Acquire),
        };
        // SAFETY: `uffd` points to the floor's descriptor, which outlives
        // the pass; `base` is non-zero only during the pass.
        let uffd = unsafe { &*(SIG.uffd.load(Acquire) as *const Uffd) };
        if resolve(uffd, &t, addr, SIG.stage.load(Acquire)).is_err() {
            fatal(b"uffd-pager floor: install failed in the SIGBUS handler\n");
        }
        return;
    }
    chain(sig, info, uctx);
}

/// Passes a SIGBUS that is not the floor's to the handler installed before
/// the floor's, or applies the default action.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let handler = SIG.prev_handler.load(Acquire);
    let flags = SIG.prev_flags.load(Acquire) as libc::c_int;
    if handler == libc::SIG_IGN {
        return;
    }
    if handler == libc::SIG_DFL {
        // SAFETY: sigaction, pthread_sigmask and raise are async-signal-safe;
        // the process dies of SIGBUS as it would with no handler at all.
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
    // SAFETY: `handler` is the function pointer that was installed with
    // sigaction before the floor's; we call it with the signature its
    // flags declare.
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

/// The floor's SIGBUS handler, installed while this lives (and the
/// [`SERIAL`] guard with it).
struct Installed {
    old: libc::sigaction,
}

impl Installed {
    fn new(uffd: &Uffd, t: &Target, stage: usize) -> Result<Installed> {
        SIG.uffd.store(uffd as *const Uffd as usize, Release);
        SIG.src.store(t.src, Release);
        SIG.alias.store(t.alias, Release);
        SIG.stage.store(stage, Release);
        // SAFETY: zeroed sigaction structs are valid; we query the current
        // disposition first (so chaining works from the first signal), then
        // install ours with SA_SIGINFO and an empty mask.
        let old = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return Err(Error::sys("sigaction(SIGBUS)", crate::sys::errno()));
            }
            SIG.prev_handler.store(old.sa_sigaction, Release);
            SIG.prev_flags.store(old.sa_flags as usize, Release);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
                return Err(Error::sys("sigaction(SIGBUS)", crate::sys::errno()));
            }
            old
        };
        SIG.len.store(t.len, Release);
        SIG.base.store(t.base, Release);
        Ok(Installed { old })
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        // SAFETY: restores the disposition saved in `new`.
        unsafe { libc::sigaction(libc::SIGBUS, &self.old, std::ptr::null_mut()) };
        SIG.base.store(0, Release);
        SIG.len.store(0, Release);
        SIG.uffd.store(0, Release);
    }
}

/// Handler threads of the floor; stopped and joined on drop.
struct Handlers {
    stop: OwnedFd,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Handlers {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn serve(uffd: &Uffd, t: Target, stop: RawFd, spin_us: u32, stage: usize) {
    let mut msgs = [Msg::default(); 16];
    let spin_ns = spin_us as u64 * 1000;
    let mut deadline = now_ns() + spin_ns;
    loop {
        match uffd.read_msgs(&mut msgs) {
            Ok(n) if n > 0 => {
                for m in msgs[..n].iter().filter(|m| m.event == EVENT_PAGEFAULT) {
                    if let Err(e) = resolve(uffd, &t, m.arg1 as usize, stage) {
                        let e = std::io::Error::from_raw_os_error(e);
                        eprintln!("uffd-pager floor: install failed in a handler thread: {e}");
                        std::process::abort();
                    }
                }
                deadline = now_ns() + spin_ns;
                continue;
            }
            Ok(_) | Err(libc::EINTR) => {}
            Err(e) => {
                let e = std::io::Error::from_raw_os_error(e);
                eprintln!("uffd-pager floor: reading fault messages: {e}");
                std::process::abort();
            }
        }
        if spin_ns > 0 && now_ns() < deadline {
            std::hint::spin_loop();
            continue;
        }
        let mut fds = [
            libc::pollfd {
                fd: uffd.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if fds[1].revents != 0 {
            return;
        }
    }
}

/// The raw floor loop for one install kind and delivery mode. See the
/// module docs.
pub struct FloorLoop {
    pages: usize,
    target: Target,
    handlers: Option<Handlers>,
    uffd: Arc<Uffd>,
    user: Mapping,
    _src: Mapping,
    stage: Mapping,
    _memfd: Option<Memfd>,
    _alias: Option<Mapping>,
}

impl std::fmt::Debug for FloorLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FloorLoop")
            .field("pages", &self.pages)
            .field("shared", &(self.target.alias != 0))
            .field("handler_threads", &self.handlers.as_ref().map(|h| h.threads.len()))
            .finish()
    }
}

fn sys(op: &'static str) -> impl Fn(i32) -> Error {
    move |e| Error::sys(op, e)
}

/// Sets every byte of page `i` of the `pages`-page range at `base` to its
/// pattern.
fn fill(base: usize, pages: usize) {
    for i in 0..pages {
        // SAFETY: `base` is a fresh writable mapping of `pages` pages that
        // nothing else references yet.
        unsafe {
            std::ptr::write_bytes((base + i * PAGE_SIZE) as *mut u8, super::pattern(i), PAGE_SIZE)
        };
    }
}

impl FloorLoop {
    /// Sets up `pages` pages of `kind`, served by `delivery` (in-thread, or
    /// `threads` handler threads spinning `spin_us` before blocking).
    pub fn new(pages: usize, kind: InstallKind, delivery: Delivery) -> Result<FloorLoop> {
        if pages == 0 {
            return Err(Error::ZeroLength);
        }
        let len = pages
            .checked_mul(PAGE_SIZE)
            .ok_or_else(|| Error::Config(format!("{pages} pages is too large")))?;
        let shared = kind == InstallKind::Shared;
        let (nthreads, spin_us) = match delivery {
            Delivery::InThread => (0, 0),
            Delivery::Threads { threads: 0, .. } => {
                return Err(Error::Config("handler threads must be at least 1".into()))
            }
            Delivery::Threads { threads, spin_us } => (threads, spin_us),
        };
        let mut features = if shared { feature::MINOR_SHMEM } else { 0 };
        if nthreads == 0 {
            settle_engine_handler();
            features |= feature::SIGBUS;
        }
        let open = |umo: bool| Uffd::open(features, umo, nthreads > 0);
        let uffd = if nthreads == 0 {
            open(true)
        } else {
            open(false).or_else(|_| open(true))
        }
        .map_err(|e| Error::Unsupported(format!("userfaultfd: {e}")))?;
        let uffd = Arc::new(uffd);

        let src = Mapping::anonymous(len).map_err(sys("mmap source"))?;
        fill(src.addr(), pages);
        let stage = Mapping::anonymous(nthreads.max(1) * PAGE_SIZE).map_err(sys("mmap stage"))?;
        // SAFETY: a fresh private mapping of that many bytes; touching it
        // now keeps first-touch allocation out of the timed faults.
        unsafe { std::ptr::write_bytes(stage.addr() as *mut u8, 0, stage.len()) };
        let (memfd, alias, user) = if shared {
            let memfd = Memfd::new("uffd-pager-floor", len).map_err(sys("memfd_create"))?;
            let alias = Mapping::shared(memfd.fd(), len, 0, false).map_err(sys("mmap alias"))?;
            fill(alias.addr(), pages);
            let user = Mapping::shared(memfd.fd(), len, 0, false).map_err(sys("mmap memfd"))?;
            (Some(memfd), Some(alias), user)
        } else {
            let user = Mapping::anonymous(len).map_err(sys("mmap"))?;
            (None, None, user)
        };
        let reg_mode = if shared {
            mode::MINOR | mode::MISSING
        } else {
            mode::MISSING
        };
        uffd.register(user.addr(), len, reg_mode)
            .map_err(sys("UFFDIO_REGISTER"))?;
        let target = Target {
            base: user.addr(),
            len,
            src: src.addr(),
            alias: alias.as_ref().map_or(0, |a| a.addr()),
        };
        let handlers = if nthreads > 0 {
            Some(Self::start(&uffd, target, &stage, nthreads, spin_us)?)
        } else {
            None
        };
        Ok(FloorLoop {
            pages,
            target,
            handlers,
            uffd,
            user,
            _src: src,
            stage,
            _memfd: memfd,
            _alias: alias,
        })
    }

    fn start(
        uffd: &Arc<Uffd>,
        target: Target,
        stage: &Mapping,
        n: usize,
        spin_us: u32,
    ) -> Result<Handlers> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::sys("eventfd", crate::sys::errno()));
        }
        // SAFETY: a fresh descriptor that we now own.
        let stop = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut h = Handlers {
            stop,
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let uffd = uffd.clone();
            let stopfd = h.stop.as_raw_fd();
            let page = stage.addr() + i * PAGE_SIZE;
            let t = std::thread::Builder::new()
                .name(format!("uffd-floor-{i}"))
                .spawn(move || serve(&uffd, target, stopfd, spin_us, page))
                .map_err(|e| Error::Io {
                    context: "starting floor handler threads".into(),
                    source: e,
                })?;
            h.threads.push(t);
        }
        Ok(h)
    }

    /// Pages per full pass.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// One pass over the first `n` pages (at most [`FloorLoop::pages`]):
    /// makes them absent (untimed), then touches each once. Returns the
    /// time of the touches alone.
    pub fn pass(&mut self, n: usize) -> Result<Duration> {
        let n = n.min(self.pages);
        madvise(self.user.addr(), n * PAGE_SIZE, libc::MADV_DONTNEED)
            .map_err(sys("madvise(MADV_DONTNEED)"))?;
        if self.handlers.is_some() {
            return touch(self.user.addr(), n);
        }
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let _installed = Installed::new(&self.uffd, &self.target, self.stage.addr())?;
        touch(self.user.addr(), n)
    }
}

impl Drop for FloorLoop {
    fn drop(&mut self) {
        // Join the handler threads before the descriptor and mappings go.
        self.handlers.take();
    }
}
