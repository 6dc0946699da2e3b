//! Statistics: a struct of every counter, and `/proc/vmstat`-style text.

use crate::{fail, guard, non_null, uffd_pager};
use engine::{Counter, Stats};
use std::ffi::c_char;

/// A snapshot of a pager's statistics ([`uffd_pager_stats_get`]): the
/// engine's counters (named as in `/proc/vmstat`), global-lock contention,
/// residency and fault latency. Fields are only appended: a counter added
/// later goes at the end, wherever the vmstat text prints it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct uffd_pager_stats {
    /// Faults completed under the region lock.
    pub vma_lock_success: u64,
    /// Region attempts that could not start (no region, write-locked, out of range).
    pub vma_lock_abort: u64,
    /// Region attempts that returned RETRY.
    pub vma_lock_retry: u64,
    /// Lookups that found a detached region and looked again.
    pub vma_lock_miss: u64,
    /// RETRY returned from steps 4-5 (lock dropped around I/O or a wait).
    pub retry_mmap_drop: u64,
    /// A `tried` attempt found its page absent again (reclaimed in the window).
    pub retry_io_miss: u64,
    /// Faults served in a region (or ended in SIGBUS); not an address in no
    /// region nor an access its region refuses with a SIGSEGV of the
    /// engine's (those are `segv`).
    pub pgfault: u64,
    /// Faults that needed store I/O.
    pub pgmajfault: u64,
    /// SIGSEGVs the engine raised for a faulting thread (an address in no
    /// region, or an access its region refuses), once per signal.
    pub segv: u64,
    /// Store read errors (each try).
    pub io_error: u64,
    /// Pages poisoned after repeated read errors.
    pub poisoned: u64,
    /// Write-protect faults that marked a page dirty.
    pub wp_fault: u64,
    /// Pages installed (COPY, ZEROPAGE or CONTINUE).
    pub pginstall: u64,
    /// Pages read from the store.
    pub pgread: u64,
    /// Pages scanned by reclaim.
    pub pgscan: u64,
    /// Pages reclaimed.
    pub pgsteal: u64,
    /// Dirty pages written back to the store.
    pub writeback: u64,
    /// LRU lock acquisitions.
    pub lru_lock: u64,
    /// LRU lock acquisitions that had to wait.
    pub lru_lock_contended: u64,
    /// Direct reclaim runs (in the faulting context).
    pub direct_reclaim: u64,
    /// Background reclaimer wake-ups.
    pub kswapd_wake: u64,
    /// Pages read ahead (loaded before anyone faulted on them).
    pub readahead_pages: u64,
    /// Read-ahead pages later used by a fault.
    pub readahead_used: u64,
    /// Read-ahead pages evicted unused.
    pub readahead_wasted: u64,
    /// Pages installed by fault-around (neighbours of a fault).
    pub fault_around: u64,
    /// `UFFDIO_WAKE` calls by handler threads: one per run of adjacent pages in a batch of fault messages (installs never wake).
    pub uffd_wake: u64,
    /// Faults on a page the engine had installed that was no longer mapped (the kernel unmapped a shared page, e.g. DAMON's pageout), mapped again.
    pub reinstall: u64,
    /// Faults on a page the engine had installed whose contents were gone (the application dropped an anonymous page with madvise, or punched a shared page's memory): the page started over from its source.
    pub page_dropped: u64,
    /// Install or eviction ioctls that reported an error although they had done their work (this kernel's `UFFDIO_MOVE` can return EEXIST after moving the page), found out by looking where the page is.
    pub ioctl_did_work: u64,
    /// Non-cooperative events read: `madvise(MADV_DONTNEED)` and the like.
    pub event_remove: u64,
    /// Non-cooperative events read: `munmap` of region memory.
    pub event_unmap: u64,
    /// Non-cooperative events read: `mremap` that moved region memory.
    pub event_remap: u64,
    /// A map the kernel gave a range the table still held let go of the global lock to let the event that freed it be applied first.
    pub map_waited_event: u64,
    /// 2 MiB extents of a kernel-mapped region's cache collapsed into huge folios.
    pub thp_collapse_alloc: u64,
    /// Collapses the kernel refused (the extent stays in base pages).
    pub thp_collapse_alloc_failed: u64,
    /// Global-lock read acquisitions.
    pub global_lock_read: u64,
    /// Global-lock read acquisitions that waited.
    pub global_lock_read_contended: u64,
    /// Nanoseconds spent waiting for the global lock as a reader.
    pub global_lock_read_wait_ns: u64,
    /// Global-lock write acquisitions.
    pub global_lock_write: u64,
    /// Global-lock write acquisitions that waited.
    pub global_lock_write_contended: u64,
    /// Nanoseconds spent waiting for the global lock as a writer.
    pub global_lock_write_wait_ns: u64,
    /// Pages resident now.
    pub resident_pages: u64,
    /// The most pages resident at once.
    pub peak_resident_pages: u64,
    /// The budget in pages (0: unlimited).
    pub budget_pages: u64,
    /// Faults timed.
    pub fault_latency_count: u64,
    /// Median fault service time, ns.
    pub fault_latency_p50_ns: u64,
    /// 99th-percentile fault service time, ns.
    pub fault_latency_p99_ns: u64,
    /// Slowest fault, ns.
    pub fault_latency_max_ns: u64,
}

