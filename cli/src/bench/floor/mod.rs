//! The raw floor loop: the userfaultfd ioctls a pager cannot avoid, driven
//! by the smallest handler that works, with no engine in between.
//!
//! Each fault does exactly what the engine must do for a page that comes
//! from a store, and nothing else:
//!
//! - **Anonymous**: a private anonymous range registered MISSING. Each fault
//!   is one UFFDIO_COPY of its page's 4 KiB straight from the source buffer
//!   (the kernel allocates the page, copies and wakes): the least any
//!   handler can do for a page that comes from elsewhere. (The engine reads
//!   a read-only region's page from its store into a buffer and copies it
//!   in the same way; a writable region's page is read into the cache area
//!   and moved into place.)
//! - **Shared**: a memfd mapping registered MINOR|MISSING. Each pass starts
//!   with the memfd's pages punched out (absent from the page cache, as the
//!   engine's are) and the user mapping's page-table entries dropped. Each
//!   fault `pwrite`s 4 KiB from the source into the memfd
//!   (allocating the page) and UFFDIO_CONTINUE maps it (and wakes).
//!
//! With 2 MiB pages (`page_size` [`HUGE_PAGE_SIZE`]) both kinds sit on
//! the kernel's hugetlb pool: the anonymous range is `MAP_HUGETLB` and
//! each fault one `UFFDIO_COPY` of 2 MiB; the shared range is a hugetlbfs
//! memfd, which has no `write(2)`, so each fault copies its 2 MiB into the
//! memfd through a second (unregistered) mapping of it, then one
//! `UFFDIO_CONTINUE` of 2 MiB maps it.
//!
//! One page per ioctl, one ioctl per fault: the same granularity as the
//! engine. Delivery is either in-thread (a SIGBUS handler of the floor's
//! own, installed only for the duration of a pass, see the module docs of
//! [`crate::bench`]) or handler threads that block in poll(2), read fault
//! messages and resolve exactly one page per message, optionally spinning
//! first as the engine's pool does. The install ioctl wakes the faulter
//! itself (no DONTWAKE + UFFDIO_WAKE pair, as the engine uses).
//!
//! A failed install leaves the faulting thread with no way forward, so the
//! floor reports it on stderr and aborts the process.

mod hop;
pub(crate) mod sigbus;
mod threads;

use super::touch;
use crate::io_error as sys;
use crate::os::mem::{self, Memfd};
use crate::os::uffd::{feature, RegisterMode, Uffd};
use memmap2::{MmapMut, UncheckedAdvice};
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;
use threads::Handlers;
use uffd_pager::{Delivery, Error, HugePagePool, InstallKind, Result, HUGE_PAGE_SIZE, PAGE_SIZE};

/// The addresses a fault is resolved with. Plain integers, so that the
/// signal handler can rebuild it from atomics.
#[derive(Debug, Clone, Copy)]
struct Target {
    /// The registered user range.
    base: usize,
    len: usize,
    /// The source buffer (same layout as the user range).
    src: usize,
    /// The memfd of a shared range; -1 for anonymous ones.
    memfd: i32,
    /// A second mapping of a huge memfd (filled through it: hugetlbfs has
    /// no `write`), or 0.
    alias: usize,
    /// The page size: [`PAGE_SIZE`] or [`HUGE_PAGE_SIZE`].
    page: usize,
    /// A [`hop::Hop`] that copies each page on a worker first, or 0.
    hop: usize,
}

