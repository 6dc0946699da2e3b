//! `--page-size 2M` on the benches that time faults and evictions against
//! a floor (`fault-cost`, `evict`, `wakeup`, `scale`, `metadata`, `far`):
//! each runs on 2 MiB pages end to end (both sides check every page they
//! read), says so, and answers an empty pool with the typed error's
//! message. The workload benches' `--page-size` is covered with the
//! workloads (`workload_random_scan_launch.rs`, `kernel_baseline.rs`),
//! but for filemap's default budget here.

#[path = "../../tests/huge_util.rs"]
mod huge_util;

mod cli_util;

use cli_util::run;

/// Runs `args`, asserts exit 0 and that stdout mentions every one of
/// `needles`; returns stdout.
fn ok(args: &[&str], needles: &[&str]) -> String {
    let o = run(args);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{args:?}: {:?}\nstdout: {out}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    for n in needles {
        assert!(out.contains(n), "{args:?}: no {n:?} in\n{out}");
    }
    out
}

/// The figures of a `fault-cost` table row: floor, engine, ratio, median.
fn row_figures(out: &str, kind: &str) -> Vec<f64> {
    let line = out
        .lines()
        .find(|l| l.starts_with(kind))
        .unwrap_or_else(|| panic!("no {kind} row in\n{out}"));
    line.split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

#[test]
fn fault_bench_floors_run_on_2_mib_pages() {
    // fault-cost holds a pass of each side at once (4 + 4); wakeup holds
    // every configuration's pages (4 configurations x 2 faulters x 2).
    let _pool = huge_util::HugePool::take(16);
    let out = ok(
        &[
            "bench",
            "fault-cost",
            "--page-size",
            "2M",
            "--pages",
            "4",
            "--passes",
            "2",
        ],
        &["4 pages of 2 MiB"],
    );
    for kind in ["anonymous", "shared"] {
        let f = row_figures(&out, kind);
        assert_eq!(f.len(), 4, "{kind}: {out}");
        // A 2 MiB fault copies 2 MiB: it cannot take under 20 µs (about
        // 100 GB/s), where a 4 KiB one takes about 2.
        assert!(f[0] > 20.0 && f[1] > 20.0, "{kind}: {out}");
    }
    ok(
        &[
            "bench",
            "evict",
            "--page-size",
            "2M",
            "--pages",
            "4",
            "--passes",
            "1",
        ],
        &["4 installed pages of 2 MiB", "anonymous", "shared"],
    );
    ok(
        &[
            "bench",
            "wakeup",
            "--page-size",
            "2M",
            "--faulters",
            "2",
            "--pages",
            "2",
            "--passes",
            "1",
        ],
        &["2 faulters × 2 pages of 2 MiB", "one descriptor per region"],
    );
    ok(
        &[
            "bench",
            "scale",
            "--page-size",
            "2M",
            "--few",
            "2",
            "--many",
            "64",
            "--faults",
            "8",
            "--passes",
            "1",
        ],
        &["8 faults at random pages of 2 MiB"],
    );
    let out = ok(
        &[
            "bench",
            "metadata",
            "--page-size",
            "2M",
            "--pages",
            "4096",
            "--budget",
            "4",
            "--touch",
            "8",
        ],
        &["4096 pages of 2 MiB", "per tracked 4 KiB"],
    );
    assert!(out.contains(": MET"), "{out}");
    // The hop is measured on 4 KiB pages only.
    let o = run(&["bench", "fault-cost", "--page-size", "2M", "--hop"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}

/// filemap's default budget (512 KiB) is raised to the two 2 MiB pages a
/// budget of them needs; before, the engine refused it (exit 1).
#[test]
fn filemap_runs_on_2_mib_pages_with_its_default_budget() {
    let _pool = huge_util::HugePool::take(8);
    ok(
        &[
            "bench",
            "filemap",
            "--page-size",
            "2M",
            "--policy",
            "vanilla",
            "--threads",
            "1",
            "--duration",
            "0.2",
        ],
        &["filemap"],
    );
}

#[test]
fn an_empty_pool_is_named_not_faulted_on() {
    let pool = huge_util::HugePool::take(0);
    let _none = pool.drain();
    for args in [
        &["bench", "fault-cost", "--page-size", "2M", "--pages", "2"][..],
        &["bench", "evict", "--page-size", "2M", "--pages", "2"],
        &["bench", "wakeup", "--page-size", "2M", "--pages", "1"],
        &["bench", "scale", "--page-size", "2M", "--faults", "2"],
        // (Before the store is filled: the server here is never reached.)
        &[
            "bench",
            "far",
            "--store",
            "redis://127.0.0.1:1",
            "--page-size",
            "2M",
            "--pages",
            "2",
        ],
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        assert!(err.contains("nr_hugepages"), "{args:?}: {err}");
    }
}

/// A run that writes a file as large as its region (torture's file kind,
/// scan's tmpfs file) looks at the pool before it writes: it wrote 4 GiB
/// (13 s) before the map found the pool empty. Here a file-size limit of
/// 64 KiB kills a run that writes first (SIGXFSZ).
#[test]
fn an_empty_pool_is_named_before_files_are_written() {
    let pool = huge_util::HugePool::take(0);
    let _none = pool.drain();
    for args in [
        &[
            "torture",
            "--page-size",
            "2M",
            "--pages",
            "64",
            "--budget",
            "8",
            "--kind",
            "file",
        ][..],
        &[
            "bench",
            "scan",
            "--page-size",
            "2M",
            "--pages",
            "64",
            "--duration",
            "0.1",
        ],
    ] {
        let o = std::process::Command::new("prlimit")
            .arg("--fsize=65536")
            .arg(env!("CARGO_BIN_EXE_uffd-pager"))
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .expect("running prlimit (util-linux)");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        assert!(err.contains("nr_hugepages"), "{args:?}: {err}");
    }
}

/// Scan raises its budget to hold its file, so the pool it needs is the
/// file's, whatever --budget says: the look before the file is written
/// took --budget 2 (four pages) as enough with 8 free, and the map failed
/// after the 128 MiB file was written (here, killed by the size limit).
#[test]
fn scan_asks_the_pool_for_the_budget_it_runs_with() {
    let pool = huge_util::HugePool::take(8);
    pool.shrink_to(8);
    let args = [
        "bench",
        "scan",
        "--page-size",
        "2M",
        "--pages",
        "64",
        "--budget",
        "2",
        "--duration",
        "0.1",
    ];
    let o = std::process::Command::new("prlimit")
        .arg("--fsize=65536")
        .arg(env!("CARGO_BIN_EXE_uffd-pager"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running prlimit (util-linux)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
    assert!(err.contains("nr_hugepages"), "{args:?}: {err}");
}

#[test]
fn far_misses_run_on_2_mib_pages() {
    let Some(url) = cli_util::redis_url() else {
        return;
    };
    let _pool = huge_util::HugePool::take(4);
    ok(
        &[
            "bench",
            "far",
            "--store",
            &url,
            "--page-size",
            "2M",
            "--pages",
            "2",
            "--passes",
            "1",
        ],
        &[
            "2 pages of 2 MiB",
            "MGET of its 512 keys",
            "scan: left out with 2 MiB pages",
        ],
    );
}
