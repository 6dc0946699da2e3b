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
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::{Store, StoreError};
use crate::stats::histogram::{AtomicHistogram, Percentiles};
use crate::sys::{futex, now_ns};

/// Delays shorter than this are spun rather than slept: `clock_nanosleep`
/// overshoots by tens of microseconds (timer slack, wake-up latency).
const SPIN_BELOW_NS: u64 = 20_000;

/// How long each simulated I/O takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatencyModel {
    /// No added latency.
    None,
    /// Every I/O takes exactly `ns`.
    Fixed {
        /// The latency.
        ns: u64,
    },
    /// Uniformly distributed in `[min_ns, max_ns]`.
    Uniform {
        /// Smallest latency.
        min_ns: u64,
        /// Largest latency (inclusive).
        max_ns: u64,
    },
    /// Exponentially distributed with mean `mean_ns`.
    Exponential {
        /// Mean latency.
        mean_ns: u64,
    },
}

impl LatencyModel {
    /// The model's mean latency.
    pub fn mean_ns(&self) -> u64 {
        match *self {
            LatencyModel::None => 0,
            LatencyModel::Fixed { ns } => ns,
            LatencyModel::Uniform { min_ns, max_ns } => {
                min_ns / 2 + max_ns / 2 + (min_ns & max_ns & 1)
            }
            LatencyModel::Exponential { mean_ns } => mean_ns,
        }
    }

    /// Draws one latency, given 64 uniformly random bits. Pure arithmetic,
    /// async-signal-safe.
    fn sample(&self, r: u64) -> u64 {
        match *self {
            LatencyModel::None => 0,
            LatencyModel::Fixed { ns } => ns,
            LatencyModel::Uniform { min_ns, max_ns } => {
                // A hand-built model may have the bounds swapped.
                let (lo, hi) = (min_ns.min(max_ns), min_ns.max(max_ns));
                let span = (hi - lo) as u128 + 1;
                // Multiply-shift maps r onto [0, span) without division.
                lo + ((r as u128 * span) >> 64) as u64
            }
            LatencyModel::Exponential { mean_ns } => {
                // u in (0, 1], from the top 53 bits.
                let u = ((r >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
                let x = -(mean_ns as f64) * u.ln();
                if x >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    x as u64
                }
            }
        }
    }
}

/// Parses a duration such as `50us`, `1.5ms`, `200ns`, `2s` (or `0`).
fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("duration {t:?} needs a unit (ns, us, ms or s)"))?;
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        u => {
            return Err(format!(
                "unknown unit {u:?} in duration {t:?} (use ns, us, ms or s)"
            ))
        }
    };
    if num.is_empty() {
        return Err(format!("duration {t:?} has no number"));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(scale)
            .ok_or_else(|| format!("duration {t:?} is too large"));
    }
    let v: f64 = num
        .parse()
        .map_err(|_| format!("bad number {num:?} in duration {t:?}"))?;
    let ns = (v * scale as f64).round();
    if !ns.is_finite() || ns < 0.0 || ns >= u64::MAX as f64 {
        return Err(format!("duration {t:?} is out of range"));
    }
    Ok(ns as u64)
}

/// Formats nanoseconds with the largest unit that represents them exactly.
fn fmt_duration(ns: u64, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for (scale, unit) in [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")] {
        if ns != 0 && ns.is_multiple_of(scale) {
            return write!(f, "{}{unit}", ns / scale);
        }
    }
    write!(f, "{ns}ns")
}

impl FromStr for LatencyModel {
    type Err = String;

