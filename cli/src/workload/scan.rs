//! `scan`: a sequential scan of a file through the engine, side by side with
//! the kernel's own `mmap` of the same file, in the same run.
//!
//! # What is compared
//!
//! The file (`k.pages` pages of [`pattern`](super::common::pattern)) lives
//! in [`default_dir`] — tmpfs `/dev/shm` when it exists — so its contents
//! are always in the kernel's page cache. One **pass** reads one `u64` word
//! per page, in page order, and checks it. Both sides are **warm**: their
//! page cache holds the whole file, and only the page-table entries are
//! dropped (`MADV_DONTNEED`, untimed) before each timed pass, so every page
//! of a pass is a minor fault served from the page cache:
//!
//! - **engine**: one region ([`Pager::map_store`](uffd_pager::Pager::map_store)
//!   of a [`FileStore`](uffd_pager::store::FileStore) over the file, `k.install` kind), read once untimed (see below)
//!   to fill the engine's page cache, then [`Region::dontneed`] before each
//!   pass; faults are served by the engine (fault-around and readahead as
//!   configured);
//! - **kernel**: one `mmap(PROT_READ, MAP_SHARED)` of a second file with
//!   the same bytes in the same directory, `madvise(MADV_DONTNEED)` before
//!   each pass; faults are the kernel's minor page-cache faults (with its
//!   fault-around).
//!
//! The kernel maps a file of its own because the engine's store keeps the
//! first one mapped: a [`FileStore`](uffd_pager::store::FileStore) on
//! tmpfs reads through a view of the file, whose entries stay. The kernel
//! counts only a page's first mapping (`NR_FILE_MAPPED`, per memory
//! cgroup), so a fault that maps a page the view holds skips that count,
//! and a kernel pass over the store's file ran about 10% faster than a
//! user's only mapping of a file would (2026-12-06, `perf`: the engine's
//! passes spent that in `__lruvec_stat_mod_folio` and
//! `mod_memcg_lruvec_state`; the kernel's passes not at all). Each side's
//! pages are mapped once, by the scanned mapping: the run reports
//! `engine_pages_mapped_twice` and `kernel_pages_mapped_twice` (pages
//! that `/proc/self/smaps` counts as shared after the warm-up; 0 unless
//! the comparison is off).
//!
//! The first engine pass (every page from the store: a `pread` of the
//! tmpfs file) runs in runs of 256 pages between the writes of the kernel
//! side's file, so that both sides' pages are allocated at the same time:
//! where the kernel takes a page from decides how fast it is read (in a C
//! program here, a tmpfs file's mapping scanned up to a sixth faster over
//! pages allocated later, `docs/measurements/2-vcpu/issue14/scan-1206/`).
//! That pass is not part of the comparison; its time is reported as
//! `engine_cold_ns_per_page`: the runs of the engine's pass alone, so
//! the readahead a run starts may finish untimed while the file is
//! written, and with readahead the figure reads lower than one
//! uninterrupted cold pass would (with 2 MiB pages, about a tenth of what
//! it read before 2026-12-06). Engine and
//! kernel passes alternate until `k.duration` is up (at least one of each).
//! The engine's budget is raised to at least [`budget_holding`] the file,
//! so that a pass measures fault service, not reclaim. `k.threads` is not used (one
//! scanner); `k.writers` writer threads run on the engine's pager
//! throughout.
//!
//! [`Region::dontneed`]: uffd_pager::Region::dontneed

use super::common::{cpu_time, Knobs, RunResult, Writers};
use super::random::{default_dir, pattern_word, read_map_options, PatternFile};
use memmap2::{MmapOptions, UncheckedAdvice};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::{Result, PAGE_SIZE};

/// Reads one word per page of `[base, base + pages × PAGE_SIZE)` in order;
/// returns the words that differ from the pattern.
///
/// # Safety
/// The range must be mapped readable and hold the pattern file's bytes.
pub(crate) unsafe fn scan_pass(base: usize, pages: usize) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { scan_range(base, 0..pages) }
}

/// [`scan_pass`] over pages `range` of the mapping at `base` only.
///
/// # Safety
/// Those pages must be mapped readable and hold the pattern file's bytes.
unsafe fn scan_range(base: usize, range: std::ops::Range<usize>) -> u64 {
    let mut bad = 0;
    for p in range {
        let off = p * PAGE_SIZE + 8 * (p % (PAGE_SIZE / 8));
        // SAFETY: inside the mapped range (caller's contract), 8-aligned.
        let v = unsafe { std::ptr::read_volatile((base + off) as *const u64) };
        bad += (v != pattern_word(off)) as u64;
    }
    bad
}

/// The smallest budget under which `pages` resident pages (and 64 more, for
/// fault-around's reach) stay below kswapd's high watermark, so that a warm
/// pass measures fault service, not reclaim.
pub fn budget_holding(pages: usize) -> u64 {
    let want = pages as u64 + 64;
    (want..)
        .find(|&b| uffd_pager::watermarks(b).0 >= want)
        .unwrap_or(want)
}

/// Runs `f` and times it (wall, process CPU).
fn timed(f: impl FnOnce() -> u64) -> (u64, Duration, Duration) {
    let (t, c) = (Instant::now(), cpu_time());
    let bad = f();
    (bad, t.elapsed(), cpu_time() - c)
}

