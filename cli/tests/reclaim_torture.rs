//! Reclaim torture ([`uffd_pager_cli::workload::torture`]): random checked reads
//! and writes over a region four to eight times the budget, with reclaim
//! and write-back running all the time, for every backing and delivery.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use uffd_pager::{Counter, Delivery, InstallKind};
use uffd_pager_cli::workload::torture::{run, TortureConfig, TortureKind, TortureReport};

const THREADS: Delivery = Delivery::Threads {
    threads: 2,
    spin_us: 0,
};

/// A unique path in the temporary directory, removed on drop.
struct TempPath(PathBuf);

impl TempPath {
    fn new(tag: &str) -> TempPath {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        TempPath(std::env::temp_dir().join(format!(
            "uffd-reclaim-torture-{tag}-{}-{n}.bin",
            std::process::id()
        )))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn config(kind: TortureKind, delivery: Delivery, seed: u64) -> TortureConfig {
    TortureConfig {
        threads: 3,
        pages: 512,
        budget_pages: 64,
        ops_per_thread: 12_000,
        write_pct: 40,
        seed,
        kind,
        install: InstallKind::Shared,
        delivery,
        ..TortureConfig::default()
    }
}

/// Resident pages may pass the budget by the reads in flight (each
/// charges before it reclaims directly): one per faulting thread (the
/// application threads, plus handler threads), and one run per readahead
/// thread (the pager's default 2; a run from a disk file or swap file is
/// up to a sixteenth of the budget, `readahead::run_limit`; a 2 MiB page
/// is read ahead only within the budget), and a little more. (CI once saw
/// 79 with a budget of 64, 3 threads and a swap file: one over a bound
/// that left readahead out.)
fn slack(cfg: &TortureConfig) -> u64 {
    let handlers = match cfg.delivery {
        Delivery::InThread => 0,
        Delivery::Threads { threads, .. } => threads,
        Delivery::PerRegion => 1,
    };
    let readahead = match cfg.page_size {
        uffd_pager::HUGE_PAGE_SIZE => 0,
        _ => 2 * (cfg.budget_pages / 16).max(1),
    };
    2 * (cfg.threads + handlers) as u64 + readahead + 8
}

#[track_caller]
fn check(cfg: &TortureConfig, r: &TortureReport, expect_writeback: bool) {
    println!("{:?} {}: {r}", cfg.kind, cfg.delivery);
    let s = &r.stats;
    assert_eq!(r.mismatches, 0, "{r}");
    assert_eq!(r.ops, cfg.ops_per_thread * cfg.threads as u64);
    assert!(r.reads > 0, "{r}");
    assert_eq!(r.writes > 0, cfg.write_pct > 0, "{r}");
    assert!(r.words_verified >= (cfg.pages * 512) as u64, "{r}");
    assert!(s.get(Counter::PGSTEAL) > 0, "the pager never evicted: {r}");
    assert!(
        s.get(Counter::PGMAJFAULT) > 0,
        "no page was ever read back: {r}"
    );
    if expect_writeback {
        assert!(s.get(Counter::WRITEBACK) > 0, "nothing written back: {r}");
    }
    assert_eq!(s.budget_pages, cfg.budget_pages);
    assert!(
        s.peak_resident_pages <= cfg.budget_pages + slack(cfg),
        "peak resident {} over budget {} + slack {}: {r}",
        s.peak_resident_pages,
        cfg.budget_pages,
        slack(cfg)
    );
    // Everything was unmapped: nothing may stay charged.
    assert_eq!(s.resident_pages, 0, "pages left charged after unmap: {r}");
}

fn file_torture(delivery: Delivery, install: InstallKind, seed: u64) {
    let path = TempPath::new("file");
    let cfg = TortureConfig {
        install,
        ..config(
            TortureKind::File {
                path: path.0.clone(),
            },
            delivery,
            seed,
        )
    };
    let r = run(&cfg).expect("torture run");
    check(&cfg, &r, true);
    // The file is read back at the end whatever the install kind: against
    // the model (shared), or against its initial pattern (anonymous: a
    // private copy must never write its file).
    assert_eq!(
        r.words_verified,
        2 * (cfg.pages * 512) as u64,
        "the file was not read back: {r}"
    );
}

fn anon_torture(delivery: Delivery, swapfile: bool, seed: u64) {
    let kind = if swapfile {
        TortureKind::Swapfile {
            dir: std::env::temp_dir(),
        }
    } else {
        TortureKind::Anonymous
    };
    let cfg = config(kind, delivery, seed);
    let r = run(&cfg).expect("torture run");
    check(&cfg, &r, true);
}

/// The soak's side-region churn (maps, writes, remaps, protects, drops and
/// unmaps side regions of the same pager) runs beside the torture and finds
/// every byte it wrote. No test ran it before.
#[test]
fn churn_beside_the_torture_is_clean() {
    let cfg = TortureConfig {
        churn: true,
        ..config(TortureKind::Anonymous, Delivery::InThread, 23)
    };
    let r = run(&cfg).expect("torture run");
    check(&cfg, &r, true);
    assert!(r.churn_ops > 0, "the churn did nothing: {r}");
    assert_eq!(r.churn_mismatches, 0, "{r}");
    assert!(r.is_clean(), "{r}");
}

#[test]
fn file_shared_in_thread() {
    file_torture(Delivery::InThread, InstallKind::Shared, 11);
}

#[test]
fn file_shared_handler_threads() {
    file_torture(THREADS, InstallKind::Shared, 12);
}

#[test]
fn file_anonymous_install_in_thread() {
    file_torture(Delivery::InThread, InstallKind::Anonymous, 13);
}

#[test]
fn anonymous_memory_swap_in_thread() {
    anon_torture(Delivery::InThread, false, 21);
}

#[test]
fn anonymous_memory_swap_handler_threads() {
    anon_torture(THREADS, false, 22);
}

#[test]
fn file_shared_per_region() {
    file_torture(Delivery::PerRegion, InstallKind::Shared, 13);
}

#[test]
fn anonymous_memory_swap_per_region() {
    // Eviction moves pages out of the region (its own descriptor) into the
    // staging area (the pager's): the move is issued on the destination's.
    anon_torture(Delivery::PerRegion, false, 23);
}

#[test]
fn anonymous_swapfile_in_thread() {
    anon_torture(Delivery::InThread, true, 31);
}

#[test]
fn anonymous_swapfile_handler_threads() {
    anon_torture(THREADS, true, 32);
}

#[test]
fn read_only_workload_writes_nothing_back_to_the_file() {
    // No writes: eviction and the background flushes must never write a
    // page back, and the file keeps its initial pattern.
    let path = TempPath::new("ro");
    let cfg = TortureConfig {
        write_pct: 0,
        threads: 2,
        ops_per_thread: 8_000,
        ..config(
            TortureKind::File {
                path: path.0.clone(),
            },
            Delivery::InThread,
            41,
        )
    };
    let r = run(&cfg).expect("torture run");
    check(&cfg, &r, false);
    assert_eq!(r.writes, 0);
    assert_eq!(r.stats.get(Counter::WRITEBACK), 0, "{r}");
}

#[test]
fn bad_configurations_are_refused() {
    let small = TortureConfig {
        pages: 100,
        budget_pages: 64,
        ..TortureConfig::default()
    };
    assert!(run(&small).is_err(), "region under 4x the budget");
    let unbounded = TortureConfig {
        budget_pages: 0,
        ..TortureConfig::default()
    };
    assert!(
        run(&unbounded).is_err(),
        "no budget: nothing would be evicted"
    );
    let no_threads = TortureConfig {
        threads: 0,
        ..TortureConfig::default()
    };
    assert!(run(&no_threads).is_err());
}

#[path = "../../tests/huge_util.rs"]
mod huge_util;

#[test]
fn torture_on_2_mib_pages_for_every_backing_and_delivery() {
    let _pool = huge_util::HugePool::take(8);
    let units = (uffd_pager::HUGE_PAGE_SIZE / uffd_pager::PAGE_SIZE) as u64;
    for delivery in [Delivery::InThread, THREADS] {
        for install in [InstallKind::Shared, InstallKind::Anonymous] {
            let path = TempPath::new("huge");
            let mut cfg = config(
                TortureKind::File {
                    path: path.0.clone(),
                },
                delivery,
                7,
            );
            cfg.page_size = uffd_pager::HUGE_PAGE_SIZE;
            cfg.install = install;
            // 16 pages of 2 MiB over a budget of 4.
            cfg.pages = 16 * units as usize;
            cfg.budget_pages = 4 * units;
            cfg.ops_per_thread = 1_500;
            let r = run(&cfg).unwrap();
            println!("{install} {delivery}: {r}");
            let s = &r.stats;
            assert_eq!(r.mismatches, 0, "{r}");
            assert!(s.get(Counter::PGSTEAL) > 0, "never evicted: {r}");
            assert!(s.get(Counter::WRITEBACK) > 0, "nothing written back: {r}");
            // As `slack`, in huge pages: an eviction of one takes long (a
            // 2 MiB copy and write), so more faults pass the budget
            // meanwhile.
            assert!(
                s.peak_resident_pages <= cfg.budget_pages + (slack(&cfg) - 6) * units,
                "peak {}: {r}",
                s.peak_resident_pages
            );
            assert_eq!(s.resident_pages, 0, "pages left charged: {r}");
        }
        let mut cfg = config(TortureKind::Anonymous, delivery, 8);
        cfg.page_size = uffd_pager::HUGE_PAGE_SIZE;
        cfg.pages = 16 * units as usize;
        cfg.budget_pages = 4 * units;
        cfg.ops_per_thread = 1_500;
        let r = run(&cfg).unwrap();
        assert_eq!(r.mismatches, 0, "anonymous {delivery}: {r}");
        assert!(r.stats.get(Counter::PGSTEAL) > 0, "{r}");
    }
}
