//! Running the built command line from integration tests.

#![allow(dead_code)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs the built binary with `args` (and no `RUST_LOG`).
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uffd-pager"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running uffd-pager")
}

/// Asserts that `args` is rejected as a usage error: exit code 2, a message
/// on stderr that mentions `needle` (case-insensitive), nothing run (fast).
pub fn rejects(args: &[&str], needle: &str) {
    let t = Instant::now();
    let o = run(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{args:?}: want exit 2, got {:?}\nstdout: {}\nstderr: {err}",
        o.status,
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(
        !err.trim().is_empty(),
        "{args:?}: exit 2 without a message on stderr"
    );
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "{args:?}: stderr does not mention {needle:?}:\n{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "{args:?}: took {:?}; usage errors must be caught before running",
        t.elapsed()
    );
}

/// The standalone Redis server the far-memory tests use: `UFFD_REDIS_URL`
/// (default `redis://127.0.0.1:6390`, which `make redis-up` starts), or
/// `None` (the test skipped, which it says) with `UFFD_SKIP_REDIS=1`.
pub fn redis_url() -> Option<String> {
    if std::env::var_os("UFFD_SKIP_REDIS").is_some_and(|v| v == "1") {
        eprintln!("skipped: UFFD_SKIP_REDIS=1");
        return None;
    }
    Some(std::env::var("UFFD_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390".into()))
}
