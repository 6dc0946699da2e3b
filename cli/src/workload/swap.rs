//! `swap` (seeds 003 and 004): one anonymous region with non-zero contents
//! under a budget below its size, so the background reclaimer keeps pushing
//! it out to swap; reader threads fault it back in, all walking the same
//! page order so concurrent faults on one page are common (the
//! `uptodate-no-retry` case); `writers` threads map and unmap unrelated
//! regions to contend on the global lock. Throughput is page reads/s.

use super::common::{
    cpu_time, mib, pattern_aligned_word, pattern_stores, sum_over_threads, Knobs, Rng, RunResult,
    Writers,
};
use super::deadline::Deadline;
use super::noise::Noise;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::Instant;
use uffd_pager::{InstallKind, MapOptions, Result, PAGE_SIZE};

/// Runs `swap`; `k.pages` is the region size in pages.
pub fn run(k: &Knobs) -> Result<RunResult> {
    let far = k.far("swap")?;
    let pager = Arc::new(k.pager_far(far.as_ref())?);
    let swap = pattern_stores(k, far.as_deref(), "swap", k.pages, 1)?.remove(0);
    // SAFETY: the workload's stores and files are its own, and it changes them only through its
    // regions (the store contract).
    let region = unsafe {
        pager.map_store(
            swap.clone(),
            k.pages * PAGE_SIZE,
            &k.sized(MapOptions {
                kind: Some(InstallKind::Anonymous),
                ..MapOptions::default()
            }),
        )
    }?;
    let mut order: Vec<u32> = (0..k.pages as u32).collect();
    Rng::new(k.seed).shuffle(&mut order);
    let base = region.as_ptr() as usize;
    let mismatches = AtomicU64::new(0);
    pager.reset_stats();
    let (t0, c0) = (Instant::now(), cpu_time());
    let deadline = t0 + k.duration;
    let writers = Writers::start(&pager, k, deadline)?;
    let noise = Noise::start(k.noise, deadline)?;
    let stop = Deadline::start(deadline)?;
    let reads = sum_over_threads(k.threads, |_| {
        let mut n = 0u64;
        'run: loop {
            for &p in &order {
                // Before every read: one of them may wait out a long store
                // latency.
                if stop.passed() {
                    break 'run;
                }
                let off = p as usize * PAGE_SIZE + 8 * (p as usize % 512);
                // A whole word, not one byte: another page's bytes passed
                // one read in 256 (found by review).
                // SAFETY: inside the region, which outlives the threads;
                // `off` is 8-aligned and the region page-aligned.
                let v = unsafe { std::ptr::read_volatile((base + off) as *const u64) };
                if v != pattern_aligned_word(off) {
                    mismatches.fetch_add(1, Relaxed);
                }
                n += 1;
            }
        }
        n
    })?;
    let writer_loops = writers.stop();
    let (noise_loops, noise_prioritised) = noise.stop();
    let (elapsed, cpu) = (t0.elapsed(), cpu_time() - c0);
    let stats = pager.stats();
    let footprint = pager.memory_use();
    drop(region);
    Ok(RunResult {
        workload: "swap",
        label: k.policy.to_string(),
        ops: reads,
        unit: "page reads",
        elapsed,
        cpu,
        stats,
        latency: swap.latency_report(),
        extra: vec![
            ("mismatches", mismatches.load(Relaxed) as f64),
            ("writer_loops", writer_loops as f64),
            ("noise_loops", noise_loops as f64),
            ("noise_prioritised", noise_prioritised as f64),
            ("footprint_mib", mib(footprint.total_bytes())),
            ("swap_in_memory_mib", mib(footprint.swap_bytes)),
        ],
        install: Some(InstallKind::Anonymous),
    })
}
