//! Applying the events [`super::Events`] queued: under the gate's write
//! side and the global write lock, in read order.

use super::records::{may_come, prune_left, Desc};
use super::release::Released;
use super::Event;
use crate::address_space::Mm;
use crate::stats::Counter;
use crate::sync::percpu_rwsem::WriteGuard;
use crate::vma::Vma;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

/// Applies every queued event, in read order, under the gate's write
/// side, then releases the objects they left ([`Released`]) outside it.
/// The caller holds no engine lock and no read section.
pub fn queued(mm: &Mm) {
    // (A count, not the queue's lock, which a read holds across its
    // system call: this runs after every batch of every handler thread.)
    if mm.events.queued.load(SeqCst) == 0 {
        return;
    }
    let gate = mm.events.gate.write();
    let released = queued_locked(mm, &gate);
    drop(gate);
    drop(released);
}

/// As [`queued`], for a caller that holds the gate's write side already:
/// it drops what this returns only once it has let go of the gate.
pub fn queued_locked<'a>(mm: &'a Mm, _gate: &WriteGuard<'_>) -> Released<'a> {
    let mut released = Released::new(mm);
    loop {
        // (Named in `applying`, under the queue's lock, while it is
        // applied: [`may_come`] counts it.)
        let Some((e, from)) = ({
            let mut queue = mm.events.lock_queue();
            let next = queue.pop_front();
            if next.is_some() {
                mm.events.queued.fetch_sub(1, SeqCst);
            }
            mm.events.applying.store(next.map_or(0, |(_, f)| f), SeqCst);
            next
        }) else {
            return released;
        };
        apply_read(mm, e, from, &mut released);
        mm.events.applying.store(0, SeqCst);
        mm.events.busy.fetch_sub(1, SeqCst);
        crate::inject::after_event();
    }
}

/// A `map` found table entries overlapping `[start, end)`, which the
/// kernel just gave it for `new`'s region: the application unmapped them
/// (or moved them) and no event will change them in time (see
/// `Mm::map`). Applies an unmap now. `awaited`: an event was still on its
/// way when the map gave up waiting; records are then left for it
/// ([`settle_stale`]), so that the event, when it is read, does not touch
/// the new region. (Recorded when no event is coming, the range would be
/// taken by the next unmap, whatever it is, and could hide the new region
/// from an unmap of its own.)
pub(crate) fn stale(mm: &Mm, start: usize, end: usize, awaited: bool, new: &crate::object::Object) {
    // (Released here, under the caller's global lock: see
    // `Released::here`.)
    let record = awaited.then_some((start, end));
    settle_stale(
        mm,
        &[(start, end)],
        record,
        new,
        false,
        &mut Released::here(mm),
    );
}