impl From<&Stats> for uffd_pager_stats {
    fn from(s: &Stats) -> Self {
        let (g, l) = (&s.global, &s.fault_latency);
        uffd_pager_stats {
            vma_lock_success: s.get(Counter::VMA_LOCK_SUCCESS),
            vma_lock_abort: s.get(Counter::VMA_LOCK_ABORT),
            vma_lock_retry: s.get(Counter::VMA_LOCK_RETRY),
            vma_lock_miss: s.get(Counter::VMA_LOCK_MISS),
            retry_mmap_drop: s.get(Counter::RETRY_MMAP_DROP),
            retry_io_miss: s.get(Counter::RETRY_IO_MISS),
            pgfault: s.get(Counter::PGFAULT),
            pgmajfault: s.get(Counter::PGMAJFAULT),
            segv: s.get(Counter::SEGV),
            io_error: s.get(Counter::IO_ERROR),
            poisoned: s.get(Counter::POISONED),
            wp_fault: s.get(Counter::WP_FAULT),
            pginstall: s.get(Counter::PGINSTALL),
            pgread: s.get(Counter::PGREAD),
            pgscan: s.get(Counter::PGSCAN),
            pgsteal: s.get(Counter::PGSTEAL),
            writeback: s.get(Counter::WRITEBACK),
            lru_lock: s.get(Counter::LRU_LOCK),
            lru_lock_contended: s.get(Counter::LRU_LOCK_CONTENDED),
            direct_reclaim: s.get(Counter::DIRECT_RECLAIM),
            kswapd_wake: s.get(Counter::KSWAPD_WAKE),
            readahead_pages: s.get(Counter::RA_PAGES),
            readahead_used: s.get(Counter::RA_USED),
            readahead_wasted: s.get(Counter::RA_WASTED),
            fault_around: s.get(Counter::FAULT_AROUND),
            uffd_wake: s.get(Counter::UFFD_WAKE),
            reinstall: s.get(Counter::REINSTALL),
            page_dropped: s.get(Counter::PAGE_DROPPED),
            ioctl_did_work: s.get(Counter::IOCTL_DID_WORK),
            event_remove: s.get(Counter::EVENT_REMOVE),
            event_unmap: s.get(Counter::EVENT_UNMAP),
            event_remap: s.get(Counter::EVENT_REMAP),
            map_waited_event: s.get(Counter::MAP_WAITED_EVENT),
            thp_collapse_alloc: s.get(Counter::THP_COLLAPSE_ALLOC),
            thp_collapse_alloc_failed: s.get(Counter::THP_COLLAPSE_ALLOC_FAILED),
            global_lock_read: g.read_acquisitions,
            global_lock_read_contended: g.read_contended,
            global_lock_read_wait_ns: g.read_wait_ns,
            global_lock_write: g.write_acquisitions,
            global_lock_write_contended: g.write_contended,
            global_lock_write_wait_ns: g.write_wait_ns,
            resident_pages: s.resident_pages,
            peak_resident_pages: s.peak_resident_pages,
            budget_pages: s.budget_pages,
            fault_latency_count: l.count,
            fault_latency_p50_ns: l.p50_ns,
            fault_latency_p99_ns: l.p99_ns,
            fault_latency_max_ns: l.max_ns,
        }
    }
}

