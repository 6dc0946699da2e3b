//! What the concurrency primitives are built on: the real thing normally,
//! the `loom` model checker's stand-ins under `--cfg loom`.
//!
//! [`crate::page_cache`], [`crate::sync::region_lock`], [`crate::sync::pins`],
//! [`crate::sync::global_lock`], [`crate::sync::rcu`] and
//! [`crate::sync::percpu_rwsem`] take their atomics,
//! futex calls, clock, CPU number, mutex and spin hints from here. In a
//! normal build everything here is a plain re-export of `std` or
//! [`crate::sys`] (the same items, so the same code and the same cost: no
//! wrapper, no indirection). Under `--cfg loom` they are replaced by:
//!
//! - loom's atomics, mutex and yield, which loom schedules and checks;
//! - a futex emulation that loom understands ([`futex`]): a waiter that
//!   found the expected value sleeps until a wake for its word picks it
//!   (the kernel's semantics, without the spurious returns), so a lost
//!   wake-up shows up as a deadlock;
//! - a clock that stands still and a CPU number the test picks, with knobs
//!   ([`set_futex_mode`], [`set_handoff_ns`], [`set_cpu`]) that a model
//!   test sets at the start of each execution.
//!
//! The model tests are `tests/loom_*.rs`; run them with `make model-check`.
//! Under `cfg(loom)` the primitives work only inside `loom::model`, and a
//! [`crate::page_cache::PageCache`] keeps every word on the heap (no
//! mapping), so models use small page counts.

#[cfg(not(loom))]
pub(crate) use crate::sys::{cpu_count, futex, now_ns, this_cpu};
#[cfg(not(loom))]
pub(crate) use std::hint::spin_loop;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

#[cfg(loom)]
pub use loom::hint::spin_loop;
#[cfg(loom)]
pub use loom::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64};
#[cfg(loom)]
pub use loom::sync::{Mutex, MutexGuard};
#[cfg(loom)]
pub use loom::thread::yield_now;

#[cfg(loom)]
pub use self::loom_impl::*;

