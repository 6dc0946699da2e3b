//! Counters, latency histograms and their snapshots.
//!
//! Counter names follow the kernel's (`/proc/vmstat`), so results read the
//! same as the seeds'. Every counter is a relaxed atomic: incrementing one is
//! async-signal-safe and costs one uncontended RMW.

pub mod histogram;

use crate::sync::global_lock::Contention;
use histogram::{AtomicHistogram, Percentiles};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident => $text:literal,)*) => {
        /// One engine counter: read from a [`Stats`] snapshot.
        ///
        /// ```
        /// use uffd_pager::{Counter, Pager};
        ///
        /// let pager = Pager::builder().build()?;
        /// let region = pager.map_anonymous(4 * uffd_pager::PAGE_SIZE)?;
        /// assert_eq!(region.as_slice()[0], 0); // one fault
        /// let st = pager.stats();
        /// assert!(st.get(Counter::PGFAULT) >= 1);
        /// println!("{st}"); // every counter, /proc/vmstat style
        /// # Ok::<(), uffd_pager::Error>(())
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        pub enum Counter { $($(#[$doc])* $name,)* }

        impl Counter {
            /// Every counter, in report order.
            pub const ALL: &'static [Counter] = &[$(Counter::$name,)*];
            /// The kernel-style name (`/proc/vmstat` spelling).
            pub fn name(self) -> &'static str {
                match self { $(Counter::$name => $text,)* }
            }
        }
    };
}

counters! {
    /// Faults completed under the region lock.
    VMA_LOCK_SUCCESS => "vma_lock_success",
    /// Region attempts that could not start (no region, write-locked, out of range).
    VMA_LOCK_ABORT => "vma_lock_abort",
    /// Region attempts that returned RETRY.
    VMA_LOCK_RETRY => "vma_lock_retry",
    /// Lookups that found a detached region and looked again.
    VMA_LOCK_MISS => "vma_lock_miss",
    /// RETRY returned from steps 4-5 (lock dropped around I/O or a wait).
    RETRY_MMAP_DROP => "retry_mmap_drop",
    /// A `tried` attempt found its page absent again (reclaimed in the window).
    RETRY_IO_MISS => "retry_io_miss",
    /// Faults served in a region (or ended in SIGBUS); not an address in no
    /// region nor an access its region refuses with a SIGSEGV of the
    /// engine's, which the kernel's count leaves out too (they are
    /// [`SEGV`](Counter::SEGV)s). (A write to a region made read-only with
    /// write protection is served: the fault makes it read-only with
    /// `mprotect`, and the kernel's own SIGSEGV answers the write.)
    PGFAULT => "pgfault",
    /// Faults that needed store I/O.
    PGMAJFAULT => "pgmajfault",
    /// SIGSEGVs the engine raised for a faulting thread: an address in no
    /// region, or an access its region refuses (a write to a read-only
    /// store's page). Counted once per signal, not per look at the fault.
    SEGV => "segv",
    /// Store errors: each failed read try (a fault's; a readahead run's,
    /// once per run, which a 2 MiB page's empty pool fails too), and each
    /// failed write of a page reclaim evicts (a `flush`'s failed
    /// write-back is returned to its caller, not counted).
    IO_ERROR => "io_error",
    /// Pages poisoned after repeated read errors.
    POISONED => "poisoned",
    /// Write-protect faults that marked a page dirty.
    WP_FAULT => "wp_fault",
    /// Pages installed (COPY, ZEROPAGE or CONTINUE).
    PGINSTALL => "pginstall",
    /// Pages read from the store.
    PGREAD => "pgread",
    /// Pages scanned by reclaim.
    PGSCAN => "pgscan",
    /// Pages reclaimed.
    PGSTEAL => "pgsteal",
    /// Dirty pages written back to the store.
    WRITEBACK => "writeback",
    /// LRU lock acquisitions.
    LRU_LOCK => "lru_lock",
    /// LRU lock acquisitions that had to wait.
    LRU_LOCK_CONTENDED => "lru_lock_contended",
    /// Reclaim passes run where the charge was made, outside kswapd: at
    /// the budget (direct reclaim) and past the high watermark (the clean
    /// pass), in a faulting context or a readahead thread; a charge that
    /// goes over the budget makes both.
    DIRECT_RECLAIM => "direct_reclaim",
    /// Background reclaimer rounds (one per wake-up, and one more per
    /// round that left residency above the high watermark, its waits
    /// after rounds that freed nothing included).
    KSWAPD_WAKE => "kswapd_wake",
    /// Pages read ahead (loaded before anyone faulted on them).
    RA_PAGES => "readahead_pages",
    /// Read-ahead pages later used by a fault.
    RA_USED => "readahead_used",
    /// Read-ahead pages evicted unused.
    RA_WASTED => "readahead_wasted",
    /// Pages installed by fault-around (neighbours of a fault).
    FAULT_AROUND => "fault_around",
    /// `UFFDIO_WAKE` calls by handler threads: one per run of adjacent
    /// pages in a batch of fault messages (installs never wake).
    UFFD_WAKE => "uffd_wake",
    /// Faults on a page the engine had installed that was no longer mapped
    /// (the kernel unmapped a shared page, e.g. DAMON's pageout), mapped
    /// again.
    REINSTALL => "reinstall",
    /// Faults on a page the engine had installed whose contents were gone
    /// (the application dropped an anonymous page with madvise, or punched
    /// a shared page's memory): the page started over from its source.
    PAGE_DROPPED => "page_dropped",
    /// Install or eviction ioctls that reported an error although they had
    /// done their work (this kernel's `UFFDIO_MOVE` can return EEXIST after
    /// moving the page), found out by looking where the page is.
    IOCTL_DID_WORK => "ioctl_did_work",
    /// Non-cooperative events read: `madvise(MADV_DONTNEED)` and the like.
    EVENT_REMOVE => "event_remove",
    /// Non-cooperative events read: `munmap` of region memory.
    EVENT_UNMAP => "event_unmap",
    /// Non-cooperative events read: `mremap` that moved region memory.
    EVENT_REMAP => "event_remap",
    /// A map the kernel gave a range the table still held let go of the
    /// global lock to let the event that freed it be applied first (or a
    /// `Region::remap` waited for the pager's events on their way).
    MAP_WAITED_EVENT => "map_waited_event",
    /// 2 MiB extents of a kernel-mapped object's memfd collapsed into huge
    /// folios once all their pages were cached (`MADV_COLLAPSE`; the
    /// kernel's khugepaged counter of the same name).
    THP_COLLAPSE_ALLOC => "thp_collapse_alloc",
    /// Collapses the kernel refused (no huge page to be had, huge pages
    /// off for the process): the extent stays in base pages.
    THP_COLLAPSE_ALLOC_FAILED => "thp_collapse_alloc_failed",
}

const N: usize = Counter::ALL.len();

/// One CPU's share of the counters, on cache lines of its own.
#[repr(align(128))]
#[derive(Debug)]
struct CpuCounters {
    vals: [AtomicU64; N],
    /// Fault service time, ns: from the delivery's first try (the wait for
    /// the event gate and the restarts included) to done.
    latency: AtomicHistogram,
}

/// The live counters of one pager.
///
/// # Cost
/// Per CPU (the kernel's per-CPU vm event counters): a bump is one relaxed
/// atomic add on the current CPU's lines (`sched_getcpu` reads the rseq
/// area), so threads faulting on different CPUs do not bounce a counter's
/// cache line between them. Reading sums every CPU's share. There are as
/// many shares as the machine has CPUs (`_SC_NPROCESSORS_CONF`, see
/// `sys::cpu_count`); a CPU numbered past that count (one brought online
/// later) shares the share of its number modulo the count (the counts stay
/// exact; only the lines are shared).
#[derive(Debug)]
pub struct Counters {
    cpus: Box<[CpuCounters]>,
}

impl Default for Counters {
    fn default() -> Self {
        let n = crate::sys::cpu_count();
        Counters {
            cpus: (0..n)
                .map(|_| CpuCounters {
                    vals: std::array::from_fn(|_| AtomicU64::new(0)),
                    latency: AtomicHistogram::new(),
                })
                .collect(),
        }
    }
}

impl Counters {
    /// This CPU's share. Async-signal-safe.
    #[inline]
    fn mine(&self) -> &CpuCounters {
        &self.cpus[crate::sys::this_cpu() % self.cpus.len()]
    }

    /// Adds one.
    #[inline]
    pub fn inc(&self, c: Counter) {
        self.mine().vals[c as usize].fetch_add(1, Relaxed);
    }

    /// Adds `n`.
    #[inline]
    pub fn add(&self, c: Counter, n: u64) {
        self.mine().vals[c as usize].fetch_add(n, Relaxed);
    }

    /// Current value (summed over CPUs).
    pub fn get(&self, c: Counter) -> u64 {
        self.cpus
            .iter()
            .map(|p| p.vals[c as usize].load(Relaxed))
            .sum()
    }

    /// Records one fault's service time. Async-signal-safe.
    #[inline]
    pub fn record_latency(&self, ns: u64) {
        self.mine().latency.record(ns);
    }

    /// Fault service-time percentiles over every CPU.
    pub fn latency_percentiles(&self) -> Percentiles {
        let all = AtomicHistogram::new();
        for p in self.cpus.iter() {
            all.absorb(&p.latency);
        }
        all.percentiles()
    }

    /// Zeroes everything.
    pub fn reset(&self) {
        for p in self.cpus.iter() {
            for v in &p.vals {
                v.store(0, Relaxed);
            }
            p.latency.reset();
        }
    }
}

/// A snapshot of a pager's statistics ([`Pager::stats`](crate::Pager::stats)):
/// the counters, global-lock [`Contention`](crate::Contention), fault
/// latency [`Percentiles`](crate::Percentiles) and resident pages. See
/// [`Counter`] for an example.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    counters: [u64; N],
    /// Global-lock acquisitions and contention.
    pub global: Contention,
    /// Fault service-time percentiles.
    pub fault_latency: Percentiles,
    /// Pages resident (cached + installed) now.
    pub resident_pages: u64,
    /// Highest resident count seen.
    pub peak_resident_pages: u64,
    /// The memory budget in pages (0: unlimited).
    pub budget_pages: u64,
}