/// Resolves the fault at `addr` (inside `t`) with one page-sized install
/// that also wakes.
/// Async-signal-safe: a memcpy and ioctls.
fn resolve(uffd: &Uffd, t: &Target, addr: usize) -> std::result::Result<(), i32> {
    let size = t.page;
    let page = addr & !(size - 1);
    let off = page.wrapping_sub(t.base);
    if off >= t.len {
        return Err(libc::EFAULT);
    }
    let src = if t.hop != 0 {
        // SAFETY: a non-zero `hop` points to the loop's `HopWorker`'s
        // state, which outlives every pass.
        unsafe { &*(t.hop as *const hop::Hop) }.fetch(t.src + off)
    } else {
        t.src + off
    };
    if t.alias != 0 {
        // SAFETY: `src + off` starts a page of the live source buffer and
        // `alias + off` the same page of the memfd's second mapping, both
        // `t.len` long with `off < t.len` page-aligned; the page is absent
        // from the user mapping, so nothing else touches it meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, (t.alias + off) as *mut u8, size)
        };
    } else if t.memfd >= 0 {
        // SAFETY: `src` is a page of the live source buffer (same length
        // as the user range, and `off < t.len` was checked) or of the hop's
        // buffer, which nothing writes while the floor reads it.
        let page_src = unsafe { std::slice::from_raw_parts(src as *const u8, size) };
        // SAFETY: `t.memfd` is the floor's memfd, open as long as the
        // `FloorLoop` whose faults are being resolved.
        let memfd = unsafe { BorrowedFd::borrow_raw(t.memfd) };
        mem::pwrite_all(memfd, page_src, off as u64).map_err(|e| e as i32)?;
    }
    loop {
        let r = if t.memfd >= 0 {
            uffd.cont(page, size).map(drop)
        } else {
            // SAFETY: the source page is readable (as above), and the user
            // page is only ever read through raw pointers by the touch loop.
            unsafe { uffd.copy(page, src, size) }.map(drop)
        };
        match r {
            Ok(()) | Err(libc::EEXIST) => return Ok(()),
            Err(libc::EAGAIN) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes `msg` to stderr and aborts; async-signal-safe.
pub(super) fn fatal(msg: &[u8]) -> ! {
    // SAFETY: write(2) from a live buffer and abort(3) are async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::abort()
    }
}

/// The raw floor loop for one install kind and delivery mode. See the
/// module docs.
pub struct FloorLoop {
    pages: usize,
    page_size: usize,
    target: Target,
    handlers: Option<Handlers>,
    uffd: Arc<Uffd>,
    user: MmapMut,
    _src: MmapMut,
    _memfd: Option<Memfd>,
    _alias: Option<MmapMut>,
    _hop: Option<hop::HopWorker>,
}

impl std::fmt::Debug for FloorLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FloorLoop")
            .field("pages", &self.pages)
            .field("shared", &(self.target.memfd >= 0))
            .field(
                "handler_threads",
                &self.handlers.as_ref().map(|h| h.threads.len()),
            )
            .finish()
    }
}

fn sys_errno(op: &'static str) -> impl Fn(nix::errno::Errno) -> Error {
    move |e| crate::sys_error(op, e as i32)
}

/// Sets every byte of page `i` (of `page_size` bytes) of the `pages`-page
/// range at `base` to its pattern.
fn fill(base: usize, pages: usize, page_size: usize) {
    for i in 0..pages {
        // SAFETY: `base` is a fresh writable mapping of `pages` pages that
        // nothing else references yet.
        unsafe {
            std::ptr::write_bytes(
                (base + i * page_size) as *mut u8,
                super::pattern(i),
                page_size,
            )
        };
    }
}

impl FloorLoop {
    /// Sets up `pages` pages of `kind` and of `page_size` ([`PAGE_SIZE`]
    /// or [`HUGE_PAGE_SIZE`], which takes `pages` pages from the hugetlb
    /// pool while a pass's pages are in), served by `delivery`
    /// (in-thread, or `threads` handler threads spinning `spin_us` before
    /// blocking).
    pub fn new(
        pages: usize,
        kind: InstallKind,
        delivery: Delivery,
        page_size: usize,
    ) -> Result<FloorLoop> {
        Self::build(pages, kind, delivery, false, page_size)
    }

    /// [`FloorLoop::new`] whose every page is first copied on a worker
    /// thread, handed over and back by a raw futex ping-pong (see
    /// `floor/hop.rs`): the floor of the engine's I/O-worker hop. One
    /// faulter at a time: in-thread delivery or one handler thread.
    /// 4 KiB pages only.
    pub fn with_hop(pages: usize, kind: InstallKind, delivery: Delivery) -> Result<FloorLoop> {
        Self::build(pages, kind, delivery, true, PAGE_SIZE)
    }

