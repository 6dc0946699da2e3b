//! Readahead (`mm/readahead.c`): after a fault, start reads for the pages
//! that follow it, with a window that grows on sequential access and
//! shrinks on random access.
//!
//! Requests go into a bounded lock-free queue (one entry per page) that a
//! small pool of I/O threads drains; a faulting thread, possibly in its
//! signal handler, only enqueues and wakes — it never waits for readahead
//! and never holds a lock across it. Read-ahead pages enter the page cache
//! as Loading, then Cached, like any other, marked `READAHEAD` until a
//! fault uses them (`readahead_used`) or reclaim drops them unused
//! (`readahead_wasted`).

use crate::address_space::Mm;
use crate::lru::{entry, unpack, Entry};
use crate::object::Object;
use crate::page_cache::{LOCKED, POISONED, READAHEAD, UPTODATE};
use crate::stats::Counter::*;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// After a fault on page `i` of `obj` (a miss, or a hit on a read-ahead
/// page), updates the window and requests the pages past what was already
/// requested. Async-signal-safe.
pub fn on_fault(mm: &Mm, obj: &Object, i: usize) {
    let max = mm.config.readahead_pages;
    if max == 0 {
        return;
    }
    let expected = obj.ra_next.swap(i + 1, Relaxed);
    let w = obj.ra_window.load(Relaxed);
    let end = obj.ra_end.load(Relaxed);
    // Sequential: the next page, or a page a little ahead of it up to the
    // end of what readahead requested (fault-around maps the cached pages in
    // between, so a sequential reader's next fault lands further on). The
    // reach is bounded: `end` only grows, and a random fault that lands
    // anywhere past the last one must not count as sequential.
    let reach = max as usize + mm.config.fault_around_pages * crate::fault::FAULT_AROUND_GROWTH;
    let sequential = i == expected || (i >= expected && i <= end && i - expected <= reach);
    let w = if sequential {
        (w * 2).clamp(4, max)
    } else {
        w / 4
    };
    obj.ra_window.store(w, Relaxed);
    if w == 0 {
        return;
    }
    let from = (i + 1).max(if sequential { end } else { 0 });
    let to = (i + 1 + w as usize).min(obj.npages());
    if from >= to {
        return;
    }
    let slot = obj.slot.load(Relaxed);
    let mut last = from;
    for j in from..to {
        if obj.cache.load(j) & (UPTODATE | LOCKED | POISONED) != 0 {
            last = j + 1;
            continue;
        }
        if !mm.readahead.push(entry(slot, j)) {
            break;
        }
        last = j + 1;
    }
    obj.ra_end.fetch_max(last, Relaxed);
    mm.readahead.kick();
}

/// Reads one requested page, if it is still absent.
fn read_one(mm: &Mm, e: Entry) {
    let (slot, j) = unpack(e);
    let Some(obj) = mm.objects.pin(slot) else {
        return;
    };
    if j >= obj.npages() {
        return;
    }
    let Ok(prev) = obj.cache.try_lock(j) else {
        return;
    };
    if prev & (UPTODATE | POISONED) != 0 {
        obj.cache.unlock(j, 0, 0);
        return;
    }
    crate::reclaim::charge(mm, 1);
    // SAFETY: we hold the page lock and the page is absent.
    if unsafe { obj.fill(j, &mm.io) }.is_ok() {
        mm.counters.inc(RA_PAGES);
        mm.counters.inc(PGREAD);
        obj.cache.unlock(j, UPTODATE | READAHEAD, 0);
        mm.page_cached(&obj, j);
    } else {
        // Leave it absent: a fault will read it again and report errors.
        mm.counters.inc(IO_ERROR);
        obj.cache.unlock(j, 0, 0);
        mm.uncharge(1);
    }
}

/// Starts `n` readahead I/O threads for `mm`, pushing each onto `started`
/// as it starts (so a failure leaves the caller what to stop), and returns
/// them all.
pub fn start(
    mm: &Arc<Mm>,
    n: usize,
    started: &mut Vec<std::thread::JoinHandle<()>>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    for k in 0..n {
        let mm = mm.clone();
        started.push(
            std::thread::Builder::new()
                .name(format!("uffd-readahead-{k}"))
                .spawn(move || {
                    while let Some(e) = mm.readahead.next() {
                        read_one(&mm, e);
                    }
                })?,
        );
    }
    Ok(std::mem::take(started))
}

/// Stops the I/O threads (they exit at their next wake-up).
pub fn stop(mm: &Mm) {
    mm.readahead.stop();
}
