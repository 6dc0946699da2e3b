//! The records late events are matched against: which descriptor a
//! region is on ([`Desc`]), whether an event of a descriptor may still be
//! applied ([`may_come`]), and the records of unmaps applied before their
//! event was read ([`super::PreApplied`]): which of them an unmap takes
//! ([`take`]), and dropping those no event will take
//! ([`prune_after_event`]).

use super::Event;
use crate::address_space::Mm;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

/// The descriptor an object's regions are registered with, held without
/// the object.
#[derive(Debug, Clone)]
pub(crate) enum Desc {
    /// The pager's quiet or event-reporting descriptor.
    Pager { quiet: bool },
    /// The region's own (per-region delivery), held weakly: a record
    /// must not keep a descriptor open once its region is gone (nothing
    /// would read an event posted on it then, and the application's call
    /// would wait for ever).
    Own(std::sync::Weak<crate::sys::uffd::Uffd>),
}

impl Desc {
    pub(crate) fn of(obj: &crate::object::Object) -> Desc {
        match obj.region_uffd.get() {
            Some(u) => Desc::Own(Arc::downgrade(u.arc())),
            None => Desc::Pager { quiet: obj.quiet },
        }
    }

    /// Its [`super::uffd_id`].
    pub(crate) fn id(&self, mm: &Mm) -> usize {
        match self {
            Desc::Pager { quiet } => super::uffd_id(mm.pager_uffd(*quiet)),
            Desc::Own(u) => u.as_ptr() as usize,
        }
    }

    /// The descriptor itself (`None`: a region's own, closed since).
    pub(crate) fn uffd<'a>(&self, mm: &'a Mm) -> Option<DescRef<'a>> {
        match self {
            Desc::Pager { quiet } => Some(DescRef::Pager(mm.pager_uffd(*quiet))),
            Desc::Own(u) => u.upgrade().map(DescRef::Own),
        }
    }

    /// Whether an event is on its way on it ([`Uffd::mmap_changing`]).
    ///
    /// [`Uffd::mmap_changing`]: crate::sys::uffd::Uffd::mmap_changing
    pub(crate) fn changing(&self, mm: &Mm) -> bool {
        match self {
            Desc::Pager { quiet } => mm.pager_uffd(*quiet).mmap_changing(),
            Desc::Own(u) => u.upgrade().is_some_and(|u| u.mmap_changing()),
        }
    }
}

/// A descriptor [`Desc::uffd`] found: the pager's, or a region's own.
pub(crate) enum DescRef<'a> {
    Pager(&'a crate::sys::uffd::Uffd),
    Own(Arc<crate::sys::uffd::Uffd>),
}

impl std::ops::Deref for DescRef<'_> {
    type Target = crate::sys::uffd::Uffd;
    fn deref(&self) -> &crate::sys::uffd::Uffd {
        match self {
            DescRef::Pager(u) => u,
            DescRef::Own(u) => u,
        }
    }
}

/// Whether an event of `d`'s may still be applied: on its way, read and
/// queued, or being applied. `current`: the caller is the one applying,
/// and asks about the events after its own.
///
/// Hazard: the descriptor is asked first. The kernel counts an event from
/// before the change until the read has taken it (and a little longer:
/// until the thread that posted it runs again), and `Events::read` holds
/// the queue across its read, so an event the kernel has let go of is in
/// the queue by the time the queue is ours. Asked the other way round, a
/// read between the two questions would be missed.
pub(super) fn may_come(mm: &Mm, d: &Desc, current: bool) -> bool {
    if d.changing(mm) {
        return true;
    }
    let id = d.id(mm);
    let queue = mm.events.lock_queue();
    (!current && mm.events.applying.load(SeqCst) == id) || queue.iter().any(|&(_, from)| from == id)
}

/// Drops the `left` records whose descriptor has no event that may
/// still be applied ([`may_come`]).
pub(super) fn prune_left(mm: &Mm, left: &mut Vec<(usize, usize, Desc)>) {
    left.retain(|(_, _, d)| may_come(mm, d, false));
}

/// The ranges event `e`, read from descriptor `from`, must leave alone:
/// for an unmap, the records on `from` whose key it meets, which it takes
/// (the part of each key it covers; the rest waits for the unmap of that
/// part): that was the event they waited for. An unmap on another
/// descriptor leaves them (it leaves their regions alone anyway, and
/// would leave them unguarded against their own). Other events leave
/// every record for its unmap, and leave every record's region alone.
pub(super) fn take(mm: &Mm, e: Event, from: usize) -> Vec<(usize, usize)> {
    let mut records = mm.events.lock_pre_applied();
    let Event::Unmap(s, end) = e else {
        return records.iter().map(|r| r.kept).collect();
    };
    let mut taken = Vec::new();
    let mut rest = Vec::new();
    for r in records.drain(..) {
        let (a, b) = r.key;
        if a >= end || s >= b || r.desc.id(mm) != from {
            rest.push(r);
            continue;
        }
        taken.push(r.kept);
        for key in [(a, s.min(b)), (end.max(a), b)] {
            if key.0 < key.1 {
                rest.push(super::PreApplied { key, ..r.clone() });
            }
        }
    }
    *records = rest;
    taken
}

/// How long, after an event is applied, a record's descriptor that still
/// reads as changing is given to settle ([`prune_after_event`]).
const SETTLE_NS: u64 = 2_000_000;

/// Drops the records no event may still take, after an event is applied
/// (the caller applies it): kept, one would hide its region from the
/// region's own later unmap.
///
/// Hazard: the kernel counts an event on its descriptor until the thread
/// that posted it runs again, after the read: right after the event is
/// applied, its descriptor may still read as changing. A descriptor that
/// does is asked again for up to [`SETTLE_NS`] (sleeps of 20 µs, under
/// the gate and the global lock, and only while records are kept); one
/// with an event truly on its way keeps its records, and costs that wait.
pub(super) fn prune_after_event(mm: &Mm) {
    let mut records = mm.events.lock_pre_applied();
    if records.is_empty() {
        return;
    }
    let deadline = crate::sys::now_ns() + SETTLE_NS;
    records.retain(|r| {
        while r.desc.changing(mm) {
            if crate::sys::now_ns() > deadline {
                return true;
            }
            crate::sys::sleep_ns(20_000);
        }
        may_come(mm, &r.desc, true)
    });
}
