//! The floor's SIGBUS handler: what it does per fault (see the parent
//! module) and the state it reads, plain integers and pointers behind
//! atomics that [`super::RandomFloor::run`] sets before a run and clears
//! after it. Everything here runs in the signal handler: no allocation,
//! no locks, errno kept.

use crate::bench::floor::fatal;
use crate::os::mem;
use crate::os::signal::{chain, ErrnoGuard};
use crate::os::uffd::Uffd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use uffd_pager::store::{FileStore, Store};
use uffd_pager::{PipePool, PAGE_SIZE};

pub(super) const EMPTY: usize = usize::MAX;

/// One page-aligned page on the stack (the handler cannot allocate).
#[repr(C, align(4096))]
pub(super) struct PageBuf([u8; PAGE_SIZE]);

/// The handler's state: plain integers and pointers behind atomics, set
/// before a pass and cleared after it. What every fault writes is on a
/// cache line of its own ([`Hot`]): beside the rest, each fault's first
/// read of the settings missed in cache after the other thread's write.
pub(super) struct State {
    pub(super) hot: Hot,
    pub(super) base: AtomicUsize,
    pub(super) len: AtomicUsize,
    pub(super) uffd: AtomicUsize,
    pub(super) file_fd: AtomicUsize,
    pub(super) memfd: AtomicUsize,
    pub(super) ring: AtomicUsize,
    pub(super) ring_len: AtomicUsize,
    /// [`SHARED`], [`ANON`] or [`KERNEL_MAPS`]: the variant (see
    /// [`super::RandomFloor`]).
    pub(super) variant: AtomicUsize,
    /// The store over the file (a `*const FileStore`).
    pub(super) store: AtomicUsize,
    /// The kernel-mapped variant's pipes (a `*const PipePool`).
    pub(super) pipes: AtomicUsize,
}

/// The two words every fault writes: the ring's head and the fault count.
#[repr(align(64))]
pub(super) struct Hot {
    pub(super) head: AtomicUsize,
    pub(super) faults: AtomicU64,
}

pub(super) static ST: State = State {
    hot: Hot {
        head: AtomicUsize::new(0),
        faults: AtomicU64::new(0),
    },
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    uffd: AtomicUsize::new(0),
    file_fd: AtomicUsize::new(0),
    memfd: AtomicUsize::new(0),
    ring: AtomicUsize::new(0),
    ring_len: AtomicUsize::new(0),
    variant: AtomicUsize::new(SHARED),
    store: AtomicUsize::new(0),
    pipes: AtomicUsize::new(0),
};

/// Ring slots per cache line.
const PER_LINE: usize = 64 / std::mem::size_of::<AtomicUsize>();

/// The ring slot of the `h`th fault: FIFO over a ring of `len` slots
/// (fault `h + len` reuses the slot of fault `h`), but consecutive faults
/// get slots [`PER_LINE`] apart where `len` is a multiple of it and at
/// least two lines long (so on different cache lines of the ring, whose
/// first line may start anywhere in one); in plain order two threads
/// faulting in turn wrote the same line.
pub(super) fn ring_slot(h: usize, len: usize) -> usize {
    if !len.is_multiple_of(PER_LINE) {
        return h % len;
    }
    let lines = len / PER_LINE;
    (h % lines) * PER_LINE + (h / lines) % PER_LINE
}

pub(super) const SHARED: usize = 0;
pub(super) const ANON: usize = 1;
pub(super) const KERNEL_MAPS: usize = 2;

/// Victims a thread of the anonymous or kernel-mapped variant collects before it zaps them
/// with one `process_madvise`.
const ZAP_BATCH: usize = 32;

thread_local! {
    /// The anonymous and kernel-mapped variants' victims waiting for their
    /// batched zap (offsets in the user mapping), per faulting thread. Const-initialised plain cells: no
    /// lazy allocation, so usable in the signal handler.
    static PENDING: (std::cell::Cell<usize>, std::cell::Cell<[usize; ZAP_BATCH]>) =
        const { (std::cell::Cell::new(0), std::cell::Cell::new([0; ZAP_BATCH])) };
}

