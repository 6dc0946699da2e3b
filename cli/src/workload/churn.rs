//! `populate-churn` (seed 002): the `stress-ng --mremap-bytes 4K` shape.
//! Each op maps one anonymous page with populate, touches it and unmaps
//! it: the LRU lock is taken on the way in (the populate drain) and on the
//! way out (release). Compares drain policies and LRU shards.

use super::common::{cpu_time, join_sum, spawn_scoped, Knobs, RunResult};
use std::time::Instant;
use uffd_pager::{Counter, DrainPolicy, Result, PAGE_SIZE};

/// Runs `populate-churn` with `drain` and `shards`.
pub fn run(k: &Knobs, drain: DrainPolicy, shards: usize) -> Result<RunResult> {
    let pager = k
        .builder()
        // A page per thread at a time: a budget that never evicts (the
        // command line refuses --budget here).
        .budget_pages(k.budget_pages.max(1 << 16))
        .kswapd(false)
        .drain_policy(drain)
        .lru_shards(shards)
        .build()?;
    pager.reset_stats();
    let (t0, c0) = (Instant::now(), cpu_time());
    let deadline = t0 + k.duration;
    let ops: Result<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..k.threads)
            .map(|_| {
                let pager = &pager;
                spawn_scoped(s, move || -> Result<u64> {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let mut r = pager.map_anonymous(PAGE_SIZE)?;
                        r.populate(0, PAGE_SIZE)?;
                        r.as_mut_slice()[0] = n as u8;
                        drop(r);
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        join_sum(hs)
    });
    let (elapsed, cpu) = (t0.elapsed(), cpu_time() - c0);
    let ops = ops?;
    let stats = pager.stats();
    let per_op = |c| stats.get(c) as f64 / ops.max(1) as f64;
    let extra = vec![
        ("lru_lock_per_op", per_op(Counter::LRU_LOCK)),
        ("lru_contended_per_op", per_op(Counter::LRU_LOCK_CONTENDED)),
        ("shards", shards as f64),
    ];
    Ok(RunResult {
        workload: "populate-churn",
        label: format!("{drain}/{shards}"),
        ops,
        unit: "ops",
        elapsed,
        cpu,
        stats,
        latency: None,
        extra,
        install: None,
    })
}
