//! The background reclaimer (kswapd) and its watermarks, and the pass a
//! faulting context makes over clean pages past the high watermark.
//!
//! # Who reclaims what
//! Past the high watermark, the faulting context whose charge crossed it
//! frees a batch of clean pages itself ([`past_high`]): one zap of up to
//! [`unmap_batch::BATCH`] pages, on its own CPU. kswapd is woken only when
//! that pass cannot free its batch (the pages at the LRU's end are dirty,
//! anonymous pages to move out to swap, 2 MiB pages, busy), and does the
//! writing until residency is back under the low watermark; faulting
//! contexts leave reclaim to it meanwhile. The kernel's direct reclaim
//! likewise leaves dirty file pages to the flusher threads.
//!
//! Why not kswapd for clean pages too, as the kernel does: here its zap
//! runs on another CPU than the faulting thread's, so the TLB flush is an
//! IPI to the faulting CPU for every batch, and where the scheduler packs
//! runnable threads onto few vCPUs (`kernel.sched_vcpu_pack` on this
//! project's VMs) kswapd is woken onto the faulting thread's own CPU and
//! preempts it: about 1,400 times a second in a one-thread `bench random`,
//! with the faulting thread off its CPU for a fifth of the run. Freeing
//! the same clean pages in the faulting context costs the same zap with a
//! local flush and no switch.
//!
//! # Hazard
//! [`past_high`] runs where [`charge`] runs, so in the SIGBUS handler too:
//! it must stay async-signal-safe (it is [`shrink_in`], which is).

use super::*;

/// LRU entries a faulting context's clean pass looks at, at most.
pub(super) const CLEAN_SCAN: u64 = 4 * ISOLATE as u64;

/// Called with the residency a charge left (`resident`): past the high
/// watermark, frees a batch of clean pages in the calling context, and
/// wakes kswapd if that pass could not (see the module docs). With no
/// kswapd (`PagerBuilder::kswapd(false)`) only [`direct`] reclaims, at the
/// budget. Async-signal-safe.
#[inline]
pub(super) fn past_high(mm: &Mm, resident: u64) {
    let budget = mm.config.budget_pages;
    let (high, low) = watermarks(budget);
    if resident <= high || !mm.config.kswapd {
        return;
    }
    let r = &mm.reclaim;
    if !r.clean_refused.load(Relaxed) {
        let want = (resident - low)
            .min(unmap_batch::BATCH as u64)
            .min((budget / 16).max(1));
        mm.counters.inc(DIRECT_RECLAIM);
        if shrink_in(mm, want, &mut Pass::clean_only()) >= want {
            return;
        }
        // Until kswapd has brought residency back under the low watermark.
        r.clean_refused.store(true, Relaxed);
    }
    maybe_wake_kswapd(mm, mm.resident.load(Relaxed));
}

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
///
/// The charge that raised residency to `resident` and this look at
/// `kswapd_sleeping` are `SeqCst`, as kswapd's store of it and its look at
/// residency before it sleeps: of the two, one sees the other (with
/// relaxed ones, allowed by the memory model though not by x86, kswapd
/// could sleep past the high watermark until the next charge).
#[inline]
pub fn maybe_wake_kswapd(mm: &Mm, resident: u64) {
    let (high, _) = watermarks(mm.config.budget_pages);
    if resident > high && mm.reclaim.kswapd_sleeping.load(SeqCst) {
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
            // Faulting contexts try clean passes again, and the next
            // episode's first empty round waits 1 ms again, not the
            // backoff a failing store left from an earlier one.
            r.clean_refused.store(false, Relaxed);
            idle_ns = 0;
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