pub(super) extern "C" fn on_sigbus(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) {
    let _errno = ErrnoGuard::save();
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    let (base, len) = (ST.base.load(Acquire), ST.len.load(Acquire));
    if code <= 0 || base == 0 || addr.wrapping_sub(base) >= len {
        chain(sig, info, uctx);
        return;
    }
    ST.hot.faults.fetch_add(1, Relaxed);
    let off = (addr - base) & !(PAGE_SIZE - 1);
    let memfd = ST.memfd.load(Acquire) as i32;
    // 1. Evict the oldest resident page.
    let ring = ST.ring.load(Acquire) as *const AtomicUsize;
    let slot = ring_slot(ST.hot.head.fetch_add(1, Relaxed), ST.ring_len.load(Acquire));
    // SAFETY: `ring` points to `ring_len` atomics that outlive the pass.
    let victim = unsafe { &*ring.add(slot) }.swap(off, AcqRel);
    let variant = ST.variant.load(Acquire);
    if variant == ANON {
        if victim != EMPTY {
            zap_later(base, victim, None);
        }
        anon_fill_and_copy(base, off);
        return;
    }
    if variant == KERNEL_MAPS {
        if victim != EMPTY {
            zap_later(base, victim, Some(memfd));
        }
    } else if victim != EMPTY {
        // The floor's memfd, open for the pass.
        let _ = mem::punch_hole(memfd, victim, PAGE_SIZE);
    }
    // 2. Fill it from the file, as the engine fills its memfd: the
    // kernel-mapped variant through a pipe (see `PipePool`), since the
    // kernel maps what the memfd holds.
    // SAFETY: the store outlives the pass (set before, cleared after).
    let store = unsafe { &*(ST.store.load(Acquire) as *const FileStore) };
    let filled = if variant == KERNEL_MAPS {
        // SAFETY: the pool outlives the pass (set before, cleared after).
        let pipes = unsafe { &*(ST.pipes.load(Acquire) as *const PipePool) };
        let mut buf = None;
        let src = match store.page_in_memory(off as u64) {
            Some(src) => src as *const u8,
            None => buf.insert(read_file_page(off)).0.as_ptr(),
        };
        // SAFETY: `src` is the store's mapped page (the kernel reads it or
        // reports EFAULT) or `buf`, a page on this stack.
        unsafe { pipes.write_at(memfd, src, PAGE_SIZE, off as u64) }.is_ok()
    } else {
        // SAFETY: `memfd` is the pass's memfd, which the pass's caller
        // holds open until the handler is taken down.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(memfd) };
        store
            .read_to_fd(off as u64, PAGE_SIZE, fd, off as u64)
            .is_ok()
    };
    if !filled {
        fatal(b"uffd-pager random floor: filling a page failed\n");
    }
    // 3. Map it (the kernel does, when the access runs again).
    if variant == KERNEL_MAPS {
        return;
    }
    // SAFETY: the descriptor outlives the pass (set before, cleared after).
    let uffd = unsafe { &*(ST.uffd.load(Acquire) as *const Uffd) };
    loop {
        match uffd.cont(base + off, PAGE_SIZE) {
            Err(libc::EAGAIN) => continue,
            // EEXIST: another thread installed it; EFAULT/ENOENT: another
            // thread evicted it before our install, so we fault again.
            Ok(_) | Err(libc::EEXIST) | Err(libc::EFAULT) | Err(libc::ENOENT) => return,
            Err(_) => fatal(b"uffd-pager random floor: UFFDIO_CONTINUE failed\n"),
        }
    }
}

/// Reads the file's page at `off` into a buffer on the stack; aborts on a
/// short read (the floor has no way forward).
fn read_file_page(off: usize) -> PageBuf {
    let mut buf = PageBuf([0; PAGE_SIZE]);
    let file_fd = ST.file_fd.load(Acquire) as i32;
    // SAFETY: `buf` is a live page-sized buffer; the descriptor is open.
    let n = unsafe {
        libc::pread(
            file_fd,
            buf.0.as_mut_ptr().cast(),
            PAGE_SIZE,
            off as libc::off_t,
        )
    };
    if n != PAGE_SIZE as isize {
        fatal(b"uffd-pager random floor: reading a page failed\n");
    }
    buf
}

/// The batched eviction of the anonymous and kernel-mapped variants: queue
/// the victim (its offset in the mapping at `base`) and zap the queue with
/// one `process_madvise(MADV_DONTNEED)` when it is full (anonymous PTEs,
/// and file PTEs the kernel mapped clean, need no flush of their own, so
/// the batch costs one TLB flush); then, with a `memfd`, punch each
/// victim out of it.
fn zap_later(base: usize, victim: usize, memfd: Option<i32>) {
    PENDING.with(|(n, q)| {
        let mut a = q.get();
        a[n.get()] = victim;
        n.set(n.get() + 1);
        if n.get() == ZAP_BATCH {
            let mut ranges = [(0usize, 0usize); ZAP_BATCH];
            for (r, &v) in ranges.iter_mut().zip(&a) {
                *r = (base + v, PAGE_SIZE);
            }
            // SAFETY: the victims are pages of the floor's user mapping,
            // which the readers only read through raw pointers (a zapped
            // page faults again and is refilled).
            let _ = unsafe { mem::dontneed_batch(&ranges) };
            if let Some(fd) = memfd {
                for &v in &a {
                    let _ = mem::punch_hole(fd, v, PAGE_SIZE);
                }
            }
            n.set(0);
        }
        q.set(a);
    });
}

/// The anonymous variant's install: `UFFDIO_COPY` the page into place
/// (which allocates it) from the store's page in memory, or else from a
/// stack buffer the page is read into.
fn anon_fill_and_copy(base: usize, off: usize) {
    // SAFETY: the store outlives the pass (set before, cleared after).
    let store = unsafe { &*(ST.store.load(Acquire) as *const FileStore) };
    let mut buf = None;
    let src = match store.page_in_memory(off as u64) {
        Some(src) => src,
        None => buf.insert(read_file_page(off)).0.as_ptr() as usize,
    };
    // SAFETY: the descriptor outlives the pass (set before, cleared after).
    let uffd = unsafe { &*(ST.uffd.load(Acquire) as *const Uffd) };
    loop {
        // SAFETY: `src` is the store's mapped page or `buf`, both readable
        // for a page; the user page is only read through raw pointers.
        match unsafe { uffd.copy(base + off, src, PAGE_SIZE) } {
            Err(libc::EAGAIN) => continue,
            Ok(_) | Err(libc::EEXIST) => return,
            Err(_) => fatal(b"uffd-pager random floor: UFFDIO_COPY failed\n"),
        }
    }
}