/// Takes the regions the table still holds in `ranges` for unmapped: the
/// kernel has just given those ranges to `ours` (an object's region
/// mapped, moved or grown there), so what the table says is there is
/// gone, its event not applied yet. Where one of them is on `ours`'s
/// descriptor, or a move of a region on that descriptor left the range
/// and its unmap is not applied yet, a record is left with `record` (the
/// range `ours` holds now; `None`: no event is on its way, and nothing is
/// recorded), so that the late event, which is applied to every region of
/// its descriptor in its range, leaves `ours`'s region alone. One on
/// another descriptor needs a record only while an event is on its way on
/// `ours`'s: one call over regions of two descriptors posts an event on
/// each, each over the whole range, so that event may cover it too.
///
/// Each such region leaves a record of its own, keyed by its range, and
/// an unmap takes only the part of a record it covers (`apply_read`): two
/// calls that unmapped one region in two parts post two events, and the
/// first took the whole record, so the second cut the region. Hazard: a
/// region the application moved rather than unmapped is lost here (its
/// move's event finds nothing to move): a move applied as an event first
/// applies the older events of the regions it meets ([`older_first`]),
/// and a map waits for events on their way (`event_coming`), so what is
/// left is a map that gave up waiting, and a move made between a map's
/// look and its `mmap`. A record no unmap takes would
/// swallow `ours`'s own later unmap: once its descriptor has no event
/// that may still be applied ([`may_come`]), it is dropped, here and after
/// each event applied (`records::prune_after_event`). `in_event`: the
/// range was given to a move the application made, applied as an event.
pub(crate) fn settle_stale(
    mm: &Mm,
    ranges: &[(usize, usize)],
    record: Option<(usize, usize)>,
    ours: &crate::object::Object,
    in_event: bool,
    released: &mut Released<'_>,
) {
    let desc = Desc::of(ours);
    let mine = desc.id(mm);
    // One call over regions of two descriptors posts an event on each, each
    // over the whole range: with one on its way on ours, a region of
    // another's taken here may lie in its range too. (Not for a move the
    // application made, applied as an event: its own descriptor's events
    // are applied in order, and the unmap of the range it left, which
    // counts as on its way, covers none of this.)
    let own_coming = record.is_some() && !in_event && desc.changing(mm);
    for &(a, b) in ranges.iter().filter(|(a, b)| a < b) {
        let there = mm.table.read(|t| t.overlapping(a, b));
        let overlap = |s: usize, e: usize| (s.max(a), e.min(b));
        // (Not one left unregistered by a failed remap: its unmap posts no
        // event, and a record of one would swallow the next event over the
        // range, another region's unmap.)
        let mut keys: Vec<(usize, usize)> = there
            .iter()
            .filter(|v| own_coming || Desc::of(&v.object).id(mm) == mine)
            .filter(|v| !v.unregistered.load(SeqCst))
            .map(|v| overlap(v.start, v.end))
            .collect();
        {
            let mut left = mm.events.lock_left();
            prune_left(mm, &mut left);
            keys.extend(
                left.iter()
                    .filter(|(s, e, d)| *s < b && a < *e && d.id(mm) == mine)
                    .map(|&(s, e, _)| overlap(s, e)),
            );
        }
        if !there.is_empty() {
            drop(there);
            apply(mm, Event::Unmap(a, b), None, &[], released);
        }
        let Some(kept) = record else { continue };
        let mut records = mm.events.lock_pre_applied();
        records.retain(|r| may_come(mm, &r.desc, false));
        // Only while an event may still come on the descriptor: a record
        // with none to take it would take the next one.
        if !may_come(mm, &desc, false) {
            continue;
        }
        records.extend(keys.into_iter().map(|key| super::PreApplied {
            key,
            kept,
            desc: desc.clone(),
        }));
    }
}

/// Applies event `e`, read from descriptor `from` ([`super::uffd_id`])
/// (the caller holds the gate's write side, not the global lock).
fn apply_read(mm: &Mm, e: Event, from: usize, released: &mut Released<'_>) {
    let _w = mm.lock.write();
    let pre = super::records::take(mm, e, from);
    apply(mm, e, Some(from), &pre, released);
    super::records::prune_after_event(mm);
    mm.events.applied.fetch_add(1, SeqCst);
}

