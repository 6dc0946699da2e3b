//! The budget bounds the memory the pager's pages take: a read-only
//! anonymous region over a store that waits on a device (a file on disk)
//! keeps each resident page once, not also in its cache area.
//!
//! Measured in a child process (the test binary re-run), from the growth
//! of its anonymous resident memory (`RssAnon`) while it reads a region
//! four times the budget, twice over.

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::{FileStore, FileStoreOptions};
use uffd_pager::{InstallKind, MapOptions, Pager};
use util::*;

const BUDGET: usize = 2048; // 8 MiB
const PAGES: usize = 4 * BUDGET;

fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/self/status")
}

/// Child: reads the region and prints how much anonymous memory it grew.
#[test]
fn child_read_only_anonymous_region_over_a_disk_file() {
    if !is_child() {
        return;
    }
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("budget-memory-{}", std::process::id()));
    std::fs::write(&path, pattern_vec(7, PAGES * PAGE)).unwrap();
    let store = FileStore::open(&path, &FileStoreOptions::default()).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!store.is_direct());
    let pager = Pager::builder()
        .budget_pages(BUDGET as u64)
        .readahead(0, 1)
        .build()
        .unwrap();
    let opts = MapOptions {
        kind: InstallKind::Anonymous,
        writable: false,
        ..MapOptions::default()
    };
    let region = pager
        .map_store(Arc::new(store), PAGES * PAGE, &opts)
        .unwrap();
    let before = rss_anon_kib();
    let mut peak = 0;
    for pass in 0..2 {
        for p in 0..PAGES {
            let off = p * PAGE + 99;
            assert_eq!(
                region.as_slice()[off],
                pattern(7, off),
                "pass {pass} page {p}"
            );
            if p % 256 == 0 {
                peak = peak.max(rss_anon_kib().saturating_sub(before));
            }
        }
    }
    println!("grew {peak} KiB for a budget of {} KiB", BUDGET * 4);
}

#[test]
fn a_read_only_anonymous_region_keeps_each_page_once() {
    let out = run_child("child_read_only_anonymous_region_over_a_disk_file", &[]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let grew: u64 = text
        .lines()
        .find_map(|l| l.split_once("grew ").map(|(_, r)| r))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure in {text}"));
    // The budget plus the reclaimer's slack and the engine's own
    // allocations; a second copy of every page would be twice the budget.
    let budget_kib = (BUDGET * 4) as u64;
    assert!(
        grew <= budget_kib + budget_kib / 4 + 2048,
        "anonymous memory grew {grew} KiB for a budget of {budget_kib} KiB"
    );
}
