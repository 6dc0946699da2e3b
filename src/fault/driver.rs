//! The fault driver: region attempt, retry per policy, global fallback.
//! Reads top to bottom like `do_user_addr_fault`.

use super::attempt::attempt;
use super::{Access, Fault, LockKind, Outcome, PolicyKind, Resolution};
use crate::address_space::Mm;
use crate::stats::Counter::*;
use crate::sys::now_ns;

/// Handles one fault at `addr` in `mm` to completion, restarting it while
/// non-cooperative events are applied. Async-signal-safe.
pub fn handle_fault(mm: &Mm, addr: usize, access: Access) -> Resolution {
    handle_fault_since(mm, addr, access, now_ns())
}

/// [`handle_fault`] for a fault its delivery first looked at `since`
/// ([`now_ns`]): its latency counts from there (the waits for the gate,
/// the restarts and the delivery's own looks are the fault's too, and the
/// longest of all). Async-signal-safe.
pub fn handle_fault_since(mm: &Mm, addr: usize, access: Access, since: u64) -> Resolution {
    loop {
        match handle_fault_once(mm, addr, access, since) {
            Resolution::Restart => {
                // The event reader takes the gate to apply what it read:
                // wait for it (or, if it has not woken yet, let it run).
                if mm.events.pending() {
                    mm.events.wait_applied();
                } else {
                    std::thread::yield_now();
                }
            }
            r => return r,
        }
    }
}

/// Handles one fault at `addr` in `mm`, inside one read section of the
/// event gate; [`Resolution::Restart`] if an event must be applied first.
/// The fault's latency is recorded from `since` (a [`now_ns`] taken
/// before the caller's first try: the wait for the gate counts).
/// Async-signal-safe.
pub fn handle_fault_once(mm: &Mm, addr: usize, access: Access, since: u64) -> Resolution {
    let _section = mm.events.section();
    let epoch = mm.events.epoch();
    let c = &mm.counters;
    let mut f = Fault::new(addr, access);
    let policy = mm.config.policy.kind;

    let out = 'done: {
        if policy == PolicyKind::GlobalOnly {
            break 'done global(mm, &mut f);
        }
        // Lockless lookup and the first attempt under the region lock.
        let regions = if matches!(policy, PolicyKind::Vanilla) {
            1
        } else {
            2
        };
        for n in 0..regions {
            match attempt(mm, &mut f, LockKind::Region) {
                Outcome::Retry { major } => {
                    c.inc(VMA_LOCK_RETRY);
                    // FAULT_FLAG_TRIED after a major retry; P2 sets it on
                    // the second region attempt regardless.
                    f.tried |= major || (policy == PolicyKind::RetryOnceTried && n == 0);
                }
                Outcome::Abort => {
                    c.inc(VMA_LOCK_ABORT);
                    break;
                }
                Outcome::Restart => break 'done Outcome::Restart,
                done => {
                    c.inc(VMA_LOCK_SUCCESS);
                    break 'done done;
                }
            }
        }
        // Fall back to the global lock.
        global(mm, &mut f)
    };

    // No region, or an install the kernel refused, while events may be
    // half applied: the application may have just moved, unmapped or
    // mapped what this fault is for. Try again once they are applied (a
    // true SIGSEGV or SIGBUS stays one).
    let refused = matches!(out, Outcome::Segv | Outcome::Denied | Outcome::NoPage);
    if out == Outcome::Restart || (refused && mm.events.unsettled_since(epoch)) {
        return Resolution::Restart;
    }
    // An address in no region is not counted or timed (the kernel's bad
    // area never reaches `handle_mm_fault`): the delivery may look again
    // and send it elsewhere, and an access counted once per look read as
    // several faults. SIGSEGV is counted where it is raised.
    // An access the region refuses is not counted either (the kernel's
    // access error): handler threads look at it three times before they
    // signal it.
    let not_counted = matches!(
        out,
        Outcome::Segv | Outcome::Abort | Outcome::Retry { .. } | Outcome::Denied
    );
    if !not_counted {
        c.inc(PGFAULT);
        if f.major {
            c.inc(PGMAJFAULT);
        }
        c.record_latency(now_ns().saturating_sub(since));
    }
    match out {
        Outcome::Done => Resolution::Resolved,
        Outcome::Bus => Resolution::Bus,
        Outcome::NoPage => Resolution::NoPage,
        Outcome::Restart => Resolution::Restart,
        Outcome::Denied => Resolution::Segv,
        // Abort and Retry never leave `global`.
        Outcome::Segv | Outcome::Abort | Outcome::Retry { .. } => Resolution::NoRegion,
    }
}

/// Attempts under the global lock until one completes; a RETRY sets
/// `tried` (the mmap_lock path's `FAULT_FLAG_TRIED`).
fn global(mm: &Mm, f: &mut Fault) -> Outcome {
    loop {
        match attempt(mm, f, LockKind::Global) {
            Outcome::Retry { .. } => f.tried = true,
            out => return out,
        }
    }
}
