//! Per-fault cost of the engine against the raw floor loop (the same
//! userfaultfd ioctls with no engine), for each install kind and delivery
//! mode. One criterion iteration is one page fault; `iter_custom` runs
//! passes of fresh absent pages and reports the time of the touches alone
//! (map, unmap and `MADV_DONTNEED` between passes are excluded).
//!
//! `cargo bench --bench fault_cost`; `FAULT_COST_PAGES` sets the pages per
//! pass (default 1024). Floor and engine benchmarks run one after the
//! other, never concurrently (see `uffd_pager_cli::bench`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;
use uffd_pager::{Delivery, InstallKind, PAGE_SIZE};
use uffd_pager_cli::bench::{EngineLoop, FloorLoop};

/// Runs `iters` faults as passes of at most `pages` pages each, summing
/// the timed part of every pass.
fn faults(iters: u64, pages: usize, mut pass: impl FnMut(usize) -> Duration) -> Duration {
    let mut left = iters;
    let mut total = Duration::ZERO;
    while left > 0 {
        let n = left.min(pages as u64) as usize;
        total += pass(n);
        left -= n as u64;
    }
    total
}

fn fault_cost(c: &mut Criterion) {
    let pages: usize = std::env::var("FAULT_COST_PAGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1024);
    let deliveries = [
        Delivery::InThread,
        Delivery::Threads {
            threads: 1,
            spin_us: 0,
        },
    ];
    for delivery in deliveries {
        for kind in [InstallKind::Anonymous, InstallKind::Shared] {
            let mut g = c.benchmark_group(format!("fault_cost/{kind}/{delivery}"));
            g.throughput(Throughput::Elements(1))
                .sample_size(10)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(2));
            // The engine first: its process-wide SIGBUS handler must be in
            // place before the floor saves and restores the disposition.
            let mut engine =
                EngineLoop::new(pages, kind, delivery, PAGE_SIZE).expect("engine set-up");
            let mut floor = FloorLoop::new(pages, kind, delivery, PAGE_SIZE).expect("floor set-up");
            g.bench_function(BenchmarkId::new("floor", pages), |b| {
                b.iter_custom(|iters| faults(iters, pages, |n| floor.pass(n).expect("floor pass")))
            });
            g.bench_function(BenchmarkId::new("engine", pages), |b| {
                b.iter_custom(|iters| {
                    faults(iters, pages, |n| engine.pass(n).expect("engine pass"))
                })
            });
            g.finish();
        }
    }
}

criterion_group!(benches, fault_cost);
criterion_main!(benches);
