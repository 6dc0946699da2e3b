//! `scan`: a sequential scan of a file through the engine, side by side with
//! the kernel's own `mmap` of the same file, in the same run.
//!
//! # What is compared
//!
//! The file (`k.pages` pages of [`pattern`](super::common::pattern)) lives
//! in [`default_dir`] — tmpfs `/dev/shm` when it exists — so its contents
//! are always in the kernel's page cache. One **pass** reads one `u64` word
//! per page, in page order, through a **fresh mapping**, and checks it:
//!
//! - **engine pass**: [`Pager::map_store`](crate::Pager::map_store) of a
//!   [`FileStore`] over the file (opened once; `k.install` kind, mapped
//!   per [`read_map_options`]), scan, unmap. The new mapping has a new
//!   object, so its page cache starts empty and every page comes from the
//!   store — a `pread` of the warm tmpfs file — through real userfaultfd
//!   faults (with the engine's own fault-around and read-ahead).
//! - **kernel pass**: `mmap(PROT_READ, MAP_SHARED)` of the same file (same
//!   descriptor), scan, `munmap`. The page cache is warm, so every fault is
//!   a minor page-cache fault (with the kernel's fault-around).
//!
//! Both timings include map, scan and unmap. So the comparison is "scan a
//! warm file once through a new mapping": the engine's cold-per-mapping
//! cost (store read + install) against the kernel's minor-fault cost. A
//! warm-up pass of each runs first, untimed; then engine and kernel passes
//! alternate until `k.duration` is up (at least one of each). The engine's
//! budget is raised to at least the file size so that a pass measures fault
//! service, not reclaim. `k.threads` is not used (one scanner); `k.writers`
//! writer threads run on the engine's pager throughout.

use super::common::{cpu_time, Knobs, RunResult, Writers};
use super::random::{default_dir, pattern_word, read_map_options, PatternFile};
use crate::error::{Error, Result};
use crate::store::FileStore;
use crate::sys::PAGE_SIZE;
use crate::{MapOptions, Pager};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Reads one word per page of `[base, base + pages × PAGE_SIZE)` in order;
/// returns the words that differ from the pattern.
///
/// # Safety
/// The range must be mapped readable and hold the pattern file's bytes.
unsafe fn scan_pass(base: usize, pages: usize) -> u64 {
    let mut bad = 0;
    for p in 0..pages {
        let off = p * PAGE_SIZE + 8 * (p % (PAGE_SIZE / 8));
        // SAFETY: inside the mapped range (caller's contract), 8-aligned.
        let v = unsafe { std::ptr::read_volatile((base + off) as *const u64) };
        bad += (v != pattern_word(off)) as u64;
    }
    bad
}

/// What one timed pass measured.
#[derive(Debug, Default, Clone, Copy)]
struct Pass {
    /// Words that differed from the pattern.
    bad: u64,
    /// Wall time of map + scan + unmap.
    wall: Duration,
    /// CPU time of the same (engine passes only).
    cpu: Duration,
    /// The part of `wall` spent mapping and unmapping.
    map_unmap: Duration,
}

/// One engine pass: map, scan, unmap.
fn engine_pass(
    pager: &Pager,
    store: &Arc<FileStore>,
    pages: usize,
    opts: &MapOptions,
) -> Result<Pass> {
    let (t, c) = (Instant::now(), cpu_time());
    let region = pager.map_store(store.clone(), pages * PAGE_SIZE, opts)?;
    let mapped = t.elapsed();
    // SAFETY: the region maps the pattern file and lives across the call.
    let bad = unsafe { scan_pass(region.as_ptr() as usize, pages) };
    let scanned = t.elapsed();
    region.unmap()?;
    let (wall, cpu) = (t.elapsed(), cpu_time() - c);
    Ok(Pass {
        bad,
        wall,
        cpu,
        map_unmap: wall - scanned + mapped,
    })
}