/// Declares an associated `fn` that is `const` except under loom, whose
/// atomics cannot be made in a `const fn`.
macro_rules! const_fn_unless_loom {
    ($(#[$m:meta])* $v:vis fn $name:ident() -> $ret:ty $body:block) => {
        #[cfg(not(loom))]
        $(#[$m])* $v const fn $name() -> $ret $body
        #[cfg(loom)]
        $(#[$m])* $v fn $name() -> $ret $body
    };
}
pub(crate) use const_fn_unless_loom;

#[cfg(loom)]
mod loom_impl {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU32 as StdU32, AtomicU64 as StdU64, Ordering::Relaxed};

    /// How the emulated futex treats a wait that finds the expected value.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum FutexMode {
        /// Every wait sleeps until a wake picks it; timeouts never fire.
        /// The strictest mode: any wake-up the code relies on must be sent.
        Exact,
        /// Untimed waits as in `Exact`; a timed wait returns at once, as if
        /// its timeout had run out (explores the paths that poll).
        TimeoutsFire,
        /// The first `n` waits of the execution that would sleep return at
        /// once instead, as if interrupted by a signal (the engine's SIGBUS
        /// handler can interrupt any thread, and a timed wait can time
        /// out); later waits are as in `Exact`. Callers must re-check their
        /// condition. (Bounded: with every wait returning at once, two
        /// threads that spin give loom an endless schedule to explore.)
        Spurious(u32),
    }

    /// Per-execution settings. Plain std atomics: loom runs one model thread
    /// at a time, and these are not part of what is checked.
    struct Knobs {
        /// 0: `Exact`, 1: `TimeoutsFire`, 2: `Spurious`.
        futex_mode: StdU32,
        spurious_left: StdU32,
        handoff_ns: StdU64,
    }

    loom::lazy_static! {
        static ref KNOBS: Knobs = Knobs {
            futex_mode: StdU32::new(0),
            spurious_left: StdU32::new(0),
            // The model's clock stands still, so by default no reader ever
            // waits long enough to ask for a handoff.
            handoff_ns: StdU64::new(u64::MAX),
        };
    }

    loom::thread_local! {
        static CPU: Cell<usize> = Cell::new(0);
    }

    /// Sets the futex mode for the rest of this execution (default `Exact`).
    pub fn set_futex_mode(mode: FutexMode) {
        let (m, n) = match mode {
            FutexMode::Exact => (0, 0),
            FutexMode::TimeoutsFire => (1, 0),
            FutexMode::Spurious(n) => (2, n),
        };
        KNOBS.futex_mode.store(m, Relaxed);
        KNOBS.spurious_left.store(n, Relaxed);
    }

    /// Whether a wait that found the expected value returns at once rather
    /// than sleep (and takes one spurious return, if it is one).
    fn returns_at_once(timed: bool) -> bool {
        match KNOBS.futex_mode.load(Relaxed) {
            0 => false,
            1 => timed,
            _ => {
                let left = KNOBS.spurious_left.load(Relaxed);
                if left > 0 {
                    KNOBS.spurious_left.store(left - 1, Relaxed);
                }
                left > 0
            }
        }
    }

    /// How long a reader of the global lock waits before it asks for the
    /// handoff, for the rest of this execution. The model's clock stands
    /// still, so 0 means "at its first blocked attempt" and `u64::MAX`
    /// means "never"; the default (`HANDOFF_NS`) also means never.
    pub fn set_handoff_ns(ns: u64) {
        KNOBS.handoff_ns.store(ns, Relaxed);
    }

    pub(crate) fn handoff_ns() -> u64 {
        KNOBS.handoff_ns.load(Relaxed)
    }

    /// The model's clock: it stands still (time is a knob, not a variable
    /// loom could explore; see [`set_handoff_ns`]).
    pub fn now_ns() -> u64 {
        0
    }

    /// Orders a SeqCst store (or RMW) before a later SeqCst load of another
    /// word, for loom. C++20 (and the hardware) already forbid the two
    /// threads of a store-buffering pattern made of SeqCst accesses from
    /// both reading the other's word stale, but loom 0.7 models SeqCst
    /// accesses barely more strongly than acquire/release (its runtime
    /// leaves the SeqCst total order out, noting that this "may fail to
    /// model correct code"; only SeqCst *fences* are modelled), so it
    /// reports that forbidden outcome as a use after free. Called, under `cfg(loom)` only, between
    /// the two halves of each such pattern in [`crate::sync::rcu`] and
    /// [`crate::sync::percpu_rwsem`]: the
    /// model then checks the algorithm under the ordering the real code
    /// has. (What it cannot catch is a downgrade of those SeqCst accesses.)
    pub(crate) fn loom_store_load_fence() {
        loom::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// CPUs the model pretends to have (per-CPU shards).
    pub fn cpu_count() -> usize {
        2
    }

    /// The CPU the calling model thread is on: 0 unless it called
    /// [`set_cpu`].
    pub fn this_cpu() -> usize {
        CPU.with(|c| c.get())
    }

    /// Puts the calling model thread on `cpu`.
    pub fn set_cpu(cpu: usize) {
        CPU.with(|c| c.set(cpu));
    }

    /// futex(2) wait and wake, emulated with a loom mutex (the kernel's hash
    /// bucket lock) and condition variable.
    ///
    /// A waiter checks the word and queues itself under the mutex; a waker
    /// takes the mutex after its store, so either the waiter sees the new
    /// value or the waker sees the waiter: the kernel's guarantee. A queued
    /// waiter returns only once a wake has picked it (in `Exact` mode), so
    /// a missing wake leaves it asleep and loom reports the deadlock.
    pub mod futex {
        use super::returns_at_once;
        use loom::sync::atomic::AtomicU32;
        use loom::sync::{Condvar, Mutex};
        use std::sync::atomic::Ordering::Relaxed;

        #[derive(Default)]
        struct Queue {
            /// Sleepers in arrival order: (word address, ticket).
            sleepers: Vec<(usize, u64)>,
            next_ticket: u64,
        }

        struct Table {
            queue: Mutex<Queue>,
            woken: Condvar,
        }

        loom::lazy_static! {
            static ref TABLE: Table = Table {
                queue: Mutex::new(Queue::default()),
                woken: Condvar::new(),
            };
        }

        fn sleep(word: &AtomicU32, expected: u32, timed: bool) {
            let mut q = TABLE.queue.lock().unwrap();
            if word.load(Relaxed) != expected {
                return;
            }
            if returns_at_once(timed) {
                drop(q);
                loom::thread::yield_now();
                return;
            }
            let ticket = q.next_ticket;
            q.next_ticket += 1;
            q.sleepers.push((word as *const AtomicU32 as usize, ticket));
            while q.sleepers.iter().any(|&(_, t)| t == ticket) {
                q = TABLE.woken.wait(q).unwrap();
            }
        }

        /// Sleeps while `*word == expected`, until woken.
        pub fn wait(word: &AtomicU32, expected: u32) {
            sleep(word, expected, false);
        }

        /// As [`wait`]; whether the timeout fires is the futex mode's call.
        pub fn wait_timeout(word: &AtomicU32, expected: u32, _timeout_ns: u64) {
            sleep(word, expected, true);
        }

        /// Wakes at most `n` threads sleeping on `word`, oldest first.
        pub fn wake(word: &AtomicU32, n: i32) {
            let addr = word as *const AtomicU32 as usize;
            let mut q = TABLE.queue.lock().unwrap();
            let mut left = n.max(0) as usize;
            let before = q.sleepers.len();
            q.sleepers.retain(|&(a, _)| {
                if a == addr && left > 0 {
                    left -= 1;
                    false
                } else {
                    true
                }
            });
            if q.sleepers.len() != before {
                TABLE.woken.notify_all();
            }
        }

        /// Wakes every thread sleeping on `word`.
        pub fn wake_all(word: &AtomicU32) {
            wake(word, i32::MAX);
        }
    }
}
