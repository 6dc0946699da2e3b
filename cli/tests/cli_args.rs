//! The command line's argument handling: bad arguments exit with code 2 and
//! say why on stderr, before any workload runs; `--help` and `probe` exit 0.

mod cli_util;

use cli_util::{rejects, run};

#[test]
fn unknown_subcommand() {
    rejects(&["frobnicate"], "frobnicate");
    rejects(&["bench", "nope"], "nope");
}

#[test]
fn bad_policy() {
    rejects(&["bench", "filemap", "--policy", "bogus"], "bogus");
}

#[test]
fn zero_threads() {
    rejects(&["bench", "filemap", "--threads", "0"], "--threads");
}

#[test]
fn two_swept_knobs() {
    rejects(
        &["bench", "filemap", "--threads", "2,4", "--writers", "1,2"],
        "--writers",
    );
}

#[test]
fn zero_duration() {
    rejects(&["bench", "filemap", "--duration", "0"], "--duration");
}

/// Under a millisecond a run may end before its first operation; before,
/// `bench swap --latency none --duration 1e-9` exited 0 having done none.
#[test]
fn a_duration_under_a_millisecond() {
    rejects(
        &["bench", "swap", "--latency", "none", "--duration", "1e-9"],
        "--duration",
    );
    rejects(&["demo", "--duration", "0.0001"], "--duration");
    // Before, exit 1 at the first run with advice to give "fewer --pages",
    // which the demo has not.
    rejects(
        &["demo", "--duration", "0.1"],
        "--duration 0.1 must be in [1, 600]",
    );
    rejects(&["torture", "--duration", "0.0000001"], "1 ms");
}

#[test]
fn bad_latency() {
    rejects(&["bench", "swap", "--latency", "fixed:abc"], "--latency");
}

#[test]
fn zero_fault_cost_pages() {
    rejects(&["bench", "fault-cost", "--pages", "0"], "--pages");
}

#[test]
fn torture_region_smaller_than_four_budgets() {
    rejects(
        &["torture", "--budget", "2048", "--pages", "4096"],
        "--budget",
    );
    rejects(&["torture", "--threads", "0"], "--threads");
    rejects(&["torture", "--kind", "floppy"], "floppy");
}

#[test]
fn zero_launches() {
    rejects(&["bench", "launch", "--launches", "0"], "--launches");
}

#[test]
fn missing_trace() {
    rejects(
        &["bench", "launch", "--trace", "/nonexistent/trace"],
        "/nonexistent/trace",
    );
}

#[test]
fn metadata_zero_pages() {
    rejects(&["bench", "metadata", "--pages", "0"], "--pages");
}

#[test]
fn help_exits_zero() {
    for args in [
        &["--help"][..],
        &["bench", "--help"],
        &["torture", "--help"],
        &["bench", "metadata", "--help"],
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("Usage"), "{args:?}: no usage text:\n{out}");
    }
    let o = run(&["--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    for sub in ["probe", "bench", "torture"] {
        assert!(out.contains(sub), "--help does not list {sub}:\n{out}");
    }
}

#[test]
fn probe_mentions_sigbus() {
    let o = run(&["probe"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("SIGBUS"), "probe output:\n{out}");
}

#[test]
fn probe_reports_the_huge_page_pool() {
    let o = run(&["probe"]);
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.starts_with("huge pages (2 MiB)"))
        .unwrap_or_else(|| panic!("no huge-page line in\n{out}"));
    match std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages") {
        Ok(nr) => assert!(
            line.contains(&format!(" {} reserved", nr.trim())),
            "{line} (sysfs says {nr})"
        ),
        Err(_) => assert!(line.contains("none"), "{line}"),
    }
}

/// `random` sizes its file from the budget: a budget of 0 is refused
/// rather than printing NaN ratios.
#[test]
fn random_needs_a_budget() {
    rejects(
        &["bench", "random", "--budget", "0", "--duration", "1"],
        "--budget",
    );
}

/// `--page-size` takes 4K or 2M and nothing else; populate-churn, whose
/// regions are one page each, refuses 2M.
#[test]
fn page_size_is_4k_or_2m() {
    rejects(&["bench", "scan", "--page-size", "3M"], "4K or 2M");
    rejects(&["torture", "--page-size", "8192"], "4K or 2M");
    rejects(
        &["bench", "populate-churn", "--page-size", "2M"],
        "populate-churn",
    );
}

/// A scan of the anonymous kind is refused: its warm passes would each
/// read the file again (it ran, and reported store reads as warm faults).
#[test]
fn scan_needs_the_shared_kind() {
    rejects(
        &["bench", "scan", "--kind", "anonymous"],
        "need the shared kind",
    );
}

#[test]
fn kernel_maps_needs_read_only_shared_base_pages() {
    for args in [
        &["bench", "swap", "--kernel-maps"][..],
        &["bench", "random", "--kernel-maps", "--write-pct", "10"],
        &["bench", "random", "--kernel-maps", "--kind", "anonymous"],
        &["bench", "filemap", "--kernel-maps", "--page-size", "2M"],
    ] {
        rejects(args, "--kernel-maps needs read-only shared regions");
    }
}

#[test]
fn no_floor_applies_to_random_only() {
    for w in ["scan", "filemap", "swap"] {
        rejects(
            &["bench", w, "--no-floor"],
            "--no-floor applies to random only",
        );
    }
}

/// `bench far`'s text report starts with its header; the spinning floor's
/// line, which qualifies the miss line, comes after it (it came first).
#[test]
fn far_text_starts_with_its_header() {
    let Some(url) = cli_util::redis_url() else {
        return;
    };
    let o = far_run(&url, 256);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("far memory on "), "{out}");
    assert!(lines[1].starts_with("miss ("), "{out}");
    assert!(lines[2].starts_with("a raw GET that busy-polls"), "{out}");
}

/// With an I/O spin the raw client cannot measure (a database other than
/// 0), the report says the spinning floor is left out and why; before,
/// its line was silently missing.
#[test]
fn far_says_why_the_spinning_floor_is_left_out() {
    let Some(url) = cli_util::redis_url() else {
        return;
    };
    let o = far_run(&format!("{url}/3"), 64);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("a raw GET that busy-polls")
                && l.contains(
                    "left out (the raw client speaks to a standalone server's database 0"
                )),
        "{out}"
    );
}

/// `bench far` of 16 pages, `scan` pages in the scan, one pass, spinning
/// 20 µs, on `url`.
fn far_run(url: &str, scan: u32) -> std::process::Output {
    run(&[
        "bench",
        "far",
        "--store",
        url,
        "--pages",
        "16",
        "--scan-pages",
        &scan.to_string(),
        "--passes",
        "1",
        "--io-spin-us",
        "20",
    ])
}
