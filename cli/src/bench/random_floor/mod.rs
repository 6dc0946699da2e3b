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

mod handler;

use super::floor::sigbus::with_raw_handler;
use crate::os::mem::{self, Memfd};
use crate::os::uffd::{feature, RegisterMode, Uffd};
use crate::workload::pattern_file::{PatternFile, RandomWords};
use handler::{on_sigbus, ANON, EMPTY, KERNEL_MAPS, SHARED, ST};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::time::{Duration, Instant};
use uffd_pager::store::FileStore;
use uffd_pager::{Error, InstallKind, PipePool, Result, PAGE_SIZE};

/// What [`random_floor`] measured.
#[derive(Debug, Clone, Copy, Default)]
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
    /// Adds another run's figures to these.
    pub fn add(&mut self, o: &RandomFloorReport) {
        self.reads += o.reads;
        self.faults += o.faults;
        self.elapsed += o.elapsed;
        self.mismatches += o.mismatches;
    }

    /// Wall time per page read per thread, µs (the workload's
    /// `us_per_page`).
    pub fn us_per_page(&self, threads: usize) -> f64 {
        self.elapsed.as_secs_f64() * threads.max(1) as f64 / self.reads.max(1) as f64 * 1e6
    }
}

/// Runs the raw floor of `random`: `threads` threads reading for
/// `duration` over a file of `4 × budget` pages created in `dir`, with at
/// most `budget` pages resident. One [`RandomFloor`] run.
pub fn random_floor(
    dir: &Path,
    budget: usize,
    threads: usize,
    duration: Duration,
    seed: u64,
    kind: InstallKind,
    kernel_maps: bool,
) -> Result<RandomFloorReport> {
    RandomFloor::new(dir, budget, threads, kind, kernel_maps)?.run(duration, seed)
}

/// The floor's file, mappings and ring, kept between runs, so that a
/// caller can run it in slices alternated with the engine's (each slice
/// after the first starts with the pages the last one left resident, as
/// the engine's region does).
pub struct RandomFloor {
    threads: usize,
    pages: usize,
    variant: usize,
    file: PatternFile,
    store: FileStore,
    memfd: Memfd,
    user: memmap2::MmapMut,
    uffd: Uffd,
    ring: Vec<AtomicUsize>,
    head: usize,
    pipes: PipePool,
}

impl RandomFloor {
    /// Creates the file (`4 × budget` pages in `dir`), maps and registers
    /// it for `kind` (`kernel_maps`: the kernel-mapped variant of the
    /// shared kind).
    pub fn new(
        dir: &Path,
        budget: usize,
        threads: usize,
        kind: InstallKind,
        kernel_maps: bool,
    ) -> Result<RandomFloor> {
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
        uffd.register(user.as_ptr() as usize, len, reg)
            .map_err(|e| crate::sys_error("UFFDIO_REGISTER", e))?;
        let variant = match (anon, kernel_maps) {
            (true, _) => ANON,
            (false, true) => KERNEL_MAPS,
            (false, false) => SHARED,
        };
        Ok(RandomFloor {
            threads,
            pages,
            variant,
            file,
            store,
            memfd,
            user,
            uffd,
            ring: (0..budget).map(|_| AtomicUsize::new(EMPTY)).collect(),
            head: 0,
            pipes: PipePool::default(),
        })
    }

    /// Reads for `duration` (the threads seeded from `seed`, as the
    /// workload's), then evicts the victims its threads queued and never
    /// zapped (see `settle`).
    pub fn run(&mut self, duration: Duration, seed: u64) -> Result<RandomFloorReport> {
        let (len, user_base) = (self.pages * PAGE_SIZE, self.user.as_ptr() as usize);
        let mismatches = AtomicU64::new(0);
        let report = with_raw_handler(on_sigbus, || {
            ST.pipes
                .store(&self.pipes as *const PipePool as usize, Release);
            ST.uffd.store(&self.uffd as *const Uffd as usize, Release);
            ST.file_fd
                .store(self.file.file().as_raw_fd() as usize, Release);
            ST.memfd.store(self.memfd.fd() as usize, Release);
            ST.ring.store(self.ring.as_ptr() as usize, Release);
            ST.ring_len.store(self.ring.len(), Release);
            ST.hot.head.store(self.head, Release);
            ST.hot.faults.store(0, Release);
            ST.variant.store(self.variant, Release);
            ST.store
                .store(&self.store as *const FileStore as usize, Release);
            ST.len.store(len, Release);
            ST.base.store(user_base, Release);
            let t0 = Instant::now();
            // SAFETY: `user` maps `pages` pages and outlives the call.
            let reads = unsafe {
                RandomWords {
                    pages: self.pages,
                    threads: self.threads,
                    seed,
                    deadline: t0 + duration,
                    write_pct: 0,
                }
                .run(user_base, &mismatches, None)
            };
            let elapsed = t0.elapsed();
            ST.base.store(0, Release);
            ST.len.store(0, Release);
            self.head = ST.hot.head.load(Acquire);
            Ok(RandomFloorReport {
                // (A thread that could not start is an error only now, after
                // the handler's state is cleared.)
                reads: reads?,
                faults: ST.hot.faults.load(Acquire),
                elapsed,
                mismatches: mismatches.load(Relaxed),
            })
        })?;
        self.settle()?;
        Ok(report)
    }