/// Fills `*out`, of `size` bytes (`sizeof *out`), with a snapshot of `p`'s
/// statistics: as many of the library's fields as fit (a struct from an
/// older header gets those it has), the rest of `size` zeroed (fields of a
/// newer header read 0). Fields are only ever appended.
///
/// Returns the bytes of statistics written (at most `size`), or a
/// negative errno (-EINVAL for a `size` over 4096, which no version has).
///
/// # Safety
/// `p` is a live pager; `out` points at `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_stats_get(
    p: *const uffd_pager,
    out: *mut uffd_pager_stats,
    size: usize,
) -> i32 {
    guard(|| {
        non_null!(p);
        non_null!(out);
        if let Err(rc) = crate::abi::check_out_size("uffd_pager_stats", size) {
            return rc;
        }
        // SAFETY: the caller's contract.
        let s = uffd_pager_stats::from(&unsafe { (*p).pager.stats() });
        // SAFETY: `size` writable bytes (the caller's contract), not `s`.
        let n = unsafe { crate::abi::fill(out.cast::<u8>(), size, &s) };
        n as i32
    })
}

/// Writes `p`'s statistics as `/proc/vmstat`-style text (`name value`
/// lines) into `buf`, NUL-terminated and cut to `cap` bytes, as snprintf
/// does. Returns the text's full length (without the NUL), so a caller can
/// size `buf` with a first call of `cap` 0; `buf` may be NULL then.
///
/// # Safety
/// `p` is a live pager; `buf` points at `cap` writable bytes (or `cap` is 0).
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_stats_vmstat(
    p: *const uffd_pager,
    buf: *mut c_char,
    cap: usize,
) -> i64 {
    if p.is_null() || (buf.is_null() && cap > 0) {
        return i64::from(fail(libc::EINVAL, "p is NULL, or buf is NULL with cap > 0"));
    }
    let text = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        format!("{}\n", unsafe { (*p).pager.stats() })
    })) {
        Ok(t) => t,
        Err(_) => return i64::from(fail(libc::EFAULT, "internal error formatting stats")),
    };
    if cap > 0 {
        let n = text.len().min(cap - 1);
        // SAFETY: `buf` has `cap` > n bytes (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast(), n);
            *buf.add(n) = 0;
        }
    }
    text.len() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::mem::{offset_of, size_of};

    /// Each field's name and offset, in the struct's order.
    macro_rules! fields {
        ($($f:ident),* $(,)?) => {
            [$((stringify!($f), offset_of!(uffd_pager_stats, $f))),*]
        };
    }

    /// The first version's fields, in order: a program built against it
    /// reads them at these places in every later library, so fields are
    /// only appended (a new counter goes at the end of the struct, wherever
    /// the vmstat text prints it).
    const FIRST: [&str; 48] = [
        "vma_lock_success",
        "vma_lock_abort",
        "vma_lock_retry",
        "vma_lock_miss",
        "retry_mmap_drop",
        "retry_io_miss",
        "pgfault",
        "pgmajfault",
        "segv",
        "io_error",
        "poisoned",
        "wp_fault",
        "pginstall",
        "pgread",
        "pgscan",
        "pgsteal",
        "writeback",
        "lru_lock",
        "lru_lock_contended",
        "direct_reclaim",
        "kswapd_wake",
        "readahead_pages",
        "readahead_used",
        "readahead_wasted",
        "fault_around",
        "uffd_wake",
        "reinstall",
        "page_dropped",
        "ioctl_did_work",
        "event_remove",
        "event_unmap",
        "event_remap",
        "map_waited_event",
        "thp_collapse_alloc",
        "thp_collapse_alloc_failed",
        "global_lock_read",
        "global_lock_read_contended",
        "global_lock_read_wait_ns",
        "global_lock_write",
        "global_lock_write_contended",
        "global_lock_write_wait_ns",
        "resident_pages",
        "peak_resident_pages",
        "budget_pages",
        "fault_latency_count",
        "fault_latency_p50_ns",
        "fault_latency_p99_ns",
        "fault_latency_max_ns",
    ];

    #[test]
    fn every_vmstat_line_is_a_field_and_the_first_versions_stay_in_place() {
        let all = fields!(
            vma_lock_success,
            vma_lock_abort,
            vma_lock_retry,
            vma_lock_miss,
            retry_mmap_drop,
            retry_io_miss,
            pgfault,
            pgmajfault,
            segv,
            io_error,
            poisoned,
            wp_fault,
            pginstall,
            pgread,
            pgscan,
            pgsteal,
            writeback,
            lru_lock,
            lru_lock_contended,
            direct_reclaim,
            kswapd_wake,
            readahead_pages,
            readahead_used,
            readahead_wasted,
            fault_around,
            uffd_wake,
            reinstall,
            page_dropped,
            ioctl_did_work,
            event_remove,
            event_unmap,
            event_remap,
            map_waited_event,
            thp_collapse_alloc,
            thp_collapse_alloc_failed,
            global_lock_read,
            global_lock_read_contended,
            global_lock_read_wait_ns,
            global_lock_write,
            global_lock_write_contended,
            global_lock_write_wait_ns,
            resident_pages,
            peak_resident_pages,
            budget_pages,
            fault_latency_count,
            fault_latency_p50_ns,
            fault_latency_p99_ns,
            fault_latency_max_ns,
        );
        // The list is the struct: every u64 slot, in order.
        assert_eq!(size_of::<uffd_pager_stats>(), 8 * all.len());
        for (i, (name, off)) in all.iter().enumerate() {
            assert_eq!(*off, 8 * i, "{name}");
        }
        for (i, name) in FIRST.iter().enumerate() {
            assert_eq!(all[i].0, *name, "field {i} of the first version moved");
        }
        // A field per vmstat line, each holding that line's value.
        let pager = engine::Pager::builder()
            .budget_pages(12345)
            .build()
            .unwrap();
        let text = pager.stats().to_string();
        let lines: HashMap<&str, u64> = text
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap())
            .map(|(k, v)| (k, v.parse().unwrap()))
            .collect();
        assert_eq!(Counter::ALL.len() + 13, lines.len());
        assert_eq!(lines.len(), all.len());
        let s = uffd_pager_stats::from(&pager.stats());
        // SAFETY: a repr(C) struct of u64 fields only (checked above).
        let vals: &[u64] = unsafe {
            std::slice::from_raw_parts((&s as *const uffd_pager_stats).cast(), all.len())
        };
        for ((name, _), v) in all.iter().zip(vals) {
            let Some(want) = lines.get(name) else {
                panic!("{name} is no vmstat line")
            };
            if !name.starts_with("fault_latency") {
                assert_eq!(want, v, "{name}");
            }
        }
        assert_eq!(s.budget_pages, 12345);
    }

    #[test]
    fn stats_fill_as_many_bytes_as_the_caller_has() {
        let p = crate::uffd_pager {
            pager: engine::Pager::builder().budget_pages(7).build().unwrap(),
        };
        let ours = size_of::<uffd_pager_stats>();
        let budget = offset_of!(uffd_pager_stats, budget_pages) / 8;
        // An older header's smaller struct: only its bytes are written.
        let mut old = vec![u64::MAX; budget + 2];
        // SAFETY: `old` has `8 * (budget + 1)` bytes to write.
        let n = unsafe { uffd_pager_stats_get(&p, old.as_mut_ptr().cast(), 8 * (budget + 1)) };
        assert_eq!(n as usize, 8 * (budget + 1));
        assert_eq!(old[budget], 7);
        assert_eq!(old[budget + 1], u64::MAX, "wrote past the caller's size");
        // A newer header's larger one: the fields this library lacks read 0.
        let mut new = vec![u64::MAX; ours / 8 + 3];
        // SAFETY: `new` has `ours + 16` bytes to write.
        let n = unsafe { uffd_pager_stats_get(&p, new.as_mut_ptr().cast(), ours + 16) };
        assert_eq!(n as usize, ours);
        assert_eq!(new[budget], 7);
        assert_eq!(new[ours / 8..], [0, 0, u64::MAX]);
    }
}
