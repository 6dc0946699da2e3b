//! Model checks of the engine's concurrency primitives with `loom`: every
//! interleaving of a few threads (up to a preemption bound), loom's model of
//! weak memory, and a futex emulation under which a lost wake-up is a
//! deadlock (see `src/sync/model.rs`).
//!
//! Only built with `--cfg loom`; run with `make model-check`, i.e.
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom_sync`.
//! `LOOM_MAX_PREEMPTIONS` overrides the default bound of
//! [`util::DEFAULT_PREEMPTIONS`]; `LOOM_LOG=trace LOOM_LOCATION=1` explains
//! a failure.
#![cfg(loom)]

mod global_lock;
mod page_cache;
mod rcu;
mod region_lock;
mod util;