    /// Evicts what the last run's threads queued for a batched zap and
    /// never zapped (their queues died with them): every page resident but
    /// not in the ring. Without it each run would leave up to a batch per
    /// thread mapped beyond the budget, free hits for the next run.
    fn settle(&self) -> Result<()> {
        let base = self.user.as_ptr() as usize;
        let mut core = self.in_core()?;
        for r in &self.ring {
            let off = r.load(Relaxed);
            if off != EMPTY {
                core[off / PAGE_SIZE] = 0;
            }
        }
        for (p, _) in core.iter().enumerate().filter(|(_, c)| **c & 1 != 0) {
            // SAFETY: a page of the floor's user mapping, read only through
            // raw pointers (it faults again and is refilled).
            let _ = unsafe { mem::dontneed_batch(&[(base + p * PAGE_SIZE, PAGE_SIZE)]) };
            // The shared variants' pages live in the memfd (`mincore` of a
            // shared mapping reports the page cache): the kernel-mapped
            // one's queued victims, or a page a thread filled after
            // another evicted it.
            if self.variant != ANON {
                let _ = mem::punch_hole(self.memfd.fd(), p * PAGE_SIZE, PAGE_SIZE);
            }
        }
        Ok(())
    }

    /// Pages resident in the floor's mapping now.
    pub fn resident_pages(&self) -> Result<usize> {
        Ok(self.in_core()?.iter().filter(|c| **c & 1 != 0).count())
    }

    /// `mincore` of the floor's mapping: a byte per page, bit 0 set where
    /// the page is resident.
    fn in_core(&self) -> Result<Vec<u8>> {
        let mut core = vec![0u8; self.pages];
        // SAFETY: `core` holds a byte per page of the mapping, which is
        // page-aligned and `pages` pages long.
        let r = unsafe {
            libc::mincore(
                self.user.as_ptr() as *mut _,
                self.pages * PAGE_SIZE,
                core.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(crate::sys_error("mincore", nix::errno::Errno::last_raw()));
        }
        Ok(core)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor's three variants: the shared kind, kernel-mapped or not,
    /// and the anonymous kind.
    const VARIANTS: [(InstallKind, bool); 3] = [
        (InstallKind::Shared, false),
        (InstallKind::Shared, true),
        (InstallKind::Anonymous, false),
    ];

    #[test]
    fn floor_reads_the_file_correctly_under_its_budget() {
        let dir = crate::workload::pattern_file::default_dir();
        for (kind, km) in VARIANTS {
            let r = random_floor(&dir, 64, 2, Duration::from_millis(200), 3, kind, km).unwrap();
            assert_eq!(r.mismatches, 0);
            assert!(r.reads > 0);
            // A quarter of the file fits: most reads must have faulted.
            assert!(r.faults > r.reads / 4, "{r:?}");
        }
    }

    #[test]
    fn ring_slots_are_fifo_and_spread_over_lines() {
        for len in [64, 4096, 7, 100] {
            let slots: Vec<usize> = (0..len).map(|h| handler::ring_slot(h, len)).collect();
            let mut sorted = slots.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..len).collect::<Vec<_>>(), "len {len}");
            for h in 0..3 * len {
                assert_eq!(handler::ring_slot(h + len, len), handler::ring_slot(h, len));
            }
            if len % 8 == 0 {
                assert!(slots.windows(2).all(|w| w[0] / 8 != w[1] / 8), "len {len}");
            }
        }
    }

    #[test]
    fn a_floor_run_in_slices_keeps_its_budget_between_them() {
        // The batched variants' threads queue victims and die with their
        // queue: unless the run settles, the pages stay mapped beyond the
        // budget and the next slice hits them for free.
        let dir = crate::workload::pattern_file::default_dir();
        for (kind, km) in VARIANTS {
            let mut f = RandomFloor::new(&dir, 64, 2, kind, km).unwrap();
            let mut total = RandomFloorReport::default();
            for seed in 0..3 {
                let r = f.run(Duration::from_millis(100), seed).unwrap();
                assert_eq!(r.mismatches, 0);
                total.add(&r);
                let resident = f.resident_pages().unwrap();
                assert!(resident <= 64, "{kind} km {km}: {resident} pages resident");
            }
            assert!(total.faults > total.reads / 4, "{total:?}");
        }
    }
}
