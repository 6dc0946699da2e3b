//! The seed workloads (filemap, swap, populate-churn) on a small size:
//! each runs on real faults, reads back correct data and moves the counters
//! its mechanism must move.

use std::time::Duration;
use uffd_pager::store::LatencyModel;
use uffd_pager::{Counter, DrainPolicy, InstallKind, Policy, PolicyKind};
use uffd_pager_cli::workload::{churn, filemap, swap, Knobs};

fn knobs(policy: PolicyKind) -> Knobs {
    Knobs {
        threads: 2,
        writers: 1,
        writer_pause: Duration::from_micros(100),
        duration: Duration::from_millis(300),
        policy: Policy::new(policy),
        latency: LatencyModel::Fixed { ns: 20_000 },
        pages: 32,
        budget_pages: 24,
        readahead_pages: 0,
        fault_around_pages: 0,
        ..Knobs::default()
    }
}

#[test]
fn filemap_rounds_read_correct_data_under_reclaim() {
    for policy in [PolicyKind::Vanilla, PolicyKind::RetryOnce] {
        for install in [InstallKind::Shared, InstallKind::Anonymous] {
            let k = Knobs {
                install: Some(install),
                ..knobs(policy)
            };
            let r = filemap::run(&k).unwrap();
            let s = &r.stats;
            assert!(r.ops > 0, "{policy:?} {install}: no round completed");
            assert_eq!(r.extra("mismatches"), Some(0.0), "{policy:?} {install}");
            // Every round maps a fresh region: every page is a major fault
            // that drops its lock for I/O and retries.
            assert!(s.get(Counter::PGMAJFAULT) >= r.ops * 32, "{s}");
            assert!(s.get(Counter::RETRY_MMAP_DROP) > 0, "{s}");
            assert!(s.get(Counter::VMA_LOCK_RETRY) > 0, "{s}");
            if policy == PolicyKind::RetryOnce {
                assert!(s.get(Counter::VMA_LOCK_SUCCESS) > 0, "{s}");
            } else {
                assert!(s.global.read_acquisitions > 0, "{s}");
            }
            // Two workers × 32 pages > a budget of 24: reclaim runs.
            assert!(s.get(Counter::PGSTEAL) > 0, "{s}");
            assert!(s.global.write_acquisitions >= 2 * r.ops, "{s}");
        }
    }
}

#[test]
fn swap_readers_get_their_data_back_from_swap() {
    for policy in [PolicyKind::Vanilla, PolicyKind::RetryOnce] {
        let k = Knobs {
            pages: 128,
            budget_pages: 64,
            ..knobs(policy)
        };
        let r = swap::run(&k).unwrap();
        let s = &r.stats;
        assert!(r.ops > 0);
        assert_eq!(r.extra("mismatches"), Some(0.0), "{policy:?}");
        assert!(s.get(Counter::PGMAJFAULT) > 0, "{s}");
        assert!(s.get(Counter::PGSTEAL) > 0, "{s}");
        assert!(s.peak_resident_pages <= 64 + 16, "{s}");
    }
}

#[test]
fn populate_churn_counts_lru_lock_per_op() {
    let k = Knobs {
        threads: 1,
        ..knobs(PolicyKind::RetryOnce)
    };
    let always = churn::run(&k, DrainPolicy::Always, 1).unwrap();
    let never = churn::run(&k, DrainPolicy::Never, 1).unwrap();
    assert!(always.ops > 0 && never.ops > 0);
    // About 2 per op with a drain on every populate (the thread may move
    // between CPUs, whose batches differ: allow a little slack); batching
    // cuts that by an order of magnitude.
    let a = always.extra("lru_lock_per_op").unwrap();
    let n = never.extra("lru_lock_per_op").unwrap();
    assert!((1.5..=2.0).contains(&a), "always: {a}");
    assert!(n < 0.2, "never: {n}");
}