/// Runs `scan` with its file in [`default_dir`].
pub fn run(k: &Knobs) -> Result<RunResult> {
    run_in(k, &default_dir())
}

/// Runs `scan` with its file (`k.pages` pages) in `dir`; see the module
/// docs for what is compared.
///
/// `ops` is engine pages scanned in timed passes, and `elapsed` / `cpu`
/// are the engine passes' own wall and CPU time, so `throughput()` is the
/// engine's page rate. Extras: `engine_ns_per_page`,
/// `kernel_mmap_ns_per_page`, `ratio` (kernel ns / engine ns: the engine's
/// throughput relative to the kernel's mmap; 1.0 = as fast),
/// `engine_cold_ns_per_page` (the first pass, every page from the store),
/// `passes` (timed passes of each), `file_pages`, `mismatches` (both sides;
/// 0 unless broken), `writer_loops`, and `engine_pages_mapped_twice` /
/// `kernel_pages_mapped_twice` (see the module docs; 0 unless the
/// comparison is off).
pub fn run_in(k: &Knobs, dir: &Path) -> Result<RunResult> {
    let pages = k.pages.max(1);
    let len = pages * PAGE_SIZE;
    let file = PatternFile::create(dir, "scan", pages)?;
    let budget = if k.budget_pages == 0 {
        0
    } else {
        k.budget_pages.max(budget_holding(pages))
    };
    let pager = Arc::new(k.builder().budget_pages(budget).build()?);
    let store = Arc::new(file.store()?);
    let opts = k.sized(read_map_options(k.install));
    let region_kind = opts.install_kind();
    // SAFETY: the workload's stores and files are its own, and it changes them only through its
    // regions (the store contract).
    let mut region = unsafe { pager.map_store(store, len, &opts) }?;
    let ebase = region.as_ptr() as usize;
    // Untimed warm-up: fill both page caches, the engine's from the store
    // by a first pass, in step with the writes of the kernel side's file
    // (its own, which nothing else maps: see the module docs), so that
    // both sides' pages are allocated at the same time.
    let (mut mismatches, mut cold) = (0, Duration::ZERO);
    let kfile = PatternFile::create_beside(dir, "scan-kernel", pages, |r| {
        // SAFETY: the region maps the pattern file, `r` lies inside it,
        // and it outlives the call.
        let (bad, t, _) = timed(|| unsafe { scan_range(ebase, r) });
        (mismatches, cold) = (mismatches + bad, cold + t);
        Ok(())
    })?;
    let io = crate::io_error;
    // SAFETY: the file is this run's own, and nothing writes it while it
    // is mapped; the mapping is read only through raw pointers.
    let kmap = unsafe { MmapOptions::new().len(len).map(kfile.file()) }.map_err(io("mmap"))?;
    let kbase = kmap.as_ptr() as usize;
    // SAFETY: the mapping holds the pattern file and outlives the call.
    mismatches += unsafe { scan_pass(kbase, pages) };
    // Both sides' pages are mapped once, by the scanned mapping alone.
    let twice = |a, l| crate::os::mem::pages_mapped_elsewhere(a, l).map_err(io("reading smaps"));
    let (engine_twice, kernel_twice) = (twice(ebase, len)?, twice(kbase, len)?);

    pager.reset_stats();
    let deadline = Instant::now() + k.duration;
    let writers = Writers::start(&pager, k, deadline)?;
    let (mut ewall, mut ecpu, mut kwall) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut passes = 0u64;
    let result = (|| -> Result<()> {
        while passes == 0 || Instant::now() < deadline {
            region.dontneed(0, len)?;
            let (bad, w, c) = timed(|| unsafe { scan_pass(ebase, pages) });
            mismatches += bad;
            ewall += w;
            ecpu += c;
            // SAFETY: no reference into the mapping is held (the scans read
            // it through raw pointers); its pages come back from the file.
            unsafe { kmap.unchecked_advise(UncheckedAdvice::DontNeed) }.map_err(io("madvise"))?;
            let (bad, w, _) = timed(|| unsafe { scan_pass(kbase, pages) });
            mismatches += bad;
            kwall += w;
            passes += 1;
        }
        Ok(())
    })();
    let writer_loops = writers.stop();
    result?;
    let stats = pager.stats();
    drop(region);
    let scanned = passes * pages as u64;
    let ns_per_page = |d: Duration| d.as_nanos() as f64 / scanned as f64;
    let (engine_ns, kernel_ns) = (ns_per_page(ewall), ns_per_page(kwall));
    Ok(RunResult {
        workload: "scan",
        label: k.policy.to_string(),
        ops: scanned,
        unit: "pages",
        elapsed: ewall,
        cpu: ecpu,
        stats,
        latency: None,
        extra: vec![
            ("engine_ns_per_page", engine_ns),
            ("kernel_mmap_ns_per_page", kernel_ns),
            ("ratio", kernel_ns / engine_ns.max(1e-9)),
            (
                "engine_cold_ns_per_page",
                cold.as_nanos() as f64 / pages as f64,
            ),
            ("passes", passes as f64),
            ("file_pages", pages as f64),
            ("mismatches", mismatches as f64),
            ("writer_loops", writer_loops as f64),
            ("engine_pages_mapped_twice", engine_twice as f64),
            ("kernel_pages_mapped_twice", kernel_twice as f64),
        ],
        install: Some(region_kind),
    })
}
