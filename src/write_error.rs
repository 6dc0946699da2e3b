//! A store's recent write failures, as reclaim sees them (the kernel marks
//! a failed write-back on the file's `address_space`: `mapping_set_error`,
//! `AS_EIO`).
//!
//! Hazard: a store whose writes hang (a frozen Redis server, a stalled
//! network file system) makes every write wait out the
//! [I/O timeout](crate::PagerBuilder::io_timeout) before it counts as
//! failed. Reclaim that tried every dirty page it met would make a fault
//! that took the pager over its budget wait one timeout per page, with no
//! bound on how many. So after a reclaim write to an object's store
//! fails, reclaim leaves that object's dirty pages where they are (they
//! stay resident and dirty; clean pages are evicted in their place, and
//! the pager may go over its budget) until a backoff has passed: 100 ms,
//! doubling with each failure in a row up to 10 s. Then one reclaimer,
//! and only one, tries again (a probe; the others wait until it reports,
//! or 10 s); a success ends the backoff.
//! Write-back the application asks for ([`crate::Region::flush`], unmap)
//! always tries: it reports its own error.
//!
//! Cost: one atomic load per page reclaim writes (and one per write
//! after it) while the store is healthy; the clock is read only while it
//! is not.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// The first backoff after a failure.
const FIRST_BACKOFF_NS: u64 = 100_000_000;
/// The longest backoff.
const MAX_BACKOFF_NS: u64 = 10_000_000_000;
/// How long a probe holds the others off before it reports: the longest
/// backoff. (A probe whose write hangs, in a signal-safe store that the
/// faulting thread calls itself, reports only when the write ends; one
/// that met no write to make reports nothing, and the next probe waits
/// this long.)
const PROBE_HOLD_NS: u64 = MAX_BACKOFF_NS;

/// What [`WriteHealth::may_write`] answers.
#[derive(Debug)]
#[must_use = "a probe held and dropped unused is given back"]
pub enum Permit<'a> {
    /// The store is failing and its backoff has not ended, or another
    /// caller holds the probe: do not write.
    Refused,
    /// The store is healthy: write.
    Healthy,
    /// This caller won the probe: write, and [`record`](WriteHealth::record)
    /// the outcome. Dropped with no outcome recorded (the caller met no
    /// write to make after all: a page found to be zeros, or its unmap
    /// refused), the probe is given back, so the next caller may probe at
    /// once instead of after the probe's hold.
    Probe(#[allow(dead_code)] Probe<'a>), // (Held for its drop.)
}

impl Permit<'_> {
    /// Whether the caller may write.
    pub fn allowed(&self) -> bool {
        !matches!(self, Permit::Refused)
    }
}

/// A probe won ([`Permit::Probe`]).
#[derive(Debug)]
pub struct Probe<'a> {
    health: &'a WriteHealth,
    /// `retry_at` as the probe set it, and as it was before.
    held: u64,
    before: u64,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        // Only while no outcome was recorded (which moves `retry_at`).
        let _ = self
            .health
            .retry_at
            .compare_exchange(self.held, self.before, Relaxed, Relaxed);
    }
}

/// Reclaim's view of one object's store: healthy, or failing with the time
/// of the next probe. Async-signal-safe (atomics only).
#[derive(Debug, Default)]
pub struct WriteHealth {
    /// When reclaim may try a write again (`sys::now_ns`); 0: healthy.
    retry_at: AtomicU64,
    /// The backoff the next failure sets; 0: none yet.
    backoff: AtomicU64,
}