/// Applies one event under the global write lock to the regions of
/// descriptor `desc` (`None`: every region), leaving alone regions that
/// lie wholly inside a `pre` range (mapped after the kernel freed it).
///
/// Hazard: one call of the application's over regions of two descriptors
/// (an anonymous region beside a shared one, or two regions under
/// per-region delivery) posts an event on each descriptor, each with the
/// whole range, and the second only once the first is read. Each is
/// applied to its own descriptor's regions: applied to all of them, the
/// first would clear the range, a `map` could land a new region there, and
/// the second would then cut it.
fn apply(
    mm: &Mm,
    e: Event,
    desc: Option<usize>,
    pre: &[(usize, usize)],
    released: &mut Released<'_>,
) {
    let (s, end) = match e {
        Event::Remove(s, end) | Event::Unmap(s, end) => (s, end),
        Event::Remap { from, len, .. } => (from, from + len),
    };
    let inside_pre = |v: &Vma| pre.iter().any(|&(a, b)| v.start >= a && v.end <= b);
    let ours = |v: &Vma| desc.is_none_or(|d| Desc::of(&v.object).id(mm) == d);
    let vmas: Vec<Arc<Vma>> = mm
        .table
        .read(|t| t.overlapping(s, end))
        .into_iter()
        .filter(|v| !inside_pre(v) && ours(v))
        .collect();
    match e {
        Event::Remove(..) => {
            mm.counters.inc(Counter::EVENT_REMOVE);
            for v in &vmas {
                remove(mm, v, s, end);
            }
        }
        Event::Unmap(..) => {
            mm.counters.inc(Counter::EVENT_UNMAP);
            // (A record waits for the unmap on the moved region's own
            // descriptor.)
            mm.events
                .lock_left()
                .retain(|(a, b, d)| *a < s || *b > end || desc.is_some_and(|x| d.id(mm) != x));
            let mut gone = Vec::new();
            for v in &vmas {
                let Cut { kept, .. } = cut(mm, v, s, end, None);
                mm.publish(std::slice::from_ref(v), &kept);
                gone.push(v.object.clone());
            }
            drop(vmas);
            for obj in gone {
                // All of a region gone under per-region delivery: its
                // handler is told so, and lingers while the object holds
                // the descriptor (this thread, as a rule: it read the
                // event). All of it: a region cut into more pieces than
                // its object has windows for kept its last pieces
                // registered on the descriptor with no window, and a
                // handler stopped on them left their faults waiting for
                // ever.
                if let (Some(p), Some(u)) = (mm.per_region.get(), obj.region_uffd.get()) {
                    if !mm.maps_object(&obj) {
                        p.retire(u);
                    }
                }
                // Released (written back if it was the last piece) once
                // the locks are let go.
                released.push(obj);
            }
        }
        Event::Remap { to, placed, .. } => {
            mm.counters.inc(Counter::EVENT_REMAP);
            if let Some(v) = vmas.first() {
                mm.events.lock_left().push((s, end, Desc::of(&v.object)));
            }
            // Regions the table still holds where the kernel has put the
            // moved range are gone: the application unmapped (or moved)
            // them, and their event, on another descriptor or behind this
            // one, is not applied yet. Left there, the moved pieces sat
            // beside them at the same start, and a lookup found the stale
            // region: the moved one's faults were served with its object,
            // its `mapped()` was empty and its unmap unmapped nothing. Taken
            // for unmapped now; the late event leaves the moved pieces
            // alone (the range is recorded).
            if let Some(v) = vmas.first() {
                let dest = (to, to + (end - s));
                if let Some(from) = desc {
                    older_first(mm, dest, from, released);
                }
                settle_stale(mm, &[dest], Some(dest), &v.object, true, released);
            }
            for v in &vmas {
                let Cut { mut kept, moved } = cut(mm, v, s, end, Some((to, placed)));
                kept.extend(moved);
                mm.publish(std::slice::from_ref(v), &kept);
            }
        }
    }
}