impl Stats {
    pub(crate) fn capture(
        c: &Counters,
        global: Contention,
        resident_pages: u64,
        peak_resident_pages: u64,
        budget_pages: u64,
    ) -> Stats {
        Stats {
            counters: std::array::from_fn(|i| c.get(Counter::ALL[i])),
            global,
            fault_latency: c.latency_percentiles(),
            resident_pages,
            peak_resident_pages,
            budget_pages,
        }
    }

    /// A counter's value.
    ///
    /// Example: [`Stats`](crate::Stats).
    pub fn get(&self, c: Counter) -> u64 {
        self.counters[c as usize]
    }

    /// `RETRY_IO_MISS / RETRY_MMAP_DROP` in percent (seed 000's Miss/Drop).
    ///
    /// Example: [`Stats`](crate::Stats).
    pub fn miss_drop_pct(&self) -> f64 {
        let drop = self.get(Counter::RETRY_MMAP_DROP);
        if drop == 0 {
            0.0
        } else {
            100.0 * self.get(Counter::RETRY_IO_MISS) as f64 / drop as f64
        }
    }

    /// Global-lock acquisitions that had to wait, reads and writes.
    ///
    /// Example: [`Stats`](crate::Stats).
    pub fn global_contended(&self) -> u64 {
        // (Saturating: `global` is public, and a caller may fill it.)
        self.global
            .read_contended
            .saturating_add(self.global.write_contended)
    }