/// One kernel pass over `file`: mmap, scan, munmap.
fn kernel_pass(file: &std::fs::File, pages: usize) -> Result<Pass> {
    let len = pages * PAGE_SIZE;
    let t = Instant::now();
    // SAFETY: a fresh shared read-only mapping of an open file; no existing
    // memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::sys("mmap", crate::sys::errno()));
    }
    let mapped = t.elapsed();
    // SAFETY: `p` maps `len` bytes of the pattern file, readable.
    let bad = unsafe { scan_pass(p as usize, pages) };
    let scanned = t.elapsed();
    // SAFETY: unmapping exactly the mapping made above, no longer used.
    unsafe { libc::munmap(p, len) };
    let wall = t.elapsed();
    Ok(Pass {
        bad,
        wall,
        cpu: Duration::ZERO,
        map_unmap: wall - scanned + mapped,
    })
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
/// throughput relative to the kernel's mmap; 1.0 = as fast), `passes` (timed
/// passes of each), `file_pages`, `mismatches` (both sides; 0 unless
/// broken), `writer_loops`, and `engine_map_unmap_us_per_pass` /
/// `kernel_map_unmap_us_per_pass` (the part of a pass spent in map and
/// unmap, included in the per-page figures).
pub fn run_in(k: &Knobs, dir: &Path) -> Result<RunResult> {
    let pages = k.pages.max(1);
    let file = PatternFile::create(dir, "scan", pages)?;
    let budget = if k.budget_pages == 0 {
        0
    } else {
        k.budget_pages.max(pages as u64)
    };
    let pager = Arc::new(k.builder().budget_pages(budget).build()?);
    let store = Arc::new(file.store(k.install)?);
    let opts = read_map_options(k.install);
    // Warm-up, untimed: the kernel's mapping path and the engine's.
    let mut mismatches = kernel_pass(file.file(), pages)?.bad;
    mismatches += engine_pass(&pager, &store, pages, &opts)?.bad;

    pager.reset_stats();
    let deadline = Instant::now() + k.duration;
    let writers = Writers::start(&pager, k.writers, k.writer_pause);
    let (mut engine, mut kernel) = (Pass::default(), Pass::default());
    let mut passes = 0u64;
    let timed = (|| -> Result<()> {
        while passes == 0 || Instant::now() < deadline {
            // Alternate which side goes first, so neither always follows
            // the other's cache footprint.
            let even = passes.is_multiple_of(2);
            for engine_side in [even, !even] {
                let (p, sum) = if engine_side {
                    (engine_pass(&pager, &store, pages, &opts)?, &mut engine)
                } else {
                    (kernel_pass(file.file(), pages)?, &mut kernel)
                };
                sum.bad += p.bad;
                sum.wall += p.wall;
                sum.cpu += p.cpu;
                sum.map_unmap += p.map_unmap;
            }
            passes += 1;
        }
        Ok(())
    })();
    let writer_loops = writers.stop();
    timed?;
    mismatches += engine.bad + kernel.bad;
    let stats = pager.stats();
    let scanned = passes * pages as u64;
    let ns_per_page = |d: Duration| d.as_nanos() as f64 / scanned as f64;
    let us_per_pass = |d: Duration| d.as_nanos() as f64 / 1e3 / passes as f64;
    let (engine_ns, kernel_ns) = (ns_per_page(engine.wall), ns_per_page(kernel.wall));
    Ok(RunResult {
        workload: "scan",
        label: k.policy.to_string(),
        ops: scanned,
        unit: "pages",
        elapsed: engine.wall,
        cpu: engine.cpu,
        stats,
        latency: None,
        extra: vec![
            ("engine_ns_per_page", engine_ns),
            ("kernel_mmap_ns_per_page", kernel_ns),
            ("ratio", kernel_ns / engine_ns.max(1e-9)),
            (
                "engine_map_unmap_us_per_pass",
                us_per_pass(engine.map_unmap),
            ),
            (
                "kernel_map_unmap_us_per_pass",
                us_per_pass(kernel.map_unmap),
            ),
            ("passes", passes as f64),
            ("file_pages", pages as f64),
            ("mismatches", mismatches as f64),
            ("writer_loops", writer_loops as f64),
        ],
    })
}
