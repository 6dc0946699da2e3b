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
//!
//! Each primitive's scenarios were checked to fail on broken variants of
//! it (not committed), among them: the page unlock without its WAITERS
//! wake, a waiter that sleeps without setting WAITERS, a Relaxed page
//! trylock (deadlocks and races in `page_cache`); `write_lock` without the
//! reader drain, `read_unlock` without the wake, `try_read` ignoring
//! DETACHED (`region_lock`); the global lock's last reader or last writer
//! not waking, a writer that ignores the handoff bit, a writer-to-writer
//! hand-over that does not wake the asking readers, `try_read` ignoring a
//! waiting writer, a Relaxed writer acquire (`global_lock`); an RCU reader
//! without the epoch recheck, an update waiting on the wrong parity or not
//! at all, a Relaxed reader exit (`rcu`); an unpin that does not wake the
//! draining owner (`pins`); a leaving reader that does not bump `drained`
//! for a waiting writer, a writer that does not wait for the readers, a
//! last writer that does not wake the readers (`percpu_rwsem`).
#![cfg(loom)]

mod global_lock;
mod page_cache;
mod percpu_rwsem;
mod pins;
mod rcu;
mod region_lock;
mod util;
