//! `filemap` (seeds 000 and 003): each worker owns a file-backed region and
//! repeats rounds of map → read one byte per page → unmap. Mapping and
//! unmapping take the global lock for write, so the workers are themselves
//! the global-lock writers; `writers` adds more. The budget is far below
//! `threads × pages`, so reclaim runs all the time. Throughput is rounds/s;
//! the workers stop at the deadline even inside a round, which then does
//! not count.

use super::common::{
    cpu_time, join_sum, pattern_aligned_word, pattern_stores, spawn_scoped, Knobs, RunResult,
    Writers,
};
use super::deadline::Deadline;
use super::noise::Noise;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::Instant;
use uffd_pager::{MapOptions, Result, PAGE_SIZE};

/// Runs `filemap` with `k`; `k.pages` is the per-worker file size in pages.
pub fn run(k: &Knobs) -> Result<RunResult> {
    let far = k.far("filemap")?;
    let pager = Arc::new(k.pager_far(far.as_ref())?);
    let stores = pattern_stores(k, far.as_deref(), "filemap", k.pages, k.threads)?;
    let opts = k.sized(MapOptions {
        kind: k.install,
        writable: false,
        ..MapOptions::default()
    });
    let mismatches = AtomicU64::new(0);
    pager.reset_stats();
    let (t0, c0) = (Instant::now(), cpu_time());
    let deadline = t0 + k.duration;
    let writers = Writers::start(&pager, k, deadline)?;
    let noise = Noise::start(k.noise, deadline)?;
    let stop = Deadline::start(deadline)?;
    let rounds: Result<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = stores
            .iter()
            .map(|store| {
                let (pager, opts, mismatches, stop) = (&pager, &opts, &mismatches, &stop);
                spawn_scoped(s, move || -> Result<u64> {
                    let mut n = 0;
                    'run: while !stop.passed() {
                        // SAFETY: the stores are filled before the run and never written
                        // after: the regions are read-only, so the workers' regions that
                        // map one store at once write nothing back (the store contract).
                        let r =
                            unsafe { pager.map_store(store.clone(), k.pages * PAGE_SIZE, opts) }?;
                        for p in 0..k.pages {
                            // A round of a large region (or a slow store)
                            // may outlast the run: the round under way at
                            // the deadline is left unfinished, and uncounted.
                            if stop.passed() {
                                break 'run;
                            }
                            // A whole word, not one byte: another
                            // page's bytes passed one read in 256 (found
                            // by review).
                            let off = p * PAGE_SIZE + (p * 56) % PAGE_SIZE;
                            // SAFETY: `off` is inside the mapped region,
                            // 8-aligned in a page-aligned mapping.
                            let v = unsafe {
                                std::ptr::read_volatile(r.as_ptr().add(off) as *const u64)
                            };
                            if v != pattern_aligned_word(off) {
                                mismatches.fetch_add(1, Relaxed);
                            }
                        }
                        drop(r);
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        join_sum(hs)
    });
    let writer_loops = writers.stop();
    let (noise_loops, noise_prioritised) = noise.stop();
    let (elapsed, cpu) = (t0.elapsed(), cpu_time() - c0);
    let rounds = rounds?;
    // A run whose first round outlasts it measured nothing: an error, not
    // a rate of zero.
    if rounds == 0 {
        return Err(uffd_pager::Error::Config(format!(
            "no round of {} pages finished within the {:.3} s --duration: give a longer \
             --duration or fewer --pages",
            k.pages,
            k.duration.as_secs_f64()
        )));
    }
    Ok(RunResult {
        workload: "filemap",
        label: k.policy.to_string(),
        ops: rounds,
        unit: "rounds",
        elapsed,
        cpu,
        stats: pager.stats(),
        // (The first thread's file's: each thread's file is a store of its
        // own, with its own `--max-inflight`.)
        latency: stores[0].latency_report(),
        extra: vec![
            ("mismatches", mismatches.load(Relaxed) as f64),
            ("writer_loops", writer_loops as f64),
            ("noise_loops", noise_loops as f64),
            ("noise_prioritised", noise_prioritised as f64),
        ],
        install: Some(opts.install_kind()),
    })
}
