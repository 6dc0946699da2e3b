//! What the model tests share.
//!
//! The tests share state through `std::sync::Arc`, not loom's: what they
//! check is the primitives, and a loom `Arc` dropped while a failed model
//! unwinds calls back into the stopped model and aborts the whole test
//! binary, hiding the other tests' results.

use loom::cell::UnsafeCell;

/// Preemption bound when `LOOM_MAX_PREEMPTIONS` is unset (the largest
/// models use 2): every broken variant listed in `main.rs` fails within
/// it, and the suite runs in about a minute on 2 vCPUs.
pub const DEFAULT_PREEMPTIONS: usize = 3;

/// Runs `f` under loom for every interleaving within the preemption bound.
pub fn check(f: impl Fn() + Sync + Send + 'static) {
    check_bounded(DEFAULT_PREEMPTIONS, f)
}

/// As [`check`], with a default bound of `preemptions` for models whose
/// state space is too large for the usual one.
pub fn check_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(preemptions);
    }
    // Counted outside the model (loom runs one execution at a time, on
    // this test's thread) so that a run shows how much it explored.
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    // As `loom::model` does: `LOOM_LOG=trace` logs each step.
    let log = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("LOOM_LOG"))
        .with_test_writer()
        .without_time()
        .finish();
    tracing::subscriber::with_default(log, || {
        b.check(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            f()
        })
    });
    eprintln!(
        "{} executions (preemption bound {})",
        runs.load(std::sync::atomic::Ordering::Relaxed),
        b.preemption_bound.unwrap()
    );
}

/// Data that a lock protects: loom records every access and fails the
/// model if two of them, one a write, are not ordered by happens-before
/// (which is what mutual exclusion has to give).
#[derive(Debug, Default)]
pub struct Guarded(UnsafeCell<u64>);

// SAFETY: every access goes through loom's checked `with`/`with_mut`; a
// racing pair fails the model rather than being undefined behaviour (loom
// runs one model thread at a time).
unsafe impl Sync for Guarded {}

impl Guarded {
    /// Reads the value; the caller claims to hold the lock (shared).
    pub fn read(&self) -> u64 {
        // SAFETY: `p` points to the cell's value, alive as long as `self`;
        // loom fails the model if this read races a write.
        self.0.with(|p| unsafe { *p })
    }

    /// Adds one; the caller claims to hold the lock (exclusive).
    pub fn bump(&self) {
        // SAFETY: `p` points to the cell's value, alive as long as `self`;
        // loom fails the model if this write races any other access.
        self.0.with_mut(|p| unsafe { *p += 1 })
    }

    /// Sets the value; the caller claims to hold the lock (exclusive).
    pub fn set(&self, v: u64) {
        // SAFETY: as in `bump`.
        self.0.with_mut(|p| unsafe { *p = v })
    }
}