    /// Parses `none`, `fixed:50us`, `uniform:10us-100us`, `exp:50us`
    /// (also `exponential:50us`). Units: ns, us, ms, s.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("none") {
            return Ok(LatencyModel::None);
        }
        let (kind, arg) = t.split_once(':').ok_or_else(|| {
            format!(
                "bad latency model {t:?}: expected none, fixed:<dur>, \
                 uniform:<dur>-<dur> or exp:<dur>"
            )
        })?;
        let ctx = |e: String| format!("bad latency model {t:?}: {e}");
        match kind.trim().to_ascii_lowercase().as_str() {
            "fixed" => Ok(LatencyModel::Fixed {
                ns: parse_duration(arg).map_err(ctx)?,
            }),
            "uniform" => {
                let (lo, hi) = arg.split_once('-').ok_or_else(|| {
                    ctx(format!("uniform needs a range <min>-<max>, got {arg:?}"))
                })?;
                let min_ns = parse_duration(lo).map_err(ctx)?;
                let max_ns = parse_duration(hi).map_err(ctx)?;
                if min_ns > max_ns {
                    return Err(ctx(format!("uniform minimum exceeds maximum in {arg:?}")));
                }
                Ok(LatencyModel::Uniform { min_ns, max_ns })
            }
            "exp" | "exponential" => Ok(LatencyModel::Exponential {
                mean_ns: parse_duration(arg).map_err(ctx)?,
            }),
            k => Err(format!(
                "bad latency model {t:?}: unknown kind {k:?} (expected none, fixed, uniform or exp)"
            )),
        }
    }
}

impl fmt::Display for LatencyModel {
    /// The form [`FromStr`] accepts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LatencyModel::None => write!(f, "none"),
            LatencyModel::Fixed { ns } => {
                write!(f, "fixed:")?;
                fmt_duration(ns, f)
            }
            LatencyModel::Uniform { min_ns, max_ns } => {
                write!(f, "uniform:")?;
                fmt_duration(min_ns, f)?;
                write!(f, "-")?;
                fmt_duration(max_ns, f)
            }
            LatencyModel::Exponential { mean_ns } => {
                write!(f, "exp:")?;
                fmt_duration(mean_ns, f)
            }
        }
    }
}

/// Configured versus delivered latency of a [`SimulatedStore`]'s reads.
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
    pub fn with_write_latency(mut self, delay_writes: bool) -> Self {
        self.delay_writes = delay_writes;
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The configured model.
    pub fn model(&self) -> LatencyModel {
        self.model
    }

    /// The configured bound on in-flight I/Os (0 = unbounded).
    pub fn max_inflight(&self) -> u32 {
        self.slots.max
    }

    /// Simulated I/Os in progress now.
    pub fn inflight(&self) -> u32 {
        self.slots.inflight.load(Ordering::Relaxed)
    }

    /// Makes the next `n` reads fail with `EIO` (after their modelled
    /// latency, without reaching the inner store). Replaces any countdown
    /// still pending.
    pub fn fail_next_reads(&self, n: u32) {
        self.fail_reads.store(n, Ordering::SeqCst);
    }

    /// Reads issued to the inner store.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Writes issued to the inner store.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Delivered read latencies.
    pub fn histogram(&self) -> &AtomicHistogram {
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
        self.slots.release();
        (r, now_ns().saturating_sub(start))
    }
}

