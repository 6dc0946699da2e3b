//! Scripted LRU scenarios (seed 002): LRU-lock acquisitions per
//! single-page populate/unmap under each drain policy, and sharding.

use uffd_pager::{Counter, DrainPolicy, Pager};

const PAGE: usize = 4096;
const OPS: u64 = 310;

/// Keeps the calling thread on one CPU, so the per-CPU add batch that
/// populate fills is the one it drains.
fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t is valid; we set one bit and apply it to
    // the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// `OPS` rounds of map one page → populate → touch → unmap; returns LRU
/// lock acquisitions per op and the pager.
fn churn(drain: DrainPolicy, shards: usize) -> (f64, Pager) {
    let pager = Pager::builder()
        .budget_pages(1 << 16)
        .kswapd(false)
        .drain_policy(drain)
        .lru_shards(shards)
        .build()
        .unwrap();
    let run = || {
        pin_to_cpu0();
        pager.reset_stats();
        for i in 0..OPS {
            let mut r = pager.map_anonymous(PAGE).unwrap();
            r.populate(0, PAGE).unwrap();
            r.as_mut_slice()[0] = i as u8;
            assert_eq!(r.as_slice()[0], i as u8);
            drop(r);
        }
        pager.stats().get(Counter::LRU_LOCK) as f64 / OPS as f64
    };
    let per_op = std::thread::scope(|s| s.spawn(run).join().unwrap());
    (per_op, pager)
}

#[test]
fn always_takes_the_lru_lock_twice_per_op() {
    let (per_op, _) = churn(DrainPolicy::Always, 1);
    assert_eq!(per_op, 2.0, "one drain on populate, one release on unmap");
}

#[test]
fn locked_only_batches_the_populate_side() {
    let (per_op, _) = churn(DrainPolicy::LockedOnly, 1);
    // A batch of 31 moves to the LRU once per 31 populates (1 lock), and
    // only the page still mapped then is on the LRU at its unmap (1 lock).
    let expected = 2.0 / 31.0;
    assert!(
        (per_op - expected).abs() < 0.02,
        "{per_op} LRU-lock acquisitions per op, expected about {expected}"
    );
    let (never, _) = churn(DrainPolicy::Never, 1);
    assert!(never < 0.1, "{never}");
}

#[test]
fn shards_spread_the_acquisitions() {
    let (per_op, pager) = churn(DrainPolicy::Always, 4);
    assert_eq!(per_op, 2.0);
    let counts = pager.lru_shard_counts();
    assert_eq!(counts.len(), 4);
    let total: u64 = counts.iter().map(|c| c.0).sum();
    for (i, &(acq, _)) in counts.iter().enumerate() {
        assert!(acq > 0, "shard {i} unused: {counts:?}");
        assert!(
            acq * 2 < total,
            "shard {i} took most acquisitions: {counts:?}"
        );
    }
}