    /// The difference `self - earlier`, counter by counter (latency and
    /// residency are taken from `self`).
    ///
    /// Example: [`Stats`](crate::Stats).
    pub fn since(&self, earlier: &Stats) -> Stats {
        // Saturating: `earlier` may come from before a `reset_stats`,
        // which zeroes these too.
        self.combine(earlier, u64::saturating_sub)
    }

    /// The sum `self + other`, counter by counter, of two runs' counters
    /// (two pagers', say; latency and residency are taken from `other`,
    /// the later).
    ///
    /// ```
    /// # use uffd_pager::{Counter, Pager};
    /// let a = Pager::builder().build()?.stats();
    /// let b = a.plus(&a);
    /// assert_eq!(b.get(Counter::PGFAULT), 2 * a.get(Counter::PGFAULT));
    /// # Ok::<(), uffd_pager::Error>(())
    /// ```
    pub fn plus(&self, other: &Stats) -> Stats {
        other.combine(self, u64::saturating_add)
    }

    /// `self` with each counter and global-lock figure `f(self's, other's)`.
    fn combine(&self, other: &Stats, f: impl Fn(u64, u64) -> u64) -> Stats {
        let mut s = self.clone();
        for i in 0..N {
            s.counters[i] = f(self.counters[i], other.counters[i]);
        }
        let (a, b) = (&self.global, &other.global);
        s.global = Contention {
            read_acquisitions: f(a.read_acquisitions, b.read_acquisitions),
            read_contended: f(a.read_contended, b.read_contended),
            read_wait_ns: f(a.read_wait_ns, b.read_wait_ns),
            write_acquisitions: f(a.write_acquisitions, b.write_acquisitions),
            write_contended: f(a.write_contended, b.write_contended),
            write_wait_ns: f(a.write_wait_ns, b.write_wait_ns),
        };
        s
    }
}

