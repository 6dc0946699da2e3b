//! `random` (the shape of UMap's `pfbenchmark-read`): one region backed by a
//! real file four times the memory budget, `k.threads` threads each reading
//! one `u64` word per uniformly random page until `k.duration` is up. With
//! the file 4× the budget, about three reads in four miss and reclaim runs
//! all the time. The file holds [`pattern`](super::common::pattern) and every word read is checked
//! against it. Throughput is page reads/s.
//!
//! The file is created (and unlinked at once) in [`default_dir`] — tmpfs
//! `/dev/shm` when it exists, so the store's `pread`s measure the pager
//! rather than a disk — or in a directory the caller names ([`run_in`]).
//! It is mapped read-only through a read-only [`FileStore`](uffd_pager::store::FileStore) with
//! `k.install` as install kind (see [`read_map_options`]).

use super::common::{cpu_time, mib, Knobs, RunResult, Writers};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::{Result, PAGE_SIZE};

pub use super::pattern_file::{
    default_dir, file_pages, pattern_word, read_map_options, PatternFile,
};
use super::pattern_file::{random_map_options, RandomWords};

/// Runs `random` with its file in [`default_dir`].
pub fn run(k: &Knobs) -> Result<RunResult> {
    run_in(k, &default_dir())
}

/// Whether [`crate::bench::random_floor`] does the work of this run: a
/// budget, reads only, 4 KiB pages, no global-lock writers beside the
/// readers (the floor has none), and in-thread delivery (the floor's
/// handler runs in the faulting thread: beside handler threads it would
/// leave out their wake-ups, found by review).
fn floor_is_comparable(k: &Knobs) -> bool {
    k.floor
        && k.budget_pages > 0
        && k.write_pct == 0
        && k.writers == 0
        && k.page_size == PAGE_SIZE
        && k.delivery.is_in_thread()
}

/// Runs `random` with its file in `dir`.
///
/// `ops` is page reads (all threads). Extras: `us_per_page` (wall time per
/// page per thread, `elapsed × threads / ops` in µs), `us_per_page_overall`
/// (`elapsed / ops`: wall time per page of the whole run), `floor_us_per_page`
/// (the same measure for [`crate::bench::RandomFloor`], run with the same
/// threads, budget and duration, in [`slices`] alternated with the
/// engine's: engine, floor, engine, floor…, each slice with its own seed
/// and the same on both sides; NaN without the floor (`k.floor` false)
/// or where the floor would do other work: without a budget, with
/// writes, writers, 2 MiB pages or handler threads),
/// `vs_floor` (their ratio), `mismatches` (words that differed from the
/// pattern, engine and floor; 0 unless one is broken),
/// `file_pages`, `writer_loops`, `footprint_mib` (what the pager held at
/// the end, [`uffd_pager::Pager::memory_use`]).
pub fn run_in(k: &Knobs, dir: &Path) -> Result<RunResult> {
    let pages = file_pages(k);
    let file = PatternFile::create(dir, "random", pages)?;
    let pager = Arc::new(k.pager()?);
    let opts = k.sized(random_map_options(k.install, k.write_pct));
    let store = Arc::new(file.store_rw(k.write_pct > 0)?);
    // SAFETY: the workload's stores and files are its own, and it changes them only through its
    // regions (the store contract).
    let region = unsafe { pager.map_store(store, pages * PAGE_SIZE, &opts) }?;
    let base = region.as_ptr() as usize;
    let mismatches = AtomicU64::new(0);
    let threads = k.threads.max(1);
    // The raw floor, same reads, same threads, same budget, in slices
    // alternated with the engine's. Only where it does the same work: it
    // reads 4 KiB pages and nothing competes with it (none beside a run
    // that writes, one with global-lock writers, or one of 2 MiB pages).
    let mut floor = if floor_is_comparable(k) {
        Some(crate::bench::RandomFloor::new(
            dir,
            k.budget_pages as usize,
            threads,
            opts.install_kind(),
            opts.kernel_maps,
        )?)
    } else {
        None
    };
    let slices = if floor.is_some() {
        slices(k.duration)
    } else {
        1
    };
    let slice = k.duration / slices;
    let mut floor_report = crate::bench::RandomFloorReport::default();
    pager.reset_stats();
    let (mut elapsed, mut cpu, mut reads) = (Duration::ZERO, Duration::ZERO, 0);
    let mut writer_loops = 0;
    for n in 0..slices {
        // Each slice reads its own sequence, the same on both sides.
        let seed = k.seed.wrapping_add((n as u64) << 32);
        let (t0, c0) = (Instant::now(), cpu_time());
        let deadline = t0 + slice;
        let writers = Writers::start(&pager, k, deadline)?;
        let words = RandomWords {
            seed,
            ..RandomWords::of(k, pages, deadline)
        };
        // SAFETY: the region maps `pages` pages of the file, writable when
        // writes are asked for, and outlives the call.
        reads += unsafe { words.run(base, &mismatches, None) }?;
        writer_loops += writers.stop();
        (elapsed, cpu) = (elapsed + t0.elapsed(), cpu + (cpu_time() - c0));
        if let Some(f) = floor.as_mut() {
            floor_report.add(&f.run(slice, seed)?);
        }
    }
    let stats = pager.stats();
    let footprint = pager.memory_use();
    drop(region);
    drop(file);
    drop(pager);
    let us_per_page = elapsed.as_secs_f64() * threads as f64 / reads.max(1) as f64 * 1e6;
    let floor_us = if floor.is_some() {
        mismatches.fetch_add(floor_report.mismatches, Relaxed);
        floor_report.us_per_page(threads)
    } else {
        f64::NAN
    };
    // Misses per read on each side: the floor keeps exactly `budget`
    // pages, the engine stays under its high watermark (a thirty-second
    // below the budget), so it misses a little more often (found by
    // review: the ratio above charges the engine for that too).
    let faults_per_read = stats.get(uffd_pager::Counter::PGFAULT) as f64 / reads.max(1) as f64;
    let floor_faults_per_read = if floor.is_some() {
        floor_report.faults as f64 / floor_report.reads.max(1) as f64
    } else {
        f64::NAN
    };
    Ok(RunResult {
        workload: "random",
        label: k.policy.to_string(),
        ops: reads,
        unit: "page reads",
        elapsed,
        cpu,
        stats,
        latency: None,
        extra: vec![
            ("us_per_page", us_per_page),
            ("us_per_page_overall", us_per_page / threads as f64),
            ("floor_us_per_page", floor_us),
            ("vs_floor", us_per_page / floor_us),
            ("faults_per_read", faults_per_read),
            ("floor_faults_per_read", floor_faults_per_read),
            ("mismatches", mismatches.load(Relaxed) as f64),
            ("file_pages", pages as f64),
            ("writer_loops", writer_loops as f64),
            ("footprint_mib", mib(footprint.total_bytes())),
        ],
        install: Some(opts.install_kind()),
    })
}

/// How many slices of a run alternate the engine with its floor: one per
/// half second (at least one, at most 20), so that a change in the
/// machine's speed during the run (a noisy neighbour, the host's clock)
/// falls on both sides alike rather than on whichever ran second.
pub fn slices(duration: Duration) -> u32 {
    (duration.as_millis() / 500).clamp(1, 20) as u32
}