impl WriteHealth {
    /// Whether reclaim may write now (`now` reads the clock): the store is
    /// healthy, or its backoff ended and this caller won the probe (the
    /// next caller finds writes held off until the probe reports, or for
    /// the longest backoff if it never does: it renewed the backoff only,
    /// and a probe whose write hung let another start every 100 ms).
    pub fn may_write(&self, now: impl FnOnce() -> u64) -> Permit<'_> {
        let at = self.retry_at.load(Relaxed);
        if at == 0 {
            return Permit::Healthy;
        }
        let now = now();
        if now < at {
            return Permit::Refused;
        }
        let held = now.saturating_add(PROBE_HOLD_NS);
        match self.retry_at.compare_exchange(at, held, Relaxed, Relaxed) {
            Ok(_) => Permit::Probe(Probe {
                health: self,
                held,
                before: at,
            }),
            Err(_) => Permit::Refused,
        }
    }

    /// Records how a write that [`may_write`](Self::may_write) allowed
    /// ended (`now` reads the clock).
    pub fn record(&self, ok: bool, now: impl FnOnce() -> u64) {
        if ok {
            if self.retry_at.load(Relaxed) != 0 {
                self.retry_at.store(0, Relaxed);
                self.backoff.store(0, Relaxed);
            }
            return;
        }
        let b = self.backoff.load(Relaxed);
        let next = if b == 0 {
            FIRST_BACKOFF_NS
        } else {
            (b * 2).min(MAX_BACKOFF_NS)
        };
        self.backoff.store(next, Relaxed);
        self.retry_at
            .store(now().saturating_add(next).max(1), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl WriteHealth {
        fn failing(&self) -> bool {
            self.retry_at.load(Relaxed) != 0
        }
    }

    #[test]
    fn a_failure_pauses_writes_until_one_probe_and_a_success_ends_it() {
        let h = WriteHealth::default();
        assert!(matches!(h.may_write(|| 5), Permit::Healthy));
        h.record(true, || 5);
        assert!(!h.failing());
        h.record(false, || 1_000);
        assert!(h.failing());
        assert!(!h.may_write(|| 1_000 + FIRST_BACKOFF_NS - 1).allowed());
        // The backoff ends: one caller probes, the next waits, however
        // long the probe takes to report (up to the longest backoff).
        let t = 1_000 + FIRST_BACKOFF_NS;
        let probe = h.may_write(|| t);
        assert!(matches!(probe, Permit::Probe(_)));
        assert!(!h.may_write(|| t).allowed());
        assert!(!h.may_write(|| t + 2 * FIRST_BACKOFF_NS).allowed());
        assert!(!h.may_write(|| t + MAX_BACKOFF_NS - 1).allowed());
        // The probe fails: twice as long (its drop changes nothing now).
        h.record(false, || t);
        drop(probe);
        assert!(!h.may_write(|| t + 2 * FIRST_BACKOFF_NS - 1).allowed());
        let probe = h.may_write(|| t + 2 * FIRST_BACKOFF_NS);
        assert!(probe.allowed());
        h.record(true, || t + 2 * FIRST_BACKOFF_NS);
        drop(probe);
        assert!(!h.failing());
        assert!(matches!(
            h.may_write(|| t + 2 * FIRST_BACKOFF_NS),
            Permit::Healthy
        ));
    }

    /// A probe that met no write to make (dropped with no outcome) is
    /// given back: the next caller probes at once. (It held every write of
    /// the object off for the probe's whole hold.)
    #[test]
    fn a_probe_dropped_unused_is_given_back() {
        let h = WriteHealth::default();
        h.record(false, || 0);
        let t = FIRST_BACKOFF_NS;
        let probe = h.may_write(|| t);
        assert!(matches!(probe, Permit::Probe(_)));
        assert!(!h.may_write(|| t + 1).allowed());
        drop(probe);
        assert!(matches!(h.may_write(|| t + 1), Permit::Probe(_)));
    }

    #[test]
    fn the_backoff_stops_growing_at_its_cap() {
        let h = WriteHealth::default();
        for _ in 0..64 {
            h.record(false, || 0);
        }
        assert!(!h.may_write(|| MAX_BACKOFF_NS - 1).allowed());
        assert!(h.may_write(|| MAX_BACKOFF_NS).allowed());
    }
}
