//! A store wrapper that models device latency and queue depth, for
//! experiments on how the fault path behaves against slow storage.
//!
//! Every read (and, if enabled, every write) of the inner store is made to
//! take a latency drawn from a [`LatencyModel`], with at most `max_inflight`
//! simulated I/Os in progress at once. The latency actually delivered
//! (including waits for a free slot, sleep overshoot and the inner store's
//! own time) is recorded so that a run can report how close it came to the
//! configured model.
//!
//! Everything on the I/O path is async-signal-safe: atomics, `futex`,
//! `clock_gettime` and `clock_nanosleep`.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::latency::LatencyModel;
use super::{Store, StoreError};
use crate::stats::histogram::{AtomicHistogram, Percentiles};
use crate::sys::{futex, now_ns};

/// Delays shorter than this are spun rather than slept: `clock_nanosleep`
/// overshoots by tens of microseconds (timer slack, wake-up latency).
const SPIN_BELOW_NS: u64 = 20_000;

/// Configured versus delivered latency of a [`SimulatedStore`]'s reads.
///
/// See [`SimulatedStore`] for an example.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyReport {
    /// The configured model.
    pub model: LatencyModel,
    /// The model's mean.
    pub configured_mean_ns: u64,
    /// What reads actually took, slot waits included.
    pub delivered: Percentiles,
}

/// A futex-based counting semaphore bounding in-flight simulated I/Os.
#[derive(Debug)]
struct Slots {
    /// I/Os in flight; the futex word.
    inflight: AtomicU32,
    /// Threads sleeping (or about to sleep) on `inflight`.
    waiters: AtomicU32,
    /// Maximum in flight; 0 = unbounded.
    max: u32,
}

