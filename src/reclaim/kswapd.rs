//! The background reclaimer (kswapd) and its watermarks, and the pass a
//! faulting context makes over clean pages past the high watermark.

use super::*;

/// kswapd's watermarks for a budget of `budget` pages, `(high, low)` in
/// pages: kswapd wakes when residency passes `high` and reclaims down to
/// `low` (a thirty-second and a sixteenth of the budget below it). A
/// working set that must stay resident without reclaim needs `high` above
/// it.
///
/// ```
/// assert_eq!(uffd_pager::watermarks(4096), (3968, 3840));
/// ```
pub fn watermarks(budget: u64) -> (u64, u64) {
    let high = budget - (budget / 32).max(1).min(budget);
    let low = budget - (budget / 16).max(2).min(budget);
    (high, low)
}

/// Wakes kswapd if it sleeps and residency passed the high watermark.
/// Async-signal-safe (one futex wake at most).
#[inline]
pub fn maybe_wake_kswapd(mm: &Mm, resident: u64) {
    let (high, _) = watermarks(mm.config.budget_pages);
    if resident > high && mm.reclaim.kswapd_sleeping.load(Relaxed) {
        mm.reclaim.kswapd_seq.fetch_add(1, Release);
        futex::wake(&mm.reclaim.kswapd_seq, 1);
    }
}

/// Starts the background reclaimer for `mm`.
pub fn start_kswapd(mm: &Arc<Mm>) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mm = mm.clone();
    crate::sys::thread::spawn("uffd-kswapd".into(), move || {
        let r = &mm.reclaim;
        let (high, low) = watermarks(mm.config.budget_pages);
        // How long to wait after a round that freed nothing.
        let mut idle_ns = 0u64;
        while !r.stop.load(Acquire) {
            let seq = r.kswapd_seq.load(Acquire);
            let resident = mm.resident.load(Relaxed);
            if resident > high {
                mm.counters.inc(KSWAPD_WAKE);
                // In a section of the event gate: eviction issues
                // ioctls on user addresses (see `crate::events`).
                let section = mm.events.section();
                let got = shrink(&mm, resident - low);
                drop(section);
                // Nothing could go (every page busy, referenced, or dirty
                // over a store in its write backoff, `crate::write_error`):
                // wait, twice as long each time up to 100 ms, instead of
                // scanning the LRU a thousand times a second while a store
                // is down. A stop wakes it.
                if got == 0 {
                    idle_ns = (idle_ns * 2).clamp(1_000_000, 100_000_000);
                    futex::wait_timeout(&r.kswapd_seq, seq, idle_ns);
                } else {
                    idle_ns = 0;
                }
                continue;
            }
            r.kswapd_sleeping.store(true, SeqCst);
            if mm.resident.load(SeqCst) <= high && !r.stop.load(Acquire) {
                futex::wait(&r.kswapd_seq, seq);
            }
            r.kswapd_sleeping.store(false, Relaxed);
        }
    })
}

/// Stops the background reclaimer (the thread exits at its next wake-up).
pub fn stop_kswapd(mm: &Mm) {
    mm.reclaim.stop.store(true, Release);
    mm.reclaim.kswapd_seq.fetch_add(1, Release);
    futex::wake_all(&mm.reclaim.kswapd_seq);
}
