//! `--duration` bounds a run: swap and filemap stop within one access of
//! it, even where one access waits out a long simulated latency or one
//! round of filemap outlasts the run. Before, swap looked at the clock
//! every 64 reads (64 reads of a 1 s store: over a minute for `--duration
//! 0.2`) and filemap only between rounds. A filemap run whose first round
//! outlasts it measured nothing, and says so (it printed a rate of zero
//! rounds and exited 0).

mod cli_util;

use std::time::{Duration, Instant};

/// Runs `bench WORKLOAD` under one policy with one thread over 64 pages,
/// with `more`; asserts that it took less than `bound`, and returns what
/// it printed on stderr with its exit code.
fn bounded(workload: &str, more: &[&str], bound: Duration) -> (Option<i32>, String) {
    let mut args = vec!["bench", workload, "--policy", "vanilla", "--threads", "1"];
    args.extend(["--pages", "64"]);
    args.extend(more);
    let t = Instant::now();
    let o = cli_util::run(&args);
    let took = t.elapsed();
    assert!(took < bound, "{args:?} took {took:?}");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn swap_stops_at_its_duration_between_slow_reads() {
    // 48 of the 64 pages miss the budget on each walk: 24 s of reads
    // before the 64th would have looked at the clock.
    let more = ["--budget", "16", "--latency", "fixed:500ms"];
    let (code, err) = bounded(
        "swap",
        &[&more[..], &["--duration", "0.6"]].concat(),
        Duration::from_secs(8),
    );
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn filemap_stops_at_its_duration_inside_a_round() {
    // One round reads 64 pages of a 200 ms store one at a time: 12.8 s.
    let more = ["--budget", "8", "--readahead", "0", "--fault-around", "0"];
    let slow = ["--latency", "fixed:200ms", "--duration", "0.3"];
    let (code, err) = bounded(
        "filemap",
        &[&more[..], &slow].concat(),
        Duration::from_secs(6),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no round of 64 pages finished"), "{err}");
}