    fn build(
        pages: usize,
        kind: InstallKind,
        delivery: Delivery,
        hop: bool,
        page_size: usize,
    ) -> Result<FloorLoop> {
        let huge = match page_size {
            PAGE_SIZE => false,
            HUGE_PAGE_SIZE if !hop => true,
            HUGE_PAGE_SIZE => {
                return Err(Error::Config(
                    "the hop floor copies 4 KiB pages only".into(),
                ))
            }
            other => return Err(Error::PageSize(other)),
        };
        if hop
            && !matches!(
                delivery,
                Delivery::InThread | Delivery::Threads { threads: 1, .. }
            )
        {
            return Err(Error::Config(
                "the hop floor serves one faulter at a time: in-thread or threads:1".into(),
            ));
        }
        if pages == 0 {
            return Err(Error::ZeroLength);
        }
        let len = pages
            .checked_mul(page_size)
            .ok_or_else(|| Error::Config(format!("{pages} pages is too large")))?;
        let shared = kind == InstallKind::Shared;
        if huge {
            HugePagePool::require(pages as u64)?;
        }
        let (nthreads, spin_us) = match delivery {
            Delivery::InThread => (0, 0),
            Delivery::Threads { threads: 0, .. } => {
                return Err(Error::Config("handler threads must be at least 1".into()))
            }
            Delivery::Threads { threads, spin_us } => (threads, spin_us),
            Delivery::PerRegion => {
                return Err(Error::Config(
                    "the floor loop has one range: per-region delivery is `bench wakeup`'s".into(),
                ))
            }
        };
        let mut features = if shared && huge {
            feature::MINOR_HUGETLBFS
        } else if shared {
            feature::MINOR_SHMEM
        } else {
            feature::MOVE
        };
        if nthreads == 0 {
            sigbus::settle_engine_handler();
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

        let src = mem::anonymous(len).map_err(sys("mmap source"))?;
        fill(src.as_ptr() as usize, pages, page_size);
        let (memfd, user, alias) = if shared {
            let memfd =
                Memfd::sized(c"uffd-pager-floor", len, page_size).map_err(sys("memfd_create"))?;
            let user = memfd.map_shared(len).map_err(sys("mmap memfd"))?;
            let alias = if huge {
                Some(memfd.map_shared(len).map_err(sys("mmap memfd"))?)
            } else {
                None
            };
            (Some(memfd), user, alias)
        } else {
            let user = mem::anonymous_sized(len, page_size).map_err(sys("mmap"))?;
            (None, user, None)
        };
        let reg_mode = if shared {
            RegisterMode::MINOR | RegisterMode::MISSING
        } else {
            RegisterMode::MISSING
        };
        uffd.register(user.as_ptr() as usize, len, reg_mode)
            .map_err(|e| crate::sys_error("UFFDIO_REGISTER", e))?;
        let hop = if hop {
            Some(hop::HopWorker::start().map_err(|e| Error::Io {
                context: "starting the hop floor's worker".into(),
                source: e,
            })?)
        } else {
            None
        };
        let target = Target {
            base: user.as_ptr() as usize,
            len,
            src: src.as_ptr() as usize,
            memfd: memfd.as_ref().map_or(-1, |m| m.fd()),
            alias: alias.as_ref().map_or(0, |a| a.as_ptr() as usize),
            page: page_size,
            hop: hop.as_ref().map_or(0, |h| Arc::as_ptr(&h.hop) as usize),
        };
        let handlers = if nthreads > 0 {
            Some(Handlers::start(&uffd, target, nthreads, spin_us)?)
        } else {
            None
        };
        Ok(FloorLoop {
            pages,
            page_size,
            target,
            handlers,
            uffd,
            user,
            _src: src,
            _memfd: memfd,
            _alias: alias,
            _hop: hop,
        })
    }

    /// Pages per full pass.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Makes the first `n` pages absent again (user mapping and, for a
    /// shared range, the memfd), so that the next touches fault.
    pub fn reset(&mut self, n: usize) -> Result<()> {
        let n = n.min(self.pages);
        // SAFETY: the user range is only ever read through raw pointers
        // (the touch loops), and no pass is running (`&mut self`).
        unsafe {
            self.user
                .unchecked_advise_range(UncheckedAdvice::DontNeed, 0, n * self.page_size)
        }
        .map_err(sys("madvise(MADV_DONTNEED)"))?;
        if let Some(m) = &self._memfd {
            m.punch_hole(0, n * self.page_size)
                .map_err(sys_errno("fallocate(PUNCH_HOLE)"))?;
        }
        Ok(())
    }

    /// Touches pages `first..first + n` once each from the calling thread
    /// (served by this loop's handler threads; in-thread loops use
    /// [`FloorLoop::pass`]). Returns the time of the touches.
    pub fn touch_slice(&self, first: usize, n: usize) -> Result<Duration> {
        if self.handlers.is_none() {
            return Err(Error::Config(
                "touch_slice needs handler-thread delivery".into(),
            ));
        }
        let n = n.min(self.pages.saturating_sub(first));
        super::touch_from(self.user.as_ptr() as usize, first, n, self.page_size)
    }

    /// One pass over the first `n` pages (at most [`FloorLoop::pages`]):
    /// makes them absent (untimed), then touches each once. Returns the
    /// time of the touches alone.
    pub fn pass(&mut self, n: usize) -> Result<Duration> {
        let n = n.min(self.pages);
        self.reset(n)?;
        let size = self.page_size;
        if self.handlers.is_some() {
            return touch(self.user.as_ptr() as usize, n, size);
        }
        let base = self.user.as_ptr() as usize;
        sigbus::with_handler(&self.uffd, &self.target, || touch(base, n, size))
    }
}

impl Drop for FloorLoop {
    fn drop(&mut self) {
        // Join the handler threads before the descriptor and mappings go.
        self.handlers.take();
    }
}