/// Before a move read from descriptor `from` is applied: the regions of
/// other descriptors the table still holds in its destination `dest` left
/// that range (moved or unmapped by the application) before this move
/// could land there, so their events are older than this one, posted on
/// their own descriptors and read after it (a reader drains one
/// descriptor before the next; two handler threads race). Taken for
/// unmapped by [`settle_stale`], a region the application moved lost its
/// pages, and its own move then found nothing to move (found by review).
/// So their events are applied first: queued ones, in their order, and
/// those still in the kernel (its descriptor `changing`) read now. A fault
/// message read with them is not served here: its range is woken, and the
/// access runs again and faults again. Under the gate's write side and
/// the global write lock, as [`apply`].
fn older_first(mm: &Mm, dest: (usize, usize), from: usize, released: &mut Released<'_>) {
    // The descriptors whose events are being applied, this one and those
    // of the moves this one is applied inside (an older event applied
    // here may be a move that meets regions of its own): their regions
    // are left to `settle_stale`, since their first queued event is newer
    // than the one being applied.
    let outer = {
        let mut nested = mm.events.lock_nested();
        nested.push(from);
        nested.clone()
    };
    // (Popped on an unwind too: a stale entry would leave its descriptor's
    // regions out of every later look.)
    struct Pop<'a>(&'a Mm);
    impl Drop for Pop<'_> {
        fn drop(&mut self) {
            self.0.events.lock_nested().pop();
        }
    }
    let _pop = Pop(mm);
    older_first_of(mm, dest, &outer, released);
}

/// How long [`older_first`] waits, under the gate, for an event whose
/// descriptor reports a change with nothing to read yet: the kernel counts
/// the change from before it lets go of `mmap_lock`, and posts the event
/// after, so a poster preempted in between leaves nothing to read.
const POSTED_PATIENCE_NS: u64 = 100_000_000;

fn older_first_of(mm: &Mm, dest: (usize, usize), outer: &[usize], released: &mut Released<'_>) {
    let mut msgs = [crate::sys::uffd::Msg::default(); 64];
    let mut deadline = 0;
    // (Bounded: each round applies an event, reads one, or waits for one
    // under the deadline; faults read meanwhile do not count.)
    let mut events = 0;
    while events < 64 {
        let mut others: Vec<Desc> = Vec::new();
        for v in mm.table.read(|t| t.overlapping(dest.0, dest.1)).iter() {
            let d = Desc::of(&v.object);
            let id = d.id(mm);
            if !outer.contains(&id) && others.iter().all(|o| o.id(mm) != id) {
                others.push(d);
            }
        }
        if others.is_empty() {
            return;
        }
        // The descriptors first, then the queue (as `may_come`): an event
        // a handler reads in between is in the queue by then.
        let changing: Vec<&Desc> = others.iter().filter(|d| d.changing(mm)).collect();
        let ids: Vec<usize> = others.iter().map(|d| d.id(mm)).collect();
        let next = {
            let mut queue = mm.events.lock_queue();
            let at = queue.iter().position(|(_, f)| ids.contains(f));
            let next = at.and_then(|i| queue.remove(i));
            if next.is_some() {
                mm.events.queued.fetch_sub(1, SeqCst);
            }
            next
        };
        if let Some((e, f)) = next {
            events += 1;
            // (Named as the one being applied meanwhile: `may_come`; put
            // back on an unwind too.)
            struct Was<'a>(&'a Mm, usize);
            impl Drop for Was<'_> {
                fn drop(&mut self) {
                    self.0.events.applying.store(self.1, SeqCst);
                }
            }
            let _was = Was(mm, mm.events.applying.swap(f, SeqCst));
            let pre = super::records::take(mm, e, f);
            apply(mm, e, Some(f), &pre, released);
            super::records::prune_after_event(mm);
            mm.events.applied.fetch_add(1, SeqCst);
            mm.events.busy.fetch_sub(1, SeqCst);
            continue;
        }
        if changing.is_empty() {
            return;
        }
        let mut read = 0;
        for d in changing {
            if let Some(u) = d.uffd(mm) {
                read += read_events(mm, &u, &mut msgs);
            }
        }
        events += read;
        if read == 0 {
            // The awaited event may be posted only once an event of the
            // same call on another descriptor is read (the kernel posts one
            // at a time): the pager's own descriptors are read too, their
            // events queued behind (found by review).
            for quiet in [false, true] {
                let u = mm.pager_uffd(quiet);
                if u.mmap_changing() {
                    read_events(mm, u, &mut msgs);
                }
            }
            let now = crate::sys::now_ns();
            if deadline == 0 {
                deadline = now + POSTED_PATIENCE_NS;
            } else if now > deadline {
                return;
            }
            crate::sys::sleep_ns(20_000);
        }
    }
}