/// `/proc/vmstat` style: one `name value` line per counter, per global-lock
/// figure and per residency figure, and the fault latency's count, p50,
/// p99 and maximum (the mean, p90 and p99.9 are in [`Stats::fault_latency`]).
impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &c in Counter::ALL {
            writeln!(f, "{} {}", c.name(), self.get(c))?;
        }
        let g = &self.global;
        writeln!(f, "global_lock_read {}", g.read_acquisitions)?;
        writeln!(f, "global_lock_read_contended {}", g.read_contended)?;
        writeln!(f, "global_lock_read_wait_ns {}", g.read_wait_ns)?;
        writeln!(f, "global_lock_write {}", g.write_acquisitions)?;
        writeln!(f, "global_lock_write_contended {}", g.write_contended)?;
        writeln!(f, "global_lock_write_wait_ns {}", g.write_wait_ns)?;
        writeln!(f, "resident_pages {}", self.resident_pages)?;
        writeln!(f, "peak_resident_pages {}", self.peak_resident_pages)?;
        writeln!(f, "budget_pages {}", self.budget_pages)?;
        let l = &self.fault_latency;
        writeln!(f, "fault_latency_count {}", l.count)?;
        writeln!(f, "fault_latency_p50_ns {}", l.p50_ns)?;
        writeln!(f, "fault_latency_p99_ns {}", l.p99_ns)?;
        write!(f, "fault_latency_max_ns {}", l.max_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `since` of a snapshot taken before a reset (which zeroes the
    /// counters and the global lock's figures alike) saturates at 0: the
    /// lock's figures were subtracted plainly, which panicked in a debug
    /// build and wrapped to about 2^64 in a release one.
    #[test]
    fn since_a_snapshot_from_before_a_reset_saturates() {
        let c = Counters::default();
        c.add(Counter::PGFAULT, 5);
        let busy = Contention {
            read_acquisitions: 10,
            read_contended: 2,
            read_wait_ns: 300,
            write_acquisitions: 4,
            write_contended: 1,
            write_wait_ns: 70,
        };
        let before = Stats::capture(&c, busy, 0, 0, 0);
        c.reset();
        c.inc(Counter::PGFAULT);
        let after = Stats::capture(&c, Contention::default(), 0, 0, 0);
        let d = after.since(&before);
        assert_eq!(d.get(Counter::PGFAULT), 0);
        assert_eq!(d.global, Contention::default());
    }

    /// A snapshot whose public lock figures a caller set near the limit
    /// sums them without overflow (a debug build panicked).
    #[test]
    fn contended_acquisitions_saturate() {
        let mut s = Stats::capture(&Counters::default(), Contention::default(), 0, 0, 0);
        s.global.read_contended = u64::MAX;
        s.global.write_contended = 1;
        assert_eq!(s.global_contended(), u64::MAX);
    }
}
