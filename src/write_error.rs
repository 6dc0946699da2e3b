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
    pub fn may_write(&self, now: impl FnOnce() -> u64) -> bool {
        let at = self.retry_at.load(Relaxed);
        if at == 0 {
            return true;
        }
        let now = now();
        if now < at {
            return false;
        }
        self.retry_at
            .compare_exchange(at, now.saturating_add(PROBE_HOLD_NS), Relaxed, Relaxed)
            .is_ok()
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
        assert!(h.may_write(|| 5));
        h.record(true, || 5);
        assert!(!h.failing());
        h.record(false, || 1_000);
        assert!(h.failing());
        assert!(!h.may_write(|| 1_000 + FIRST_BACKOFF_NS - 1));
        // The backoff ends: one caller probes, the next waits, however
        // long the probe takes to report (up to the longest backoff).
        let t = 1_000 + FIRST_BACKOFF_NS;
        assert!(h.may_write(|| t));
        assert!(!h.may_write(|| t));
        assert!(!h.may_write(|| t + 2 * FIRST_BACKOFF_NS));
        assert!(!h.may_write(|| t + MAX_BACKOFF_NS - 1));
        // The probe fails: twice as long.
        h.record(false, || t);
        assert!(!h.may_write(|| t + 2 * FIRST_BACKOFF_NS - 1));
        assert!(h.may_write(|| t + 2 * FIRST_BACKOFF_NS));
        h.record(true, || t + 2 * FIRST_BACKOFF_NS);
        assert!(!h.failing());
        assert!(h.may_write(|| t + 2 * FIRST_BACKOFF_NS));
    }

    #[test]
    fn the_backoff_stops_growing_at_its_cap() {
        let h = WriteHealth::default();
        for _ in 0..64 {
            h.record(false, || 0);
        }
        assert!(!h.may_write(|| MAX_BACKOFF_NS - 1));
        assert!(h.may_write(|| MAX_BACKOFF_NS));
    }
}