impl Store for SimulatedStore {
    fn len(&self) -> u64 {
        self.inner.len()
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

    fn latency_report(&self) -> Option<LatencyReport> {
        Some(LatencyReport {
            model: self.model,
            configured_mean_ns: self.model.mean_ns(),
            delivered: self.delivered.percentiles(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryStore, ZeroStore};
    use crate::sys::PAGE_SIZE;

    fn zero(pages: u64) -> Arc<dyn Store> {
        Arc::new(ZeroStore::new(pages * PAGE_SIZE as u64))
    }

    #[test]
    fn parses_models() {
        assert_eq!("none".parse::<LatencyModel>(), Ok(LatencyModel::None));
        assert_eq!(" NONE ".parse::<LatencyModel>(), Ok(LatencyModel::None));
        assert_eq!(
            "fixed:50us".parse::<LatencyModel>(),
            Ok(LatencyModel::Fixed { ns: 50_000 })
        );
        assert_eq!(
            "fixed:1.5ms".parse::<LatencyModel>(),
            Ok(LatencyModel::Fixed { ns: 1_500_000 })
        );
        assert_eq!(
            "fixed:0".parse::<LatencyModel>(),
            Ok(LatencyModel::Fixed { ns: 0 })
        );
        assert_eq!(
            "uniform:10us-100us".parse::<LatencyModel>(),
            Ok(LatencyModel::Uniform {
                min_ns: 10_000,
                max_ns: 100_000
            })
        );
        assert_eq!(
            "uniform:500ns-2ms".parse::<LatencyModel>(),
            Ok(LatencyModel::Uniform {
                min_ns: 500,
                max_ns: 2_000_000
            })
        );
        assert_eq!(
            "exp:50us".parse::<LatencyModel>(),
            Ok(LatencyModel::Exponential { mean_ns: 50_000 })
        );
        assert_eq!(
            "exponential:1s".parse::<LatencyModel>(),
            Ok(LatencyModel::Exponential {
                mean_ns: 1_000_000_000
            })
        );
    }

    #[test]
    fn rejects_bad_models() {
        for bad in [
            "",
            "fast",
            "fixed",
            "fixed:",
            "fixed:50",
            "fixed:50xs",
            "fixed:us",
            "fixed:-5us",
            "fixed:1.2.3ms",
            "fixed:99999999999999999999s",
            "uniform:10us",
            "uniform:100us-10us",
            "uniform:10us-",
            "exp:abc",
            "gauss:10us",
        ] {
            let e = bad.parse::<LatencyModel>().unwrap_err();
            assert!(!e.is_empty(), "{bad:?}");
            assert!(e.contains("latency model"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn display_round_trips() {
        for m in [
            LatencyModel::None,
            LatencyModel::Fixed { ns: 50_000 },
            LatencyModel::Fixed { ns: 1_234 },
            LatencyModel::Fixed { ns: 0 },
            LatencyModel::Uniform {
                min_ns: 10_000,
                max_ns: 2_000_000_000,
            },
            LatencyModel::Exponential { mean_ns: 3_000_000 },
        ] {
            let s = m.to_string();
            assert_eq!(s.parse::<LatencyModel>(), Ok(m), "{s}");
        }
        assert_eq!(LatencyModel::Fixed { ns: 50_000 }.to_string(), "fixed:50us");
    }

    #[test]
    fn model_means_and_samples() {
        assert_eq!(LatencyModel::None.mean_ns(), 0);
        assert_eq!(LatencyModel::Fixed { ns: 7 }.mean_ns(), 7);
        let u = LatencyModel::Uniform {
            min_ns: 10,
            max_ns: 21,
        };
        assert_eq!(u.mean_ns(), 15);
        let big = LatencyModel::Uniform {
            min_ns: u64::MAX,
            max_ns: u64::MAX,
        };
        assert_eq!(big.mean_ns(), u64::MAX);
        assert_eq!(u.sample(0), 10);
        assert_eq!(u.sample(u64::MAX), 21);
        let swapped = LatencyModel::Uniform {
            min_ns: 21,
            max_ns: 10,
        };
        assert_eq!(swapped.sample(0), 10);
        assert_eq!(swapped.sample(u64::MAX), 21);
        let e = LatencyModel::Exponential { mean_ns: 1_000 };
        assert_eq!(e.mean_ns(), 1_000);
        // Sample means over many draws land near the configured mean.
        let s = SimulatedStore::new(zero(1), e, 0, 42);
        let n = 100_000u64;
        let mut sum_e = 0u64;
        let mut sum_u = 0u64;
        for _ in 0..n {
            let r = s.next_random();
            sum_e += e.sample(r);
            let x = u.sample(r);
            assert!((10..=21).contains(&x));
            sum_u += x;
        }
        let mean_e = sum_e as f64 / n as f64;
        let mean_u = sum_u as f64 / n as f64;
        assert!((900.0..1100.0).contains(&mean_e), "exp mean {mean_e}");
        assert!((15.0..16.0).contains(&mean_u), "uniform mean {mean_u}");
    }

    #[test]
    fn seeded_sequences_repeat() {
        let a = SimulatedStore::new(zero(1), LatencyModel::None, 0, 7);
        let b = SimulatedStore::new(zero(1), LatencyModel::None, 0, 7);
        let c = SimulatedStore::new(zero(1), LatencyModel::None, 0, 8);
        let va: Vec<u64> = (0..8).map(|_| a.next_random()).collect();
        let vb: Vec<u64> = (0..8).map(|_| b.next_random()).collect();
        let vc: Vec<u64> = (0..8).map(|_| c.next_random()).collect();
        assert_eq!(va, vb);
        assert_ne!(va, vc);
    }

    #[test]
    fn fixed_latency_is_delivered() {
        let s = SimulatedStore::new(zero(4), LatencyModel::Fixed { ns: 200_000 }, 0, 1);
        let mut buf = vec![1u8; PAGE_SIZE];
        for i in 0..20 {
            s.read((i % 4) * PAGE_SIZE as u64, &mut buf).unwrap();
        }
        assert!(buf.iter().all(|&b| b == 0));
        let rep = s.latency_report().unwrap();
        assert_eq!(rep.model, LatencyModel::Fixed { ns: 200_000 });
        assert_eq!(rep.configured_mean_ns, 200_000);
        assert_eq!(rep.delivered.count, 20);
        assert!(rep.delivered.mean_ns >= 200_000.0, "{rep:?}");
        assert!(rep.delivered.mean_ns < 50_000_000.0, "{rep:?}");
        assert!(s.histogram().min_ns() >= 200_000);
        assert_eq!(s.reads(), 20);
        assert_eq!(s.name(), "simulated");
    }

    #[test]
    fn short_delays_spin() {
        let s = SimulatedStore::new(zero(1), LatencyModel::Fixed { ns: 5_000 }, 0, 1);
        let mut buf = vec![0u8; PAGE_SIZE];
        for _ in 0..50 {
            s.read(0, &mut buf).unwrap();
        }
        assert!(s.histogram().min_ns() >= 5_000);
        assert!(s.histogram().mean_ns() < 50_000_000.0);
    }

    #[test]
    fn bounded_concurrency_queues() {
        // One slot, 4 threads × 5 reads of 1 ms: at least 20 ms overall, and
        // some reads must have waited for the slot.
        let s = Arc::new(SimulatedStore::new(
            zero(4),
            LatencyModel::Fixed { ns: 1_000_000 },
            1,
            3,
        ));
        let t0 = std::time::Instant::now();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; PAGE_SIZE];
                    for _ in 0..5 {
                        s.read(t * PAGE_SIZE as u64, &mut buf).unwrap();
                        assert!(s.inflight() <= 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(t0.elapsed() >= std::time::Duration::from_millis(20));
        assert_eq!(s.inflight(), 0);
        assert_eq!(s.max_inflight(), 1);
        let rep = s.latency_report().unwrap();
        assert_eq!(rep.delivered.count, 20);
        assert!(rep.delivered.max_ns >= 2_000_000, "{rep:?}");
    }

    #[test]
    fn unbounded_concurrency_overlaps() {
        let s = Arc::new(SimulatedStore::new(
            zero(4),
            LatencyModel::Fixed { ns: 20_000_000 },
            0,
            3,
        ));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; PAGE_SIZE];
                    s.read(0, &mut buf).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.inflight(), 0);
        assert_eq!(s.reads(), 4);
    }

    #[test]
    fn injected_failures() {
        let mem = Arc::new(MemoryStore::from_bytes(&[9u8; PAGE_SIZE]).unwrap());
        let s = SimulatedStore::new(mem, LatencyModel::None, 0, 0);
        let mut buf = vec![0u8; PAGE_SIZE];
        s.fail_next_reads(2);
        assert_eq!(s.read(0, &mut buf), Err(StoreError(libc::EIO)));
        assert_eq!(s.read(0, &mut buf), Err(StoreError(libc::EIO)));
        assert_eq!(s.reads(), 0);
        s.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 9));
        assert_eq!(s.reads(), 1);
        assert_eq!(s.histogram().count(), 3);
    }

    #[test]
    fn writes_pass_through() {
        let mem = Arc::new(MemoryStore::new(2 * PAGE_SIZE as u64).unwrap());
        let s = SimulatedStore::new(mem.clone(), LatencyModel::Fixed { ns: 100_000 }, 2, 0)
            .with_write_latency(true);
        assert!(s.writable());
        assert_eq!(s.len(), 2 * PAGE_SIZE as u64);
        let page = vec![0x42u8; PAGE_SIZE];
        let t0 = now_ns();
        s.write(PAGE_SIZE as u64, &page).unwrap();
        assert!(now_ns() - t0 >= 100_000);
        assert_eq!(s.writes(), 1);
        assert_eq!(&mem.snapshot()[PAGE_SIZE..], &page[..]);
        s.sync().unwrap();
        // Writes are not in the read report.
        assert_eq!(s.latency_report().unwrap().delivered.count, 0);

        let ro = SimulatedStore::new(zero(1), LatencyModel::None, 0, 0);
        assert!(!ro.writable());
        assert_eq!(ro.write(0, &page), Err(StoreError(libc::EROFS)));
    }
}
