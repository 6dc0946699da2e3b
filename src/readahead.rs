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
use crate::object::{Object, ObjectPin};
use crate::page_cache::{LOCKED, POISONED, READAHEAD, SWAPPED, UPTODATE};
use crate::stats::Counter::*;
use crate::store::MAX_BATCH;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// Faults in a row, net of near-sequential ones, after which an object
/// gets no readahead (the kernel's `MMAP_LOTSAMISS`).
const LOTSAMISS: u32 = 100;

/// Free huge pages a huge page's readahead leaves in the pool.
const HUGE_MARGIN: u64 = 2;

/// After a fault on page `i` of `obj` (a miss, or a hit on a read-ahead
/// page), updates the window and requests the pages past what was already
/// requested, none at or past `limit`: the end of the region piece that
/// faulted (as the kernel's swap readahead stays inside the VMA), since no
/// fault can use a page nothing maps (the tail a shrink or the
/// application's `munmap` cut off, the rest of a store the region maps
/// only the start of), and each one read is charged and held until
/// reclaim or the object's release drops it. Async-signal-safe.
pub fn on_fault(mm: &Mm, obj: &Object, i: usize, limit: usize) {
    let max = mm.config.readahead_pages;
    if max == 0 {
        return;
    }
    if obj.is_huge() {
        return on_huge_fault(mm, obj, i, limit);
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
    let near = i >= expected && i - expected <= reach;
    let sequential = i == expected || (near && i <= end);
    // The kernel's `mmap_miss`: random readers land "near" the last fault
    // now and then (about reach / npages of their faults: one in seven
    // over a file eight times the reach), and each such hit doubled the
    // window again. Faults that are not near count up, near ones count
    // down twice as fast, so the count climbs for random faults over an
    // object of more than three reaches (1,632 pages with the defaults;
    // a smaller one is soon all cached anyway). Past LOTSAMISS the object
    // gets no readahead until a sequential reader brings the count back
    // down (50 faults from the cap).
    let miss = obj.ra_miss.load(Relaxed);
    let next = if near {
        miss.saturating_sub(2)
    } else {
        (miss + 1).min(2 * LOTSAMISS)
    };
    // At the cap (a random reader's steady state) the line stays clean.
    if next != miss {
        obj.ra_miss.store(next, Relaxed);
    }
    if miss > LOTSAMISS {
        obj.ra_window.store(0, Relaxed);
        return;
    }
    let w = if sequential {
        // (A window below 4 pages is allowed: `PagerBuilder::readahead`
        // takes any maximum.)
        w.saturating_mul(2).clamp(4.min(max), max)
    } else {
        w / 4
    };
    obj.ra_window.store(w, Relaxed);
    if w == 0 {
        return;
    }
    // A sequential reader's next window starts where its last one ended;
    // an `end` out of reach was left by some other reader (it only grows).
    let from = if sequential && end > i && end - i <= reach {
        end
    } else {
        i + 1
    };
    let to = (i + 1 + w as usize).min(obj.npages()).min(limit);
    if from >= to {
        return;
    }
    let slot = obj.slot.load(Relaxed);
    let mut last = from;
    for j in from..to {
        let w = obj.cache.load(j);
        // Anonymous memory reads ahead only what is in swap, as the
        // kernel's swap readahead does: a page never swapped out is a zero
        // page, which its fault maps for nothing (`UFFDIO_ZEROPAGE`); read
        // from the zero store, it would take a page of the cache area, and
        // of the budget, to hold zeros.
        if w & (UPTODATE | LOCKED | POISONED) != 0 || (obj.zero_fill && w & SWAPPED == 0) {
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

/// [`on_fault`] for an object of 2 MiB pages. A 2 MiB page is a 512-page
/// read already, so no window is built on it: a fault on the page right
/// after the last one (a sequential reader) requests the next one, so that
/// its read overlaps the reader's pass over this one; any other fault
/// requests nothing. Shared objects only: an anonymous one's pages come
/// back from swap, where a guessed 2 MiB read competes with the 2 MiB
/// swap writes of the evictions it forces.
fn on_huge_fault(mm: &Mm, obj: &Object, i: usize, limit: usize) {
    if obj.kind != crate::object::InstallKind::Shared {
        return;
    }
    let expected = obj.ra_next.swap(i + 1, Relaxed);
    let j = i + 1;
    if i != expected || j >= obj.npages().min(limit) {
        return;
    }
    if obj.cache.load(j) & (UPTODATE | LOCKED | POISONED) != 0 {
        return;
    }
    if mm.readahead.push(entry(obj.slot.load(Relaxed), j)) {
        obj.ra_end.fetch_max(j + 1, Relaxed);
        mm.readahead.kick();
    }
}

/// A run of consecutive requested pages of one object, locked and absent,
/// that read from the same source: one store call.
struct Run {
    obj: Option<ObjectPin>,
    slot: u32,
    start: usize,
    n: usize,
    swapped: bool,
    /// Pages the run may grow to (see [`run_limit`]).
    max: usize,
}

/// How many pages one store call of readahead carries: a batch only for a
/// store that gains by it; a page at a time for the others, whose
/// `read_many` would loop anyway, so that their pages are charged one by
/// one as they are read. A batch is charged to the budget whole before its
/// call, and the pages of batches in flight are residency past the budget
/// until reclaim catches up, so a batch is held to a share of the budget:
/// - a store that is not signal-safe (a network round trip and a thread
///   hop per call): a quarter of it;
/// - a signal-safe one that [batches reads](crate::store::Store::batches_reads)
///   (a disk file: one request per window instead of one per page): a
///   sixteenth, so that small budgets keep their bound (32 pages from a
///   budget of 512 pages up).
fn run_limit(mm: &Mm, obj: &Object, src: &dyn crate::store::Store) -> usize {
    // (One 2 MiB page is a request's whole buffer.)
    if obj.is_huge() || (src.signal_safe() && !src.batches_reads()) {
        return 1;
    }
    let share = if src.signal_safe() { 16 } else { 4 };
    match mm.config.budget_pages {
        0 => MAX_BATCH,
        b => MAX_BATCH.min((b / share).max(1) as usize),
    }
}

impl Run {
    /// Whether page `j` of the object in `slot` comes right after the run,
    /// which has room for it.
    fn extends(&self, slot: u32, j: usize) -> bool {
        self.n > 0 && self.n < self.max && self.slot == slot && self.start + self.n == j
    }
}

/// Reads the requested page `e` if it is still absent: it joins the run
/// when it extends it; otherwise the run is read first (so that no page
/// sits locked while another's read runs) and `e` starts the next one.
fn add(mm: &Mm, run: &mut Run, e: Entry) {
    let (slot, j) = unpack(e);
    let continuing = run.extends(slot, j);
    if !continuing {
        flush(mm, run);
        // A fresh pin per run: the object may have gone meanwhile.
        let Some(o) = mm.objects.pin(slot) else {
            return;
        };
        run.obj = Some(o);
        run.slot = slot;
        run.start = j;
    }
    // Pinned above, or by the run this page extends.
    let Some(obj) = run.obj.as_deref() else {
        return;
    };
    // Past the object, or a page no region maps any more: the region
    // shrank or the application unmapped it after the request was queued
    // (or the object's last region went: it may be kept, and guesses for
    // it are waste).
    if j >= obj.npages() || obj.windows.addr_of(j).is_none() {
        return;
    }
    // The same lock order as everyone else: a page lock is only ever
    // tried here, never waited for, while the run holds others.
    let Ok(prev) = obj.cache.try_lock(j) else {
        return;
    };
    // (Dropped since it was requested: a zero page now, see `on_fault`.)
    let swapped = prev & SWAPPED != 0;
    if prev & (UPTODATE | POISONED) != 0 || (obj.zero_fill && !swapped) {
        obj.cache.unlock(j, 0, 0);
        return;
    }
    if continuing && swapped != run.swapped {
        // Another source (swap, not the store): the run ends before it.
        obj.cache.unlock(j, 0, 0);
        flush(mm, run);
        return add(mm, run, e);
    }
    if !continuing {
        run.swapped = swapped;
        run.max = run_limit(mm, obj, &**obj.source(prev));
    }
    run.n += 1;
}

/// Reads the run's pages in one store call (`read_many`) and makes them
/// Cached, or on a failure leaves them all absent (a fault will read each
/// again and report its error).
fn flush(mm: &Mm, run: &mut Run) {
    let n = std::mem::take(&mut run.n);
    // The pin goes with the run: an unmap waits for pins, and pages read
    // into an object that is going away are wasted.
    let Some(obj) = run.obj.take() else {
        return;
    };
    if n == 0 {
        return;
    }
    let (start, end) = (run.start, run.start + n);
    let units = n as u64 * obj.units();
    // A huge page read ahead comes out of the hugetlb pool, which a fault
    // that finds it empty answers with SIGBUS. So one is read only if it
    // fits in the budget as it stands, charged in one step with the check
    // (a guess must not make reclaim evict 2 MiB, nor add to the overshoot
    // of the faults in flight, which is what map checked the pool for),
    // and only while the pool keeps a margin beyond it (other pagers and
    // processes draw on it too; a sysfs read: readahead threads are
    // ordinary threads).
    let charged = if obj.is_huge() {
        crate::sys::huge::Pool::now().available() >= HUGE_MARGIN + n as u64
            && crate::reclaim::charge_within_budget(mm, units)
    } else {
        crate::reclaim::charge(mm, units);
        true
    };
    if !charged {
        for j in start..end {
            obj.cache.unlock(j, 0, 0);
        }
        return;
    }
    let src = if run.swapped { obj.swap() } else { &obj.store };
    // SAFETY: we hold the lock of every page of the run, each absent, and
    // they all read from `src`.
    if unsafe { obj.fill_run(start, n, src, &mm.io) }.is_ok() {
        for j in start..end {
            mm.counters.inc(RA_PAGES);
            mm.counters.inc(PGREAD);
            obj.cache.unlock(j, UPTODATE | READAHEAD, 0);
            mm.page_cached(&obj, j);
            crate::collapse::after_cached(mm, &obj, j);
        }
    } else {
        mm.counters.inc(IO_ERROR);
        for j in start..end {
            obj.cache.unlock(j, 0, 0);
        }
        mm.uncharge(units);
    }
}

/// One readahead thread: takes requests as they come, gathers the
/// consecutive ones already queued into a run, and reads each run in one
/// store call.
fn work(mm: &Mm) {
    while let Some(e) = mm.readahead.next() {
        // A read section per gathering, taken before any page lock (an
        // event is applied under the gate's write side and locks pages):
        // the direct reclaim a run's charge may start zaps user ranges, and
        // with in-thread delivery the section is what keeps that from
        // acting on a range the application has just unmapped (see
        // `crate::events`).
        let _section = mm.events.section();
        let mut run = Run {
            obj: None,
            slot: u32::MAX,
            start: 0,
            n: 0,
            swapped: false,
            max: 1,
        };
        add(mm, &mut run, e);
        // Not while an event waits for the gate: the section would keep
        // it (and, as new sections wait behind it, every fault) waiting
        // for a store call per run as long as requests are queued. The
        // rest of the queue is read in the next section.
        while !mm.events.pending() {
            let Some(e) = mm.readahead.pop() else {
                break;
            };
            add(mm, &mut run, e);
        }
        flush(mm, &mut run);
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
        started.push(crate::sys::thread::spawn(
            format!("uffd-readahead-{k}"),
            move || work(&mm),
        )?);
    }
    Ok(std::mem::take(started))
}

/// Stops the I/O threads (they exit at their next wake-up).
pub fn stop(mm: &Mm) {
    mm.readahead.stop();
}
