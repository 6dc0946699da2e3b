//! The raw floor for `random`: the same reads over the same kind of file,
//! served by the smallest in-thread handler that keeps the same budget.
//!
//! The file (4 × `budget` pages of [`crate::workload::common::pattern`]) is
//! mapped through a memfd registered MINOR|MISSING, as the engine maps a
//! shared region. Each fault, in the faulting thread's SIGBUS handler:
//!
//! 1. takes the next slot of a ring of `budget` resident pages and, if the
//!    slot held a page, punches that page out of the memfd (which also
//!    unmaps it from the user mapping): FIFO eviction, one page per fault;
//! 2. fills the faulting page of the memfd from the file with the store's
//!    [`Store::read_to_fd`], as the engine does (for a file on tmpfs one
//!    `pwrite` from the store's view of the file);
//! 3. maps it with one `UFFDIO_CONTINUE`, which also wakes.
//!
//! The kernel-mapped variant (the engine's `MapOptions::kernel_maps`)
//! registers the memfd's mapping MISSING only: it queues its victims for
//! one `process_madvise(MADV_DONTNEED)` per 32 (the kernel mapped them
//! clean, so the batch costs one TLB flush) and punches them out of the
//! memfd after the zap; it fills the page through a pipe (`PipePool`: the
//! kernel maps what the memfd holds, so no page may be seen half written)
//! and returns, and the access, run again, is mapped by the kernel.
//!
//! The anonymous variant maps a private anonymous area registered MISSING,
//! queues its victims for one `process_madvise(MADV_DONTNEED)` per 32, and
//! installs with one `UFFDIO_COPY`, from the file's page where the store
//! has it in memory ([`Store::page_in_memory`]: a file on tmpfs), as the
//! engine's clean anonymous path does, or else from a stack buffer it read
//! the page into.
//!
//! No lookup, no locks, no page states, no LRU, no fault-around, no
//! readahead: what is left is what the kernel charges a userspace pager for
//! a miss under a budget. Two faulting threads may race on one page (both
//! fill it; one install wins with `EEXIST`) or evict a page between
//! another's fill and install (that install fails and the thread simply
//! faults again); both are rare and cost only time.

use super::floor::fatal;
use super::floor::sigbus::with_raw_handler;
use crate::os::mem::{self, Memfd};
use crate::os::signal::{chain, ErrnoGuard};
use crate::os::uffd::{feature, RegisterMode, Uffd};
use crate::workload::pattern_file::{PatternFile, RandomWords};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::time::{Duration, Instant};
use uffd_pager::store::{FileStore, Store};
use uffd_pager::{Error, InstallKind, PipePool, Result, PAGE_SIZE};

const EMPTY: usize = usize::MAX;

/// One page-aligned page on the stack (the handler cannot allocate).
#[repr(C, align(4096))]
struct PageBuf([u8; PAGE_SIZE]);

/// The handler's state: plain integers and pointers behind atomics, set
/// before a pass and cleared after it.
struct State {
    base: AtomicUsize,
    len: AtomicUsize,
    uffd: AtomicUsize,
    file_fd: AtomicUsize,
    memfd: AtomicUsize,
    ring: AtomicUsize,
    ring_len: AtomicUsize,
    head: AtomicUsize,
    faults: AtomicU64,
    /// [`SHARED`], [`ANON`] or [`KERNEL_MAPS`]: the variant (see
    /// [`random_floor`]).
    variant: AtomicUsize,
    /// The store over the file (a `*const FileStore`).
    store: AtomicUsize,
    /// The kernel-mapped variant's pipes (a `*const PipePool`).
    pipes: AtomicUsize,
}

static ST: State = State {
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    uffd: AtomicUsize::new(0),
    file_fd: AtomicUsize::new(0),
    memfd: AtomicUsize::new(0),
    ring: AtomicUsize::new(0),
    ring_len: AtomicUsize::new(0),
    head: AtomicUsize::new(0),
    faults: AtomicU64::new(0),
    variant: AtomicUsize::new(SHARED),
    store: AtomicUsize::new(0),
    pipes: AtomicUsize::new(0),
};

const SHARED: usize = 0;
const ANON: usize = 1;
const KERNEL_MAPS: usize = 2;

/// Victims a thread of the anonymous or kernel-mapped variant collects before it zaps them
/// with one `process_madvise`.
const ZAP_BATCH: usize = 32;

thread_local! {
    /// The anonymous variant's victims waiting for their batched zap (user
    /// addresses), per faulting thread. Const-initialised plain cells: no
    /// lazy allocation, so usable in the signal handler.
    static PENDING: (std::cell::Cell<usize>, std::cell::Cell<[usize; ZAP_BATCH]>) =
        const { (std::cell::Cell::new(0), std::cell::Cell::new([0; ZAP_BATCH])) };
}

/// What [`random_floor`] measured.
#[derive(Debug, Clone, Copy)]
pub struct RandomFloorReport {
    /// Page reads done (all threads).
    pub reads: u64,
    /// Faults served.
    pub faults: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Words that differed from the pattern (0 unless the floor is broken).
    pub mismatches: u64,
}

