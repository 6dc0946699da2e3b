//! The reclaim torture over far memory, against the real servers that
//! `make test` starts (`UFFD_REDIS_URL`, `UFFD_REDIS_CLUSTER_URL`): a
//! region four times the budget, 10^6 checked operations, the object (or
//! the swap) in Redis; at the end a plain client reads the object back
//! from Redis and it must match the model word for word. Set
//! `UFFD_SKIP_REDIS=1` to skip.

use uffd_pager::{Counter, Delivery, InstallKind};
use uffd_pager_cli::far::StoreUrl;
use uffd_pager_cli::workload::torture::{run, TortureConfig, TortureKind};

fn url(var: &str, default: &str) -> Option<StoreUrl> {
    if std::env::var_os("UFFD_SKIP_REDIS").is_some_and(|v| v == "1") {
        eprintln!("skipped: UFFD_SKIP_REDIS=1");
        return None;
    }
    Some(StoreUrl(
        std::env::var(var).unwrap_or_else(|_| default.into()),
    ))
}

fn standalone() -> Option<StoreUrl> {
    url("UFFD_REDIS_URL", "redis://127.0.0.1:6390")
}

fn cluster() -> Option<StoreUrl> {
    url(
        "UFFD_REDIS_CLUSTER_URL",
        "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002",
    )
}

fn torture(kind: TortureKind, install: InstallKind, seed: u64) {
    let cfg = TortureConfig {
        threads: 2,
        pages: 4096,
        budget_pages: 1024,
        ops_per_thread: 500_000,
        write_pct: 40,
        seed,
        kind: kind.clone(),
        install,
        delivery: Delivery::InThread,
        ..TortureConfig::default()
    };
    let r =
        run(&cfg).unwrap_or_else(|e| panic!("{kind:?}: {e} (are the servers up? `make redis-up`)"));
    eprintln!(
        "{kind:?} {install}: {} ops, {} mismatches, {} words verified, writeback {}, pgmajfault {}, {:?}",
        r.ops,
        r.mismatches,
        r.words_verified,
        r.stats.get(Counter::WRITEBACK),
        r.stats.get(Counter::PGMAJFAULT),
        r.elapsed
    );
    assert_eq!(r.mismatches, 0, "{:?}", r.first_mismatches);
    assert_eq!(r.ops, 1_000_000);
    assert_eq!(r.stats.get(Counter::IO_ERROR), 0);
    assert!(r.stats.get(Counter::WRITEBACK) > 0, "pages went to Redis");
    assert!(
        r.stats.get(Counter::PGMAJFAULT) > 100_000,
        "pages came back from Redis"
    );
    let words = 4096 * 512;
    let readback = matches!(kind, TortureKind::Far { .. });
    assert_eq!(r.words_verified, if readback { 2 * words } else { words });
}

#[test]
fn an_object_in_redis_survives_a_million_operations() {
    if let Some(url) = standalone() {
        torture(TortureKind::Far { url }, InstallKind::Shared, 11);
    }
}

#[test]
fn anonymous_memory_swapped_to_redis_survives_a_million_operations() {
    if let Some(url) = standalone() {
        torture(TortureKind::FarSwap { url }, InstallKind::Anonymous, 12);
    }
}

#[test]
fn an_object_in_a_redis_cluster_survives_a_million_operations() {
    if let Some(url) = cluster() {
        torture(TortureKind::Far { url }, InstallKind::Shared, 13);
    }
}

#[test]
fn a_private_copy_of_an_object_in_a_cluster_swaps_to_the_cluster() {
    if let Some(url) = cluster() {
        torture(TortureKind::Far { url }, InstallKind::Anonymous, 14);
    }
}