impl Slots {
    fn acquire(&self) {
        if self.max == 0 {
            self.inflight.fetch_add(1, Ordering::Relaxed);
            return;
        }
        loop {
            let cur = self.inflight.load(Ordering::Relaxed);
            if cur < self.max {
                if self
                    .inflight
                    .compare_exchange_weak(cur, cur + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            // Dekker-style handshake with `release`: we publish ourselves as a
            // waiter, then the kernel re-reads `inflight` before sleeping; the
            // releaser decrements `inflight`, then reads `waiters`. With both
            // sides SeqCst, either the releaser sees our waiter count and
            // wakes us, or the futex sees the decremented value and returns.
            self.waiters.fetch_add(1, Ordering::SeqCst);
            let now = self.inflight.load(Ordering::SeqCst);
            if now >= self.max {
                futex::wait(&self.inflight, now);
            }
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn release(&self) {
        self.inflight.fetch_sub(1, Ordering::SeqCst);
        if self.max != 0 && self.waiters.load(Ordering::SeqCst) != 0 {
            futex::wake(&self.inflight, 1);
        }
    }
}

/// Sleeps (or spins) until `deadline` on the monotonic clock.
/// Async-signal-safe.
fn wait_until(deadline: u64) {
    loop {
        let now = now_ns();
        if now >= deadline {
            return;
        }
        if deadline - now < SPIN_BELOW_NS {
            while now_ns() < deadline {
                std::hint::spin_loop();
            }
            return;
        }
        let ts = libc::timespec {
            tv_sec: (deadline / 1_000_000_000) as libc::time_t,
            tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `ts` is a valid timespec; with TIMER_ABSTIME the remainder
        // pointer is unused and may be null.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        // clock_nanosleep returns the error number. EINTR: sleep again to
        // the same absolute deadline. Anything else: fall back to the loop's
        // clock check (and spin if need be) rather than return early.
        if rc == 0 {
            return;
        }
    }
}

/// A store that adds modelled latency and bounded concurrency to another.
///
/// ```
/// use std::sync::Arc;
/// use uffd_pager::store::{LatencyModel, MemoryStore, SimulatedStore, Store};
///
/// let inner = Arc::new(MemoryStore::new(1 << 20)?);
/// // Reads take 20 µs each, at most 4 at once.
/// let slow = SimulatedStore::new(inner, "fixed:20us".parse().unwrap(), 4, 1);
/// let mut page = [0; uffd_pager::PAGE_SIZE];
/// slow.read(0, &mut page)?;
/// let report = slow.latency_report().expect("a simulated store reports");
/// assert_eq!(report.delivered.count, 1);
/// # Ok::<(), uffd_pager::store::StoreError>(())
/// ```
pub struct SimulatedStore {
    inner: Arc<dyn Store>,
    model: LatencyModel,
    delay_writes: bool,
    slots: Slots,
    rng: AtomicU64,
    fail_reads: AtomicU32,
    reads: AtomicU64,
    writes: AtomicU64,
    delivered: AtomicHistogram,
}

impl fmt::Debug for SimulatedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimulatedStore")
            .field("inner", &self.inner.name())
            .field("model", &self.model)
            .field("max_inflight", &self.slots.max)
            .field("delay_writes", &self.delay_writes)
            .field("reads", &self.reads())
            .finish_non_exhaustive()
    }
}

impl SimulatedStore {
    /// Wraps `inner`. Each read takes a latency drawn from `model`; at most
    /// `max_inflight` simulated I/Os run at once (0 = unbounded). `seed`
    /// makes the latency sequence reproducible (for a single thread).
    ///
    /// Example: [`SimulatedStore`](crate::store::SimulatedStore).
    pub fn new(inner: Arc<dyn Store>, model: LatencyModel, max_inflight: u32, seed: u64) -> Self {
        SimulatedStore {
            inner,
            model,
            delay_writes: false,
            slots: Slots {
                inflight: AtomicU32::new(0),
                waiters: AtomicU32::new(0),
                max: max_inflight,
            },
            rng: AtomicU64::new(seed),
            fail_reads: AtomicU32::new(0),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            delivered: AtomicHistogram::new(),
        }
    }

    /// Whether writes also take modelled latency and a slot (default: no).
    /// Write latencies are not recorded in the read report.
    ///
    /// Example: [`SimulatedStore`](crate::store::SimulatedStore).
    pub fn with_write_latency(mut self, delay_writes: bool) -> Self {
        self.delay_writes = delay_writes;
        self
    }

    /// The wrapped store.
    ///
    /// Example: [`SimulatedStore`](crate::store::SimulatedStore).
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The configured model.
    ///
    /// Example: [`SimulatedStore`](crate::store::SimulatedStore).
    pub fn model(&self) -> LatencyModel {
        self.model
    }

    /// The configured bound on in-flight I/Os (0 = unbounded).
    ///
    /// Example: [`SimulatedStore`](crate::store::SimulatedStore).
    pub fn max_inflight(&self) -> u32 {
        self.slots.max
    }

    /// Simulated I/Os in progress now.
    ///
    /// Example: [`SimulatedStore`](crate::store::SimulatedStore).
    pub fn inflight(&self) -> u32 {
        self.slots.inflight.load(Ordering::Relaxed)
    }

    /// Makes the next `n` reads fail with `EIO` (after their modelled
    /// latency, without reaching the inner store). Replaces any countdown
    /// still pending.
    ///
    /// Example: [`SimulatedStore`](crate::store::SimulatedStore).
    pub fn fail_next_reads(&self, n: u32) {
        self.fail_reads.store(n, Ordering::SeqCst);
    }

    /// Reads issued to the inner store.
    ///
    /// Example: [`SimulatedStore`](crate::store::SimulatedStore).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Writes issued to the inner store.
    ///
    /// Example: [`SimulatedStore`](crate::store::SimulatedStore).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Delivered read latencies.
    #[cfg(test)]
    pub(crate) fn histogram(&self) -> &AtomicHistogram {
        &self.delivered
    }

    /// 64 random bits: splitmix64 over an atomic counter (lock-free, one
    /// atomic add).
    #[inline]
    fn next_random(&self) -> u64 {
        const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut z = self
            .rng
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Takes the next injected failure, if any.
    #[inline]
    fn take_injected_failure(&self) -> bool {
        if self.fail_reads.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.fail_reads
            .fetch_update(Ordering::SeqCst, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Runs `op` as one simulated I/O: takes a slot, runs it, and holds the
    /// slot until the modelled latency has passed since the slot was taken.
    /// Returns the result and the latency delivered since `start`.
    #[inline]
    fn simulate<R>(&self, op: impl FnOnce() -> R) -> (R, u64) {
        let start = now_ns();
        self.slots.acquire();
        // The slot goes back if `op` panics too: the engine catches a
        // store's panic (`io::caught`, the I/O workers) and goes on using
        // the store, whose every later I/O waited for the slot for ever
        // once `max_inflight` of them had panicked.
        struct Slot<'a>(&'a Slots);
        impl Drop for Slot<'_> {
            fn drop(&mut self) {
                self.0.release();
            }
        }
        let slot = Slot(&self.slots);
        let delay = self.model.sample(self.next_random());
        let deadline = if delay == 0 {
            0
        } else {
            now_ns().saturating_add(delay)
        };
        let r = op();
        if delay != 0 {
            wait_until(deadline);
        }
        drop(slot);
        (r, now_ns().saturating_sub(start))
    }
}

impl Store for SimulatedStore {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn discard(&self, offset: u64, len: u64) {
        self.inner.discard(offset, len)
    }

    fn memory_bytes(&self) -> u64 {
        self.inner.memory_bytes()
    }

    /// As signal-safe as the store it wraps (its own waits are futexes
    /// and sleeps).
    fn signal_safe(&self) -> bool {
        self.inner.signal_safe()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let (r, took) = self.simulate(|| {
            if self.take_injected_failure() {
                return Err(StoreError(libc::EIO));
            }
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.inner.read(offset, buf)
        });
        self.delivered.record(took);
        r
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        let op = || {
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.inner.write(offset, buf)
        };
        if self.delay_writes {
            self.simulate(op).0
        } else {
            op()
        }
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync()
    }

    fn name(&self) -> &'static str {
        "simulated"
    }

    fn contents_stamp(&self) -> Option<u64> {
        self.inner.contents_stamp()
    }

    fn identity(&self) -> Option<(u64, u64)> {
        self.inner.identity()
    }

    fn latency_report(&self) -> Option<LatencyReport> {
        Some(LatencyReport {
            model: self.model,
            configured_mean_ns: self.model.mean_ns(),
            delivered: self.delivered.percentiles(),
        })
    }
}

#[cfg(test)]
#[path = "simulated_tests.rs"]
mod tests;