impl RandomFloorReport {
    /// Wall time per page read per thread, µs (the workload's
    /// `us_per_page`).
    pub fn us_per_page(&self, threads: usize) -> f64 {
        self.elapsed.as_secs_f64() * threads.max(1) as f64 / self.reads.max(1) as f64 * 1e6
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let _errno = ErrnoGuard::save();
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    let (base, len) = (ST.base.load(Acquire), ST.len.load(Acquire));
    if code <= 0 || base == 0 || addr.wrapping_sub(base) >= len {
        chain(sig, info, uctx);
        return;
    }
    ST.faults.fetch_add(1, Relaxed);
    let off = (addr - base) & !(PAGE_SIZE - 1);
    let memfd = ST.memfd.load(Acquire) as i32;
    // 1. Evict the oldest resident page.
    let ring = ST.ring.load(Acquire) as *const AtomicUsize;
    let slot = ST.head.fetch_add(1, Relaxed) % ST.ring_len.load(Acquire);
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

/// Runs the raw floor of `random`: `threads` threads reading for
/// `duration` over a file of `4 × budget` pages created in `dir`, with at
/// most `budget` pages resident.
pub fn random_floor(
    dir: &Path,
    budget: usize,
    threads: usize,
    duration: Duration,
    seed: u64,
    kind: InstallKind,
    kernel_maps: bool,
) -> Result<RandomFloorReport> {
    if budget == 0 || threads == 0 {
        return Err(Error::Config(
            "the random floor needs a budget and at least one thread".into(),
        ));
    }
    let pages = 4 * budget;
    let len = pages * PAGE_SIZE;
    let file = PatternFile::create(dir, "random-floor", pages)?;
    let store = file.store()?;
    let io = crate::io_error;
    let memfd = Memfd::new(c"uffd-pager-random-floor", len).map_err(io("memfd_create"))?;
    let anon = kind == InstallKind::Anonymous;
    let user = if anon {
        mem::anonymous(len).map_err(io("mmap"))?
    } else {
        memfd.map_shared(len).map_err(io("mmap memfd"))?
    };
    let user_base = user.as_ptr() as usize;
    let kernel_maps = kernel_maps && !anon;
    let (features, reg) = if anon || kernel_maps {
        (feature::SIGBUS, RegisterMode::MISSING)
    } else {
        (
            feature::MINOR_SHMEM | feature::SIGBUS,
            RegisterMode::MINOR | RegisterMode::MISSING,
        )
    };
    let uffd = Uffd::open(features, true, false)
        .map_err(|e| Error::Unsupported(format!("userfaultfd: {e}")))?;
    uffd.register(user_base, len, reg)
        .map_err(|e| crate::sys_error("UFFDIO_REGISTER", e))?;
    let ring: Vec<AtomicUsize> = (0..budget).map(|_| AtomicUsize::new(EMPTY)).collect();
    let mismatches = AtomicU64::new(0);
    let pipes = PipePool::default();
    with_raw_handler(on_sigbus, || {
        ST.pipes.store(&pipes as *const PipePool as usize, Release);
        ST.uffd.store(&uffd as *const Uffd as usize, Release);
        ST.file_fd.store(file.file().as_raw_fd() as usize, Release);
        ST.memfd.store(memfd.fd() as usize, Release);
        ST.ring.store(ring.as_ptr() as usize, Release);
        ST.ring_len.store(ring.len(), Release);
        ST.head.store(0, Release);
        ST.faults.store(0, Release);
        let variant = match (anon, kernel_maps) {
            (true, _) => ANON,
            (false, true) => KERNEL_MAPS,
            (false, false) => SHARED,
        };
        ST.variant.store(variant, Release);
        ST.store.store(&store as *const FileStore as usize, Release);
        ST.len.store(len, Release);
        ST.base.store(user_base, Release);
        let t0 = Instant::now();
        // SAFETY: `user` maps `pages` pages and outlives the call.
        let reads = unsafe {
            RandomWords {
                pages,
                threads,
                seed,
                deadline: t0 + duration,
                write_pct: 0,
            }
            .run(user_base, &mismatches, None)
        };
        let elapsed = t0.elapsed();
        ST.base.store(0, Release);
        ST.len.store(0, Release);
        Ok(RandomFloorReport {
            // (A thread that could not start is an error only now, after the
            // handler's state is cleared.)
            reads: reads?,
            faults: ST.faults.load(Acquire),
            elapsed,
            mismatches: mismatches.load(Relaxed),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_reads_the_file_correctly_under_its_budget() {
        let dir = crate::workload::pattern_file::default_dir();
        for (kind, km) in [
            (InstallKind::Shared, false),
            (InstallKind::Shared, true),
            (InstallKind::Anonymous, false),
        ] {
            let r = random_floor(&dir, 64, 2, Duration::from_millis(200), 3, kind, km).unwrap();
            assert_eq!(r.mismatches, 0);
            assert!(r.reads > 0);
            // A quarter of the file fits: most reads must have faulted.
            assert!(r.faults > r.reads / 4, "{r:?}");
        }
    }
}