/// Reads messages from `u` for [`older_first`]: its events are queued
/// ([`super::Events::read`]), its fault messages, not served here, are
/// woken (the access runs again and faults again; a 2 MiB page's waiter
/// too, its page alone where the 2 MiB range is refused, as at the bottom
/// of memory). Returns the events read.
fn read_events(mm: &Mm, u: &crate::sys::uffd::Uffd, msgs: &mut [crate::sys::uffd::Msg]) -> usize {
    let Ok(n) = mm.events.read(u, msgs) else {
        return 0;
    };
    let huge = crate::sys::huge::HUGE_PAGE_SIZE;
    let mut events = 0;
    for m in &msgs[..n] {
        if m.event != crate::sys::uffd::EVENT_PAGEFAULT {
            events += 1;
            continue;
        }
        let addr = m.arg1 as usize;
        if u.wake(addr & !(huge - 1), huge).is_err() {
            let _ = u.wake(addr & !(crate::sys::PAGE_SIZE - 1), crate::sys::PAGE_SIZE);
        }
    }
    events
}

/// `REMOVE` on one region: its anonymous pages in `[s, e)` read as their
/// source again. Shared regions keep their data (their descriptor does not
/// report `madvise`; a fault on a page dropped from their mapping maps it
/// again).
fn remove(mm: &Mm, v: &Vma, s: usize, e: usize) {
    let obj = &v.object;
    if obj.kind != crate::object::InstallKind::Anonymous {
        return;
    }
    let (cs, ce) = (s.max(v.start), e.min(v.end));
    if cs >= ce {
        return;
    }
    v.lock.write_lock();
    crate::discard::give_up_pages(mm, obj, v.page_index(cs)..v.page_index(ce - 1) + 1);
    v.lock.write_unlock();
}

/// What the application's own `munmap` or `mremap` did to one VMA: the
/// pieces it leaves in place, and the piece it moved (and where).
struct Cut {
    /// New VMAs for the parts of the old one outside the range.
    kept: Vec<Arc<Vma>>,
    /// The part inside the range, moved to a new start (`mremap`), if any.
    moved: Option<Arc<Vma>>,
}

/// Cuts `[s, e)` out of `vma` (the caller holds the global write lock and
/// the event gate): the parts outside stay; the part inside moves to `to`
/// (an `mremap` the application made, with the placement stamp its event
/// took when it was read), or is gone (`munmap`): then its
/// anonymous pages are discarded and its shared pages stay cached,
/// unmapped. Updates the object's windows; the caller publishes.
fn cut(mm: &Mm, vma: &Arc<Vma>, s: usize, e: usize, to: Option<(usize, u64)>) -> Cut {
    let (cs, ce) = (s.max(vma.start), e.min(vma.end));
    vma.lock.write_lock();
    vma.lock.mark_detached();
    let obj = &vma.object;
    if to.is_none() {
        crate::discard::give_up_pages(mm, obj, vma.page_index(cs)..vma.page_index(ce - 1) + 1);
    }
    let mut kept = Vec::new();
    if vma.start < cs {
        kept.push(Arc::new(vma.slice(vma.start, cs, vma.start)));
    }
    if ce < vma.end {
        kept.push(Arc::new(vma.slice(ce, vma.end, ce)));
    }
    let moved = to.map(|(t, placed)| {
        let mut v = vma.slice(cs, ce, t + (cs - s));
        v.placed = placed;
        Arc::new(v)
    });
    let mut windows: Vec<crate::object::Window> = kept.iter().map(|v| v.window()).collect();
    windows.extend(moved.iter().map(|v| v.window()));
    let (first, end, _) = vma.window();
    obj.windows.replace(first, end, &windows);
    vma.lock.write_unlock();
    Cut { kept, moved }
}
